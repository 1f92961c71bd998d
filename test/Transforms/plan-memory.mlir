// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-plan-memory{emit-remark=true}))' --verify-diagnostics | FileCheck %s

// Tests reuse of dead buffers, reshapes aliasing their input, that an
// op's operands stay live while its result is written, and that a returned
// result takes no arena space (-2: written into the caller's output).
// CHECK-LABEL: func.func @chain
// CHECK-SAME:    attributes {pcc.arena_bytes = 2048 : i64}
// CHECK:         pcc.relu %{{.*}} {pcc.buffer_offsets = array<i64: 0>}
// CHECK:         pcc.exp %{{.*}} {pcc.buffer_offsets = array<i64: 1024>}
// CHECK:         pcc.neg %{{.*}} {pcc.buffer_offsets = array<i64: 0>}
// CHECK:         pcc.reshape %{{.*}} {pcc.buffer_offsets = array<i64: -1>}
// CHECK:         pcc.transpose %{{.*}} {pcc.buffer_offsets = array<i64: 1024>}
// CHECK:         pcc.reshape %{{.*}} {pcc.buffer_offsets = array<i64: -1>}
// CHECK:         pcc.add %{{.*}}, %{{.*}} {pcc.buffer_offsets = array<i64: -2>}
// expected-remark @below {{arena 2048 bytes for 4096 bytes of intermediate tensors}}
func.func @chain(%x: tensor<256xf32>) -> tensor<256xf32> {
  %0 = pcc.relu %x : tensor<256xf32>
  %1 = pcc.exp %0 : tensor<256xf32>
  %2 = pcc.neg %1 : tensor<256xf32>
  %3 = pcc.reshape %2 : tensor<256xf32> -> tensor<16x16xf32>
  %4 = pcc.transpose %3 [1, 0] : tensor<16x16xf32> -> tensor<16x16xf32>
  %5 = pcc.reshape %4 : tensor<16x16xf32> -> tensor<256xf32>
  %6 = pcc.add %5, %2 : tensor<256xf32>
  return %6 : tensor<256xf32>
}

// -----

// Tests that returned results are written into the caller's outputs (-2),
// also when later ops read them through a reshape, that params and
// constants take no arena space, and that each result of a multi-result op
// gets its own aligned offset. The unused relu result reuses split#0's
// slot, free once exp has read it.
// CHECK-LABEL: func.func @returned
// CHECK:         pcc.param {{.*}} {pcc.buffer_offsets = array<i64: -1>}
// CHECK:         pcc.constant {pcc.buffer_offsets = array<i64: -1>}
// CHECK:         pcc.split {{.*}} {pcc.buffer_offsets = array<i64: 0, 64>}
// CHECK:         pcc.exp {{.*}} {pcc.buffer_offsets = array<i64: -2>}
// CHECK:         pcc.relu {{.*}} {pcc.buffer_offsets = array<i64: 0>}
// CHECK:         pcc.concat {{.*}} {pcc.buffer_offsets = array<i64: -2>}
// expected-remark @below {{arena 128 bytes for 48 bytes of intermediate tensors}}
func.func @returned(%x: tensor<2x4xf32>) -> (tensor<8xf32>, tensor<2x2xf32>) {
  %w = pcc.param "w" : tensor<2x4xf32>
  %c = pcc.constant dense<1.0> : tensor<2x4xf32>
  %s:2 = pcc.split %x axis = 1 sizes = [2, 2] : tensor<2x4xf32> -> tensor<2x2xf32>, tensor<2x2xf32>
  %e = pcc.exp %s#0 : tensor<2x2xf32>
  %r = pcc.reshape %e : tensor<2x2xf32> -> tensor<4xf32>
  %y = pcc.relu %s#1 : tensor<2x2xf32>
  %out = pcc.concat %r, %r axis = 0 : tensor<4xf32>, tensor<4xf32> -> tensor<8xf32>
  return %out, %e : tensor<8xf32>, tensor<2x2xf32>
}
