// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-merge-state-loads))' | FileCheck %s

// Tests that a load used only to name the state an update stores to joins
// the earlier load across the store (a tied weight's gradient accumulated
// from two uses).
// CHECK-LABEL: func.func @names_only
// CHECK:         %[[G:.*]] = pcc.param "w@grad"
// CHECK-NEXT:    pcc.accumulate %[[G]], %{{.*}}
// CHECK-NEXT:    pcc.accumulate %[[G]], %{{.*}}
// CHECK-NEXT:    return
func.func @names_only(%d1: tensor<4xf32>, %d2: tensor<4xf32>) {
  %a = pcc.param "w@grad" : tensor<4xf32>
  pcc.accumulate %a, %d1 : tensor<4xf32>
  %b = pcc.param "w@grad" : tensor<4xf32>
  pcc.accumulate %b, %d2 : tensor<4xf32>
  return
}

// -----

// Tests that a load whose value is read stays when a store to its state
// lies between, and joins the earlier one across stores to other state.
// CHECK-LABEL: func.func @values
// CHECK:         %[[G:.*]] = pcc.param "w@grad"
// CHECK-NEXT:    %[[V:.*]] = pcc.param "v@grad"
// CHECK-NEXT:    pcc.accumulate %[[V]]
// CHECK-NEXT:    %[[S:.*]] = pcc.add %[[G]], %[[G]]
// CHECK-NEXT:    pcc.accumulate %[[G]], %[[S]]
// CHECK-NEXT:    %[[G2:.*]] = pcc.param "w@grad"
// CHECK-NEXT:    return %[[G2]]
func.func @values(%d: tensor<4xf32>) -> tensor<4xf32> {
  %a = pcc.param "w@grad" : tensor<4xf32>
  %v = pcc.param "v@grad" : tensor<4xf32>
  pcc.accumulate %v, %d : tensor<4xf32>
  %b = pcc.param "w@grad" : tensor<4xf32>
  %s = pcc.add %a, %b : tensor<4xf32>
  pcc.accumulate %a, %s : tensor<4xf32>
  %c = pcc.param "w@grad" : tensor<4xf32>
  return %c : tensor<4xf32>
}

// -----

// Tests that loads of one state in different layouts stay apart.
// CHECK-LABEL: func.func @layouts
// CHECK:         pcc.param "w" :
// CHECK-NEXT:    pcc.param "w" shard(#pcc.shard<tp, dim = 0>)
module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 2]
  func.func @layouts() -> (tensor<4xf32>, tensor<2xf32>) {
    %a = pcc.param "w" : tensor<4xf32>
    %b = pcc.param "w" shard(#pcc.shard<tp, dim = 0>) : tensor<2xf32>
    return %a, %b : tensor<4xf32>, tensor<2xf32>
  }
}
