// RUN: pcc-opt %s --pcc-loss=kind=mse --pcc-autodiff --split-input-file --verify-diagnostics

// An op without a gradient rule (here a gradient op: no second
// derivatives) is refused where it is.
func.func @main(%x: tensor<1x1x2x2xf32>) -> tensor<1x1x4x4xf32> {
  %w = pcc.param "conv.weight" : tensor<1x1x2x2xf32>
  // expected-error @+1 {{autodiff: pcc.conv_grad_input has no gradient rule; training through it is not supported yet}}
  %y = pcc.conv_grad_input %x, %w strides = [2, 2] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 1 : tensor<1x1x2x2xf32>, tensor<1x1x2x2xf32> -> tensor<1x1x4x4xf32>
  return %y : tensor<1x1x4x4xf32>
}

// -----

// expected-error @+1 {{autodiff: the loss does not depend on any float weight; there is nothing to train}}
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = pcc.relu %x : tensor<4xf32>
  return %y : tensor<4xf32>
}
