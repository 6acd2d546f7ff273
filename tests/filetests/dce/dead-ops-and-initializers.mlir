// dce removes ops whose results reach no graph output (here a dead chain of two ops) and
// initializers nothing reads; what reaches an output stays, in order.
// RUN: pipec opt %s --passes=dce | FileCheck %s
// RUN: pipec opt %s --passes=dce --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK: %w = "pipec.initializer"
// CHECK-NOT: %unused =
// CHECK-NEXT: %y = "onnx.MatMul"(%x, %w)
// CHECK-NEXT: %r = "onnx.Relu"(%y)
// CHECK-NEXT: func.return %r
// CHECK-NOT: onnx.Neg
// CHECK-NOT: onnx.Exp

// STATS: dce  removed-initializers=1 removed-ops=2

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x2xf32, ["batch"]>) -> (tensor<?x2xf32, ["batch"]>) {
    %w = "pipec.initializer"() {value = dense<[[1.0, 0.0], [0.0, 1.0]]> : tensor<2x2xf32>} : () -> tensor<2x2xf32>
    %unused = "pipec.initializer"() {value = dense<[3.0, 4.0]> : tensor<2xf32>} : () -> tensor<2xf32>
    %y = "onnx.MatMul"(%x, %w) : (tensor<?x2xf32, ["batch"]>, tensor<2x2xf32>) -> tensor<?x2xf32, ["batch"]>
    %d1 = "onnx.Neg"(%y) : (tensor<?x2xf32, ["batch"]>) -> tensor<?x2xf32, ["batch"]>
    %d2 = "onnx.Exp"(%d1) : (tensor<?x2xf32, ["batch"]>) -> tensor<?x2xf32, ["batch"]>
    %r = "onnx.Relu"(%y) : (tensor<?x2xf32, ["batch"]>) -> tensor<?x2xf32, ["batch"]>
    func.return %r : tensor<?x2xf32, ["batch"]>
  }
}
