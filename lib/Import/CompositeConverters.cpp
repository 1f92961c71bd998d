//===- CompositeConverters.cpp - ONNX ops built from other pcc ops -------===//
//
// Ops newer exporters write that pcc computes with ops it already has:
// RMSNormalization (opset 23), CumSum (a log-step scan of adds),
// Trilu (a select with a constant mask on run-time data), ScatterND with
// constant indices (one gather from the data and the updates), and Einsum
// for the contractions exporters write (one batched matmul between
// transposes and reshapes), Attention (opset 23: matmuls and a softmax)
// and RotaryEmbedding (slices, products and a concat). Each folds on the host when its inputs do.
//
//===----------------------------------------------------------------------===//

#include "GraphImporter.h"
#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

#include "llvm/ADT/StringExtras.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::onnx_import;

namespace {

Value transposeTo(NodeImporter &n, Value v, ArrayRef<int64_t> perm) {
  auto t = cast<RankedTensorType>(v.getType());
  bool identity = true;
  SmallVector<int64_t> shape;
  for (auto [i, p] : llvm::enumerate(perm)) {
    shape.push_back(t.getDimSize(p));
    identity &= static_cast<int64_t>(i) == p;
  }
  if (identity)
    return v;
  return n.create<TransposeOp>(
      RankedTensorType::get(shape, t.getElementType()), v,
      n.getBuilder().getDenseI64ArrayAttr(perm));
}

/// RMSNormalization: x / sqrt(mean(x^2 over [axis, rank)) + epsilon) *
/// scale, computed in f32 (stash_type 1) as the exporters ask.
LogicalResult convertRMSNorm(NodeImporter &n) {
  auto x = n.input(0), scale = n.input(1);
  if (failed(x) || failed(scale))
    return failure();
  auto type = cast<RankedTensorType>(x->getType());
  if (!type.getElementType().isF32())
    return n.error() << "RMSNormalization: pcc computes it in f32; the input "
                        "is "
                     << type.getElementType();
  auto a = n.axis(n.intAttr("axis", -1), type.getRank(), "axis");
  if (failed(a))
    return failure();
  ArrayRef<int64_t> normalized = type.getShape().drop_front(*a);
  auto st = cast<RankedTensorType>(scale->getType());
  if (!isBroadcastableTo(st.getShape(), normalized))
    return n.error() << "RMSNormalization: scale of shape "
                     << shapeToString(st.getShape())
                     << " does not match the normalised shape "
                     << shapeToString(normalized);
  SmallVector<int64_t> axes;
  for (int64_t d = *a; d < type.getRank(); ++d)
    axes.push_back(d);
  Value sq = n.create<MulOp>(*x, *x);
  auto mean =
      n.createChecked<ReduceMeanOp>(sq, axes, /*keep_dims=*/true);
  if (failed(mean))
    return failure();
  auto meanType = cast<RankedTensorType>(mean->getType());
  Value eps = n.splat(meanType, n.floatAttr("epsilon", 1e-5f));
  Value inv = n.create<ReciprocalOp>(
      n.create<SqrtOp>(n.create<AddOp>(mean->getResult(), eps)));
  Value normed =
      n.create<MulOp>(*x, n.broadcastTo(inv, type.getShape()));
  n.setOutput(0, n.create<MulOp>(normed, n.broadcastTo(*scale, type.getShape())));
  return success();
}

/// CumSum along `axis` (`exclusive` leaves out each position's own value,
/// `reverse` sums from the end).
LogicalResult convertCumSum(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  auto axisT = n.requireConstant(1, "axis");
  if (failed(axisT))
    return failure();
  auto a = n.axis(axisT->getInt(0), type->getRank(), "axis");
  if (failed(a))
    return failure();
  bool exclusive = n.intAttr("exclusive", 0) != 0,
       reverse = n.intAttr("reverse", 0) != 0;
  int64_t len = type->getDimSize(*a);
  if (const HostTensor *c = n.constant(0)) {
    // One running sum along each line of the axis (in the order of the
    // sum: backwards for a reverse one), written before or after adding.
    HostTensor out(c->getElementType(), c->getShape());
    SmallVector<int64_t> strides = stridesOf(c->getShape());
    int64_t stride = strides[*a];
    for (int64_t i = 0; i < out.size(); ++i) {
      if (i / stride % len != 0)
        continue; // not the first position of its line
      double sum = 0;
      int64_t isum = 0;
      for (int64_t k = 0; k < len; ++k) {
        int64_t at = i + (reverse ? len - 1 - k : k) * stride;
        if (exclusive) {
          out.isFloat() ? out.setDouble(at, sum) : out.setInt(at, isum);
        }
        if (out.isFloat())
          sum += c->getDouble(at);
        else
          isum += c->getInt(at);
        if (!exclusive) {
          out.isFloat() ? out.setDouble(at, sum) : out.setInt(at, isum);
        }
      }
    }
    n.setConstantOutput(0, std::move(out));
    return success();
  }
  auto x = n.input(0);
  if (failed(x))
    return failure();
  // A log-step scan (Hillis-Steele): after the step of width s every
  // position holds the sum of the s positions ending there; exact for
  // integers (position ids from an attention mask).
  auto shifted = [&](Value v, int64_t s) -> FailureOr<Value> {
    // v moved s places towards the end of the axis (the start for a
    // reverse sum), zeros coming in.
    SmallVector<int64_t> starts(type->getRank(), 0),
        limits(type->getShape()), steps(type->getRank(), 1);
    if (reverse)
      starts[*a] = s;
    else
      limits[*a] = len - s;
    auto kept = n.createChecked<SliceOp>(v, starts, limits, steps);
    if (failed(kept))
      return failure();
    SmallVector<int64_t> zeroShape(type->getShape());
    zeroShape[*a] = s;
    Value zeros =
        n.splat(RankedTensorType::get(zeroShape, type->getElementType()), 0);
    SmallVector<Value> parts = reverse ? SmallVector<Value>{*kept, zeros}
                                       : SmallVector<Value>{zeros, *kept};
    auto joined = n.createChecked<ConcatOp>(parts, *a);
    if (failed(joined))
      return failure();
    return joined->getResult();
  };
  Value sum = *x;
  for (int64_t s = 1; s < len; s *= 2) {
    auto moved = shifted(sum, s);
    if (failed(moved))
      return failure();
    sum = n.create<AddOp>(sum, *moved);
  }
  if (exclusive && len > 0) {
    auto moved = shifted(sum, 1);
    if (failed(moved))
      return failure();
    sum = *moved;
  }
  n.setOutput(0, sum);
  return success();
}

/// Trilu: the entries outside the triangle become 0 (on the host for a
/// constant input, else a select with a constant mask).
LogicalResult convertTrilu(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  if (type->getRank() < 2)
    return n.error() << "Trilu: input needs rank >= 2";
  int64_t k = 0;
  if (n.hasInput(1)) {
    auto kT = n.requireConstant(1, "k");
    if (failed(kT))
      return failure();
    k = kT->getInt(0);
  }
  bool upper = n.intAttr("upper", 1) != 0;
  int64_t rows = type->getDimSize(type->getRank() - 2),
          cols = type->getDimSize(type->getRank() - 1);
  auto inside = [&](int64_t r, int64_t c) {
    return upper ? c - r >= k : c - r <= k;
  };
  if (const HostTensor *c = n.constant(0)) {
    HostTensor out = *c;
    for (int64_t i = 0; i < out.size(); ++i)
      if (!inside((i / cols) % rows, i % cols))
        out.setDouble(i, 0.0);
    n.setConstantOutput(0, std::move(out));
    return success();
  }
  HostTensor keep(n.getBuilder().getI1Type(), {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      keep.setInt(r * cols + c, inside(r, c));
  auto x = n.input(0);
  if (failed(x))
    return failure();
  Value mask = n.broadcastTo(n.constantValue(keep), type->getShape());
  Value zero = n.splat(*type, 0);
  n.setOutput(0, n.create<SelectOp>(mask, *x, zero));
  return success();
}

/// ScatterND (reduction none) with constant indices: every output element
/// comes either from the data or from one update, so the output is one
/// gather from the data and the updates laid end to end.
LogicalResult convertScatterND(NodeImporter &n) {
  std::string reduction = n.stringAttr("reduction", "none");
  if (reduction != "none")
    return n.error() << "ScatterND: reduction '" << reduction
                     << "' is not supported (only 'none')";
  auto type = n.inputType(0), updatesType = n.inputType(2);
  if (failed(type) || failed(updatesType))
    return failure();
  auto idx = n.requireConstant(1, "indices (ScatterND with run-time indices "
                                  "is not supported)");
  if (failed(idx))
    return failure();
  int64_t r = type->getRank(), q = idx->getRank();
  if (q < 1)
    return n.error() << "ScatterND: indices must have rank >= 1";
  int64_t k = idx->getShape().back();
  if (k > r)
    return n.error() << "ScatterND: index depth " << k
                     << " exceeds the data's rank " << r;
  if (k < 1)
    return n.error() << "ScatterND: an index depth of 0 (every update "
                        "replacing the whole data) is not supported";
  ArrayRef<int64_t> ds = type->getShape();
  int64_t dataCount = numElements(ds);
  int64_t slice = numElements(ds.drop_front(k));
  SmallVector<int64_t> strides = stridesOf(ds);
  SmallVector<int64_t> source(dataCount);
  for (int64_t i = 0; i < dataCount; ++i)
    source[i] = i;
  int64_t tuples = idx->size() / k;
  if (updatesType->getNumElements() != tuples * slice)
    return n.error() << "ScatterND: updates have "
                     << updatesType->getNumElements() << " elements; "
                     << tuples << " indices of depth " << k << " need "
                     << tuples * slice;
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t offset = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t v = idx->getInt(t * k + j);
      if (v < -ds[j] || v >= ds[j])
        return n.error() << "ScatterND: index " << v
                         << " is out of range for dimension " << j
                         << " of size " << ds[j];
      offset += (v < 0 ? v + ds[j] : v) * strides[j];
    }
    for (int64_t e = 0; e < slice; ++e)
      source[offset + e] = dataCount + t * slice + e;
  }
  auto data = n.input(0), updates = n.input(2);
  if (failed(data) || failed(updates))
    return failure();
  Value flatData = n.reshape(*data, {dataCount});
  Value flatUpdates = n.reshape(*updates, {updatesType->getNumElements()});
  auto both = n.createChecked<ConcatOp>(ValueRange{flatData, flatUpdates},
                                        static_cast<int64_t>(0));
  if (failed(both))
    return failure();
  Value map = n.constantValue(
      HostTensor::ints(n.getBuilder().getI64Type(), {dataCount}, source));
  auto gathered = n.createChecked<GatherOp>(both->getResult(), map,
                                            static_cast<int64_t>(0));
  if (failed(gathered))
    return failure();
  n.setOutput(0, n.reshape(gathered->getResult(), ds));
  return success();
}

/// Einsum with one or two operands, each label at most once per operand
/// (no diagonals): labels in both operands and the output are batch
/// dimensions, in both but not the output are contracted, the rest are
/// free. Lowers to transposes, reshapes and one batched matmul.
LogicalResult convertEinsum(NodeImporter &n) {
  std::string equation = n.stringAttr("equation", "");
  equation.erase(llvm::remove_if(equation, ::isspace), equation.end());
  // An ellipsis stands for the same leading dimensions in every operand
  // and the output: spell them as labels of their own.
  std::string spelled, ellipsisLabels;
  {
    SmallVector<StringRef> parts;
    StringRef(equation).split(parts, "...");
    if (parts.size() > 1) {
      auto t0 = n.inputType(0);
      if (failed(t0))
        return failure();
      StringRef first = StringRef(equation).split(',').first.split("->").first;
      int64_t explicitLabels = first.size() - 3;
      int64_t hidden = t0->getRank() - explicitLabels;
      if (hidden < 0)
        return n.error() << "Einsum: '" << equation
                         << "' does not match operand 0's rank";
      // Letters the equation does not use stand for the hidden dimensions.
      std::string dims;
      for (char c = 'A'; c <= 'Z' && static_cast<int64_t>(dims.size()) < hidden;
           ++c)
        if (!StringRef(equation).contains(c))
          dims += c;
      if (static_cast<int64_t>(dims.size()) < hidden)
        return n.error() << "Einsum: '" << equation
                         << "': too many dimensions under the ellipsis";
      ellipsisLabels = dims;
      spelled = llvm::join(parts, dims);
    } else {
      spelled = equation;
    }
  }
  StringRef eq(spelled);
  auto [lhs, explicitOut] = eq.split("->");
  // Without "->" the output is the ellipsis's dimensions, then every other
  // label used once, in alphabetical order.
  std::string implicitOut = ellipsisLabels;
  if (!eq.contains("->")) {
    for (char c = 'A'; c <= 'z'; ++c)
      if (llvm::count(lhs, c) == 1 && !StringRef(ellipsisLabels).contains(c))
        implicitOut += c;
  }
  StringRef out = eq.contains("->") ? explicitOut : StringRef(implicitOut);
  SmallVector<StringRef> ins;
  lhs.split(ins, ',');
  if (ins.size() != n.numInputs() || ins.empty() || ins.size() > 2)
    return n.error() << "Einsum: '" << equation
                     << "': pcc supports one or two operands";
  SmallVector<RankedTensorType> types;
  SmallVector<Value> values;
  llvm::StringMap<int64_t> sizes;
  for (auto [i, labels] : llvm::enumerate(ins)) {
    auto t = n.inputType(i);
    auto v = n.input(i);
    if (failed(t) || failed(v))
      return failure();
    if (static_cast<int64_t>(labels.size()) != t->getRank())
      return n.error() << "Einsum: operand " << i << " '" << labels
                       << "' does not match its rank " << t->getRank();
    for (auto [d, c] : llvm::enumerate(labels)) {
      if (labels.count(c) > 1)
        return n.error() << "Einsum: '" << equation
                         << "': repeated labels (diagonals) are not supported";
      auto [it, fresh] = sizes.try_emplace(StringRef(&labels.data()[d], 1),
                                           t->getDimSize(d));
      if (!fresh && it->second != t->getDimSize(d))
        return n.error() << "Einsum: label '" << c << "' has sizes "
                         << it->second << " and " << t->getDimSize(d);
    }
    types.push_back(*t);
    values.push_back(*v);
  }
  auto sizeOf = [&](char c) { return sizes.lookup(StringRef(&c, 1)); };
  for (char c : out)
    if (!sizes.count(StringRef(&c, 1)))
      return n.error() << "Einsum: output label '" << c
                       << "' is not in any operand";
  StringRef a = ins[0], b = ins.size() == 2 ? ins[1] : StringRef();
  std::string batch, free_a, free_b, contracted;
  for (char c : a) {
    bool inB = b.contains(c), inOut = out.contains(c);
    if (inB && inOut)
      batch += c;
    else if (inB)
      contracted += c;
    else if (inOut)
      free_a += c;
    else
      contracted += c; // summed away: contracted against ones below
  }
  for (char c : b)
    if (!a.contains(c))
      (out.contains(c) ? free_b : contracted) += c;
  auto product = [&](StringRef labels) {
    int64_t p = 1;
    for (char c : labels)
      p *= sizeOf(c);
    return p;
  };
  auto permFor = [&](StringRef labels, StringRef order) {
    SmallVector<int64_t> perm;
    for (char c : order)
      if (labels.contains(c))
        perm.push_back(labels.find(c));
    return perm;
  };
  Type element = types[0].getElementType();
  int64_t B = product(batch), M = product(free_a), N = product(free_b),
          K = product(contracted);
  // A as [B, M, K]; B as [B, K, N] (a missing operand or label is ones).
  auto viewA = [&]() -> Value {
    std::string order = batch + free_a;
    std::string cA;
    for (char c : contracted)
      if (a.contains(c))
        cA += c;
    order += cA;
    Value v = transposeTo(n, values[0], permFor(a, order));
    v = n.reshape(v, {B, M, product(cA)});
    if (product(cA) != K) // labels only in b are summed against ones
      return Value();
    return v;
  };
  Value va = viewA();
  if (!va)
    return n.error() << "Einsum: '" << equation
                     << "': a contracted label missing from the first "
                        "operand is not supported";
  Value vb;
  if (ins.size() == 2) {
    std::string order = batch;
    std::string cB;
    for (char c : contracted)
      if (b.contains(c))
        cB += c;
    if (product(cB) != K)
      return n.error() << "Einsum: '" << equation
                       << "': a label summed over in one operand only is not "
                          "supported with two operands";
    order += cB + free_b;
    vb = transposeTo(n, values[1], permFor(b, order));
    vb = n.reshape(vb, {B, K, N});
  } else {
    vb = n.splat(RankedTensorType::get({B, K, 1}, element), 1.0);
  }
  auto prod = n.createChecked<MatmulOp>(va, vb, false, false);
  if (failed(prod))
    return failure();
  // [B, M, N] -> batch + free_a + free_b -> the output's order.
  std::string have = batch + free_a + free_b;
  SmallVector<int64_t> shape;
  for (char c : have)
    shape.push_back(sizeOf(c));
  Value r = n.reshape(prod->getResult(), shape);
  SmallVector<int64_t> perm;
  for (char c : out)
    perm.push_back(StringRef(have).find(c));
  n.setOutput(0, transposeTo(n, r, perm));
  return success();
}

/// Attention (opset 23): softmax(Q K^T * scale + mask) V per head, with
/// Q, K, V as [batch, heads, seq, head_dim] or [batch, seq, heads x
/// head_dim] (q_num_heads / kv_num_heads), fewer K/V heads than Q heads
/// (grouped-query attention: each K/V head serves a group of Q heads), a
/// boolean (true: attend) or additive mask, is_causal and softcap. A fully
/// masked row gives 0 (the exporters' NaN guard at older opsets).
LogicalResult convertAttention(NodeImporter &n) {
  for (unsigned i : {4u, 5u, 6u})
    if (n.hasInput(i))
      return n.error() << "Attention: past key/value and nonpad_kv_seqlen "
                          "inputs (KV caches) are not supported";
  if (failed(n.rejectOutputsFrom(1, "pcc compiles attention without a KV "
                                    "cache or the raw scores")))
    return failure();
  if (n.intAttr("qk_matmul_output_mode", 0) != 0)
    return n.error() << "Attention: qk_matmul_output_mode other than 0 is "
                        "not supported";
  auto q = n.input(0), k = n.input(1), v = n.input(2);
  if (failed(q) || failed(k) || failed(v))
    return failure();
  auto qt = cast<RankedTensorType>(q->getType());
  Type element = qt.getElementType();
  if (!isa<FloatType>(element))
    return n.error() << "Attention: Q must be floating-point";
  bool threeD = qt.getRank() == 3;
  // To [batch, heads, seq, head_dim].
  auto heads4 = [&](Value x, StringRef attr) -> FailureOr<Value> {
    auto t = cast<RankedTensorType>(x.getType());
    if (t.getRank() == 4)
      return x;
    if (t.getRank() != 3)
      return n.error() << "Attention: inputs must be 3-D or 4-D, got " << t;
    int64_t heads = n.intAttr(attr, 0);
    if (heads <= 0 || t.getDimSize(2) % heads != 0)
      return n.error() << "Attention: 3-D inputs need " << attr
                       << " dividing the hidden size " << t.getDimSize(2);
    Value r = n.reshape(x, {t.getDimSize(0), t.getDimSize(1), heads,
                            t.getDimSize(2) / heads});
    return transposeTo(n, r, {0, 2, 1, 3});
  };
  auto q4 = heads4(*q, "q_num_heads"), k4 = heads4(*k, "kv_num_heads"),
       v4 = heads4(*v, "kv_num_heads");
  if (failed(q4) || failed(k4) || failed(v4))
    return failure();
  auto shapeOf = [](Value x) {
    return cast<RankedTensorType>(x.getType()).getShape();
  };
  ArrayRef<int64_t> qs = shapeOf(*q4), ks = shapeOf(*k4), vs = shapeOf(*v4);
  int64_t batch = qs[0], hq = qs[1], seq = qs[2], d = qs[3];
  int64_t hkv = ks[1], len = ks[2], dv = vs[3];
  if (ks[0] != batch || vs[0] != batch || ks[3] != d || vs[1] != hkv ||
      vs[2] != len || hkv == 0 || hq % hkv != 0)
    return n.error() << "Attention: Q " << shapeToString(qs) << ", K "
                     << shapeToString(ks) << " and V " << shapeToString(vs)
                     << " do not fit together";
  // Each K/V head serves hq / hkv consecutive Q heads.
  auto repeatHeads = [&](Value x, int64_t last) {
    if (hkv == hq)
      return x;
    int64_t group = hq / hkv;
    Value r = n.reshape(x, {batch, hkv, 1, len, last});
    r = n.broadcastTo(r, {batch, hkv, group, len, last});
    return n.reshape(r, {batch, hq, len, last});
  };
  Value kr = repeatHeads(*k4, d), vr = repeatHeads(*v4, dv);
  auto scores =
      n.createChecked<MatmulOp>(*q4, kr, /*transpose_a=*/false,
                                /*transpose_b=*/true);
  if (failed(scores))
    return failure();
  auto st = RankedTensorType::get({batch, hq, seq, len}, element);
  double scale = n.floatAttr("scale", 0.0f);
  if (scale == 0.0)
    scale = 1.0 / std::sqrt(static_cast<double>(d));
  Value s = n.create<MulOp>(scores->getResult(), n.splat(st, scale));
  float softcap = n.floatAttr("softcap", 0.0f);
  if (softcap > 0)
    s = n.create<MulOp>(
        n.create<TanhOp>(n.create<DivOp>(s, n.splat(st, softcap))),
        n.splat(st, softcap));
  double negInf = -std::numeric_limits<double>::infinity();
  if (n.hasInput(3)) {
    auto mask = n.input(3);
    if (failed(mask))
      return failure();
    auto mt = cast<RankedTensorType>(mask->getType());
    if (!isBroadcastableTo(mt.getShape(), st.getShape()))
      return n.error() << "Attention: the mask " << shapeToString(mt.getShape())
                       << " does not broadcast to the scores "
                       << shapeToString(st.getShape());
    Value m = n.broadcastTo(*mask, st.getShape());
    if (mt.getElementType().isInteger(1))
      m = n.create<SelectOp>(m, n.splat(st, 0.0), n.splat(st, negInf));
    else if (mt.getElementType() != element)
      return n.error() << "Attention: an additive mask must have Q's type";
    s = n.create<AddOp>(s, m);
  }
  if (n.intAttr("is_causal", 0)) {
    // Query i sees keys j <= i (ONNX aligns the triangle to the upper
    // left).
    HostTensor causal(element, {seq, len});
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = 0; j < len; ++j)
        causal.setDouble(i * len + j, j <= i ? 0.0 : negInf);
    s = n.create<AddOp>(s, n.broadcastTo(n.constantValue(causal),
                                         st.getShape()));
  }
  auto p = n.createChecked<SoftmaxOp>(s, static_cast<int64_t>(3),
                                      /*nan_to_zero=*/true);
  if (failed(p))
    return failure();
  auto y = n.createChecked<MatmulOp>(p->getResult(), vr, false, false);
  if (failed(y))
    return failure();
  Value out = y->getResult();
  if (threeD)
    out = n.reshape(transposeTo(n, out, {0, 2, 1, 3}), {batch, seq, hq * dv});
  n.setOutput(0, out);
  return success();
}

/// RotaryEmbedding (opset 23): x rotated pairwise by the position's angle,
/// x1 * cos - x2 * sin and x2 * cos + x1 * sin, over the first
/// rotary_embedding_dim entries of each head (all by default), the pairs
/// being the two halves or (interleaved) neighbours. X is [batch, heads,
/// seq, head] or [batch, seq, heads x head] (num_heads); cos/sin are
/// [batch or 1, seq, rot/2], or [max_pos, rot/2] looked up at
/// position_ids.
LogicalResult convertRotaryEmbedding(NodeImporter &n) {
  auto x = n.input(0), cosIn = n.input(1), sinIn = n.input(2);
  if (failed(x) || failed(cosIn) || failed(sinIn))
    return failure();
  auto xt = cast<RankedTensorType>(x->getType());
  Type element = xt.getElementType();
  bool threeD = xt.getRank() == 3;
  if (!threeD && xt.getRank() != 4)
    return n.error() << "RotaryEmbedding: X must be 3-D or 4-D, got " << xt;
  // X as [batch, seq, heads, head] (its natural 3-D order) or kept 4-D.
  Value v = *x;
  int64_t batch = xt.getDimSize(0), heads, seq, head;
  if (threeD) {
    heads = n.intAttr("num_heads", 0);
    if (heads <= 0 || xt.getDimSize(2) % heads != 0)
      return n.error() << "RotaryEmbedding: a 3-D input needs num_heads "
                          "dividing its hidden size "
                       << xt.getDimSize(2);
    seq = xt.getDimSize(1);
    head = xt.getDimSize(2) / heads;
    v = n.reshape(v, {batch, seq, heads, head});
  } else {
    heads = xt.getDimSize(1);
    seq = xt.getDimSize(2);
    head = xt.getDimSize(3);
  }
  int64_t rot = n.intAttr("rotary_embedding_dim", 0);
  if (rot == 0)
    rot = head;
  if (rot <= 0 || rot > head || rot % 2 != 0)
    return n.error() << "RotaryEmbedding: rotary_embedding_dim " << rot
                     << " must be even and at most the head size " << head;
  bool interleaved = n.intAttr("interleaved", 0) != 0;
  // cos / sin as [batch, seq, rot/2].
  Value c = *cosIn, sn = *sinIn;
  if (n.hasInput(3)) {
    auto pos = n.input(3);
    if (failed(pos))
      return failure();
    auto gc = n.createChecked<GatherOp>(c, *pos, static_cast<int64_t>(0));
    auto gs = n.createChecked<GatherOp>(sn, *pos, static_cast<int64_t>(0));
    if (failed(gc) || failed(gs))
      return failure();
    c = gc->getResult();
    sn = gs->getResult();
  }
  auto ct = cast<RankedTensorType>(c.getType());
  int64_t half = rot / 2;
  // A batch of 1 broadcasts (the dynamo exporter passes one table for all
  // batch entries).
  if (ct.getRank() != 3 ||
      (ct.getDimSize(0) != batch && ct.getDimSize(0) != 1) ||
      ct.getDimSize(1) != seq || ct.getDimSize(2) < half)
    return n.error() << "RotaryEmbedding: cos/sin of shape "
                     << shapeToString(ct.getShape()) << " do not give ["
                     << batch << ", " << seq << ", " << half << "]";
  auto cut = [&](Value t, int64_t dim, int64_t start, int64_t limit,
                 int64_t step) -> FailureOr<Value> {
    auto tt = cast<RankedTensorType>(t.getType());
    SmallVector<int64_t> starts(tt.getRank(), 0), limits(tt.getShape()),
        steps(tt.getRank(), 1);
    starts[dim] = start;
    limits[dim] = limit;
    steps[dim] = step;
    auto r = n.createChecked<SliceOp>(t, starts, limits, steps);
    if (failed(r))
      return failure();
    return r->getResult();
  };
  if (ct.getDimSize(2) != half) {
    auto cc = cut(c, 2, 0, half, 1), ss = cut(sn, 2, 0, half, 1);
    if (failed(cc) || failed(ss))
      return failure();
    c = *cc;
    sn = *ss;
  }
  // The angles broadcast over the heads.
  SmallVector<int64_t> pieceShape =
      threeD ? SmallVector<int64_t>{batch, seq, heads, half}
             : SmallVector<int64_t>{batch, heads, seq, half};
  int64_t angleBatch = ct.getDimSize(0);
  SmallVector<int64_t> angleShape =
      threeD ? SmallVector<int64_t>{angleBatch, seq, 1, half}
             : SmallVector<int64_t>{angleBatch, 1, seq, half};
  Value cb = n.broadcastTo(n.reshape(c, angleShape), pieceShape);
  Value sb = n.broadcastTo(n.reshape(sn, angleShape), pieceShape);
  if (cast<RankedTensorType>(cb.getType()).getElementType() != element)
    return n.error() << "RotaryEmbedding: cos/sin must have X's type";
  int64_t last = 3;
  auto x1 = interleaved ? cut(v, last, 0, rot, 2) : cut(v, last, 0, half, 1);
  auto x2 = interleaved ? cut(v, last, 1, rot, 2) : cut(v, last, half, rot, 1);
  if (failed(x1) || failed(x2))
    return failure();
  Value r1 = n.create<SubOp>(n.create<MulOp>(*x1, cb), n.create<MulOp>(*x2, sb));
  Value r2 = n.create<AddOp>(n.create<MulOp>(*x2, cb), n.create<MulOp>(*x1, sb));
  Value rotated;
  if (interleaved) {
    // [.., half, 2] pairs back to [.., rot].
    SmallVector<int64_t> pairShape(pieceShape);
    pairShape.push_back(1);
    auto both = n.createChecked<ConcatOp>(
        ValueRange{n.reshape(r1, pairShape), n.reshape(r2, pairShape)},
        static_cast<int64_t>(4));
    if (failed(both))
      return failure();
    SmallVector<int64_t> rotShape(pieceShape);
    rotShape[3] = rot;
    rotated = n.reshape(both->getResult(), rotShape);
  } else {
    auto both = n.createChecked<ConcatOp>(ValueRange{r1, r2}, last);
    if (failed(both))
      return failure();
    rotated = both->getResult();
  }
  if (rot < head) {
    auto rest = cut(v, last, rot, head, 1);
    if (failed(rest))
      return failure();
    auto all = n.createChecked<ConcatOp>(ValueRange{rotated, *rest}, last);
    if (failed(all))
      return failure();
    rotated = all->getResult();
  }
  n.setOutput(0, threeD ? n.reshape(rotated, xt.getShape()) : rotated);
  return success();
}

} // namespace

void onnx_import::registerCompositeConverters(
    llvm::StringMap<ConverterFn> &table) {
  table["RMSNormalization"] = convertRMSNorm;
  table["Attention"] = convertAttention;
  table["RotaryEmbedding"] = convertRotaryEmbedding;
  table["CumSum"] = convertCumSum;
  table["ScatterND"] = convertScatterND;
  table["Einsum"] = convertEinsum;
  table["Trilu"] = convertTrilu;
}
