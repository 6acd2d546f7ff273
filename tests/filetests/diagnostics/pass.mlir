// A pass whose contract requires a module attribute that no earlier pass provided, or that a
// later pass invalidated, is not run: the error names the pass, the attribute and what to run.
// The cause is not repeated when the message already says it.
// RUN: not pipec opt %s --passes=optimizer 2>&1 | FileCheck %s
// RUN: not pipec opt %s '--passes=partition-gpp{devices=2},fold-constants,schedule-gpp' 2>&1 | FileCheck %s --check-prefix=STALE

// CHECK: error: pass 'optimizer': needs the module attribute 'pipec.params' (run autodiff first)
// CHECK-NOT: caused by

// STALE: error: pass 'schedule-gpp': needs the module attribute 'pipec.stages' from partition-gpp, but fold-constants ran after it and invalidated it (run partition-gpp again after fold-constants)

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>) -> (tensor<?x4xf32, ["batch"]>) {
    %y = "onnx.Relu"(%x) : (tensor<?x4xf32, ["batch"]>) -> tensor<?x4xf32, ["batch"]>
    func.return %y : tensor<?x4xf32, ["batch"]>
  }
}
