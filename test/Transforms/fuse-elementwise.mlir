// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-fuse-elementwise))' | FileCheck %s

// Tests that a bias add, a broadcast and an activation become one fusion
// whose inputs are the unbroadcast tensors.
// CHECK-LABEL: func.func @bias_relu
// CHECK-SAME:    (%[[X:.*]]: tensor<2x64xf32>, %[[B:.*]]: tensor<64xf32>)
// CHECK:         %[[F:.*]] = pcc.fusion(%[[B]], %[[X]]) : (tensor<64xf32>, tensor<2x64xf32>) -> tensor<2x64xf32> {
// CHECK-NEXT:    ^bb0(%[[A0:.*]]: tensor<64xf32>, %[[A1:.*]]: tensor<2x64xf32>):
// CHECK-NEXT:      %[[BB:.*]] = pcc.broadcast %[[A0]]
// CHECK-NEXT:      %[[S:.*]] = pcc.add %[[A1]], %[[BB]]
// CHECK-NEXT:      %[[R:.*]] = pcc.relu %[[S]]
// CHECK-NEXT:      pcc.yield %[[R]]
// CHECK-NEXT:    }
// CHECK-NEXT:    return %[[F]]
func.func @bias_relu(%x: tensor<2x64xf32>, %b: tensor<64xf32>) -> tensor<2x64xf32> {
  %bb = pcc.broadcast %b : tensor<64xf32> -> tensor<2x64xf32>
  %s = pcc.add %x, %bb : tensor<2x64xf32>
  %r = pcc.relu %s : tensor<2x64xf32>
  return %r : tensor<2x64xf32>
}

// -----

// Tests that a value with a user outside the chain ends a group: %e is
// returned, so it is materialised and the group starting at %n reads it.
// CHECK-LABEL: func.func @shared
// CHECK:         %[[G1:.*]] = pcc.fusion
// CHECK:           pcc.relu
// CHECK-NEXT:      pcc.exp
// CHECK-NEXT:      pcc.yield
// CHECK:         %[[G2:.*]] = pcc.fusion(%[[G1]])
// CHECK:           pcc.neg
// CHECK-NEXT:      pcc.tanh
// CHECK-NEXT:      pcc.yield
// CHECK:         return %[[G2]], %[[G1]]
func.func @shared(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %r = pcc.relu %x : tensor<8xf32>
  %e = pcc.exp %r : tensor<8xf32>
  %n = pcc.neg %e : tensor<8xf32>
  %t = pcc.tanh %n : tensor<8xf32>
  return %t, %e : tensor<8xf32>, tensor<8xf32>
}

// -----

// Tests that a shared splat constant is cloned into the fusion and that a
// lone elementwise op without broadcasts or constants is left alone.
// CHECK-LABEL: func.func @splat
// CHECK:         pcc.fusion(%{{.*}}) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK:           pcc.constant dense<2.000000e+00>
// CHECK-NEXT:      pcc.mul
// CHECK-NEXT:      pcc.yield
// CHECK:         pcc.neg %{{.*}} : tensor<4xf32>
// CHECK-NOT:     pcc.fusion
func.func @splat(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %c = pcc.constant dense<2.0> : tensor<4xf32>
  %m = pcc.mul %x, %c : tensor<4xf32>
  %n = pcc.neg %y : tensor<4xf32>
  return %m, %n : tensor<4xf32>, tensor<4xf32>
}

// -----

// Tests that ops of another shape (the reduction) and casts are not fused.
// CHECK-LABEL: func.func @boundaries
// CHECK:         pcc.cast
// CHECK:         pcc.reduce_sum
// CHECK-NOT:     pcc.fusion
func.func @boundaries(%x: tensor<4x8xi64>) -> tensor<4xf32> {
  %c = pcc.cast %x : tensor<4x8xi64> -> tensor<4x8xf32>
  %r = pcc.reduce_sum %c axes = [1] : tensor<4x8xf32> -> tensor<4xf32>
  %n = pcc.neg %r : tensor<4xf32>
  return %n : tensor<4xf32>
}

// -----

// Tests that a group does not move a read of loaded state past a store to
// that state: %s reads the gradient as loaded before the accumulate, so it
// stays before it and only %r and %e (after the store) fuse.
// CHECK-LABEL: func.func @state_store_between
// CHECK:         %[[G:.*]] = pcc.param "w@grad"
// CHECK-NEXT:    %[[S:.*]] = pcc.mul %[[G]], %[[G]]
// CHECK-NEXT:    pcc.accumulate %[[G]]
// CHECK-NEXT:    %[[F:.*]] = pcc.fusion(%[[S]])
// CHECK:           pcc.relu
// CHECK-NEXT:      pcc.exp
// CHECK-NEXT:      pcc.yield
// CHECK:         return %[[F]]
func.func @state_store_between(%d: tensor<8xf32>) -> tensor<8xf32> {
  %g = pcc.param "w@grad" : tensor<8xf32>
  %s = pcc.mul %g, %g : tensor<8xf32>
  pcc.accumulate %g, %d : tensor<8xf32>
  %r = pcc.relu %s : tensor<8xf32>
  %e = pcc.exp %r : tensor<8xf32>
  return %e : tensor<8xf32>
}

// -----

// Tests that a store to other state does not stop a group.
// CHECK-LABEL: func.func @other_state_store
// CHECK:         pcc.param "v@grad"
// CHECK-NEXT:    pcc.accumulate
// CHECK-NEXT:    %[[F:.*]] = pcc.fusion
// CHECK:           pcc.mul
// CHECK-NEXT:      pcc.relu
// CHECK-NEXT:      pcc.yield
// CHECK:         return %[[F]]
func.func @other_state_store(%d: tensor<8xf32>) -> tensor<8xf32> {
  %g = pcc.param "w@grad" : tensor<8xf32>
  %s = pcc.mul %g, %g : tensor<8xf32>
  %v = pcc.param "v@grad" : tensor<8xf32>
  pcc.accumulate %v, %d : tensor<8xf32>
  %r = pcc.relu %s : tensor<8xf32>
  return %r : tensor<8xf32>
}
