//===- PccOps.td - pcc dialect operations ------------------*- tablegen -*-===//
//
// Ops are grouped by concern: values (params, constants), linear algebra,
// elementwise, normalisation, data movement, reductions, convolution and
// pooling, collectives, pipeline transfers; the training passes' ops and
// the fused kernels are in PccTrainingOps.td, included at the end. Every op's result type is inferred from its operands and
// attributes (InferTypeOpAdaptor or SameOperandsAndResultType), so the
// verifier and the importer share one shape-inference rule per op.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_PCCOPS_TD
#define PCC_DIALECT_PCC_IR_PCCOPS_TD

include "pcc/Dialect/Pcc/IR/PccBase.td"
include "pcc/Dialect/Pcc/IR/PccAttrs.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"

// Model state: the weights and the buffers named after them (gradients,
// optimizer moments, buckets, running statistics) that `pcc.param` reads by
// name and that live across calls of the model's phases. A `pcc.param` is
// a load of its state at its place in the block; the ops that update state
// in place store through their state operands. The effects say so, so no
// pass may move a load past a store of the same state (CSE does not merge
// two loads across a store), and the C++ back end, which reads a loaded
// value from the state's buffer without a copy, checks that no use of a
// load follows a store to its state (pcc::verifyStateOrder).
def Pcc_StateResource : Resource<"::mlir::pcc::StateResource">;

// A state operand that an op updates in place.
class Pcc_UpdatedState<string desc>
    : Arg<Pcc_FloatTensor, desc,
          [MemRead<Pcc_StateResource>, MemWrite<Pcc_StateResource>]>;
// A state operand that an op overwrites whole.
class Pcc_OverwrittenState<string desc>
    : Arg<Pcc_FloatTensor, desc, [MemWrite<Pcc_StateResource>]>;

// An op whose `axis` attribute names an axis of the module's pcc.mesh
// (pcc::MeshAxisUser in PccDialect.h): the module's verifier checks the
// name against the mesh, as it checks a symbol use.
def Pcc_MeshAxisUserTrait : NativeOpTrait<"MeshAxisUser"> {
  let cppNamespace = "::mlir::pcc";
}
def Pcc_MeshAxisUser
    : TraitList<[SymbolUserOpInterface, Pcc_MeshAxisUserTrait]>;

//===----------------------------------------------------------------------===//
// Values: parameters and constants
//===----------------------------------------------------------------------===//

def Pcc_MeshOp : Pcc_Op<"mesh", [Pcc_RunsWhole, Symbol,
                                 HasParent<"::mlir::ModuleOp">]> {
  let summary = "the device mesh: named axes and their sizes, in rank-grid order";
  let description = [{
    The module's device mesh (one per module, `@mesh`). Its axes are in the
    order of the rank grid, slowest first: the last varies fastest, so its
    groups are neighbouring ranks (`--mesh-order`; by default dp, pp, tp,
    which keeps tensor parallelism within a node). Collectives, shardings
    and `pcc.param` pieces name its axes; the model library's mesh table,
    and so the runtime's communicator groups, follow its order.

    ```mlir
    pcc.mesh @mesh [dp = 2, pp = 1, tp = 4]
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axes,
                       DenseI64ArrayAttr:$shape);
  let assemblyFormat = [{
    $sym_name custom<MeshAxes>($axes, $shape) attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The size of `axis`, or nullopt when the mesh has no such axis.
    std::optional<int64_t> getAxisSize(::llvm::StringRef axis);
  }];
}

def Pcc_ParamOp : Pcc_Op<"param", [Pcc_RunsWhole,
    MemoryEffects<[MemRead<Pcc_StateResource>]>]> {
  let summary = "a model weight, named after its ONNX initializer";
  let description = [{
    Reads the weight called `name` from the model's weight store. The data is
    not inlined into the IR: passes shard or move a weight by its name, and
    the back end reads only the slice each rank needs.

    ```mlir
    %w = pcc.param "encoder.layers.0.linear1.weight" : tensor<256x64xf32>
    ```

    After `pcc-partition`, `shard` says which slice of the stored weight this
    rank reads and the type is the local shape:

    ```mlir
    %w = pcc.param "h.0.attn.c_attn.weight" shard(#pcc.shard<tp, dim = 1, stripes = 3>)
        : tensor<64x96xf32>
    ```

    ZeRO shards model state flat over `dp` (`#pcc.shard<dp, flat>`); `of`
    then gives the whole tensor's shape, and the type is the rank's 1-D
    piece of the padded flattened tensor:

    ```mlir
    %m = pcc.param "fc1.weight@exp_avg" shard(#pcc.shard<dp, flat>) of [256, 64]
        : tensor<8192xf32>
    ```

    With tensor parallelism as well, the flat shard is of the rank's
    tensor-parallel piece: `within` is that split of the whole tensor
    (here rows [r * 128, (r + 1) * 128) on tp rank r, 8192 elements, a
    quarter of them on each of 4 dp ranks):

    ```mlir
    %m = pcc.param "fc1.weight@exp_avg" shard(#pcc.shard<dp, flat>) of [256, 64]
        within(#pcc.shard<tp, dim = 0>) : tensor<2048xf32>
    ```

    A `pcc.param` loads the state at its place: ops that update the state
    later do not change the loaded value (load the state again after them
    to read the update).
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<Pcc_ShardingAttr>:$shard,
                       OptionalAttr<DenseI64ArrayAttr>:$whole,
                       OptionalAttr<Pcc_ShardingAttr>:$within);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $name (`shard` `(` qualified($shard)^ `)`)? (`of` $whole^)?
    (`within` `(` qualified($within)^ `)`)? attr-dict `:` type($result)
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Type":$type, "::mlir::StringAttr":$name,
                   "::mlir::pcc::ShardingAttr":$shard), [{
      build($_builder, $_state, type, name, shard, ::mlir::DenseI64ArrayAttr(),
            ::mlir::pcc::ShardingAttr());
    }]>,
    OpBuilder<(ins "::mlir::Type":$type, "::mlir::StringAttr":$name,
                   "::mlir::pcc::ShardingAttr":$shard,
                   "::mlir::DenseI64ArrayAttr":$whole), [{
      build($_builder, $_state, type, name, shard, whole,
            ::mlir::pcc::ShardingAttr());
    }]>
  ];
  let hasVerifier = 1;
}

def Pcc_ConstantOp : Pcc_Op<"constant", [Pcc_RunsWhole, ConstantLike, Pure,
    AllTypesMatch<["value", "result"]>]> {
  let summary = "a small constant tensor";
  let description = [{
    Holds constants the importer folded (shape vectors, masks, scalars).
    Large weights are `pcc.param` instead.

    ```mlir
    %c = pcc.constant dense<[2, 16, 64]> : tensor<3xi64>
    ```
  }];
  let arguments = (ins ElementsAttr:$value);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = "attr-dict $value";
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

def Pcc_MatmulOp : Pcc_Op<"matmul", [Pure, SameOperandsElementType,
    InferTypeOpAdaptor]> {
  let summary = "batched matrix product with optional operand transposes";
  let description = [{
    Multiplies the trailing two dimensions of `lhs` and `rhs`
    (transposed first when `transpose_a` / `transpose_b` is set). `rhs` is
    either a matrix shared by every batch entry of `lhs` (the weight of a
    linear layer) or has exactly the batch dimensions of `lhs`; any other
    batch broadcast is made explicit with `pcc.broadcast` by the importer.
    ONNX `MatMul` and `Gemm` import to this op (Gemm's bias and scaling
    become `pcc.add` / `pcc.mul`).

    The result has the operands' element type, except that bf16 or f16
    operands may give an f32 result: the fp32 accumulator unrounded, to
    which mixed precision adds a linear layer's bias before rounding once
    (as PyTorch's `addmm` does under autocast).

    ```mlir
    %y = pcc.matmul %x, %w {transpose_b} : tensor<2x16x64xf32>, tensor<256x64xf32> -> tensor<2x16x256xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$lhs, Pcc_Tensor:$rhs,
                       UnitAttr:$transpose_a, UnitAttr:$transpose_b);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];  let hasCanonicalizer = 1;
  let extraClassDeclaration = [{
    /// The inferred type, or f32 in place of an inferred bf16 or f16.
    static bool isCompatibleReturnTypes(::mlir::TypeRange inferred,
                                        ::mlir::TypeRange actual);
  }];
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

class Pcc_UnaryOp<string mnemonic, string what,
                  Type tensorType = Pcc_FloatTensor, list<Trait> traits = []>
    : Pcc_Op<mnemonic, !listconcat([Pure, Elementwise,
                                    SameOperandsAndResultType], traits)> {
  let summary = "elementwise " # what;
  let description = [{
    Applies the function to every element; the result has the operand's type.

    ```mlir
    %y = pcc.}] # mnemonic # [{ %x : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins tensorType:$input);
  let results = (outs tensorType:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Pcc_NegOp : Pcc_UnaryOp<"neg", "negation", Pcc_Tensor>;
def Pcc_AbsOp : Pcc_UnaryOp<"abs", "absolute value", Pcc_Tensor>;
def Pcc_SqrtOp : Pcc_UnaryOp<"sqrt", "square root">;
def Pcc_ReciprocalOp : Pcc_UnaryOp<"reciprocal", "reciprocal 1/x">;
def Pcc_ExpOp : Pcc_UnaryOp<"exp", "exponential">;
def Pcc_LogOp : Pcc_UnaryOp<"log", "natural logarithm">;
def Pcc_ErfOp : Pcc_UnaryOp<"erf", "Gauss error function">;
def Pcc_TanhOp : Pcc_UnaryOp<"tanh", "hyperbolic tangent">;
def Pcc_SigmoidOp : Pcc_UnaryOp<"sigmoid", "logistic sigmoid 1/(1+exp(-x))">;
def Pcc_ReluOp : Pcc_UnaryOp<"relu", "rectified linear unit max(x, 0)">;
def Pcc_FloorOp : Pcc_UnaryOp<"floor", "rounding towards minus infinity">;
def Pcc_CeilOp : Pcc_UnaryOp<"ceil", "rounding towards plus infinity">;
def Pcc_SinOp : Pcc_UnaryOp<"sin", "sine">;
def Pcc_CosOp : Pcc_UnaryOp<"cos", "cosine">;
def Pcc_NotOp : Pcc_UnaryOp<"not", "logical negation", Pcc_BoolTensor>;

def Pcc_GeluOp : Pcc_Op<"gelu", [Pure, Elementwise,
                                 SameOperandsAndResultType]> {
  let summary = "elementwise Gaussian error linear unit";
  let description = [{
    `x * Phi(x)` with the exact erf form, or the tanh approximation when
    `tanh_approximation` is set. The importer recognises the decomposed
    forms exporters emit only when they arrive as an ONNX `Gelu` node.

    ```mlir
    %y = pcc.gelu %x {tanh_approximation} : tensor<2x256xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, UnitAttr:$tanh_approximation);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Pcc_LeakyReluOp : Pcc_Op<"leaky_relu", [Pure, Elementwise,
    SameOperandsAndResultType]> {
  let summary = "elementwise leaky ReLU: x if x >= 0 else alpha * x";
  let description = [{
    ```mlir
    %y = pcc.leaky_relu %x alpha = 1.000000e-01 : tensor<4xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, F32Attr:$alpha);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = "$input `alpha` `=` $alpha attr-dict `:` type($result)";
}

def Pcc_ClampOp : Pcc_Op<"clamp", [Pure, Elementwise,
                                   SameOperandsAndResultType]> {
  let summary = "elementwise clamp to [min, max]";
  let description = [{
    Bounds are attributes: ONNX `Clip` bounds must be constants.

    ```mlir
    %y = pcc.clamp %x min = 0.000000e+00 max = 6.000000e+00 : tensor<4xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, F64Attr:$min, F64Attr:$max);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $input `min` `=` $min `max` `=` $max attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

class Pcc_BinaryOp<string mnemonic, string what,
                   Type tensorType = Pcc_Tensor, list<Trait> traits = []>
    : Pcc_Op<mnemonic, !listconcat([Pure, Elementwise,
                                    SameOperandsAndResultType], traits)> {
  let summary = "elementwise " # what;
  let description = [{
    Both operands have the result's type: the importer makes ONNX
    broadcasting explicit with `pcc.broadcast` first.

    ```mlir
    %z = pcc.}] # mnemonic # [{ %x, %y : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins tensorType:$lhs, tensorType:$rhs);
  let results = (outs tensorType:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Pcc_AddOp : Pcc_BinaryOp<"add", "addition", Pcc_Tensor, [Commutative]> {
  let hasFolder = 1;
}
def Pcc_SubOp : Pcc_BinaryOp<"sub", "subtraction"> {
  let hasFolder = 1;
}
def Pcc_MulOp : Pcc_BinaryOp<"mul", "multiplication", Pcc_Tensor,
                             [Commutative]> {
  let hasFolder = 1;
}
def Pcc_DivOp : Pcc_BinaryOp<"div", "division (truncating for integers)"> {
  let hasFolder = 1;
}
def Pcc_PowOp : Pcc_BinaryOp<"pow", "power lhs^rhs">;
def Pcc_MaxOp : Pcc_BinaryOp<"max", "maximum", Pcc_Tensor, [Commutative]>;
def Pcc_MinOp : Pcc_BinaryOp<"min", "minimum", Pcc_Tensor, [Commutative]>;
def Pcc_AndOp : Pcc_BinaryOp<"and", "logical and", Pcc_BoolTensor,
                             [Commutative]>;
def Pcc_OrOp : Pcc_BinaryOp<"or", "logical or", Pcc_BoolTensor,
                            [Commutative]>;
def Pcc_XorOp : Pcc_BinaryOp<"xor", "logical exclusive or", Pcc_BoolTensor,
                             [Commutative]>;

def Pcc_ModOp : Pcc_BinaryOp<"mod", "remainder (ONNX Mod)"> {
  let description = [{
    Without `fmod`, the remainder takes the sign of the divisor (Python's
    `%`, ONNX Mod with fmod = 0, integers only in ONNX); with `fmod`, the
    sign of the dividend (C's `fmod`). A zero integer divisor gives 0.

    ```mlir
    %r = pcc.mod %x, %y {fmod} : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$lhs, Pcc_Tensor:$rhs, UnitAttr:$fmod);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

class Pcc_FloatTestOp<string mnemonic, string what, dag extraArgs = (ins)>
    : Pcc_Op<mnemonic, [Pure, Elementwise,
                        AllShapesMatch<["input", "result"]>]> {
  let summary = "elementwise test: " # what;
  let arguments = !con((ins Pcc_FloatTensor:$input), extraArgs);
  let results = (outs Pcc_BoolTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
}

def Pcc_IsNaNOp : Pcc_FloatTestOp<"is_nan", "whether an element is NaN"> {
  let description = [{
    Exporters test softmax outputs with it (`Where(IsNaN(Softmax(s)), 0,
    Softmax(s))`); canonicalisation turns that pattern into one softmax
    with `nan_to_zero`, so no NaN scan runs.

    ```mlir
    %m = pcc.is_nan %x : tensor<4x8xf32> -> tensor<4x8xi1>
    ```
  }];
}

def Pcc_IsInfOp : Pcc_FloatTestOp<"is_inf", "whether an element is infinite",
    (ins DefaultValuedAttr<BoolAttr, "true">:$detect_positive,
         DefaultValuedAttr<BoolAttr, "true">:$detect_negative)> {
  let description = [{
    True for +inf when `detect_positive`, for -inf when `detect_negative`.

    ```mlir
    %m = pcc.is_inf %x {detect_negative = false} : tensor<4x8xf32> -> tensor<4x8xi1>
    ```
  }];
}

def Pcc_CompareOp : Pcc_Op<"compare", [Pure, Elementwise, SameTypeOperands,
    InferTypeOpAdaptor]> {
  let summary = "elementwise comparison producing a boolean tensor";
  let description = [{
    ```mlir
    %m = pcc.compare lt, %a, %b : tensor<16x16xi64>
    ```
  }];
  let arguments = (ins Pcc_ComparePredicate:$predicate, Pcc_Tensor:$lhs,
                       Pcc_Tensor:$rhs);
  let results = (outs Pcc_BoolTensor:$result);
  let assemblyFormat = "$predicate `,` $lhs `,` $rhs attr-dict `:` type($lhs)";
  let hasFolder = 1;
}

def Pcc_SelectOp : Pcc_Op<"select", [Pure, Elementwise,
    AllTypesMatch<["true_value", "false_value", "result"]>,
    AllShapesMatch<["condition", "result"]>]> {
  let summary = "elementwise choice between two tensors (ONNX Where)";
  let description = [{
    ```mlir
    %y = pcc.select %mask, %x, %neg_inf : tensor<16x16xi1>, tensor<16x16xf32>
    ```
  }];
  let arguments = (ins Pcc_BoolTensor:$condition, Pcc_Tensor:$true_value,
                       Pcc_Tensor:$false_value);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $condition `,` $true_value `,` $false_value attr-dict `:`
    type($condition) `,` type($result)
  }];
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Pcc_CastOp : Pcc_Op<"cast", [Pure, AllShapesMatch<["input", "result"]>]> {
  let summary = "elementwise conversion to another element type";
  let description = [{
    Floats convert to integers by truncation towards zero; any non-zero value
    converts to `true` for `i1`.

    ```mlir
    %y = pcc.cast %x : tensor<4xi64> -> tensor<4xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Fusion
//===----------------------------------------------------------------------===//

def Pcc_FusionOp : Pcc_Op<"fusion", [Pcc_RunsWhole, IsolatedFromAbove,
    RecursiveMemoryEffects, RecursivelySpeculatable,
    SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "elementwise ops computed together in one loop";
  let description = [{
    Made by `pcc-fuse-elementwise`. The body holds elementwise ops,
    broadcasts of the inputs to the iteration shape and splat constants; every
    result has the iteration shape. The back end emits it as one loop that
    reads each input once per element (broadcast inputs through index
    arithmetic) and writes only the results.

    ```mlir
    %y = pcc.fusion (%x, %bias) : (tensor<2x64xf32>, tensor<64xf32>) -> tensor<2x64xf32> {
    ^bb0(%a: tensor<2x64xf32>, %b: tensor<64xf32>):
      %bb = pcc.broadcast %b : tensor<64xf32> -> tensor<2x64xf32>
      %s = pcc.add %a, %bb : tensor<2x64xf32>
      %r = pcc.relu %s : tensor<2x64xf32>
      pcc.yield %r : tensor<2x64xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<Pcc_Tensor>:$inputs);
  let results = (outs Variadic<Pcc_Tensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` attr-dict `:` functional-type($inputs, $results) $body
  }];
  let hasVerifier = 1;
}

def Pcc_YieldOp : Pcc_Op<"yield", [Pcc_RunsWhole, Pure, Terminator,
                                   HasParent<"FusionOp">]> {
  let summary = "the results of a pcc.fusion";
  let arguments = (ins Variadic<Pcc_Tensor>:$values);
  let assemblyFormat = "$values attr-dict `:` type($values)";
  let builders = [OpBuilder<(ins), [{ /* empty yield */ }]>];
}

//===----------------------------------------------------------------------===//
// Normalisation and softmax
//===----------------------------------------------------------------------===//

class Pcc_SoftmaxLikeOp<string mnemonic, string what>
    : Pcc_Op<mnemonic, [Pure, SameOperandsAndResultType]> {
  let summary = what # " along one axis";
  let description = [{
    `axis` is in `[0, rank)`; the importer normalises negative ONNX axes.
    With `nan_to_zero`, NaN results (a row whose every entry is -inf, as
    an attention row that masks every key) are 0 instead.

    ```mlir
    %p = pcc.}] # mnemonic # [{ %logits axis = 2 : tensor<2x16x512xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, I64Attr:$axis,
                       UnitAttr:$nan_to_zero);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = "$input `axis` `=` $axis attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Pcc_SoftmaxOp : Pcc_SoftmaxLikeOp<"softmax", "softmax">;
def Pcc_LogSoftmaxOp : Pcc_SoftmaxLikeOp<"log_softmax", "log-softmax">;

def Pcc_LayerNormOp : Pcc_Op<"layer_norm", [Pure,
    AllTypesMatch<["input", "result"]>]> {
  let summary = "layer normalisation over the trailing dimensions from axis";
  let description = [{
    Normalises over dimensions `[axis, rank)` and applies `scale` (and
    `bias`, when present), both shaped like those dimensions.

    ```mlir
    %y = pcc.layer_norm %x, %gamma, %beta axis = 2 epsilon = 9.99999974E-6
        : tensor<2x16x64xf32>, tensor<64xf32>, tensor<64xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, Pcc_FloatTensor:$scale,
                       Optional<Pcc_FloatTensor>:$bias, I64Attr:$axis,
                       F32Attr:$epsilon);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $scale (`,` $bias^)? `axis` `=` $axis `epsilon` `=` $epsilon
    attr-dict `:` type($input) `,` type($scale) (`,` type($bias)^)?
  }];
  let hasVerifier = 1;
}

def Pcc_BatchNormOp : Pcc_Op<"batch_norm", [Pure,
    AllTypesMatch<["input", "result"]>,
    AllTypesMatch<["scale", "bias", "mean", "variance"]>]> {
  let summary = "batch normalisation in inference mode";
  let description = [{
    `(x - mean) / sqrt(variance + epsilon) * scale + bias` over the channel
    dimension 1; the four vectors have one entry per channel. `momentum`
    (ONNX's, 0.9 when absent) only matters when pcc trains the model:
    `pcc-train-mode` rewrites the op to batch statistics and updates the
    running ones with it.

    ```mlir
    %y = pcc.batch_norm %x, %s, %b, %m, %v epsilon = 9.99999974E-6
        : tensor<2x8x16x16xf32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, Pcc_FloatTensor:$scale,
                       Pcc_FloatTensor:$bias, Pcc_FloatTensor:$mean,
                       Pcc_FloatTensor:$variance, F32Attr:$epsilon,
                       OptionalAttr<F32Attr>:$momentum);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $scale `,` $bias `,` $mean `,` $variance `epsilon` `=` $epsilon
    attr-dict `:` type($input) `,` type($scale)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

def Pcc_ReshapeOp : Pcc_Op<"reshape", [Pure, SameOperandsAndResultElementType]> {
  let summary = "reinterprets a tensor with another static shape";
  let description = [{
    Row-major order is kept; the element counts match. ONNX `Reshape`,
    `Flatten`, `Squeeze` and `Unsqueeze` all import to this op.

    ```mlir
    %y = pcc.reshape %x : tensor<2x16x64xf32> -> tensor<2x16x4x16xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Pcc_TransposeOp : Pcc_Op<"transpose", [Pure, InferTypeOpAdaptor]> {
  let summary = "permutes dimensions";
  let description = [{
    Result dimension `i` is input dimension `permutation[i]`.

    ```mlir
    %y = pcc.transpose %x [0, 2, 1, 3] : tensor<2x16x4x16xf32> -> tensor<2x4x16x16xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $input $permutation attr-dict `:` type($input) `->` type($result)
  }];
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Pcc_BroadcastOp : Pcc_Op<"broadcast", [Pure,
    SameOperandsAndResultElementType]> {
  let summary = "numpy-style broadcast to a larger static shape";
  let description = [{
    Dimensions are aligned from the right; each input dimension equals the
    result's or is 1. Implements ONNX implicit broadcasting and `Expand`.

    ```mlir
    %b = pcc.broadcast %bias : tensor<64xf32> -> tensor<2x16x64xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Pcc_ConcatOp : Pcc_Op<"concat", [Pure, SameOperandsAndResultElementType,
    InferTypeOpAdaptor]> {
  let summary = "joins tensors along one axis";
  let description = [{
    ```mlir
    %y = pcc.concat %a, %b axis = 1 : tensor<2x3xf32>, tensor<2x5xf32> -> tensor<2x8xf32>
    ```
  }];
  let arguments = (ins Variadic<Pcc_Tensor>:$inputs, I64Attr:$axis);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $inputs `axis` `=` $axis attr-dict `:` type($inputs) `->` type($result)
  }];
}

def Pcc_SplitOp : Pcc_Op<"split", [Pure, InferTypeOpAdaptor]> {
  let summary = "splits a tensor into consecutive pieces along one axis";
  let description = [{
    Piece `i` has `sizes[i]` entries along `axis`; the sizes add up to the
    input's dimension. Used for the fused QKV projections exporters emit.

    ```mlir
    %q, %k, %v = pcc.split %qkv axis = 2 sizes = [64, 64, 64]
        : tensor<2x16x192xf32> -> tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x16x64xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, I64Attr:$axis,
                       DenseI64ArrayAttr:$sizes);
  let results = (outs Variadic<Pcc_Tensor>:$results);
  let assemblyFormat = [{
    $input `axis` `=` $axis `sizes` `=` $sizes attr-dict `:` type($input)
    `->` type($results)
  }];
}

def Pcc_SliceOp : Pcc_Op<"slice", [Pure, InferTypeOpAdaptor]> {
  let summary = "strided slice with static bounds";
  let description = [{
    Along dimension `d`, takes indices `start[d], start[d] + step[d], ...`
    while they are before `limit[d]` (after, for a negative step). The
    importer clamps ONNX's out-of-range bounds, so `0 <= start < dim` and
    `-1 <= limit <= dim` hold.

    ```mlir
    %y = pcc.slice %x starts = [0, 8] limits = [2, 16] steps = [1, 2]
        : tensor<2x16xf32> -> tensor<2x4xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, DenseI64ArrayAttr:$starts,
                       DenseI64ArrayAttr:$limits, DenseI64ArrayAttr:$steps);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $input `starts` `=` $starts `limits` `=` $limits `steps` `=` $steps
    attr-dict `:` type($input) `->` type($result)
  }];
  let hasFolder = 1;
}

def Pcc_GatherOp : Pcc_Op<"gather", [Pure, InferTypeOpAdaptor]> {
  let summary = "takes slices of data at the given indices along one axis";
  let description = [{
    The result's shape is `data.shape[:axis] + indices.shape +
    data.shape[axis+1:]`. Negative indices count from the end, as in ONNX.
    With `axis = 0` this is an embedding lookup.

    ```mlir
    %e = pcc.gather %table[%ids] axis = 0 : tensor<512x64xf32>, tensor<2x16xi64> -> tensor<2x16x64xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$data, Pcc_IndexTensor:$indices,
                       I64Attr:$axis);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $data `[` $indices `]` `axis` `=` $axis attr-dict `:` type($data) `,`
    type($indices) `->` type($result)
  }];
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

class Pcc_ReduceOp<string mnemonic, string what, Type tensorType = Pcc_Tensor>
    : Pcc_Op<mnemonic, [Pure, SameOperandsAndResultElementType,
                        InferTypeOpAdaptor]> {
  let summary = what # " over the given axes";
  let description = [{
    `axes` are distinct and in `[0, rank)`. With `keep_dims` the reduced
    dimensions stay as size 1.

    ```mlir
    %s = pcc.}] # mnemonic # [{ %x axes = [1] {keep_dims} : tensor<2x64xf32> -> tensor<2x1xf32>
    ```
  }];
  let arguments = (ins tensorType:$input, DenseI64ArrayAttr:$axes,
                       UnitAttr:$keep_dims);
  let results = (outs tensorType:$result);
  let assemblyFormat = [{
    $input `axes` `=` $axes attr-dict `:` type($input) `->` type($result)
  }];
}

def Pcc_ReduceSumOp : Pcc_ReduceOp<"reduce_sum", "sum">;
def Pcc_ReduceMeanOp : Pcc_ReduceOp<"reduce_mean", "mean", Pcc_FloatTensor>;
def Pcc_ReduceMaxOp : Pcc_ReduceOp<"reduce_max", "maximum">;
def Pcc_ReduceMinOp : Pcc_ReduceOp<"reduce_min", "minimum">;
def Pcc_ReduceProdOp : Pcc_ReduceOp<"reduce_prod", "product">;

def Pcc_ArgMaxOp : Pcc_Op<"argmax", [Pure, InferTypeOpAdaptor]> {
  let summary = "index of the first maximum along one axis";
  let description = [{
    ```mlir
    %i = pcc.argmax %logits axis = 2 : tensor<2x16x512xf32> -> tensor<2x16xi64>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, I64Attr:$axis, UnitAttr:$keep_dims);
  let results = (outs StaticShapeTensorOf<[I64]>:$result);
  let assemblyFormat = [{
    $input `axis` `=` $axis attr-dict `:` type($input) `->` type($result)
  }];
}

//===----------------------------------------------------------------------===//
// Convolution and pooling (NC + spatial layout, 1 to 3 spatial dimensions)
//===----------------------------------------------------------------------===//

def Pcc_ConvOp : Pcc_Op<"conv", [Pure, InferTypeOpAdaptor,
    SameOperandsElementType]> {
  let summary = "grouped N-d convolution (cross-correlation) with bias";
  let description = [{
    `input` is `N x C x D1 ... Dk`, `weight` is `M x C/groups x K1 ... Kk`
    and the optional `bias` has `M` entries. `pads` holds the `k` leading
    pads then the `k` trailing pads.

    ```mlir
    %y = pcc.conv %x, %w, %b strides = [1, 1] pads = [1, 1, 1, 1]
        dilations = [1, 1] groups = 1
        : tensor<2x3x32x32xf32>, tensor<8x3x3x3xf32>, tensor<8xf32> -> tensor<2x8x32x32xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, Pcc_FloatTensor:$weight,
                       Optional<Pcc_FloatTensor>:$bias,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, I64Attr:$groups);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? `strides` `=` $strides `pads` `=` $pads
    `dilations` `=` $dilations `groups` `=` $groups attr-dict `:`
    type($input) `,` type($weight) (`,` type($bias)^)? `->` type($result)
  }];
}

class Pcc_PoolOp<string mnemonic, string what, dag extraArgs,
                 Type tensorType = Pcc_FloatTensor>
    : Pcc_Op<mnemonic, [Pure, SameOperandsAndResultElementType,
                        InferTypeOpAdaptor]> {
  let summary = what # " pooling over the spatial dimensions";
  let arguments = !con((ins tensorType:$input,
                            DenseI64ArrayAttr:$kernel_shape,
                            DenseI64ArrayAttr:$strides,
                            DenseI64ArrayAttr:$pads,
                            DenseI64ArrayAttr:$dilations,
                            UnitAttr:$ceil_mode), extraArgs);
  let results = (outs tensorType:$result);
  let assemblyFormat = [{
    $input `kernel` `=` $kernel_shape `strides` `=` $strides `pads` `=` $pads
    `dilations` `=` $dilations attr-dict `:` type($input) `->` type($result)
  }];
}

def Pcc_MaxPoolOp : Pcc_PoolOp<"max_pool", "maximum", (ins), Pcc_Tensor> {
  let description = [{
    Padded positions never win. With `ceil_mode` the output size rounds up.

    ```mlir
    %y = pcc.max_pool %x kernel = [3, 3] strides = [2, 2] pads = [1, 1, 1, 1]
        dilations = [1, 1] : tensor<2x8x32x32xf32> -> tensor<2x8x16x16xf32>
    ```
  }];
}

def Pcc_AvgPoolOp : Pcc_PoolOp<"avg_pool", "average",
                               (ins UnitAttr:$count_include_pad)> {
  let description = [{
    Divides by the window size including padded positions when
    `count_include_pad` is set, else by the number of real positions.
    ONNX `GlobalAveragePool` imports to `pcc.reduce_mean` instead.

    ```mlir
    %y = pcc.avg_pool %x kernel = [2, 2] strides = [2, 2] pads = [0, 0, 0, 0]
        dilations = [1, 1] : tensor<2x8x32x32xf32> -> tensor<2x8x16x16xf32>
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Collectives over a named mesh axis (see PccAttrs.td for the layouts)
//===----------------------------------------------------------------------===//

// Collectives have no traits: every rank must run the same ones in the same
// order, so no pass may drop, hoist or merge one on its own.

def Pcc_AllReduceOp : Pcc_Op<"all_reduce", [Pcc_MeshAxisUser, Pcc_RunsWhole,
                                            SameOperandsAndResultType]> {
  let summary = "sums a tensor over the ranks of one mesh axis";
  let description = [{
    Turns a `partial` tensor into a replicated one: every rank of the group
    gets the elementwise sum of all ranks' inputs (ncclAllReduce or
    MPI_Allreduce).

    ```mlir
    %y = pcc.all_reduce %p axis = "tp" : tensor<32x64xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, StrAttr:$axis);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = "$input `axis` `=` $axis attr-dict `:` type($input)";
}

def Pcc_AllGatherOp : Pcc_Op<"all_gather", [Pcc_MeshAxisUser, Pcc_RunsWhole]> {
  let summary = "stacks every rank's tensor along a new leading dimension";
  let description = [{
    The result's leading dimension is the size of the mesh axis, and slice r
    is rank r's input (ncclAllGather or MPI_Allgather). `pcc-partition`
    follows it with the transpose and reshape that put a split dimension
    back together.

    ```mlir
    %g = pcc.all_gather %x axis = "tp" : tensor<2x16xf32> -> tensor<4x2x16xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, StrAttr:$axis);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $input `axis` `=` $axis attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = [{
    /// The checks that need the size of the mesh axis (MeshAxisUser).
    ::mlir::LogicalResult verifyAxisSize(int64_t size);
  }];
}

def Pcc_ReduceScatterOp : Pcc_Op<"reduce_scatter", [
    Pcc_MeshAxisUser, Pcc_RunsWhole]> {
  let summary = "sums stacked tensors over the ranks and keeps this rank's slice";
  let description = [{
    The input's leading dimension is the size of the mesh axis. Rank r gets
    the sum over all ranks of their slice r (ncclReduceScatter or
    MPI_Reduce_scatter_block): a `partial` tensor becomes a split one.

    ```mlir
    %s = pcc.reduce_scatter %p axis = "tp" : tensor<4x2x16xf32> -> tensor<2x16xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, StrAttr:$axis);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `axis` `=` $axis attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = [{
    /// The checks that need the size of the mesh axis (MeshAxisUser).
    ::mlir::LogicalResult verifyAxisSize(int64_t size);
  }];
}

def Pcc_ShardSliceOp : Pcc_Op<"shard_slice", [
    Pcc_MeshAxisUser, Pcc_RunsWhole, Pure]> {
  let summary = "this rank's slice of a replicated tensor";
  let description = [{
    Takes the part of a whole tensor that `#pcc.shard<axis, dim, stripes>`
    gives this rank; no communication. `pcc-partition` slices weights and
    constants where they are defined and uses this op only for computed
    values.

    ```mlir
    %s = pcc.shard_slice %x axis = "tp" dim = 1 stripes = 1
        : tensor<2x64xf32> -> tensor<2x16xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, StrAttr:$axis, I64Attr:$dim,
                       I64Attr:$stripes);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $input `axis` `=` $axis `dim` `=` $dim `stripes` `=` $stripes attr-dict
    `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
  let extraClassDeclaration = [{
    /// The checks that need the size of the mesh axis (MeshAxisUser).
    ::mlir::LogicalResult verifyAxisSize(int64_t size);
  }];
}

def Pcc_ShardGatherOp : Pcc_Op<"shard_gather", [Pcc_MeshAxisUser,
    Pcc_RunsWhole, Pure]> {
  let summary = "a gather from this rank's block of a table split on its axis";
  let description = [{
    `data` is this rank's block of a table whose dimension `axis` is split
    over mesh axis `mesh_axis` (`#pcc.shard<mesh_axis, dim = axis>`): rank r
    holds entries `[r * n, (r + 1) * n)` of the whole dimension of size
    `n * ranks`. Indices are into the whole dimension (negative ones count
    from its end); an index that falls in another rank's block gives zeros.
    The result is therefore a partial sum over the mesh axis, and an
    all-reduce makes it the whole gather. This is the vocabulary-parallel
    embedding lookup of Megatron-LM; `pcc-partition` makes it from a
    `pcc.gather` whose table the plan splits on the gathered axis.

    ```mlir
    %e = pcc.shard_gather %table[%ids] axis = 0 mesh_axis = "tp"
        : tensor<256x64xf32>, tensor<2x16xi64> -> tensor<2x16x64xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$data, Pcc_IndexTensor:$indices,
                       I64Attr:$axis, StrAttr:$mesh_axis);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $data `[` $indices `]` `axis` `=` $axis `mesh_axis` `=` $mesh_axis
    attr-dict `:` type($data) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Pipeline stages
//===----------------------------------------------------------------------===//

def Pcc_TransferOp : Pcc_Op<"transfer", [Pcc_RunsWhole, Pure,
                                         SameOperandsAndResultType]> {
  let summary = "moves a tensor from one pipeline stage to a later one";
  let description = [{
    After `pcc-pipeline-cut`, `@main` calls one function per stage (marked
    `pcc.stage = k`) and connects them with transfers: the value computed
    by stage `from` becomes an input of stage `to`. The runtime turns a
    transfer into a send on the ranks of stage `from` and a receive on those
    of stage `to`, once per micro-batch, in the order the schedule gives.

    ```mlir
    %h = func.call @stage0(%ids) : (tensor<1x16xi64>) -> tensor<1x16x64xf32>
    %r = pcc.transfer %h from 0 to 1 : tensor<1x16x64xf32>
    %y = func.call @stage1(%r) : (tensor<1x16x64xf32>) -> tensor<1x16x512xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, I64Attr:$from, I64Attr:$to);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $input `from` $from `to` $to attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

include "pcc/Dialect/Pcc/IR/PccTrainingOps.td"

#endif // PCC_DIALECT_PCC_IR_PCCOPS_TD
