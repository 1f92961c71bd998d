// RUN: pcc-opt %s --split-input-file --cse | FileCheck %s

// A pcc.param loads model state at its place and the in-place updates
// store to it (PccOps.td, Pcc_StateResource): CSE merges two loads of a
// state with no store between them, never two across a store.

// CHECK-LABEL: func.func @loads
// CHECK:         %[[W:.*]] = pcc.param "w"
// CHECK-NOT:     pcc.param
// CHECK:         pcc.add %[[W]], %[[W]]
func.func @loads() -> tensor<4xf32> {
  %a = pcc.param "w" : tensor<4xf32>
  %b = pcc.param "w" : tensor<4xf32>
  %s = pcc.add %a, %b : tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @loads_across_store
// CHECK:         %[[A:.*]] = pcc.param "w@grad"
// CHECK-NEXT:    pcc.accumulate %[[A]]
// CHECK-NEXT:    %[[B:.*]] = pcc.param "w@grad"
// CHECK-NEXT:    return %[[B]]
func.func @loads_across_store(%d: tensor<4xf32>) -> tensor<4xf32> {
  %a = pcc.param "w@grad" : tensor<4xf32>
  pcc.accumulate %a, %d : tensor<4xf32>
  %b = pcc.param "w@grad" : tensor<4xf32>
  return %b : tensor<4xf32>
}

// -----

// An unused load is dead.
// CHECK-LABEL: func.func @dead_load
// CHECK-NOT:     pcc.param
// CHECK:         return
func.func @dead_load(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = pcc.param "w" : tensor<4xf32>
  return %x : tensor<4xf32>
}
