// RUN: pcc-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(pcc-pipeline-cut)'
// RUN: not pcc-opt %s --split-input-file --pass-pipeline='builtin.module(pcc-pipeline-cut{stages=2 cuts=nowhere})' 2>&1 | FileCheck %s --check-prefix=NAMED
// NAMED: error: pipeline cut: no ONNX node 'nowhere' to cut after

// Tests that more stages than places to cut is an error that says how many
// places there are.
module {
  pcc.mesh @mesh [dp = 1, pp = 4, tp = 1]
  // expected-error @below {{pipeline cut: 4 stages need 3 cuts, but the model has 1 places to cut between its layers (where 128 bytes of activations are live); use fewer stages, or --pp-cuts to cut elsewhere}}
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %w0 = pcc.param "w0" : tensor<8x8xf32>
    %w1 = pcc.param "w1" : tensor<8x8xf32>
    %a0 = pcc.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    %a1 = pcc.matmul %a0, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %a1 : tensor<4x8xf32>
  }
}

// -----

// Tests that a transfer runs forward between stages of the mesh.
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func @back(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @below {{goes from stage 1 to stage 0; stages run forward, in [0, 2)}}
    %t = pcc.transfer %x from 1 to 0 : tensor<4xf32>
    return %t : tensor<4xf32>
  }
}

// -----

// Tests that pcc.pp_chunks multiplies the stages: 2 ranks x 2 chunks.
module attributes {pcc.pp_chunks = 2 : i64} {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func @chunks(%x: tensor<4xf32>) -> tensor<4xf32> {
    %t = pcc.transfer %x from 2 to 3 : tensor<4xf32>
    // expected-error @below {{goes from stage 3 to stage 4; stages run forward, in [0, 4)}}
    %u = pcc.transfer %t from 3 to 4 : tensor<4xf32>
    return %u : tensor<4xf32>
  }
}

// -----

// expected-error @below {{pcc.pp_chunks must be an integer >= 1 on the module}}
module attributes {pcc.pp_chunks = 0 : i64} {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
}
