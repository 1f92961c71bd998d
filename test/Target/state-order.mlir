// RUN: not pcc-translate --pcc-to-cpp %s 2>&1 | FileCheck %s

// The C++ back end reads a loaded weight from its buffer, without a copy,
// so a use of a load after a store to the same state is refused, naming
// both (pcc::verifyStateOrder).

module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 1]
  func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32> {pcc.name = "y"}) {
    %w = pcc.param "w" : tensor<4xf32>
    pcc.assign %w, %x : tensor<4xf32>
    %y = pcc.add %w, %x : tensor<4xf32>
    return %y : tensor<4xf32>
  }
}

// CHECK: state-order.mlir:12:10: error: reads state 'w' loaded before an op that stores to it; load it again after the store
// CHECK: state-order.mlir:11:5: note: the store
