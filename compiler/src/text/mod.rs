//! Textual IR: a [`Module`] printed as MLIR and parsed back.
//!
//! The text is accepted by `mlir-opt --allow-unregistered-dialect` (the module and the function
//! use the `builtin`/`func` custom syntax, every ONNX node is a generic-syntax op of the
//! unregistered `onnx` dialect), and it round-trips exactly: `print(&parse(&print(m))?)` is
//! byte-for-byte `print(m)`, and the parsed module holds everything the IR holds (names, types,
//! symbolic dims, attributes, absent operands, metadata), except the data of large weights,
//! which stays out of the text unless asked for.
//!
//! # Example
//!
//! ```text
//! module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]], pipec.producer_name = "pytorch"} {
//!   func.func @main(%input: tensor<?x3xf32, ["batch"]>) -> (tensor<?x8xf32, ["batch"]>) {
//!     %fc.weight = "pipec.initializer"() {value = dense_resource<fc.weight> : tensor<8x3xf32>} : () -> tensor<8x3xf32>
//!     %fc.bias = "pipec.initializer"() {value = dense<[0.5, -1.0, 0.0, 2.0, 0.1, 1.0e-8, 3.0e20, -0.0]> : tensor<8xf32>} : () -> tensor<8xf32>
//!     %fc_Gemm_output_0 = "onnx.Gemm"(%input, %fc.weight, %fc.bias) {alpha = 1.0 : f32, pipec.names = ["/fc/Gemm_output_0"], pipec.node = "/fc/Gemm", transB = 1 : i64} : (tensor<?x3xf32, ["batch"]>, tensor<8x3xf32>, tensor<8xf32>) -> tensor<?x8xf32, ["batch"]>
//!     %out = "onnx.Relu"(%fc_Gemm_output_0) {pipec.node = "relu"} : (tensor<?x8xf32, ["batch"]>) -> tensor<?x8xf32, ["batch"]>
//!     func.return %out : tensor<?x8xf32, ["batch"]>
//!   }
//! }
//! ```
//!
//! With [`PrintOptions::emit_resources`] the weight's bytes follow the module (MLIR's blob
//! format: a 4-byte little-endian alignment, then the little-endian elements):
//!
//! ```text
//! {-#
//!   dialect_resources: {
//!     builtin: {
//!       fc.weight: "0x04000000000000000000803F00000040..."
//!     }
//!   }
//! #-}
//! ```
//!
//! Check it with `mlir-opt --allow-unregistered-dialect FILE` (the `onnx` dialect and the
//! `!onnx.string` element type are unregistered).
//!
//! # Format
//!
//! - **Module**: `module attributes {...}` holds `pipec.ir_version` (i64), `pipec.opset_imports`
//!   (a list of `[domain, version]` pairs, `""` is the default domain), `pipec.producer_name` and
//!   `pipec.producer_version` (only when not empty) and the module's own attributes.
//! - **Function**: one `func.func @NAME`; `NAME` is the graph name sanitized to an MLIR bare
//!   identifier; when that changed it, the func has `attributes {pipec.graph_name = "..."}`.
//!   Arguments are the graph inputs, `func.return` lists the graph outputs.
//! - **Values** are named `%SANITIZED` where SANITIZED is the ONNX name with a leading `/`
//!   dropped and every character outside `[A-Za-z0-9$._-]` replaced by `_` (`_` is put in front
//!   of a name that starts with a digit but is not all digits; an empty name becomes `v`).
//!   Collisions get `_1`, `_2`, ... suffixes. Whenever the SSA name is not exactly the ONNX
//!   name, the original is kept: `{pipec.name = "..."}` on a function argument or an
//!   initializer, `pipec.names = [...]` (one entry per result) on an op.
//! - **Initializers** are `%w = "pipec.initializer"() {value = TENSOR} : () -> TYPE`, in ONNX
//!   order, before the ops.
//! - **Ops** are `%r1, %r2 = "onnx.OpType"(%a, %b) {attrs} : (types) -> types` in program order.
//!   A non-default domain goes between: `"onnx.com.microsoft.FusedMatMul"` (split at the last
//!   dot). An op type that is empty or contains a dot is printed as `"pipec.op"` with
//!   `pipec.op_type` and `pipec.domain` attributes. The node name is `pipec.node` (left out when
//!   empty). Absent optional operands are left out of the operand list and their positions are
//!   listed in `pipec.absent = array<i64: ...>`.
//! - **Attributes**: `Int` is `3 : i64`, `Float` is `1.5 : f32` (shortest decimal that reads back
//!   to the same f32; NaN and infinities as hex bits `0x7FC00000 : f32`), `String` is a string
//!   literal (bytes outside printable ASCII as `\XX`), `Ints` is `array<i64: 1, 2>`, `Floats` is
//!   `array<f32: 1.0, 2.5>`, `Strings` is `["a", "b"]`, `Tensor` is a tensor literal. Attribute
//!   names that the format reserves (`pipec.node`, `pipec.names`, ...), empty names and names
//!   starting with `pipec.esc.` are printed with a `pipec.esc.` prefix.
//! - **Tensor literals**: `dense<...> : tensor<...>` with nested lists holding the exact values
//!   (ints as ints, bools as `true`/`false`, f32/f64/f16/bf16 as shortest round-trip decimals or
//!   hex bits when not finite, float8 types as hex bits, complex as `(re, im)`, strings as string
//!   literals). A non-string tensor with more than [`PrintOptions::elide_threshold`] elements,
//!   or whose data is already elided, is `dense_resource<KEY> : tensor<...>` where KEY comes
//!   from the initializer's name (or `node.attribute`), sanitized to `[A-Za-z0-9_.]` and made
//!   unique. Without the blob it parses back as [`Payload::Elided`]`(KEY)`. With
//!   [`PrintOptions::emit_resources`] the text ends with MLIR's
//!   `{-# dialect_resources: { builtin: { KEY: "0x..." } } #-}` section (hex of a 4-byte
//!   little-endian alignment followed by the raw little-endian bytes) and parses back as
//!   [`Payload::Raw`]. String tensors always print inline (blobs hold no strings).
//! - **Types**: `tensor<2x?x768xf32>`, `tensor<*xf32>` when the rank is unknown, element types
//!   from [`DType::mlir_name`]. A symbolic dim prints as `?` and the type carries an encoding
//!   that lists, for each `?` in order, the symbol text: `tensor<?x?x768xf32, ["batch", "seq"]>`.
//!   A symbol whose `Dim::parse(Display)` would not give it back is written `[coeff, "s1", ...]`;
//!   a negative known size (not valid MLIR) is written as `?` with the integer in the encoding.
//!   On input a `?` without an encoding reads as the symbol `?`.
//!
//! Only what the module reaches is printed: graph inputs, initializers, the ops in
//! `Graph::order` and the graph outputs. Dead ops stay out, and a use of a value that nothing
//! printed defines (an unverified module) prints but does not parse back. Arena numbers
//! (`Value`, `Op`) are not kept; their order is.
//!
//! The text after `mlir-opt` (which renames values to `%0`, `%arg0`, sorts attributes and may
//! print `return`, `%0:2` result groups, splat `dense` literals, `dense<"0x...">` for literals
//! over 100 elements and float8/f16 elements as 6-digit decimals) also parses, to the same
//! module; only the names that were not kept in `pipec.name(s)` then come from MLIR's
//! numbering (`0`, `arg0`, `3#1` for result 1 of a `%3:2` group).
//!
//! # Parser
//!
//! A hand-written on-demand lexer (`text/lexer.rs`) and a recursive-descent parser. MLIR's
//! grammar is context-sensitive in ways that parser crates handle badly (`2x?xf32` dimension
//! lists lex differently inside `tensor<...>`, `-` and `:` mean different things in different
//! places, `{-# ... #-}` metadata), and exact error positions matter, so it is written by hand.
//! Errors are [`Error::Parse`] with a 1-based line and column and name the culprit (`use of
//! undefined value '%x'`). Like MLIR it checks that every use of a value states the type the
//! value was defined with, and that values are defined before use (so the parsed program order
//! is topological). The parser never panics; nesting depth and splat sizes are bounded.
//!
//! [`Module`]: crate::ir::Module
//! [`Payload::Elided`]: crate::ir::Payload::Elided
//! [`Payload::Raw`]: crate::ir::Payload::Raw
//! [`DType::mlir_name`]: crate::ir::DType::mlir_name
//! [`Error::Parse`]: crate::error::Error::Parse

mod lexer;
mod parser;
mod printer;

use crate::error::Result;
use crate::ir::Module;

/// Options of [`print_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrintOptions {
    /// Tensors with more elements than this print as `dense_resource<KEY>` (default 16).
    pub elide_threshold: usize,
    /// Print the data of `dense_resource` tensors in a `dialect_resources` section (default off).
    pub emit_resources: bool,
}

impl Default for PrintOptions {
    fn default() -> Self {
        PrintOptions {
            elide_threshold: 16,
            emit_resources: false,
        }
    }
}

/// Print a module with the default options.
pub fn print(m: &Module) -> String {
    print_with(m, &PrintOptions::default())
}

/// Print a module.
pub fn print_with(m: &Module, opts: &PrintOptions) -> String {
    printer::print_module(m, opts)
}

/// Parse a module from text. `file` names the source in error messages.
pub fn parse(src: &str, file: &str) -> Result<Module> {
    parser::parse_module(src, file)
}

/// Op attribute names the format uses itself; an IR attribute with one of these names is escaped.
pub(crate) const OP_RESERVED: &[&str] = &[
    "pipec.node",
    "pipec.names",
    "pipec.absent",
    "pipec.op_type",
    "pipec.domain",
];

/// Module attribute names the format uses itself.
pub(crate) const MODULE_RESERVED: &[&str] = &[
    "pipec.ir_version",
    "pipec.opset_imports",
    "pipec.producer_name",
    "pipec.producer_version",
];

/// Prefix of escaped attribute names.
pub(crate) const ESC: &str = "pipec.esc.";
