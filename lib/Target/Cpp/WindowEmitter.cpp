//===- WindowEmitter.cpp - convolutions and pooling -----------------------===//
//
// Convolution, pooling and their gradients as calls of the runtime's
// window kernels, with the window geometry as static arrays.
//
//===----------------------------------------------------------------------===//

#include "CppEmitter.h"

#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mlir::pcc;

namespace mlir::pcc::cpp {

LogicalResult CppEmitter::emit(ConvOp conv) {
  Operation *op = conv;
  if (failed(requireF32(op, conv.getInput())))
    return failure();
  auto in = conv.getInput().getType();
  line(llvm::formatv(
           "{ static const int64_t in[] = {{{0}}, w[] = {{{1}}, out[] = "
           "{{{2}}, st[] = {{{3}}, pd[] = {{{4}}, dl[] = {{{5}};",
           intList(in.getShape()),
           intList(conv.getWeight().getType().getShape()),
           intList(conv.getType().getShape()), intList(conv.getStrides()),
           intList(conv.getPads()), intList(conv.getDilations()))
           .str());
  line(llvm::formatv("  {6}{0}, {1}, {2}, {3}, {4}, in, w, "
                     "out, st, pd, dl, {5}); }",
                     nameOf(conv.getInput()), nameOf(conv.getWeight()),
                     conv.getBias() ? nameOf(conv.getBias()) : "nullptr",
                     nameOf(conv.getResult()), in.getRank() - 2,
                     conv.getGroups(), call("conv_f32"))
           .str());
  return success();
}

LogicalResult CppEmitter::emitPool(Operation *op) {
  Type e = tensorTypeOf(op->getOperand(0)).getElementType();
  StringRef suffix = e.isF32()                ? "f32"
                     : e.isUnsignedInteger(8) ? "u8"
                     : e.isSignlessInteger(8) ? "i8"
                                              : "";
  if (suffix.empty() || (isa<AvgPoolOp>(op) && suffix != "f32"))
    return op->emitError("code generation: ")
           << op->getName() << " on " << e << " is not supported by the "
           << (cuda ? "CUDA" : "CPU") << " back end";
  auto in = tensorTypeOf(op->getOperand(0));
  auto attr = [&](StringRef name) {
    return intList(cast<DenseI64ArrayAttr>(op->getAttr(name)).asArrayRef());
  };
  line(llvm::formatv("{ static const int64_t in[] = {{{0}}, out[] = {{{1}}, "
                     "k[] = {{{2}}, st[] = {{{3}}, pd[] = {{{4}}, dl[] = "
                     "{{{5}};",
                     intList(in.getShape()),
                     intList(tensorTypeOf(op->getResult(0)).getShape()),
                     attr("kernel_shape"), attr("strides"), attr("pads"),
                     attr("dilations"))
           .str());
  if (auto avg = dyn_cast<AvgPoolOp>(op))
    line(llvm::formatv("  {4}{0}, {1}, {2}, in, out, k, "
                       "st, pd, dl, {3}); }",
                       nameOf(avg.getInput()), nameOf(avg.getResult()),
                       in.getRank() - 2, avg.getCountIncludePad() ? 1 : 0,
                       call("avg_pool_f32"))
             .str());
  else
    line(llvm::formatv("  {0}{1}, {2}, {3}, in, out, k, "
                       "st, pd, dl); }",
                       call(("max_pool_" + suffix).str()),
                       nameOf(op->getOperand(0)), nameOf(op->getResult(0)),
                       in.getRank() - 2)
             .str());
  return success();
}

LogicalResult CppEmitter::emitConvGrad(Operation *op) {
  // (gradient, weight) -> input, or (input, gradient) -> weight; the
  // kernels take the convolution's three shapes.
  bool wantInput = isa<ConvGradInputOp>(op);
  if (failed(requireF32(op, op->getOperand(0))))
    return failure();
  auto in = tensorTypeOf(wantInput ? op->getResult(0) : op->getOperand(0));
  auto w = tensorTypeOf(wantInput ? op->getOperand(1) : op->getResult(0));
  auto out = tensorTypeOf(op->getOperand(wantInput ? 0 : 1));
  auto attr = [&](StringRef name) {
    return intList(cast<DenseI64ArrayAttr>(op->getAttr(name)).asArrayRef());
  };
  line(llvm::formatv(
           "{ static const int64_t in[] = {{{0}}, w[] = {{{1}}, out[] = "
           "{{{2}}, st[] = {{{3}}, pd[] = {{{4}}, dl[] = {{{5}};",
           intList(in.getShape()), intList(w.getShape()),
           intList(out.getShape()), attr("strides"), attr("pads"),
           attr("dilations"))
           .str());
  line(llvm::formatv(
           "  {0}{1}, {2}, {3}, {4}, in, w, out, st, pd, dl, "
           "{5}); }",
           call(wantInput ? "conv_grad_input_f32" : "conv_grad_weight_f32"),
           nameOf(op->getOperand(0)), nameOf(op->getOperand(1)),
           nameOf(op->getResult(0)), in.getRank() - 2,
           op->getAttrOfType<IntegerAttr>("groups").getInt())
           .str());
  return success();
}

LogicalResult CppEmitter::emitPoolGrad(Operation *op) {
  bool isMax = isa<MaxPoolGradOp>(op);
  if (failed(requireF32(op, op->getOperand(0))))
    return failure();
  auto in = tensorTypeOf(op->getResult(0));
  auto out = tensorTypeOf(op->getOperand(isMax ? 1 : 0));
  auto attr = [&](StringRef name) {
    return intList(cast<DenseI64ArrayAttr>(op->getAttr(name)).asArrayRef());
  };
  line(llvm::formatv("{ static const int64_t in[] = {{{0}}, out[] = {{{1}}, "
                     "k[] = {{{2}}, st[] = {{{3}}, pd[] = {{{4}}, dl[] = "
                     "{{{5}};",
                     intList(in.getShape()), intList(out.getShape()),
                     attr("kernel_shape"), attr("strides"), attr("pads"),
                     attr("dilations"))
           .str());
  if (isMax)
    line(llvm::formatv("  {0}{1}, {2}, {3}, {4}, in, out, k, st, pd, dl); }",
                       call("max_pool_grad_f32"), nameOf(op->getOperand(0)),
                       nameOf(op->getOperand(1)), nameOf(op->getResult(0)),
                       in.getRank() - 2)
             .str());
  else
    line(llvm::formatv("  {0}{1}, {2}, {3}, in, out, k, st, pd, dl, {4}); }",
                       call("avg_pool_grad_f32"), nameOf(op->getOperand(0)),
                       nameOf(op->getResult(0)), in.getRank() - 2,
                       op->hasAttr("count_include_pad") ? 1 : 0)
             .str());
  return success();
}

} // namespace mlir::pcc::cpp
