//===- Passes.td - pcc transformation passes ---------------*- tablegen -*-===//

#ifndef PCC_TRANSFORMS_PASSES_TD
#define PCC_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def ModelStats : Pass<"pcc-model-stats", "func::FuncOp"> {
  let summary = "counts ops, weights and the FLOPs of matmuls and convolutions";
  let description = [{
    An analysis pass: it changes nothing and reports, as pass statistics
    (`--mlir-pass-statistics`) and, with `emit-remark`, as a remark on the
    function, what the cost model and the partitioner start from: the number
    of pcc ops, of distinct weights (`pcc.param` names) and their bytes, and
    the multiply-add FLOPs of `pcc.matmul` and `pcc.conv` (2 per MAC).

    ```mlir
    func.func @main(%x: tensor<2x64xf32>) -> tensor<2x256xf32> {
      %w = pcc.param "fc.weight" : tensor<256x64xf32>
      %y = pcc.matmul %x, %w {transpose_b} : tensor<2x64xf32>, tensor<256x64xf32> -> tensor<2x256xf32>
      return %y : tensor<2x256xf32>
    }
    // remark: 2 ops, 1 weights (65536 bytes), 65536 FLOPs
    ```
  }];
  let options = [
    Option<"emitRemark", "emit-remark", "bool", /*default=*/"false",
           "attach a remark with the summary to each function">
  ];
  let statistics = [
    Statistic<"numOps", "ops", "pcc ops in the function">,
    Statistic<"numWeights", "weights", "distinct weights (pcc.param names)">,
    Statistic<"weightBytes", "weight-bytes", "bytes of the distinct weights">,
    Statistic<"flops", "flops", "FLOPs of matmuls and convolutions">
  ];
}

#endif // PCC_TRANSFORMS_PASSES_TD
