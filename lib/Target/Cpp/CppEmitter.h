//===- CppEmitter.h - the emitter of one planned function -------*- C++ -*-===//
//
// Internal to the C++ target: the CppEmitter class, shared by
// CppEmitter.cpp (values, runtime-kernel calls, collectives, training ops,
// the run function) and ElementwiseEmitter.cpp (the generated loop kernels
// of elementwise ops and fusions), and the type and literal helpers both
// use.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_LIB_TARGET_CPP_CPPEMITTER_H
#define PCC_LIB_TARGET_CPP_CPPEMITTER_H

#include "FunctionEmitter.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace mlir::pcc::cpp {

//===----------------------------------------------------------------------===//
// Types and literals
//===----------------------------------------------------------------------===//

/// C type, ABI dtype code and byte size of an element type.
struct ElementInfo {
  StringRef cType;
  int code;
  int64_t size;
};

inline std::optional<ElementInfo> elementInfo(Type type) {
  if (type.isF32())
    return ElementInfo{"float", 0, 4};
  if (type.isF64())
    return ElementInfo{"double", 1, 8};
  if (type.isF16())
    return ElementInfo{"uint16_t", 2, 2};
  if (type.isBF16())
    return ElementInfo{"uint16_t", 3, 2};
  if (type.isInteger(64))
    return ElementInfo{"int64_t", 4, 8};
  if (type.isInteger(32))
    return ElementInfo{"int32_t", 5, 4};
  if (type.isInteger(16))
    return ElementInfo{"int16_t", 6, 2};
  if (type.isSignlessInteger(8))
    return ElementInfo{"int8_t", 7, 1};
  if (type.isUnsignedInteger(8))
    return ElementInfo{"uint8_t", 8, 1};
  if (type.isInteger(1))
    return ElementInfo{"uint8_t", 9, 1};
  return std::nullopt;
}

/// A C++ literal of `value` in `type` (f32, f64 or an integer type).
inline std::string literal(double value, Type type) {
  if (isa<FloatType>(type)) {
    StringRef t = type.isF64() ? "double" : "float";
    if (std::isnan(value))
      return ("std::numeric_limits<" + t + ">::quiet_NaN()").str();
    if (std::isinf(value))
      return ((value < 0 ? "-" : "") +
              ("std::numeric_limits<" + t + ">::infinity()"))
          .str();
    return llvm::formatv(type.isF64() ? "{0:e16}" : "{0:e9}f", value).str();
  }
  if (type.isInteger(1))
    return value != 0 ? "1" : "0";
  if (value >= 9.2e18)
    return "INT64_MAX";
  if (value <= -9.2e18)
    return "INT64_MIN";
  return std::to_string(static_cast<int64_t>(value)) + "LL";
}

inline std::string intList(ArrayRef<int64_t> values) {
  std::string s;
  for (auto [i, v] : llvm::enumerate(values))
    s += (i ? ", " : "") + std::to_string(v) + "LL";
  return s.empty() ? "0LL" : s; // a C array needs one element
}

inline SmallVector<int64_t> stridesOf(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

inline int64_t product(ArrayRef<int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims)
    p *= d;
  return p;
}

/// "node '/enc/MatMul' (MatMul)" for an op imported from ONNX.
inline std::string describeOp(Operation *op) {
  auto [opType, node] = getOnnxNodeOfLocation(op->getLoc());
  if (!opType.empty())
    return "node '" + node + "' (" + opType + ")";
  // What a pass named it ("the gradient of 'fc1.weight'").
  if (auto name = dyn_cast<NameLoc>(op->getLoc()))
    return name.getName().str() + " (" + op->getName().getStringRef().str() +
           ")";
  return op->getName().getStringRef().str();
}

//===----------------------------------------------------------------------===//
// The emitter
//===----------------------------------------------------------------------===//

class CppEmitter {
public:
  CppEmitter(func::FuncOp func, bool cuda, const llvm::StringMap<int> &meshAxes)
      : func(func), cuda(cuda), meshAxes(meshAxes) {}

  /// Emits `run_cpu` or `run_cuda` with the kernels and constants it uses.
  FailureOr<TargetCode> emit();

private:
  // Values.
  std::string nameOf(Value v) { return names.lookup(v); }
  LogicalResult define(Value v, StringRef cType, StringRef init, bool isConst);
  LogicalResult defineResult(Operation *op, unsigned i);

  // Ops.
  LogicalResult emitOp(Operation *op);
  LogicalResult emitElementwise(Operation *op);
  LogicalResult emitFusion(FusionOp fusion);
  /// Adds a kernel (deduplicated by its text) and returns its name.
  std::string kernel(const std::string &text);
  /// The loop header of an elementwise kernel over `count` elements: a plain
  /// loop on the CPU, a grid-stride loop on the GPU.
  std::string loop(int64_t count) const;
  std::string parallelFor(int64_t count) const;
  /// Calls (CPU) or launches (CUDA) an elementwise kernel.
  void launch(const std::string &kernelName, int64_t count,
              const std::string &args);
  LogicalResult emitCopy(Value in, Value out, ArrayRef<int64_t> shape,
                         ArrayRef<int64_t> inStrides, int64_t inOffset,
                         ArrayRef<int64_t> outStrides, int64_t outOffset);
  LogicalResult emitCopy(Value in, Value out, ArrayRef<int64_t> shape,
                         ArrayRef<int64_t> inStrides,
                         const std::string &inOffset,
                         ArrayRef<int64_t> outStrides, int64_t outOffset);
  LogicalResult emitConstant(ConstantOp op);
  /// Ops by family: state and communication (CppEmitter.cpp), data
  /// movement (MovementEmitter.cpp), products, norms and reductions
  /// (ComputeEmitter.cpp), windows (WindowEmitter.cpp).
  LogicalResult emit(ParamOp param);
  LogicalResult emit(WaitCollectivesOp wait);
  LogicalResult emit(BucketStartOp start);
  LogicalResult emit(BucketWaitOp wait);
  LogicalResult emit(CastOp cast);
  LogicalResult emit(BroadcastOp b);
  LogicalResult emit(TransposeOp t);
  LogicalResult emit(SliceOp s);
  LogicalResult emit(ConcatOp c);
  LogicalResult emit(SplitOp s);
  LogicalResult emitGather(Operation *op);
  LogicalResult emit(MatmulOp mm);
  LogicalResult emitSoftmax(Operation *op);
  LogicalResult emitAttention(Operation *op);
  LogicalResult emitLinearCrossEntropy(Operation *op);
  LogicalResult emit(LayerNormOp ln);
  LogicalResult emit(BatchNormOp bn);
  LogicalResult emitReduce(Operation *op);
  LogicalResult emit(ArgMaxOp am);
  LogicalResult emit(ConvOp conv);
  LogicalResult emitPool(Operation *op);
  LogicalResult emitConvGrad(Operation *op);
  LogicalResult emitPoolGrad(Operation *op);
  LogicalResult emitCollective(Operation *op);
  /// Gradient, loss and optimizer ops (pcc-autodiff, pcc-loss,
  /// pcc-optimizer).
  LogicalResult emitTraining(Operation *op);
  /// A call of a runtime kernel that can fail on data: on the CPU its
  /// status is checked at once; on CUDA the kernel records `site` and the
  /// run's end reports `message`.
  void checkedCall(StringRef kernel, const std::string &args,
                   const std::string &message, Operation *op);
  /// Sets `bytes` bytes at `ptr` to zero.
  void zeroFill(const std::string &ptr, int64_t bytes);
  /// A scatter-add of `sa`'s updates into `into`: zeroed first, or added
  /// to what it holds (`accumulate`: an embedding gradient added to its
  /// accumulator touches only the rows its indices name).
  /// `sa` is a pcc.scatter_add or a pcc.shard_scatter_add (this rank's
  /// block of the table: the rows whose index falls in it).
  LogicalResult emitScatterAdd(Operation *sa, const std::string &into,
                               bool accumulate);
  void copyBytes(const std::string &to, const std::string &from, int64_t bytes);
  /// This rank's block of `block` entries of a dimension split over mesh
  /// axis `meshAxis` (empty: the whole dimension): the whole dimension's
  /// size and the block's first entry, as C++.
  LogicalResult blockOf(Operation *op, StringRef meshAxis, int64_t block,
                        int64_t &total, std::string &start);
  /// `rc->comms[i]` for mesh axis `axis`.
  std::string comm(StringRef axis) const {
    return "rc->comms[" + std::to_string(meshAxes.lookup(axis)) + "]";
  }
  std::optional<std::string>
  scalarExpr(Operation *op, ArrayRef<std::string> args, Type computeType);
  LogicalResult requireF32(Operation *op, Value v);
  /// On the CPU, whether `op`'s one user, the next op that runs code, can
  /// compute it on the fly (recorded in `squares`, `widened`, `castInto`):
  /// a gradient's squares summed (the global norm), a 16-bit gradient
  /// widened into its f32 accumulator, a weight's 16-bit copy cast straight
  /// into its state, an embedding's gradient scattered straight into its
  /// accumulator. The op itself then emits nothing.
  bool deferToUser(Operation *op);
  /// A profile site (pcc_profile_site) of this function, added to
  /// `profileSites`; returns the statement that marks its start.
  std::string profileSite(StringRef kind, StringRef node, StringRef dtype,
                          double flops, double bytes);
  /// The profile site of `op`: its kind, node, type, FLOPs and bytes.
  std::string profileMark(Operation *op);
  /// The name of the function's profile-site table (CPU and CUDA code
  /// share a namespace).
  std::string profileTable() const {
    return cuda ? "kProfileSitesCuda" : "kProfileSitesCpu";
  }

  void line(const llvm::Twine &text) { body += "  " + text.str() + "\n"; }
  /// `std::exp` on the CPU, the CUDA math library's `exp` on the GPU.
  std::string math(StringRef fn) const {
    return (cuda ? "" : "std::") + fn.str();
  }
  /// exp, tanh and erf in f32 on the CPU use pccrt's vectorisable forms
  /// (runtime/include/pcc/runtime/FastMath.h); elsewhere `math(fn)`.
  std::string transcendental(StringRef fn, Type computeType) const {
    if (cuda || !computeType.isF32())
      return math(fn);
    if (fn == "exp")
      return "pccrt::fastExp";
    if (fn == "tanh")
      return "pccrt::fastTanh";
    return "pccrt::fastErf";
  }
  /// The start of a call to runtime kernel `name` of this target.
  std::string call(StringRef name) const {
    return cuda ? ("pcc_cuda_" + name + "(ctx, ").str()
                : ("pcc_cpu_" + name + "(").str();
  }
  /// Grid size of a grid-stride loop over `count` elements.
  static int64_t gridFor(int64_t count) {
    return std::clamp<int64_t>((count + 255) / 256, 1, 65535 * 8);
  }

  func::FuncOp func;
  bool cuda;
  /// Messages of the CUDA calls that can fail on data, by site number - 1.
  std::vector<std::string> sites;
  /// What users compute of the ops deferred to them (deferToUser): a
  /// whole-tensor sum of x * x by the sum, x; an accumulate of a widened
  /// value by it, its 16-bit input; an assign of a cast by it, the cast;
  /// an assign or accumulate of a scatter-add (an embedding's gradient) by
  /// it, the scatter-add.
  llvm::DenseMap<Operation *, Value> squares, widened;
  llvm::DenseMap<Operation *, CastOp> castInto;
  llvm::DenseMap<Operation *, Operation *> scatterInto;
  /// The initialisers of the function's profile sites, in op order.
  std::vector<std::string> profileSites;
  llvm::DenseMap<Value, std::string> names;
  unsigned nextValue = 0;
  /// Results the function returns that its ops write straight into the
  /// caller's output array (the first place each is returned), so that no
  /// copy follows: out[k] for result value v.
  llvm::DenseMap<Value, unsigned> returnedAt;
  llvm::DenseSet<Value> writtenInPlace;
  /// A product assigned whole to a state loaded before it (a bf16 weight
  /// gradient, pcc-bf16-gradients) is computed in the state's memory: the
  /// state for the product's result, and the assigns that then copy
  /// nothing.
  llvm::DenseMap<Value, Value> intoState;
  llvm::DenseSet<Operation *> assignedInPlace;
  /// The variable holding each started collective's number on its group
  /// (pcc_comm.started), by the started value.
  llvm::DenseMap<Value, std::string> tickets;
  std::string constants, kernels, body;
  llvm::StringMap<std::string> kernelNames; // kernel text -> name
  std::vector<std::pair<std::string, RankedTensorType>> weights;
  std::vector<std::string> weightShards;
  std::vector<std::vector<int64_t>> weightWholes;
  llvm::StringMap<unsigned> weightIndex; // name and shard -> index
  const llvm::StringMap<int> &meshAxes;  // mesh axis -> index
  /// Whether the run context's hyperparameters have been checked.
  bool hyperChecked = false;
};

} // namespace mlir::pcc::cpp

#endif // PCC_LIB_TARGET_CPP_CPPEMITTER_H
