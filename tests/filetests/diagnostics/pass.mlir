// A pass that cannot run on its input fails naming the pass and what to do; the cause is not
// repeated when the message already says it.
// RUN: not pipec opt %s --passes=optimizer 2>&1 | FileCheck %s

// CHECK: error: pass 'optimizer': {{.*}}the module has no 'pipec.params' attribute (run autodiff first)
// CHECK-NOT: caused by

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>) -> (tensor<?x4xf32, ["batch"]>) {
    %y = "onnx.Relu"(%x) : (tensor<?x4xf32, ["batch"]>) -> tensor<?x4xf32, ["batch"]>
    func.return %y : tensor<?x4xf32, ["batch"]>
  }
}
