//! ONNX protobuf messages (`onnx.proto`, IR version 10), written by hand as `prost` structs.
//!
//! Field numbers are exactly those of `onnx.proto`. No `protoc` and no build script are involved.
//! Every field that holds raw bytes (`TensorProto.raw_data`, `string_data`, `AttributeProto.s`,
//! `strings`) is a [`bytes::Bytes`], so decoding from a `Bytes` buffer (for example a memory-mapped
//! file wrapped with `Bytes::from_owner`) slices the source buffer instead of copying weights.
//!
//! Only the fields the compiler reads or writes are declared; unknown fields (training info,
//! quantization annotations, ...) are skipped by the decoder and never cause a failure.
//! Enumerations are kept as plain `i32` codes; see the `*_TYPE_*` / `DATA_LOCATION_*` constants.

use bytes::Bytes;

/// `TensorProto.DataLocation.DEFAULT`: the data is inside the tensor message.
pub const DATA_LOCATION_DEFAULT: i32 = 0;
/// `TensorProto.DataLocation.EXTERNAL`: the data lives in a separate file (`external_data`).
pub const DATA_LOCATION_EXTERNAL: i32 = 1;

/// `AttributeProto.AttributeType` codes.
pub mod attribute_type {
    /// Not set (old files: infer from the populated field).
    pub const UNDEFINED: i32 = 0;
    /// `f`.
    pub const FLOAT: i32 = 1;
    /// `i`.
    pub const INT: i32 = 2;
    /// `s`.
    pub const STRING: i32 = 3;
    /// `t`.
    pub const TENSOR: i32 = 4;
    /// `g`.
    pub const GRAPH: i32 = 5;
    /// `floats`.
    pub const FLOATS: i32 = 6;
    /// `ints`.
    pub const INTS: i32 = 7;
    /// `strings`.
    pub const STRINGS: i32 = 8;
    /// `tensors`.
    pub const TENSORS: i32 = 9;
    /// `graphs`.
    pub const GRAPHS: i32 = 10;
    /// `sparse_tensor`.
    pub const SPARSE_TENSOR: i32 = 11;
    /// `sparse_tensors`.
    pub const SPARSE_TENSORS: i32 = 12;
    /// `tp`.
    pub const TYPE_PROTO: i32 = 13;
    /// `type_protos`.
    pub const TYPE_PROTOS: i32 = 14;
}

/// A whole model file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// ONNX IR version the file follows.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// Operator sets the graph uses, one per domain.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// Tool that wrote the file.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// Version of that tool.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// Reverse-DNS model namespace.
    #[prost(string, tag = "4")]
    pub domain: String,
    /// Version of the model itself.
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    /// Free text.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// The main graph.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    /// Named metadata strings.
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
    /// Model-local functions (decoded so that files carrying them load; not imported).
    #[prost(message, repeated, tag = "25")]
    pub functions: Vec<FunctionProto>,
}

/// An `(domain, version)` operator-set import.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// Domain; empty or `ai.onnx` for the default operator set.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// Operator-set version.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// A key/value string pair (metadata, external-data keys).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    /// Key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A graph: nodes in topological order, initializers, inputs, outputs and value types.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// Nodes (ONNX requires topological order; real files are sometimes unsorted).
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// Graph name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Constant tensors.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// Sparse constant tensors (rejected by the importer).
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensorProto>,
    /// Free text.
    #[prost(string, tag = "10")]
    pub doc_string: String,
    /// Graph inputs (older files also list the initializers here).
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// Graph outputs.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    /// Types of intermediate values.
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// One node (operator call).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// Input value names; `""` for an omitted optional input.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Output value names; `""` for an omitted optional output.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// Node name (optional in ONNX).
    #[prost(string, tag = "3")]
    pub name: String,
    /// Operator type.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// Attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    /// Free text.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// Operator domain; empty for `ai.onnx`.
    #[prost(string, tag = "7")]
    pub domain: String,
}

/// A named attribute of a node. Singular values are `Option`s (proto2 presence).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// Attribute name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// In a function body: the name of the caller's attribute this one refers to.
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    /// Free text.
    #[prost(string, tag = "13")]
    pub doc_string: String,
    /// Which field holds the value (see [`attribute_type`]).
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    /// Float value.
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    /// Integer value.
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    /// String value (bytes).
    #[prost(bytes = "bytes", optional, tag = "4")]
    pub s: Option<Bytes>,
    /// Tensor value.
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// Graph value (subgraph of If/Loop/Scan).
    #[prost(message, optional, tag = "6")]
    pub g: Option<GraphProto>,
    /// Sparse tensor value.
    #[prost(message, optional, tag = "22")]
    pub sparse_tensor: Option<SparseTensorProto>,
    /// Type value.
    #[prost(message, optional, tag = "14")]
    pub tp: Option<TypeProto>,
    /// Float list.
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    /// Integer list.
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    /// String list (bytes).
    #[prost(bytes = "bytes", repeated, tag = "9")]
    pub strings: Vec<Bytes>,
    /// Tensor list.
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
    /// Graph list.
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<GraphProto>,
    /// Sparse tensor list.
    #[prost(message, repeated, tag = "23")]
    pub sparse_tensors: Vec<SparseTensorProto>,
    /// Type list.
    #[prost(message, repeated, tag = "15")]
    pub type_protos: Vec<TypeProto>,
}

/// A value name with its type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// Value name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Value type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    /// Free text.
    #[prost(string, tag = "3")]
    pub doc_string: String,
}

/// A constant tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// Shape.
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// Element type (`TensorProto.DataType` code).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// Segment of a chunked tensor (rejected by the importer).
    #[prost(message, optional, tag = "3")]
    pub segment: Option<tensor_proto::Segment>,
    /// FLOAT and COMPLEX64 data.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// INT32, INT16, INT8, UINT16, UINT8, BOOL, FLOAT16, BFLOAT16, FLOAT8*, (U)INT4 data.
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    /// STRING data, one byte string per element.
    #[prost(bytes = "bytes", repeated, tag = "6")]
    pub string_data: Vec<Bytes>,
    /// INT64 data.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// Tensor name.
    #[prost(string, tag = "8")]
    pub name: String,
    /// Free text.
    #[prost(string, tag = "12")]
    pub doc_string: String,
    /// Packed little-endian data of any non-string type.
    #[prost(bytes = "bytes", tag = "9")]
    pub raw_data: Bytes,
    /// Keys `location`, `offset`, `length`, `checksum` for external data.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// [`DATA_LOCATION_DEFAULT`] or [`DATA_LOCATION_EXTERNAL`].
    #[prost(int32, tag = "14")]
    pub data_location: i32,
    /// DOUBLE and COMPLEX128 data.
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// UINT32 and UINT64 data.
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
}

/// Nested messages of [`TensorProto`].
pub mod tensor_proto {
    /// A segment `[begin, end)` of a chunked tensor.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Segment {
        /// First element.
        #[prost(int64, tag = "1")]
        pub begin: i64,
        /// One past the last element.
        #[prost(int64, tag = "2")]
        pub end: i64,
    }
}

/// A sparse tensor (COO format).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseTensorProto {
    /// Non-zero values (its `name` is the tensor's name).
    #[prost(message, optional, tag = "1")]
    pub values: Option<TensorProto>,
    /// Indices of the values.
    #[prost(message, optional, tag = "2")]
    pub indices: Option<TensorProto>,
    /// Dense shape.
    #[prost(int64, repeated, packed = "false", tag = "3")]
    pub dims: Vec<i64>,
}

/// The type of a value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// Which kind of type.
    #[prost(oneof = "type_proto::Value", tags = "1, 4, 5, 9, 8")]
    pub value: Option<type_proto::Value>,
    /// Denotation of the type.
    #[prost(string, tag = "6")]
    pub denotation: String,
}

/// Nested messages of [`TypeProto`].
pub mod type_proto {
    use super::{TensorShapeProto, TypeProto};

    /// The `value` oneof of [`TypeProto`].
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        /// A dense tensor.
        #[prost(message, tag = "1")]
        TensorType(Tensor),
        /// A sequence.
        #[prost(message, tag = "4")]
        SequenceType(Sequence),
        /// A map.
        #[prost(message, tag = "5")]
        MapType(Map),
        /// An optional.
        #[prost(message, tag = "9")]
        OptionalType(Optional),
        /// A sparse tensor.
        #[prost(message, tag = "8")]
        SparseTensorType(SparseTensor),
    }

    /// A dense tensor type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Tensor {
        /// Element type code.
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        /// Shape; absent means unknown rank.
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }

    /// A sequence type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sequence {
        /// Element type.
        #[prost(message, optional, boxed, tag = "1")]
        pub elem_type: Option<Box<TypeProto>>,
    }

    /// A map type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Map {
        /// Key element type code.
        #[prost(int32, tag = "1")]
        pub key_type: i32,
        /// Value type.
        #[prost(message, optional, boxed, tag = "2")]
        pub value_type: Option<Box<TypeProto>>,
    }

    /// An optional type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Optional {
        /// Element type.
        #[prost(message, optional, boxed, tag = "1")]
        pub elem_type: Option<Box<TypeProto>>,
    }

    /// A sparse tensor type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SparseTensor {
        /// Element type code.
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        /// Shape.
        #[prost(message, optional, tag = "2")]
        pub shape: Option<TensorShapeProto>,
    }
}

/// A tensor shape: one entry per dimension.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// Dimensions.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<tensor_shape_proto::Dimension>,
}

/// Nested messages of [`TensorShapeProto`].
pub mod tensor_shape_proto {
    /// One dimension: a value, a symbol, or neither (unknown).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        /// `dim_value` or `dim_param`.
        #[prost(oneof = "dimension::Value", tags = "1, 2")]
        pub value: Option<dimension::Value>,
        /// Denotation of the dimension.
        #[prost(string, tag = "3")]
        pub denotation: String,
    }

    /// Nested types of [`Dimension`].
    pub mod dimension {
        /// The `value` oneof of a dimension.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            /// A known size.
            #[prost(int64, tag = "1")]
            DimValue(i64),
            /// A symbolic size.
            #[prost(string, tag = "2")]
            DimParam(String),
        }
    }
}

/// A model-local function (decoded so files carrying functions load; not imported).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FunctionProto {
    /// Function name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Formal inputs.
    #[prost(string, repeated, tag = "4")]
    pub input: Vec<String>,
    /// Formal outputs.
    #[prost(string, repeated, tag = "5")]
    pub output: Vec<String>,
    /// Attribute names.
    #[prost(string, repeated, tag = "6")]
    pub attribute: Vec<String>,
    /// Attributes with defaults.
    #[prost(message, repeated, tag = "11")]
    pub attribute_proto: Vec<AttributeProto>,
    /// Body.
    #[prost(message, repeated, tag = "7")]
    pub node: Vec<NodeProto>,
    /// Free text.
    #[prost(string, tag = "8")]
    pub doc_string: String,
    /// Operator sets the body uses.
    #[prost(message, repeated, tag = "9")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// Function domain.
    #[prost(string, tag = "10")]
    pub domain: String,
    /// Overload name.
    #[prost(string, tag = "13")]
    pub overload: String,
    /// Types of values in the body.
    #[prost(message, repeated, tag = "12")]
    pub value_info: Vec<ValueInfoProto>,
}
