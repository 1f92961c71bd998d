//===- ShardingPropertyTest.cpp - every sharding rule is total and right --===//
//
// Property tests of the layout algebra and of every op's sharding rule over
// random shapes (dimensions of size 1, smaller than the rank count, odd,
// zero), rank counts 1-16 and stripes 1-4:
//
//  - no rule crashes, whatever layouts its operands are said to have (ones
//    that do not fit their tensors included): the interface returns only
//    options whose layouts divide the shapes;
//  - every option is right: the op's partitioned program (its clone on
//    local types, rewritten by partitionLocal as pcc-partition does), run
//    on each simulated rank by the float64 interpreter on that rank's
//    pieces and gathered (split results concatenated, partial sums added,
//    replicated results equal on every rank), equals the op on the whole
//    tensors.
//
//===----------------------------------------------------------------------===//

#include "Interpreter.h"

#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

using namespace mlir;
using namespace mlir::pcc;
using ::pcc::testing::interpret;
using ::pcc::testing::Tensor;

namespace {

MLIRContext &context() { return ::pcc::testing::testContext(); }

using Rng = std::mt19937_64;

int64_t pick(Rng &rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

/// A dimension size: mostly small and awkward (1, primes, fewer than the
/// ranks), sometimes a multiple of many rank counts.
int64_t dimSize(Rng &rng) {
  static const int64_t sizes[] = {1, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24};
  return sizes[pick(rng, 0, std::size(sizes) - 1)];
}

SmallVector<int64_t> randomShape(Rng &rng, int64_t minRank, int64_t maxRank) {
  SmallVector<int64_t> shape;
  for (int64_t i = 0, r = pick(rng, minRank, maxRank); i < r; ++i)
    shape.push_back(dimSize(rng));
  return shape;
}

std::string tensorType(ArrayRef<int64_t> shape, StringRef element = "f64") {
  std::string s = "tensor<";
  for (int64_t d : shape)
    s += std::to_string(d) + "x";
  return s + element.str() + ">";
}

std::string list(ArrayRef<int64_t> values) {
  std::string s = "[";
  for (auto [i, v] : llvm::enumerate(values))
    s += (i ? ", " : "") + std::to_string(v);
  return s + "]";
}

/// A function @f of one pcc op on its arguments (the op's operands).
struct OneOp {
  SmallVector<std::string> argTypes;
  std::string op;         // e.g. "pcc.exp %a0", without the types
  std::string types;      // ": ... -> ..." or ": ..."
  SmallVector<std::string> resultTypes;

  std::string text() const {
    std::string s = "func.func @f(";
    for (auto [i, t] : llvm::enumerate(argTypes))
      s += llvm::formatv("{0}%a{1}: {2}", i ? ", " : "", i, t).str();
    s += ") -> (";
    for (auto [i, t] : llvm::enumerate(resultTypes))
      s += (i ? ", " : "") + t;
    s += ") {\n  ";
    if (resultTypes.size() == 1)
      s += "%r = ";
    else
      s += llvm::formatv("%r:{0} = ", resultTypes.size()).str();
    s += op + " " + types + "\n  return ";
    for (size_t i = 0; i < resultTypes.size(); ++i)
      s += (i ? ", " : "") +
           (resultTypes.size() == 1 ? std::string("%r")
                                    : llvm::formatv("%r#{0}", i).str());
    s += " : ";
    for (auto [i, t] : llvm::enumerate(resultTypes))
      s += (i ? ", " : "") + t;
    return s + "\n}\n";
  }
};

//===----------------------------------------------------------------------===//
// Random one-op programs, one generator per rule
//===----------------------------------------------------------------------===//

OneOp elementwise(Rng &rng) {
  static const char *binary[] = {"add", "sub", "mul", "div", "max"};
  static const char *unary[] = {"exp", "neg", "tanh"};
  auto shape = randomShape(rng, 1, 4);
  std::string t = tensorType(shape);
  if (pick(rng, 0, 2)) {
    const char *name = binary[pick(rng, 0, std::size(binary) - 1)];
    return {{t, t}, llvm::formatv("pcc.{0} %a0, %a1", name), ": " + t, {t}};
  }
  const char *name = unary[pick(rng, 0, std::size(unary) - 1)];
  return {{t}, llvm::formatv("pcc.{0} %a0", name), ": " + t, {t}};
}

OneOp transpose(Rng &rng) {
  auto shape = randomShape(rng, 1, 4);
  SmallVector<int64_t> perm(shape.size()), out;
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t p : perm)
    out.push_back(shape[p]);
  return {{tensorType(shape)},
          "pcc.transpose %a0 " + list(perm),
          ": " + tensorType(shape) + " -> " + tensorType(out),
          {tensorType(out)}};
}

/// A reshape to a random factorisation of the element count: heads merged
/// and split, and shapes no view could give.
OneOp reshape(Rng &rng) {
  auto shape = randomShape(rng, 1, 4);
  int64_t total = 1;
  for (int64_t d : shape)
    total *= d;
  SmallVector<int64_t> out;
  int64_t left = total;
  for (int64_t i = 0, r = pick(rng, 1, 4); i < r - 1; ++i) {
    SmallVector<int64_t> divisors;
    for (int64_t d = 1; d <= left; ++d)
      if (left % d == 0)
        divisors.push_back(d);
    int64_t d = divisors[pick(rng, 0, divisors.size() - 1)];
    out.push_back(d);
    left /= d;
  }
  out.push_back(left);
  return {{tensorType(shape)}, "pcc.reshape %a0",
          ": " + tensorType(shape) + " -> " + tensorType(out),
          {tensorType(out)}};
}

OneOp broadcast(Rng &rng) {
  auto in = randomShape(rng, 1, 3);
  SmallVector<int64_t> out = randomShape(rng, 0, 2);
  for (int64_t d : in)
    out.push_back(d == 1 ? dimSize(rng) : d);
  return {{tensorType(in)}, "pcc.broadcast %a0",
          ": " + tensorType(in) + " -> " + tensorType(out),
          {tensorType(out)}};
}

OneOp slice(Rng &rng) {
  auto shape = randomShape(rng, 1, 3);
  SmallVector<int64_t> starts, limits, steps, out;
  for (int64_t d : shape) {
    int64_t start = pick(rng, 0, d - 1), limit = pick(rng, start + 1, d);
    int64_t step = pick(rng, 0, 3) ? 1 : 2;
    starts.push_back(start);
    limits.push_back(limit);
    steps.push_back(step);
    out.push_back((limit - start + step - 1) / step);
  }
  return {{tensorType(shape)},
          llvm::formatv("pcc.slice %a0 starts = {0} limits = {1} steps = {2}",
                        list(starts), list(limits), list(steps)),
          ": " + tensorType(shape) + " -> " + tensorType(out),
          {tensorType(out)}};
}

OneOp pad(Rng &rng) {
  auto shape = randomShape(rng, 1, 3);
  SmallVector<int64_t> starts, steps, out;
  for (int64_t d : shape) {
    int64_t step = pick(rng, 0, 3) ? 1 : 2, start = pick(rng, 0, 4);
    int64_t need = start + (d - 1) * step + 1;
    starts.push_back(start);
    steps.push_back(step);
    out.push_back(need + pick(rng, 0, 4));
  }
  return {{tensorType(shape)},
          llvm::formatv("pcc.pad %a0 starts = {0} steps = {1}", list(starts),
                        list(steps)),
          ": " + tensorType(shape) + " -> " + tensorType(out),
          {tensorType(out)}};
}

OneOp split(Rng &rng) {
  auto shape = randomShape(rng, 1, 3);
  int64_t axis = pick(rng, 0, shape.size() - 1);
  int64_t pieces = pick(rng, 1, 3);
  shape[axis] = 0;
  SmallVector<int64_t> sizes;
  for (int64_t i = 0; i < pieces; ++i) {
    sizes.push_back(dimSize(rng));
    shape[axis] += sizes.back();
  }
  OneOp one{{tensorType(shape)},
            llvm::formatv("pcc.split %a0 axis = {0} sizes = {1}", axis,
                          list(sizes)),
            ": " + tensorType(shape) + " -> ",
            {}};
  for (auto [i, size] : llvm::enumerate(sizes)) {
    SmallVector<int64_t> piece(shape);
    piece[axis] = size;
    one.resultTypes.push_back(tensorType(piece));
    one.types += (i ? ", " : "") + tensorType(piece);
  }
  return one;
}

OneOp concat(Rng &rng) {
  auto shape = randomShape(rng, 1, 3);
  int64_t axis = pick(rng, 0, shape.size() - 1);
  OneOp one;
  one.op = "pcc.concat ";
  one.types = ": ";
  int64_t total = 0;
  for (int64_t i = 0, n = pick(rng, 1, 3); i < n; ++i) {
    SmallVector<int64_t> piece(shape);
    // Equal pieces (a fused QKV's gradient) or any sizes.
    piece[axis] = i && pick(rng, 0, 1) ? shape[axis] : dimSize(rng);
    if (i == 0)
      shape[axis] = piece[axis];
    total += piece[axis];
    one.argTypes.push_back(tensorType(piece));
    one.op += llvm::formatv("{0}%a{1}", i ? ", " : "", i).str();
    one.types += (i ? ", " : "") + tensorType(piece);
  }
  one.op += llvm::formatv(" axis = {0}", axis).str();
  SmallVector<int64_t> out(shape);
  out[axis] = total;
  one.types += " -> " + tensorType(out);
  one.resultTypes.push_back(tensorType(out));
  return one;
}

OneOp softmax(Rng &rng) {
  auto shape = randomShape(rng, 1, 3);
  int64_t axis = pick(rng, 0, shape.size() - 1);
  std::string t = tensorType(shape);
  return {{t},
          llvm::formatv("pcc.{0} %a0 axis = {1}",
                        pick(rng, 0, 1) ? "softmax" : "log_softmax", axis),
          ": " + t,
          {t}};
}

OneOp layerNorm(Rng &rng) {
  auto shape = randomShape(rng, 1, 3);
  int64_t axis = pick(rng, 0, shape.size() - 1);
  ArrayRef<int64_t> normalized = ArrayRef<int64_t>(shape).drop_front(axis);
  std::string t = tensorType(shape), w = tensorType(normalized);
  bool bias = pick(rng, 0, 1);
  return {bias ? SmallVector<std::string>{t, w, w}
               : SmallVector<std::string>{t, w},
          llvm::formatv("pcc.layer_norm %a0, %a1{0} axis = {1} epsilon = "
                        "1.0e-5",
                        bias ? ", %a2" : "", axis),
          ": " + t + ", " + w + (bias ? ", " + w : ""),
          {t}};
}

OneOp gather(Rng &rng) {
  auto table = randomShape(rng, 1, 3);
  auto indices = randomShape(rng, 0, 2);
  int64_t axis = pick(rng, 0, table.size() - 1);
  SmallVector<int64_t> out(table.begin(), table.begin() + axis);
  out.append(indices.begin(), indices.end());
  out.append(table.begin() + axis + 1, table.end());
  std::string it = tensorType(indices, "i64");
  return {{tensorType(table), it},
          llvm::formatv("pcc.gather %a0[%a1] axis = {0}", axis),
          ": " + tensorType(table) + ", " + it + " -> " + tensorType(out),
          {tensorType(out)}};
}

OneOp reduce(Rng &rng) {
  static const char *names[] = {"reduce_sum", "reduce_mean", "reduce_max",
                                "reduce_min", "argmax"};
  auto shape = randomShape(rng, 1, 3);
  const char *name = names[pick(rng, 0, std::size(names) - 1)];
  bool keep = pick(rng, 0, 1);
  SmallVector<int64_t> axes, out;
  bool argmax = StringRef(name) == "argmax";
  int64_t argAxis = pick(rng, 0, shape.size() - 1);
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    bool reduced = argmax ? d == argAxis : pick(rng, 0, 2) == 0;
    if (reduced)
      axes.push_back(d);
    if (!reduced)
      out.push_back(shape[d]);
    else if (keep)
      out.push_back(1);
  }
  if (argmax) {
    std::string rt = tensorType(out, "i64");
    return {{tensorType(shape)},
            llvm::formatv("pcc.argmax %a0 axis = {0}{1}", argAxis,
                          keep ? " {keep_dims}" : ""),
            ": " + tensorType(shape) + " -> " + rt,
            {rt}};
  }
  if (axes.empty()) {
    axes.push_back(0);
    out.erase(out.begin());
    if (keep)
      out.insert(out.begin(), 1);
  }
  return {{tensorType(shape)},
          llvm::formatv("pcc.{0} %a0 axes = {1}{2}", name, list(axes),
                        keep ? " {keep_dims}" : ""),
          ": " + tensorType(shape) + " -> " + tensorType(out),
          {tensorType(out)}};
}

OneOp matmul(Rng &rng) {
  int64_t m = dimSize(rng), k = dimSize(rng), n = dimSize(rng);
  SmallVector<int64_t> batch = randomShape(rng, 0, 2);
  bool ta = pick(rng, 0, 1), tb = pick(rng, 0, 1), rhs2 = pick(rng, 0, 1);
  SmallVector<int64_t> a(batch), b(rhs2 ? SmallVector<int64_t>() : batch),
      out(batch);
  a.append(ta ? SmallVector<int64_t>{k, m} : SmallVector<int64_t>{m, k});
  b.append(tb ? SmallVector<int64_t>{n, k} : SmallVector<int64_t>{k, n});
  out.append({m, n});
  std::string attrs;
  if (ta || tb)
    attrs = std::string(" {") + (ta ? "transpose_a" : "") +
            (ta && tb ? ", " : "") + (tb ? "transpose_b" : "") + "}";
  return {{tensorType(a), tensorType(b)},
          "pcc.matmul %a0, %a1" + attrs,
          ": " + tensorType(a) + ", " + tensorType(b) + " -> " +
              tensorType(out),
          {tensorType(out)}};
}

OneOp pool(Rng &rng) {
  int64_t n = dimSize(rng), c = dimSize(rng), h = pick(rng, 2, 6),
          w = pick(rng, 2, 6);
  SmallVector<int64_t> in{n, c, h, w}, out{n, c, h - 1, w - 1};
  return {{tensorType(in)},
          "pcc.max_pool %a0 kernel = [2, 2] strides = [1, 1] pads = [0, 0, 0, "
          "0] dilations = [1, 1]",
          ": " + tensorType(in) + " -> " + tensorType(out),
          {tensorType(out)}};
}

using Generator = OneOp (*)(Rng &);
const std::pair<const char *, Generator> kGenerators[] = {
    {"elementwise", elementwise}, {"transpose", transpose},
    {"reshape", reshape},         {"broadcast", broadcast},
    {"slice", slice},             {"pad", pad},
    {"split", split},             {"concat", concat},
    {"softmax", softmax},         {"layer_norm", layerNorm},
    {"gather", gather},           {"reduce", reduce},
    {"matmul", matmul},           {"max_pool", pool},
};

//===----------------------------------------------------------------------===//
// Simulated ranks
//===----------------------------------------------------------------------===//

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

std::vector<int64_t> stridesOf(ArrayRef<int64_t> shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

/// The global index of element `local` of rank `rank`'s piece of a tensor
/// of shape `global` split as `s` over `ranks` ranks (dimension d viewed as
/// [stripes, ranks, chunk]; the rank holds [stripes, chunk]).
int64_t globalIndex(int64_t local, ArrayRef<int64_t> global, Shard s,
                    int64_t ranks, int64_t rank) {
  SmallVector<int64_t> localShape(global);
  localShape[s.dim] /= ranks;
  std::vector<int64_t> ls = stridesOf(localShape), gs = stridesOf(global);
  int64_t chunk = global[s.dim] / (s.stripes * ranks), flat = 0;
  for (size_t d = 0; d < global.size(); ++d) {
    int64_t i = (local / ls[d]) % localShape[d];
    if (static_cast<int64_t>(d) == s.dim)
      i = (i / chunk) * chunk * ranks + rank * chunk + i % chunk;
    flat += i * gs[d];
  }
  return flat;
}

/// Rank `rank`'s piece of `whole` in layout `s` (a partial sum's pieces
/// come from `pieces`).
Tensor pieceOf(const Tensor &whole, Shard s, int64_t ranks, int64_t rank,
               const std::vector<Tensor> &pieces) {
  if (s.isReplicated())
    return whole;
  if (s.isPartial())
    return pieces[rank];
  Tensor t;
  t.shape = whole.shape;
  t.shape[s.dim] /= ranks;
  t.data.resize(t.numElements());
  for (int64_t i = 0, e = t.data.size(); i < e; ++i)
    t.data[i] = whole.data[globalIndex(i, whole.shape, s, ranks, rank)];
  return t;
}

/// The whole tensor the ranks' `pieces` hold in layout `s`; a replicated
/// layout must be the same on every rank (checked by the caller).
Tensor wholeOf(ArrayRef<Tensor> pieces, ArrayRef<int64_t> global, Shard s,
               int64_t ranks) {
  Tensor t;
  t.shape.assign(global.begin(), global.end());
  t.data.assign(t.numElements(), 0.0);
  for (int64_t r = 0; r < ranks; ++r)
    for (int64_t i = 0, e = pieces[r].data.size(); i < e; ++i) {
      if (s.isReplicated())
        t.data[i] = pieces[0].data[i];
      else if (s.isPartial())
        t.data[i] += pieces[r].data[i];
      else
        t.data[globalIndex(i, global, s, ranks, r)] = pieces[r].data[i];
    }
  return t;
}

bool close(const Tensor &a, const Tensor &b, std::string &why) {
  if (a.data.size() != b.data.size()) {
    why = "element counts differ";
    return false;
  }
  for (size_t i = 0; i < a.data.size(); ++i) {
    double x = a.data[i], y = b.data[i];
    if (std::isnan(x) && std::isnan(y))
      continue;
    if (std::fabs(x - y) > 1e-9 * std::max(1.0, std::fabs(y))) {
      why = llvm::formatv("element {0}: {1} vs {2}", i, x, y).str();
      return false;
    }
  }
  return true;
}

/// Builds rank-local function @local: `op` cloned onto arguments of the
/// local operand types, its results retyped to their local types, then
/// rewritten by partitionLocal, as pcc-partition does.
func::FuncOp localProgram(ModuleOp module, Operation *op,
                          const ShardingOption &option, int64_t ranks) {
  OpBuilder builder(module.getBodyRegion());
  SmallVector<Type> argTypes, resultTypes;
  for (auto [v, s] : llvm::zip(op->getOperands(), option.operands))
    argTypes.push_back(localType(typeOf(v), s, ranks));
  for (auto [v, s] : llvm::zip(op->getResults(), option.results))
    resultTypes.push_back(localType(typeOf(v), s, ranks));
  auto func = func::FuncOp::create(
      builder, op->getLoc(), "local",
      builder.getFunctionType(argTypes, resultTypes));
  Block *block = func.addEntryBlock();
  builder.setInsertionPointToStart(block);
  IRMapping mapping;
  for (auto [v, arg] : llvm::zip(op->getOperands(), block->getArguments()))
    mapping.map(v, arg);
  Operation *clone = builder.clone(*op, mapping);
  for (auto [r, t] : llvm::zip(clone->getResults(), resultTypes))
    r.setType(t);
  SmallVector<Value> results =
      cast<ShardingOpInterface>(clone).partitionLocal(builder, option.operands,
                                                      ranks, "tp");
  builder.setInsertionPointToEnd(block);
  func::ReturnOp::create(builder, op->getLoc(), results);
  return func;
}

/// Random operand values: floats in [-1, 1] (away from ties for max and
/// argmax), indices in range of the gathered dimension.
Tensor randomOperand(Rng &rng, Value v, Operation *op) {
  Tensor t;
  RankedTensorType type = typeOf(v);
  t.shape.assign(type.getShape().begin(), type.getShape().end());
  t.data.resize(type.getNumElements());
  if (isa<IntegerType>(type.getElementType())) {
    auto g = cast<GatherOp>(op);
    int64_t size = g.getData().getType().getDimSize(g.getAxis());
    for (double &x : t.data)
      x = static_cast<double>(pick(rng, -size, size - 1));
    return t;
  }
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (double &x : t.data)
    x = u(rng);
  return t;
}

/// Checks one option of `op` on `ranks` simulated ranks; "" when right.
std::string checkOption(Rng &rng, ModuleOp module, Operation *op,
                        const ShardingOption &option, int64_t ranks) {
  std::vector<Tensor> whole, pieces;
  std::vector<std::vector<Tensor>> local(ranks);
  for (auto [v, s] : llvm::zip(op->getOperands(), option.operands)) {
    whole.push_back(randomOperand(rng, v, op));
    std::vector<Tensor> parts;
    if (s.isPartial()) {
      // Random pieces that sum to the whole.
      std::uniform_real_distribution<double> u(-1.0, 1.0);
      Tensor rest = whole.back();
      for (int64_t r = 0; r < ranks; ++r) {
        Tensor p = rest;
        if (r + 1 < ranks)
          for (size_t i = 0; i < p.data.size(); ++i) {
            p.data[i] = u(rng);
            rest.data[i] -= p.data[i];
          }
        parts.push_back(p);
      }
    }
    for (int64_t r = 0; r < ranks; ++r)
      local[r].push_back(pieceOf(whole.back(), s, ranks, r, parts));
  }
  auto global = cast<func::FuncOp>(op->getParentOp());
  std::string error;
  auto expected = interpret(
      global, whole, [](StringRef) { return Tensor(); }, &error);
  if (failed(expected))
    return "the whole op does not evaluate: " + error;

  func::FuncOp program = localProgram(module, op, option, ranks);
  // The mesh the local program's sharded ops name.
  OwningOpRef<ModuleOp> meshSource = parseSourceString<ModuleOp>(
      llvm::formatv("pcc.mesh @mesh [tp = {0}]", ranks).str(), &context());
  Operation *mesh = meshSource->getBody()->front().clone();
  module.getBody()->push_front(mesh);
  llvm::scope_exit cleanup([&] {
    program.erase();
    mesh->erase();
  });
  {
    std::string printed;
    llvm::raw_string_ostream os(printed);
    ScopedDiagnosticHandler handler(&context(), [&](Diagnostic &d) {
      os << d.str() << "\n";
      return success();
    });
    if (failed(verify(program)))
      return "the local program does not verify: " + printed;
  }
  // A vocabulary-parallel lookup: each rank sees zeros outside its block.
  auto shardGather = [&]() -> ShardGatherOp {
    for (Operation &o : program.getBody().front())
      if (auto g = dyn_cast<ShardGatherOp>(o))
        return g;
    return {};
  }();
  std::vector<std::vector<Tensor>> results(op->getNumResults());
  for (int64_t r = 0; r < ranks; ++r) {
    FailureOr<std::vector<Tensor>> got;
    if (shardGather) {
      // Its semantics (PccOps.td): the whole lookup with every row other
      // ranks own made zero.
      auto g = cast<GatherOp>(op);
      int64_t axis = g.getAxis(), size = whole[0].shape[axis];
      int64_t block = size / ranks;
      Tensor table = whole[0];
      std::vector<int64_t> st = stridesOf(table.shape);
      for (int64_t i = 0, e = table.data.size(); i < e; ++i) {
        int64_t row = (i / st[axis]) % size;
        if (row / block != r)
          table.data[i] = 0;
      }
      got = interpret(
          global, {table, whole[1]}, [](StringRef) { return Tensor(); },
          &error);
    } else {
      got = interpret(
          program, local[r], [](StringRef) { return Tensor(); }, &error);
    }
    if (failed(got))
      return "the local program does not evaluate: " + error;
    for (size_t k = 0; k < got->size(); ++k)
      results[k].push_back((*got)[k]);
  }
  for (size_t k = 0; k < results.size(); ++k) {
    Shard s = option.results[k];
    if (s.isReplicated())
      for (int64_t r = 1; r < ranks; ++r) {
        std::string why;
        if (!close(results[k][r], results[k][0], why))
          return llvm::formatv("result {0} is replicated but rank {1} "
                               "differs from rank 0: {2}",
                               k, r, why)
              .str();
      }
    Tensor gathered = wholeOf(results[k], typeOf(op->getResult(k)).getShape(),
                              s, ranks);
    std::string why;
    if (!close(gathered, (*expected)[k], why))
      return llvm::formatv("result {0} ({1}) gathered differs from the whole "
                           "op: {2}",
                           k, s.describe(), why)
          .str();
  }
  return "";
}

std::string describe(const ShardingOption &o) {
  std::string s = "reads (";
  for (auto [i, x] : llvm::enumerate(o.operands))
    s += (i ? ", " : "") + x.describe();
  s += ") gives (";
  for (auto [i, x] : llvm::enumerate(o.results))
    s += (i ? ", " : "") + x.describe();
  return s + ")";
}

/// The layouts a planner may say an operand of `type` has: whole, partial
/// sums, and every split (dimension, stripes 1-4), fitting or not.
std::vector<Shard> hints(RankedTensorType type) {
  std::vector<Shard> out{Shard::replicated(), Shard::partial()};
  for (int64_t d = 0; d <= type.getRank(); ++d)
    for (int64_t s = 1; s <= 4; ++s)
      out.push_back(Shard::split(d, s));
  return out;
}

TEST(ShardingProperty, EveryRuleIsTotalAndEveryOptionComputesTheOp) {
  Rng rng(31);
  int64_t checked = 0, queried = 0;
  for (auto [name, generate] : kGenerators) {
    for (int iteration = 0; iteration < 40; ++iteration) {
      OneOp one = generate(rng);
      std::string text = one.text();
      OwningOpRef<ModuleOp> module =
          parseSourceString<ModuleOp>(text, &context());
      ASSERT_TRUE(module) << text;
      auto func = *module->getOps<func::FuncOp>().begin();
      Operation *op = &func.getBody().front().front();
      auto sharding = cast<ShardingOpInterface>(op);
      for (int64_t ranks = 1; ranks <= 16; ++ranks) {
        // One operand hinted at a time, then all alike (same-shape ops).
        std::vector<SmallVector<Shard>> queries;
        for (unsigned i = 0; i < op->getNumOperands(); ++i)
          for (Shard h : hints(typeOf(op->getOperand(i)))) {
            SmallVector<Shard> in(op->getNumOperands(), Shard::replicated());
            in[i] = h;
            queries.push_back(in);
          }
        for (Shard h : hints(typeOf(op->getOperand(0))))
          queries.push_back(SmallVector<Shard>(op->getNumOperands(), h));
        for (const SmallVector<Shard> &in : queries) {
          SmallVector<ShardingOption> options;
          sharding.getShardingOptions(in, ranks, options);
          ++queried;
          for (const ShardingOption &o : options) {
            ASSERT_EQ(o.operands.size(), op->getNumOperands()) << text;
            ASSERT_EQ(o.results.size(), op->getNumResults()) << text;
            for (auto [v, s] : llvm::zip(op->getOperands(), o.operands))
              ASSERT_TRUE(layoutFits(s, typeOf(v), ranks))
                  << name << ": an option reads " << s.describe()
                  << ", which does not fit over " << ranks << " ranks\n"
                  << text;
            for (auto [v, s] : llvm::zip(op->getResults(), o.results))
              ASSERT_TRUE(layoutFits(s, typeOf(v), ranks))
                  << name << ": an option gives " << s.describe()
                  << ", which does not fit over " << ranks << " ranks\n"
                  << text;
            // The numbers, on up to 6 simulated ranks.
            if (ranks > 6)
              continue;
            std::string wrong = checkOption(rng, *module, op, o, ranks);
            ++checked;
            ASSERT_EQ(wrong, "")
                << name << " over " << ranks << " ranks, option "
                << describe(o) << ":\n"
                << text;
          }
        }
      }
    }
  }
  // The search is not vacuous.
  std::printf("%lld option queries, %lld options checked on simulated "
              "ranks\n",
              static_cast<long long>(queried), static_cast<long long>(checked));
  EXPECT_GT(checked, 1000);
  EXPECT_GT(queried, 10000);
}

/// reshapeSplit over random shapes, splits and rank counts: never divides
/// by zero, and a split it returns puts every element of the flat order on
/// the rank the input's split puts it.
TEST(ShardingProperty, ReshapeSplitIsTotalAndKeepsEveryElementsRank) {
  Rng rng(32);
  int64_t found = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    OneOp one = reshape(rng);
    OwningOpRef<ModuleOp> module =
        parseSourceString<ModuleOp>(one.text(), &context());
    ASSERT_TRUE(module);
    auto func = *module->getOps<func::FuncOp>().begin();
    auto op = cast<ReshapeOp>(func.getBody().front().front());
    ArrayRef<int64_t> in = op.getInput().getType().getShape(),
                      out = op.getType().getShape();
    // Zero-size tensors and splits of a dimension that does not exist.
    SmallVector<int64_t> zero(in);
    zero[pick(rng, 0, zero.size() - 1)] = 0;
    EXPECT_FALSE(reshapeSplit(zero, out, Shard::split(0, 1), 2));
    EXPECT_FALSE(reshapeSplit(in, out, Shard::split(in.size(), 1), 2));
    EXPECT_FALSE(reshapeSplit(in, out, Shard::split(-1, 1), 2));
    EXPECT_FALSE(reshapeSplit(in, out, Shard::split(0, 0), 2));
    EXPECT_FALSE(reshapeSplit(in, out, Shard::split(0, 1), 0));
    int64_t ranks = pick(rng, 1, 16);
    Shard s = Shard::split(pick(rng, 0, in.size() - 1), pick(rng, 1, 4));
    std::optional<Shard> r = reshapeSplit(in, out, s, ranks);
    if (!r)
      continue;
    ++found;
    ASSERT_TRUE(layoutFits(s, op.getInput().getType(), ranks));
    ASSERT_TRUE(layoutFits(*r, op.getType(), ranks));
    // Element f of the flat order: its rank under either split.
    auto owner = [&](ArrayRef<int64_t> shape, Shard x, int64_t f) {
      std::vector<int64_t> st = stridesOf(shape);
      int64_t i = (f / st[x.dim]) % shape[x.dim];
      int64_t chunk = shape[x.dim] / (x.stripes * ranks);
      return (i / chunk) % ranks;
    };
    for (int64_t f = 0, e = op.getType().getNumElements(); f < e; ++f)
      ASSERT_EQ(owner(in, s, f), owner(out, *r, f))
          << "element " << f << " over " << ranks << " ranks:\n"
          << one.text();
  }
  EXPECT_GT(found, 100);
}

} // namespace
