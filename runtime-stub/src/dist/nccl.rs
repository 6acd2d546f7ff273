//! NCCL collectives of `pipec run --device cuda --transport nccl` (cargo feature `cuda`): the
//! all-reduces of the schedule sum GPU values where they are, with `ncclAllReduce` on one
//! communicator per all-reduce group.
//!
//! ```text
//! worker (first device of the group in this process)
//!   ├─ in-process: the group's other local devices hand their GPU values over; it adds them
//!   ├─ Nccl::all_reduce_sum: device sync (ONNX Runtime's streams are done), one NCCL group
//!   │    call with an in-place ncclAllReduce(sum) per value on this process's stream, stream sync
//!   └─ in-process: a copy of each sum to every other local device
//! ```
//!
//! One NCCL rank per process and GPU (NCCL refuses two ranks on one GPU). With `--backend mpi`
//! (one process per device, `mpirun -np N`) the communicator of a group has a rank per member
//! and NCCL does the whole sum; its unique id is made by the group's first rank and broadcast
//! over the group's MPI communicator. In one process (threads) every communicator is a world
//! of one: the devices' values meet in-process and the NCCL call is the same call on one rank.
//!
//! Libraries are opened at run time: the CUDA driver (`libcuda.so.1`) and NCCL as `libnccl.so`
//! (the `nvidia-nccl-cu13` wheel ships `libnccl.so.2`: link it as `libnccl.so` in a folder on
//! `LD_LIBRARY_PATH`, as `scripts/gpu_check.sh` does). A missing library is an error naming it,
//! before any worker starts.
//!
//! Which groups: those of [`ordered_groups`](super::collective::ordered_groups) (every member
//! issues the same sequence of all-reduces on them, as NCCL matches collectives by order); the
//! all-reduces of any other group go through the host collectives.

use super::collective::ValueCollectives;
use super::transport::CommError;
use crate::value::Value;
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{result as nccl, sys};
use pipec_compiler::ir::DType;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static CALLS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// The `ncclAllReduce` calls this process made so far, and the bytes they summed (its share).
pub fn totals() -> (u64, u64) {
    (CALLS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed))
}

/// NCCL's 128-byte unique id of a communicator, as bytes (what MPI broadcasts).
pub type UniqueId = [u8; 128];

/// Why NCCL could not be set up.
fn setup_err(msg: impl std::fmt::Display) -> String {
    format!("--transport nccl: {msg}")
}

/// An NCCL error in words: the result code (`ncclInvalidUsage`), NCCL's string for it and the
/// last error NCCL recorded (e.g. "Duplicate GPU detected : rank 0 and rank 1 both on CUDA
/// device 60"), plus what to do where the cause is known.
fn describe(e: &nccl::NcclError) -> String {
    let code = e.0;
    // SAFETY: both return NCCL's static (or thread-local) NUL-terminated strings, or null.
    let (what, last) = unsafe {
        let text = |p: *const std::ffi::c_char| {
            (!p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
        };
        (
            text(sys::ncclGetErrorString(code)),
            text(sys::ncclGetLastError(std::ptr::null_mut())),
        )
    };
    let mut s = format!("{code:?}");
    if let Some(w) = what.filter(|w| !w.is_empty()) {
        s += &format!(" ({w})");
    }
    if let Some(l) = last.filter(|l| !l.trim().is_empty()) {
        s += &format!(": {}", l.trim());
        if l.contains("Duplicate GPU") {
            s += " (NCCL takes one rank per GPU: start at most as many ranks per machine as it \
                  has GPUs, each on its own GPU, or run without --transport nccl)";
        }
    }
    s
}

/// Check that the CUDA driver and NCCL libraries can be opened (cudarc panics on a missing
/// library, so this runs first).
pub fn check_libraries() -> Result<(), String> {
    // SAFETY: only tries to dlopen the candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(setup_err(
            "the CUDA driver library (libcuda.so.1) cannot be opened: this needs a machine \
             with an NVIDIA GPU and its driver",
        ));
    }
    // SAFETY: as above.
    if !unsafe { sys::is_culib_present() } {
        return Err(setup_err(
            "NCCL cannot be opened: no libnccl.so on the library path (the nvidia-nccl-cu13 \
             Python package ships nvidia/nccl/lib/libnccl.so.2: link it as libnccl.so in a \
             folder on LD_LIBRARY_PATH; scripts/gpu_check.sh does)",
        ));
    }
    Ok(())
}

/// A new unique id (made by one rank of a communicator and given to the others).
pub fn unique_id() -> Result<UniqueId, String> {
    let id = nccl::get_uniqueid()
        .map_err(|e| setup_err(format!("ncclGetUniqueId: {}", describe(&e))))?;
    Ok(id.internal.map(|c| c as u8))
}

/// The installed NCCL's version (e.g. 22707 for 2.27.7).
pub fn version() -> Result<i32, String> {
    nccl::get_nccl_version().map_err(|e| setup_err(format!("ncclGetVersion: {}", describe(&e))))
}

/// One communicator (this process's rank in it).
struct Comm {
    raw: sys::ncclComm_t,
}

// SAFETY: a communicator is used by one thread at a time (behind the `Mutex` of `Nccl`).
unsafe impl Send for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ncclCommInitRank and is destroyed once, with no operation
        // pending (every call below waits for its stream).
        unsafe {
            let _ = nccl::comm_destroy(self.raw);
        }
    }
}

/// The NCCL communicators of one process, one per all-reduce group it takes part in.
pub struct Nccl {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    comms: BTreeMap<Vec<usize>, Mutex<Comm>>,
    /// The devices that run in this process.
    local: Vec<usize>,
}

/// What a communicator of [`Nccl::new`] is: a group, this process's rank and the number of
/// ranks (processes) in it, and the id every rank of it was given.
pub struct CommSpec {
    pub group: Vec<usize>,
    pub rank: usize,
    pub size: usize,
    pub id: UniqueId,
}

impl Nccl {
    /// Open GPU `gpu` and create the communicators of `specs` in their order (collective: the
    /// processes of a communicator create it together, so every process must list the groups
    /// in the same order). `local` lists the devices this process runs.
    pub fn new(gpu: usize, local: Vec<usize>, specs: Vec<CommSpec>) -> Result<Nccl, String> {
        check_libraries()?;
        let ctx =
            CudaContext::new(gpu).map_err(|e| setup_err(format!("CUDA device {gpu}: {e}")))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| setup_err(format!("a CUDA stream on device {gpu}: {e}")))?;
        let mut comms = BTreeMap::new();
        for s in specs {
            let id = sys::ncclUniqueId {
                internal: s.id.map(|b| b as std::ffi::c_char),
            };
            let mut raw = std::ptr::null_mut();
            // SAFETY: `raw` is written by NCCL; the context of `gpu` is current (CudaContext::new
            // binds it to this thread), which is the GPU NCCL takes for the communicator.
            unsafe { nccl::comm_init_rank(&mut raw, s.size as i32, id, s.rank as i32) }.map_err(
                |e| {
                    setup_err(format!(
                        "ncclCommInitRank for the all-reduce group {:?} (rank {} of {}): {}",
                        s.group,
                        s.rank,
                        s.size,
                        describe(&e)
                    ))
                },
            )?;
            comms.insert(s.group, Mutex::new(Comm { raw }));
        }
        Ok(Nccl {
            ctx,
            stream,
            comms,
            local,
        })
    }

    /// The communicators of one process that runs every device of `program` (threads): a world
    /// of one per group of [`ordered_groups`](super::collective::ordered_groups).
    pub fn in_process(
        gpu: usize,
        program: &pipec_compiler::program::Program,
    ) -> Result<Nccl, String> {
        check_libraries()?;
        let local = (0..program.devices.len()).collect();
        let mut specs = Vec::new();
        for group in super::collective::ordered_groups(program) {
            specs.push(CommSpec {
                group,
                rank: 0,
                size: 1,
                id: unique_id()?,
            });
        }
        Nccl::new(gpu, local, specs)
    }
}

fn nccl_dtype(d: DType) -> Option<sys::ncclDataType_t> {
    Some(match d {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        _ => return None,
    })
}

impl ValueCollectives for Nccl {
    fn is_local(&self, d: usize) -> bool {
        self.local.contains(&d)
    }

    fn covers(&self, group: &[usize]) -> bool {
        self.comms.contains_key(group)
    }

    fn all_reduce_sum(
        &self,
        group: &[usize],
        tag: u32,
        values: &mut [Value],
    ) -> Result<(), CommError> {
        let what = || format!("NCCL all-reduce over devices {group:?} (tag {tag})");
        let err = |m: String| CommError::Other(format!("{}: {m}", what()));
        let comm = self
            .comms
            .get(group)
            .ok_or_else(|| err("no communicator for this group".into()))?;
        let comm = comm.lock().unwrap_or_else(|e| e.into_inner());
        let mut bufs = Vec::with_capacity(values.len());
        for v in values.iter_mut() {
            let dt = v.dtype();
            let ty = nccl_dtype(dt).ok_or_else(|| err(format!("cannot sum {dt} tensors")))?;
            let Value::Ort(o) = v else {
                return Err(err("a value in host memory (NCCL sums GPU values)".into()));
            };
            let (ptr, n) = o
                .device_buffer_mut()
                .ok_or_else(|| err("a value in host memory (NCCL sums GPU values)".into()))?;
            bufs.push((ptr, n, ty));
            BYTES.fetch_add(dt.bytes_for(n as u64).unwrap_or(0), Ordering::Relaxed);
        }
        // The worker threads of one process share the context; make it this thread's.
        self.ctx
            .bind_to_thread()
            .map_err(|e| err(format!("binding the CUDA context: {e}")))?;
        // What produced the values (ONNX Runtime's own streams) must be done before NCCL reads
        // them on ours.
        self.ctx
            .synchronize()
            .map_err(|e| err(format!("CUDA synchronize: {e}")))?;
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        nccl::group_start().map_err(|e| err(format!("ncclGroupStart: {}", describe(&e))))?;
        let mut first_err = None;
        for &(ptr, n, ty) in &bufs {
            // SAFETY: `ptr` is the GPU buffer of `n` elements of type `ty` of a value this
            // worker owns (in place: send and receive buffers are the same, which NCCL allows);
            // it stays alive and untouched until the stream is synchronized below.
            let r = unsafe {
                nccl::all_reduce(ptr, ptr, n, ty, sys::ncclRedOp_t::ncclSum, comm.raw, stream)
            };
            CALLS.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = r {
                first_err.get_or_insert(format!("ncclAllReduce: {}", describe(&e)));
            }
        }
        let end = nccl::group_end();
        if let Some(m) = first_err {
            return Err(err(m));
        }
        end.map_err(|e| err(format!("ncclGroupEnd: {}", describe(&e))))?;
        self.stream
            .synchronize()
            .map_err(|e| err(format!("waiting for the stream: {e}")))?;
        Ok(())
    }
}
