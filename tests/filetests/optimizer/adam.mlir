// Adam keeps two moments per parameter and a step counter: they become graph inputs
// (opt/step, opt/PARAM/m, opt/PARAM/v) and their next values graph outputs (.out), with the
// bias corrections 1 - beta^step.
// RUN: pipec opt %s '--passes=autodiff,optimizer{type=adam lr=0.001}' | FileCheck %s
// RUN: pipec opt %s '--passes=autodiff,optimizer{type=adam lr=0.001}' --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK: pipec.opt_inputs = ["opt/step", "opt/w1/m", "opt/w1/v", "opt/b1/m", "opt/b1/v", "opt/w2/m", "opt/w2/v"]
// CHECK-SAME: pipec.opt_state_outputs = ["opt/w1/m.out", "opt/w1/v.out",
// CHECK-LABEL: func.func @main
// CHECK-SAME: %opt_step: tensor<f32> {pipec.name = "opt/step"}, %opt_w1_m: tensor<4x3xf32> {pipec.name = "opt/w1/m"}
// CHECK: "onnx.Mul"(%opt_w1_m, [[BETA1:%[A-Za-z0-9_]+]])
// CHECK: "onnx.Mul"(%grad_w1, %grad_w1)
// CHECK: "onnx.Pow"([[BETA1]], %opt_step)
// CHECK: "onnx.Sqrt"
// CHECK: %update_w1 = "onnx.Identity"
// CHECK-NEXT: %opt_w1_m.out = "onnx.Identity"
// CHECK-NEXT: %opt_w1_v.out = "onnx.Identity"

// STATS: optimizer  state-tensors=6 updated-params=3

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
