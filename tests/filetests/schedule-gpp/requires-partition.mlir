// schedule-gpp needs the stages partition-gpp annotates (its contract requires `pipec.stages`);
// run alone it fails with exit 2 and says which pass to run first.
// RUN: not pipec opt %s --passes=schedule-gpp 2>&1 | FileCheck %s

// CHECK: error: pass 'schedule-gpp': needs the module attribute 'pipec.stages' (run partition-gpp first)

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x4xf32, ["batch"]>) -> (tensor<?x2xf32, ["batch"]>) {
    %wa = "pipec.initializer"() {value = dense<[[0.5, -1.0, 0.25, 0.0], [1.0, 0.0, -0.5, 0.5], [0.1, 0.2, 0.3, 0.4]]> : tensor<3x4xf32>} : () -> tensor<3x4xf32>
    %wb = "pipec.initializer"() {value = dense<[[0.5, 1.0, -0.25, 0.0], [-1.0, 0.0, 0.5, 0.5], [0.3, 0.2, 0.1, 0.4]]> : tensor<3x4xf32>} : () -> tensor<3x4xf32>
    %wo = "pipec.initializer"() {value = dense<[[1.0, -1.0, 0.5], [0.0, 1.0, -0.5]]> : tensor<2x3xf32>} : () -> tensor<2x3xf32>
    %a = "onnx.Gemm"(%x, %wa) {transB = 1 : i64} : (tensor<?x4xf32, ["batch"]>, tensor<3x4xf32>) -> tensor<?x3xf32, ["batch"]>
    %ra = "onnx.Relu"(%a) : (tensor<?x3xf32, ["batch"]>) -> tensor<?x3xf32, ["batch"]>
    %b = "onnx.Gemm"(%x, %wb) {transB = 1 : i64} : (tensor<?x4xf32, ["batch"]>, tensor<3x4xf32>) -> tensor<?x3xf32, ["batch"]>
    %tb = "onnx.Tanh"(%b) : (tensor<?x3xf32, ["batch"]>) -> tensor<?x3xf32, ["batch"]>
    %s = "onnx.Add"(%ra, %tb) : (tensor<?x3xf32, ["batch"]>, tensor<?x3xf32, ["batch"]>) -> tensor<?x3xf32, ["batch"]>
    %y = "onnx.Gemm"(%s, %wo) {transB = 1 : i64} : (tensor<?x3xf32, ["batch"]>, tensor<2x3xf32>) -> tensor<?x2xf32, ["batch"]>
    func.return %y : tensor<?x2xf32, ["batch"]>
  }
}
