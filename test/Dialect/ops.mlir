// RUN: pcc-opt %s --split-input-file | pcc-opt --split-input-file | FileCheck %s

// Tests that params and constants round-trip.
// CHECK-LABEL: func.func @values
// CHECK:         pcc.param "layers.0.weight" : tensor<256x64xf32>
// CHECK:         pcc.constant dense<[2, 16, 64]> : tensor<3xi64>
func.func @values() -> (tensor<256x64xf32>, tensor<3xi64>) {
  %w = pcc.param "layers.0.weight" : tensor<256x64xf32>
  %c = pcc.constant dense<[2, 16, 64]> : tensor<3xi64>
  return %w, %c : tensor<256x64xf32>, tensor<3xi64>
}

// -----

// Tests matmul with a shared weight, transposes and equal batch dimensions.
// CHECK-LABEL: func.func @matmul
// CHECK:         pcc.matmul %{{.*}}, %{{.*}} {transpose_b} : tensor<2x16x64xf32>, tensor<256x64xf32> -> tensor<2x16x256xf32>
// CHECK:         pcc.matmul %{{.*}}, %{{.*}} {transpose_a} : tensor<4x8x3xf32>, tensor<4x8x5xf32> -> tensor<4x3x5xf32>
func.func @matmul(%x: tensor<2x16x64xf32>, %w: tensor<256x64xf32>,
                  %a: tensor<4x8x3xf32>, %b: tensor<4x8x5xf32>)
    -> (tensor<2x16x256xf32>, tensor<4x3x5xf32>) {
  %0 = pcc.matmul %x, %w {transpose_b} : tensor<2x16x64xf32>, tensor<256x64xf32> -> tensor<2x16x256xf32>
  %1 = pcc.matmul %a, %b {transpose_a} : tensor<4x8x3xf32>, tensor<4x8x5xf32> -> tensor<4x3x5xf32>
  return %0, %1 : tensor<2x16x256xf32>, tensor<4x3x5xf32>
}

// -----

// Tests that 16-bit operands may give their f32 accumulator (mixed
// precision adds a linear layer's bias to it before rounding once), or a
// result of their own type.
// CHECK-LABEL: func.func @matmul_accumulator
// CHECK:         pcc.matmul %{{.*}}, %{{.*}} {transpose_b} : tensor<4x8xbf16>, tensor<16x8xbf16> -> tensor<4x16xf32>
// CHECK:         pcc.matmul %{{.*}}, %{{.*}} : tensor<4x8xf16>, tensor<8x16xf16> -> tensor<4x16xf32>
// CHECK:         pcc.matmul %{{.*}}, %{{.*}} : tensor<4x8xf16>, tensor<8x16xf16> -> tensor<4x16xf16>
func.func @matmul_accumulator(%x: tensor<4x8xbf16>, %w: tensor<16x8xbf16>,
                              %h: tensor<4x8xf16>, %v: tensor<8x16xf16>)
    -> (tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf16>) {
  %0 = pcc.matmul %x, %w {transpose_b} : tensor<4x8xbf16>, tensor<16x8xbf16> -> tensor<4x16xf32>
  %1 = pcc.matmul %h, %v : tensor<4x8xf16>, tensor<8x16xf16> -> tensor<4x16xf32>
  %2 = pcc.matmul %h, %v : tensor<4x8xf16>, tensor<8x16xf16> -> tensor<4x16xf16>
  return %0, %1, %2 : tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf16>
}

// -----

// Tests every unary and binary elementwise op, compare, select and cast.
// CHECK-LABEL: func.func @elementwise
// CHECK-COUNT-14: pcc.{{[a-z]+}} %{{.*}} : tensor<4xf32>
// CHECK:         pcc.gelu %{{.*}} {tanh_approximation} : tensor<4xf32>
// CHECK:         pcc.leaky_relu %{{.*}} alpha = 1.000000e-01 : tensor<4xf32>
// CHECK:         pcc.clamp %{{.*}} min = 0.000000e+00 max = 6.000000e+00 : tensor<4xf32>
// CHECK-COUNT-7: pcc.{{[a-z]+}} %{{.*}}, %{{.*}} : tensor<4xf32>
// CHECK:         %[[M:.+]] = pcc.compare lt, %{{.*}}, %{{.*}} : tensor<4xf32>
// CHECK:         pcc.not %[[M]] : tensor<4xi1>
// CHECK:         pcc.and
// CHECK:         pcc.or
// CHECK:         pcc.xor
// CHECK:         pcc.select %[[M]], %{{.*}}, %{{.*}} : tensor<4xi1>, tensor<4xf32>
// CHECK:         pcc.cast %{{.*}} : tensor<4xf32> -> tensor<4xi64>
func.func @elementwise(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xi64> {
  %0 = pcc.neg %x : tensor<4xf32>
  %1 = pcc.abs %0 : tensor<4xf32>
  %2 = pcc.sqrt %1 : tensor<4xf32>
  %3 = pcc.reciprocal %2 : tensor<4xf32>
  %4 = pcc.exp %3 : tensor<4xf32>
  %5 = pcc.log %4 : tensor<4xf32>
  %6 = pcc.erf %5 : tensor<4xf32>
  %7 = pcc.tanh %6 : tensor<4xf32>
  %8 = pcc.sigmoid %7 : tensor<4xf32>
  %9 = pcc.relu %8 : tensor<4xf32>
  %10 = pcc.floor %9 : tensor<4xf32>
  %11 = pcc.ceil %10 : tensor<4xf32>
  %12 = pcc.sin %11 : tensor<4xf32>
  %13 = pcc.cos %12 : tensor<4xf32>
  %14 = pcc.gelu %13 {tanh_approximation} : tensor<4xf32>
  %15 = pcc.leaky_relu %14 alpha = 0.1 : tensor<4xf32>
  %16 = pcc.clamp %15 min = 0.0 max = 6.0 : tensor<4xf32>
  %17 = pcc.add %16, %y : tensor<4xf32>
  %18 = pcc.sub %17, %y : tensor<4xf32>
  %19 = pcc.mul %18, %y : tensor<4xf32>
  %20 = pcc.div %19, %y : tensor<4xf32>
  %21 = pcc.pow %20, %y : tensor<4xf32>
  %22 = pcc.max %21, %y : tensor<4xf32>
  %23 = pcc.min %22, %y : tensor<4xf32>
  %m = pcc.compare lt, %23, %y : tensor<4xf32>
  %n = pcc.not %m : tensor<4xi1>
  %a = pcc.and %m, %n : tensor<4xi1>
  %o = pcc.or %a, %n : tensor<4xi1>
  %e = pcc.xor %o, %m : tensor<4xi1>
  %s = pcc.select %m, %23, %x : tensor<4xi1>, tensor<4xf32>
  %c = pcc.cast %s : tensor<4xf32> -> tensor<4xi64>
  return %c : tensor<4xi64>
}

// -----

// Tests softmax, layer norm (with and without bias) and batch norm.
// CHECK-LABEL: func.func @normalisation
// CHECK:         pcc.softmax %{{.*}} axis = 2 : tensor<2x16x64xf32>
// CHECK:         pcc.log_softmax %{{.*}} axis = 0 : tensor<2x16x64xf32>
// CHECK:         pcc.layer_norm %{{.*}}, %{{.*}}, %{{.*}} axis = 2 epsilon = 9.99999974E-6 : tensor<2x16x64xf32>, tensor<64xf32>, tensor<64xf32>
// CHECK:         pcc.layer_norm %{{.*}}, %{{.*}} axis = 1 epsilon = 9.99999974E-6 : tensor<2x16x64xf32>, tensor<16x64xf32>
// CHECK:         pcc.batch_norm %{{.*}} epsilon = 9.99999974E-6 : tensor<2x8x4x4xf32>, tensor<8xf32>
func.func @normalisation(%x: tensor<2x16x64xf32>, %g: tensor<64xf32>,
                         %b: tensor<64xf32>, %g2: tensor<16x64xf32>,
                         %img: tensor<2x8x4x4xf32>, %v: tensor<8xf32>)
    -> (tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x8x4x4xf32>) {
  %0 = pcc.softmax %x axis = 2 : tensor<2x16x64xf32>
  %1 = pcc.log_softmax %0 axis = 0 : tensor<2x16x64xf32>
  %2 = pcc.layer_norm %1, %g, %b axis = 2 epsilon = 1.0e-5 : tensor<2x16x64xf32>, tensor<64xf32>, tensor<64xf32>
  %3 = pcc.layer_norm %2, %g2 axis = 1 epsilon = 1.0e-5 : tensor<2x16x64xf32>, tensor<16x64xf32>
  %4 = pcc.batch_norm %img, %v, %v, %v, %v epsilon = 1.0e-5 : tensor<2x8x4x4xf32>, tensor<8xf32>
  return %2, %3, %4 : tensor<2x16x64xf32>, tensor<2x16x64xf32>, tensor<2x8x4x4xf32>
}

// -----

// Tests the data-movement ops.
// CHECK-LABEL: func.func @data_movement
// CHECK:         pcc.reshape %{{.*}} : tensor<2x16x64xf32> -> tensor<2x16x4x16xf32>
// CHECK:         pcc.transpose %{{.*}} [0, 2, 1, 3] : tensor<2x16x4x16xf32> -> tensor<2x4x16x16xf32>
// CHECK:         pcc.broadcast %{{.*}} : tensor<64xf32> -> tensor<2x16x64xf32>
// CHECK:         pcc.concat %{{.*}}, %{{.*}} axis = 2 : tensor<2x16x64xf32>, tensor<2x16x64xf32> -> tensor<2x16x128xf32>
// CHECK:         pcc.split %{{.*}} axis = 2 sizes = [32, 96] : tensor<2x16x128xf32> -> tensor<2x16x32xf32>, tensor<2x16x96xf32>
// CHECK:         pcc.slice %{{.*}} starts = [0, 15, 0] limits = [2, -1, 32] steps = [1, -2, 4] : tensor<2x16x32xf32> -> tensor<2x8x8xf32>
// CHECK:         pcc.gather %{{.*}}[%{{.*}}] axis = 0 : tensor<512x64xf32>, tensor<2x16xi64> -> tensor<2x16x64xf32>
func.func @data_movement(%x: tensor<2x16x64xf32>, %b: tensor<64xf32>,
                         %table: tensor<512x64xf32>, %ids: tensor<2x16xi64>)
    -> (tensor<2x4x16x16xf32>, tensor<2x8x8xf32>, tensor<2x16x96xf32>, tensor<2x16x64xf32>) {
  %0 = pcc.reshape %x : tensor<2x16x64xf32> -> tensor<2x16x4x16xf32>
  %1 = pcc.transpose %0 [0, 2, 1, 3] : tensor<2x16x4x16xf32> -> tensor<2x4x16x16xf32>
  %2 = pcc.broadcast %b : tensor<64xf32> -> tensor<2x16x64xf32>
  %3 = pcc.concat %x, %2 axis = 2 : tensor<2x16x64xf32>, tensor<2x16x64xf32> -> tensor<2x16x128xf32>
  %4:2 = pcc.split %3 axis = 2 sizes = [32, 96] : tensor<2x16x128xf32> -> tensor<2x16x32xf32>, tensor<2x16x96xf32>
  %5 = pcc.slice %4#0 starts = [0, 15, 0] limits = [2, -1, 32] steps = [1, -2, 4] : tensor<2x16x32xf32> -> tensor<2x8x8xf32>
  %6 = pcc.gather %table[%ids] axis = 0 : tensor<512x64xf32>, tensor<2x16xi64> -> tensor<2x16x64xf32>
  return %1, %5, %4#1, %6 : tensor<2x4x16x16xf32>, tensor<2x8x8xf32>, tensor<2x16x96xf32>, tensor<2x16x64xf32>
}

// -----

// Tests reductions with and without kept dimensions, and argmax.
// CHECK-LABEL: func.func @reductions
// CHECK:         pcc.reduce_sum %{{.*}} axes = [1] {keep_dims} : tensor<2x64xf32> -> tensor<2x1xf32>
// CHECK:         pcc.reduce_mean %{{.*}} axes = [0, 1] : tensor<2x64xf32> -> tensor<f32>
// CHECK:         pcc.reduce_max %{{.*}} axes = [0] : tensor<2x64xf32> -> tensor<64xf32>
// CHECK:         pcc.reduce_min %{{.*}} axes = [1] : tensor<2x64xf32> -> tensor<2xf32>
// CHECK:         pcc.reduce_prod %{{.*}} axes = [1] : tensor<2x64xf32> -> tensor<2xf32>
// CHECK:         pcc.argmax %{{.*}} axis = 1 : tensor<2x64xf32> -> tensor<2xi64>
func.func @reductions(%x: tensor<2x64xf32>) -> (tensor<2x1xf32>, tensor<f32>, tensor<64xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xi64>) {
  %0 = pcc.reduce_sum %x axes = [1] {keep_dims} : tensor<2x64xf32> -> tensor<2x1xf32>
  %1 = pcc.reduce_mean %x axes = [0, 1] : tensor<2x64xf32> -> tensor<f32>
  %2 = pcc.reduce_max %x axes = [0] : tensor<2x64xf32> -> tensor<64xf32>
  %3 = pcc.reduce_min %x axes = [1] : tensor<2x64xf32> -> tensor<2xf32>
  %4 = pcc.reduce_prod %x axes = [1] : tensor<2x64xf32> -> tensor<2xf32>
  %5 = pcc.argmax %x axis = 1 : tensor<2x64xf32> -> tensor<2xi64>
  return %0, %1, %2, %3, %4, %5 : tensor<2x1xf32>, tensor<f32>, tensor<64xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xi64>
}

// -----

// Tests convolution (grouped, with bias) and both poolings, ceil mode too.
// CHECK-LABEL: func.func @conv_pool
// CHECK:         pcc.conv %{{.*}}, %{{.*}}, %{{.*}} strides = [2, 2] pads = [1, 1, 1, 1] dilations = [1, 1] groups = 2 : tensor<2x4x32x32xf32>, tensor<8x2x3x3xf32>, tensor<8xf32> -> tensor<2x8x16x16xf32>
// CHECK:         pcc.max_pool %{{.*}} kernel = [3, 3] strides = [2, 2] pads = [1, 1, 1, 1] dilations = [1, 1] : tensor<2x8x16x16xf32> -> tensor<2x8x8x8xf32>
// CHECK:         pcc.avg_pool %{{.*}} kernel = [2, 2] strides = [2, 2] pads = [0, 0, 0, 0] dilations = [1, 1] {ceil_mode, count_include_pad} : tensor<2x8x8x8xf32> -> tensor<2x8x4x4xf32>
func.func @conv_pool(%x: tensor<2x4x32x32xf32>, %w: tensor<8x2x3x3xf32>, %b: tensor<8xf32>) -> tensor<2x8x4x4xf32> {
  %0 = pcc.conv %x, %w, %b strides = [2, 2] pads = [1, 1, 1, 1] dilations = [1, 1] groups = 2 : tensor<2x4x32x32xf32>, tensor<8x2x3x3xf32>, tensor<8xf32> -> tensor<2x8x16x16xf32>
  %1 = pcc.max_pool %0 kernel = [3, 3] strides = [2, 2] pads = [1, 1, 1, 1] dilations = [1, 1] : tensor<2x8x16x16xf32> -> tensor<2x8x8x8xf32>
  %2 = pcc.avg_pool %1 kernel = [2, 2] strides = [2, 2] pads = [0, 0, 0, 0] dilations = [1, 1] {ceil_mode, count_include_pad} : tensor<2x8x8x8xf32> -> tensor<2x8x4x4xf32>
  return %2 : tensor<2x8x4x4xf32>
}

// -----

// Tests the float tests, mod and the NaN-guarded softmax.
// CHECK-LABEL: func.func @float_tests
// CHECK:         pcc.is_nan %{{.*}} : tensor<2x8xf32> -> tensor<2x8xi1>
// CHECK:         pcc.is_inf %{{.*}} {detect_negative = false} : tensor<2x8xf32> -> tensor<2x8xi1>
// CHECK:         pcc.mod %{{.*}}, %{{.*}} {fmod} : tensor<2x8xf32>
// CHECK:         pcc.mod %{{.*}}, %{{.*}} : tensor<4xi64>
// CHECK:         pcc.softmax %{{.*}} axis = 1 {nan_to_zero} : tensor<2x8xf32>
func.func @float_tests(%x: tensor<2x8xf32>, %i: tensor<4xi64>) -> (tensor<2x8xi1>, tensor<2x8xi1>, tensor<2x8xf32>, tensor<4xi64>, tensor<2x8xf32>) {
  %n = pcc.is_nan %x : tensor<2x8xf32> -> tensor<2x8xi1>
  %f = pcc.is_inf %x {detect_negative = false} : tensor<2x8xf32> -> tensor<2x8xi1>
  %m = pcc.mod %x, %x {fmod} : tensor<2x8xf32>
  %j = pcc.mod %i, %i : tensor<4xi64>
  %s = pcc.softmax %x axis = 1 {nan_to_zero} : tensor<2x8xf32>
  return %n, %f, %m, %j, %s : tensor<2x8xi1>, tensor<2x8xi1>, tensor<2x8xf32>, tensor<4xi64>, tensor<2x8xf32>
}

// -----

// Tests that the gradient, loss and optimizer ops round-trip.
// CHECK-LABEL: func.func @training
// CHECK: pcc.scatter_add %{{.*}}[%{{.*}}] axis = 0 : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<16x8xf32>
// CHECK: pcc.pad %{{.*}} starts = [1, 0] steps = [2, 1] : tensor<2x8xf32> -> tensor<4x8xf32>
// CHECK: pcc.cross_entropy %{{.*}}, %{{.*}} ignore_index = -100 : tensor<8x16xf32>, tensor<8xi64> -> tensor<8xf32>
// CHECK: pcc.cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} ignore_index = -100 : tensor<8x16xf32>, tensor<8xi64>, tensor<8xf32> -> tensor<8x16xf32>
// CHECK: pcc.accumulate %{{.*}}, %{{.*}} : tensor<16x8xf32>
// CHECK: pcc.zero %{{.*}} : tensor<16x8xf32>
// CHECK: pcc.sgd_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x8xf32>, tensor<f32>
// CHECK: pcc.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<16x8xf32>, tensor<f32>
// CHECK: pcc.ema_update %{{.*}}, %{{.*}} momentum = 9.000000e-01 scale = 1.500000e+00 : tensor<16x8xf32>
func.func @training(%g: tensor<2x4x8xf32>, %ids: tensor<2x4xi64>, %s: tensor<2x8xf32>,
                    %logits: tensor<8x16xf32>, %labels: tensor<8xi64>, %n: tensor<f32>) {
  %t = pcc.scatter_add %g[%ids] axis = 0 : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<16x8xf32>
  %p = pcc.pad %s starts = [1, 0] steps = [2, 1] : tensor<2x8xf32> -> tensor<4x8xf32>
  %l = pcc.cross_entropy %logits, %labels ignore_index = -100 : tensor<8x16xf32>, tensor<8xi64> -> tensor<8xf32>
  %d = pcc.cross_entropy_grad %logits, %labels, %l ignore_index = -100 : tensor<8x16xf32>, tensor<8xi64>, tensor<8xf32> -> tensor<8x16xf32>
  %w = pcc.param "w" : tensor<16x8xf32>
  %gw = pcc.param "w@grad" : tensor<16x8xf32>
  %m = pcc.param "w@exp_avg" : tensor<16x8xf32>
  %v = pcc.param "w@exp_avg_sq" : tensor<16x8xf32>
  pcc.accumulate %gw, %t : tensor<16x8xf32>
  pcc.zero %m : tensor<16x8xf32>
  pcc.sgd_update %w, %gw, %m, %n : tensor<16x8xf32>, tensor<f32>
  pcc.adamw_update %w, %gw, %m, %v, %n : tensor<16x8xf32>, tensor<f32>
  pcc.ema_update %v, %t momentum = 0.9 scale = 1.5 : tensor<16x8xf32>
  return
}

// Tests that the gradient ops of convolution and pooling round-trip.
// CHECK-LABEL: func.func @window_gradients
// CHECK: pcc.conv_grad_input %{{.*}}, %{{.*}} strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2 : tensor<2x6x4x5xf32>, tensor<6x2x3x2xf32> -> tensor<2x4x7x6xf32>
// CHECK: pcc.conv_grad_weight %{{.*}}, %{{.*}} strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2 : tensor<2x4x7x6xf32>, tensor<2x6x4x5xf32> -> tensor<6x2x3x2xf32>
// CHECK: pcc.max_pool_grad %{{.*}}, %{{.*}} kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode} : tensor<2x4x7x6xf32>, tensor<2x4x4x3xf32> -> tensor<2x4x7x6xf32>
// CHECK: pcc.avg_pool_grad %{{.*}} kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode, count_include_pad} : tensor<2x4x4x3xf32> -> tensor<2x4x7x6xf32>
func.func @window_gradients(%x: tensor<2x4x7x6xf32>, %w: tensor<6x2x3x2xf32>, %dc: tensor<2x6x4x5xf32>,
                            %dp: tensor<2x4x4x3xf32>) {
  %gi = pcc.conv_grad_input %dc, %w strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
      : tensor<2x6x4x5xf32>, tensor<6x2x3x2xf32> -> tensor<2x4x7x6xf32>
  %gw = pcc.conv_grad_weight %x, %dc strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
      : tensor<2x4x7x6xf32>, tensor<2x6x4x5xf32> -> tensor<6x2x3x2xf32>
  %m = pcc.max_pool_grad %x, %dp kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode}
      : tensor<2x4x7x6xf32>, tensor<2x4x4x3xf32> -> tensor<2x4x7x6xf32>
  %a = pcc.avg_pool_grad %dp kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode, count_include_pad}
      : tensor<2x4x4x3xf32> -> tensor<2x4x7x6xf32>
  return
}

// -----

// Tests that ZeRO's flat shards of model state and pcc.assign round-trip.
// CHECK-LABEL: func.func @zero_state
// CHECK: pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) of [5, 2] : tensor<4xf32>
// CHECK: pcc.assign %{{.*}}, %{{.*}} : tensor<5x2xf32>
module {
  pcc.mesh @mesh [dp = 3]
  func.func @zero_state(%x: tensor<5x2xf32>) -> tensor<4xf32> {
    %m = pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) of [5, 2] : tensor<4xf32>
    %w = pcc.param "w" : tensor<5x2xf32>
    pcc.assign %w, %x : tensor<5x2xf32>
    return %m : tensor<4xf32>
  }
}

// -----

// Tests that a flat shard within a tensor-parallel split round-trips: rows
// [r * 4, (r + 1) * 4) of a [8, 3] tensor on tp rank r, 12 elements in
// pieces of 4 over 3 dp ranks.
// CHECK-LABEL: func.func @zero_within_tp
// CHECK: pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) of [8, 3] within(#pcc.shard<tp, dim = 0>) : tensor<4xf32>
module {
  pcc.mesh @mesh [dp = 3, tp = 2]
  func.func @zero_within_tp() -> tensor<4xf32> {
    %m = pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) of [8, 3] within(#pcc.shard<tp, dim = 0>) : tensor<4xf32>
    return %m : tensor<4xf32>
  }
}

// -----

// Tests that the gradient bucket ops and an ordered mesh round-trip.
// CHECK-LABEL: func.func @buckets
// CHECK: pcc.bucket_start %{{.*}} axis = "dp" : tensor<48xf32>
// CHECK: pcc.bucket_wait %{{.*}} axis = "dp" : tensor<48xf32>
module {
  pcc.mesh @mesh [tp = 2, dp = 2]
  func.func @buckets() {
    %b = pcc.param "w@bucket" : tensor<48xf32>
    pcc.bucket_start %b axis = "dp" : tensor<48xf32>
    pcc.bucket_wait %b axis = "dp" : tensor<48xf32>
    return
  }
}

// -----

// Tests that started collectives and their wait round-trip: a gather
// started ahead and a reduce-scatter, completed by one wait that keeps both
// inputs.
// CHECK-LABEL: func.func @started
// CHECK: %[[G:.*]] = pcc.all_gather_start %{{.*}} axis = "dp" : tensor<4xf32> -> tensor<2x4xf32>
// CHECK: %[[S:.*]] = pcc.reduce_scatter_start %{{.*}} axis = "dp" : tensor<2x8xf32> -> tensor<8xf32>
// CHECK: pcc.wait_collectives axis = "dp"(%[[G]], %[[S]]) reading(%{{.*}}, %{{.*}})
module {
  pcc.mesh @mesh [dp = 2]
  func.func @started(%g: tensor<2x8xf32>) -> (tensor<2x4xf32>, tensor<8xf32>) {
    %w = pcc.param "w" shard(#pcc.shard<dp, flat>) of [8] : tensor<4xf32>
    %a = pcc.all_gather_start %w axis = "dp" : tensor<4xf32> -> tensor<2x4xf32>
    %b = pcc.reduce_scatter_start %g axis = "dp" : tensor<2x8xf32> -> tensor<8xf32>
    %r:2 = pcc.wait_collectives axis = "dp"(%a, %b) reading(%w, %g)
        : (tensor<2x4xf32>, tensor<8xf32>), (tensor<4xf32>, tensor<2x8xf32>) -> tensor<2x4xf32>, tensor<8xf32>
    return %r#0, %r#1 : tensor<2x4xf32>, tensor<8xf32>
  }
}

// -----

// Tests that the fused LM-head cross-entropy and its gradient round-trip,
// in both weight layouts and as a rank's block of the vocabulary.
// CHECK-LABEL: func.func @linear_cross_entropy
// CHECK: %[[LSE:.*]], %[[T:.*]] = pcc.linear_cross_entropy %arg0, %arg1, %arg3 ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
// CHECK: pcc.linear_cross_entropy %arg0, %arg2, %arg3 ignore_index = 0 {mesh_axis = "tp"} : tensor<8x4xf32>, tensor<4x16xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
// CHECK: pcc.linear_cross_entropy_grad %arg0, %arg1, %arg3, %[[LSE]], %[[LSE]], %[[T]] ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x4xf32>, tensor<16x4xf32>
func.func @linear_cross_entropy(%h: tensor<8x4xf32>, %w: tensor<16x4xf32>, %wt: tensor<4x16xf32>, %l: tensor<8xi64>) {
  %lse, %t = pcc.linear_cross_entropy %h, %w, %l ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
  %lse2, %t2 = pcc.linear_cross_entropy %h, %wt, %l ignore_index = 0 {mesh_axis = "tp"} : tensor<8x4xf32>, tensor<4x16xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
  %dh, %dw = pcc.linear_cross_entropy_grad %h, %w, %l, %lse, %lse, %t ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x4xf32>, tensor<16x4xf32>
  return
}
