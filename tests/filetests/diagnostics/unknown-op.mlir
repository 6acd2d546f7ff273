// An op type without a shape rule (so no kernel, no gradient rule) is refused at the front
// end, naming the op by its result when it has no node name.
// RUN: not pipec opt %s 2>&1 | FileCheck %s

// CHECK: error: {{.*}}unknown-op.mlir: shape inference failed
// CHECK-NEXT: caused by: node '%y': unknown op type 'Frobnicate'

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>) -> (tensor<?x4xf32, ["batch"]>) {
    %y = "onnx.Frobnicate"(%x) : (tensor<?x4xf32, ["batch"]>) -> tensor<?x4xf32, ["batch"]>
    func.return %y : tensor<?x4xf32, ["batch"]>
  }
}
