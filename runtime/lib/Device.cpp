//===- Device.cpp - CPU and CUDA devices, ModelRunner ---------------------===//

#include "pcc/runtime/Device.h"

#include <algorithm>

#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/CudaKernels.h"
#include "pcc/runtime/DType.h"

#include "Loader.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <vector>

namespace pccrt {

namespace {
const pcc_profile *processProfile = nullptr;
} // namespace

void setRunProfile(const pcc_profile *profile) { processProfile = profile; }
const pcc_profile *runProfile() { return processProfile; }

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The best of `times` runs of `run` (a Status-returning call) after one
/// warm-up, in seconds.
/// A causal self-attention's sizes, as pcc_cpu_attention reads them.
pcc_attention_shape causalAttention(int64_t batchHeads, int64_t seq,
                                    int64_t headDim, bool bf16) {
  pcc_attention_shape shape{};
  shape.batch = 1;
  shape.heads = shape.kv_heads = batchHeads;
  shape.seq = shape.len = seq;
  shape.head_dim = shape.v_dim = headDim;
  shape.scale = 1.0 / std::sqrt(static_cast<double>(headDim));
  shape.causal = 1;
  shape.dtype = bf16 ? 1 : 0;
  return shape;
}

template <typename Fn> Result<double> bestOf(int times, Fn run) {
  if (Status s = run(); !s.ok())
    return Error{s.error()};
  double best = 1e30;
  for (int i = 0; i < std::max(1, times); ++i) {
    Clock::time_point t0 = Clock::now();
    if (Status s = run(); !s.ok())
      return Error{s.error()};
    best = std::min(best, secondsSince(t0));
  }
  return best;
}

/// The mean of `times` runs of `run` after one warm-up, the device
/// synchronised once at the end (`sync`).
template <typename Fn, typename Sync>
Result<double> meanOf(int times, Fn run, Sync sync) {
  run();
  if (Status s = sync(); !s.ok())
    return Error{s.error()};
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < std::max(1, times); ++i)
    run();
  if (Status s = sync(); !s.ok())
    return Error{s.error()};
  return secondsSince(t0) / std::max(1, times);
}

class CpuDevice final : public Device {
public:
  std::string describe() const override { return "cpu"; }
  pcc_target target() const override { return PCC_TARGET_CPU; }
  Result<void *> allocate(int64_t bytes) override {
    size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 64));
    void *ptr = std::aligned_alloc(64, (size + 63) / 64 * 64);
    if (!ptr)
      return Error{"cannot allocate " + std::to_string(bytes) +
                   " bytes of host memory"};
    return ptr;
  }
  void release(void *ptr) override { std::free(ptr); }
  Status copyToDevice(void *dst, const void *src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return Status::success();
  }
  Status copyToHost(void *dst, const void *src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return Status::success();
  }
  Status synchronize() override { return Status::success(); }
  pcc_run_context runContext() const override {
    return {PCC_TARGET_CPU, 0, nullptr, nullptr, nullptr, runProfile()};
  }
  Result<double> timeProduct(int64_t m, int64_t n, int64_t k, bool bf16,
                             int times) override {
    if (!bf16) {
      std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n);
      return bestOf(times, [&] {
        pcc_cpu_matmul_f32(a.data(), b.data(), c.data(), 1, m, n, k, 0, 0, 0,
                           0);
        return Status::success();
      });
    }
    // 0.5 and 0.25 in bf16.
    std::vector<uint16_t> a(m * k, 0x3f00), b(k * n, 0x3e80), c(m * n);
    return bestOf(times, [&]() -> Status {
      if (pcc_cpu_matmul_bf16(a.data(), b.data(), c.data(), 1, m, n, k, 0, 0, 0,
                              0))
        return Error{std::string("bf16 products: ") + pcc_cpu_last_error()};
      return Status::success();
    });
  }
  Result<double> timeCopy(int64_t bytes, int times) override {
    std::vector<char> from(static_cast<size_t>(bytes), 1),
        to(static_cast<size_t>(bytes), 2);
    int64_t shape = bytes, stride = 1;
    // Through the runtime's copy kernel, as a model library's copies run.
    return meanOf(
        times,
        [&] {
          pcc_cpu_copy_strided(from.data(), to.data(), 1, 1, &shape, &stride, 0,
                               &stride, 0);
        },
        [] { return Status::success(); });
  }
  Result<double> timeAttention(int64_t batchHeads, int64_t seq,
                               int64_t headDim, bool bf16, bool grad,
                               int times) override {
    pcc_attention_shape shape =
        causalAttention(batchHeads, seq, headDim, bf16);
    auto elements = static_cast<size_t>(batchHeads * seq * headDim);
    // 0.5 in each precision; every tensor of q's shape.
    std::vector<float> f32(bf16 ? 0 : 7 * elements, 0.5f);
    std::vector<uint16_t> b16(bf16 ? 7 * elements : 0, 0x3f00);
    auto at = [&](int i) -> void * {
      return bf16 ? static_cast<void *>(b16.data() + i * elements)
                  : static_cast<void *>(f32.data() + i * elements);
    };
    std::vector<float> lse(static_cast<size_t>(batchHeads * seq));
    if (pcc_cpu_attention(&shape, at(0), at(1), at(2), nullptr, at(3),
                          lse.data()))
      return Error{std::string("attention: ") + pcc_cpu_last_error()};
    return bestOf(times, [&]() -> Status {
      int rc = grad ? pcc_cpu_attention_grad(&shape, at(0), at(1), at(2),
                                             at(3), lse.data(), at(3), nullptr,
                                             at(4), at(5), at(6))
                    : pcc_cpu_attention(&shape, at(0), at(1), at(2), nullptr,
                                        at(3), lse.data());
      if (rc)
        return Error{std::string("attention: ") + pcc_cpu_last_error()};
      return Status::success();
    });
  }
};


/// The host-side entry points of libpcc_runtime_cuda.so, found with dlsym.
struct CudaApi {
  decltype(&pcc_cuda_last_error) lastError;
  decltype(&pcc_cuda_device_count) deviceCount;
  decltype(&pcc_cuda_context_create) contextCreate;
  decltype(&pcc_cuda_context_destroy) contextDestroy;
  decltype(&pcc_cuda_device_name) deviceName;
  decltype(&pcc_cuda_malloc) malloc;
  decltype(&pcc_cuda_free) free;
  decltype(&pcc_cuda_copy_to_device) copyToDevice;
  decltype(&pcc_cuda_copy_to_host) copyToHost;
  decltype(&pcc_cuda_synchronize) synchronize;
  decltype(&pcc_cuda_capture_begin) captureBegin;
  decltype(&pcc_cuda_capture_end) captureEnd;
  decltype(&pcc_cuda_graph_run) graphRun;
  decltype(&pcc_cuda_finish) finish;
  decltype(&pcc_cuda_matmul_f32) matmulF32;
  decltype(&pcc_cuda_matmul_bf16) matmulBf16;
  decltype(&pcc_cuda_copy_strided) copyStrided;
  decltype(&pcc_cuda_attention) attention;
  decltype(&pcc_cuda_attention_grad) attentionGrad;
};

} // namespace

Result<void *> loadRuntimeLibrary(const char *fileName, const char *envVar,
                                  const std::string &purpose) {
  std::vector<std::string> candidates;
  if (const char *env = std::getenv(envVar))
    candidates.push_back(env);
  std::string dir;
  Dl_info info;
  if (dladdr(reinterpret_cast<void *>(&loadRuntimeLibrary), &info) &&
      info.dli_fname) {
    std::string path = info.dli_fname;
    size_t slash = path.find_last_of('/');
    if (slash != std::string::npos)
      dir = path.substr(0, slash + 1);
  }
  candidates.push_back(dir + fileName);
  candidates.push_back(dir + "../lib/" + fileName);
  candidates.push_back(fileName);
  std::string errors;
  for (const std::string &path : candidates) {
    if (void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL))
      return handle;
    errors += std::string("\n  ") + dlerror();
  }
  return Error{purpose + errors};
}

namespace {

Result<CudaApi> loadCudaApi() {
  auto loaded = loadRuntimeLibrary(
      "libpcc_runtime_cuda.so", "PCC_RUNTIME_CUDA_LIBRARY",
      "the CUDA backend (libpcc_runtime_cuda.so) cannot be loaded; was pcc "
      "built with a CUDA toolkit, and are libcudart and libcublas on the "
      "library path?");
  if (!loaded.ok())
    return Error{loaded.error()};
  void *handle = *loaded;
  CudaApi api;
  bool ok = true;
  auto bind = [&](auto &fn, const char *name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
        dlsym(handle, name));
    ok = ok && fn;
  };
  bind(api.lastError, "pcc_cuda_last_error");
  bind(api.deviceCount, "pcc_cuda_device_count");
  bind(api.contextCreate, "pcc_cuda_context_create");
  bind(api.contextDestroy, "pcc_cuda_context_destroy");
  bind(api.deviceName, "pcc_cuda_device_name");
  bind(api.malloc, "pcc_cuda_malloc");
  bind(api.free, "pcc_cuda_free");
  bind(api.copyToDevice, "pcc_cuda_copy_to_device");
  bind(api.copyToHost, "pcc_cuda_copy_to_host");
  bind(api.synchronize, "pcc_cuda_synchronize");
  bind(api.captureBegin, "pcc_cuda_capture_begin");
  bind(api.captureEnd, "pcc_cuda_capture_end");
  bind(api.graphRun, "pcc_cuda_graph_run");
  bind(api.finish, "pcc_cuda_finish");
  bind(api.matmulF32, "pcc_cuda_matmul_f32");
  bind(api.matmulBf16, "pcc_cuda_matmul_bf16");
  bind(api.copyStrided, "pcc_cuda_copy_strided");
  bind(api.attention, "pcc_cuda_attention");
  bind(api.attentionGrad, "pcc_cuda_attention_grad");
  if (!ok)
    return Error{"libpcc_runtime_cuda.so lacks the pcc_cuda_* entry points; "
                 "it belongs to another pcc version"};
  return api;
}

class CudaDevice final : public Device {
public:
  CudaDevice(CudaApi api, pcc_cuda_context *ctx, int ordinal)
      : api(api), ctx(ctx), ordinal(ordinal) {}
  ~CudaDevice() override { api.contextDestroy(ctx); }

  std::string describe() const override {
    return "cuda:" + std::to_string(ordinal) + " (" + api.deviceName(ctx) + ")";
  }
  pcc_target target() const override { return PCC_TARGET_CUDA; }
  Result<void *> allocate(int64_t bytes) override {
    void *ptr = nullptr;
    if (api.malloc(ctx, &ptr, std::max<int64_t>(bytes, 256)))
      return Error{api.lastError()};
    return ptr;
  }
  void release(void *ptr) override { api.free(ctx, ptr); }
  Status copyToDevice(void *dst, const void *src, int64_t bytes) override {
    if (bytes && api.copyToDevice(ctx, dst, src, bytes))
      return Error{api.lastError()};
    return Status::success();
  }
  Status copyToHost(void *dst, const void *src, int64_t bytes) override {
    if (bytes && api.copyToHost(ctx, dst, src, bytes))
      return Error{api.lastError()};
    return Status::success();
  }
  Status synchronize() override {
    if (api.synchronize(ctx))
      return Error{api.lastError()};
    return Status::success();
  }
  pcc_run_context runContext() const override {
    return {PCC_TARGET_CUDA, ordinal, ctx, nullptr, nullptr, runProfile()};
  }
  Status beginCapture() override {
    if (api.captureBegin(ctx))
      return Error{api.lastError()};
    return Status::success();
  }
  Status endCapture() override {
    if (api.captureEnd(ctx))
      return Error{api.lastError()};
    return Status::success();
  }
  Status replay() override {
    if (api.graphRun(ctx))
      return Error{std::string("the model graph failed: ") + api.lastError()};
    return Status::success();
  }
  Result<double> timeProduct(int64_t m, int64_t n, int64_t k, bool bf16,
                             int times) override {
    int64_t elem = bf16 ? 2 : 4;
    auto a = DeviceBuffer::zeros(*this, m * k * elem);
    auto b = DeviceBuffer::zeros(*this, k * n * elem);
    auto c = DeviceBuffer::zeros(*this, m * n * elem);
    if (!a.ok() || !b.ok() || !c.ok())
      return Error{!a.ok() ? a.error() : !b.ok() ? b.error() : c.error()};
    return bestOf(times, [&]() -> Status {
      if (bf16)
        api.matmulBf16(ctx, a->data(), b->data(), c->data(), 1, m, n, k, 0, 0,
                       0, 0);
      else
        api.matmulF32(ctx, static_cast<const float *>(a->data()),
                      static_cast<const float *>(b->data()),
                      static_cast<float *>(c->data()), 1, m, n, k, 0, 0, 0, 0);
      return finish();
    });
  }
  Result<double> timeCopy(int64_t bytes, int times) override {
    auto from = DeviceBuffer::zeros(*this, bytes);
    auto to = DeviceBuffer::zeros(*this, bytes);
    if (!from.ok() || !to.ok())
      return Error{!from.ok() ? from.error() : to.error()};
    int64_t shape = bytes, stride = 1;
    return meanOf(
        times,
        [&] {
          api.copyStrided(ctx, from->data(), to->data(), 1, 1, &shape, &stride,
                          0, &stride, 0);
        },
        [&] { return finish(); });
  }
  Result<double> timeAttention(int64_t batchHeads, int64_t seq,
                               int64_t headDim, bool bf16, bool grad,
                               int times) override {
    pcc_attention_shape shape =
        causalAttention(batchHeads, seq, headDim, bf16);
    int64_t bytes = batchHeads * seq * headDim * (bf16 ? 2 : 4);
    std::vector<DeviceBuffer> t;
    for (int i = 0; i < 7; ++i) {
      auto b = DeviceBuffer::zeros(*this, bytes);
      if (!b.ok())
        return Error{b.error()};
      t.push_back(b.take());
    }
    auto lse = DeviceBuffer::zeros(*this, batchHeads * seq * 4);
    if (!lse.ok())
      return Error{lse.error()};
    auto *l = static_cast<float *>(lse->data());
    api.attention(ctx, &shape, t[0].data(), t[1].data(), t[2].data(), nullptr,
                  t[3].data(), l);
    if (Status s = finish(); !s.ok())
      return Error{s.error()};
    return bestOf(times, [&]() -> Status {
      if (grad)
        api.attentionGrad(ctx, &shape, t[0].data(), t[1].data(), t[2].data(),
                          t[3].data(), l, t[3].data(), nullptr, t[4].data(),
                          t[5].data(), t[6].data());
      else
        api.attention(ctx, &shape, t[0].data(), t[1].data(), t[2].data(),
                      nullptr, t[3].data(), l);
      return finish();
    });
  }

private:
  /// Waits for the stream; an error a kernel recorded is one.
  Status finish() {
    if (api.finish(ctx) != 0)
      return Error{api.lastError()};
    return Status::success();
  }

  CudaApi api;
  pcc_cuda_context *ctx;
  int ordinal;
};

} // namespace

Result<std::unique_ptr<Device>> Device::open(const std::string &spec) {
  if (spec == "cpu")
    return std::unique_ptr<Device>(new CpuDevice());
  if (spec.rfind("cuda", 0) != 0)
    return Error{"unknown device '" + spec + "' (cpu, cuda or cuda:N)"};
  int ordinal = 0;
  if (spec.size() > 4) {
    char *end = nullptr;
    long n = spec[4] == ':' ? std::strtol(spec.c_str() + 5, &end, 10) : -1;
    if (spec[4] != ':' || !end || *end || end == spec.c_str() + 5 || n < 0)
      return Error{"unknown device '" + spec + "' (cpu, cuda or cuda:N)"};
    ordinal = static_cast<int>(n);
  }
  auto api = loadCudaApi();
  if (!api.ok())
    return Error{api.error()};
  int count = api->deviceCount();
  if (count == 0)
    return Error{api->lastError()};
  if (ordinal >= count)
    return Error{"device '" + spec + "' does not exist: this machine has " +
                 std::to_string(count) + " CUDA device(s)"};
  pcc_cuda_context *ctx = api->contextCreate(ordinal);
  if (!ctx)
    return Error{"cannot use CUDA device " + std::to_string(ordinal) + ": " +
                 api->lastError()};
  return std::unique_ptr<Device>(new CudaDevice(*api, ctx, ordinal));
}

Result<int> Device::cudaDeviceCount() {
  auto api = loadCudaApi();
  if (!api.ok())
    return Error{api.error()};
  int count = api->deviceCount();
  if (count == 0)
    return Error{api->lastError()};
  return count;
}

Status Device::beginCapture() {
  return Error{describe() + " has no graphs to capture (CUDA only)"};
}
Status Device::endCapture() { return beginCapture(); }
Status Device::replay() { return beginCapture(); }

Result<DeviceBuffer> DeviceBuffer::zeros(Device &device, int64_t bytes) {
  auto buffer = allocate(device, bytes);
  if (!buffer.ok())
    return Error{buffer.error()};
  if (bytes > 0) {
    std::vector<uint8_t> host(static_cast<size_t>(bytes), 0);
    Status copied = device.copyToDevice(buffer->data(), host.data(), bytes);
    if (!copied.ok())
      return Error{copied.error()};
  }
  return buffer.take();
}

Result<DeviceBuffer> DeviceBuffer::allocate(Device &device, int64_t bytes) {
  auto ptr = device.allocate(bytes);
  if (!ptr.ok())
    return Error{ptr.error()};
  DeviceBuffer buffer;
  buffer.device = &device;
  buffer.ptr = *ptr;
  buffer.bytes = bytes;
  device.inUse += bytes;
  device.peak = std::max(device.peak, device.inUse);
  return buffer;
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  std::swap(device, other.device);
  std::swap(ptr, other.ptr);
  std::swap(bytes, other.bytes);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (device && ptr) {
    device->release(ptr);
    device->inUse -= bytes;
  }
}

Status checkTarget(const ModelLibrary &library, const Device &device) {
  const pcc_model_info &info = library.info();
  if (!(info.targets & device.target()))
    return Error{"the model was compiled for " + std::string(info.target) +
                 " and cannot run on " + device.describe() +
                 "; compile it with pcc --target=" +
                 (device.isHost() ? "cpu" : "cuda") + " (or --target=all)"};
  return Status::success();
}

Result<ModelRunner>
ModelRunner::create(const ModelLibrary &library, Device &device,
                    const std::vector<const void *> &weights) {
  const pcc_model_info &info = library.info();
  Status target = checkTarget(library, device);
  if (!target.ok())
    return Error{target.error()};
  ModelRunner runner;
  runner.library = &library;
  runner.device = &device;
  auto own = [&](int64_t bytes) -> Result<void *> {
    auto buffer = DeviceBuffer::allocate(device, bytes);
    if (!buffer.ok())
      return Error{buffer.error()};
    runner.owned.push_back(buffer.take());
    return runner.owned.back().data();
  };
  for (int i = 0; i < info.num_weights; ++i) {
    if (device.isHost()) {
      runner.weightPtrs.push_back(weights[i]);
      continue;
    }
    int64_t bytes = specBytes(info.weights[i]);
    auto ptr = own(bytes);
    if (!ptr.ok())
      return Error{"weight '" + std::string(info.weights[i].name) +
                   "': " + ptr.error()};
    Status s = device.copyToDevice(*ptr, weights[i], bytes);
    if (!s.ok())
      return Error{"weight '" + std::string(info.weights[i].name) +
                   "': " + s.error()};
    runner.weightPtrs.push_back(*ptr);
  }
  // Device buffers for the inputs and the outputs.
  auto ownAll = [&](const pcc_tensor_spec *specs, int count, const char *kind,
                    auto &pointers) -> Status {
    for (int i = 0; i < count; ++i) {
      auto ptr = own(specBytes(specs[i]));
      if (!ptr.ok())
        return Error{std::string(kind) + " '" + specs[i].name +
                     "': " + ptr.error()};
      pointers.push_back(*ptr);
    }
    return Status::success();
  };
  Status buffers =
      ownAll(info.inputs, info.num_inputs, "input", runner.inputPtrs);
  if (buffers.ok())
    buffers =
        ownAll(info.outputs, info.num_outputs, "output", runner.outputPtrs);
  if (!buffers.ok())
    return Error{buffers.error()};
  auto arena = own(info.arena_bytes);
  if (!arena.ok())
    return Error{"the " + std::to_string(info.arena_bytes) +
                 "-byte arena: " + arena.error()};
  runner.arena = *arena;
  return runner;
}

Status ModelRunner::run(const std::vector<const void *> &inputs,
                        const std::vector<void *> &outputs) {
  const pcc_model_info &info = library->info();
  for (int i = 0; i < info.num_inputs; ++i) {
    Status s = device->copyToDevice(const_cast<void *>(inputPtrs[i]), inputs[i],
                                    specBytes(info.inputs[i]));
    if (!s.ok())
      return Error{"input '" + std::string(info.inputs[i].name) +
                   "': " + s.error()};
  }
  Status s = runResident();
  if (!s.ok())
    return s;
  return readOutputs(outputs);
}

Status ModelRunner::captureGraph() {
  Status s = device->beginCapture();
  if (!s.ok())
    return s;
  Status run = runResident();
  Status end = device->endCapture();
  if (!run.ok())
    return run;
  return end;
}

Status ModelRunner::replayGraph() { return device->replay(); }

Status ModelRunner::readOutputs(const std::vector<void *> &outputs) {
  const pcc_model_info &info = library->info();
  for (int i = 0; i < info.num_outputs; ++i) {
    Status c = device->copyToHost(outputs[i], outputPtrs[i],
                                  specBytes(info.outputs[i]));
    if (!c.ok())
      return Error{"output '" + std::string(info.outputs[i].name) +
                   "': " + c.error()};
  }
  return Status::success();
}

Status ModelRunner::runResident() {
  pcc_run_context context = device->runContext();
  context.comms = comms;
  return library->run(context, inputPtrs.data(), outputPtrs.data(),
                      weightPtrs.data(), arena);
}

} // namespace pccrt
