// partition-gpp plans with GraphPipe's Algorithm 1 and annotates the IR. Two equal 8192-wide
// branches (weights elided: planning reads only shapes) on 4 devices: the branches become two
// stages that run side by side (0 and 1, one device each), followed by the join and the head,
// so the stage graph is a DAG of depth 3, not a chain.
// RUN: pipec opt %s '--passes=partition-gpp{devices=4 batch=256 micro-batch=16}' | FileCheck %s
// RUN: pipec opt %s '--passes=partition-gpp{devices=4 batch=256 micro-batch=16}' --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK: module attributes {pipec.batch = 256 : i64, pipec.devices = 4 : i64,
// CHECK-SAME: pipec.micro_batch = 16 : i64
// CHECK-SAME: pipec.stage0.devices = array<i64: 0>, pipec.stage1.devices = array<i64: 1>, pipec.stage2.devices = array<i64: 2>, pipec.stage3.devices = array<i64: 3>, pipec.stages = 4 : i64
// CHECK: %a = "onnx.Gemm"(%x, %wa) {pipec.stage = 0 : i64
// CHECK-NEXT: %ra = "onnx.Relu"(%a) {pipec.stage = 0 : i64}
// CHECK-NEXT: %b = "onnx.Gemm"(%x, %wb) {pipec.stage = 1 : i64
// CHECK-NEXT: %tb = "onnx.Tanh"(%b) {pipec.stage = 1 : i64}
// CHECK-NEXT: %s = "onnx.Add"(%ra, %tb) {pipec.stage = 2 : i64}
// CHECK-NEXT: %y = "onnx.Gemm"(%s, %wo) {pipec.stage = 3 : i64

// STATS: partition-gpp  depth=3 micro-batch=16 stages=4

module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]]} {
  func.func @main(%x: tensor<?x8192xf32, ["batch"]>) -> (tensor<?x8192xf32, ["batch"]>) {
    %wa = "pipec.initializer"() {value = dense_resource<wa> : tensor<8192x8192xf32>} : () -> tensor<8192x8192xf32>
    %wb = "pipec.initializer"() {value = dense_resource<wb> : tensor<8192x8192xf32>} : () -> tensor<8192x8192xf32>
    %wo = "pipec.initializer"() {value = dense_resource<wo> : tensor<8192x8192xf32>} : () -> tensor<8192x8192xf32>
    %a = "onnx.Gemm"(%x, %wa) {transB = 1 : i64} : (tensor<?x8192xf32, ["batch"]>, tensor<8192x8192xf32>) -> tensor<?x8192xf32, ["batch"]>
    %ra = "onnx.Relu"(%a) : (tensor<?x8192xf32, ["batch"]>) -> tensor<?x8192xf32, ["batch"]>
    %b = "onnx.Gemm"(%x, %wb) {transB = 1 : i64} : (tensor<?x8192xf32, ["batch"]>, tensor<8192x8192xf32>) -> tensor<?x8192xf32, ["batch"]>
    %tb = "onnx.Tanh"(%b) : (tensor<?x8192xf32, ["batch"]>) -> tensor<?x8192xf32, ["batch"]>
    %s = "onnx.Add"(%ra, %tb) : (tensor<?x8192xf32, ["batch"]>, tensor<?x8192xf32, ["batch"]>) -> tensor<?x8192xf32, ["batch"]>
    %y = "onnx.Gemm"(%s, %wo) {transB = 1 : i64} : (tensor<?x8192xf32, ["batch"]>, tensor<8192x8192xf32>) -> tensor<?x8192xf32, ["batch"]>
    func.return %y : tensor<?x8192xf32, ["batch"]>
  }
}
