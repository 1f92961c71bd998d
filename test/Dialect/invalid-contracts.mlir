// RUN: pcc-opt %s --split-input-file --verify-diagnostics

// What the passes tell each other is verified (Contracts.h, ScheduleAttr.h):
// the module's pcc.training, a pipelined main's pcc.schedule, the phase and
// stage marks on functions.

// Tests that a known entry with the wrong value is refused.
// expected-error @below {{pcc.training loss must be one of 'cross_entropy' 'mse' 'none'}}
module attributes {pcc.training = {loss = "hinge"}} {
}

// -----

// Tests that an unknown entry is refused, naming the known ones.
// expected-error @below {{pcc.training: unknown entry 'lr' (loss, ignore_index, microbatches, optimizer, weights, tied, zero, buckets, offload)}}
module attributes {pcc.training = {lr = 1.0e-03 : f64}} {
}

// -----

// Tests that a ZeRO stage is 0 to 3.
// expected-error @below {{pcc.training zero must be an integer in [0, 3]}}
module attributes {pcc.training = {zero = 4 : i64}} {
}

// -----

// Tests that a bucket has one offset per gradient.
// expected-error @below {{pcc.training bucket 'w@bucket': one offset (>= 0) per gradient}}
module attributes {pcc.training = {buckets = [{grads = ["w@grad", "b@grad"], offsets = array<i64: 0>, state = "w@bucket"}]}} {
}

// -----

// Tests that pcc.training belongs to the module.
module {
  // expected-error @below {{pcc.training must be a dictionary on the module}}
  func.func @f() attributes {pcc.training = {loss = "mse"}} {
    return
  }
}

// -----

// Tests that a schedule's instruction names a micro-batch it has.
module {
  // expected-error @below {{pcc.schedule rank 1: 'F2' is not an instruction of 2 ranks, 2 micro-batches and 1 chunk}}
  func.func @main() attributes {pcc.schedule = {microbatches = 2 : i64, policy = "gpipe", ranks = ["F0 send_fwd0>1 F1 send_fwd1>1", "recv_fwd0<0 F0 recv_fwd1<0 F2"]}} {
    return
  }
}

// -----

// Tests that a transfer's peer is a pipeline rank.
module {
  // expected-error @below {{pcc.schedule rank 0: 'send_fwd0>2' is not an instruction of 2 ranks, 1 micro-batches and 1 chunk}}
  func.func @main() attributes {pcc.schedule = {microbatches = 1 : i64, policy = "gpipe", ranks = ["F0 send_fwd0>2", "recv_fwd0<0 F0"]}} {
    return
  }
}

// -----

// Tests that the policy is one pcc schedules.
module {
  // expected-error @below {{pcc.schedule policy must be gpipe, 1f1b, interleaved or zb-h1}}
  func.func @main() attributes {pcc.schedule = {microbatches = 1 : i64, policy = "dualpipe", ranks = ["F0"]}} {
    return
  }
}

// -----

// Tests that a phase is one of the model ABI's.
module {
  // expected-error @below {{pcc.phase must name a phase on a function (forward, backward, weight_grad, optimizer, zero_grad, optimizer_pre, optimizer_post)}}
  func.func @f() attributes {pcc.phase = "loss"} {
    return
  }
}

// -----

// Tests that a pipeline stage is an index.
module {
  // expected-error @below {{pcc.pipeline_stage must be an integer >= 0 on a function}}
  func.func @f() attributes {pcc.pipeline_stage = -1 : i64} {
    return
  }
}

// -----

// Tests that a collective's axis is an axis of the module's mesh, as a
// symbol use is checked.
module {
  pcc.mesh @mesh [dp = 2, pp = 1, tp = 1]
  func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @below {{'pcc.all_reduce' op names mesh axis 'tp2', which is not an axis of @mesh}}
    %y = pcc.all_reduce %x axis = "tp2" : tensor<4xf32>
    return %y : tensor<4xf32>
  }
}

// -----

module {
  func.func @f(%x: tensor<4xf32>) -> tensor<8xf32> {
    // expected-error @below {{'pcc.all_gather' op names mesh axis 'dp', but the module has no pcc.mesh}}
    %y = pcc.all_gather %x axis = "dp" : tensor<4xf32> -> tensor<8xf32>
    return %y : tensor<8xf32>
  }
}

// -----

// Tests the memory plan: an arena is a size, and every buffer lies in its
// function's arena.
// expected-error @below {{pcc.arena_bytes must be an integer >= 0 on a function}}
func.func @f() attributes {pcc.arena_bytes = -4 : i64} {
  return
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.arena_bytes = 16 : i64} {
  // expected-error @below {{'pcc.exp' op pcc.buffer_offsets: result 0 lies at bytes [8, 24), past the function's arena of 16 bytes}}
  %y = pcc.exp %x {pcc.buffer_offsets = array<i64: 8>} : tensor<4xf32>
  %z = pcc.exp %y {pcc.buffer_offsets = array<i64: -2>} : tensor<4xf32>
  return %z : tensor<4xf32>
}

// -----

func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> attributes {pcc.arena_bytes = 16 : i64} {
  // expected-error @below {{'pcc.exp' op pcc.buffer_offsets needs one offset per result (1)}}
  %y = pcc.exp %x {pcc.buffer_offsets = array<i64: 0, 0>} : tensor<4xf32>
  return %y : tensor<4xf32>
}
