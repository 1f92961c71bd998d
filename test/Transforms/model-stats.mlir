// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-model-stats{emit-remark=true}))' --verify-diagnostics -o /dev/null

// Debian's LLVM is built without LLVM_ENABLE_STATS, so pass statistics print
// nothing there; the remark carries the same numbers.

// Tests the op, weight and FLOP counts: a 2x64 by 64x256 matmul is
// 2*2*64*256 = 65536 FLOPs, a 1x3x8x8 conv with 4x3x3x3 weights and a 6x6
// output is 2*(4*6*6)*(3*3*3) = 7776 FLOPs; the weight read twice counts once.
// expected-remark @below {{5 ops, 2 weights (65968 bytes), 73312 FLOPs}}
func.func @main(%x: tensor<2x64xf32>, %img: tensor<1x3x8x8xf32>) -> (tensor<2x256xf32>, tensor<1x4x6x6xf32>) {
  %w = pcc.param "fc.weight" : tensor<256x64xf32>
  %y = pcc.matmul %x, %w {transpose_b} : tensor<2x64xf32>, tensor<256x64xf32> -> tensor<2x256xf32>
  %k = pcc.param "conv.weight" : tensor<4x3x3x3xf32>
  %k2 = pcc.param "conv.weight" : tensor<4x3x3x3xf32>
  %c = pcc.conv %img, %k2 strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 1 : tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32> -> tensor<1x4x6x6xf32>
  return %y, %c : tensor<2x256xf32>, tensor<1x4x6x6xf32>
}
