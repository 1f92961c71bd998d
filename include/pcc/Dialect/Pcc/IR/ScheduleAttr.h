//===- ScheduleAttr.h - a pipelined main's schedule, typed ------*- C++ -*-===//
//
// `pcc.schedule` on a pipelined @main (pcc-pipeline-schedule): the policy,
// the micro-batches, the chunks per rank and one instruction list per
// pipeline rank, as pcc::schedule::Schedule::describeRank writes them. Apart
// from Contracts.h: the plain C++ schedule library's namespace `::pcc`
// would make `pcc::` ambiguous in files that use namespace mlir.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_SCHEDULEATTR_H
#define PCC_DIALECT_PCC_IR_SCHEDULEATTR_H

#include "pcc/Schedule/Schedule.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include <optional>

namespace mlir::pcc {

/// Reads a `pcc.schedule` dictionary (policy, micro-batches, chunks and
/// one instruction list per pipeline rank); an instruction that does not
/// parse, or names a micro-batch, chunk or peer out of range, is an error.
LogicalResult
parseScheduleAttr(DictionaryAttr attr, ::pcc::schedule::Schedule &schedule,
                  llvm::function_ref<InFlightDiagnostic()> emitError);
/// The schedule of a pipelined `main`, or nullopt when it has none.
std::optional<::pcc::schedule::Schedule> getPipelineSchedule(Operation *main);

} // namespace mlir::pcc

#endif // PCC_DIALECT_PCC_IR_SCHEDULEATTR_H
