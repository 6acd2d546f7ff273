// sp-decompose (GraphPipe §5) splits the graph into series-parallel units: the two branches
// x -> Gemm -> Relu and x -> Gemm -> Tanh are one parallel composition, in series with the join
// and the head. Every op gets its unit; the statistics give the tree's shape.
// RUN: pipec opt %s --passes=sp-decompose | FileCheck %s
// RUN: pipec opt %s --passes=sp-decompose --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK: %a = "onnx.Gemm"(%x, %wa) {pipec.sp_unit = 0 : i64, transB = 1 : i64}
// CHECK-NEXT: %ra = "onnx.Relu"(%a) {pipec.sp_unit = 1 : i64}
// CHECK-NEXT: %b = "onnx.Gemm"(%x, %wb) {pipec.sp_unit = 2 : i64, transB = 1 : i64}
// CHECK-NEXT: %tb = "onnx.Tanh"(%b) {pipec.sp_unit = 3 : i64}
// CHECK-NEXT: %s = "onnx.Add"(%ra, %tb) {pipec.sp_unit = 4 : i64}
// CHECK-NEXT: %y = "onnx.Gemm"(%s, %wo) {pipec.sp_unit = 5 : i64, transB = 1 : i64}

// STATS: sp-decompose  forced-splits=0 parallel=1 series=3 side-ops=0 tree-depth=4 units=6

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
