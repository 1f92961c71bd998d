//===- SetMesh.cpp - declare the module's device mesh ---------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"

#include "llvm/ADT/StringSet.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_SETMESH
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {
struct SetMeshPass : public pcc::impl::SetMeshBase<SetMeshPass> {
  using SetMeshBase::SetMeshBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<std::pair<StringRef, int64_t>> parsed;
    llvm::StringSet<> seen;
    for (const std::string &axis : axes) {
      auto [name, size] = StringRef(axis).split('=');
      int64_t n = 0;
      if (name.empty() || size.getAsInteger(10, n) || n < 1 ||
          !seen.insert(name).second) {
        module.emitError("pcc-set-mesh: axis '")
            << axis << "' is not name=size with a new name and a size of 1 "
            << "or more";
        return signalPassFailure();
      }
      parsed.emplace_back(name, n);
    }
    setMesh(module, parsed);
  }
};
} // namespace
