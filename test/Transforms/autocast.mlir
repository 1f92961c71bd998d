// RUN: split-file %s %t
// RUN: pcc-opt %t/rules.mlir --pcc-autocast --cse | FileCheck %s
// RUN: pcc-opt %t/rules.mlir --pcc-autocast='precision=fp32' | FileCheck %s --check-prefix=FP32
// RUN: pcc-opt %t/grad.mlir --pcc-autocast --cse --pcc-loss=fuse-head-bytes=-1 --pcc-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: pcc-opt %t/legalize.mlir --pcc-legalize-bf16 | FileCheck %s --check-prefix=LEGAL
// RUN: pcc-opt %t/loss.mlir --pcc-legalize-bf16 | FileCheck %s --check-prefix=LOSS
// RUN: not pcc-opt %t/rules.mlir --pcc-autocast='precision=fp8' 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: pcc-opt %t/rules.mlir --pcc-autocast='precision=fp16' --cse | FileCheck %s --check-prefix=FP16
// RUN: pcc-opt %t/rules.mlir --pcc-autocast='precision=fp16 loss-scale=128' | FileCheck %s --check-prefix=STATIC
// RUN: not pcc-opt %t/rules.mlir --pcc-autocast='precision=fp16 loss-scale=dynamic:-2' 2>&1 | FileCheck %s --check-prefix=BADSCALE

// Tests torch.autocast's rules, op by op: the product on bf16 operands
// with its f32 accumulator as the result, the bias (a weight added to it)
// rounded to bf16 and added to the accumulator, the sum rounded once (as
// addmm under autocast); an
// elementwise op on bf16 alone in bf16; a splat constant taking the bf16
// type; softmax on bf16 computing in f32 between casts; f32 meeting bf16
// promoting to f32; the result keeping its type.
//--- rules.mlir
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %w = pcc.param "fc.weight" : tensor<8x8xf32>
  %b = pcc.param "fc.bias" : tensor<8xf32>
  %y = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %bb = pcc.broadcast %b : tensor<8xf32> -> tensor<4x8xf32>
  %z = pcc.add %y, %bb : tensor<4x8xf32>
  %r = pcc.relu %z : tensor<4x8xf32>
  %c = pcc.constant dense<0.125> : tensor<4x8xf32>
  %s = pcc.mul %r, %c : tensor<4x8xf32>
  %p = pcc.softmax %s axis = 1 : tensor<4x8xf32>
  %o = pcc.add %p, %x : tensor<4x8xf32>
  return %o : tensor<4x8xf32>
}

// fp16: the same rules with f16 for bf16, and GradScaler's loss scaling.
// FP16: module attributes {pcc.loss_scale = {initial = 6.553600e+04 : f64, window = 2000 : i64}, pcc.precision = "fp16"}
// FP16: pcc.cast %arg0 : tensor<4x8xf32> -> tensor<4x8xf16>
// FP16: pcc.matmul {{.*}} -> tensor<4x8xf32>
// FP16: pcc.cast {{.*}} : tensor<4x8xf32> -> tensor<4x8xf16>
// FP16: pcc.softmax {{.*}} : tensor<4x8xf32>
// STATIC: pcc.loss_scale = {initial = 1.280000e+02 : f64, window = 0 : i64}
// BADSCALE: loss scale 'dynamic:-2' is not dynamic, dynamic:N or a positive number

// CHECK: module attributes {pcc.precision = "bf16"}
// CHECK: %[[XB:.*]] = pcc.cast %arg0 : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK: %[[WB:.*]] = pcc.cast %{{.*}} : tensor<8x8xf32> -> tensor<8x8xbf16>
// CHECK: %[[Y:.*]] = pcc.matmul %[[XB]], %[[WB]] {transpose_b} : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xf32>
// CHECK: %[[BB:.*]] = pcc.broadcast
// CHECK: %[[BB16:.*]] = pcc.cast %[[BB]] : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK: %[[BBW:.*]] = pcc.cast %[[BB16]] : tensor<4x8xbf16> -> tensor<4x8xf32>
// CHECK: %[[Z32:.*]] = pcc.add %[[Y]], %[[BBW]] : tensor<4x8xf32>
// CHECK: %[[Z:.*]] = pcc.cast %[[Z32]] : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK: %[[R:.*]] = pcc.relu %[[Z]] : tensor<4x8xbf16>
// CHECK: %[[C:.*]] = pcc.constant dense<1.250000e-01> : tensor<4x8xbf16>
// CHECK: %[[S:.*]] = pcc.mul %[[R]], %[[C]] : tensor<4x8xbf16>
// CHECK: %[[S32:.*]] = pcc.cast %[[S]] : tensor<4x8xbf16> -> tensor<4x8xf32>
// CHECK: %[[P32:.*]] = pcc.softmax %[[S32]] axis = 1 : tensor<4x8xf32>
// CHECK: %[[P:.*]] = pcc.cast %[[P32]] : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK: %[[PW:.*]] = pcc.cast %[[P]] : tensor<4x8xbf16> -> tensor<4x8xf32>
// CHECK: %[[O:.*]] = pcc.add %[[PW]], %arg0 : tensor<4x8xf32>
// CHECK: return %[[O]] : tensor<4x8xf32>

// FP32-NOT: bf16

// The backward phase differentiates the casts: the products of the
// backward pass run in bf16, the two uses of the weight's bf16 copy add
// their gradients in bf16 (as autograd does for autocast's cached weight
// cast), and the sum reaches the f32 gradient state through a cast. The
// bf16 copy of the weight is cast again in the backward phase, not saved;
// the saved activations are the bf16 values.
//--- grad.mlir
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %w = pcc.param "fc.weight" : tensor<8x8xf32>
  %y = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %r = pcc.relu %y : tensor<4x8xf32>
  %z = pcc.matmul %r, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  return %z : tensor<4x8xf32>
}

// GRAD-LABEL: func.func @train_backward
// GRAD-NOT: tensor<8x8xbf16> {pcc.name = "saved
// GRAD: %[[W:.*]] = pcc.param "fc.weight" : tensor<8x8xf32>
// GRAD: pcc.cast %[[W]] : tensor<8x8xf32> -> tensor<8x8xbf16>
// GRAD: %[[DW1:.*]] = pcc.matmul {{.*}} {transpose_a} : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<8x8xbf16>
// GRAD: %[[DW2:.*]] = pcc.matmul {{.*}} {transpose_a} : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<8x8xbf16>
// GRAD: %[[DW:.*]] = pcc.add %[[DW1]], %[[DW2]] : tensor<8x8xbf16>
// GRAD: %[[DW32:.*]] = pcc.cast %[[DW]] : tensor<8x8xbf16> -> tensor<8x8xf32>
// GRAD: pcc.accumulate {{.*}}, %[[DW32]] : tensor<8x8xf32>

// Tests that an op the back ends do not run on bf16 (a reduction, as a
// broadcast's gradient makes) computes in f32 between casts, and
// elementwise ops and constants stay bf16.
//--- legalize.mlir
func.func @main(%x: tensor<4x8xbf16>) -> tensor<8xbf16> {
  %c = pcc.constant dense<2.0> : tensor<4x8xbf16>
  %m = pcc.mul %x, %c : tensor<4x8xbf16>
  %s = pcc.reduce_sum %m axes = [0] : tensor<4x8xbf16> -> tensor<8xbf16>
  return %s : tensor<8xbf16>
}

// LEGAL: %[[C:.*]] = pcc.constant dense<2.000000e+00> : tensor<4x8xbf16>
// LEGAL: %[[M:.*]] = pcc.mul %arg0, %[[C]] : tensor<4x8xbf16>
// LEGAL: %[[M32:.*]] = pcc.cast %[[M]] : tensor<4x8xbf16> -> tensor<4x8xf32>
// LEGAL: %[[S:.*]] = pcc.reduce_sum %[[M32]] axes = [0] : tensor<4x8xf32> -> tensor<8xf32>
// LEGAL: %[[S16:.*]] = pcc.cast %[[S]] : tensor<8xf32> -> tensor<8xbf16>
// LEGAL: return %[[S16]]

// Cross-entropy reads bf16 logits without their widened copy (through
// the reshapes), and its gradient, read only by a cast to bf16 (through a
// reshape), is written in bf16.
//--- loss.mlir
func.func @main(%l: tensor<2x3x16xbf16>, %y: tensor<6xi64>, %g: tensor<6xf32>) -> (tensor<6xf32>, tensor<2x3x16xbf16>) {
  %w = pcc.cast %l : tensor<2x3x16xbf16> -> tensor<2x3x16xf32>
  %r = pcc.reshape %w : tensor<2x3x16xf32> -> tensor<6x16xf32>
  %c = pcc.cross_entropy %r, %y ignore_index = -100 : tensor<6x16xf32>, tensor<6xi64> -> tensor<6xf32>
  %w2 = pcc.cast %l : tensor<2x3x16xbf16> -> tensor<2x3x16xf32>
  %r2 = pcc.reshape %w2 : tensor<2x3x16xf32> -> tensor<6x16xf32>
  %d = pcc.cross_entropy_grad %r2, %y, %g ignore_index = -100 : tensor<6x16xf32>, tensor<6xi64>, tensor<6xf32> -> tensor<6x16xf32>
  %dr = pcc.reshape %d : tensor<6x16xf32> -> tensor<2x3x16xf32>
  %dn = pcc.cast %dr : tensor<2x3x16xf32> -> tensor<2x3x16xbf16>
  return %c, %dn : tensor<6xf32>, tensor<2x3x16xbf16>
}

// LOSS-NOT: pcc.cast
// LOSS: %[[R:.*]] = pcc.reshape %arg0 : tensor<2x3x16xbf16> -> tensor<6x16xbf16>
// LOSS: %[[C:.*]] = pcc.cross_entropy %[[R]], %arg1 ignore_index = -100 : tensor<6x16xbf16>, tensor<6xi64> -> tensor<6xf32>
// LOSS: %[[R2:.*]] = pcc.reshape %arg0 : tensor<2x3x16xbf16> -> tensor<6x16xbf16>
// LOSS: %[[D:.*]] = pcc.cross_entropy_grad %[[R2]], %arg1, %arg2 ignore_index = -100 : tensor<6x16xbf16>, tensor<6xi64>, tensor<6xf32> -> tensor<6x16xbf16>
// LOSS: %[[DR:.*]] = pcc.reshape %[[D]] : tensor<6x16xbf16> -> tensor<2x3x16xbf16>
// LOSS-NOT: pcc.cast
// LOSS: return %[[C]], %[[DR]]

// BAD: autocast: precision 'fp8' is not known (bf16, fp16 or fp32)
