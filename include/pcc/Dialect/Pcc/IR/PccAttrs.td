//===- PccAttrs.td - pcc dialect attributes ----------------*- tablegen -*-===//
//
// How a tensor is laid out over one axis of the device mesh. The mesh itself
// is the module attribute `pcc.mesh = {dp = 1, pp = 1, tp = 4}`: named axes
// and their sizes.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_PCCATTRS_TD
#define PCC_DIALECT_PCC_IR_PCCATTRS_TD

include "pcc/Dialect/Pcc/IR/PccBase.td"

def Pcc_ShardKind : I64EnumAttr<"ShardKind", "how a tensor lies on a mesh axis",
    [
      I64EnumAttrCase<"replicated", 0>,
      I64EnumAttrCase<"split", 1>,
      I64EnumAttrCase<"partial", 2>,
      I64EnumAttrCase<"flat", 3>
    ]> {
  let cppNamespace = "::mlir::pcc";
}

def Pcc_ShardingAttr : AttrDef<Pcc_Dialect, "Sharding"> {
  let mnemonic = "shard";
  let summary = "the layout of a tensor over one named mesh axis";
  let description = [{
    - `#pcc.shard<replicated>`: every rank holds the whole tensor.
    - `#pcc.shard<tp, dim = 1, stripes = 3>`: dimension 1 is viewed as
      `[stripes, n, chunk]` (n the size of mesh axis `tp`), and rank r holds
      chunk r of every stripe. One stripe is the usual contiguous split.
      Several stripes keep a fused projection's pieces local: the columns
      of a fused QKV weight `[d, 3d]` split with `stripes = 3` give each rank
      the same heads of q, k and v. A stripe survives the reshapes that
      split heads, which is how a split of the hidden dimension becomes a
      split of the heads.
    - `#pcc.shard<tp, partial>`: every rank holds a full-shape addend; the
      tensor is their sum (the output of a matmul whose contraction is
      split), made whole by an all-reduce.
    - `#pcc.shard<dp, flat>`: ZeRO's layout of model state. The tensor is
      flattened (row-major), padded with zeros to `n * s` elements (n the
      size of mesh axis `dp`, `s = ceil(elements / n)`), and rank r holds
      elements `[r * s, (r + 1) * s)` as a 1-D tensor. Any tensor shards
      this way whatever its shape (a 50,257-row vocabulary over dp = 8), and
      an all-gather of the shards, sliced to the element count, is the
      whole tensor again.
  }];
  let parameters = (ins "::mlir::pcc::ShardKind":$kind,
                        StringRefParameter<"mesh axis">:$axis,
                        "int64_t":$dim, "int64_t":$stripes);
  let hasCustomAssemblyFormat = 1;
  let extraClassDeclaration = [{
    static ShardingAttr replicated(::mlir::MLIRContext *context) {
      return get(context, ShardKind::replicated, "", -1, 0);
    }
    static ShardingAttr split(::mlir::MLIRContext *context,
                              ::llvm::StringRef axis, int64_t dim,
                              int64_t stripes = 1) {
      return get(context, ShardKind::split, axis, dim, stripes);
    }
    static ShardingAttr partial(::mlir::MLIRContext *context,
                                ::llvm::StringRef axis) {
      return get(context, ShardKind::partial, axis, -1, 0);
    }
    bool isReplicated() const { return getKind() == ShardKind::replicated; }
    bool isSplit() const { return getKind() == ShardKind::split; }
    bool isPartial() const { return getKind() == ShardKind::partial; }
    static ShardingAttr flat(::mlir::MLIRContext *context,
                             ::llvm::StringRef axis) {
      return get(context, ShardKind::flat, axis, -1, 0);
    }
    bool isFlat() const { return getKind() == ShardKind::flat; }
  }];
}

#endif // PCC_DIALECT_PCC_IR_PCCATTRS_TD
