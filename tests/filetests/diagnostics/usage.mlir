// Unknown passes and bad pass options are usage errors that list what is known.
// RUN: not pipec opt %s --passes=bogus 2>&1 | FileCheck %s
// RUN: not pipec opt %s '--passes=autodiff{loss=bogus}' 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not pipec opt %s '--passes=partition-gpp{devices=0}' 2>&1 | FileCheck %s --check-prefix=VALUE

// CHECK: error: --passes: unknown pass 'bogus' (known: shape-infer, fold-constants, dce, lower, autodiff, optimizer, sp-decompose, partition-gpp, schedule-gpp)
// OPTION: error: --passes: unknown loss 'bogus' (known: mean-square, sum, cross-entropy:LABEL_INPUT)
// VALUE: devices=0 must be an integer >= 1

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>) -> (tensor<?x4xf32, ["batch"]>) {
    %y = "onnx.Relu"(%x) : (tensor<?x4xf32, ["batch"]>) -> tensor<?x4xf32, ["batch"]>
    func.return %y : tensor<?x4xf32, ["batch"]>
  }
}
