// schedule-gpp (GraphPipe Algorithm 2, ComputeInFlight) gives every stage its in-flight count,
// sinks first: with uniform micro-batches and 1F1B a stage keeps as many micro-batches in
// flight as there are stages on the longest path from it to a sink (3 for both parallel
// branch stages, 2 for the join, 1 for the head).
// RUN: pipec opt %s '--passes=partition-gpp{devices=4 batch=256 micro-batch=16},schedule-gpp' | FileCheck %s
// RUN: pipec opt %s '--passes=partition-gpp{devices=4 batch=256 micro-batch=16},schedule-gpp' --timing 2>&1 | FileCheck %s --check-prefix=STATS

// CHECK: pipec.stage0.devices = array<i64: 0>, pipec.stage0.in_flight = 3 : i64,
// CHECK-SAME: pipec.stage1.devices = array<i64: 1>, pipec.stage1.in_flight = 3 : i64,
// CHECK-SAME: pipec.stage2.devices = array<i64: 2>, pipec.stage2.in_flight = 2 : i64,
// CHECK-SAME: pipec.stage3.devices = array<i64: 3>, pipec.stage3.in_flight = 1 : i64,

// STATS: schedule-gpp  max-in-flight=3 stages=4

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
