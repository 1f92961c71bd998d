//===- GradCheck.h - VJP rules against finite differences -------*- C++ -*-===//
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
//
// The tests are in GradCheckElementwiseTest.cpp (elementwise, softmax and
// normalisation) and GradCheckStructureTest.cpp (data movement,
// reductions, matrix products, losses, and the ops without a gradient or
// without a rule).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_UNITTESTS_GRADCHECK_H
#define PCC_UNITTESTS_GRADCHECK_H

#include "Interpreter.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace pcc_gradcheck {

using mlir::ModuleOp;
using mlir::Operation;
using mlir::OwningOpRef;
using ::pcc::testing::Tensor;
namespace func = mlir::func;

/// The context every case parses into (pcc and func dialects loaded).
mlir::MLIRContext &context();
/// A params callback for programs that read none.
Tensor noParam(llvm::StringRef);

inline mlir::RankedTensorType typeOf(mlir::Value v) {
  return llvm::cast<mlir::RankedTensorType>(v.getType());
}
inline bool isFloat(mlir::Value v) {
  return llvm::isa<mlir::FloatType>(typeOf(v).getElementType());
}

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

/// How a table-driven case draws its values (Rng).
struct Sample {
  enum Kind { Uniform, AwayFromZero, Distinct } kind;
  double lo, hi;
  std::vector<double> draw(Rng &r, int64_t n) const {
    switch (kind) {
    case AwayFromZero:
      return r.awayFromZero(n, lo, hi);
    case Distinct:
      return r.distinct(n, lo, hi);
    case Uniform:
      break;
    }
    return r.uniform(n, lo, hi);
  }
};

/// A name for each instance of a table-driven test: the case's `name`.
struct CaseName {
  template <typename Info> std::string operator()(const Info &info) const {
    return info.param.name;
  }
};

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

std::string toString(Operation *op);
/// Parses `c`, builds the rule's VJP in @vjp and interprets it.
void buildAndRunVjp(const GradCase &c, Rng &rng, BuiltVjp &out);
/// The whole check of one case (see the top of this file).
void gradCheck(const GradCase &c);
/// The rule's gradients equal `expected` (per operand) within `tol`.
void expectGradients(const GradCase &c,
                     const std::vector<std::vector<double>> &expected,
                     double tol = 1e-12);
/// The op defining @f's first returned value.
Operation *opUnderTest(OwningOpRef<ModuleOp> &module);
/// The op's rule returns no gradient and builds nothing.
void expectNoGradient(const std::string &ir, bool noSaved = true);
/// The op's rule fails with `message`.
void expectRefused(const GradCase &c, const std::string &message);

/// @f(%x) -> `op %x` on `type`; `op` is the op's text up to its type, e.g.
/// "pcc.leaky_relu %x alpha = 1.000000e-01".
std::string unary(const std::string &op,
                  const std::string &type = "tensor<2x3xf64>");
/// @f(%a, %b) -> `op %a, %b` on `type`.
std::string binary(const std::string &op,
                   const std::string &type = "tensor<2x3xf64>");
GradCase unaryCase(const std::string &op, std::vector<double> x);
GradCase binaryCase(const std::string &op, std::vector<double> a,
                    std::vector<double> b);

} // namespace pcc_gradcheck

#endif // PCC_UNITTESTS_GRADCHECK_H
