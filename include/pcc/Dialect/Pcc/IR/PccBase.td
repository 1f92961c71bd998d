//===- PccBase.td - pcc dialect definition and shared types -*- tablegen -*-===//
//
// The pcc dialect: tensor-level ops on statically shaped ranked tensors, with
// value semantics, covering what exported transformer, MLP and CNN models use.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_PCCBASE_TD
#define PCC_DIALECT_PCC_IR_PCCBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/CommonTypeConstraints.td"
include "mlir/IR/CommonAttrConstraints.td"

def Pcc_Dialect : Dialect {
  let name = "pcc";
  let cppNamespace = "::mlir::pcc";
  let summary = "tensor-level ops of the pcc auto-partitioning compiler";
  let description = [{
    The pcc dialect holds an imported model as a function of statically shaped
    ranked tensors. Weights are `pcc.param` ops that name the ONNX initializer
    they come from, so that later passes can shard them by name; small
    integer or scalar constants are `pcc.constant`. Broadcasting is always
    explicit (`pcc.broadcast`): elementwise ops take operands of one shape.
  }];
  let hasConstantMaterializer = 1;
  let useDefaultAttributePrinterParser = 1;
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    /// The module attributes that held the mesh before `pcc.mesh` became an
    /// op; the verifier names the op when it meets them.
    static constexpr ::llvm::StringLiteral kMeshAttrName = "pcc.mesh";
    static constexpr ::llvm::StringLiteral kMeshOrderAttrName =
        "pcc.mesh_order";
    /// Per-result shardings chosen by the planner (`pcc.sharding`).
    static constexpr ::llvm::StringLiteral kShardingAttrName = "pcc.sharding";
    /// Model chunks per pipeline rank of a cut module (`pcc.pp_chunks`;
    /// 1 when absent): the program has pp x chunks stages, and rank r runs
    /// stages r, r + pp, r + 2 pp, ... (the interleaved schedule).
    static constexpr ::llvm::StringLiteral kPipelineChunksAttrName =
        "pcc.pp_chunks";
  }];
}

class Pcc_Op<string mnemonic, list<Trait> traits = []>
    : Op<Pcc_Dialect, mnemonic, traits>;

// An op that every parallel plan runs on whole tensors (pcc::RunsWhole
// in PccDialect.h): the sharding interface's generic model is attached
// only to these and to Elementwise ops; every other op needs a rule.
def Pcc_RunsWhole : NativeOpTrait<"RunsWhole"> {
  let cppNamespace = "::mlir::pcc";
}

// Element types pcc handles. Signed ONNX integers map to signless MLIR
// integers; uint8 keeps its sign for quantised inputs.
def Pcc_ElementType : AnyTypeOf<[F16, BF16, F32, F64, I1, I8, I16, I32, I64,
                                 UI8]>;
def Pcc_FloatElementType : AnyTypeOf<[F16, BF16, F32, F64]>;
def Pcc_IndexElementType : AnyTypeOf<[I32, I64]>;

def Pcc_Tensor : StaticShapeTensorOf<[Pcc_ElementType]>;
def Pcc_FloatTensor : StaticShapeTensorOf<[Pcc_FloatElementType]>;
def Pcc_BoolTensor : StaticShapeTensorOf<[I1]>;
def Pcc_IndexTensor : StaticShapeTensorOf<[Pcc_IndexElementType]>;

def Pcc_ComparePredicate : I64EnumAttr<
    "ComparePredicate", "elementwise comparison predicate", [
      I64EnumAttrCase<"eq", 0>,
      I64EnumAttrCase<"ne", 1>,
      I64EnumAttrCase<"lt", 2>,
      I64EnumAttrCase<"le", 3>,
      I64EnumAttrCase<"gt", 4>,
      I64EnumAttrCase<"ge", 5>
    ]> {
  let cppNamespace = "::mlir::pcc";
}

#endif // PCC_DIALECT_PCC_IR_PCCBASE_TD
