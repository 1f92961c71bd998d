// RUN: pcc-opt %s --split-input-file --pcc-check-collectives --verify-diagnostics

// Tests that a collective over the pipeline axis that only one pipeline
// rank issues is refused: the other rank would never join it.
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func private @stage0(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.stage = 0 : i64} {
    // expected-error @below {{collectives over 'pp' do not match: pipeline rank 0 (pp=0) issues collective #1 all_reduce of tensor<4xf32> -> tensor<4xf32> but pipeline rank 1 (pp=1) issues no collective #1 (it issues 0); the job would hang or exchange mismatched data}}
    %y = pcc.all_reduce %x axis = "pp" : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  func.func private @stage1(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.stage = 1 : i64} {
    return %x : tensor<4xf32>
  }
}

// -----

// Tests that two different collectives at the same place are refused, with
// a note at the other rank's.
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func private @stage0(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.stage = 0 : i64} {
    // expected-note @below {{pipeline rank 0's collective #1 is here}}
    %y = pcc.all_reduce %x axis = "pp" : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  func.func private @stage1(%x: tensor<4xf32>) -> tensor<2x4xf32> attributes {pcc.stage = 1 : i64} {
    // expected-error @below {{collectives over 'pp' do not match: pipeline rank 0 (pp=0) issues collective #1 all_reduce of tensor<4xf32> -> tensor<4xf32> but pipeline rank 1 (pp=1) issues collective #1 all_gather of tensor<4xf32> -> tensor<2x4xf32>}}
    %y = pcc.all_gather %x axis = "pp" : tensor<4xf32> -> tensor<2x4xf32>
    return %y : tensor<2x4xf32>
  }
}

// -----

// Tests that matching collectives pass, and that collectives over other
// axes (the same program on every member of their groups) are not
// compared across pipeline ranks.
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 2]
  func.func private @stage0(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.stage = 0 : i64} {
    %y = pcc.all_reduce %x axis = "pp" : tensor<4xf32>
    %z = pcc.all_reduce %y axis = "tp" : tensor<4xf32>
    return %z : tensor<4xf32>
  }
  func.func private @stage1(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.stage = 1 : i64} {
    %y = pcc.all_reduce %x axis = "pp" : tensor<4xf32>
    return %y : tensor<4xf32>
  }
}

// -----

// Tests a pipelined training step: each pipeline rank's optimizer sums the
// tied weights' gradients over pp; a rank that sums a tensor of another
// shape (or skips the sum) is refused at compile time.
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func @stage0_forward(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.phase = "forward", pcc.pipeline_stage = 0 : i64} {
    return %x : tensor<4xf32>
  }
  func.func @stage1_forward(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.phase = "forward", pcc.pipeline_stage = 1 : i64} {
    return %x : tensor<4xf32>
  }
  func.func @rank0_optimizer() -> tensor<f32> attributes {pcc.phase = "optimizer", pcc.pipeline_rank = 0 : i64} {
    %g = pcc.param "w@grad" : tensor<4xf32>
    // expected-note @below {{pipeline rank 0's collective #1 is here}}
    %s = pcc.all_reduce %g axis = "pp" : tensor<4xf32>
    %n = pcc.constant dense<0.0> : tensor<f32>
    %t = pcc.all_reduce %n axis = "pp" : tensor<f32>
    return %t : tensor<f32>
  }
  func.func @rank0_zero_grad() attributes {pcc.phase = "zero_grad", pcc.pipeline_rank = 0 : i64} {
    return
  }
  func.func @rank1_optimizer() -> tensor<f32> attributes {pcc.phase = "optimizer", pcc.pipeline_rank = 1 : i64} {
    %n = pcc.constant dense<0.0> : tensor<f32>
    // expected-error @below {{collectives over 'pp' do not match: pipeline rank 0 (pp=0) issues collective #1 all_reduce of tensor<4xf32> -> tensor<4xf32> but pipeline rank 1 (pp=1) issues collective #1 all_reduce of tensor<f32> -> tensor<f32>}}
    %t = pcc.all_reduce %n axis = "pp" : tensor<f32>
    return %t : tensor<f32>
  }
  func.func @rank1_zero_grad() attributes {pcc.phase = "zero_grad", pcc.pipeline_rank = 1 : i64} {
    return
  }
}
