// A parse error names the file, line and column and the culprit; exit 2, nothing printed.
// RUN: not pipec opt %s 2>&1 | FileCheck %s

// CHECK: error: {{.*}}parse.mlir:[[# @LINE + 5]]:22: parse error: use of undefined value '%z'
// CHECK-NOT: module

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>) -> (tensor<?x4xf32, ["batch"]>) {
    %y = "onnx.Relu"(%z) : (tensor<?x4xf32, ["batch"]>) -> tensor<?x4xf32, ["batch"]>
    func.return %y : tensor<?x4xf32, ["batch"]>
  }
}
