// fold-constants evaluates ops whose operands are all constants, and Shape of a statically
// shaped value; Shape of a value with a symbolic dim stays. The folded-away producers are left
// for dce (second RUN line), and the statistics count the folded ops.
// RUN: pipec opt %s --passes=fold-constants | FileCheck %s
// RUN: pipec opt %s --passes=fold-constants,dce | FileCheck %s --check-prefix=DCE
// RUN: pipec opt %s --passes=fold-constants --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK: %c = "onnx.Constant"() {value = dense<[0.5, 1.0, 1.5, 2.0]> : tensor<4xf32>}
// CHECK: %s = "onnx.Constant"() {value = dense<[2, 3]> : tensor<2xsi64>}
// CHECK-NEXT: %n = "onnx.Constant"() {value = dense<[6]> : tensor<1xsi64>}
// CHECK-NEXT: %f = "onnx.Reshape"(%z, %n)
// CHECK-NEXT: %sx = "onnx.Shape"(%x)
// CHECK-NOT: "onnx.Mul"
// CHECK-NOT: "onnx.ReduceProd"

// DCE-NOT: %a =
// DCE-NOT: %s =
// DCE: %c = "onnx.Constant"
// DCE: %n = "onnx.Constant"

// STATS: fold-constants  folded-ops=3

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>, %z: tensor<2x3xf32>) -> (tensor<?x4xf32, ["batch"]>, tensor<6xf32>, tensor<2xsi64>) {
    %a = "onnx.Constant"() {value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>} : () -> tensor<4xf32>
    %b = "onnx.Constant"() {value = dense<[0.5, 0.5, 0.5, 0.5]> : tensor<4xf32>} : () -> tensor<4xf32>
    %c = "onnx.Mul"(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %y = "onnx.Add"(%x, %c) : (tensor<?x4xf32, ["batch"]>, tensor<4xf32>) -> tensor<?x4xf32, ["batch"]>
    %s = "onnx.Shape"(%z) : (tensor<2x3xf32>) -> tensor<2xsi64>
    %n = "onnx.ReduceProd"(%s) {keepdims = 1 : i64} : (tensor<2xsi64>) -> tensor<1xsi64>
    %f = "onnx.Reshape"(%z, %n) : (tensor<2x3xf32>, tensor<1xsi64>) -> tensor<6xf32>
    %sx = "onnx.Shape"(%x) : (tensor<?x4xf32, ["batch"]>) -> tensor<2xsi64>
    func.return %y, %f, %sx : tensor<?x4xf32, ["batch"]>, tensor<6xf32>, tensor<2xsi64>
  }
}
