//===- ShapeConverters.cpp - ONNX shape and data-movement ops -------------===//
//
// Constant, Shape, Size, ConstantOfShape and Range only ever produce
// host constants (pcc's shapes are static). Reshape, Flatten, (Un)Squeeze,
// Transpose, Concat, Split, Slice, Gather and Expand fold on the host when
// their data input is a constant and build IR otherwise.
//
//===----------------------------------------------------------------------===//

#include "GraphImporter.h"

#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::onnx_import;

/// Sets output 0 to `folded` when it is small enough, else to the IR
/// `build()` makes. Returns whatever build returns.
template <typename BuildFn>
static LogicalResult
foldOrBuild(NodeImporter &n, std::optional<HostTensor> folded, BuildFn build) {
  if (folded && folded->size() <= n.maxFoldElements()) {
    n.setConstantOutput(0, std::move(*folded));
    return success();
  }
  return build();
}

/// Gathers elements of `in` at the flat indices `source[i]`.
static HostTensor gatherFlat(const HostTensor &in, ArrayRef<int64_t> shape,
                             ArrayRef<int64_t> source) {
  HostTensor out(in.getElementType(), shape);
  for (int64_t i = 0; i < out.size(); ++i) {
    if (in.isFloat())
      out.setDouble(i, in.getDouble(source[i]));
    else
      out.setInt(i, in.getInt(source[i]));
  }
  return out;
}

/// Calls `fn(outIndex, coords)` for every element of `shape` in row-major
/// order.
template <typename Fn>
static void forEachIndex(ArrayRef<int64_t> shape, Fn fn) {
  int64_t count = numElements(shape);
  SmallVector<int64_t> coords(shape.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    fn(i, ArrayRef<int64_t>(coords));
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++coords[d] < shape[d])
        break;
      coords[d] = 0;
    }
  }
}

//===----------------------------------------------------------------------===//
// Constants and shape queries
//===----------------------------------------------------------------------===//

static LogicalResult convertConstant(NodeImporter &n) {
  MLIRContext *ctx = n.getContext();
  Builder b(ctx);
  auto output = [&](HostTensor t) {
    n.setConstantOutput(0, std::move(t));
    return success();
  };
  if (const auto *a = n.attr("value")) {
    auto t = decodeTensor(a->t(), "", n.getLoc());
    return failed(t) ? failure() : output(std::move(*t));
  }
  if (const auto *a = n.attr("value_float"))
    return output(HostTensor::floats(b.getF32Type(), {}, {a->f()}));
  if (const auto *a = n.attr("value_floats")) {
    SmallVector<double> v(a->floats().begin(), a->floats().end());
    return output(HostTensor::floats(b.getF32Type(), {int64_t(v.size())}, v));
  }
  if (const auto *a = n.attr("value_int"))
    return output(HostTensor::ints(b.getI64Type(), {}, {a->i()}));
  if (const auto *a = n.attr("value_ints")) {
    SmallVector<int64_t> v(a->ints().begin(), a->ints().end());
    return output(HostTensor::ints(b.getI64Type(), {int64_t(v.size())}, v));
  }
  return n.error() << "Constant: only tensor, float(s) and int(s) values are "
                      "supported (not sparse or string constants)";
}

static LogicalResult convertShape(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  int64_t rank = type->getRank();
  int64_t start = n.intAttr("start", 0), end = n.intAttr("end", rank);
  start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
  end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
  SmallVector<int64_t> dims;
  for (int64_t d = start; d < end; ++d)
    dims.push_back(type->getDimSize(d));
  n.setConstantOutput(0, HostTensor::ints(n.getBuilder().getI64Type(),
                                          {int64_t(dims.size())}, dims));
  return success();
}

static LogicalResult convertSize(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  n.setConstantOutput(0, HostTensor::ints(n.getBuilder().getI64Type(), {},
                                          {type->getNumElements()}));
  return success();
}

static LogicalResult convertConstantOfShape(NodeImporter &n) {
  auto shapeT = n.requireConstant(0, "shape");
  if (failed(shapeT))
    return failure();
  std::vector<int64_t> shape = shapeT->toInts();
  for (int64_t d : shape)
    if (d < 0)
      return n.error() << "ConstantOfShape: negative dimension " << d;
  HostTensor fill = HostTensor::floats(n.getBuilder().getF32Type(), {1}, {0.0});
  if (const auto *a = n.attr("value")) {
    auto t = decodeTensor(a->t(), "", n.getLoc());
    if (failed(t))
      return failure();
    fill = std::move(*t);
  }
  HostTensor scalar = fill.reshaped({});
  if (numElements(shape) > n.maxFoldElements()) {
    auto type = RankedTensorType::get(shape, fill.getElementType());
    n.setOutput(0, n.splat(type, scalar.getDouble(0)));
    return success();
  }
  n.setConstantOutput(0, broadcastTo(scalar, shape));
  return success();
}

static LogicalResult convertRange(NodeImporter &n) {
  auto start = n.requireConstant(0, "start");
  auto limit = n.requireConstant(1, "limit");
  auto delta = n.requireConstant(2, "delta");
  if (failed(start) || failed(limit) || failed(delta))
    return failure();
  double s = start->getDouble(0), l = limit->getDouble(0),
         d = delta->getDouble(0);
  if (d == 0)
    return n.error() << "Range: delta is zero";
  // Compared as a double: converting an out-of-range (or NaN) count to
  // int64 would be undefined behaviour.
  double steps = std::ceil((l - s) / d);
  if (!(steps <= static_cast<double>(n.maxFoldElements())))
    return n.error() << "Range: " << steps << " elements is too large";
  int64_t count = std::max<int64_t>(0, static_cast<int64_t>(steps));
  HostTensor out(start->getElementType(), {count});
  for (int64_t i = 0; i < count; ++i) {
    if (out.isFloat())
      out.setDouble(i, s + i * d);
    else
      out.setInt(i, start->getInt(0) + i * delta->getInt(0));
  }
  n.setConstantOutput(0, std::move(out));
  return success();
}

//===----------------------------------------------------------------------===//
// Reshapes
//===----------------------------------------------------------------------===//

/// Reshapes input 0 to `shape`, on the host when it is constant.
static LogicalResult reshapeTo(NodeImporter &n, ArrayRef<int64_t> shape) {
  if (const HostTensor *c = n.constant(0)) {
    n.setConstantOutput(0, c->reshaped(shape));
    return success();
  }
  auto v = n.input(0);
  if (failed(v))
    return failure();
  n.setOutput(0, n.reshape(*v, shape));
  return success();
}

static LogicalResult convertReshape(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  std::vector<int64_t> requested;
  if (n.getOpset() < 5) {
    auto attr = n.intsAttr("shape");
    if (!attr)
      return n.error() << "Reshape: missing shape attribute";
    requested.assign(attr->begin(), attr->end());
  } else {
    auto shapeT = n.requireConstant(1, "target shape");
    if (failed(shapeT))
      return failure();
    requested = shapeT->toInts();
  }
  bool allowZero = n.intAttr("allowzero", 0) != 0;
  SmallVector<int64_t> shape;
  int64_t inferred = -1, known = 1;
  for (auto [i, d] : llvm::enumerate(requested)) {
    if (d == 0 && !allowZero) {
      if (static_cast<int64_t>(i) >= type->getRank())
        return n.error() << "Reshape: 0 at position " << i
                         << " copies a dimension the input (rank "
                         << type->getRank() << ") does not have";
      d = type->getDimSize(i);
    }
    if (d == -1) {
      if (inferred >= 0)
        return n.error() << "Reshape: more than one -1 in the target shape";
      inferred = i;
      shape.push_back(1);
      continue;
    }
    if (d < 0)
      return n.error() << "Reshape: invalid dimension " << d;
    if (llvm::MulOverflow(known, d, known))
      return n.error() << "Reshape: target shape ["
                       << llvm::make_range(requested.begin(), requested.end())
                       << "] has more elements than a tensor can hold";
    shape.push_back(d);
  }
  int64_t total = type->getNumElements();
  if (inferred >= 0) {
    if (known == 0 || total % known)
      return n.error() << "Reshape: cannot infer -1 reshaping "
                       << shapeToString(type->getShape()) << " to ["
                       << llvm::make_range(requested.begin(), requested.end())
                       << "]";
    shape[inferred] = total / known;
  }
  if (numElements(shape) != total)
    return n.error() << "Reshape: cannot reshape "
                     << shapeToString(type->getShape()) << " (" << total
                     << " elements) to " << shapeToString(shape);
  return reshapeTo(n, shape);
}

static LogicalResult convertFlatten(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  int64_t rank = type->getRank();
  int64_t a = n.intAttr("axis", 1);
  if (a < 0)
    a += rank;
  if (a < 0 || a > rank)
    return n.error() << "Flatten: axis " << n.intAttr("axis", 1)
                     << " is out of range for rank " << rank;
  int64_t outer = numElements(type->getShape().take_front(a));
  return reshapeTo(
      n, {outer, type->getNumElements() / std::max<int64_t>(outer, 1)});
}

/// The axes of Squeeze / Unsqueeze: an attribute before opset 13, an input
/// from then on.
static FailureOr<std::optional<std::vector<int64_t>>>
squeezeAxes(NodeImporter &n) {
  if (n.getOpset() < 13) {
    if (auto a = n.intsAttr("axes"))
      return std::optional<std::vector<int64_t>>(
          std::vector<int64_t>(a->begin(), a->end()));
    return std::optional<std::vector<int64_t>>();
  }
  if (!n.hasInput(1))
    return std::optional<std::vector<int64_t>>();
  auto axes = n.requireConstant(1, "axes");
  if (failed(axes))
    return failure();
  return std::optional<std::vector<int64_t>>(axes->toInts());
}

static LogicalResult convertSqueeze(NodeImporter &n) {
  auto type = n.inputType(0);
  auto axes = squeezeAxes(n);
  if (failed(type) || failed(axes))
    return failure();
  int64_t rank = type->getRank();
  SmallVector<bool> drop(rank, false);
  if (*axes) {
    for (int64_t a : **axes) {
      auto d = n.axis(a, rank, "axis");
      if (failed(d))
        return failure();
      if (type->getDimSize(*d) != 1)
        return n.error() << "Squeeze: dimension " << *d << " has size "
                         << type->getDimSize(*d) << ", not 1";
      drop[*d] = true;
    }
  } else {
    for (int64_t d = 0; d < rank; ++d)
      drop[d] = type->getDimSize(d) == 1;
  }
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < rank; ++d)
    if (!drop[d])
      shape.push_back(type->getDimSize(d));
  return reshapeTo(n, shape);
}

static LogicalResult convertUnsqueeze(NodeImporter &n) {
  auto type = n.inputType(0);
  auto axes = squeezeAxes(n);
  if (failed(type) || failed(axes))
    return failure();
  if (!*axes)
    return n.error() << "Unsqueeze: missing axes";
  int64_t outRank = type->getRank() + (*axes)->size();
  SmallVector<bool> inserted(outRank, false);
  for (int64_t a : **axes) {
    auto d = n.axis(a, outRank, "axis");
    if (failed(d))
      return failure();
    if (inserted[*d])
      return n.error() << "Unsqueeze: axis " << *d << " is repeated";
    inserted[*d] = true;
  }
  SmallVector<int64_t> shape;
  auto in = type->getShape();
  size_t next = 0;
  for (int64_t d = 0; d < outRank; ++d)
    shape.push_back(inserted[d] ? 1 : in[next++]);
  return reshapeTo(n, shape);
}

//===----------------------------------------------------------------------===//
// Transpose, Concat, Split, Slice, Gather, Expand
//===----------------------------------------------------------------------===//

static LogicalResult convertTranspose(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  int64_t rank = type->getRank();
  SmallVector<int64_t> perm;
  if (auto attr = n.intsAttr("perm"))
    perm = *attr;
  else
    for (int64_t d = rank - 1; d >= 0; --d)
      perm.push_back(d);
  SmallVector<bool> seen(rank, false);
  if (static_cast<int64_t>(perm.size()) != rank ||
      llvm::any_of(perm, [&](int64_t p) {
        return p < 0 || p >= rank || std::exchange(seen[p], true);
      }))
    return n.error() << "Transpose: perm [" << ArrayRef<int64_t>(perm)
                     << "] is not a permutation of rank " << rank;
  if (const HostTensor *c = n.constant(0)) {
    SmallVector<int64_t> shape, inStrides = stridesOf(c->getShape());
    for (int64_t p : perm)
      shape.push_back(c->getShape()[p]);
    SmallVector<int64_t> source(numElements(shape));
    forEachIndex(shape, [&](int64_t i, ArrayRef<int64_t> coords) {
      int64_t s = 0;
      for (int64_t d = 0; d < rank; ++d)
        s += coords[d] * inStrides[perm[d]];
      source[i] = s;
    });
    n.setConstantOutput(0, gatherFlat(*c, shape, source));
    return success();
  }
  auto v = n.input(0);
  if (failed(v))
    return failure();
  return n.produce<TransposeOp>(*v, perm);
}

static LogicalResult convertConcat(NodeImporter &n) {
  auto first = n.inputType(0);
  if (failed(first))
    return failure();
  auto a = n.axis(n.intAttr("axis", 0), first->getRank(), "axis");
  if (failed(a))
    return failure();
  if (n.allInputsConstant()) {
    SmallVector<const HostTensor *> parts;
    SmallVector<int64_t> shape(first->getShape());
    shape[*a] = 0;
    for (unsigned i = 0; i < n.numInputs(); ++i) {
      const HostTensor *c = n.constant(i);
      if (c->getRank() != first->getRank())
        return n.error() << "Concat: inputs have different ranks";
      shape[*a] += c->getShape()[*a];
      parts.push_back(c);
    }
    if (numElements(shape) <= n.maxFoldElements()) {
      int64_t outer = numElements(ArrayRef<int64_t>(shape).take_front(*a));
      int64_t inner = numElements(ArrayRef<int64_t>(shape).drop_front(*a + 1));
      HostTensor out(first->getElementType(), shape);
      int64_t o = 0;
      for (int64_t i = 0; i < outer; ++i)
        for (const HostTensor *p : parts) {
          int64_t chunk = p->getShape()[*a] * inner;
          for (int64_t j = 0; j < chunk; ++j, ++o) {
            if (out.isFloat())
              out.setDouble(o, p->getDouble(i * chunk + j));
            else
              out.setInt(o, p->getInt(i * chunk + j));
          }
        }
      n.setConstantOutput(0, std::move(out));
      return success();
    }
  }
  SmallVector<Value> inputs;
  for (unsigned i = 0; i < n.numInputs(); ++i) {
    auto v = n.input(i);
    if (failed(v))
      return failure();
    inputs.push_back(*v);
  }
  return n.produce<ConcatOp>(inputs, *a);
}

static LogicalResult convertSplit(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  auto a = n.axis(n.intAttr("axis", 0), type->getRank(), "axis");
  if (failed(a))
    return failure();
  int64_t dim = type->getDimSize(*a);
  SmallVector<int64_t> sizes;
  if (n.getOpset() >= 13 && n.hasInput(1)) {
    auto split = n.requireConstant(1, "split sizes");
    if (failed(split))
      return failure();
    for (int64_t s : split->toInts())
      sizes.push_back(s);
  } else if (auto attr = n.intsAttr("split"); attr && n.getOpset() < 13) {
    sizes = *attr;
  } else {
    int64_t parts = n.intAttr("num_outputs", n.numOutputs());
    int64_t chunk = (dim + parts - 1) / parts;
    for (int64_t p = 0, left = dim; p < parts; ++p, left -= chunk)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, left)));
  }
  if (static_cast<int64_t>(sizes.size()) != n.numOutputs())
    return n.error() << "Split: " << sizes.size() << " sizes for "
                     << n.numOutputs() << " outputs";
  auto v = n.input(0);
  if (failed(v))
    return failure();
  int64_t total = 0;
  for (int64_t s : sizes)
    total += s;
  if (total != dim)
    return n.error() << "Split: sizes add up to " << total << ", dimension "
                     << *a << " has " << dim;
  auto op = n.createChecked<SplitOp>(*v, *a, sizes);
  if (failed(op))
    return failure();
  for (unsigned i = 0; i < n.numOutputs(); ++i)
    n.setOutput(i, op->getResult(i));
  return success();
}

static LogicalResult convertSlice(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  int64_t rank = type->getRank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (n.getOpset() < 10) {
    auto s = n.intsAttr("starts"), e = n.intsAttr("ends");
    if (!s || !e)
      return n.error() << "Slice: missing starts or ends";
    starts.assign(s->begin(), s->end());
    ends.assign(e->begin(), e->end());
    if (auto ax = n.intsAttr("axes"))
      axes.assign(ax->begin(), ax->end());
  } else {
    auto s = n.requireConstant(1, "starts"), e = n.requireConstant(2, "ends");
    if (failed(s) || failed(e))
      return failure();
    starts = s->toInts();
    ends = e->toInts();
    if (n.hasInput(3)) {
      auto ax = n.requireConstant(3, "axes");
      if (failed(ax))
        return failure();
      axes = ax->toInts();
    }
    if (n.hasInput(4)) {
      auto st = n.requireConstant(4, "steps");
      if (failed(st))
        return failure();
      steps = st->toInts();
    }
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(i);
  if (steps.empty())
    steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      steps.size() != starts.size())
    return n.error() << "Slice: starts, ends, axes and steps differ in length";

  SmallVector<int64_t> lo(rank, 0), hi(type->getShape()), st(rank, 1);
  for (size_t i = 0; i < starts.size(); ++i) {
    auto d = n.axis(axes[i], rank, "axis");
    if (failed(d))
      return failure();
    int64_t dim = type->getDimSize(*d), step = steps[i];
    if (step == 0)
      return n.error() << "Slice: step is zero on axis " << *d;
    auto clampBound = [&](int64_t v, bool isEnd) {
      if (v < 0)
        v += dim; // may stay negative; the clamp below handles it
      if (step > 0)
        return std::clamp<int64_t>(v, 0, dim);
      return std::clamp<int64_t>(v, isEnd ? -1 : 0, dim - 1);
    };
    lo[*d] = clampBound(starts[i], false);
    hi[*d] = clampBound(ends[i], true);
    st[*d] = step;
  }

  if (const HostTensor *c = n.constant(0)) {
    SmallVector<int64_t> shape, inStrides = stridesOf(c->getShape());
    for (int64_t d = 0; d < rank; ++d)
      shape.push_back(sliceLength(lo[d], hi[d], st[d]));
    SmallVector<int64_t> source(numElements(shape));
    forEachIndex(shape, [&](int64_t i, ArrayRef<int64_t> coords) {
      int64_t s = 0;
      for (int64_t d = 0; d < rank; ++d)
        s += (lo[d] + coords[d] * st[d]) * inStrides[d];
      source[i] = s;
    });
    n.setConstantOutput(0, gatherFlat(*c, shape, source));
    return success();
  }
  auto v = n.input(0);
  if (failed(v))
    return failure();
  return n.produce<SliceOp>(*v, lo, hi, st);
}

static LogicalResult convertGather(NodeImporter &n) {
  auto type = n.inputType(0), indicesType = n.inputType(1);
  if (failed(type) || failed(indicesType))
    return failure();
  auto a = n.axis(n.intAttr("axis", 0), type->getRank(), "axis");
  if (failed(a))
    return failure();
  if (!indicesType->getElementType().isInteger(32) &&
      !indicesType->getElementType().isInteger(64))
    return n.error() << "Gather: indices must be int32 or int64, got "
                     << indicesType->getElementType();
  int64_t dim = type->getDimSize(*a);
  const HostTensor *data = n.constant(0), *indices = n.constant(1);
  if (indices) {
    for (int64_t i = 0; i < indices->size(); ++i)
      if (indices->getInt(i) < -dim || indices->getInt(i) >= dim)
        return n.error() << "Gather: index " << indices->getInt(i)
                         << " is out of range for dimension of size " << dim;
  }
  if (data && indices) {
    ArrayRef<int64_t> ds = data->getShape();
    SmallVector<int64_t> shape(ds.take_front(*a));
    llvm::append_range(shape, indices->getShape());
    llvm::append_range(shape, ds.drop_front(*a + 1));
    int64_t inner = numElements(ds.drop_front(*a + 1));
    int64_t outer = numElements(ds.take_front(*a));
    SmallVector<int64_t> source;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = 0; k < indices->size(); ++k) {
        int64_t idx = indices->getInt(k);
        if (idx < 0)
          idx += dim;
        for (int64_t j = 0; j < inner; ++j)
          source.push_back((o * dim + idx) * inner + j);
      }
    if (static_cast<int64_t>(source.size()) <= n.maxFoldElements()) {
      n.setConstantOutput(0, gatherFlat(*data, shape, source));
      return success();
    }
  }
  auto v = n.input(0), idx = n.input(1);
  if (failed(v) || failed(idx))
    return failure();
  return n.produce<GatherOp>(*v, *idx, *a);
}

static LogicalResult convertExpand(NodeImporter &n) {
  auto type = n.inputType(0);
  auto shapeT = n.requireConstant(1, "target shape");
  if (failed(type) || failed(shapeT))
    return failure();
  std::vector<int64_t> requested = shapeT->toInts();
  auto shape = broadcastShapes(type->getShape(), requested);
  if (!shape)
    return n.error() << "Expand: input shape "
                     << shapeToString(type->getShape())
                     << " does not broadcast with ["
                     << llvm::make_range(requested.begin(), requested.end())
                     << "]";
  std::optional<HostTensor> folded;
  if (const HostTensor *c = n.constant(0))
    if (numElements(*shape) <= n.maxFoldElements())
      folded = broadcastTo(*c, *shape);
  return foldOrBuild(n, std::move(folded), [&]() -> LogicalResult {
    auto v = n.input(0);
    if (failed(v))
      return failure();
    n.setOutput(0, n.broadcastTo(*v, *shape));
    return success();
  });
}

void onnx_import::registerShapeConverters(llvm::StringMap<ConverterFn> &t) {
  t["Constant"] = convertConstant;
  t["Shape"] = convertShape;
  t["Size"] = convertSize;
  t["ConstantOfShape"] = convertConstantOfShape;
  t["Range"] = convertRange;
  t["Reshape"] = convertReshape;
  t["Flatten"] = convertFlatten;
  t["Squeeze"] = convertSqueeze;
  t["Unsqueeze"] = convertUnsqueeze;
  t["Transpose"] = convertTranspose;
  t["Concat"] = convertConcat;
  t["Split"] = convertSplit;
  t["Slice"] = convertSlice;
  t["Gather"] = convertGather;
  t["Expand"] = convertExpand;
}
