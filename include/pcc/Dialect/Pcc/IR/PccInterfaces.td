//===- PccInterfaces.td - per-op rules the passes ask for ---*- tablegen -*-===//
//
// What a pass needs to know about each op lives with the op, behind these
// interfaces, instead of in type switches inside the passes:
//
// - PccShardingOpInterface: how the op runs on operands laid out over a
//   mesh axis (pcc-plan-sharding, pcc-partition), and what its per-rank
//   clone must change.
// - PccCostOpInterface: its FLOPs and the bytes it writes (the planners'
//   cost model, --explain).
// - PccCollectiveOpInterface: which collective a communication op is, over
//   which axis, moving how many bytes.
// - PccAutodiffOpInterface: the op's vector-Jacobian product (pcc-autodiff)
//   and the forward values it reads.
//
// Every pcc op implements the first two through external models
// (lib/Dialect/Pcc/IR/InterfaceModels.cpp): a rule per op where the op has
// one, the same-shape rule for Elementwise ops, and otherwise none, which
// means the op runs on whole tensors on every rank. A unit test checks that
// every registered op has both.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_PCCINTERFACES_TD
#define PCC_DIALECT_PCC_IR_PCCINTERFACES_TD

include "mlir/IR/OpBase.td"

def Pcc_ShardingOpInterface : OpInterface<"ShardingOpInterface"> {
  let cppNamespace = "::mlir::pcc";
  let description = [{
    How an op runs when its operands are laid out over one mesh axis of
    `ranks` ranks. Running on whole (replicated) operands with whole results
    is always possible and is not listed.
  }];
  let methods = [
    InterfaceMethod<[{
        Appends the ways the op can run given the layouts its operands have
        now (`operands`, one per operand): for each, the layout it reads
        every operand in and the layouts of its results. Options keep a
        split or partial sum that an operand has; the planner drops those
        whose layouts do not divide the shapes.
      }], "void", "getShardingOptions",
      (ins "::llvm::ArrayRef<::mlir::pcc::Shard>":$operands,
           "int64_t":$ranks,
           "::llvm::SmallVectorImpl<::mlir::pcc::ShardingOption> &":$options),
      "", [{}]>,
    InterfaceMethod<[{
        Called by pcc-partition on the op's clone in one rank's program,
        whose operands are already the local values (read in `operands`
        layouts) and whose result types are the local shapes: changes what
        counts global sizes (slice bounds, split sizes) or replaces the op
        with its local form (a vocabulary-parallel lookup). Returns the
        values that stand for the op's results.
      }], "::llvm::SmallVector<::mlir::Value>", "partitionLocal",
      (ins "::mlir::OpBuilder &":$builder,
           "::llvm::ArrayRef<::mlir::pcc::Shard>":$operands,
           "int64_t":$ranks, "::llvm::StringRef":$axis),
      "", [{
        return ::llvm::SmallVector<::mlir::Value>($_op->getResults());
      }]>,
    InterfaceMethod<[{
        What splitting operand `operand` as `shard` means to this op, for
        --explain ("columns (outputs)", "rows (contraction)", "vocabulary
        (lookup rows)"); empty when the op gives it no name.
      }], "std::string", "getSplitRole",
      (ins "unsigned":$operand, "::mlir::pcc::Shard":$shard),
      "", [{ return std::string(); }]>,
  ];
}

def Pcc_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mlir::pcc";
  let description = [{
    The work one op does on the tensors it has (whole or local), which the
    cost model turns into seconds.
  }];
  let methods = [
    InterfaceMethod<[{
        Floating-point operations, 2 per multiply-add; 0 for ops whose time
        is their memory traffic.
      }], "int64_t", "getFlops", (ins), "", [{ return 0; }]>,
    InterfaceMethod<[{
        Bytes the op writes to memory: its results, or 0 for views and for
        weights and constants (stored once, not computed).
      }], "int64_t", "getBytesWritten", (ins), "", [{
        int64_t bytes = 0;
        for (::mlir::Value r : $_op->getResults())
          bytes += ::mlir::pcc::getTensorBytes(r.getType());
        return bytes;
      }]>,
  ];
}

def Pcc_CollectiveOpInterface : OpInterface<"CollectiveOpInterface"> {
  let cppNamespace = "::mlir::pcc";
  let description = [{
    A communication among the ranks of one mesh axis. Every rank of the
    axis must issue the same collectives in the same order.
  }];
  let methods = [
    InterfaceMethod<"Which collective this is.",
      "::mlir::pcc::CollectiveKind", "getCollectiveKind">,
    InterfaceMethod<"The mesh axis whose ranks take part.",
      "::llvm::StringRef", "getMeshAxis", (ins), "",
      [{ return $_op.getAxis(); }]>,
    InterfaceMethod<[{
        Bytes of the whole tensor the collective works on (an all-reduce's
        and a reduce-scatter's input, an all-gather's result): the ring
        formulas price collectives by it.
      }], "int64_t", "getPayloadBytes">,
  ];
}

def Pcc_AutodiffOpInterface : OpInterface<"AutodiffOpInterface"> {
  let cppNamespace = "::mlir::pcc";
  let description = [{
    The reverse-mode rule of an op: given the gradients of its results, the
    gradients of its operands (a vector-Jacobian product), built as pcc ops.
    Each operand's gradient is a separate value, so a pass can place the
    gradients of weights apart from those of activations (the zero-bubble
    pipeline schedules' W and B). Ops without this interface are refused
    by pcc-autodiff, naming the ONNX node. Rules are attached as external
    models (lib/Dialect/Pcc/IR/AutodiffModels.cpp); a unit test checks each
    against finite differences in float64.
  }];
  let methods = [
    InterfaceMethod<[{
        Appends the forward values (operands or results of this op) that
        the rule reads: what the forward phase must keep for the backward
        one (saved activations). The rule reads no other forward value.
      }], "void", "getSavedValues",
      (ins "::llvm::SmallVectorImpl<::mlir::Value> &":$saved)>,
    InterfaceMethod<[{
        Builds the operand gradients at the builder's insertion point.
        `resultGrads` has one entry per result, null where the result has
        no gradient (zero). `needed` says, per operand, whether its gradient
        is wanted. `operandGrads` receives one entry per operand: null
        means zero, or an operand that is not differentiable (integers,
        booleans, indices). Fails, with an error on the op, where the rule
        does not cover the op's attributes.
      }], "::mlir::LogicalResult", "buildVjp",
      (ins "::mlir::OpBuilder &":$builder,
           "::llvm::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::ArrayRef<bool>":$needed,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

#endif // PCC_DIALECT_PCC_IR_PCCINTERFACES_TD
