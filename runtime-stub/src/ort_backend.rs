//! The ONNX Runtime backend (`"ort"`, and `"ort-cuda"` for `--device cuda`).
//!
//! `prepare` exports the module with `pipec_compiler::onnx::export::to_bytes` and creates one ONNX
//! Runtime session from it (graph optimizations on, so ONNX Runtime's own fusions run once per
//! piece); `run` wraps the input tensors as ONNX Runtime values, runs the session and copies the
//! outputs back into [`Tensor`]s. The pieces are plain ONNX, so ONNX Runtime's kernels (CPU, or
//! CUDA with the `cuda` feature) run every op the training graphs use: this keeps the runtime
//! thin (a schedule interpreter, sessions, buffers, a transport).
//!
//! # The library
//!
//! The `ort` crate is built with `load-dynamic`: pipec builds without ONNX Runtime and opens
//! `libonnxruntime.so` the first time an `ort` executor prepares a module, from
//!
//! 1. `ORT_DYLIB_PATH` (a path to the library file), else
//! 2. the `onnxruntime` Python package of `$PIPEC_PYTHON` (default `python3`): its
//!    `onnxruntime/capi/libonnxruntime.so*` (the PyPI wheels `onnxruntime` and, for CUDA,
//!    `onnxruntime-gpu` ship it; `scripts/setup.sh` installs the CPU one).
//!
//! A missing library is an [`Error::Backend`] that names both ways to fix it.
//!
//! # Threads
//!
//! `pipec run` runs one worker thread per device, each with its own sessions, so every session
//! gets `PIPEC_ORT_THREADS` intra-op threads (default 1: the workers already occupy the cores;
//! raise it when devices are fewer than cores).
//!
//! # CUDA (`--device cuda`, cargo feature `cuda`)
//!
//! The CUDA execution provider on GPU `PIPEC_CUDA_DEVICE`, else (under OpenMPI's `mpirun`) the
//! process's local rank `OMPI_COMM_WORLD_LOCAL_RANK`, else 0. Float32 stays float32: TF32 matrix
//! products are off (`PIPEC_CUDA_TF32=1` turns them on; they move a training run by ~1e-3
//! relative, more than `--check` allows) and cuDNN picks its default convolution algorithms
//! rather than benchmarking (reproducible runs).
//!
//! CPU fallback is allowed: ONNX Runtime deliberately places shape arithmetic (`Shape`, `Size`,
//! the small int64 ops after them) on the CPU even when CUDA kernels exist, so disabling the
//! fallback rejects every training graph (seen on gpt2_tiny and inception_mini). With
//! `PIPEC_ORT_STRICT=1` it is disabled; `PIPEC_ORT_LOG=verbose` prints ONNX Runtime's node
//! placement to tell which nodes run on the CPU; `PIPEC_ORT_PROFILE=PREFIX` writes ONNX
//! Runtime's per-node profile of every session (`PREFIX<n>-<graph>_<time>.json`, Chrome trace
//! format).
//!
//! # Values stay where they are computed
//!
//! [`Executor::upload`] turns a host tensor into an [`OrtValue`] in the provider's memory (the
//! GPU's for CUDA: one copy), and [`Prepared::run_values`] binds the values it is given where
//! they are and binds every output to that memory (ONNX Runtime's `IoBinding`), so the worker's
//! parameters, gradients, optimizer state and activations stay on the GPU from one piece to the
//! next (all-reduces between the devices of one process too); only what the host needs (the
//! loss, MPI messages and all-reduces, the final parameters) is copied back ([`OrtValue::to_host`]). [`transfers`] counts the bytes copied
//! each way.

use crate::error::{Error, Result};
use crate::exec::{bind_inputs, Executor, Prepared};
use crate::tensor::Tensor;
use crate::value::Value;
use ndarray::{ArrayD, IxDyn};
use ort::environment::Environment;
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{builder::GraphOptimizationLevel, Session};
use ort::value::{
    DynTensor, DynTensorValueType, DynValue, TensorElementType, TensorValueTypeMarker, ValueType,
};
use pipec_compiler::ir::DType;
use pipec_compiler::ir::{Graph, Module};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Where ONNX Runtime's computation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrtDevice {
    /// The CPU execution provider.
    Cpu,
    /// The CUDA execution provider (feature `cuda`).
    Cuda,
}

/// The ONNX Runtime backend.
#[derive(Clone, Copy, Debug)]
pub struct Ort {
    pub device: OrtDevice,
}

fn oerr(e: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: "ort",
        msg: e.to_string().replace('\n', " "),
    }
}

/// The library path: `ORT_DYLIB_PATH`, else the `onnxruntime` Python package's.
fn find_library() -> std::result::Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "ORT_DYLIB_PATH={}: no such file (point it at libonnxruntime.so)",
                p.display()
            ))
        };
    }
    let python = std::env::var("PIPEC_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))",
        ])
        .stderr(std::process::Stdio::null())
        .output();
    let dir = match out {
        Ok(o) if o.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("capi")
        }
        _ => {
            return Err(format!(
                "ONNX Runtime not found: `{python} -c 'import onnxruntime'` failed and \
                 ORT_DYLIB_PATH is not set. Install it (`{python} -m pip install \
                 onnxruntime==1.31.1`, as scripts/setup.sh does; `onnxruntime-gpu` for \
                 --device cuda) or set ORT_DYLIB_PATH=/path/to/libonnxruntime.so"
            ))
        }
    };
    let mut libs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so"))
        })
        .collect();
    libs.sort();
    libs.pop().ok_or_else(|| {
        format!(
            "{}: no libonnxruntime.so* in the onnxruntime package (set ORT_DYLIB_PATH)",
            dir.display()
        )
    })
}

/// The process's ONNX Runtime environment, created on first use (ONNX Runtime allows one).
fn environment() -> Result<&'static Environment> {
    static ENV: OnceLock<std::result::Result<Environment, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let lib = find_library()?;
        ort::init_from(&lib)
            .map_err(|e| format!("{}: {e}", lib.display()))?
            .with_name("pipec")
            .build()
            .map_err(|e| format!("{}: {e}", lib.display()))
    })
    .as_ref()
    .map_err(|e| Error::Backend {
        backend: "ort",
        msg: e.clone(),
    })
}

/// Whether the variable is set to something other than empty or `0`.
#[cfg(feature = "cuda")]
fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

impl Executor for Ort {
    fn name(&self) -> &'static str {
        match self.device {
            OrtDevice::Cpu => "ort",
            OrtDevice::Cuda => "ort-cuda",
        }
    }

    fn prepare(&self, module: &Module) -> Result<Box<dyn Prepared>> {
        let env = environment()?;
        let bytes = pipec_compiler::onnx::export::to_bytes(module)?;
        let threads = std::env::var("PIPEC_ORT_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        let mut b = Session::builder(env)
            .map_err(oerr)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(oerr)?
            .with_intra_threads(threads)
            .map_err(oerr)?
            .with_inter_threads(1)
            .map_err(oerr)?;
        if let Ok(level) = std::env::var("PIPEC_ORT_LOG") {
            use ort::logging::LogLevel;
            let l = match level.as_str() {
                "verbose" => LogLevel::Verbose,
                "info" => LogLevel::Info,
                "warning" => LogLevel::Warning,
                _ => LogLevel::Error,
            };
            b = b.with_log_level(l).map_err(oerr)?;
        }
        if self.device == OrtDevice::Cuda {
            b = cuda_provider(b)?;
        }
        let profiling = match std::env::var("PIPEC_ORT_PROFILE") {
            Ok(prefix) if !prefix.is_empty() => {
                static N: AtomicU64 = AtomicU64::new(0);
                let n = N.fetch_add(1, Ordering::Relaxed);
                b = b
                    .with_profiling(format!("{prefix}{n:03}-{}", module.graph.name))
                    .map_err(oerr)?;
                true
            }
            _ => false,
        };
        let session = b.commit_from_memory(&bytes).map_err(oerr)?;
        Ok(Box::new(OrtProgram {
            graph: module.graph.clone(),
            outputs: module
                .graph
                .outputs
                .iter()
                .map(|v| module.graph.name(*v).to_string())
                .collect(),
            session,
            memory: self.memory_info()?,
            profiling,
        }))
    }

    fn holds_values(&self) -> bool {
        true
    }

    fn upload(&self, t: Tensor) -> Result<Value> {
        environment()?;
        let v = into_ort("upload", t)?;
        let v = match self.device {
            OrtDevice::Cpu => v,
            OrtDevice::Cuda => {
                let t =
                    v.t.to(AllocationDevice::CUDA, cuda_device())
                        .map_err(oerr)?;
                OrtValue { t, ..v }
            }
        };
        Ok(Value::Ort(v))
    }
}

impl Ort {
    /// Where this executor's values live.
    fn memory_info(&self) -> Result<MemoryInfo<'static>> {
        let (dev, id) = match self.device {
            OrtDevice::Cpu => (AllocationDevice::CPU, 0),
            OrtDevice::Cuda => (AllocationDevice::CUDA, cuda_device()),
        };
        MemoryInfo::new(dev, id, AllocatorType::Device, MemoryType::Default).map_err(oerr)
    }
}

/// The GPU of `--device cuda`: `PIPEC_CUDA_DEVICE`, else (under OpenMPI's `mpirun`) the
/// process's local rank, else 0.
pub fn cuda_device() -> i32 {
    ["PIPEC_CUDA_DEVICE", "OMPI_COMM_WORLD_LOCAL_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

static UPLOADED: AtomicU64 = AtomicU64::new(0);
static DOWNLOADED: AtomicU64 = AtomicU64::new(0);

/// Bytes this process handed from host tensors to ONNX Runtime (copied to the GPU for CUDA)
/// and copied from ONNX Runtime values back to host tensors, so far: what crosses between the
/// runtime's host memory and the executor's values.
pub fn transfers() -> (u64, u64) {
    (
        UPLOADED.load(Ordering::Relaxed),
        DOWNLOADED.load(Ordering::Relaxed),
    )
}

/// A tensor held by ONNX Runtime, in the memory of the provider that made it.
#[derive(Debug)]
pub struct OrtValue {
    t: DynTensor,
    dtype: DType,
    shape: Vec<usize>,
    bytes: u64,
}

impl OrtValue {
    fn new(name: &str, v: DynValue) -> Result<Self> {
        let (dtype, shape) = tensor_type(name, v.dtype())?;
        let bytes = dtype
            .bytes_for(shape.iter().product::<usize>() as u64)
            .unwrap_or(0);
        let t = v
            .downcast::<DynTensorValueType>()
            .map_err(|e| Error::input(name, format!("ONNX Runtime output: {e}")))?;
        Ok(OrtValue {
            t,
            dtype,
            shape,
            bytes,
        })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether the data is in GPU memory.
    pub fn on_device(&self) -> bool {
        !self.t.memory_info().is_cpu_accessible()
    }

    /// A copy in the same memory (a GPU-to-GPU copy for a CUDA value).
    pub fn try_clone(&self) -> Result<OrtValue> {
        let m = self.t.memory_info();
        let t = self
            .t
            .to(m.allocation_device(), m.device_id())
            .map_err(oerr)?;
        Ok(OrtValue {
            t,
            dtype: self.dtype,
            shape: self.shape.clone(),
            bytes: self.bytes,
        })
    }

    /// The GPU address and element count of a CUDA value, for a transport that reads and
    /// writes it where it is (NCCL); `None` for a value in host memory.
    pub fn device_buffer_mut(&mut self) -> Option<(*mut std::ffi::c_void, usize)> {
        if !self.on_device() {
            return None;
        }
        let n = self.shape.iter().product();
        Some((self.t.data_ptr_mut().cast(), n))
    }

    /// A host copy (from the GPU for a CUDA value).
    pub fn to_host(&self) -> Result<Tensor> {
        DOWNLOADED.fetch_add(self.bytes, Ordering::Relaxed);
        if self.on_device() {
            let host = self.t.to(AllocationDevice::CPU, 0).map_err(oerr)?;
            from_ort("value", &host)
        } else {
            from_ort("value", &self.t)
        }
    }
}

/// The dtype and shape of an ONNX Runtime value that must be a tensor of a dtype pipec has.
fn tensor_type(name: &str, ty: &ValueType) -> Result<(DType, Vec<usize>)> {
    let (ty, shape) = match ty {
        ValueType::Tensor { ty, shape, .. } => (*ty, shape),
        other => {
            return Err(Error::input(
                name,
                format!("ONNX Runtime produced a {other}, not a tensor"),
            ))
        }
    };
    let dtype = match ty {
        TensorElementType::Float32 => DType::F32,
        TensorElementType::Float64 => DType::F64,
        TensorElementType::Int64 => DType::I64,
        TensorElementType::Int32 => DType::I32,
        TensorElementType::Uint8 => DType::U8,
        TensorElementType::Bool => DType::Bool,
        other => {
            return Err(Error::input(
                name,
                format!("ONNX Runtime produced an unsupported dtype {other}"),
            ))
        }
    };
    Ok((dtype, shape.iter().map(|&d| d.max(0) as usize).collect()))
}

/// An ONNX Runtime value in host memory that owns `t`'s data (no copy for a contiguous array).
fn into_ort(name: &str, t: Tensor) -> Result<OrtValue> {
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    macro_rules! val {
        ($a:expr) => {
            ort::value::Tensor::from_array((shape, crate::tensor::into_row_major_vec($a)))
                .map(|v| v.into_dyn())
        };
    }
    let v = match t {
        Tensor::F32(a) => val!(a),
        Tensor::F64(a) => val!(a),
        Tensor::I64(a) => val!(a),
        Tensor::I32(a) => val!(a),
        Tensor::U8(a) => val!(a),
        Tensor::Bool(a) => val!(a),
    }
    .map_err(|e| Error::input(name, format!("to ONNX Runtime: {e}")))?;
    let v = OrtValue::new(name, v)?;
    UPLOADED.fetch_add(v.bytes, Ordering::Relaxed);
    Ok(v)
}

#[cfg(feature = "cuda")]
fn cuda_provider(
    b: ort::session::builder::SessionBuilder,
) -> Result<ort::session::builder::SessionBuilder> {
    use ort::ep::cuda::ConvAlgorithmSearch;
    let device = cuda_device();
    let b = b
        .with_execution_providers([ort::ep::CUDA::default()
            .with_device_id(device)
            .with_tf32(env_flag("PIPEC_CUDA_TF32"))
            .with_conv_algorithm_search(ConvAlgorithmSearch::Default)
            .build()
            .error_on_failure()])
        .map_err(|e| Error::Backend {
            backend: "ort-cuda",
            msg: format!(
                "the CUDA execution provider failed to load on device {device}: {e} (it needs \
                 onnxruntime-gpu's libonnxruntime_providers_cuda.so next to \
                 libonnxruntime.so, and cuBLAS, cuDNN 9, cuRAND and the CUDA runtime on the \
                 library path; scripts/gpu_check.sh sets these up)"
            ),
        })?;
    if env_flag("PIPEC_ORT_STRICT") {
        b.with_disable_cpu_fallback().map_err(oerr)
    } else {
        Ok(b)
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_provider(
    _b: ort::session::builder::SessionBuilder,
) -> Result<ort::session::builder::SessionBuilder> {
    Err(Error::Backend {
        backend: "ort-cuda",
        msg: "this pipec was built without CUDA support: rebuild with \
              `cargo build --release --features cuda`"
            .into(),
    })
}

struct OrtProgram {
    graph: Graph,
    /// The graph's output names, in order (what every run returns).
    outputs: Vec<String>,
    session: Session,
    /// Where outputs are bound (the provider's memory).
    memory: MemoryInfo<'static>,
    /// `PIPEC_ORT_PROFILE` is set: write ONNX Runtime's profile when the piece is dropped.
    profiling: bool,
}

impl Drop for OrtProgram {
    fn drop(&mut self) {
        if self.profiling {
            match self.session.end_profiling() {
                Ok(path) => eprintln!("ONNX Runtime profile: {path}"),
                Err(e) => eprintln!("ONNX Runtime profile not written: {e}"),
            }
        }
    }
}

fn from_ort<T: TensorValueTypeMarker + ?Sized>(
    name: &str,
    v: &ort::value::Value<T>,
) -> Result<Tensor> {
    let bad = |e: ort::Error| Error::input(name, format!("ONNX Runtime output: {e}"));
    macro_rules! arr {
        ($ty:ty, $variant:ident) => {{
            let (shape, data) = v.try_extract_tensor::<$ty>().map_err(bad)?;
            let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            Tensor::$variant(
                ArrayD::from_shape_vec(IxDyn(&dims), data.to_vec())
                    .map_err(|e| Error::input(name, format!("ONNX Runtime output: {e}")))?,
            )
        }};
    }
    Ok(match tensor_type(name, v.dtype())?.0 {
        DType::F32 => arr!(f32, F32),
        DType::F64 => arr!(f64, F64),
        DType::I64 => arr!(i64, I64),
        DType::I32 => arr!(i32, I32),
        DType::U8 => arr!(u8, U8),
        DType::Bool => arr!(bool, Bool),
        // tensor_type gives only the dtypes above.
        other => return Err(Error::input(name, format!("unsupported dtype {other}"))),
    })
}

impl Prepared for OrtProgram {
    fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let (ins, _) = bind_inputs(&self.graph, inputs)?;
        let mut feed: Vec<(String, DynValue)> = Vec::with_capacity(ins.len());
        for (v, t) in self.graph.inputs.iter().zip(ins) {
            let name = self.graph.values[*v].name.clone();
            let val = into_ort(&name, t.clone())?.t.into_dyn();
            feed.push((name, val));
        }
        let outs = self.session.run(feed).map_err(oerr)?;
        let mut res = Vec::with_capacity(self.graph.outputs.len());
        for name in &self.outputs {
            let name = name.clone();
            let val = outs.get(&name).ok_or_else(|| {
                Error::input(&name, "ONNX Runtime did not return this graph output")
            })?;
            let t = from_ort(&name, val)?;
            res.push((name, t));
        }
        Ok(res)
    }

    fn run_values(&mut self, inputs: Vec<(String, Value)>) -> Result<crate::exec::ValuesRun> {
        let mut binding = self.session.create_binding().map_err(oerr)?;
        let mut back = Vec::with_capacity(inputs.len());
        for (name, v) in inputs {
            // A host input is bound in host memory: ONNX Runtime copies it to the GPU only if
            // a kernel wants it there (the worker uploads its buffers itself; what comes here
            // are small host operands such as a slice's bounds, which CUDA kernels read on the
            // CPU).
            let v = match v {
                Value::Host(t) => into_ort(&name, t)?,
                Value::Ort(o) => o,
            };
            binding.bind_input(name.as_str(), &v.t).map_err(oerr)?;
            back.push((name, v));
        }
        for n in &self.outputs {
            binding
                .bind_output_to_device(n.as_str(), &self.memory)
                .map_err(oerr)?;
        }
        let mut outs = self.session.run_binding(&binding).map_err(oerr)?;
        let mut res = Vec::with_capacity(self.outputs.len());
        for n in &self.outputs {
            let v = outs
                .remove(n.as_str())
                .ok_or_else(|| Error::input(n, "ONNX Runtime did not return this graph output"))?;
            res.push((n.clone(), Value::Ort(OrtValue::new(n, v)?)));
        }
        // Host inputs converted above are ONNX Runtime values now.
        let back = back.into_iter().map(|(n, o)| (n, Value::Ort(o))).collect();
        Ok((back, res))
    }
}
