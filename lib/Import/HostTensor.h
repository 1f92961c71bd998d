//===- HostTensor.h - constant tensors evaluated at import time -*- C++ -*-===//
//
// Exporters compute shapes, masks and index vectors inside the graph
// (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Range/Equal/Where for
// causal masks). Once symbolic dimensions are bound every such value is a
// constant, and the importer folds it on the host instead of emitting IR for
// it. HostTensor is that constant: a shape, an MLIR element type and its
// values (integers and booleans as int64, floats as double).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_LIB_IMPORT_HOSTTENSOR_H
#define PCC_LIB_IMPORT_HOSTTENSOR_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mlir::pcc::onnx_import {

class HostTensor {
public:
  HostTensor() = default;
  HostTensor(Type elementType, llvm::ArrayRef<int64_t> shape);

  static HostTensor ints(Type elementType, llvm::ArrayRef<int64_t> shape,
                         llvm::ArrayRef<int64_t> values);
  static HostTensor floats(Type elementType, llvm::ArrayRef<int64_t> shape,
                           llvm::ArrayRef<double> values);
  /// From an MLIR elements attribute (e.g. a pcc.constant).
  static HostTensor fromAttr(ElementsAttr attr);

  Type getElementType() const { return elementType; }
  llvm::ArrayRef<int64_t> getShape() const { return shape; }
  int64_t getRank() const { return shape.size(); }
  int64_t size() const { return count; }
  bool isFloat() const { return isa<FloatType>(elementType); }

  /// Element i as an integer / a double, whatever the storage.
  int64_t getInt(int64_t i) const;
  double getDouble(int64_t i) const;
  void setInt(int64_t i, int64_t v);
  void setDouble(int64_t i, double v);

  /// All values as integers (for shape vectors, axes, indices).
  std::vector<int64_t> toInts() const;

  RankedTensorType getType() const;
  DenseElementsAttr toAttr() const;

  /// Same data, other shape (the element count must match).
  HostTensor reshaped(llvm::ArrayRef<int64_t> newShape) const;
  /// Converted to another element type with ONNX Cast semantics.
  HostTensor castTo(Type newType) const;

private:
  Type elementType;
  llvm::SmallVector<int64_t> shape;
  int64_t count = 0;
  std::vector<int64_t> intData;
  std::vector<double> floatData;
};

/// Row-major strides of a shape.
llvm::SmallVector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape);

/// Broadcasts `t` to `shape` (numpy rules; the caller checked compatibility).
HostTensor broadcastTo(const HostTensor &t, llvm::ArrayRef<int64_t> shape);

} // namespace mlir::pcc::onnx_import

#endif // PCC_LIB_IMPORT_HOSTTENSOR_H
