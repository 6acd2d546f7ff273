// lower rewrites Resize (nearest, scales 2x2 on the spatial axes) as one MatMul per resized axis
// with a constant interpolation matrix, so no Resize kernel or gradient rule is needed.
// RUN: pipec opt %s --passes=lower | FileCheck %s
// RUN: pipec opt %s --passes=lower --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK-NOT: "onnx.Resize"
// CHECK: [[ROWS:%[A-Za-z0-9_]+]] = "onnx.Constant"() {{.*}}value = dense<{{\[\[}}1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]> : tensor<4x2xf32>}
// CHECK-NEXT: [[H:%[A-Za-z0-9_]+]] = "onnx.MatMul"([[ROWS]], %x)
// CHECK-SAME: -> tensor<?x1x4x2xf32, ["batch"]>
// CHECK-NEXT: [[COLS:%[A-Za-z0-9_]+]] = "onnx.Constant"() {{.*}}value = dense<{{\[\[}}1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]> : tensor<2x4xf32>}
// CHECK-NEXT: %y = "onnx.MatMul"([[H]], [[COLS]])
// CHECK-SAME: -> tensor<?x1x4x4xf32, ["batch"]>
// CHECK-NOT: "onnx.Resize"

// STATS: lower  lowered-control=0 lowered-resize=1 lowered-rnn=0 ops-added=4

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x1x2x2xf32, ["batch"]>) -> (tensor<?x1x4x4xf32, ["batch"]>) {
    %scales = "pipec.initializer"() {value = dense<[1.0, 1.0, 2.0, 2.0]> : tensor<4xf32>} : () -> tensor<4xf32>
    %y = "onnx.Resize"(%x, %scales) {mode = "nearest", pipec.absent = array<i64: 1>, pipec.node = "up"} : (tensor<?x1x2x2xf32, ["batch"]>, tensor<4xf32>) -> tensor<?x1x4x4xf32, ["batch"]>
    func.return %y : tensor<?x1x4x4xf32, ["batch"]>
  }
}
