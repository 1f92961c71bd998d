//===- ShapeRules.cpp - shape arithmetic shared by ops and importer -------===//

#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

#include "llvm/ADT/STLExtras.h"

using namespace llvm;

namespace mlir::pcc {

std::optional<SmallVector<int64_t>> broadcastShapes(ArrayRef<int64_t> a,
                                                    ArrayRef<int64_t> b) {
  size_t rank = std::max(a.size(), b.size());
  SmallVector<int64_t> result(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1)
      return std::nullopt;
    result[rank - 1 - i] = da == 1 ? db : da;
  }
  return result;
}

bool isBroadcastableTo(ArrayRef<int64_t> from, ArrayRef<int64_t> to) {
  if (from.size() > to.size())
    return false;
  for (size_t i = 0; i < from.size(); ++i) {
    int64_t df = from[from.size() - 1 - i];
    int64_t dt = to[to.size() - 1 - i];
    if (df != dt && df != 1)
      return false;
  }
  return true;
}

std::optional<int64_t> normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    return std::nullopt;
  return axis < 0 ? axis + rank : axis;
}

int64_t numElements(ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

int64_t windowOutputSize(int64_t in, int64_t kernel, int64_t stride,
                         int64_t padBegin, int64_t padEnd, int64_t dilation,
                         bool ceilMode) {
  int64_t effectiveKernel = dilation * (kernel - 1) + 1;
  int64_t span = in + padBegin + padEnd - effectiveKernel;
  if (span < 0 || stride <= 0)
    return 0;
  int64_t out = (ceilMode ? (span + stride - 1) / stride : span / stride) + 1;
  // In ceil mode the last window must start inside the input or the leading
  // padding (ONNX and PyTorch agree on this rule).
  if (ceilMode && (out - 1) * stride >= in + padBegin)
    --out;
  return out;
}

int64_t sliceLength(int64_t start, int64_t limit, int64_t step) {
  if (step > 0)
    return limit > start ? (limit - start + step - 1) / step : 0;
  if (step < 0)
    return start > limit ? (start - limit + (-step) - 1) / (-step) : 0;
  return 0;
}

std::string shapeToString(ArrayRef<int64_t> shape) {
  std::string s;
  for (auto [i, d] : llvm::enumerate(shape)) {
    if (i)
      s += "x";
    s += std::to_string(d);
  }
  return s.empty() ? "scalar" : s;
}

} // namespace mlir::pcc
