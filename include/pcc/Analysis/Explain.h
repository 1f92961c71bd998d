//===- Explain.h - the pcc --explain report ---------------------*- C++ -*-===//
//
// `pcc --explain` prints what the lowering pipeline made of a model; the
// driver collects the passes' remarks and its settings into an
// ExplainSettings. Also the helpers the driver shares with it.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_ANALYSIS_EXPLAIN_H
#define PCC_ANALYSIS_EXPLAIN_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mlir::pcc {

/// Remarks for the --explain report, by what made them: the importer
/// (weights stored once), the sharding passes, the pipeline passes (whose
/// remarks start "pp=").
enum class NoteKind { Import, Sharding, Pipeline };

struct ExplainSettings {
  std::string inputFile;
  int64_t tp = 1, pp = 1, ppChunks = 1, dp = 1, zero = 0;
  std::vector<std::pair<NoteKind, std::string>> notes;
};

/// The report, for a module the whole pipeline ran on.
void explain(mlir::ModuleOp module, const ExplainSettings &settings,
             llvm::raw_ostream &os);

/// "node '/fc1/Gemm' (Gemm)", "'name'" or "file:line:col": how pcc names
/// where an op came from in messages.
std::string describeLocation(mlir::Location loc);
/// The arena one rank allocates: the largest of the planned functions'
/// (each pipeline rank runs one stage; unpipelined, @main's).
int64_t rankArenaBytes(mlir::ModuleOp module);
/// 1234567 as "1,234,567".
std::string grouped(int64_t n);

/// --explain's schedule section for a pipelined `main` over `pp` pipeline
/// ranks: the policy, each rank's list and, with pp > 1, the bubble of the
/// lists replayed by pcc::schedule::simulate with F, B and W one unit
/// each; "" when `main` has no schedule.
std::string describeSchedule(mlir::Operation *main, int64_t pp);

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_EXPLAIN_H
