// Shape inference rejects operands whose shapes the op cannot combine, naming the node, the
// op type and both sizes; a declared result type that disagrees with the inferred one too.
// RUN: not pipec opt %s 2>&1 | FileCheck %s

// CHECK: error: {{.*}}shape.mlir: shape inference failed
// CHECK-NEXT: caused by: node 'proj' (MatMul): shape error: inner dimensions differ: 4 (input 0) vs 3 (input 1)

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>, %w: tensor<3x5xf32>) -> (tensor<*xf32>) {
    %y = "onnx.MatMul"(%x, %w) {pipec.node = "proj"} : (tensor<?x4xf32, ["batch"]>, tensor<3x5xf32>) -> tensor<*xf32>
    func.return %y : tensor<*xf32>
  }
}
