//===- FdGradients.cpp - pcc's gradients against float64 differences ------===//
//
// pcc-fd-gradients checks one training step of a model library against the
// float64 reference interpreter (Interpreter.h), for the plan fuzzer
// (scripts/fuzz_plans.py) and by hand:
//
//   pcc m.onnx --train --loss=cross_entropy --dump-ir=ir -o m.so
//   pcc-run m.so --steps 1 --lr 1 --momentum 0 --weight-decay 0 \
//       --input x.npy --labels y.npy --save-dir ck --loss-log loss.csv
//   pcc-fd-gradients ir/NN-pcc-loss.mlir --weights m.safetensors \
//       --stepped ck/step-00000001/weights.safetensors --lr 1 \
//       --input x.npy --labels y.npy --loss-log loss.csv
//
// The IR after pcc-loss is the model's forward pass with its loss summed
// over the labels; the runtime divides that sum by the labels that count
// (cross-entropy: those other than the ignore index; mse: every element).
// The interpreter evaluates it in double at the initial weights: the loss
// must be pcc's step-1 loss, and for sampled elements of every weight the
// central difference of the objective must be pcc's gradient, recovered
// from one plain SGD step (w1 = w0 - lr g). An element where differences
// of three step sizes disagree (a ReLU kink, a max tie within reach) is
// skipped, and counted. Exit 0 when everything matches, 1 when something
// differs (each difference printed), 2 on bad input.
//
//===----------------------------------------------------------------------===//

#include "Interpreter.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/runtime/Npy.h"
#include "pcc/runtime/Safetensors.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

using namespace mlir;
using ::pcc::testing::interpret;
using ::pcc::testing::Tensor;
namespace cl = llvm::cl;

static cl::opt<std::string> irFile(cl::Positional, cl::Required,
                                   cl::desc("<the IR after pcc-loss>"));
static cl::list<std::string> inputs("input", cl::desc("a model input (.npy)"));
static cl::opt<std::string> labelsFile("labels", cl::Required,
                                       cl::desc("the labels (.npy)"));
static cl::opt<std::string> weightsFile("weights", cl::Required,
                                        cl::desc("the initial weights"));
static cl::opt<std::string>
    steppedFile("stepped", cl::Required,
                cl::desc("the weights after one SGD step (no momentum, no "
                         "weight decay)"));
static cl::opt<double> lr("lr", cl::init(1.0), cl::desc("that step's lr"));
static cl::opt<std::string> lossLog("loss-log",
                                    cl::desc("pcc-run's loss log of that step"));
static cl::opt<int> samples("samples", cl::init(6),
                            cl::desc("elements checked per weight"));
static cl::opt<double> tolerance(
    "tolerance", cl::init(2e-3),
    cl::desc("allowed |g - fd|, relative to the weight's largest |fd|"));

[[noreturn]] static void die(const std::string &message) {
  llvm::errs() << "pcc-fd-gradients: error: " << message << "\n";
  std::exit(2);
}

static Tensor fromNpy(const std::string &path) {
  auto array = pccrt::readNpy(path);
  if (!array)
    die(array.error());
  Tensor t;
  t.shape = array->shape;
  int64_t n = pccrt::elementCount(array->shape);
  t.data.resize(n);
  const uint8_t *p = array->data.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (array->dtype) {
    case pccrt::DType::F32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      t.data[i] = f;
      break;
    }
    case pccrt::DType::I64: {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      t.data[i] = static_cast<double>(v);
      break;
    }
    default:
      die(path + ": only float32 and int64 arrays are read");
    }
  }
  return t;
}

static std::map<std::string, Tensor> readWeights(const std::string &path) {
  auto file = pccrt::SafetensorsFile::open(path);
  if (!file)
    die(file.error());
  std::map<std::string, Tensor> out;
  for (const pccrt::TensorEntry &e : file->tensors()) {
    if (e.dtype != pccrt::DType::F32)
      continue;
    Tensor t;
    t.shape = e.shape;
    t.data.resize(pccrt::elementCount(e.shape));
    const uint8_t *p = file->data(e);
    for (size_t i = 0; i < t.data.size(); ++i) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      t.data[i] = f;
    }
    out[e.name] = std::move(t);
  }
  return out;
}

/// pcc-run's step-1 loss from its log (step,loss,...).
static double loggedLoss(const std::string &path) {
  std::ifstream in(path);
  std::string header, row;
  if (!std::getline(in, header) || !std::getline(in, row))
    die(path + ": no step in the loss log");
  std::stringstream ss(row);
  std::string step, loss;
  std::getline(ss, step, ',');
  std::getline(ss, loss, ',');
  return std::stod(loss);
}

int main(int argc, char **argv) {
  cl::ParseCommandLineOptions(argc, argv,
                              "pcc's gradients against float64 central "
                              "differences of the reference interpreter\n");
  MLIRContext context;
  context.loadDialect<mlir::pcc::PccDialect, func::FuncDialect>();
  llvm::SourceMgr sources;
  OwningOpRef<ModuleOp> module =
      parseSourceFile<ModuleOp>(irFile.getValue(), sources, &context);
  if (!module)
    die("cannot parse " + irFile);
  func::FuncOp main = module->lookupSymbol<func::FuncOp>("main");
  if (!main || main.getNumResults() != 1)
    die(irFile + ": expects @main returning the summed loss (the IR after "
                 "pcc-loss)");
  auto training = (*module)->getAttrOfType<DictionaryAttr>("pcc.training");
  if (!training)
    die(irFile + ": no pcc.training attribute (the IR after pcc-loss)");
  std::string kind = cast<StringAttr>(training.get("loss")).str();
  int64_t ignore = training.getAs<IntegerAttr>("ignore_index")
                       ? training.getAs<IntegerAttr>("ignore_index").getInt()
                       : -100;

  std::vector<Tensor> args;
  for (const std::string &f : inputs)
    args.push_back(fromNpy(f));
  Tensor labels = fromNpy(labelsFile);
  args.push_back(labels);
  if (args.size() != main.getNumArguments())
    die(llvm::formatv("@main takes {0} arguments; {1} inputs and the labels "
                      "given",
                      main.getNumArguments(), inputs.size())
            .str());
  // Step 1 reads the first batch of rows of each file, as pcc-run does.
  for (auto [i, t] : llvm::enumerate(args)) {
    auto type = cast<RankedTensorType>(main.getArgument(i).getType());
    int64_t want = type.getNumElements();
    if (t.shape.empty() || type.getRank() == 0 ||
        static_cast<int64_t>(t.data.size()) < want ||
        llvm::ArrayRef<int64_t>(t.shape).drop_front() !=
            type.getShape().drop_front())
      die(llvm::formatv("argument {0} of @main is {1}; the file's shape "
                        "does not hold it",
                        i, type)
              .str());
    t.data.resize(want);
    t.shape[0] = type.getDimSize(0);
  }
  // What the runtime divides the summed loss by.
  double count = 0;
  for (double y : args.back().data)
    count += kind == "cross_entropy" ? (y != ignore) : 1;
  if (count == 0)
    die("no label counts");

  std::map<std::string, Tensor> weights = readWeights(weightsFile),
                                stepped = readWeights(steppedFile);
  auto objective = [&]() {
    std::string error;
    auto r = interpret(
        main, args,
        [&](StringRef name) {
          auto it = weights.find(name.str());
          return it == weights.end() ? Tensor() : it->second;
        },
        &error);
    if (failed(r))
      die("the interpreter cannot run " + irFile + ": " + error);
    return (*r)[0].data[0] / count;
  };

  int bad = 0, checked = 0, skipped = 0;
  double loss = objective();
  if (!lossLog.empty()) {
    double logged = loggedLoss(lossLog);
    bool same = std::fabs(logged - loss) <= 1e-4 * std::fabs(loss) + 1e-6;
    llvm::outs() << llvm::formatv("loss: interpreter {0:e}, pcc {1:e}{2}\n",
                                  loss, logged, same ? "" : "  DIFFERS");
    bad += !same;
  }
  // The params the program reads (a tied weight once).
  std::vector<std::string> names;
  main.walk([&](mlir::pcc::ParamOp p) {
    std::string n = p.getName().str();
    if (weights.count(n) && std::find(names.begin(), names.end(), n) ==
                                names.end())
      names.push_back(n);
  });
  std::mt19937_64 rng(7);
  struct Pair {
    double g, fd, w0;
  };
  std::vector<std::pair<std::string, std::vector<Pair>>> sampled;
  for (const std::string &name : names) {
    Tensor &w = weights[name];
    auto it = stepped.find(name);
    if (it == stepped.end() || it->second.data.size() != w.data.size())
      die("weight '" + name + "' is not in " + steppedFile + " whole");
    const Tensor &w1 = it->second;
    std::vector<size_t> picks;
    for (int k = 0; k < samples && k < static_cast<int>(w.data.size()); ++k)
      picks.push_back(std::uniform_int_distribution<size_t>(
          0, w.data.size() - 1)(rng));
    std::vector<Pair> pairs;
    for (size_t i : picks) {
      double w0 = w.data[i];
      auto difference = [&](double h) {
        w.data[i] = w0 + h;
        double up = objective();
        w.data[i] = w0 - h;
        double down = objective();
        w.data[i] = w0;
        return (up - down) / (2 * h);
      };
      double h = 1e-5 * std::max(1.0, std::fabs(w0));
      double fd = difference(h), fdSmall = difference(h / 8),
             fdLarge = difference(h * 8);
      double scale = std::max({std::fabs(fd), std::fabs(fdSmall), 1e-12});
      if (std::fabs(fd - fdSmall) > 1e-4 * scale + 1e-9 ||
          std::fabs(fd - fdLarge) > 1e-3 * scale + 1e-9) {
        ++skipped; // not differentiable within reach
        continue;
      }
      // The stored weights are float32: the step recovers g to their ulp.
      double g = (w0 - w1.data[i]) / lr;
      pairs.push_back({g, fd, w0});
    }
    sampled.push_back({name, std::move(pairs)});
  }
  // The model's gradient scale: a gradient that is zero in exact arithmetic
  // (attention's key bias, which shifts every score of a row alike) comes
  // out of float32 as rounding noise of the terms that cancel, which are of
  // this scale, not of its own.
  double modelTop = 0;
  for (auto &[name, pairs] : sampled)
    for (const Pair &p : pairs)
      modelTop = std::max(modelTop, std::fabs(p.fd));
  for (auto &[name, pairs] : sampled) {
    double top = 0;
    for (const Pair &p : pairs)
      top = std::max(top, std::fabs(p.fd));
    for (const Pair &p : pairs) {
      ++checked;
      double ulp =
          2.0 * std::ldexp(1.0, -23) * std::max(1.0, std::fabs(p.w0)) / lr;
      double allowed =
          tolerance * top + 1e-3 * std::fabs(p.fd) + 1e-5 * modelTop + ulp;
      if (std::fabs(p.g - p.fd) > allowed) {
        ++bad;
        llvm::outs() << llvm::formatv(
            "gradient of '{0}': pcc {1:e}, float64 difference {2:e}  "
            "DIFFERS\n",
            name, p.g, p.fd);
      }
    }
  }
  llvm::outs() << llvm::formatv("pcc-fd-gradients: {0} weights, {1} elements "
                                "checked, {2} skipped (not differentiable "
                                "within reach), {3} differ\n",
                                names.size(), checked, skipped, bad);
  return bad ? 1 : 0;
}
