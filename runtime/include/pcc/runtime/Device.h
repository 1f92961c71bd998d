//===- Device.h - where a model runs: memory, copies, run context -*- C++
//-*-===//
//
// One interface over the backends a model library can run on. The CPU
// device is the host itself. The CUDA device lives in
// libpcc_runtime_cuda.so, which this runtime loads on demand, so programs
// built on the runtime (pcc-run) start and run CPU models on machines
// without CUDA and say precisely what is missing when asked for a GPU.
//
// ModelRunner binds a loaded model to a device: weights, inputs, outputs
// and the arena in device memory, host-side copies in and out.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_DEVICE_H
#define PCC_RUNTIME_DEVICE_H

#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/ModelLibrary.h"
#include "pcc/runtime/Result.h"

#include <memory>
#include <string>
#include <vector>

namespace pccrt {

class Device {
public:
  virtual ~Device() = default;

  /// "cpu", "cuda" (device 0) or "cuda:N".
  static Result<std::unique_ptr<Device>> open(const std::string &spec);
  /// The number of CUDA devices, or why there are none usable.
  static Result<int> cudaDeviceCount();

  /// "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB)".
  virtual std::string describe() const = 0;
  virtual pcc_target target() const = 0;
  /// Whether device memory is host memory (no copies needed).
  bool isHost() const { return target() == PCC_TARGET_CPU; }

  virtual Result<void *> allocate(int64_t bytes) = 0;
  virtual void release(void *ptr) = 0;
  virtual Status copyToDevice(void *dst, const void *src, int64_t bytes) = 0;
  virtual Status copyToHost(void *dst, const void *src, int64_t bytes) = 0;
  virtual Status synchronize() = 0;
  /// The context every model run on this device receives (its profile is
  /// the process's, runProfile()).
  virtual pcc_run_context runContext() const = 0;

  /// Record the work enqueued between these two calls as a graph (CUDA
  /// graphs; runs are then not executed) and replay it. Devices without
  /// graphs say so.
  virtual Status beginCapture();
  virtual Status endCapture();
  virtual Status replay();

  /// Calibration (pcc calibrate), on buffers of this device: the seconds
  /// of one product C[m,n] = A[m,k] B[k,n] through the kernels model
  /// libraries call (fp32, or bf16 operands and result with fp32
  /// accumulation), the best of `times` after one warm-up; and of one
  /// device-to-device copy of `bytes` (the mean of `times` calls, so that
  /// tiny copies measure a kernel's fixed cost).
  virtual Result<double> timeProduct(int64_t m, int64_t n, int64_t k, bool bf16,
                                     int times) = 0;
  virtual Result<double> timeCopy(int64_t bytes, int times) = 0;
  /// The seconds of one fused causal attention (pcc.attention) of
  /// `batchHeads` heads of `seq` queries and keys of width `headDim`, or of
  /// its gradient (pcc.attention_grad), through the kernels model
  /// libraries call (f32, or bf16 operands), the best of `times` after one
  /// warm-up.
  virtual Result<double> timeAttention(int64_t batchHeads, int64_t seq,
                                       int64_t headDim, bool bf16, bool grad,
                                       int times) = 0;

  /// Bytes held in DeviceBuffers now, and the most ever held at once: the
  /// runtime's measured memory high-water mark on this device.
  int64_t bytesInUse() const { return inUse; }
  int64_t peakBytes() const { return peak; }

private:
  friend class DeviceBuffer;
  int64_t inUse = 0, peak = 0;
};

/// The profiler that every run context of this process carries
/// (pcc-run --profile), or null: set before the runs to profile.
void setRunProfile(const pcc_profile *profile);
const pcc_profile *runProfile();
/// Ends the profiled interval of the op a run function marked last (its
/// caller calls this when the function returns).
inline void closeProfile(const pcc_run_context &context) {
  if (context.profile)
    context.profile->mark(context.profile->state, nullptr);
}

/// Device memory owned by its device.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> allocate(Device &device, int64_t bytes);
  /// The same, filled with zero bytes.
  static Result<DeviceBuffer> zeros(Device &device, int64_t bytes);
  DeviceBuffer(DeviceBuffer &&other) noexcept { *this = std::move(other); }
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer();
  void *data() const { return ptr; }

private:
  Device *device = nullptr;
  void *ptr = nullptr;
  int64_t bytes = 0;
};

/// Fails, naming the fix, when `library` has no code for `device`.
Status checkTarget(const ModelLibrary &library, const Device &device);

/// A model library bound to a device with its weights in device memory.
class ModelRunner {
public:
  /// Checks that the library has code for the device's target and copies
  /// the weights (host pointers, in the model's order) to the device; on
  /// the CPU they are used in place.
  static Result<ModelRunner> create(const ModelLibrary &library, Device &device,
                                    const std::vector<const void *> &weights);

  /// Copies host inputs in, runs, copies outputs back to host buffers.
  Status run(const std::vector<const void *> &inputs,
             const std::vector<void *> &outputs);
  /// Runs again on the inputs already on the device (for timing).
  Status runResident();
  /// Records one run as a graph (CUDA); replayGraph() then repeats it
  /// with a single launch.
  Status captureGraph();
  Status replayGraph();
  /// Copies the device outputs to host buffers.
  Status readOutputs(const std::vector<void *> &outputs);
  /// The collectives of each mesh axis of the library (see CommBinding),
  /// for libraries partitioned over several ranks.
  void setCommunicators(const pcc_comm *tables) { comms = tables; }

private:
  ModelRunner() = default;
  const ModelLibrary *library = nullptr;
  Device *device = nullptr;
  std::vector<DeviceBuffer> owned;
  std::vector<const void *> weightPtrs, inputPtrs;
  std::vector<void *> outputPtrs;
  void *arena = nullptr;
  const pcc_comm *comms = nullptr;
};

} // namespace pccrt

#endif // PCC_RUNTIME_DEVICE_H
