// optimizer appends the parameter update to a training graph (after autodiff): plain SGD is
// w - lr * grad for every parameter, one shared lr constant, the updates as graph outputs
// named update/PARAM, and no optimizer state.
// RUN: pipec opt %s '--passes=autodiff,optimizer{type=sgd lr=0.5}' | FileCheck %s
// RUN: pipec opt %s '--passes=autodiff,optimizer{type=sgd lr=0.5}' --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK: pipec.opt_inputs = []
// CHECK: [[LR:%[A-Za-z0-9_]+]] = "onnx.Constant"() {{.*}}pipec.phase = "opt", value = dense<0.5> : tensor<f32>}
// CHECK-NEXT: [[STEP:%[A-Za-z0-9_]+]] = "onnx.Mul"(%grad_w1, [[LR]])
// CHECK-NEXT: [[NEW:%[A-Za-z0-9_]+]] = "onnx.Sub"(%w1, [[STEP]])
// CHECK-NEXT: %update_w1 = "onnx.Identity"([[NEW]])
// CHECK: "onnx.Mul"(%grad_b1, [[LR]])
// CHECK: "onnx.Mul"(%grad_w2, [[LR]])
// CHECK: func.return %loss, %y, %grad_w1, %grad_b1, %grad_w2, %update_w1, %update_b1, %update_w2 :

// STATS: optimizer  state-tensors=0 updated-params=3

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
