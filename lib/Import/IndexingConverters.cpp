//===- IndexingConverters.cpp - GatherND, GatherElements -----------------===//
//
// Both gathers pick single elements (or rows) by multi-dimensional index.
// pcc lowers them to one row gather: the data is viewed as [rows, inner...]
// and every index tuple becomes one flat row number. When the indices are
// constants (the exporters' mask utilities index a run-time mask with
// aranges) the row numbers are computed here and the result is a plain
// pcc.gather of the data with constant indices; with run-time indices the
// row numbers are computed in IR (a few integer multiply-adds). Constant
// data and indices fold on the host.
//
//===----------------------------------------------------------------------===//

#include "GraphImporter.h"
#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::onnx_import;

namespace {

bool isIndexType(RankedTensorType t) {
  return t.getElementType().isInteger(32) || t.getElementType().isInteger(64);
}

/// Rows of `data` (viewed as [rows, inner...]) at `rows`, a host tensor of
/// row numbers, as the node's output 0 of shape `outShape`.
LogicalResult gatherRows(NodeImporter &n, RankedTensorType dataType,
                         int64_t numRows, ArrayRef<int64_t> inner,
                         const HostTensor &rows) {
  SmallVector<int64_t> outShape(rows.getShape());
  llvm::append_range(outShape, inner);
  if (const HostTensor *data = n.constant(0)) {
    int64_t innerCount = numElements(inner);
    if (numElements(outShape) <= n.maxFoldElements()) {
      HostTensor out(data->getElementType(), outShape);
      for (int64_t r = 0; r < rows.size(); ++r)
        for (int64_t j = 0; j < innerCount; ++j) {
          int64_t from = rows.getInt(r) * innerCount + j,
                  to = r * innerCount + j;
          if (out.isFloat())
            out.setDouble(to, data->getDouble(from));
          else
            out.setInt(to, data->getInt(from));
        }
      n.setConstantOutput(0, std::move(out));
      return success();
    }
  }
  auto data = n.input(0);
  if (failed(data))
    return failure();
  SmallVector<int64_t> viewed{numRows};
  llvm::append_range(viewed, inner);
  Value table = n.reshape(*data, viewed);
  Value indices = n.constantValue(rows);
  return n.produce<GatherOp>(table, indices, /*axis=*/0);
}

/// `idx` (run-time, of `type`) with negative entries shifted by `bound`
/// (a host tensor broadcastable to it), as int64.
Value normalizeIndices(NodeImporter &n, Value idx, RankedTensorType type,
                       const HostTensor &bound) {
  Type i64 = n.getBuilder().getI64Type();
  auto t64 = RankedTensorType::get(type.getShape(), i64);
  if (type.getElementType() != i64)
    idx = n.create<CastOp>(t64, idx);
  Value bounds = n.broadcastTo(n.constantValue(bound), type.getShape());
  Value zero = n.splat(t64, 0);
  Value negative = n.create<CompareOp>(ComparePredicate::lt, idx, zero);
  return n.create<SelectOp>(negative, n.create<AddOp>(idx, bounds), idx);
}

/// GatherND: indices [..., k] address the first k dimensions after the
/// batch_dims leading ones; the result is indices.shape[:-1] +
/// data.shape[batch_dims + k:].
LogicalResult convertGatherND(NodeImporter &n) {
  auto type = n.inputType(0), indicesType = n.inputType(1);
  if (failed(type) || failed(indicesType))
    return failure();
  if (!isIndexType(*indicesType))
    return n.error() << "GatherND: indices must be int32 or int64, got "
                     << indicesType->getElementType();
  int64_t b = n.intAttr("batch_dims", 0), r = type->getRank(),
          q = indicesType->getRank();
  if (q < 1)
    return n.error() << "GatherND: indices must have rank >= 1";
  int64_t k = indicesType->getDimSize(q - 1);
  if (b < 0 || b >= q || b + k > r)
    return n.error() << "GatherND: batch_dims = " << b << " and index depth "
                     << k << " do not fit data of rank " << r
                     << " and indices of rank " << q;
  ArrayRef<int64_t> ds = type->getShape(), is = indicesType->getShape();
  for (int64_t d = 0; d < b; ++d)
    if (ds[d] != is[d])
      return n.error() << "GatherND: batch dimension " << d << " is " << ds[d]
                       << " in the data but " << is[d] << " in the indices";
  ArrayRef<int64_t> addressed = ds.slice(b, k), inner = ds.drop_front(b + k);
  int64_t perBatch = numElements(addressed);
  int64_t numRows = numElements(ds.take_front(b)) * perBatch;
  SmallVector<int64_t> strides = stridesOf(addressed);
  SmallVector<int64_t> rowsShape(is.drop_back());
  // Index tuples per batch entry.
  int64_t tuplesPerBatch = numElements(is.slice(b, q - 1 - b));

  if (const HostTensor *idx = n.constant(1)) {
    HostTensor rows(n.getBuilder().getI64Type(), rowsShape);
    for (int64_t t = 0; t < rows.size(); ++t) {
      int64_t row = (t / tuplesPerBatch) * perBatch;
      for (int64_t j = 0; j < k; ++j) {
        int64_t v = idx->getInt(t * k + j);
        if (v < -addressed[j] || v >= addressed[j])
          return n.error() << "GatherND: index " << v
                           << " is out of range for dimension "
                           << b + j << " of size " << addressed[j];
        row += (v < 0 ? v + addressed[j] : v) * strides[j];
      }
      rows.setInt(t, row);
    }
    return gatherRows(n, *type, numRows, inner, rows);
  }

  // Run-time indices: row = batch offset + sum_j idx[..., j] * stride_j.
  if (k < 1)
    return n.error() << "GatherND: run-time indices of depth 0 are not "
                        "supported";
  auto idx = n.input(1);
  auto data = n.input(0);
  if (failed(idx) || failed(data))
    return failure();
  Type i64 = n.getBuilder().getI64Type();
  HostTensor bound = HostTensor::ints(i64, {k}, addressed);
  Value norm = normalizeIndices(n, *idx, *indicesType, bound);
  auto rowsType = RankedTensorType::get(rowsShape, i64);
  Value rows;
  for (int64_t j = 0; j < k; ++j) {
    SmallVector<int64_t> starts(q, 0), limits(is), steps(q, 1);
    starts[q - 1] = j;
    limits[q - 1] = j + 1;
    auto slice = n.createChecked<SliceOp>(norm, starts, limits, steps);
    if (failed(slice))
      return failure();
    Value term = n.reshape(*slice, rowsShape);
    if (strides[j] != 1)
      term = n.create<MulOp>(term, n.splat(rowsType, strides[j]));
    rows = rows ? n.create<AddOp>(rows, term) : term;
  }
  if (b > 0) {
    HostTensor offsets(i64, rowsShape);
    for (int64_t t = 0; t < offsets.size(); ++t)
      offsets.setInt(t, (t / tuplesPerBatch) * perBatch);
    rows = n.create<AddOp>(rows, n.constantValue(offsets));
  }
  SmallVector<int64_t> viewed{numRows};
  llvm::append_range(viewed, inner);
  return n.produce<GatherOp>(n.reshape(*data, viewed), rows, /*axis=*/0);
}

/// GatherElements: out[i] = data[i with i[axis] replaced by indices[i]];
/// the result has the indices' shape.
LogicalResult convertGatherElements(NodeImporter &n) {
  auto type = n.inputType(0), indicesType = n.inputType(1);
  if (failed(type) || failed(indicesType))
    return failure();
  if (!isIndexType(*indicesType))
    return n.error() << "GatherElements: indices must be int32 or int64, got "
                     << indicesType->getElementType();
  int64_t r = type->getRank();
  if (indicesType->getRank() != r)
    return n.error() << "GatherElements: indices have rank "
                     << indicesType->getRank() << ", the data " << r;
  auto a = n.axis(n.intAttr("axis", 0), r, "axis");
  if (failed(a))
    return failure();
  ArrayRef<int64_t> ds = type->getShape(), is = indicesType->getShape();
  for (int64_t d = 0; d < r; ++d)
    if (d != *a && is[d] > ds[d])
      return n.error() << "GatherElements: indices dimension " << d << " ("
                       << is[d] << ") exceeds the data's (" << ds[d] << ")";
  SmallVector<int64_t> dataStrides = stridesOf(ds);
  Type i64 = n.getBuilder().getI64Type();
  // The flat position of every index with its axis coordinate zeroed.
  HostTensor base(i64, is);
  SmallVector<int64_t> indexStrides = stridesOf(is);
  for (int64_t t = 0; t < base.size(); ++t) {
    int64_t flat = 0;
    for (int64_t d = 0; d < r; ++d)
      if (d != *a)
        flat += (t / indexStrides[d] % is[d]) * dataStrides[d];
    base.setInt(t, flat);
  }
  int64_t dim = ds[*a];
  if (const HostTensor *idx = n.constant(1)) {
    HostTensor rows(i64, is);
    for (int64_t t = 0; t < rows.size(); ++t) {
      int64_t v = idx->getInt(t);
      if (v < -dim || v >= dim)
        return n.error() << "GatherElements: index " << v
                         << " is out of range for axis " << *a << " of size "
                         << dim;
      rows.setInt(t, base.getInt(t) + (v < 0 ? v + dim : v) * dataStrides[*a]);
    }
    return gatherRows(n, *type, numElements(ds), {}, rows);
  }
  auto idx = n.input(1);
  auto data = n.input(0);
  if (failed(idx) || failed(data))
    return failure();
  Value norm = normalizeIndices(n, *idx, *indicesType,
                                HostTensor::ints(i64, {}, {dim}));
  auto rowsType = RankedTensorType::get(is, i64);
  Value rows = norm;
  if (dataStrides[*a] != 1)
    rows = n.create<MulOp>(rows, n.splat(rowsType, dataStrides[*a]));
  rows = n.create<AddOp>(rows, n.constantValue(base));
  return n.produce<GatherOp>(n.reshape(*data, {numElements(ds)}), rows,
                             /*axis=*/0);
}

} // namespace

void onnx_import::registerIndexingConverters(
    llvm::StringMap<ConverterFn> &table) {
  table["GatherND"] = convertGatherND;
  table["GatherElements"] = convertGatherElements;
}
