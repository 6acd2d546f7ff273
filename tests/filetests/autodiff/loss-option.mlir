// The pass option `loss=sum` replaces the mean-square loss by the sum of the first output:
// one ReduceSum in the loss phase and no Mul/Div, so the backward starts from an expanded 1.
// RUN: pipec opt %s '--passes=autodiff{loss=sum}' | FileCheck %s

// CHECK: pipec.saved = ["loss", "r", "x"]
// CHECK: %loss = "onnx.ReduceSum"(%y) {keepdims = 0 : i64, pipec.node = "loss/ReduceSum", pipec.phase = "loss"
// CHECK-NOT: pipec.phase = "loss"
// CHECK: "onnx.Expand"
// CHECK: func.return %loss, %y, %grad_w1, %grad_b1, %grad_w2

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x3xf32, ["batch"]>) -> (tensor<?x2xf32, ["batch"]>) {
    %w1 = "pipec.initializer"() {value = dense<[[0.5, -1.0, 0.25], [1.0, 0.0, -0.5], [0.1, 0.2, 0.3], [-0.3, 0.4, 0.5]]> : tensor<4x3xf32>} : () -> tensor<4x3xf32>
    %b1 = "pipec.initializer"() {value = dense<[0.1, -0.1, 0.0, 0.2]> : tensor<4xf32>} : () -> tensor<4xf32>
    %w2 = "pipec.initializer"() {value = dense<[[1.0, -1.0, 0.5, 0.25], [0.0, 1.0, -0.5, 1.0]]> : tensor<2x4xf32>} : () -> tensor<2x4xf32>
    %h = "onnx.Gemm"(%x, %w1, %b1) {transB = 1 : i64} : (tensor<?x3xf32, ["batch"]>, tensor<4x3xf32>, tensor<4xf32>) -> tensor<?x4xf32, ["batch"]>
    %r = "onnx.Relu"(%h) : (tensor<?x4xf32, ["batch"]>) -> tensor<?x4xf32, ["batch"]>
    %y = "onnx.Gemm"(%r, %w2) {transB = 1 : i64} : (tensor<?x4xf32, ["batch"]>, tensor<2x4xf32>) -> tensor<?x2xf32, ["batch"]>
    func.return %y : tensor<?x2xf32, ["batch"]>
  }
}
