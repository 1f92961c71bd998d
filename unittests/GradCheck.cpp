//===- GradCheck.cpp - checking VJP rules against finite differences ------===//
//
// The checker of GradCheck.h.
//
//===----------------------------------------------------------------------===//

#include "GradCheck.h"


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

namespace pcc_gradcheck {

MLIRContext &context() { return ::pcc::testing::testContext(); }

Tensor noParam(StringRef) { return {}; }


//===----------------------------------------------------------------------===//
// Seeded inputs
//===----------------------------------------------------------------------===//


//===----------------------------------------------------------------------===//
// The checker
//===----------------------------------------------------------------------===//



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
                     double tol) {
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
void expectNoGradient(const std::string &ir, bool noSaved) {
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
std::string unary(const std::string &op, const std::string &type) {
  return "func.func @f(%x: " + type + ") -> " + type + " {\n  %y = " + op +
         " : " + type + "\n  return %y : " + type + "\n}\n";
}

/// @f(%a, %b) -> `op %a, %b` on tensor<2x3xf64>.
std::string binary(const std::string &op, const std::string &type) {
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

} // namespace pcc_gradcheck
