// autodiff adds the loss (default mean-square on the first output) and the backward pass in
// standard ONNX ops: the parameters' gradients become graph outputs after the loss and the
// original outputs; forward ops are marked with their phase and the inputs their backward saves.
// RUN: pipec opt %s --passes=autodiff | FileCheck %s
// RUN: pipec opt %s --passes=autodiff --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK: module attributes {pipec.grads = ["grad/w1", "grad/b1", "grad/w2"], {{.*}}pipec.loss = "loss", {{.*}}pipec.params = ["w1", "b1", "w2"]
// CHECK-SAME: pipec.saved = [{{.*}}"y", "r", "x"]
// CHECK-LABEL: func.func @main
// CHECK-SAME: -> (tensor<f32>, tensor<?x2xf32, ["batch"]>, tensor<4x3xf32>, tensor<4xf32>, tensor<2x4xf32>)
// CHECK: %h = "onnx.Gemm"(%x, %w1, %b1) {pipec.phase = "fwd", transB = 1 : i64}
// CHECK: %r = "onnx.Relu"(%h) {pipec.phase = "fwd", pipec.saved = array<i64: 0>}
// CHECK: %loss_Mul_out0 = "onnx.Mul"(%y, %y) {{.*}}pipec.phase = "loss"}
// CHECK: %loss = "onnx.Div"
// Gemm's backward: dX = dY * W (transA = 0), dW = dY^T * X (transA = 1).
// CHECK: [[DR:%[A-Za-z0-9_]+]] = "onnx.Gemm"([[DY:%[A-Za-z0-9_]+]], %w2) {{.*}}pipec.phase = "bwd", transA = 0 : i64, transB = 0 : i64}
// CHECK-NEXT: %grad_w2 = "onnx.Gemm"([[DY]], %r) {{.*}}transA = 1 : i64, transB = 0 : i64}
// Relu's backward masks the incoming cotangent where the output is positive.
// CHECK: [[MASK:%[A-Za-z0-9_]+]] = "onnx.Greater"(%r,
// CHECK-NEXT: [[DH:%[A-Za-z0-9_]+]] = "onnx.Where"([[MASK]], [[DR]],
// CHECK-NEXT: %grad_w1 = "onnx.Gemm"([[DH]], %x)
// The bias gradient sums the cotangent over the batch axis.
// CHECK: %grad_b1 = "onnx.ReduceSum"([[DH]],
// CHECK-SAME: -> tensor<4xf32>
// CHECK: func.return %loss, %y, %grad_w1, %grad_b1, %grad_w2

// STATS: autodiff  backward-ops=18 forward-ops=3 params=3 saved-values=5

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
