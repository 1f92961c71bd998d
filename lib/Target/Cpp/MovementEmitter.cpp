//===- MovementEmitter.cpp - casts, copies and gathers --------------------===//
//
// The data movement ops: cast, broadcast, transpose, slice, concat and split
// as strided copies, and the gathers as the runtime's gather kernels.
//
//===----------------------------------------------------------------------===//

#include "CppEmitter.h"

#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mlir::pcc;

namespace mlir::pcc::cpp {

LogicalResult CppEmitter::emit(CastOp cast) {
  auto from = elementInfo(cast.getInput().getType().getElementType());
  auto to = elementInfo(cast.getType().getElementType());
  line(llvm::formatv("{5}{0}, {1}, {2}, {3}, {4});", nameOf(cast.getInput()),
                     from->code, nameOf(cast.getResult()), to->code,
                     cast.getType().getNumElements(), call("cast"))
           .str());
  return success();
}

LogicalResult CppEmitter::emit(BroadcastOp b) {
  ArrayRef<int64_t> in = b.getInput().getType().getShape();
  ArrayRef<int64_t> out = b.getType().getShape();
  SmallVector<int64_t> inStrides = stridesOf(in), xs(out.size(), 0);
  int64_t shift = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d)
    xs[d + shift] = in[d] == 1 ? 0 : inStrides[d];
  return emitCopy(b.getInput(), b.getResult(), out, xs, 0, stridesOf(out), 0);
}

LogicalResult CppEmitter::emit(TransposeOp t) {
  SmallVector<int64_t> inStrides = stridesOf(t.getInput().getType().getShape());
  SmallVector<int64_t> xs;
  for (int64_t p : t.getPermutation())
    xs.push_back(inStrides[p]);
  ArrayRef<int64_t> out = t.getType().getShape();
  return emitCopy(t.getInput(), t.getResult(), out, xs, 0, stridesOf(out), 0);
}

LogicalResult CppEmitter::emit(SliceOp s) {
  SmallVector<int64_t> inStrides = stridesOf(s.getInput().getType().getShape());
  SmallVector<int64_t> xs;
  int64_t offset = 0;
  for (size_t d = 0; d < inStrides.size(); ++d) {
    xs.push_back(inStrides[d] * s.getSteps()[d]);
    offset += s.getStarts()[d] * inStrides[d];
  }
  ArrayRef<int64_t> out = s.getType().getShape();
  return emitCopy(s.getInput(), s.getResult(), out, xs, offset, stridesOf(out),
                  0);
}

LogicalResult CppEmitter::emit(ConcatOp c) {
  ArrayRef<int64_t> out = c.getType().getShape();
  SmallVector<int64_t> outStrides = stridesOf(out);
  int64_t axis = static_cast<int64_t>(c.getAxis()), at = 0;
  for (Value in : c.getInputs()) {
    ArrayRef<int64_t> shape = tensorTypeOf(in).getShape();
    if (failed(emitCopy(in, c.getResult(), shape, stridesOf(shape), 0,
                        outStrides, at * outStrides[axis])))
      return failure();
    at += shape[axis];
  }
  return success();
}

LogicalResult CppEmitter::emit(SplitOp s) {
  SmallVector<int64_t> inStrides = stridesOf(s.getInput().getType().getShape());
  int64_t axis = static_cast<int64_t>(s.getAxis()), at = 0;
  for (Value r : s.getResults()) {
    ArrayRef<int64_t> shape = tensorTypeOf(r).getShape();
    if (failed(emitCopy(s.getInput(), r, shape, inStrides, at * inStrides[axis],
                        stridesOf(shape), 0)))
      return failure();
    at += shape[axis];
  }
  return success();
}

LogicalResult CppEmitter::emitGather(Operation *op) {
  // A shard_gather reads this rank's block of the gathered dimension.
  Value data = op->getOperand(0), indices = op->getOperand(1);
  ArrayRef<int64_t> shape = tensorTypeOf(data).getShape();
  int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
  int64_t block = shape[axis], total = block;
  std::string start;
  auto sg = dyn_cast<ShardGatherOp>(op);
  if (failed(blockOf(op, sg ? sg.getMeshAxis() : "", block, total, start)))
    return failure();
  auto indexType = tensorTypeOf(indices);
  std::string args = llvm::formatv(
      "{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}", nameOf(data),
      nameOf(indices), nameOf(op->getResult(0)),
      elementInfo(tensorTypeOf(data).getElementType())->size,
      product(shape.take_front(axis)), block, start, total,
      product(shape.drop_front(axis + 1)), indexType.getNumElements(),
      indexType.getElementType().isInteger(64) ? 1 : 0);
  if (cuda) {
    // Checked when the run finishes (see pcc_cuda_finish).
    sites.push_back(llvm::formatv("{0}: an index is outside [-{1}, {1})",
                                  describeOp(op), total)
                        .str());
    line(call("gather_block") + args + ", " + std::to_string(sites.size()) +
         ");");
    return success();
  }
  line("if (" + call("gather_block") + args + "))");
  line("  return fail(" + quoted(describeOp(op)) + ", pcc_cpu_last_error());");
  return success();
}

} // namespace mlir::pcc::cpp
