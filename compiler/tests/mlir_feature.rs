//! In-process MLIR checks (feature `mlir`): `cargo test -p pipec-compiler --features mlir`.
#![cfg(feature = "mlir")]

use pipec_compiler::mlir::{roundtrip_generic, shard_allreduce_example, verify_text};
use pipec_compiler::Error;

/// The shape of module pipec prints: generic syntax, an unregistered `onnx.*` op with a
/// `pipec.*` discardable attribute, inside a `func.func`.
const RELU: &str = r#""builtin.module"() ({
  "func.func"() ({
  ^bb0(%a: tensor<2x3xf32>):
    %0 = "onnx.Relu"(%a) {pipec.node = "r"} : (tensor<2x3xf32>) -> tensor<2x3xf32>
    "func.return"(%0) : (tensor<2x3xf32>) -> ()
  }) {function_type = (tensor<2x3xf32>) -> tensor<2x3xf32>, sym_name = "main"} : () -> ()
}) : () -> ()
"#;

fn verify_err(text: &str) -> String {
    match verify_text(text) {
        Err(Error::Verify(msg)) => msg,
        Err(e) => panic!("expected Error::Verify, got {e:?}"),
        Ok(()) => panic!("expected a verifier error for:\n{text}"),
    }
}

#[test]
fn generic_module_with_unregistered_op_verifies() {
    verify_text(RELU).unwrap();
}

#[test]
fn one_line_module_verifies() {
    let one_line = RELU.split_whitespace().collect::<Vec<_>>().join(" ");
    verify_text(&one_line).unwrap();
}

#[test]
fn roundtrip_is_generic_and_stable() {
    let out = roundtrip_generic(RELU).unwrap();
    // Inherent attributes of registered ops move into `<{...}>` (properties); discardable ones stay.
    assert!(
        out.contains(r#""func.func"() <{function_type = (tensor<2x3xf32>) -> tensor<2x3xf32>, sym_name = "main"}>"#),
        "{out}"
    );
    assert!(
        out.contains(
            r#""onnx.Relu"(%arg0) {pipec.node = "r"} : (tensor<2x3xf32>) -> tensor<2x3xf32>"#
        ),
        "{out}"
    );
    assert_eq!(roundtrip_generic(&out).unwrap(), out);
}

#[test]
fn return_type_mismatch_fails_with_message() {
    let bad = RELU.replace(
        "function_type = (tensor<2x3xf32>) -> tensor<2x3xf32>",
        "function_type = (tensor<2x3xf32>) -> tensor<3x2xf32>",
    );
    let msg = verify_err(&bad);
    assert!(
        msg.contains("type of return operand 0 ('tensor<2x3xf32>') doesn't match function result type ('tensor<3x2xf32>')"),
        "{msg}"
    );
    // The location is the `func.return` in the input (line 5, column 5).
    assert!(msg.contains("5:5: error:"), "{msg}");
}

#[test]
fn undefined_value_fails_with_message() {
    let bad = RELU.replace(r#""func.return"(%0)"#, r#""func.return"(%1)"#);
    let msg = verify_err(&bad);
    assert!(msg.contains("use of undeclared SSA value name"), "{msg}");
}

#[test]
fn syntax_error_fails_with_message() {
    let msg = verify_err(r#""builtin.module"() ({ "#);
    assert!(msg.contains("error:"), "{msg}");
}

#[test]
fn use_before_def_fails_dominance() {
    let bad = r#""builtin.module"() ({
  "func.func"() ({
  ^bb0(%a: tensor<2xf32>):
    %0 = "onnx.Relu"(%1) : (tensor<2xf32>) -> tensor<2xf32>
    %1 = "onnx.Relu"(%a) : (tensor<2xf32>) -> tensor<2xf32>
    "func.return"(%0) : (tensor<2xf32>) -> ()
  }) {function_type = (tensor<2xf32>) -> tensor<2xf32>, sym_name = "main"} : () -> ()
}) : () -> ()
"#;
    let msg = verify_err(bad);
    assert!(msg.contains("does not dominate this use"), "{msg}");
}

/// `dense_resource<blob>` whose blob is not in a `{-# dialect_resources #-}` section: mlir-opt
/// accepts it (the handle is created lazily, with no data), and so does the in-process parser.
#[test]
fn dense_resource_without_resource_section() {
    let text = r#""builtin.module"() ({
  "func.func"() ({
    %0 = "arith.constant"() {value = dense_resource<blob> : tensor<100xf32>} : () -> tensor<100xf32>
    "func.return"(%0) : (tensor<100xf32>) -> ()
  }) {function_type = () -> tensor<100xf32>, sym_name = "main"} : () -> ()
}) : () -> ()
"#;
    verify_text(text).unwrap();
    let out = roundtrip_generic(text).unwrap();
    assert!(
        out.contains("dense_resource<blob> : tensor<100xf32>"),
        "{out}"
    );
    // On an unregistered op too (what pipec prints for ONNX initializers).
    let onnx = text.replace(r#""arith.constant""#, r#""onnx.Constant""#);
    verify_text(&onnx).unwrap();
}

#[test]
fn shard_example_verifies() {
    let text = shard_allreduce_example().unwrap();
    assert!(text.contains("shard.all_reduce"), "{text}");
    verify_text(&text).unwrap();
}

/// pipec's printed IR of every bundled model, after the first passes' worth of shape inference,
/// parses and verifies in MLIR itself (in-process, the same check as `mlir-opt
/// --allow-unregistered-dialect`).
#[test]
fn printed_ir_of_bundled_models_verifies_in_mlir() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../onnx-models");
    for name in ["mlp4", "inception_mini", "resnet18", "gpt2_tiny"] {
        let mut m = pipec_compiler::onnx::import::load(&dir.join(format!("{name}.onnx"))).unwrap();
        pipec_compiler::shape::infer_shapes(&mut m).unwrap();
        let text = pipec_compiler::text::print(&m);
        verify_text(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
