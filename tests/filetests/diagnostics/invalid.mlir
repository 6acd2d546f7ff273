// An op with more operands (or results) than its ONNX schema allows at the module's opset is
// refused before any rule reads it (ONNX's checker rule; Relu takes exactly one input).
// RUN: not pipec opt %s 2>&1 | FileCheck %s

// CHECK: error: {{.*}}invalid.mlir: shape inference failed
// CHECK-NEXT: caused by: node '%y' (Relu): has 2 operands but Relu (opset 14) takes 1

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>) -> (tensor<?x4xf32, ["batch"]>) {
    %y = "onnx.Relu"(%x, %x) : (tensor<?x4xf32, ["batch"]>, tensor<?x4xf32, ["batch"]>) -> tensor<?x4xf32, ["batch"]>
    func.return %y : tensor<?x4xf32, ["batch"]>
  }
}
