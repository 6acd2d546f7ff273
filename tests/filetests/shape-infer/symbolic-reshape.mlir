// Shape inference propagates symbolic values through shape arithmetic: the Reshape target
// `Concat(Gather(Shape(x), [0, 1]), [2, 4])` is known element by element, so the result keeps
// both symbols and Transpose permutes them.
// RUN: pipec opt %s --passes=shape-infer | FileCheck %s

// CHECK-LABEL: func.func @main
// CHECK-SAME: -> (tensor<?x2x?x4xf32, ["batch", "seq"]>)
// CHECK: "onnx.Shape"(%x) : (tensor<?x?x8xf32, ["batch", "seq"]>) -> tensor<3xsi64>
// CHECK: "onnx.Concat"(%bs, %c) {axis = 0 : i64} : (tensor<2xsi64>, tensor<2xsi64>) -> tensor<4xsi64>
// CHECK: %y = "onnx.Reshape"
// CHECK-SAME: -> tensor<?x?x2x4xf32, ["batch", "seq"]>
// CHECK-NEXT: %t = "onnx.Transpose"(%y)
// CHECK-SAME: -> tensor<?x2x?x4xf32, ["batch", "seq"]>
// CHECK: func.return %t : tensor<?x2x?x4xf32, ["batch", "seq"]>

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x?x8xf32, ["batch", "seq"]>) -> (tensor<*xf32>) {
    %s = "onnx.Shape"(%x) : (tensor<?x?x8xf32, ["batch", "seq"]>) -> tensor<*xsi64>
    %i = "onnx.Constant"() {value = dense<[0, 1]> : tensor<2xsi64>} : () -> tensor<*xsi64>
    %bs = "onnx.Gather"(%s, %i) {axis = 0 : i64} : (tensor<*xsi64>, tensor<*xsi64>) -> tensor<*xsi64>
    %c = "onnx.Constant"() {value = dense<[2, 4]> : tensor<2xsi64>} : () -> tensor<*xsi64>
    %shape = "onnx.Concat"(%bs, %c) {axis = 0 : i64} : (tensor<*xsi64>, tensor<*xsi64>) -> tensor<*xsi64>
    %y = "onnx.Reshape"(%x, %shape) : (tensor<?x?x8xf32, ["batch", "seq"]>, tensor<*xsi64>) -> tensor<*xf32>
    %t = "onnx.Transpose"(%y) {perm = array<i64: 0, 2, 1, 3>} : (tensor<*xf32>) -> tensor<*xf32>
    func.return %t : tensor<*xf32>
  }
}
