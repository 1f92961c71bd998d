// RUN: pcc-opt %s --split-input-file --verify-diagnostics

// Tests that matmul needs matrices.
func.func @matmul_rank(%x: tensor<4xf32>, %w: tensor<4x8xf32>) -> tensor<8xf32> {
  // expected-error @below {{operand rank: lhs and rhs need rank >= 2, got 1 and 2}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.matmul %x, %w : tensor<4xf32>, tensor<4x8xf32> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// Tests that the contraction dimensions of a matmul agree.
func.func @matmul_contraction(%x: tensor<2x4xf32>, %w: tensor<5x8xf32>) -> tensor<2x8xf32> {
  // expected-error @below {{contraction: lhs has K = 4 but rhs has K = 5}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.matmul %x, %w : tensor<2x4xf32>, tensor<5x8xf32> -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

// Tests that batch broadcasting in matmul must be explicit.
func.func @matmul_batch(%x: tensor<2x3x4xf32>, %w: tensor<1x4x8xf32>) -> tensor<2x3x8xf32> {
  // expected-error @below {{batch dimensions: rhs must be a matrix or have lhs's batch dimensions (2), got 1}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.matmul %x, %w : tensor<2x3x4xf32>, tensor<1x4x8xf32> -> tensor<2x3x8xf32>
  return %0 : tensor<2x3x8xf32>
}

// -----

// Tests that a result type that disagrees with inference is rejected.
func.func @matmul_result(%x: tensor<2x4xf32>, %w: tensor<4x8xf32>) -> tensor<2x9xf32> {
  // expected-error @below {{inferred type(s) 'tensor<2x8xf32>' are incompatible with return type(s) of operation 'tensor<2x9xf32>'}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.matmul %x, %w : tensor<2x4xf32>, tensor<4x8xf32> -> tensor<2x9xf32>
  return %0 : tensor<2x9xf32>
}

// -----

// Tests that only 16-bit operands may give an f32 result: f32 operands
// cannot narrow their result to bf16.
func.func @matmul_narrow_result(%x: tensor<2x4xf32>, %w: tensor<4x8xf32>) -> tensor<2x8xbf16> {
  // expected-error @below {{inferred type(s) 'tensor<2x8xf32>' are incompatible with return type(s) of operation 'tensor<2x8xbf16>'}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.matmul %x, %w : tensor<2x4xf32>, tensor<4x8xf32> -> tensor<2x8xbf16>
  return %0 : tensor<2x8xbf16>
}

// -----

// Tests that a 16-bit product's accumulator is f32, not f64, and has the
// inferred shape.
func.func @matmul_wide_result(%x: tensor<2x4xbf16>, %w: tensor<4x8xbf16>) -> tensor<2x8xf64> {
  // expected-error @below {{inferred type(s) 'tensor<2x8xbf16>' are incompatible with return type(s) of operation 'tensor<2x8xf64>'}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.matmul %x, %w : tensor<2x4xbf16>, tensor<4x8xbf16> -> tensor<2x8xf64>
  return %0 : tensor<2x8xf64>
}

// -----

func.func @matmul_accumulator_shape(%x: tensor<2x4xf16>, %w: tensor<4x8xf16>) -> tensor<2x9xf32> {
  // expected-error @below {{inferred type(s) 'tensor<2x8xf16>' are incompatible with return type(s) of operation 'tensor<2x9xf32>'}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.matmul %x, %w : tensor<2x4xf16>, tensor<4x8xf16> -> tensor<2x9xf32>
  return %0 : tensor<2x9xf32>
}

// -----

// Tests that clamp bounds are ordered.
func.func @clamp_bounds(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{bounds: min 6.000000e+00 exceeds max 0.000000e+00}}
  %0 = pcc.clamp %x min = 6.0 max = 0.0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Tests that the softmax axis is in range.
func.func @softmax_axis(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @below {{axis 2 is out of range [0, 2)}}
  %0 = pcc.softmax %x axis = 2 : tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// Tests that layer norm parameters match the normalised dimensions.
func.func @layer_norm_scale(%x: tensor<2x16x64xf32>, %g: tensor<32xf32>) -> tensor<2x16x64xf32> {
  // expected-error @below {{parameter shape: scale must be 'tensor<64xf32>', got 'tensor<32xf32>'}}
  %0 = pcc.layer_norm %x, %g axis = 2 epsilon = 1.0e-5 : tensor<2x16x64xf32>, tensor<32xf32>
  return %0 : tensor<2x16x64xf32>
}

// -----

// Tests that the layer norm epsilon is non-negative.
func.func @layer_norm_epsilon(%x: tensor<2x64xf32>, %g: tensor<64xf32>) -> tensor<2x64xf32> {
  // expected-error @below {{epsilon: must be non-negative}}
  %0 = pcc.layer_norm %x, %g axis = 1 epsilon = -1.0 : tensor<2x64xf32>, tensor<64xf32>
  return %0 : tensor<2x64xf32>
}

// -----

// Tests that batch norm statistics have one entry per channel.
func.func @batch_norm_params(%x: tensor<2x8x4x4xf32>, %v: tensor<4xf32>) -> tensor<2x8x4x4xf32> {
  // expected-error @below {{parameter shape: scale, bias, mean and variance must have one entry per channel (8), got 'tensor<4xf32>'}}
  %0 = pcc.batch_norm %x, %v, %v, %v, %v epsilon = 1.0e-5 : tensor<2x8x4x4xf32>, tensor<4xf32>
  return %0 : tensor<2x8x4x4xf32>
}

// -----

// Tests that batch norm needs a channel dimension.
func.func @batch_norm_rank(%x: tensor<8xf32>, %v: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{input rank: needs N x C x ..., got rank 1}}
  %0 = pcc.batch_norm %x, %v, %v, %v, %v epsilon = 1.0e-5 : tensor<8xf32>, tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// Tests that a reshape keeps the element count.
func.func @reshape_count(%x: tensor<2x3xf32>) -> tensor<7xf32> {
  // expected-error @below {{element count: cannot reshape 6 elements into 'tensor<7xf32>'}}
  %0 = pcc.reshape %x : tensor<2x3xf32> -> tensor<7xf32>
  return %0 : tensor<7xf32>
}

// -----

// Tests that a transpose permutation is a permutation.
func.func @transpose_perm(%x: tensor<2x3xf32>) -> tensor<2x2xf32> {
  // expected-error @below {{permutation: [0, 0] is not a permutation of [0, 2)}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.transpose %x [0, 0] : tensor<2x3xf32> -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}

// -----

// Tests that a transpose permutation has one entry per dimension.
func.func @transpose_length(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  // expected-error @below {{permutation: has 3 entries for an input of rank 2}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.transpose %x [0, 1, 2] : tensor<2x3xf32> -> tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}

// -----

// Tests that broadcast follows numpy rules.
func.func @broadcast_shape(%x: tensor<3xf32>) -> tensor<2x4xf32> {
  // expected-error @below {{broadcast: 'tensor<3xf32>' does not broadcast to 'tensor<2x4xf32>'}}
  %0 = pcc.broadcast %x : tensor<3xf32> -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// Tests that concat inputs agree off the concatenation axis.
func.func @concat_dims(%a: tensor<2x3xf32>, %b: tensor<4x5xf32>) -> tensor<2x8xf32> {
  // expected-error @below {{inputs: dimension 0 differs off the concatenation axis (2 and 4)}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.concat %a, %b axis = 1 : tensor<2x3xf32>, tensor<4x5xf32> -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

// Tests that split sizes cover the dimension.
func.func @split_sizes(%x: tensor<2x10xf32>) -> tensor<2x4xf32> {
  // expected-error @below {{sizes: pieces add up to 8 but dimension 1 has 10}}
  // expected-error @below {{failed to infer returned types}}
  %0:2 = pcc.split %x axis = 1 sizes = [4, 4] : tensor<2x10xf32> -> tensor<2x4xf32>, tensor<2x4xf32>
  return %0#0 : tensor<2x4xf32>
}

// -----

// Tests that slice steps are non-zero.
func.func @slice_step(%x: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{bounds: step of dimension 0 is zero}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.slice %x starts = [0] limits = [8] steps = [0] : tensor<8xf32> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// Tests that slice bounds are inside the dimension.
func.func @slice_bounds(%x: tensor<8xf32>) -> tensor<2xf32> {
  // expected-error @below {{bounds: dimension 0 of size 8 cannot take start 0 limit 9 step 4}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.slice %x starts = [0] limits = [9] steps = [4] : tensor<8xf32> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

// Tests that the gather axis is in range.
func.func @gather_axis(%t: tensor<4x8xf32>, %i: tensor<2xi64>) -> tensor<2xf32> {
  // expected-error @below {{axis 2 is out of range [0, 2)}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.gather %t[%i] axis = 2 : tensor<4x8xf32>, tensor<2xi64> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

// Tests that gather indices are integers.
func.func @gather_indices(%t: tensor<4x8xf32>, %i: tensor<2xf32>) -> tensor<2x8xf32> {
  // expected-error @below {{operand #1 must be statically shaped tensor of 32-bit signless integer or 64-bit signless integer values}}
  %0 = pcc.gather %t[%i] axis = 0 : tensor<4x8xf32>, tensor<2xf32> -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

// Tests that reduction axes are distinct.
func.func @reduce_repeated(%x: tensor<2x4xf32>) -> tensor<2xf32> {
  // expected-error @below {{reduction axis 1 is repeated}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.reduce_sum %x axes = [1, 1] : tensor<2x4xf32> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

// Tests that reduction axes are in range.
func.func @reduce_range(%x: tensor<2x4xf32>) -> tensor<2xf32> {
  // expected-error @below {{reduction axis 3 is out of range [0, 2)}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.reduce_max %x axes = [3] : tensor<2x4xf32> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

// Tests that conv groups divide the channels.
func.func @conv_groups(%x: tensor<1x3x8x8xf32>, %w: tensor<4x1x3x3xf32>) -> tensor<1x4x6x6xf32> {
  // expected-error @below {{groups: 2 must divide input channels 3 and output channels 4}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.conv %x, %w strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 2 : tensor<1x3x8x8xf32>, tensor<4x1x3x3xf32> -> tensor<1x4x6x6xf32>
  return %0 : tensor<1x4x6x6xf32>
}

// -----

// Tests that the conv weight has the input's channels per group.
func.func @conv_weight(%x: tensor<1x3x8x8xf32>, %w: tensor<4x2x3x3xf32>) -> tensor<1x4x6x6xf32> {
  // expected-error @below {{weight shape: expects 3 input channels per group, weight has 2}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.conv %x, %w strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 1 : tensor<1x3x8x8xf32>, tensor<4x2x3x3xf32> -> tensor<1x4x6x6xf32>
  return %0 : tensor<1x4x6x6xf32>
}

// -----

// Tests that the conv bias has one entry per output channel.
func.func @conv_bias(%x: tensor<1x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %b: tensor<3xf32>) -> tensor<1x4x6x6xf32> {
  // expected-error @below {{bias shape: needs 4 entries, got 'tensor<3xf32>'}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.conv %x, %w, %b strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 1 : tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<3xf32> -> tensor<1x4x6x6xf32>
  return %0 : tensor<1x4x6x6xf32>
}

// -----

// Tests that a kernel larger than the padded input is rejected.
func.func @pool_window(%x: tensor<1x1x2x2xf32>) -> tensor<1x1x1x1xf32> {
  // expected-error @below {{window: kernel of size 3 does not fit spatial dimension 0 of size 2}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.max_pool %x kernel = [3, 3] strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] : tensor<1x1x2x2xf32> -> tensor<1x1x1x1xf32>
  return %0 : tensor<1x1x1x1xf32>
}

// -----

// Tests that window attributes have one entry per spatial dimension.
func.func @pool_attrs(%x: tensor<1x1x4x4xf32>) -> tensor<1x1x2x2xf32> {
  // expected-error @below {{window attributes: need 2 kernel sizes, strides and dilations and 4 pads}}
  // expected-error @below {{failed to infer returned types}}
  %0 = pcc.avg_pool %x kernel = [2] strides = [2, 2] pads = [0, 0, 0, 0] dilations = [1, 1] : tensor<1x1x4x4xf32> -> tensor<1x1x2x2xf32>
  return %0 : tensor<1x1x2x2xf32>
}

// -----

// Tests that select's condition has the result's shape.
func.func @select_shape(%c: tensor<3xi1>, %x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{all of {condition, result} have same shape}}
  %0 = pcc.select %c, %x, %x : tensor<3xi1>, tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Tests that cast keeps the shape.
func.func @cast_shape(%x: tensor<4xf32>) -> tensor<5xi64> {
  // expected-error @below {{all of {input, result} have same shape}}
  %0 = pcc.cast %x : tensor<4xf32> -> tensor<5xi64>
  return %0 : tensor<5xi64>
}

// -----

// Tests that pcc ops need static shapes.
func.func @dynamic_shape(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  // expected-error @below {{must be statically shaped tensor}}
  %0 = pcc.relu %x : tensor<?x4xf32>
  return %0 : tensor<?x4xf32>
}

// -----

func.func @fusion_not_elementwise(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = pcc.fusion(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    // expected-error @below {{'pcc.transpose' op fusion body: only elementwise ops, float casts, broadcasts and constants can be fused}}
    %t = pcc.transpose %a [1, 0] : tensor<4x4xf32> -> tensor<4x4xf32>
    pcc.yield %t : tensor<4x4xf32>
  }
  return %0 : tensor<4x4xf32>
}

// -----

func.func @fusion_shape(%x: tensor<4xf32>) -> tensor<2x4xf32> {
  // expected-error @below {{'pcc.fusion' op body: argument type 'tensor<2x4xf32>' differs from input type 'tensor<4xf32>'}}
  %0 = pcc.fusion(%x) : (tensor<4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    pcc.yield %a : tensor<2x4xf32>
  }
  return %0 : tensor<2x4xf32>
}

// -----

// Tests that is_nan takes floats (an integer is never NaN).
func.func @is_nan_int(%x: tensor<4xi64>) -> tensor<4xi1> {
  // expected-error @below {{operand #0 must be statically shaped tensor of}}
  %0 = pcc.is_nan %x : tensor<4xi64> -> tensor<4xi1>
  return %0 : tensor<4xi1>
}

// -----

// Tests that is_inf keeps the shape and produces booleans.
func.func @is_inf_shape(%x: tensor<4xf32>) -> tensor<2xi1> {
  // expected-error @below {{failed to verify that all of {input, result} have same shape}}
  %0 = pcc.is_inf %x : tensor<4xf32> -> tensor<2xi1>
  return %0 : tensor<2xi1>
}

// -----

// Tests that mod's operands have one type.
func.func @mod_types(%x: tensor<4xf32>, %y: tensor<4xf64>) -> tensor<4xf32> {
  // expected-error @below {{requires the same type for all operands and results}}
  %0 = "pcc.mod"(%x, %y) : (tensor<4xf32>, tensor<4xf64>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Tests that scatter_add's updates are what gathering from its result gives.
func.func @scatter_add_shape(%g: tensor<2x4x7xf32>, %ids: tensor<2x4xi64>) -> tensor<16x8xf32> {
  // expected-error @below {{updates 'tensor<2x4x7xf32>' are not what gathering 'tensor<2x4xi64>' from 'tensor<16x8xf32>' along axis 0 gives}}
  %0 = pcc.scatter_add %g[%ids] axis = 0 : tensor<2x4x7xf32>, tensor<2x4xi64> -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// Tests that scatter_add's axis lies in its result.
func.func @scatter_add_axis(%g: tensor<2x4x8xf32>, %ids: tensor<2x4xi64>) -> tensor<16x8xf32> {
  // expected-error @below {{axis 2 is outside the result's rank 2}}
  %0 = pcc.scatter_add %g[%ids] axis = 2 : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// Tests that a pad's elements fit in its result.
func.func @pad_fit(%x: tensor<3x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{dimension 0: 3 elements from 1 by steps of 2 do not fit in 4}}
  %0 = pcc.pad %x starts = [1, 0] steps = [2, 1] : tensor<3x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Tests that a pad has a step per dimension.
func.func @pad_rank(%x: tensor<2x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{needs one start and step per dimension of 'tensor<2x8xf32>' and a result of the same rank and element type}}
  %0 = pcc.pad %x starts = [1] steps = [2] : tensor<2x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Tests that cross_entropy takes [N, V] logits and [N] labels.
func.func @cross_entropy_shape(%x: tensor<8x16xf32>, %l: tensor<4xi64>) -> tensor<8xf32> {
  // expected-error @below {{takes [N, V] logits and [N] labels, not 'tensor<8x16xf32>' and 'tensor<4xi64>'}}
  %0 = pcc.cross_entropy %x, %l ignore_index = -100 : tensor<8x16xf32>, tensor<4xi64> -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// Tests that cross_entropy gives one loss per row.
func.func @cross_entropy_result(%x: tensor<8x16xf32>, %l: tensor<8xi64>) -> tensor<16xf32> {
  // expected-error @below {{gives one loss per row: 8 of 'f32'}}
  %0 = pcc.cross_entropy %x, %l ignore_index = -100 : tensor<8x16xf32>, tensor<8xi64> -> tensor<16xf32>
  return %0 : tensor<16xf32>
}

// -----

// Tests that linear_cross_entropy takes matrices and one label per row.
func.func @linear_cross_entropy_rank(%h: tensor<2x4x4xf32>, %w: tensor<16x4xf32>, %l: tensor<8xi64>) {
  // expected-error @below {{takes [N, D] hidden states, a rank-2 weight and [N] labels, not 'tensor<2x4x4xf32>', 'tensor<16x4xf32>' and 'tensor<8xi64>'}}
  %lse, %t = pcc.linear_cross_entropy %h, %w, %l ignore_index = -100 {transpose_w} : tensor<2x4x4xf32>, tensor<16x4xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
  return
}

// -----

// Tests that linear_cross_entropy's weight contracts with the hidden
// states in the layout transpose_w says.
func.func @linear_cross_entropy_layout(%h: tensor<8x4xf32>, %w: tensor<16x4xf32>, %l: tensor<8xi64>) {
  // expected-error @below {{weight 'tensor<16x4xf32>' does not contract with the hidden states' 4 (it is [D, V] without transpose_w)}}
  %lse, %t = pcc.linear_cross_entropy %h, %w, %l ignore_index = -100 : tensor<8x4xf32>, tensor<16x4xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
  return
}

// -----

// Tests that linear_cross_entropy's weight has the hidden states' type.
func.func @linear_cross_entropy_type(%h: tensor<8x4xf32>, %w: tensor<16x4xbf16>, %l: tensor<8xi64>) {
  // expected-error @below {{weight 'tensor<16x4xbf16>' is not of the hidden states' type}}
  %lse, %t = pcc.linear_cross_entropy %h, %w, %l ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xbf16>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
  return
}

// -----

// Tests that linear_cross_entropy takes one label per row.
func.func @linear_cross_entropy_labels(%h: tensor<8x4xf32>, %w: tensor<16x4xf32>, %l: tensor<6xi64>) {
  // expected-error @below {{takes one label per row: 'tensor<6xi64>' for 8 rows}}
  %lse, %t = pcc.linear_cross_entropy %h, %w, %l ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xf32>, tensor<6xi64> -> tensor<8xf32>, tensor<8xf32>
  return
}

// -----

// Tests that linear_cross_entropy gives one f32 statistic per row.
func.func @linear_cross_entropy_statistics(%h: tensor<8x4xf32>, %w: tensor<16x4xf32>, %l: tensor<8xi64>) {
  // expected-error @below {{row statistics and their gradients are 'tensor<8xf32>', not 'tensor<16xf32>'}}
  %lse, %t = pcc.linear_cross_entropy %h, %w, %l ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<16xf32>
  return
}

// -----

// Tests that linear_cross_entropy_grad takes one cotangent per row.
func.func @linear_cross_entropy_grad_rows(%h: tensor<8x4xf32>, %w: tensor<16x4xf32>, %l: tensor<8xi64>, %s: tensor<8xf32>, %g: tensor<4xf32>) {
  // expected-error @below {{row statistics and their gradients are 'tensor<8xf32>', not 'tensor<4xf32>'}}
  %dh, %dw = pcc.linear_cross_entropy_grad %h, %w, %l, %s, %g, %s ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<4xf32>, tensor<8xf32> -> tensor<8x4xf32>, tensor<16x4xf32>
  return
}

// -----

// Tests that linear_cross_entropy_grad gives the operands' types.
func.func @linear_cross_entropy_grad_types(%h: tensor<8x4xf32>, %w: tensor<16x4xf32>, %l: tensor<8xi64>, %s: tensor<8xf32>) {
  // expected-error @below {{gives gradients of the hidden states' and the weight's types}}
  %dh, %dw = pcc.linear_cross_entropy_grad %h, %w, %l, %s, %s, %s ignore_index = -100 {transpose_w} : tensor<8x4xf32>, tensor<16x4xf32>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x4xf32>, tensor<4x16xf32>
  return
}

// -----

// Tests that cross_entropy_grad takes one gradient per row.
func.func @cross_entropy_grad_rows(%x: tensor<8x16xf32>, %l: tensor<8xi64>, %g: tensor<4xf32>) -> tensor<8x16xf32> {
  // expected-error @below {{takes one gradient per row in 'f32' and gives the logits' shape in their type}}
  %0 = pcc.cross_entropy_grad %x, %l, %g ignore_index = -100 : tensor<8x16xf32>, tensor<8xi64>, tensor<4xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

// Tests that in-place ops write model state, not computed values.
func.func @accumulate_state(%x: tensor<4xf32>, %g: tensor<4xf32>) {
  // expected-error @below {{writes model state in place: operand must be a pcc.param, not a computed value}}
  pcc.accumulate %x, %g : tensor<4xf32>
  return
}

// -----

func.func @zero_state(%x: tensor<4xf32>) {
  // expected-error @below {{writes model state in place: operand must be a pcc.param, not a computed value}}
  pcc.zero %x : tensor<4xf32>
  return
}

// -----

// Tests that an optimizer update takes the norm as a float32 scalar.
func.func @adamw_norm(%n: tensor<1xf32>) {
  %w = pcc.param "w" : tensor<4xf32>
  %g = pcc.param "w@grad" : tensor<4xf32>
  %m = pcc.param "w@exp_avg" : tensor<4xf32>
  %v = pcc.param "w@exp_avg_sq" : tensor<4xf32>
  // expected-error @below {{takes the gradient norm as a tensor<f32>}}
  pcc.adamw_update %w, %g, %m, %v, %n : tensor<4xf32>, tensor<1xf32>
  return
}

// -----

func.func @sgd_state(%b: tensor<4xf32>, %n: tensor<f32>) {
  %w = pcc.param "w" : tensor<4xf32>
  %g = pcc.param "w@grad" : tensor<4xf32>
  // expected-error @below {{writes model state in place: operand must be a pcc.param, not a computed value}}
  pcc.sgd_update %w, %g, %b, %n : tensor<4xf32>, tensor<f32>
  return
}

// -----

// Tests that a convolution gradient is shaped like the convolution's result.
func.func @conv_grad_input_shape(%g: tensor<2x6x4x4xf32>, %w: tensor<6x2x3x2xf32>) -> tensor<2x4x7x6xf32> {
  // expected-error @below {{gradient 'tensor<2x6x4x4xf32>' is not shaped like the convolution's result of 'tensor<2x4x7x6xf32>' by 'tensor<6x2x3x2xf32>'}}
  %0 = pcc.conv_grad_input %g, %w strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
      : tensor<2x6x4x4xf32>, tensor<6x2x3x2xf32> -> tensor<2x4x7x6xf32>
  return %0 : tensor<2x4x7x6xf32>
}

// -----

// Tests that a convolution gradient's groups fit its channels.
func.func @conv_grad_weight_groups(%x: tensor<2x4x7x6xf32>, %g: tensor<2x6x4x5xf32>) -> tensor<6x2x3x2xf32> {
  // expected-error @below {{groups 3 do not fit input 'tensor<2x4x7x6xf32>' and weight 'tensor<6x2x3x2xf32>'}}
  %0 = pcc.conv_grad_weight %x, %g strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 3
      : tensor<2x4x7x6xf32>, tensor<2x6x4x5xf32> -> tensor<6x2x3x2xf32>
  return %0 : tensor<6x2x3x2xf32>
}

// -----

// Tests that a pooling gradient is shaped like the pooling's result.
func.func @avg_pool_grad_shape(%g: tensor<2x4x3x3xf32>) -> tensor<2x4x7x6xf32> {
  // expected-error @below {{gradient 'tensor<2x4x3x3xf32>' is not shaped like the pooling's result of 'tensor<2x4x7x6xf32>'}}
  %0 = pcc.avg_pool_grad %g kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode}
      : tensor<2x4x3x3xf32> -> tensor<2x4x7x6xf32>
  return %0 : tensor<2x4x7x6xf32>
}

// -----

// Tests that a moving average's momentum lies in [0, 1].
func.func @ema_momentum(%v: tensor<8xf32>) {
  %s = pcc.param "bn.running_mean" : tensor<8xf32>
  // expected-error @below {{momentum 1.500000e+00 is outside [0, 1]}}
  pcc.ema_update %s, %v momentum = 1.5 scale = 1.0 : tensor<8xf32>
  return
}

// -----

func.func @assign_state(%x: tensor<4xf32>, %y: tensor<4xf32>) {
  // expected-error @below {{writes model state in place: operand must be a pcc.param, not a computed value}}
  pcc.assign %x, %y : tensor<4xf32>
  return
}

// -----

// Tests that a flat (ZeRO) shard is ceil(elements / ranks) long: 10
// elements over 3 ranks are pieces of 4.
module {
  pcc.mesh @mesh [dp = 3]
  func.func @flat_piece() -> tensor<3xf32> {
    // expected-error @below {{shard: a flat shard of 10 elements over 3 ranks is a 'tensor<4xf32>', not 'tensor<3xf32>'}}
    %m = pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) of [5, 2] : tensor<3xf32>
    return %m : tensor<3xf32>
  }
}

// -----

module {
  pcc.mesh @mesh [dp = 3]
  func.func @flat_needs_whole() -> tensor<4xf32> {
    // expected-error @below {{shard: a flat shard needs the whole shape (`of`)}}
    %m = pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) : tensor<4xf32>
    return %m : tensor<4xf32>
  }
}

// -----

func.func @whole_needs_flat() -> tensor<5x2xf32> {
  // expected-error @below {{has a whole shape (`of`) but no flat shard}}
  %w = pcc.param "w" of [5, 2] : tensor<5x2xf32>
  return %w : tensor<5x2xf32>
}

// -----

// Tests the flat shard within a tensor-parallel split: its length counts
// the tp piece's elements (12 of [8, 3] at tp=2, pieces of 4 over dp=3).
module {
  pcc.mesh @mesh [dp = 3, tp = 2]
  func.func @within_piece() -> tensor<8xf32> {
    // expected-error @below {{shard: a flat shard of 12 elements over 3 ranks is a 'tensor<4xf32>', not 'tensor<8xf32>'}}
    %m = pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) of [8, 3] within(#pcc.shard<tp, dim = 0>) : tensor<8xf32>
    return %m : tensor<8xf32>
  }
}

// -----

module {
  pcc.mesh @mesh [dp = 3, tp = 2]
  func.func @within_divides() -> tensor<5xf32> {
    // expected-error @below {{within: #pcc.shard<tp, dim = 1> does not split a tensor of shape [8, 3]}}
    %m = pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) of [8, 3] within(#pcc.shard<tp, dim = 1>) : tensor<5xf32>
    return %m : tensor<5xf32>
  }
}

// -----

module {
  pcc.mesh @mesh [dp = 3, tp = 2]
  func.func @within_needs_flat() -> tensor<4x3xf32> {
    // expected-error @below {{within: only a flat shard is taken within a split}}
    %m = pcc.param "w" shard(#pcc.shard<tp, dim = 0>) within(#pcc.shard<tp, dim = 0>) : tensor<4x3xf32>
    return %m : tensor<4x3xf32>
  }
}

// -----

module {
  pcc.mesh @mesh [dp = 2]
  func.func @within_other_axis() -> tensor<2xf32> {
    // expected-error @below {{within: the split and the flat shard are over the same mesh axis 'dp'}}
    %m = pcc.param "w@exp_avg" shard(#pcc.shard<dp, flat>) of [8] within(#pcc.shard<dp, dim = 0>) : tensor<2xf32>
    return %m : tensor<2xf32>
  }
}

// -----

// Tests that a gradient bucket is 1-D and its axis is in the mesh.
module {
  pcc.mesh @mesh [dp = 2]
  func.func @bucket_rank() {
    %b = pcc.param "w@bucket" : tensor<4x4xf32>
    // expected-error @below {{bucket: a gradient bucket is 1-D, not 'tensor<4x4xf32>'}}
    pcc.bucket_start %b axis = "dp" : tensor<4x4xf32>
    return
  }
}

// -----

module {
  pcc.mesh @mesh [dp = 2]
  func.func @bucket_axis() {
    %b = pcc.param "w@bucket" : tensor<16xf32>
    // expected-error @below {{'pcc.bucket_wait' op names mesh axis 'tp', which is not an axis of @mesh}}
    pcc.bucket_wait %b axis = "tp" : tensor<16xf32>
    return
  }
}

// -----

// Tests that a mesh names each axis once.
module {
  // expected-error @below {{axes: 'tp' is empty or named twice}}
  pcc.mesh @mesh [tp = 2, tp = 2]
}

// -----

// Tests that every mesh axis has at least one rank.
module {
  // expected-error @below {{axes: 'dp' needs a size >= 1, got 0}}
  pcc.mesh @mesh [dp = 0, tp = 2]
}

// -----

// Tests that a module has one mesh.
module {
  // expected-error @below {{module: one pcc.mesh per module}}
  pcc.mesh @mesh [dp = 2]
  pcc.mesh @other [tp = 2]
}

// -----

// Tests that the mesh lives in a module.
func.func @nested() {
  // expected-error @below {{expects parent op 'builtin.module'}}
  "pcc.mesh"() {sym_name = "mesh", axes = ["dp"], shape = array<i64: 2>} : () -> ()
  return
}

// -----

// Tests that the mesh's former attribute form names the op that replaced it.
// expected-error @below {{pcc.mesh is not an attribute: the mesh is an op in the module, in the rank grid's order, e.g. pcc.mesh @mesh [dp = 2, pp = 1, tp = 2]}}
module attributes {pcc.mesh = {dp = 2 : i64}} {
}

// -----

// Tests that a started gather stacks one piece per rank of its axis.
module {
  pcc.mesh @mesh [dp = 2]
  func.func @gather_start_shape(%x: tensor<4xf32>) -> tensor<3x4xf32> {
    // expected-error @below {{the stacked tensor must be 'tensor<2x4xf32>' for 2 ranks of 'dp', got 'tensor<3x4xf32>'}}
    %a = pcc.all_gather_start %x axis = "dp" : tensor<4xf32> -> tensor<3x4xf32>
    %r = pcc.wait_collectives axis = "dp"(%a) reading(%x) : (tensor<3x4xf32>), (tensor<4xf32>) -> tensor<3x4xf32>
    return %r : tensor<3x4xf32>
  }
}

// -----

// Tests that only a wait may read a started gather's result.
module {
  pcc.mesh @mesh [dp = 2]
  func.func @gather_start_read(%x: tensor<4xf32>) -> tensor<2x4xf32> {
    // expected-error @below {{the result must be used by one pcc.wait_collectives and nothing else}}
    %a = pcc.all_gather_start %x axis = "dp" : tensor<4xf32> -> tensor<2x4xf32>
    %b = pcc.neg %a : tensor<2x4xf32>
    return %b : tensor<2x4xf32>
  }
}

// -----

// Tests that only a wait may read a started reduce-scatter's result.
module {
  pcc.mesh @mesh [dp = 2]
  func.func @scatter_start_read(%x: tensor<2x4xf32>) -> tensor<4xf32> {
    // expected-error @below {{the result must be used by one pcc.wait_collectives and nothing else}}
    %a = pcc.reduce_scatter_start %x axis = "dp" : tensor<2x4xf32> -> tensor<4xf32>
    return %a : tensor<4xf32>
  }
}

// -----

// Tests that a wait completes collectives started over its own axis.
module {
  pcc.mesh @mesh [dp = 2, tp = 2]
  func.func @wait_axis(%x: tensor<4xf32>) -> tensor<2x4xf32> {
    %a = pcc.all_gather_start %x axis = "tp" : tensor<4xf32> -> tensor<2x4xf32>
    // expected-error @below {{started operand is not a collective started over 'dp'}}
    %r = pcc.wait_collectives axis = "dp"(%a) reading(%x) : (tensor<2x4xf32>), (tensor<4xf32>) -> tensor<2x4xf32>
    return %r : tensor<2x4xf32>
  }
}

// -----

// Tests that a wait keeps the inputs of what it completes.
module {
  pcc.mesh @mesh [dp = 2]
  func.func @wait_reading(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<2x4xf32> {
    %a = pcc.all_gather_start %x axis = "dp" : tensor<4xf32> -> tensor<2x4xf32>
    // expected-error @below {{does not keep the input of a collective it completes ('reading' lacks it)}}
    %r = pcc.wait_collectives axis = "dp"(%a) reading(%y) : (tensor<2x4xf32>), (tensor<4xf32>) -> tensor<2x4xf32>
    return %r : tensor<2x4xf32>
  }
}

// -----

// Tests that a wait's result has its started value's type.
module {
  pcc.mesh @mesh [dp = 2]
  func.func @wait_type(%x: tensor<4xf32>) -> tensor<8xf32> {
    %a = pcc.all_gather_start %x axis = "dp" : tensor<4xf32> -> tensor<2x4xf32>
    // expected-error @below {{result type 'tensor<8xf32>' differs from its started value's 'tensor<2x4xf32>'}}
    %r = pcc.wait_collectives axis = "dp"(%a) reading(%x) : (tensor<2x4xf32>), (tensor<4xf32>) -> tensor<8xf32>
    return %r : tensor<8xf32>
  }
}

// -----

// Tests that a weight's 16-bit copy has its shape and a 16-bit type.
func.func @refresh_copy_type() {
  %w = pcc.param "w" : tensor<8xf32>
  %c = pcc.param "w@bf16" : tensor<4xbf16>
  // expected-error @below {{writes a bf16 or f16 copy of an f32 weight of its shape}}
  pcc.refresh_copy %c, %w : tensor<4xbf16>, tensor<8xf32>
  return
}

// -----

// Tests that AdamW's copy operand is model state.
func.func @adamw_copy_state(%g: tensor<8xf32>, %n: tensor<f32>, %c: tensor<8xbf16>) {
  %p = pcc.param "w" : tensor<8xf32>
  %m = pcc.param "w@exp_avg" : tensor<8xf32>
  %v = pcc.param "w@exp_avg_sq" : tensor<8xf32>
  // expected-error @below {{writes model state in place}}
  pcc.adamw_update %p, %g, %m, %v, %n copy %c : tensor<8xf32>, tensor<f32>, tensor<8xbf16>
  return
}

// -----

// Tests that cross-entropy of bf16 logits gives f32 losses.
func.func @cross_entropy_bf16_loss(%x: tensor<8x16xbf16>, %l: tensor<8xi64>) -> tensor<8xbf16> {
  // expected-error @below {{gives one loss per row: 8 of 'f32'}}
  %0 = pcc.cross_entropy %x, %l ignore_index = -100 : tensor<8x16xbf16>, tensor<8xi64> -> tensor<8xbf16>
  return %0 : tensor<8xbf16>
}

// -----

// Tests that pcc.sum_squares gives a tensor<f32>.
func.func @sum_squares_result(%g: tensor<8xbf16>) -> tensor<bf16> {
  // expected-error @below {{sums the squares of an f32 or bf16 tensor into a tensor<f32>}}
  %0 = pcc.sum_squares %g : tensor<8xbf16> -> tensor<bf16>
  return %0 : tensor<bf16>
}
