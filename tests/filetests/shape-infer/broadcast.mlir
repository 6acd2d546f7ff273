// Multidirectional broadcasting (Add), MatMul's batch broadcasting, and a reduction (axes as an operand since opset 13) with
// keepdims = 0.
// RUN: pipec opt %s --passes=shape-infer | FileCheck %s

// CHECK: %a = "onnx.Add"(%x, %b) : (tensor<?x1x4xf32, ["n"]>, tensor<3x1xf32>) -> tensor<?x3x4xf32, ["n"]>
// CHECK: %m = "onnx.MatMul"(%a, %w) : (tensor<?x3x4xf32, ["n"]>, tensor<4x5xf32>) -> tensor<?x3x5xf32, ["n"]>
// CHECK: %r = "onnx.ReduceSum"(%m, %axes) {keepdims = 0 : i64} : (tensor<?x3x5xf32, ["n"]>, tensor<1xsi64>) -> tensor<?x5xf32, ["n"]>
// CHECK: func.return %r : tensor<?x5xf32, ["n"]>

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x1x4xf32, ["n"]>, %b: tensor<3x1xf32>, %w: tensor<4x5xf32>) -> (tensor<*xf32>) {
    %axes = "onnx.Constant"() {value = dense<[1]> : tensor<1xsi64>} : () -> tensor<*xsi64>
    %a = "onnx.Add"(%x, %b) : (tensor<?x1x4xf32, ["n"]>, tensor<3x1xf32>) -> tensor<*xf32>
    %m = "onnx.MatMul"(%a, %w) : (tensor<*xf32>, tensor<4x5xf32>) -> tensor<*xf32>
    %r = "onnx.ReduceSum"(%m, %axes) {keepdims = 0 : i64} : (tensor<*xf32>, tensor<*xsi64>) -> tensor<*xf32>
    func.return %r : tensor<*xf32>
  }
}
