// The verifier runs after parsing and after every pass; here an initializer whose data does not
// have the type its value declares.
// RUN: not pipec opt %s 2>&1 | FileCheck %s

// CHECK: error: {{.*}}verify.mlir: the imported IR does not verify
// CHECK-NEXT: caused by: verifier: initializer 'w' holds a float32[2] tensor but its value is declared float32[3]

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x3xf32, ["batch"]>) -> (tensor<?x3xf32, ["batch"]>) {
    %w = "pipec.initializer"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<3xf32>
    %y = "onnx.Add"(%x, %w) : (tensor<?x3xf32, ["batch"]>, tensor<3xf32>) -> tensor<?x3xf32, ["batch"]>
    func.return %y : tensor<?x3xf32, ["batch"]>
  }
}
