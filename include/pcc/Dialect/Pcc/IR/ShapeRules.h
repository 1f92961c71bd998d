//===- ShapeRules.h - shape arithmetic shared by ops and importer -*- C++
//-*-===//
//
// Pure functions on static shapes. The op verifiers (through
// inferReturnTypes) and the ONNX importer use the same rules, so a shape the
// importer builds is always one the verifier accepts.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_SHAPERULES_H
#define PCC_DIALECT_PCC_IR_SHAPERULES_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include <cstdint>
#include <optional>
#include <string>

namespace mlir::pcc {

/// The numpy broadcast of two shapes, or nullopt when they are incompatible.
std::optional<llvm::SmallVector<int64_t>>
broadcastShapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b);

/// Whether `from` broadcasts (numpy rules, right-aligned) to exactly `to`.
bool isBroadcastableTo(llvm::ArrayRef<int64_t> from,
                       llvm::ArrayRef<int64_t> to);

/// Maps an ONNX axis in [-rank, rank) to [0, rank); nullopt when out of range.
std::optional<int64_t> normalizeAxis(int64_t axis, int64_t rank);

/// Number of elements of a static shape.
int64_t numElements(llvm::ArrayRef<int64_t> shape);

/// Output length of a sliding window (conv / pooling) along one dimension.
/// Returns a value < 1 when the window does not fit.
int64_t windowOutputSize(int64_t in, int64_t kernel, int64_t stride,
                         int64_t padBegin, int64_t padEnd, int64_t dilation,
                         bool ceilMode);

/// Number of elements a strided slice takes along one dimension.
int64_t sliceLength(int64_t start, int64_t limit, int64_t step);

/// "2x16x64" for diagnostics.
std::string shapeToString(llvm::ArrayRef<int64_t> shape);

} // namespace mlir::pcc

#endif // PCC_DIALECT_PCC_IR_SHAPERULES_H
