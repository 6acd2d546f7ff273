// lower inlines an If whose condition is a constant: the taken branch's ops replace the If,
// named under the If's node. Subgraph bodies are not part of the textual IR (they print as a
// `#pipec.subgraph<...>` summary), so the input is the ONNX model in Inputs/, built with
// onnx.helper: `y = If(true) then Relu(x) else Neg(x)`.
// RUN: pipec opt %S/Inputs/if-constant-condition.onnx | FileCheck %s --check-prefix=INPUT
// RUN: pipec opt %S/Inputs/if-constant-condition.onnx --passes=lower | FileCheck %s

// INPUT: %y = "onnx.If"(%c, %x) {else_branch = #pipec.subgraph<"else", 0 inputs, 1 captured, 1 ops, 1 outputs>, pipec.captures = 1 : i64

// CHECK-NOT: "onnx.If"
// CHECK: %y = "onnx.Relu"(%x) {pipec.node = "branch/then/Relu_0"}
// CHECK-NEXT: func.return %y
// CHECK-NOT: "onnx.Neg"
