// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-plan-memory))' | FileCheck %s --check-prefixes=CHECK,ANY
// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-plan-memory{cpu=true}))' | FileCheck %s --check-prefixes=CPU,ANY

// A weight gradient's last reader is the pcc.accumulate that adds it into
// its state: its buffer is free from there on, for any target. (Released
// only at ops with results, a pipeline's W phase kept every weight
// gradient of its stage: 108 MB of GPT-2's 3 layers a stage.)
// ANY-LABEL: func.func @accumulated
// ANY-SAME:    attributes {pcc.arena_bytes = 1024 : i64,
// ANY:         pcc.matmul {{.*}} {pcc.buffer_offsets = array<i64: 0>
// ANY:         pcc.accumulate
// ANY:         pcc.matmul {{.*}} {pcc.buffer_offsets = array<i64: 0>
// ANY:         pcc.accumulate
func.func @accumulated(%x: tensor<16x16xf32>, %y: tensor<16x16xf32>) attributes {pcc.phase = "backward"} {
  %g1 = pcc.param "w1@grad" : tensor<16x16xf32>
  %d1 = pcc.matmul %x, %y {transpose_a} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  pcc.accumulate %g1, %d1 : tensor<16x16xf32>
  %g2 = pcc.param "w2@grad" : tensor<16x16xf32>
  %d2 = pcc.matmul %y, %x {transpose_a} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  pcc.accumulate %g2, %d2 : tensor<16x16xf32>
  return
}

// -----

// For the CPU alone, a product assigned whole to a state loaded before it
// is computed in the state: no buffer (-1). Planned for any target, it
// has one.
// ANY-LABEL: func.func @into_state
// CHECK-SAME:  attributes {pcc.arena_bytes = 1024 : i64,
// CPU-SAME:    attributes {pcc.arena_bytes = 0 : i64,
// CHECK:       pcc.matmul {{.*}} {pcc.buffer_offsets = array<i64: 0>
// CPU:         pcc.matmul {{.*}} {pcc.buffer_offsets = array<i64: -1>
// ANY:         pcc.assign
func.func @into_state(%x: tensor<16x16xf32>, %y: tensor<16x16xf32>) attributes {pcc.phase = "backward"} {
  %g = pcc.param "w@grad" : tensor<16x16xf32>
  %d = pcc.matmul %x, %y {transpose_a} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  pcc.assign %g, %d : tensor<16x16xf32>
  return
}

// -----

// The state loaded after the product: the product is not computed in it.
// ANY-LABEL: func.func @loaded_after
// ANY:         pcc.matmul {{.*}} {pcc.buffer_offsets = array<i64: 0>
func.func @loaded_after(%x: tensor<16x16xf32>, %y: tensor<16x16xf32>) attributes {pcc.phase = "backward"} {
  %d = pcc.matmul %x, %y {transpose_a} : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
  %g = pcc.param "w@grad" : tensor<16x16xf32>
  pcc.assign %g, %d : tensor<16x16xf32>
  return
}

// -----

// The squares of the gradient norm are summed as they are read, and an
// embedding's scatter-add is computed in the state it is accumulated
// into (the 154 MB of GPT-2's table, twice: the norm's squares and the
// gradient). Its operands live to the accumulate.
// ANY-LABEL: func.func @norm_and_scatter
// CPU-SAME:    attributes {pcc.arena_bytes = 64 : i64,
// CHECK:       pcc.mul {{.*}} {pcc.buffer_offsets = array<i64: 0>
// CPU:         pcc.mul {{.*}} {pcc.buffer_offsets = array<i64: -1>
// CPU:         pcc.reduce_sum {{.*}} {pcc.buffer_offsets = array<i64: 0>
// CPU:         pcc.scatter_add {{.*}} {pcc.buffer_offsets = array<i64: -1>
func.func @norm_and_scatter(%ids: tensor<4xi64>, %u: tensor<4x16xf32>) -> tensor<f32> attributes {pcc.phase = "backward"} {
  %g = pcc.param "w@grad" : tensor<64x16xf32>
  %sq = pcc.mul %g, %g : tensor<64x16xf32>
  %n = pcc.reduce_sum %sq axes = [0, 1] : tensor<64x16xf32> -> tensor<f32>
  %s = pcc.scatter_add %u[%ids] axis = 0 : tensor<4x16xf32>, tensor<4xi64> -> tensor<64x16xf32>
  %e = pcc.param "e@grad" : tensor<64x16xf32>
  pcc.accumulate %e, %s : tensor<64x16xf32>
  %r = pcc.add %n, %n : tensor<f32>
  return %r : tensor<f32>
}
