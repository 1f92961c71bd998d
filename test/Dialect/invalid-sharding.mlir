// RUN: pcc-opt %s --split-input-file --verify-diagnostics

// Tests that a sharding names an axis of the mesh.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @unknown_axis(%x: tensor<2x64xf32>) -> tensor<2x64xf32> {
    // expected-error @below {{mesh axis 'dp' is not in the module's pcc.mesh}}
    %a = pcc.relu %x {pcc.sharding = [#pcc.shard<dp, dim = 1>]} : tensor<2x64xf32>
    return %a : tensor<2x64xf32>
  }
}

// -----

// Tests that a split dimension divides into stripes x ranks.
module {
  pcc.mesh @mesh [tp = 4]
  func.func @indivisible(%x: tensor<2x6xf32>) -> tensor<2x6xf32> {
    // expected-error @below {{dimension 1 (6) does not divide into 1 stripe(s) x 4 ranks of 'tp'}}
    %a = pcc.relu %x {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<2x6xf32>
    return %a : tensor<2x6xf32>
  }
}

// -----

// Tests that a split dimension exists.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @dim_range(%x: tensor<2x64xf32>) -> tensor<2x64xf32> {
    // expected-error @below {{dim 2 is out of range for 'tensor<2x64xf32>'}}
    %a = pcc.relu %x {pcc.sharding = [#pcc.shard<tp, dim = 2>]} : tensor<2x64xf32>
    return %a : tensor<2x64xf32>
  }
}

// -----

// Tests that there is one sharding per result.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @count(%x: tensor<2x64xf32>) -> tensor<2x64xf32> {
    // expected-error @below {{pcc.sharding needs one #pcc.shard per result (1)}}
    %a = pcc.relu %x {pcc.sharding = []} : tensor<2x64xf32>
    return %a : tensor<2x64xf32>
  }
}

// -----

// Tests that partial sums are float tensors.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @partial_int(%x: tensor<4xi64>) -> tensor<4xi64> {
    // expected-error @below {{a partial sum needs a float tensor}}
    %a = pcc.neg %x {pcc.sharding = [#pcc.shard<tp, partial>]} : tensor<4xi64>
    return %a : tensor<4xi64>
  }
}

// -----

// Tests that a stored weight is only ever split.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @param_partial() -> tensor<4x4xf32> {
    // expected-error @below {{a stored weight can only be split}}
    %w = pcc.param "w" shard(#pcc.shard<tp, partial>) : tensor<4x4xf32>
    return %w : tensor<4x4xf32>
  }
}

// -----

// Tests that an all-gather stacks one piece per rank.
module {
  pcc.mesh @mesh [tp = 4]
  func.func @gather_shape(%x: tensor<2x16xf32>) -> tensor<2x2x16xf32> {
    // expected-error @below {{the stacked tensor must be 'tensor<4x2x16xf32>' for 4 ranks of 'tp'}}
    %g = pcc.all_gather %x axis = "tp" : tensor<2x16xf32> -> tensor<2x2x16xf32>
    return %g : tensor<2x2x16xf32>
  }
}

// -----

// Tests that a shard slice keeps one rank's part.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @slice_shape(%x: tensor<2x64xf32>) -> tensor<2x16xf32> {
    // expected-error @below {{result must be 'tensor<2x32xf32>'}}
    %s = pcc.shard_slice %x axis = "tp" dim = 1 stripes = 1 : tensor<2x64xf32> -> tensor<2x16xf32>
    return %s : tensor<2x16xf32>
  }
}

// -----

// Tests that collectives need a mesh.
func.func @no_mesh(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'pcc.all_reduce' op names mesh axis 'tp', but the module has no pcc.mesh}}
  %r = pcc.all_reduce %x axis = "tp" : tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

// Tests that a shard gather has the gather's result shape and a mesh axis.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @shard_gather_shape(%t: tensor<8x4xf32>, %i: tensor<3xi64>) -> tensor<3x8xf32> {
    // expected-error @below {{result must be 'tensor<3x4xf32>', got 'tensor<3x8xf32>'}}
    %g = pcc.shard_gather %t[%i] axis = 0 mesh_axis = "tp" : tensor<8x4xf32>, tensor<3xi64> -> tensor<3x8xf32>
    return %g : tensor<3x8xf32>
  }
}

// -----

module {
  pcc.mesh @mesh [tp = 2]
  func.func @shard_gather_axis(%t: tensor<8x4xf32>, %i: tensor<3xi64>) -> tensor<3x4xf32> {
    // expected-error @below {{'pcc.shard_gather' op names mesh axis 'pp', which is not an axis of @mesh}}
    %g = pcc.shard_gather %t[%i] axis = 0 mesh_axis = "pp" : tensor<8x4xf32>, tensor<3xi64> -> tensor<3x4xf32>
    return %g : tensor<3x4xf32>
  }
}

// -----

// Tests that a shard scatter-add's updates are what gathering from its
// block gives and that it names a mesh axis.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @shard_scatter_add_shape(%g: tensor<3x5xf32>, %i: tensor<3xi64>) -> tensor<4x4xf32> {
    // expected-error @below {{updates 'tensor<3x5xf32>' are not what gathering 'tensor<3xi64>' from 'tensor<4x4xf32>' along axis 0 gives}}
    %t = pcc.shard_scatter_add %g[%i] axis = 0 mesh_axis = "tp" : tensor<3x5xf32>, tensor<3xi64> -> tensor<4x4xf32>
    return %t : tensor<4x4xf32>
  }
}

// -----

module {
  pcc.mesh @mesh [tp = 2]
  func.func @shard_scatter_add_axis(%g: tensor<3x4xf32>, %i: tensor<3xi64>) -> tensor<4x4xf32> {
    // expected-error @below {{'pcc.shard_scatter_add' op names mesh axis 'dp', which is not an axis of @mesh}}
    %t = pcc.shard_scatter_add %g[%i] axis = 0 mesh_axis = "dp" : tensor<3x4xf32>, tensor<3xi64> -> tensor<4x4xf32>
    return %t : tensor<4x4xf32>
  }
}
