//===- pcc-run.cpp - run a model library built by pcc ---------------------===//
//
//   pcc-run model.so --input x.npy [--input ...] [--output y.npy ...]
//           [--expect ref.npy ...] [--rtol R --atol A] [--bench N]
//           [--weights file.safetensors] [--device cpu]
//
// Plain C++ on the runtime library: no MLIR. Every failure is one message
// naming the file, tensor or node at fault, and exit status 1.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/DType.h"
#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/Npy.h"
#include "pcc/runtime/Safetensors.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <memory>
#include <string>
#include <vector>

using namespace pcc::rt;

namespace {

const char *kUsage = R"(pcc-run: run a model library built by pcc

Usage:
  pcc-run model.so --input x.npy [--input x2.npy ...] [options]

Options:
  --input FILE       a .npy file per model input, in the model's order
  --output FILE      write the model's outputs (one per output, in order)
  --expect FILE      compare an output with a reference .npy (one per output)
  --rtol R --atol A  comparison tolerances (default 1e-4 and 1e-5)
  --bench N          run N more times and print latency percentiles
  --weights FILE     the weights file (default: the one beside model.so)
  --device cpu       the device (only cpu in this version)
  --info             print the model's signature and exit

Example:
  pcc examples/mlp.onnx --batch=2 -o mlp.so
  pcc-run mlp.so --input examples/data/mlp.input.npy --output y.npy \
      --expect examples/data/mlp.output.npy
)";

[[noreturn]] void die(const std::string &message) {
  std::fprintf(stderr, "pcc-run: error: %s\n", message.c_str());
  std::exit(1);
}

std::string describe(const pcc_tensor_spec &spec) {
  std::vector<int64_t> shape(spec.shape, spec.shape + spec.rank);
  return std::string(dtypeName(static_cast<DType>(spec.dtype))) + " " +
         shapeString(shape);
}

std::vector<int64_t> shapeOf(const pcc_tensor_spec &spec) {
  return std::vector<int64_t>(spec.shape, spec.shape + spec.rank);
}

/// Element i of a buffer as a double (for comparisons and printing).
double valueAt(const uint8_t *data, DType type, int64_t i) {
  switch (type) {
  case DType::F32:
    return reinterpret_cast<const float *>(data)[i];
  case DType::F64:
    return reinterpret_cast<const double *>(data)[i];
  case DType::F16:
    return halfToFloat(reinterpret_cast<const uint16_t *>(data)[i]);
  case DType::BF16:
    return bf16ToFloat(reinterpret_cast<const uint16_t *>(data)[i]);
  case DType::I64:
    return double(reinterpret_cast<const int64_t *>(data)[i]);
  case DType::I32:
    return reinterpret_cast<const int32_t *>(data)[i];
  case DType::I16:
    return reinterpret_cast<const int16_t *>(data)[i];
  case DType::I8:
    return reinterpret_cast<const int8_t *>(data)[i];
  default:
    return data[i];
  }
}

struct Options {
  std::string library, weights, device = "cpu";
  std::vector<std::string> inputs, outputs, expects;
  double rtol = 1e-4, atol = 1e-5;
  int bench = 0;
  bool info = false;
};

Options parse(int argc, char **argv) {
  Options o;
  auto value = [&](int &i) -> std::string {
    if (i + 1 >= argc)
      die(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto number = [&](int &i) {
    std::string v = value(i);
    char *end = nullptr;
    double d = std::strtod(v.c_str(), &end);
    if (*end != '\0' || d < 0)
      die(std::string(argv[i - 1]) + " needs a non-negative number, got '" + v +
          "'");
    return d;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--input") {
      o.inputs.push_back(value(i));
    } else if (a == "--output") {
      o.outputs.push_back(value(i));
    } else if (a == "--expect") {
      o.expects.push_back(value(i));
    } else if (a == "--weights") {
      o.weights = value(i);
    } else if (a == "--device") {
      o.device = value(i);
    } else if (a == "--rtol") {
      o.rtol = number(i);
    } else if (a == "--atol") {
      o.atol = number(i);
    } else if (a == "--bench") {
      o.bench = static_cast<int>(number(i));
    } else if (a == "--info") {
      o.info = true;
    } else if (!a.empty() && a[0] == '-') {
      die("unknown option '" + a + "' (see --help)");
    } else if (o.library.empty()) {
      o.library = a;
    } else {
      die("unexpected argument '" + a + "' (see --help)");
    }
  }
  if (o.library.empty())
    die("no model library; usage: pcc-run model.so --input x.npy (see "
        "--help)");
  if (o.device != "cpu")
    die("--device " + o.device +
        " is not available in this version (only cpu)");
  return o;
}

struct AlignedFree {
  void operator()(void *p) const { std::free(p); }
};

std::unique_ptr<void, AlignedFree> allocate(int64_t bytes) {
  size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 64));
  size = (size + 63) / 64 * 64;
  void *p = std::aligned_alloc(64, size);
  if (!p)
    die("cannot allocate " + std::to_string(bytes) + " bytes");
  return std::unique_ptr<void, AlignedFree>(p);
}

} // namespace

int main(int argc, char **argv) {
  Options opts = parse(argc, argv);

  // The library and its ABI.
  void *handle = dlopen(opts.library.find('/') == std::string::npos
                            ? ("./" + opts.library).c_str()
                            : opts.library.c_str(),
                        RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    die("cannot load '" + opts.library + "': " + dlerror());
  auto getInfo = reinterpret_cast<pcc_model_get_info_fn>(
      dlsym(handle, "pcc_model_get_info"));
  auto run = reinterpret_cast<pcc_model_run_fn>(dlsym(handle, "pcc_model_run"));
  auto lastError = reinterpret_cast<pcc_model_last_error_fn>(
      dlsym(handle, "pcc_model_last_error"));
  if (!getInfo || !run || !lastError)
    die("'" + opts.library +
        "' is not a pcc model library (it does not export pcc_model_run)");
  const pcc_model_info *info = getInfo();
  if (info->abi_version != PCC_MODEL_ABI_VERSION)
    die("'" + opts.library + "' was built for model ABI version " +
        std::to_string(info->abi_version) + " but this pcc-run speaks " +
        std::to_string(PCC_MODEL_ABI_VERSION) +
        "; rebuild it with the matching pcc");

  if (opts.info) {
    std::printf("model %s (target %s, compiled from %s)\n",
                opts.library.c_str(), info->target, info->source);
    for (int i = 0; i < info->num_inputs; ++i)
      std::printf("  input  %s: %s\n", info->inputs[i].name,
                  describe(info->inputs[i]).c_str());
    for (int i = 0; i < info->num_outputs; ++i)
      std::printf("  output %s: %s\n", info->outputs[i].name,
                  describe(info->outputs[i]).c_str());
    std::printf("  %d weights in %s, arena %lld bytes\n", info->num_weights,
                info->weights_file, static_cast<long long>(info->arena_bytes));
    return 0;
  }

  // Weights: map the file and bind each weight by name, checking its type.
  std::string weightsPath = opts.weights;
  if (weightsPath.empty()) {
    size_t slash = opts.library.find_last_of('/');
    weightsPath =
        (slash == std::string::npos ? std::string()
                                    : opts.library.substr(0, slash + 1)) +
        info->weights_file;
  }
  auto weightsFile = SafetensorsFile::open(weightsPath);
  if (!weightsFile.ok())
    die(weightsFile.error());
  std::vector<const void *> weightPtrs;
  for (int i = 0; i < info->num_weights; ++i) {
    const pcc_tensor_spec &spec = info->weights[i];
    const TensorEntry *entry = weightsFile->find(spec.name);
    if (!entry)
      die("weights file '" + weightsPath + "' has no tensor '" + spec.name +
          "' (was it written for another model?)");
    if (entry->dtype != static_cast<DType>(spec.dtype) ||
        entry->shape != shapeOf(spec))
      die("weights file '" + weightsPath + "': tensor '" + spec.name + "' is " +
          std::string(dtypeName(entry->dtype)) + " " +
          shapeString(entry->shape) + " but the model needs " + describe(spec));
    weightPtrs.push_back(weightsFile->data(*entry));
  }

  // Inputs, checked against the model's signature.
  if (static_cast<int>(opts.inputs.size()) != info->num_inputs) {
    std::string names;
    for (int i = 0; i < info->num_inputs; ++i)
      names += std::string(i ? ", " : "") + info->inputs[i].name + " (" +
               describe(info->inputs[i]) + ")";
    die("the model takes " + std::to_string(info->num_inputs) + " input(s): " +
        names + "; got " + std::to_string(opts.inputs.size()) + " --input");
  }
  std::vector<NpyArray> inputs;
  std::vector<const void *> inputPtrs;
  for (int i = 0; i < info->num_inputs; ++i) {
    auto array = readNpy(opts.inputs[i]);
    if (!array.ok())
      die(array.error());
    const pcc_tensor_spec &spec = info->inputs[i];
    if (array->dtype != static_cast<DType>(spec.dtype) ||
        array->shape != shapeOf(spec))
      die("input '" + std::string(spec.name) + "' must be " + describe(spec) +
          ", but '" + opts.inputs[i] + "' holds " +
          std::string(dtypeName(array->dtype)) + " " +
          shapeString(array->shape));
    inputs.push_back(array.take());
  }
  for (const NpyArray &a : inputs)
    inputPtrs.push_back(a.data.data());

  std::vector<NpyArray> outputs;
  std::vector<void *> outputPtrs;
  for (int i = 0; i < info->num_outputs; ++i) {
    const pcc_tensor_spec &spec = info->outputs[i];
    NpyArray a;
    a.dtype = static_cast<DType>(spec.dtype);
    a.shape = shapeOf(spec);
    a.data.resize(elementCount(a.shape) * dtypeSize(a.dtype));
    outputs.push_back(std::move(a));
  }
  for (NpyArray &a : outputs)
    outputPtrs.push_back(a.data.data());
  auto arena = allocate(info->arena_bytes);

  auto runOnce = [&] {
    if (run(inputPtrs.data(), outputPtrs.data(), weightPtrs.data(),
            arena.get()) != 0)
      die(std::string("the model failed: ") + lastError());
  };
  runOnce();

  // Outputs: write, print, compare.
  if (opts.outputs.size() > outputs.size())
    die(std::to_string(opts.outputs.size()) + " --output files for " +
        std::to_string(outputs.size()) + " model output(s)");
  for (size_t i = 0; i < opts.outputs.size(); ++i) {
    Status s = writeNpy(opts.outputs[i], outputs[i]);
    if (!s.ok())
      die(s.error());
  }
  bool allMatch = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NpyArray &a = outputs[i];
    int64_t count = elementCount(a.shape);
    std::printf("output %s: %s %s [", info->outputs[i].name,
                std::string(dtypeName(a.dtype)).c_str(),
                shapeString(a.shape).c_str());
    for (int64_t j = 0; j < std::min<int64_t>(count, 6); ++j)
      std::printf("%s%.6g", j ? ", " : "", valueAt(a.data.data(), a.dtype, j));
    std::printf("%s]\n", count > 6 ? ", ..." : "");
    if (i >= opts.expects.size())
      continue;
    auto ref = readNpy(opts.expects[i]);
    if (!ref.ok())
      die(ref.error());
    if (ref->shape != a.shape)
      die("reference '" + opts.expects[i] + "' has shape " +
          shapeString(ref->shape) + ", output '" + info->outputs[i].name +
          "' has " + shapeString(a.shape));
    double maxAbs = 0, maxRel = 0;
    int64_t bad = 0;
    for (int64_t j = 0; j < count; ++j) {
      double x = valueAt(a.data.data(), a.dtype, j);
      double r = valueAt(ref->data.data(), ref->dtype, j);
      double diff = std::fabs(x - r);
      bool nanMatch = std::isnan(x) && std::isnan(r);
      if (!nanMatch && !(diff <= opts.atol + opts.rtol * std::fabs(r)))
        ++bad;
      if (!nanMatch) {
        maxAbs = std::max(maxAbs, diff);
        if (r != 0)
          maxRel = std::max(maxRel, diff / std::fabs(r));
      }
    }
    std::printf("  vs %s: max |diff| %.3g, max rel %.3g: %s (rtol %g, atol "
                "%g)\n",
                opts.expects[i].c_str(), maxAbs, maxRel,
                bad ? "MISMATCH" : "matches", opts.rtol, opts.atol);
    if (bad) {
      std::printf("  %lld of %lld elements outside tolerance\n",
                  static_cast<long long>(bad), static_cast<long long>(count));
      allMatch = false;
    }
  }

  if (opts.bench > 0) {
    std::vector<double> ms;
    for (int i = 0; i < opts.bench; ++i) {
      auto start = std::chrono::steady_clock::now();
      runOnce();
      ms.push_back(std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - start)
                       .count());
    }
    std::sort(ms.begin(), ms.end());
    auto pct = [&](double p) {
      return ms[std::min<size_t>(ms.size() - 1, size_t(p * ms.size()))];
    };
    double mean = 0;
    for (double m : ms)
      mean += m;
    mean /= ms.size();
    int64_t batch =
        info->num_inputs && info->inputs[0].rank ? info->inputs[0].shape[0] : 1;
    std::printf("bench: %d runs, latency ms p50 %.3f p90 %.3f p99 %.3f mean "
                "%.3f; %.1f runs/s, %.1f samples/s (batch %lld)\n",
                opts.bench, pct(0.5), pct(0.9), pct(0.99), mean, 1000.0 / mean,
                1000.0 * batch / mean, static_cast<long long>(batch));
  }
  return allMatch ? 0 : 1;
}
