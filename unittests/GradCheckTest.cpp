//===- GradCheckTest.cpp - every VJP rule against finite differences ------===//
//
// For each op with a PccAutodiffOpInterface rule, a one-op f64 function @f:
//
//  1. the forward is interpreted (unittests/Interpreter.h) on seeded random
//     inputs kept away from the points where the op is not differentiable;
//  2. a random cotangent gy is drawn for every result with a gradient, and
//     the objective is L = sum(gy * y);
//  3. the rule builds its VJP in @vjp, a copy of @f with gy as constants
//     and the operand gradients returned; @vjp is verified and interpreted;
//  4. every element of every float operand is perturbed by central
//     differences in float64 (step 1e-6 relative, `h = 1e-6 max(1, |x|)`)
//     and dL/dx compared with the rule's gradient;
//  5. every forward value the built ops read (an operand or result of the
//     op) must be among getSavedValues, and they may read no other value
//     from before them.
//
// Default tolerance: |analytic - fd| <= 1e-8 + 1e-6 max(|analytic|, |fd|).
// With h = 1e-6 the truncation error of central differences is about
// h^2 |f'''| / 6 ~ 1e-13 and the rounding error about eps |L| / h ~ 1e-10
// |L|; every case here has |L| below ~20, so 1e-8 absolute leaves two orders
// of magnitude. No case needed a looser tolerance.
//
// Conventions that finite differences cannot see (ties of max/min and of
// reduce_max, kinks of abs/relu/clamp, fully masked softmax rows) are
// checked against their documented values directly. The ops without a
// gradient get tests that their rule returns no gradient and builds
// nothing, and the ops without a rule tests that they have no model.
//
//===----------------------------------------------------------------------===//

#include "Interpreter.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace mlir;
using namespace mlir::pcc;
using ::pcc::testing::interpret;
using ::pcc::testing::Tensor;

namespace {

MLIRContext &context() {
  static MLIRContext *ctx = [] {
    auto *c = new MLIRContext();
    c->loadDialect<PccDialect, func::FuncDialect>();
    return c;
  }();
  return *ctx;
}

Tensor noParam(StringRef) { return {}; }

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }
bool isFloat(Value v) { return isa<FloatType>(typeOf(v).getElementType()); }

//===----------------------------------------------------------------------===//
// Seeded inputs
//===----------------------------------------------------------------------===//

/// Random data, seeded by the name of the running test (FNV-1a), so every
/// test has its own reproducible numbers.
struct Rng {
  std::mt19937 gen;

  /// `salt` gives a second, independent stream in the same test.
  explicit Rng(unsigned salt = 0) : gen(seed() + salt) {}

  static unsigned seed() {
    const ::testing::TestInfo *info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? info->name() : "";
    uint32_t h = 2166136261u;
    for (char c : name)
      h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
    return h;
  }

  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(gen);
  }
  std::vector<double> uniform(int64_t n, double lo, double hi) {
    std::vector<double> v(n);
    for (double &x : v)
      x = uniform(lo, hi);
    return v;
  }
  /// |x| in [lo, hi] with a random sign: away from a kink at 0.
  std::vector<double> awayFromZero(int64_t n, double lo, double hi) {
    std::vector<double> v = uniform(n, lo, hi);
    for (double &x : v)
      if (gen() & 1)
        x = -x;
    return v;
  }
  /// Uniform in [lo, hi] but at least `gap` from every point of `kinks`.
  std::vector<double> avoiding(int64_t n, double lo, double hi,
                               std::vector<double> kinks, double gap) {
    std::vector<double> v;
    while (static_cast<int64_t>(v.size()) < n) {
      double x = uniform(lo, hi);
      bool near = false;
      for (double k : kinks)
        near |= std::fabs(x - k) < gap;
      if (!near)
        v.push_back(x);
    }
    return v;
  }
  /// n distinct values in [lo, hi], any two at least (hi - lo) / (2n) apart
  /// (a jittered grid, shuffled): no ties for max, min, reduce_max.
  std::vector<double> distinct(int64_t n, double lo, double hi) {
    double step = (hi - lo) / n;
    std::vector<double> v(n);
    for (int64_t i = 0; i < n; ++i)
      v[i] = lo + (i + 0.25 + 0.5 * uniform(0.0, 1.0)) * step;
    std::shuffle(v.begin(), v.end(), gen);
    return v;
  }
};

//===----------------------------------------------------------------------===//
// The checker
//===----------------------------------------------------------------------===//

/// One gradient check: `ir` holds `func.func @f` whose return values are
/// exactly the results of the op under test (the op defining the first
/// returned value), in order.
struct GradCase {
  std::string ir;
  /// Data of @f's arguments, one per argument (integers as doubles).
  std::vector<std::vector<double>> args;
  /// Per operand of the op: whether its gradient is wanted. Empty: every
  /// float operand.
  std::vector<bool> needed;
  /// Per result: whether it has a gradient (false: a null result gradient,
  /// and the result is left out of L). Empty: every float result.
  std::vector<bool> withGrad;
  /// Per result, the cotangent; empty: random in [-1, 1].
  std::vector<std::vector<double>> gy;
  double rtol = 1e-6, atol = 1e-8;
  double step = 1e-6;
};

/// @f and @vjp of one case, and what the rule gave.
struct BuiltVjp {
  OwningOpRef<ModuleOp> module;
  func::FuncOp forward, backward;
  Operation *op = nullptr; // in @f
  std::vector<bool> needed, withGrad;
  std::vector<std::vector<double>> gy; // per result (empty: no gradient)
  /// Per operand of the op, its gradient from @vjp; nullopt when the rule
  /// gave none (null: zero or not differentiable).
  std::vector<std::optional<Tensor>> grads;
};

std::string toString(Operation *op) {
  std::string s;
  llvm::raw_string_ostream os(s);
  op->print(os);
  return s;
}

/// Parses the case, builds its VJP and interprets it; test failures (fatal
/// ones where nothing more can be checked) on any problem.
void buildAndRunVjp(const GradCase &c, Rng &rng, BuiltVjp &out) {
  out.module = parseSourceString<ModuleOp>(c.ir, &context());
  ASSERT_TRUE(out.module) << "the test program does not parse";
  out.forward = out.module->lookupSymbol<func::FuncOp>("f");
  ASSERT_TRUE(out.forward) << "no @f";
  auto fret = cast<func::ReturnOp>(out.forward.getBody().front().back());
  ASSERT_GT(fret.getNumOperands(), 0u);
  out.op = fret.getOperand(0).getDefiningOp();
  ASSERT_TRUE(out.op);
  ASSERT_TRUE(llvm::equal(fret.getOperands(), out.op->getResults()))
      << "@f must return exactly the results of the op under test";
  ASSERT_EQ(c.args.size(), out.forward.getNumArguments());

  // @vjp: a copy of @f; the VJP goes before its return.
  out.backward = out.forward.clone();
  out.backward.setSymName("vjp");
  out.module->push_back(out.backward);
  Block &body = out.backward.getBody().front();
  auto ret = cast<func::ReturnOp>(body.back());
  Operation *op = ret.getOperand(0).getDefiningOp();
  auto rule = dyn_cast<AutodiffOpInterface>(op);
  ASSERT_TRUE(rule) << op->getName().getStringRef().str()
                    << " has no AutodiffOpInterface";
  llvm::SmallPtrSet<Operation *, 16> forwardOps;
  for (Operation &o : body)
    forwardOps.insert(&o);

  unsigned numResults = op->getNumResults(), numOperands = op->getNumOperands();
  out.withGrad = c.withGrad;
  if (out.withGrad.empty())
    for (Value r : op->getResults())
      out.withGrad.push_back(isFloat(r));
  ASSERT_EQ(out.withGrad.size(), numResults);
  out.needed = c.needed;
  if (out.needed.empty())
    for (Value v : op->getOperands())
      out.needed.push_back(isFloat(v));
  ASSERT_EQ(out.needed.size(), numOperands);

  OpBuilder b(ret);
  SmallVector<Value> resultGrads;
  out.gy.assign(numResults, {});
  for (unsigned r = 0; r < numResults; ++r) {
    if (!out.withGrad[r]) {
      resultGrads.push_back(Value());
      continue;
    }
    RankedTensorType type = typeOf(op->getResult(r));
    auto ft = dyn_cast<FloatType>(type.getElementType());
    ASSERT_TRUE(ft && (ft.isF64() || ft.isF32()))
        << "result " << r << " needs an f64 or f32 type to have a gradient";
    std::vector<double> g = r < c.gy.size() && !c.gy[r].empty()
                                ? c.gy[r]
                                : rng.uniform(type.getNumElements(), -1, 1);
    ASSERT_EQ(static_cast<int64_t>(g.size()), type.getNumElements());
    DenseElementsAttr attr;
    if (ft.isF64()) {
      attr = DenseElementsAttr::get(type, ArrayRef<double>(g));
    } else {
      std::vector<float> f(g.begin(), g.end());
      for (size_t i = 0; i < g.size(); ++i)
        g[i] = f[i]; // L uses exactly the constant's values
      attr = DenseElementsAttr::get(type, ArrayRef<float>(f));
    }
    resultGrads.push_back(ConstantOp::create(b, op->getLoc(), attr));
    out.gy[r] = std::move(g);
  }

  SmallVector<Value> operandGrads;
  std::string diagnostics;
  {
    ScopedDiagnosticHandler handler(&context(), [&](Diagnostic &d) {
      diagnostics += d.str() + "\n";
      return success();
    });
    SmallVector<bool> needed(out.needed.begin(), out.needed.end());
    ASSERT_TRUE(
        succeeded(rule.buildVjp(b, resultGrads, needed, operandGrads)))
        << "buildVjp failed: " << diagnostics;
  }
  ASSERT_EQ(operandGrads.size(), numOperands);

  // Types, and no gradient for integers, booleans and indices.
  for (unsigned i = 0; i < numOperands; ++i) {
    Value operand = op->getOperand(i), g = operandGrads[i];
    if (!isFloat(operand)) {
      EXPECT_FALSE(g) << "a gradient for non-float operand " << i;
    } else if (g) {
      EXPECT_EQ(g.getType(), operand.getType())
          << "operand " << i << "'s gradient has the wrong type";
    }
  }

  // Saved values: the rule reads only forward values it declares, and
  // declares only the op's operands and results.
  SmallVector<Value> saved;
  rule.getSavedValues(saved);
  llvm::DenseSet<Value> own(op->getOperands().begin(),
                            op->getOperands().end());
  own.insert(op->getResults().begin(), op->getResults().end());
  llvm::DenseSet<Value> savedSet(saved.begin(), saved.end());
  for (Value s : saved)
    EXPECT_TRUE(own.contains(s))
        << "getSavedValues lists a value that is not an operand or result";
  auto describe = [&](Value v) -> std::string {
    for (auto [i, o] : llvm::enumerate(op->getOperands()))
      if (o == v)
        return "operand " + std::to_string(i);
    for (auto [i, r] : llvm::enumerate(op->getResults()))
      if (r == v)
        return "result " + std::to_string(i);
    return "a value that is not the op's";
  };
  auto checkRead = [&](Value v, const std::string &where) {
    Operation *def = v.getDefiningOp();
    if (def && !forwardOps.contains(def))
      return; // built by the rule (or a cotangent)
    if (own.contains(v)) {
      EXPECT_TRUE(savedSet.contains(v))
          << where << " reads " << describe(v)
          << ", which getSavedValues does not list";
      return;
    }
    ADD_FAILURE() << where << " reads " << describe(v);
  };
  for (Operation &o : body) {
    if (forwardOps.contains(&o))
      continue;
    for (Value v : o.getOperands())
      checkRead(v, "the VJP op " + toString(&o));
  }
  for (auto [i, g] : llvm::enumerate(operandGrads))
    if (g)
      checkRead(g, "the gradient of operand " + std::to_string(i));

  // Return the gradients and interpret @vjp.
  SmallVector<Value> returned;
  SmallVector<int> slot;
  for (Value g : operandGrads) {
    slot.push_back(g ? static_cast<int>(returned.size()) : -1);
    if (g)
      returned.push_back(g);
  }
  b.setInsertionPoint(ret);
  func::ReturnOp::create(b, ret.getLoc(), returned);
  ret.erase();
  out.backward.setFunctionType(b.getFunctionType(
      out.backward.getArgumentTypes(), ValueRange(returned).getTypes()));
  {
    std::string errors;
    ScopedDiagnosticHandler handler(&context(), [&](Diagnostic &d) {
      errors += d.str() + "\n";
      return success();
    });
    ASSERT_TRUE(succeeded(verify(*out.module)))
        << "the VJP does not verify: " << errors << "\n"
        << toString(out.backward);
  }
  std::vector<Tensor> args;
  for (const auto &a : c.args)
    args.push_back(Tensor{{}, a});
  std::string error;
  auto grads = interpret(out.backward, args, noParam, &error);
  ASSERT_TRUE(succeeded(grads)) << "interpreting the VJP failed: " << error
                                << "\n"
                                << toString(out.backward);
  out.grads.assign(numOperands, std::nullopt);
  for (unsigned i = 0; i < numOperands; ++i)
    if (slot[i] >= 0)
      out.grads[i] = (*grads)[slot[i]];
}

/// Checks a case against central differences.
void gradCheck(const GradCase &c) {
  Rng rng(/*salt=*/1);
  BuiltVjp built;
  buildAndRunVjp(c, rng, built);
  if (::testing::Test::HasFatalFailure())
    return;
  func::FuncOp f = built.forward;
  Operation *op = built.op;

  std::vector<Tensor> args;
  for (const auto &a : c.args)
    args.push_back(Tensor{{}, a});
  auto objective = [&](const std::vector<Tensor> &in) {
    std::string error;
    auto y = interpret(f, in, noParam, &error);
    if (failed(y)) {
      ADD_FAILURE() << "interpreting @f failed: " << error;
      return std::numeric_limits<double>::quiet_NaN();
    }
    double l = 0;
    for (unsigned r = 0; r < built.gy.size(); ++r)
      for (size_t k = 0; k < built.gy[r].size(); ++k)
        l += built.gy[r][k] * (*y)[r].data[k];
    return l;
  };
  double l0 = objective(args);
  ASSERT_TRUE(std::isfinite(l0)) << "L is not finite at the inputs";

  double worst = 0;
  int checked = 0;
  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    Value operand = op->getOperand(i);
    if (!built.needed[i] || !isFloat(operand))
      continue;
    auto arg = dyn_cast<BlockArgument>(operand);
    ASSERT_TRUE(arg) << "operand " << i
                     << " must be an argument of @f to be perturbed";
    unsigned a = arg.getArgNumber();
    int64_t n = typeOf(operand).getNumElements();
    const std::optional<Tensor> &g = built.grads[i];
    if (g) {
      ASSERT_EQ(static_cast<int64_t>(g->data.size()), n);
    }
    int reported = 0;
    for (int64_t j = 0; j < n; ++j) {
      double x = c.args[a][j];
      double analytic = g ? g->data[j] : 0.0;
      if (!std::isfinite(x)) {
        // A masked (-inf) logit: nothing moves it; its gradient is 0.
        EXPECT_EQ(analytic, 0.0)
            << "operand " << i << " element " << j << " is " << x;
        continue;
      }
      double h = c.step * std::max(1.0, std::fabs(x));
      args[a].data[j] = x + h;
      double up = objective(args);
      args[a].data[j] = x - h;
      double down = objective(args);
      args[a].data[j] = x;
      double fd = (up - down) / (2 * h);
      double err = std::fabs(analytic - fd);
      double tol =
          c.atol + c.rtol * std::max(std::fabs(analytic), std::fabs(fd));
      ++checked;
      if (std::isfinite(err))
        worst = std::max(worst, err / tol);
      if (!(err <= tol) && reported++ < 6)
        ADD_FAILURE() << "operand " << i << " element " << j << " (x = " << x
                      << "): analytic " << analytic << ", finite difference "
                      << fd << ", error " << err << " > tolerance " << tol;
    }
    if (reported > 6)
      ADD_FAILURE() << "operand " << i << ": " << reported
                    << " mismatching elements in all";
  }
  EXPECT_GT(checked, 0) << "no element was checked";
  ::testing::Test::RecordProperty("worst_error_over_tolerance",
                                  std::to_string(worst));
  if (std::getenv("PCC_GRADCHECK_VERBOSE"))
    std::cout << "  [gradcheck] " << checked << " elements, worst error "
              << worst << " of tolerance\n";
}

/// Builds the VJP with the given cotangents and compares the gradients with
/// `expected` (per operand; an empty vector expects no gradient or zeros).
void expectGradients(const GradCase &c,
                     const std::vector<std::vector<double>> &expected,
                     double tol = 1e-12) {
  Rng rng(/*salt=*/1);
  BuiltVjp built;
  buildAndRunVjp(c, rng, built);
  if (::testing::Test::HasFatalFailure())
    return;
  ASSERT_EQ(expected.size(), built.grads.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!built.needed[i])
      continue;
    const std::optional<Tensor> &g = built.grads[i];
    if (expected[i].empty()) {
      if (g) {
        for (double v : g->data)
          EXPECT_EQ(v, 0.0) << "operand " << i;
      }
      continue;
    }
    ASSERT_TRUE(g) << "no gradient for operand " << i;
    ASSERT_EQ(g->data.size(), expected[i].size());
    for (size_t j = 0; j < expected[i].size(); ++j)
      EXPECT_NEAR(g->data[j], expected[i][j], tol)
          << "operand " << i << " element " << j;
  }
}

/// The op defining @f's first returned value.
Operation *opUnderTest(OwningOpRef<ModuleOp> &module) {
  auto f = module->lookupSymbol<func::FuncOp>("f");
  if (!f)
    return nullptr;
  return f.getBody().front().back().getOperand(0).getDefiningOp();
}

/// The op's rule exists, returns no gradient for any operand and builds no
/// op (and, with `noSaved`, saves nothing).
void expectNoGradient(const std::string &ir, bool noSaved = true) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(ir, &context());
  ASSERT_TRUE(module) << "the test program does not parse";
  Operation *op = opUnderTest(module);
  ASSERT_TRUE(op);
  auto rule = dyn_cast<AutodiffOpInterface>(op);
  ASSERT_TRUE(rule) << op->getName().getStringRef().str()
                    << " should have a (no-gradient) rule";
  Block *block = op->getBlock();
  size_t before = block->getOperations().size();
  OpBuilder b(block->getTerminator());
  SmallVector<Value> resultGrads;
  for (Value r : op->getResults()) {
    RankedTensorType t = typeOf(r);
    Attribute one = isa<FloatType>(t.getElementType())
                        ? Attribute(FloatAttr::get(t.getElementType(), 1.0))
                        : Attribute(IntegerAttr::get(t.getElementType(), 1));
    resultGrads.push_back(
        ConstantOp::create(b, op->getLoc(), DenseElementsAttr::get(t, one)));
  }
  size_t withSeeds = block->getOperations().size();
  ASSERT_EQ(withSeeds, before + op->getNumResults());
  SmallVector<bool> needed(op->getNumOperands(), true);
  SmallVector<Value> grads;
  ASSERT_TRUE(succeeded(rule.buildVjp(b, resultGrads, needed, grads)));
  ASSERT_EQ(grads.size(), op->getNumOperands());
  for (auto [i, g] : llvm::enumerate(grads))
    EXPECT_FALSE(g) << "a gradient for operand " << i;
  EXPECT_EQ(block->getOperations().size(), withSeeds)
      << "the rule built ops for no gradient";
  if (noSaved) {
    SmallVector<Value> saved;
    rule.getSavedValues(saved);
    EXPECT_TRUE(saved.empty());
  }
}

/// buildVjp fails with an error on the op that contains `message`.
void expectRefused(const GradCase &c, const std::string &message) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(c.ir, &context());
  ASSERT_TRUE(module) << "the test program does not parse";
  Operation *op = opUnderTest(module);
  ASSERT_TRUE(op);
  auto rule = dyn_cast<AutodiffOpInterface>(op);
  ASSERT_TRUE(rule);
  OpBuilder b(op->getBlock()->getTerminator());
  SmallVector<Value> resultGrads;
  for (Value r : op->getResults())
    resultGrads.push_back(ConstantOp::create(
        b, op->getLoc(),
        DenseElementsAttr::get(typeOf(r), FloatAttr::get(
                                              typeOf(r).getElementType(),
                                              1.0))));
  SmallVector<bool> needed(c.needed.begin(), c.needed.end());
  ASSERT_EQ(needed.size(), op->getNumOperands());
  std::string diagnostics;
  ScopedDiagnosticHandler handler(&context(), [&](Diagnostic &d) {
    diagnostics += d.str() + "\n";
    return success();
  });
  SmallVector<Value> grads;
  EXPECT_TRUE(failed(rule.buildVjp(b, resultGrads, needed, grads)));
  EXPECT_NE(diagnostics.find(message), std::string::npos) << diagnostics;
}

//===----------------------------------------------------------------------===//
// IR helpers
//===----------------------------------------------------------------------===//

/// @f(%x) -> `op %x` on tensor<2x3xf64>; `op` is the op's text up to its
/// type, e.g. "pcc.leaky_relu %x alpha = 1.000000e-01".
std::string unary(const std::string &op,
                  const std::string &type = "tensor<2x3xf64>") {
  return "func.func @f(%x: " + type + ") -> " + type + " {\n  %y = " + op +
         " : " + type + "\n  return %y : " + type + "\n}\n";
}

/// @f(%a, %b) -> `op %a, %b` on tensor<2x3xf64>.
std::string binary(const std::string &op,
                   const std::string &type = "tensor<2x3xf64>") {
  return "func.func @f(%a: " + type + ", %b: " + type + ") -> " + type +
         " {\n  %y = " + op + " : " + type + "\n  return %y : " + type +
         "\n}\n";
}

GradCase unaryCase(const std::string &op, std::vector<double> x) {
  GradCase c;
  c.ir = unary(op);
  c.args = {std::move(x)};
  return c;
}

GradCase binaryCase(const std::string &op, std::vector<double> a,
                    std::vector<double> b) {
  GradCase c;
  c.ir = binary(op);
  c.args = {std::move(a), std::move(b)};
  return c;
}

//===----------------------------------------------------------------------===//
// Elementwise unary
//===----------------------------------------------------------------------===//

TEST(GradCheck, Neg) {
  Rng r;
  gradCheck(unaryCase("pcc.neg %x", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Abs) {
  Rng r;
  gradCheck(unaryCase("pcc.abs %x", r.awayFromZero(6, 0.1, 2)));
}

TEST(GradCheck, Sqrt) {
  Rng r;
  gradCheck(unaryCase("pcc.sqrt %x", r.uniform(6, 0.2, 3)));
}

TEST(GradCheck, Reciprocal) {
  Rng r;
  gradCheck(unaryCase("pcc.reciprocal %x", r.awayFromZero(6, 0.3, 2)));
}

TEST(GradCheck, Exp) {
  Rng r;
  gradCheck(unaryCase("pcc.exp %x", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Log) {
  Rng r;
  gradCheck(unaryCase("pcc.log %x", r.uniform(6, 0.2, 3)));
}

TEST(GradCheck, Erf) {
  Rng r;
  gradCheck(unaryCase("pcc.erf %x", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Tanh) {
  Rng r;
  gradCheck(unaryCase("pcc.tanh %x", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Sigmoid) {
  Rng r;
  gradCheck(unaryCase("pcc.sigmoid %x", r.uniform(6, -3, 3)));
}

TEST(GradCheck, Relu) {
  Rng r;
  gradCheck(unaryCase("pcc.relu %x", r.awayFromZero(6, 0.1, 2)));
}

TEST(GradCheck, Sin) {
  Rng r;
  gradCheck(unaryCase("pcc.sin %x", r.uniform(6, -3, 3)));
}

TEST(GradCheck, Cos) {
  Rng r;
  gradCheck(unaryCase("pcc.cos %x", r.uniform(6, -3, 3)));
}

TEST(GradCheck, Gelu_Erf) {
  Rng r;
  gradCheck(unaryCase("pcc.gelu %x", r.uniform(6, -3, 3)));
}

TEST(GradCheck, Gelu_Tanh) {
  Rng r;
  gradCheck(unaryCase("pcc.gelu %x {tanh_approximation}", r.uniform(6, -3, 3)));
}

TEST(GradCheck, LeakyRelu) {
  Rng r;
  gradCheck(unaryCase("pcc.leaky_relu %x alpha = 1.000000e-02",
                      r.awayFromZero(6, 0.1, 2)));
}

TEST(GradCheck, Clamp) {
  Rng r;
  // Both sides of both bounds, none within 0.05 of one.
  GradCase c;
  c.ir = unary("pcc.clamp %x min = -1.000000e+00 max = 1.500000e+00",
               "tensor<3x4xf64>");
  c.args = {r.avoiding(12, -3, 3, {-1.0, 1.5}, 0.05)};
  gradCheck(c);
}

// The conventions at the kinks (PyTorch's): abs has slope 0 at 0, relu 0,
// leaky_relu alpha (x > 0 is tested strictly), clamp 1 at its bounds.
TEST(GradCheck, Kinks_AbsReluLeakyReluAtZero) {
  GradCase c;
  c.args = {{0, 1, -1, 0, 2, -2}};
  c.gy = {{1, 2, 3, 4, 5, 6}};
  c.ir = unary("pcc.abs %x");
  expectGradients(c, {{0, 2, -3, 0, 5, -6}});
  c.ir = unary("pcc.relu %x");
  expectGradients(c, {{0, 2, 0, 0, 5, 0}});
  c.ir = unary("pcc.leaky_relu %x alpha = 5.000000e-01");
  expectGradients(c, {{0.5, 2, 1.5, 2, 5, 3}});
}

TEST(GradCheck, Kinks_ClampPassesAtBounds) {
  GradCase c;
  c.ir = unary("pcc.clamp %x min = -1.000000e+00 max = 1.500000e+00");
  c.args = {{-1, 1.5, -1.5, 2, 0, 1}};
  c.gy = {{1, 2, 3, 4, 5, 6}};
  expectGradients(c, {{1, 2, 0, 0, 5, 6}});
}

//===----------------------------------------------------------------------===//
// Elementwise binary
//===----------------------------------------------------------------------===//

TEST(GradCheck, Add) {
  Rng r;
  gradCheck(binaryCase("pcc.add %a, %b", r.uniform(6, -2, 2),
                       r.uniform(6, -2, 2)));
}

TEST(GradCheck, Sub) {
  Rng r;
  gradCheck(binaryCase("pcc.sub %a, %b", r.uniform(6, -2, 2),
                       r.uniform(6, -2, 2)));
}

TEST(GradCheck, Mul) {
  Rng r;
  gradCheck(binaryCase("pcc.mul %a, %b", r.uniform(6, -2, 2),
                       r.uniform(6, -2, 2)));
}

TEST(GradCheck, Mul_OnlyRhsNeeded) {
  Rng r;
  GradCase c = binaryCase("pcc.mul %a, %b", r.uniform(6, -2, 2),
                          r.uniform(6, -2, 2));
  c.needed = {false, true};
  gradCheck(c);
}

TEST(GradCheck, Div) {
  Rng r;
  gradCheck(binaryCase("pcc.div %a, %b", r.uniform(6, -2, 2),
                       r.awayFromZero(6, 0.5, 2)));
}

TEST(GradCheck, Pow) {
  Rng r;
  gradCheck(binaryCase("pcc.pow %a, %b", r.uniform(6, 0.3, 2.5),
                       r.uniform(6, -2, 2)));
}

TEST(GradCheck, Pow_ZeroExponent) {
  // d/dx x^0 = 0 (also what the rule's mask gives); d/de = log x.
  Rng r;
  gradCheck(binaryCase("pcc.pow %a, %b", r.uniform(6, 0.3, 2.5),
                       {0, 2, 0, -1, 0.5, 0}));
}

TEST(GradCheck, Pow_NegativeBaseIntegerExponent) {
  // Only the base: x^e with x < 0 is not differentiable in e.
  Rng r;
  GradCase c = binaryCase("pcc.pow %a, %b", r.awayFromZero(6, 0.5, 2),
                          {2, 3, -1, 1, -2, 4});
  c.needed = {true, false};
  gradCheck(c);
}

TEST(GradCheck, Max) {
  Rng r;
  std::vector<double> v = r.distinct(12, -2, 2);
  gradCheck(binaryCase("pcc.max %a, %b", {v.begin(), v.begin() + 6},
                       {v.begin() + 6, v.end()}));
}

TEST(GradCheck, Min) {
  Rng r;
  std::vector<double> v = r.distinct(12, -2, 2);
  gradCheck(binaryCase("pcc.min %a, %b", {v.begin(), v.begin() + 6},
                       {v.begin() + 6, v.end()}));
}

// Ties split the gradient in halves; finite differences cannot see this.
TEST(GradCheck, Max_TieSplitsHalf) {
  GradCase c;
  c.ir = binary("pcc.max %a, %b");
  c.args = {{1, 2, 3, 4, 5, 6}, {1, 0, 3, 5, 5, 7}};
  c.gy = {{2, 4, 6, 8, 10, 12}};
  expectGradients(c, {{1, 4, 3, 0, 5, 0}, {1, 0, 3, 8, 5, 12}});
}

TEST(GradCheck, Min_TieSplitsHalf) {
  GradCase c;
  c.ir = binary("pcc.min %a, %b");
  c.args = {{1, 2, 3, 4, 5, 6}, {1, 0, 3, 5, 5, 7}};
  c.gy = {{2, 4, 6, 8, 10, 12}};
  expectGradients(c, {{1, 0, 3, 8, 5, 12}, {1, 4, 3, 0, 5, 0}});
}

/// Dividends x = y (k + f), f in [0.1, 0.9]: away from the jumps of mod.
std::vector<double> awayFromMultiples(Rng &r, const std::vector<double> &y) {
  std::vector<double> x;
  for (double d : y)
    x.push_back(d * (std::floor(r.uniform(-3, 3)) + r.uniform(0.1, 0.9)));
  return x;
}

TEST(GradCheck, Mod) {
  // Only the dividend: the rule refuses the divisor (below).
  Rng r;
  std::vector<double> y = r.awayFromZero(6, 0.7, 2);
  GradCase c = binaryCase("pcc.mod %a, %b", awayFromMultiples(r, y), y);
  c.needed = {true, false};
  gradCheck(c);
}

TEST(GradCheck, Mod_Fmod) {
  Rng r;
  std::vector<double> y = r.awayFromZero(6, 0.7, 2);
  GradCase c = binaryCase("pcc.mod %a, %b {fmod}", awayFromMultiples(r, y), y);
  c.needed = {true, false};
  gradCheck(c);
}

TEST(GradCheck, Mod_DivisorRefused) {
  GradCase c;
  c.ir = binary("pcc.mod %a, %b");
  c.needed = {true, true};
  expectRefused(c, "has no gradient for its divisor");
}

TEST(GradCheck, Select) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%c: tensor<2x3xi1>, %a: tensor<2x3xf64>, %b: tensor<2x3xf64>) -> tensor<2x3xf64> {
      %y = pcc.select %c, %a, %b : tensor<2x3xi1>, tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir";
  c.args = {{1, 0, 1, 1, 0, 0}, r.uniform(6, -2, 2), r.uniform(6, -2, 2)};
  gradCheck(c);
}

// The interpreter computes every type in double, so a cast between float
// types is the identity there and f64 tolerances apply.
TEST(GradCheck, Cast_F64ToF32) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2x3xf32> {
      %y = pcc.cast %x : tensor<2x3xf64> -> tensor<2x3xf32>
      return %y : tensor<2x3xf32>
    }
  )mlir";
  c.args = {r.uniform(6, -2, 2)};
  gradCheck(c);
}

TEST(GradCheck, Cast_F32ToF64) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3xf32>) -> tensor<2x3xf64> {
      %y = pcc.cast %x : tensor<2x3xf32> -> tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir";
  c.args = {r.uniform(6, -2, 2)};
  gradCheck(c);
}

//===----------------------------------------------------------------------===//
// Softmax and normalisation
//===----------------------------------------------------------------------===//

GradCase softmaxCase(const std::string &op, int64_t axis, Rng &r) {
  GradCase c;
  c.ir = unary(op + " %x axis = " + std::to_string(axis), "tensor<2x3x4xf64>");
  c.args = {r.uniform(24, -2, 2)};
  return c;
}

TEST(GradCheck, Softmax_LastAxis) {
  Rng r;
  gradCheck(softmaxCase("pcc.softmax", 2, r));
}

TEST(GradCheck, Softmax_MiddleAxis) {
  Rng r;
  gradCheck(softmaxCase("pcc.softmax", 1, r));
}

TEST(GradCheck, Softmax_NanToZeroMaskedRows) {
  // Row 1 is fully masked (softmax 0 with nan_to_zero: zero gradient), row
  // 2 partly; -inf entries are not perturbed, their gradient must be 0.
  Rng r;
  double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x = r.uniform(12, -2, 2);
  for (int j = 4; j < 8; ++j)
    x[j] = -inf;
  x[9] = x[11] = -inf;
  GradCase c;
  c.ir = unary("pcc.softmax %x axis = 1 {nan_to_zero}", "tensor<3x4xf64>");
  c.args = {x};
  gradCheck(c);
  // And directly: the masked row's gradient is exactly 0, not NaN.
  c.gy = {std::vector<double>(12, 1.0)};
  BuiltVjp built;
  buildAndRunVjp(c, r, built);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_TRUE(built.grads[0]);
  for (int j = 4; j < 8; ++j)
    EXPECT_EQ(built.grads[0]->data[j], 0.0) << "element " << j;
}

TEST(GradCheck, LogSoftmax_LastAxis) {
  Rng r;
  gradCheck(softmaxCase("pcc.log_softmax", 2, r));
}

TEST(GradCheck, LogSoftmax_FirstAxis) {
  Rng r;
  gradCheck(softmaxCase("pcc.log_softmax", 0, r));
}

TEST(GradCheck, LogSoftmax_NanToZeroRefused) {
  GradCase c;
  c.ir = unary("pcc.log_softmax %x axis = 1 {nan_to_zero}");
  c.needed = {true};
  expectRefused(c, "with nan_to_zero has no gradient rule");
}

TEST(GradCheck, LayerNorm_WithBias) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3x4xf64>, %g: tensor<4xf64>, %b: tensor<4xf64>) -> tensor<2x3x4xf64> {
      %y = pcc.layer_norm %x, %g, %b axis = 2 epsilon = 9.99999974E-6 : tensor<2x3x4xf64>, tensor<4xf64>, tensor<4xf64>
      return %y : tensor<2x3x4xf64>
    }
  )mlir";
  c.args = {r.uniform(24, -2, 2), r.uniform(4, 0.5, 1.5), r.uniform(4, -1, 1)};
  gradCheck(c);
}

TEST(GradCheck, LayerNorm_NoBias) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3x4xf64>, %g: tensor<4xf64>) -> tensor<2x3x4xf64> {
      %y = pcc.layer_norm %x, %g axis = 2 epsilon = 9.99999974E-6 : tensor<2x3x4xf64>, tensor<4xf64>
      return %y : tensor<2x3x4xf64>
    }
  )mlir";
  c.args = {r.uniform(24, -2, 2), r.uniform(4, 0.5, 1.5)};
  gradCheck(c);
}

TEST(GradCheck, LayerNorm_AxisNotLast) {
  // Normalises over [1, 3): scale and bias are 3x4.
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3x4xf64>, %g: tensor<3x4xf64>, %b: tensor<3x4xf64>) -> tensor<2x3x4xf64> {
      %y = pcc.layer_norm %x, %g, %b axis = 1 epsilon = 1.000000e-03 : tensor<2x3x4xf64>, tensor<3x4xf64>, tensor<3x4xf64>
      return %y : tensor<2x3x4xf64>
    }
  )mlir";
  c.args = {r.uniform(24, -2, 2), r.uniform(12, 0.5, 1.5),
            r.uniform(12, -1, 1)};
  gradCheck(c);
}

TEST(GradCheck, LayerNorm_AxisZero) {
  // Normalises the whole tensor: no leading dimension to sum over.
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3xf64>, %g: tensor<2x3xf64>, %b: tensor<2x3xf64>) -> tensor<2x3xf64> {
      %y = pcc.layer_norm %x, %g, %b axis = 0 epsilon = 9.99999974E-6 : tensor<2x3xf64>, tensor<2x3xf64>, tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir";
  c.args = {r.uniform(6, -2, 2), r.uniform(6, 0.5, 1.5), r.uniform(6, -1, 1)};
  gradCheck(c);
}

GradCase batchNormCase(Rng &r, const std::string &xType, int64_t n) {
  GradCase c;
  c.ir = "func.func @f(%x: " + xType +
         ", %s: tensor<3xf64>, %b: tensor<3xf64>, %m: tensor<3xf64>, %v: "
         "tensor<3xf64>) -> " +
         xType +
         " {\n  %y = pcc.batch_norm %x, %s, %b, %m, %v epsilon = "
         "9.99999974E-6 : " +
         xType + ", tensor<3xf64>\n  return %y : " + xType + "\n}\n";
  c.args = {r.uniform(n, -2, 2), r.uniform(3, 0.5, 1.5), r.uniform(3, -1, 1),
            r.uniform(3, -0.5, 0.5), r.uniform(3, 0.5, 2)};
  // Inference mode: the running statistics get no gradient.
  c.needed = {true, true, true, false, false};
  return c;
}

TEST(GradCheck, BatchNorm) {
  Rng r;
  gradCheck(batchNormCase(r, "tensor<2x3x2x2xf64>", 24));
}

TEST(GradCheck, BatchNorm_Rank2) {
  Rng r;
  gradCheck(batchNormCase(r, "tensor<4x3xf64>", 12));
}

TEST(GradCheck, BatchNorm_StatisticsRefused) {
  Rng r;
  GradCase c = batchNormCase(r, "tensor<4x3xf64>", 12);
  c.needed = {true, true, true, true, false};
  expectRefused(c, "has no gradient for its running statistics");
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

/// @f(%x: `in`) -> `op %x` : `in` -> `out`.
GradCase movement(const std::string &op, const std::string &in,
                  const std::string &out, std::vector<double> x) {
  GradCase c;
  c.ir = "func.func @f(%x: " + in + ") -> " + out + " {\n  %y = " + op +
         " : " + in + " -> " + out + "\n  return %y : " + out + "\n}\n";
  c.args = {std::move(x)};
  return c;
}

TEST(GradCheck, Reshape) {
  Rng r;
  gradCheck(movement("pcc.reshape %x", "tensor<2x3x4xf64>", "tensor<6x4xf64>",
                     r.uniform(24, -2, 2)));
}

TEST(GradCheck, Transpose_Heads) {
  Rng r;
  gradCheck(movement("pcc.transpose %x [0, 2, 1, 3]", "tensor<2x3x2x2xf64>",
                     "tensor<2x2x3x2xf64>", r.uniform(24, -2, 2)));
}

TEST(GradCheck, Transpose) {
  Rng r;
  gradCheck(movement("pcc.transpose %x [2, 0, 1]", "tensor<2x3x4xf64>",
                     "tensor<4x2x3xf64>", r.uniform(24, -2, 2)));
}

TEST(GradCheck, Broadcast_NewLeadingDims) {
  Rng r;
  gradCheck(movement("pcc.broadcast %x", "tensor<3xf64>", "tensor<2x4x3xf64>",
                     r.uniform(3, -2, 2)));
}

TEST(GradCheck, Broadcast_SizeOneDims) {
  Rng r;
  gradCheck(movement("pcc.broadcast %x", "tensor<2x1x3x1xf64>",
                     "tensor<2x4x3x2xf64>", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Broadcast_LeadingAndSizeOne) {
  Rng r;
  gradCheck(movement("pcc.broadcast %x", "tensor<4x1xf64>",
                     "tensor<2x4x3xf64>", r.uniform(4, -2, 2)));
}

TEST(GradCheck, Broadcast_Scalar) {
  Rng r;
  gradCheck(movement("pcc.broadcast %x", "tensor<f64>", "tensor<2x3xf64>",
                     r.uniform(1, -2, 2)));
}

GradCase concatCase(Rng &r) {
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%a: tensor<2x1xf64>, %b: tensor<2x3xf64>, %c: tensor<2x2xf64>) -> tensor<2x6xf64> {
      %y = pcc.concat %a, %b, %c axis = 1 : tensor<2x1xf64>, tensor<2x3xf64>, tensor<2x2xf64> -> tensor<2x6xf64>
      return %y : tensor<2x6xf64>
    }
  )mlir";
  c.args = {r.uniform(2, -2, 2), r.uniform(6, -2, 2), r.uniform(4, -2, 2)};
  return c;
}

TEST(GradCheck, Concat) {
  Rng r;
  gradCheck(concatCase(r));
}

TEST(GradCheck, Concat_MiddleNotNeeded) {
  Rng r;
  GradCase c = concatCase(r);
  c.needed = {true, false, true};
  gradCheck(c);
}

TEST(GradCheck, Concat_Axis0) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%a: tensor<1x3xf64>, %b: tensor<2x3xf64>) -> tensor<3x3xf64> {
      %y = pcc.concat %a, %b axis = 0 : tensor<1x3xf64>, tensor<2x3xf64> -> tensor<3x3xf64>
      return %y : tensor<3x3xf64>
    }
  )mlir";
  c.args = {r.uniform(3, -2, 2), r.uniform(6, -2, 2)};
  gradCheck(c);
}

TEST(GradCheck, Split) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x6xf64>) -> (tensor<2x1xf64>, tensor<2x3xf64>, tensor<2x2xf64>) {
      %p:3 = pcc.split %x axis = 1 sizes = [1, 3, 2] : tensor<2x6xf64> -> tensor<2x1xf64>, tensor<2x3xf64>, tensor<2x2xf64>
      return %p#0, %p#1, %p#2 : tensor<2x1xf64>, tensor<2x3xf64>, tensor<2x2xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -2, 2)};
  gradCheck(c);
}

TEST(GradCheck, Split_OneResultWithoutGradient) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<6x2xf64>) -> (tensor<1x2xf64>, tensor<3x2xf64>, tensor<2x2xf64>) {
      %p:3 = pcc.split %x axis = 0 sizes = [1, 3, 2] : tensor<6x2xf64> -> tensor<1x2xf64>, tensor<3x2xf64>, tensor<2x2xf64>
      return %p#0, %p#1, %p#2 : tensor<1x2xf64>, tensor<3x2xf64>, tensor<2x2xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -2, 2)};
  c.withGrad = {true, false, true};
  gradCheck(c);
}

TEST(GradCheck, Slice_Step2) {
  Rng r;
  gradCheck(movement(
      "pcc.slice %x starts = [1, 0] limits = [3, 6] steps = [1, 2]",
      "tensor<3x6xf64>", "tensor<2x3xf64>", r.uniform(18, -2, 2)));
}

TEST(GradCheck, Slice_NegativeStep) {
  Rng r;
  gradCheck(movement(
      "pcc.slice %x starts = [0, 5] limits = [3, -1] steps = [1, -1]",
      "tensor<3x6xf64>", "tensor<3x6xf64>", r.uniform(18, -2, 2)));
}

TEST(GradCheck, Slice_NegativeStep2) {
  // Columns 4, 2, 0: the pad's limit 4 - 3 * 2 = -2 runs below -1.
  Rng r;
  gradCheck(movement(
      "pcc.slice %x starts = [2, 4] limits = [0, -1] steps = [-1, -2]",
      "tensor<3x6xf64>", "tensor<2x3xf64>", r.uniform(18, -2, 2)));
}

TEST(GradCheck, Pad_NegativeStep) {
  Rng r;
  gradCheck(movement("pcc.pad %x starts = [0, 4] steps = [1, -2]",
                     "tensor<2x3xf64>", "tensor<2x5xf64>",
                     r.uniform(6, -2, 2)));
}

TEST(GradCheck, Pad_Strided) {
  // Rows 1, 3 of 4 and columns 0, 3, 6 of 7: start + n * step (5 and 9)
  // lies past the dimensions (4, 7); the rule's slice must stop at the edge.
  Rng r;
  gradCheck(movement("pcc.pad %x starts = [1, 0] steps = [2, 3]",
                     "tensor<2x3xf64>", "tensor<4x7xf64>",
                     r.uniform(6, -2, 2)));
}

TEST(GradCheck, Pad_StridedEndingAtTheEdge) {
  // Rows 0, 2 of 4 and columns 0, 2, 4 of 6: the rule's slice limits are
  // 4 and 6, exactly the dimensions, so the bug of Pad_Strided is avoided.
  Rng r;
  gradCheck(movement("pcc.pad %x starts = [0, 0] steps = [2, 2]",
                     "tensor<2x3xf64>", "tensor<4x6xf64>",
                     r.uniform(6, -2, 2)));
}

TEST(GradCheck, Gather_Axis0) {
  // Repeated (0, -1 twice) and negative indices.
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%t: tensor<4x3xf64>, %i: tensor<2x3xi64>) -> tensor<2x3x3xf64> {
      %y = pcc.gather %t[%i] axis = 0 : tensor<4x3xf64>, tensor<2x3xi64> -> tensor<2x3x3xf64>
      return %y : tensor<2x3x3xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -2, 2), {0, -1, 2, 0, 3, -1}};
  gradCheck(c);
}

TEST(GradCheck, Gather_Axis1) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%t: tensor<3x4xf64>, %i: tensor<3xi32>) -> tensor<3x3xf64> {
      %y = pcc.gather %t[%i] axis = 1 : tensor<3x4xf64>, tensor<3xi32> -> tensor<3x3xf64>
      return %y : tensor<3x3xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -2, 2), {1, -1, 1}};
  gradCheck(c);
}

TEST(GradCheck, Gather_ScalarIndex) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%t: tensor<4x3xf64>, %i: tensor<i64>) -> tensor<3xf64> {
      %y = pcc.gather %t[%i] axis = 0 : tensor<4x3xf64>, tensor<i64> -> tensor<3xf64>
      return %y : tensor<3xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -2, 2), {-2}};
  gradCheck(c);
}

TEST(GradCheck, Gather_Axis1_2DIndices) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%t: tensor<2x4x3xf64>, %i: tensor<2x2xi64>) -> tensor<2x2x2x3xf64> {
      %y = pcc.gather %t[%i] axis = 1 : tensor<2x4x3xf64>, tensor<2x2xi64> -> tensor<2x2x2x3xf64>
      return %y : tensor<2x2x2x3xf64>
    }
  )mlir";
  c.args = {r.uniform(24, -2, 2), {3, -1, 0, 3}};
  gradCheck(c);
}

TEST(GradCheck, ScatterAdd_Axis0) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%u: tensor<2x3x3xf64>, %i: tensor<2x3xi64>) -> tensor<4x3xf64> {
      %y = pcc.scatter_add %u[%i] axis = 0 : tensor<2x3x3xf64>, tensor<2x3xi64> -> tensor<4x3xf64>
      return %y : tensor<4x3xf64>
    }
  )mlir";
  c.args = {r.uniform(18, -2, 2), {0, -1, 2, 0, 3, -1}};
  gradCheck(c);
}

TEST(GradCheck, ScatterAdd_Axis1) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%u: tensor<3x3xf64>, %i: tensor<3xi32>) -> tensor<3x4xf64> {
      %y = pcc.scatter_add %u[%i] axis = 1 : tensor<3x3xf64>, tensor<3xi32> -> tensor<3x4xf64>
      return %y : tensor<3x4xf64>
    }
  )mlir";
  c.args = {r.uniform(9, -2, 2), {1, -1, 1}};
  gradCheck(c);
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

/// @f(%x: tensor<2x3x4xf64>) -> `op %x axes = axes [keep]`.
GradCase reduceCase(const std::string &op, const std::string &axes,
                    bool keep, const std::string &out,
                    std::vector<double> x) {
  return movement(op + " %x axes = " + axes + (keep ? " {keep_dims}" : ""),
                  "tensor<2x3x4xf64>", out, std::move(x));
}

TEST(GradCheck, ReduceSum) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_sum", "[1]", false, "tensor<2x4xf64>",
                       r.uniform(24, -2, 2)));
}

TEST(GradCheck, ReduceSum_KeepDimsTwoAxes) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_sum", "[0, 2]", true, "tensor<1x3x1xf64>",
                       r.uniform(24, -2, 2)));
}

TEST(GradCheck, ReduceSum_AllAxes) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_sum", "[0, 1, 2]", false, "tensor<f64>",
                       r.uniform(24, -2, 2)));
}

TEST(GradCheck, ReduceSum_UnsortedAxes) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_sum", "[2, 0]", false, "tensor<3xf64>",
                       r.uniform(24, -2, 2)));
}

TEST(GradCheck, ReduceMean_AllAxesKeepDims) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_mean", "[0, 1, 2]", true,
                       "tensor<1x1x1xf64>", r.uniform(24, -2, 2)));
}

TEST(GradCheck, ReduceMean_KeepDims) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_mean", "[2]", true, "tensor<2x3x1xf64>",
                       r.uniform(24, -2, 2)));
}

TEST(GradCheck, ReduceMean_TwoAxes) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_mean", "[0, 2]", false, "tensor<3xf64>",
                       r.uniform(24, -2, 2)));
}

TEST(GradCheck, ReduceMax) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_max", "[1]", false, "tensor<2x4xf64>",
                       r.distinct(24, -2, 2)));
}

TEST(GradCheck, ReduceMax_KeepDimsTwoAxes) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_max", "[0, 2]", true, "tensor<1x3x1xf64>",
                       r.distinct(24, -2, 2)));
}

TEST(GradCheck, ReduceMax_UnsortedAxes) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_max", "[2, 1]", false, "tensor<2xf64>",
                       r.distinct(24, -2, 2)));
}

TEST(GradCheck, ReduceMin) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_min", "[2]", false, "tensor<2x3xf64>",
                       r.distinct(24, -2, 2)));
}

TEST(GradCheck, ReduceMin_KeepDimsTwoAxes) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_min", "[0, 1]", true, "tensor<1x1x4xf64>",
                       r.distinct(24, -2, 2)));
}

// amax/amin: ties share the gradient evenly.
TEST(GradCheck, ReduceMax_TiesSplitEvenly) {
  GradCase c = movement("pcc.reduce_max %x axes = [1]", "tensor<2x3xf64>",
                        "tensor<2xf64>", {1, 3, 3, 2, 2, 2});
  c.gy = {{6, 3}};
  expectGradients(c, {{0, 3, 3, 1, 1, 1}});
}

TEST(GradCheck, ReduceMin_TiesSplitEvenly) {
  GradCase c = movement("pcc.reduce_min %x axes = [0] {keep_dims}",
                        "tensor<2x3xf64>", "tensor<1x3xf64>",
                        {1, 3, -2, 1, 2, -2});
  c.gy = {{4, 6, 8}};
  expectGradients(c, {{2, 0, 4, 2, 6, 4}});
}

TEST(GradCheck, ReduceProd) {
  // No zero factor (the rule divides by x).
  Rng r;
  gradCheck(reduceCase("pcc.reduce_prod", "[1]", false, "tensor<2x4xf64>",
                       r.awayFromZero(24, 0.5, 1.5)));
}

TEST(GradCheck, ReduceProd_KeepDimsTwoAxes) {
  Rng r;
  gradCheck(reduceCase("pcc.reduce_prod", "[0, 2]", true, "tensor<1x3x1xf64>",
                       r.awayFromZero(24, 0.5, 1.5)));
}

//===----------------------------------------------------------------------===//
// Matrix products
//===----------------------------------------------------------------------===//

GradCase matmulCase(Rng &r, const std::string &lhs, int64_t lhsN,
                    const std::string &rhs, int64_t rhsN,
                    const std::string &out, const std::string &attrs) {
  GradCase c;
  c.ir = "func.func @f(%a: " + lhs + ", %b: " + rhs + ") -> " + out +
         " {\n  %y = pcc.matmul %a, %b " + attrs + " : " + lhs + ", " + rhs +
         " -> " + out + "\n  return %y : " + out + "\n}\n";
  c.args = {r.uniform(lhsN, -1, 1), r.uniform(rhsN, -1, 1)};
  return c;
}

TEST(GradCheck, Matmul) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<3x4xf64>", 12, "tensor<4x5xf64>", 20,
                       "tensor<3x5xf64>", ""));
}

TEST(GradCheck, Matmul_TransposeA) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<4x3xf64>", 12, "tensor<4x5xf64>", 20,
                       "tensor<3x5xf64>", "{transpose_a}"));
}

TEST(GradCheck, Matmul_TransposeB) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<3x4xf64>", 12, "tensor<5x4xf64>", 20,
                       "tensor<3x5xf64>", "{transpose_b}"));
}

TEST(GradCheck, Matmul_TransposeAB) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<4x3xf64>", 12, "tensor<5x4xf64>", 20,
                       "tensor<3x5xf64>", "{transpose_a, transpose_b}"));
}

TEST(GradCheck, Matmul_BatchedSharedRhs) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<2x3x4xf64>", 24, "tensor<4x5xf64>", 20,
                       "tensor<2x3x5xf64>", ""));
}

TEST(GradCheck, Matmul_BatchedSharedRhs_TransposeB) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<2x3x4xf64>", 24, "tensor<5x4xf64>", 20,
                       "tensor<2x3x5xf64>", "{transpose_b}"));
}

TEST(GradCheck, Matmul_BatchedSharedRhs_TransposeA) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<2x4x3xf64>", 24, "tensor<4x5xf64>", 20,
                       "tensor<2x3x5xf64>", "{transpose_a}"));
}

TEST(GradCheck, Matmul_BatchedSharedRhs_TransposeAB) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<2x4x3xf64>", 24, "tensor<5x4xf64>", 20,
                       "tensor<2x3x5xf64>", "{transpose_a, transpose_b}"));
}

TEST(GradCheck, Matmul_Batched4DSharedRhs) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<2x2x3x4xf64>", 48, "tensor<4x5xf64>", 20,
                       "tensor<2x2x3x5xf64>", ""));
}

TEST(GradCheck, Matmul_BatchedPerBatchRhs) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<2x3x4xf64>", 24, "tensor<2x4x5xf64>", 40,
                       "tensor<2x3x5xf64>", ""));
}

TEST(GradCheck, Matmul_BatchedPerBatchRhs_TransposeAB) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<2x4x3xf64>", 24, "tensor<2x5x4xf64>", 40,
                       "tensor<2x3x5xf64>", "{transpose_a, transpose_b}"));
}

TEST(GradCheck, Matmul_Batched4DPerBatchRhs_TransposeB) {
  Rng r;
  gradCheck(matmulCase(r, "tensor<2x2x3x4xf64>", 48, "tensor<2x2x5x4xf64>",
                       80, "tensor<2x2x3x5xf64>", "{transpose_b}"));
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

TEST(GradCheck, CrossEntropy_IgnoreIndex) {
  // Rows 1 and 3 are ignored: zero gradient there.
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<5x4xf64>, %l: tensor<5xi64>) -> tensor<5xf64> {
      %y = pcc.cross_entropy %x, %l ignore_index = -100 : tensor<5x4xf64>, tensor<5xi64> -> tensor<5xf64>
      return %y : tensor<5xf64>
    }
  )mlir";
  c.args = {r.uniform(20, -3, 3), {2, -100, 0, -100, 3}};
  gradCheck(c);
}

TEST(GradCheck, CrossEntropy_PositiveIgnoreIndex) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<3x4xf64>, %l: tensor<3xi32>) -> tensor<3xf64> {
      %y = pcc.cross_entropy %x, %l ignore_index = 1 : tensor<3x4xf64>, tensor<3xi32> -> tensor<3xf64>
      return %y : tensor<3xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -3, 3), {1, 3, 0}};
  gradCheck(c);
}

//===----------------------------------------------------------------------===//
// No gradient
//===----------------------------------------------------------------------===//

TEST(GradCheck, NoGradient_Floor) { expectNoGradient(unary("pcc.floor %x")); }

TEST(GradCheck, NoGradient_Ceil) { expectNoGradient(unary("pcc.ceil %x")); }

TEST(GradCheck, NoGradient_Compare) {
  expectNoGradient(R"mlir(
    func.func @f(%a: tensor<2x3xf64>, %b: tensor<2x3xf64>) -> tensor<2x3xi1> {
      %y = pcc.compare lt, %a, %b : tensor<2x3xf64>
      return %y : tensor<2x3xi1>
    }
  )mlir");
}

TEST(GradCheck, NoGradient_ArgMax) {
  expectNoGradient(R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2xi64> {
      %y = pcc.argmax %x axis = 1 : tensor<2x3xf64> -> tensor<2xi64>
      return %y : tensor<2xi64>
    }
  )mlir");
}

TEST(GradCheck, NoGradient_IsNaNIsInf) {
  expectNoGradient(R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2x3xi1> {
      %y = pcc.is_nan %x : tensor<2x3xf64> -> tensor<2x3xi1>
      return %y : tensor<2x3xi1>
    }
  )mlir");
  expectNoGradient(R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2x3xi1> {
      %y = pcc.is_inf %x : tensor<2x3xf64> -> tensor<2x3xi1>
      return %y : tensor<2x3xi1>
    }
  )mlir");
}

TEST(GradCheck, NoGradient_Logical) {
  expectNoGradient(unary("pcc.not %x", "tensor<2x3xi1>"));
  for (const char *op : {"pcc.and %a, %b", "pcc.or %a, %b", "pcc.xor %a, %b"})
    expectNoGradient(binary(op, "tensor<2x3xi1>"));
}

TEST(GradCheck, NoGradient_ParamAndConstant) {
  expectNoGradient(R"mlir(
    func.func @f() -> tensor<2x3xf64> {
      %y = pcc.param "w" : tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir");
  expectNoGradient(R"mlir(
    func.func @f() -> tensor<2xf64> {
      %y = pcc.constant dense<[1.0, 2.0]> : tensor<2xf64>
      return %y : tensor<2xf64>
    }
  )mlir");
}

// Rules of ops that also take integers give integers no gradient. (Their
// saved lists do not look at the type and are left alone: pcc-autodiff
// never asks an op without a float operand.)
TEST(GradCheck, NoGradient_IntegerOperands) {
  expectNoGradient(binary("pcc.div %a, %b", "tensor<2x3xi64>"),
                   /*noSaved=*/false);
  for (const char *op : {"pcc.reduce_max", "pcc.reduce_min", "pcc.reduce_prod"})
    expectNoGradient(
        movement(std::string(op) + " %x axes = [1]", "tensor<2x3xi64>",
                 "tensor<2xi64>", {})
            .ir,
        /*noSaved=*/false);
  expectNoGradient(
      movement("pcc.cast %x", "tensor<2x3xi64>", "tensor<2x3xf64>", {}).ir);
  expectNoGradient(
      movement("pcc.cast %x", "tensor<2x3xf64>", "tensor<2x3xi64>", {}).ir);
}

//===----------------------------------------------------------------------===//
// Ops without a rule: pcc-autodiff refuses them
//===----------------------------------------------------------------------===//

const char *const kRefused[] = {
    "pcc.conv",         "pcc.max_pool",     "pcc.avg_pool",
    "pcc.all_reduce",   "pcc.all_gather",   "pcc.reduce_scatter",
    "pcc.shard_slice",  "pcc.shard_gather", "pcc.transfer",
    "pcc.fusion",       "pcc.yield",        "pcc.cross_entropy_grad",
    "pcc.accumulate",   "pcc.zero",         "pcc.sgd_update",
    "pcc.adamw_update",
};

TEST(GradCheck, NoRule_ConvPoolCollectives) {
  for (const char *name : kRefused) {
    auto op = RegisteredOperationName::lookup(name, &context());
    ASSERT_TRUE(op.has_value()) << name << " is not registered";
    EXPECT_FALSE(op->hasInterface<AutodiffOpInterface>())
        << name << " has a gradient rule; give it a gradient check here";
  }
}

TEST(GradCheck, NoRule_OnAParsedConv) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%x: tensor<1x1x3x3xf64>, %w: tensor<1x1x2x2xf64>) -> tensor<1x1x2x2xf64> {
      %y = pcc.conv %x, %w strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 1
          : tensor<1x1x3x3xf64>, tensor<1x1x2x2xf64> -> tensor<1x1x2x2xf64>
      return %y : tensor<1x1x2x2xf64>
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  Operation *op = opUnderTest(module);
  ASSERT_TRUE(op);
  EXPECT_FALSE(isa<AutodiffOpInterface>(op));
}

// Every registered pcc op is covered above: a rule (checked by a GradCheck
// case), a no-gradient rule, or none (refused). A new op must be sorted.
TEST(GradCheck, EveryOpIsClassified) {
  const llvm::DenseSet<StringRef> noGradient = {
      "pcc.floor",   "pcc.ceil",   "pcc.not",     "pcc.and",
      "pcc.or",      "pcc.xor",    "pcc.is_nan",  "pcc.is_inf",
      "pcc.compare", "pcc.argmax", "pcc.param",   "pcc.constant"};
  const llvm::DenseSet<StringRef> withRule = {
      "pcc.neg",         "pcc.abs",         "pcc.sqrt",
      "pcc.reciprocal",  "pcc.exp",         "pcc.log",
      "pcc.erf",         "pcc.tanh",        "pcc.sigmoid",
      "pcc.relu",        "pcc.sin",         "pcc.cos",
      "pcc.gelu",        "pcc.leaky_relu",  "pcc.clamp",
      "pcc.add",         "pcc.sub",         "pcc.mul",
      "pcc.div",         "pcc.pow",         "pcc.max",
      "pcc.min",         "pcc.mod",         "pcc.select",
      "pcc.cast",        "pcc.softmax",     "pcc.log_softmax",
      "pcc.layer_norm",  "pcc.batch_norm",  "pcc.reshape",
      "pcc.transpose",   "pcc.broadcast",   "pcc.concat",
      "pcc.split",       "pcc.slice",       "pcc.pad",
      "pcc.gather",      "pcc.scatter_add", "pcc.reduce_sum",
      "pcc.reduce_mean", "pcc.reduce_max",  "pcc.reduce_min",
      "pcc.reduce_prod", "pcc.matmul",      "pcc.cross_entropy"};
  llvm::DenseSet<StringRef> refused(std::begin(kRefused), std::end(kRefused));
  int count = 0;
  for (RegisteredOperationName name : context().getRegisteredOperations()) {
    if (name.getDialectNamespace() != "pcc")
      continue;
    ++count;
    StringRef n = name.getStringRef();
    int lists = withRule.contains(n) + noGradient.contains(n) +
                refused.contains(n);
    EXPECT_EQ(lists, 1) << n.str() << " is in " << lists
                        << " of the lists here";
    EXPECT_EQ(name.hasInterface<AutodiffOpInterface>(), !refused.contains(n))
        << n.str();
  }
  EXPECT_EQ(count, static_cast<int>(withRule.size() + noGradient.size() +
                                    refused.size()));
}

} // namespace
