//===- FuseAttention.cpp - decomposed attention into pcc.attention --------===//
//
// See Passes.td (pcc-fuse-attention). The match starts at each softmax over
// the last axis of a rank-4 tensor and walks back through the scores
// (masks, scalings, the q k^T product) and forward to the product with v.
// Nothing is erased here: the canonicalizer that follows drops what the
// new op leaves unused.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"

#include "llvm/ADT/SmallPtrSet.h"

#include <cmath>
#include <optional>

namespace mlir::pcc {
#define GEN_PASS_DEF_FUSEATTENTION
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

template <typename OpT> OpT soleUser(Value v) {
  if (!v.hasOneUse())
    return nullptr;
  return dyn_cast<OpT>(*v.getUsers().begin());
}

/// The value of a splat float constant.
std::optional<double> splatValue(Value v) {
  auto cst = v.getDefiningOp<ConstantOp>();
  if (!cst)
    return std::nullopt;
  auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
  if (!dense || !dense.isSplat() || !isa<FloatType>(dense.getElementType()))
    return std::nullopt;
  return dense.getSplatValue<APFloat>().convertToDouble();
}

/// `x * c` or `c * x` (or `x / c`) with c a splat: x, and c (1/c).
std::optional<std::pair<Value, double>> splatScaling(Value v) {
  Operation *op = v.getDefiningOp();
  if (auto mul = dyn_cast_if_present<MulOp>(op)) {
    if (auto c = splatValue(mul.getRhs()))
      return std::make_pair(mul.getLhs(), *c);
    if (auto c = splatValue(mul.getLhs()))
      return std::make_pair(mul.getRhs(), *c);
  }
  if (auto div = dyn_cast_if_present<DivOp>(op))
    if (auto c = splatValue(div.getRhs()); c && *c != 0.0)
      return std::make_pair(div.getLhs(), 1.0 / *c);
  return std::nullopt;
}

/// Strips splat scalings used only here off `v`, multiplying them into
/// `scale`.
Value peelScalings(Value v, double &scale) {
  while (v.hasOneUse()) {
    auto s = splatScaling(v);
    if (!s)
      break;
    scale *= s->second;
    v = s->first;
  }
  return v;
}

/// A [B, H, L, D] operand that repeats the heads of a [B, Hkv, L, D] value
/// for grouped-query attention (reshape to [B, Hkv, 1, L, D], broadcast to
/// [B, Hkv, g, L, D], reshape back; `x` may be the 5-D broadcast itself):
/// the unrepeated value, or `x` itself.
Value unrepeat(Value x) {
  Value five = x;
  if (auto r = x.getDefiningOp<ReshapeOp>(); r && typeOf(x).getRank() == 4)
    five = r.getInput();
  auto bc = five.getDefiningOp<BroadcastOp>();
  if (!bc || typeOf(five).getRank() != 5)
    return x;
  auto in = bc.getInput().getDefiningOp<ReshapeOp>();
  if (!in || typeOf(bc.getInput()).getDimSize(2) != 1)
    return x;
  auto base = typeOf(in.getInput());
  ArrayRef<int64_t> s5 = typeOf(five).getShape();
  if (base.getRank() != 4 || base.getDimSize(0) != s5[0] ||
      base.getDimSize(1) != s5[1] || base.getDimSize(2) != s5[3] ||
      base.getDimSize(3) != s5[4])
    return x;
  return in.getInput();
}

/// The [B, H, L, D] keys as a value and the permutation that makes them
/// from it (empty: the value itself).
struct Keys {
  Value base;
  SmallVector<int64_t> perm;

  /// The [B, H, L, D] type of the keys.
  RankedTensorType type() const {
    RankedTensorType t = typeOf(base);
    if (perm.empty())
      return t;
    SmallVector<int64_t> shape;
    for (int64_t p : perm)
      shape.push_back(t.getDimSize(p));
    return t.clone(shape);
  }
};

/// The keys whose transpose is the [B, H, D, L] value `kt`: a transpose of
/// the last two dimensions, the exporters' reshape to [B H, L, D],
/// transpose, reshape back (of a repeat for grouped-query attention), or
/// any other transpose (a [B, L, H, D] tensor permuted [0, 2, 3, 1]: the
/// keys are it permuted [0, 2, 1, 3]). Else `kt` transposed back.
Keys keysOf(Value kt) {
  ArrayRef<int64_t> shape = typeOf(kt).getShape();
  if (auto t = kt.getDefiningOp<TransposeOp>()) {
    ArrayRef<int64_t> p = t.getPermutation();
    SmallVector<int64_t> perm = {p[0], p[1], p[3], p[2]};
    if (perm == ArrayRef<int64_t>{0, 1, 2, 3})
      return {unrepeat(t.getInput()), {}};
    return {t.getInput(), perm};
  }
  if (auto outer = kt.getDefiningOp<ReshapeOp>()) {
    auto t = outer.getInput().getDefiningOp<TransposeOp>();
    auto inner = t && t.getPermutation() == ArrayRef<int64_t>{0, 2, 1}
                     ? t.getInput().getDefiningOp<ReshapeOp>()
                     : ReshapeOp();
    if (inner) {
      Value k = inner.getInput();
      ArrayRef<int64_t> ks = typeOf(k).getShape();
      int64_t heads = shape[1];
      // [B, H, L, D], or the 5-D [B, Hkv, g, L, D] of a repeat.
      if (ks.size() == 4 && ks[0] == shape[0] && ks[1] == heads &&
          ks[2] == shape[3] && ks[3] == shape[2])
        return {unrepeat(k), {}};
      if (ks.size() == 5 && ks[0] == shape[0] && ks[1] * ks[2] == heads &&
          ks[3] == shape[3] && ks[4] == shape[2])
        return {unrepeat(k), {}};
    }
  }
  return {kt, {0, 1, 3, 2}};
}

/// Whether anything `v` is computed from is a weight.
bool readsWeights(Value v) {
  SmallVector<Value> work = {v};
  llvm::SmallPtrSet<Operation *, 32> seen;
  while (!work.empty()) {
    Operation *op = work.pop_back_val().getDefiningOp();
    if (!op || !seen.insert(op).second)
      continue;
    if (isa<ParamOp>(op))
      return true;
    llvm::append_range(work, op->getOperands());
  }
  return false;
}

/// Whether the constant `mask` (rank 2 to 4, [.., S, L], S == L) is
/// exactly the causal mask in every [S, L] slice: 0 where key <= query and
/// at most -1e30 (exp of it is 0 in f32) elsewhere.
bool isCausalMask(Value mask) {
  auto cst = mask.getDefiningOp<ConstantOp>();
  auto type = typeOf(mask);
  if (!cst || type.getRank() < 2)
    return false;
  int64_t s = type.getDimSize(type.getRank() - 2),
          l = type.getDimSize(type.getRank() - 1);
  auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
  if (s != l || !dense || !isa<FloatType>(dense.getElementType()))
    return false;
  auto causalAt = [&](int64_t i, double d) {
    int64_t row = (i / l) % s, col = i % l;
    return col <= row ? d == 0.0 : d <= -1e30;
  };
  if (dense.isSplat()) // a causal mask holds two values unless S = 1
    return s == 1 && dense.getSplatValue<APFloat>().convertToDouble() == 0.0;
  int64_t i = 0;
  // f32 masks read as floats: APFloat per element is slow at S = 2048.
  if (dense.getElementType().isF32()) {
    for (float x : dense.getValues<float>())
      if (!causalAt(i++, x))
        return false;
    return true;
  }
  for (APFloat x : dense.getValues<APFloat>())
    if (!causalAt(i++, x.convertToDouble()))
      return false;
  return true;
}

/// Whether the constant boolean `cond` (rank 2 to 4, [.., S, L], S == L)
/// holds `masked` exactly where the causal mask masks (key > query) in
/// every [S, L] slice.
bool isCausalCondition(Value cond, bool masked) {
  auto cst = cond.getDefiningOp<ConstantOp>();
  auto type = typeOf(cond);
  if (!cst || type.getRank() < 2 || !type.getElementType().isInteger(1))
    return false;
  int64_t s = type.getDimSize(type.getRank() - 2),
          l = type.getDimSize(type.getRank() - 1);
  auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
  if (s != l || !dense)
    return false;
  int64_t i = 0;
  for (bool x : dense.getValues<bool>()) {
    int64_t row = (i / l) % s, col = i % l;
    if ((x == masked) != (col > row))
      return false;
    ++i;
  }
  return true;
}

/// A masked_fill of the scores with a causal constant condition:
/// `select(cond, fill, x)` or `select(cond, x, fill)` with fill a splat at
/// most -1e30. Returns x.
std::optional<Value> causalFill(Value s) {
  auto sel = s.getDefiningOp<SelectOp>();
  if (!sel)
    return std::nullopt;
  Value cond = sel.getCondition();
  if (auto bc = cond.getDefiningOp<BroadcastOp>())
    cond = bc.getInput();
  for (bool fillFirst : {true, false}) {
    Value fill = fillFirst ? sel.getTrueValue() : sel.getFalseValue();
    Value x = fillFirst ? sel.getFalseValue() : sel.getTrueValue();
    std::optional<double> f = splatValue(fill);
    if (f && *f <= -1e30 && isCausalCondition(cond, /*masked=*/fillFirst))
      return x;
  }
  return std::nullopt;
}

/// The bias to give the fused op: the mask before its broadcast to the
/// scores (rank 4, each dimension 1 or the scores'), or the mask itself.
Value unbroadcastBias(OpBuilder &b, Value mask, ArrayRef<int64_t> scores) {
  Value m = mask;
  if (auto bc = mask.getDefiningOp<BroadcastOp>())
    m = bc.getInput();
  auto t = typeOf(m);
  if (t.getRank() > 4)
    return mask;
  SmallVector<int64_t> shape(4 - t.getRank(), 1);
  llvm::append_range(shape, t.getShape());
  for (int64_t d = 0; d < 4; ++d)
    if (shape[d] != 1 && shape[d] != scores[d])
      return mask;
  if (t.getRank() == 4)
    return m;
  return ReshapeOp::create(b, m.getLoc(), t.clone(shape), m);
}

struct Match {
  MatmulOp scores, output;
  SoftmaxOp softmax;
  Value q, v, mask;
  Keys k;
  double scale = 1.0;
  bool causal = false;
};

/// Walks back from the softmax input to the q k^T product: masks added
/// nearest the softmax, scalings nearer the product (a scaling after a mask
/// would scale the mask too: not matched).
bool matchScores(Value s, Match &m) {
  bool scaled = false;
  SmallVector<Value> masks;
  while (true) {
    if (!s.hasOneUse())
      return false;
    if (auto mm = s.getDefiningOp<MatmulOp>()) {
      m.scores = mm;
      break;
    }
    if (auto sc = splatScaling(s)) {
      m.scale *= sc->second;
      s = sc->first;
      scaled = true;
      continue;
    }
    if (std::optional<Value> x = causalFill(s); x && !scaled && !m.causal) {
      m.causal = true;
      s = *x;
      continue;
    }
    auto add = s.getDefiningOp<AddOp>();
    if (!add || scaled)
      return false;
    // The scores side is the one that leads to a product.
    auto leadsToScores = [](Value x) {
      for (int i = 0; i < 8 && x; ++i) {
        Operation *op = x.getDefiningOp();
        if (isa_and_present<MatmulOp>(op))
          return true;
        if (isa_and_present<SelectOp>(op))
          return causalFill(x).has_value();
        if (!isa_and_present<AddOp, MulOp, DivOp>(op))
          return false;
        x = op->getOperand(0);
        if (isa<AddOp, MulOp>(op) && splatValue(x))
          x = op->getOperand(1);
      }
      return false;
    };
    bool lhs = leadsToScores(add.getLhs());
    masks.push_back(lhs ? add.getRhs() : add.getLhs());
    s = lhs ? add.getLhs() : add.getRhs();
  }
  // At most one mask besides the causal one.
  for (Value mask : masks) {
    Value base = mask;
    if (auto bc = mask.getDefiningOp<BroadcastOp>())
      base = bc.getInput();
    if (!m.causal && isCausalMask(base)) {
      m.causal = true;
      continue;
    }
    if (m.mask || readsWeights(mask))
      return false;
    m.mask = mask;
  }
  return true;
}

/// The full pattern around `softmax`, or failure.
bool matchAttention(SoftmaxOp softmax, Match &m) {
  auto type = typeOf(softmax.getResult());
  if (type.getRank() != 4 || softmax.getAxis() != 3)
    return false;
  m.softmax = softmax;
  m.output = soleUser<MatmulOp>(softmax.getResult());
  if (!m.output || m.output.getLhs() != softmax.getResult() ||
      m.output.getTransposeA() || m.output.getTransposeB())
    return false;
  if (!matchScores(softmax.getInput(), m))
    return false;
  MatmulOp mm = m.scores;
  if (mm.getTransposeA() || typeOf(mm.getLhs()).getRank() != 4 ||
      typeOf(mm.getRhs()).getRank() != 4)
    return false;
  m.q = peelScalings(mm.getLhs(), m.scale);
  Value rhs = peelScalings(mm.getRhs(), m.scale);
  m.k = mm.getTransposeB() ? Keys{unrepeat(rhs), {}} : keysOf(rhs);
  m.v = unrepeat(m.output.getRhs());
  if (typeOf(m.v).getRank() != 4)
    return false;
  // Types: one float element type (f32 or bf16: the kernels'), q's heads a
  // multiple of k's and v's, which agree.
  auto q = typeOf(m.q), v = typeOf(m.v);
  RankedTensorType k = m.k.type();
  Type element = q.getElementType();
  if (!(element.isF32() || element.isBF16()) || k.getElementType() != element ||
      v.getElementType() != element ||
      typeOf(m.output.getResult()).getElementType() != element)
    return false;
  if (k.getDimSize(0) != q.getDimSize(0) || k.getDimSize(3) != q.getDimSize(3) ||
      v.getDimSize(0) != q.getDimSize(0) || v.getDimSize(1) != k.getDimSize(1) ||
      v.getDimSize(2) != k.getDimSize(2) ||
      q.getDimSize(1) % k.getDimSize(1) != 0 ||
      type.getDimSize(3) != k.getDimSize(2))
    return false;
  // A mask that may empty a row: only where softmax zeroes such rows (a
  // causal mask keeps the diagonal).
  if (m.mask && !softmax.getNanToZero())
    return false;
  if (m.mask) {
    Type me = typeOf(m.mask).getElementType();
    if (!me.isF32() && me != element)
      return false;
  }
  return true;
}

struct FuseAttentionPass
    : pcc::impl::FuseAttentionBase<FuseAttentionPass> {
  using FuseAttentionBase::FuseAttentionBase;

  void runOnOperation() override {
    SmallVector<SoftmaxOp> softmaxes;
    getOperation().walk([&](SoftmaxOp op) { softmaxes.push_back(op); });
    for (SoftmaxOp softmax : softmaxes) {
      Match m;
      if (!matchAttention(softmax, m))
        continue;
      // tp ranks that split the query heads but not the key/value heads:
      // the decomposed form repeats K and V and splits the repeats.
      int64_t kvHeads = m.k.type().getDimSize(1);
      if (tensorParallel > 1 && kvHeads % tensorParallel != 0 &&
          typeOf(m.q).getDimSize(1) % tensorParallel == 0)
        continue;
      OpBuilder b(m.output);
      auto out = typeOf(m.output.getResult());
      auto q = typeOf(m.q);
      Type stat = Float32Type::get(&getContext());
      Value bias;
      if (m.mask)
        bias = unbroadcastBias(b, m.mask, typeOf(softmax.getResult()).getShape());
      Value keys = m.k.base;
      if (!m.k.perm.empty())
        keys = TransposeOp::create(b, m.scores.getLoc(), m.k.type(), keys,
                                   m.k.perm);
      // Named after the first product (q k^T): its ONNX node is the one
      // errors and the profile show.
      auto attention = AttentionOp::create(
          b, m.scores.getLoc(), out,
          RankedTensorType::get(q.getShape().drop_back(), stat), m.q, keys, m.v,
          bias, b.getF64FloatAttr(m.scale),
          m.causal ? b.getUnitAttr() : UnitAttr());
      m.output.getResult().replaceAllUsesWith(attention.getResult());
    }
  }
};

} // namespace
