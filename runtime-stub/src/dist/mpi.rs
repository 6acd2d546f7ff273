//! The MPI backend of `pipec run --backend mpi` (cargo feature `mpi`): one process per device
//! (`mpirun -np N`, rank = device index), an [`Endpoint`] over MPI point-to-point messages and
//! [`Collectives`] over MPI's own all-reduce on one sub-communicator per group.
//!
//! ```text
//! mpirun -np N pipec run OUTDIR --backend mpi
//!   every rank: Session::init ─ load(OUTDIR) ─ run_rank: MpiCollectives::new (one communicator
//!   per all-reduce group, created in the same order on every rank) ─ worker::run_device on the
//!   main thread ─ results to rank 0 ─ rank 0: losses, parameters, --check ─ exit code broadcast
//!   a failing rank prints its error and calls MPI_Abort, so mpirun ends within seconds
//! ```
//!
//! Messages: every point-to-point message travels on a private duplicate of `MPI_COMM_WORLD`
//! with one MPI tag; the [`Tag`] and the tensor's dtype and shape are in a small header in front
//! of the raw little-endian bytes (MPI tags are only guaranteed up to 32767, the schedule's are
//! `u32`). A receive drains the messages of its source into a mailbox keyed by `(source, Tag)`
//! until the one it wants is there; MPI keeps messages of one source on one communicator and
//! tag in order, so the mailbox is FIFO per `(source, Tag)` like the in-process transport.
//! Sends are `MPI_Isend` of an owned buffer kept alive until the request completes (tested on
//! every call, waited for by [`MpiEndpoint::finish`]), so [`Endpoint::send`] never blocks.
//! Receives and all-reduces poll (`MPI_Improbe` / `MPI_Test`) and fail after the timeout.
//!
//! Limits: one message must stay below 2 GiB (MPI counts are `int`); the endpoint may only be
//! used from the thread that initialized MPI unless MPI granted `MPI_THREAD_MULTIPLE`.

use super::collective::{ordered_groups, Collectives, Elem, Ring};
use super::trace::Event;
use super::transport::{CommError, Endpoint, Tag};
use super::worker::{self, DeviceCtx, DeviceOutcome};
use super::{DeviceTiming, DistError, LoadedProgram, Result, RunOptions, RunResult};
use crate::tensor::Tensor;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::point_to_point::MatchedReceiveVec;
use mpi::request::{Request, StaticScope};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use pipec_compiler::ir::{DType, TensorData};
use pipec_compiler::program::Program;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The one MPI tag of point-to-point messages (the real [`Tag`] is in the header).
const P2P_TAG: i32 = 7;
/// [`Tag::id`] of the messages that bring the ranks' results to rank 0.
const RESULT_TAG: u32 = u32::MAX;
/// How long a poll loop sleeps between two unsuccessful polls.
const POLL_SLEEP: Duration = Duration::from_micros(50);

fn other(msg: impl Into<String>) -> CommError {
    CommError::Other(msg.into())
}

/// MPI, initialized once per process; finalized when dropped.
pub struct Session {
    world: SimpleCommunicator,
    /// Finalizes MPI when dropped (after `world`; communicators made from it must be gone).
    _universe: mpi::environment::Universe,
    /// Whether MPI granted `MPI_THREAD_MULTIPLE`.
    pub multiple: bool,
}

impl Session {
    /// Initialize MPI (`None` if it was initialized before in this process).
    pub fn init() -> Option<Session> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)?;
        let world = universe.world();
        Some(Session {
            world,
            _universe: universe,
            multiple: threading == mpi::Threading::Multiple,
        })
    }

    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// `MPI_Abort` on `MPI_COMM_WORLD`: every rank of the job is killed, `mpirun` exits
    /// non-zero.
    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    /// Rank 0's `code`, on every rank (a blocking broadcast: if rank 0 fails it aborts the job).
    pub fn broadcast_code(&self, code: u8) -> u8 {
        let mut c = code;
        self.world.process_at_rank(0).broadcast_into(&mut c);
        c
    }

    /// The lowest rank that passes `failed = true`, if any (collective: every rank calls it).
    pub fn min_rank(&self, failed: bool) -> Option<usize> {
        let mine = if failed { self.rank() } else { self.size() } as u64;
        let mut min = 0u64;
        self.world
            .all_reduce_into(&mine, &mut min, SystemOperation::min());
        (min < self.size() as u64).then_some(min as usize)
    }

    /// Wait until every rank got here.
    pub fn barrier(&self) {
        self.world.barrier();
    }

    /// The MPI library's version string.
    pub fn library_version(&self) -> String {
        mpi::environment::library_version().unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Serialization: header (tag id, tag part, dtype, rank, dims as u64) + raw little-endian bytes.

fn dtype_code(d: DType) -> Option<u8> {
    Some(match d {
        DType::F32 => 0,
        DType::F64 => 1,
        DType::I64 => 2,
        DType::I32 => 3,
        DType::U8 => 4,
        DType::Bool => 5,
        _ => return None,
    })
}

fn code_dtype(c: u8) -> Option<DType> {
    Some(match c {
        0 => DType::F32,
        1 => DType::F64,
        2 => DType::I64,
        3 => DType::I32,
        4 => DType::U8,
        5 => DType::Bool,
        _ => return None,
    })
}

/// Serialize a message: `id u32, part u32, dtype u8, rank u8, dims u64 * rank, bytes`.
pub fn encode(tag: Tag, t: &Tensor) -> Result<Vec<u8>, CommError> {
    let td = t.to_tensor_data();
    let raw = td
        .raw()
        .ok_or_else(|| other("cannot serialize a tensor without raw data"))?;
    let code = dtype_code(t.dtype())
        .ok_or_else(|| other(format!("cannot send a {} tensor", t.dtype())))?;
    let rank = u8::try_from(td.dims.len()).map_err(|_| other("tensor rank above 255"))?;
    let mut b = Vec::with_capacity(10 + 8 * td.dims.len() + raw.len());
    b.extend_from_slice(&tag.id.to_le_bytes());
    b.extend_from_slice(&tag.part.to_le_bytes());
    b.push(code);
    b.push(rank);
    for d in &td.dims {
        b.extend_from_slice(&(*d as u64).to_le_bytes());
    }
    b.extend_from_slice(raw);
    Ok(b)
}

/// Inverse of [`encode`].
pub fn decode(b: &[u8]) -> Result<(Tag, Tensor), CommError> {
    let bad = |why: &str| other(format!("malformed message ({} bytes): {why}", b.len()));
    if b.len() < 10 {
        return Err(bad("shorter than its header"));
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let tag = Tag {
        id: u32_at(0),
        part: u32_at(4),
    };
    let dtype = code_dtype(b[8]).ok_or_else(|| bad("unknown dtype code"))?;
    let rank = b[9] as usize;
    let body = 10 + 8 * rank;
    if b.len() < body {
        return Err(bad("shorter than its dims"));
    }
    let dims: Vec<i64> = (0..rank)
        .map(|k| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[10 + 8 * k..18 + 8 * k]);
            u64::from_le_bytes(x) as i64
        })
        .collect();
    let td = TensorData {
        dtype,
        dims,
        payload: pipec_compiler::ir::Payload::Raw(bytes::Bytes::copy_from_slice(&b[body..])),
    };
    let t = Tensor::from_tensor_data(&td).map_err(|e| bad(&e.to_string()))?;
    Ok((tag, t))
}

// ---------------------------------------------------------------------------------------------
// Point-to-point.

/// A send in flight and its buffer (leaked while MPI may read it; freed on completion).
struct PendingSend {
    req: Request<'static, [u8], StaticScope>,
    buf: *mut [u8],
}

impl PendingSend {
    /// Test once; on completion free the buffer and return `None`.
    fn test(self) -> Option<PendingSend> {
        let PendingSend { req, buf } = self;
        match req.test() {
            Ok(_) => {
                // SAFETY: `buf` came from `Box::leak` in `send`, and the request that read it
                // has completed, so nothing refers to it any more.
                drop(unsafe { Box::from_raw(buf) });
                None
            }
            Err(req) => Some(PendingSend { req, buf }),
        }
    }
}

/// This rank's endpoint of the MPI transport.
pub struct MpiEndpoint {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    mailbox: HashMap<(usize, Tag), VecDeque<Tensor>>,
    pending: Vec<PendingSend>,
    aborted: AtomicBool,
}

// SAFETY: the MPI handles are only used through `&mut self` / `&self` of one endpoint, i.e. by
// one thread at a time; the runner keeps the endpoint on the thread that initialized MPI (and
// asks for MPI_THREAD_MULTIPLE anyway). `Endpoint: Send` is needed for trait objects only.
unsafe impl Send for MpiEndpoint {}

impl MpiEndpoint {
    /// The endpoint of this rank, on a private duplicate of `MPI_COMM_WORLD` (collective: every
    /// rank calls it).
    pub fn new(s: &Session) -> MpiEndpoint {
        let comm = s.world.duplicate();
        MpiEndpoint {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            comm,
            mailbox: HashMap::new(),
            pending: Vec::new(),
            aborted: AtomicBool::new(false),
        }
    }

    /// Test every send in flight once, freeing the completed ones.
    fn progress(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.pending = pending.into_iter().filter_map(PendingSend::test).collect();
    }

    /// Wait until every send of this rank has completed (before MPI is finalized), at most
    /// `timeout`.
    pub fn finish(&mut self, timeout: Duration) -> Result<(), CommError> {
        let start = Instant::now();
        loop {
            self.progress();
            if self.pending.is_empty() {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(other(format!(
                    "{} sends not received after {:.1} s",
                    self.pending.len(),
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(POLL_SLEEP);
        }
    }

    /// Move every message `src` has sent so far into the mailbox; whether any arrived.
    fn drain(&mut self, src: usize) -> Result<bool, CommError> {
        let mut any = false;
        while let Some(m) = self
            .comm
            .process_at_rank(src as i32)
            .immediate_matched_probe_with_tag(P2P_TAG)
        {
            let (bytes, _status) = m.matched_receive_vec::<u8>();
            let (tag, t) = decode(&bytes).map_err(|e| other(format!("from device {src}: {e}")))?;
            self.mailbox.entry((src, tag)).or_default().push_back(t);
            any = true;
        }
        Ok(any)
    }
}

impl Endpoint for MpiEndpoint {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(&mut self, dst: usize, tag: Tag, t: Tensor) -> Result<(), CommError> {
        if dst >= self.size {
            return Err(other(format!("send to device {dst}: no such device")));
        }
        let bytes = encode(tag, &t)?;
        if bytes.len() > i32::MAX as usize {
            return Err(other(format!(
                "send to device {dst} ({tag}): {} bytes, MPI messages are limited to 2 GiB",
                bytes.len()
            )));
        }
        drop(t);
        let buf: &'static mut [u8] = Box::leak(bytes.into_boxed_slice());
        let ptr: *mut [u8] = buf;
        // SAFETY: `ptr` is the leaked buffer; MPI only reads it until the request completes,
        // after which `PendingSend::test` frees it.
        let data: &'static [u8] = unsafe { &*ptr };
        let req = self
            .comm
            .process_at_rank(dst as i32)
            .immediate_send_with_tag(StaticScope, data, P2P_TAG);
        self.pending.push(PendingSend { req, buf: ptr });
        self.progress();
        Ok(())
    }

    fn recv(&mut self, src: usize, tag: Tag, timeout: Duration) -> Result<Tensor, CommError> {
        if src >= self.size {
            return Err(other(format!("receive from device {src}: no such device")));
        }
        let start = Instant::now();
        loop {
            if let Some(t) = self
                .mailbox
                .get_mut(&(src, tag))
                .and_then(VecDeque::pop_front)
            {
                return Ok(t);
            }
            if self.is_aborted() {
                return Err(CommError::Aborted);
            }
            self.progress();
            if self.drain(src)? {
                continue;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(CommError::Timeout { src, tag, waited });
            }
            std::thread::sleep(POLL_SLEEP);
        }
    }

    /// Marks this endpoint aborted (its later receives fail at once). Stopping the other ranks
    /// is `MPI_Abort` ([`Session::abort`]), called by the caller of [`run_rank`] after it
    /// reported the error (MPI_Abort does not return, so it cannot be done here first).
    fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------------------------
// Collectives.

/// All-reduce with `MPI_Iallreduce` on one communicator per group; groups whose members do not
/// call their all-reduces in the same order (MPI matches collectives by order, the ring by tag)
/// use the [`Ring`] over the endpoint.
pub struct MpiCollectives {
    comms: HashMap<Vec<usize>, SimpleCommunicator>,
}

// SAFETY: as for `MpiEndpoint`: used by one thread at a time (the rank's worker).
unsafe impl Send for MpiCollectives {}
unsafe impl Sync for MpiCollectives {}

impl MpiCollectives {
    /// Create the communicators of every group of [`ordered_groups`] (collective over the world:
    /// every rank calls it with the same program, before any worker starts).
    pub fn new(s: &Session, p: &Program) -> MpiCollectives {
        let me = s.rank();
        let mut comms = HashMap::new();
        let groups: BTreeSet<Vec<usize>> = ordered_groups(p).into_iter().collect();
        for g in groups {
            let member = g.contains(&me);
            let color = if member {
                Color::with_value(0)
            } else {
                Color::undefined()
            };
            // Ranks of the new communicator are ordered by world rank, i.e. like `g`.
            if let Some(c) = s.world.split_by_color(color) {
                comms.insert(g, c);
            }
        }
        MpiCollectives { comms }
    }

    /// Number of groups with an MPI communicator on this rank.
    pub fn len(&self) -> usize {
        self.comms.len()
    }

    /// Whether this rank is in no MPI group.
    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }
}

/// `MPI_Iallreduce` (sum) of one flat buffer in place, polling with the timeout.
fn iallreduce<T: Elem + Equivalence + Default>(
    comm: &SimpleCommunicator,
    buf: &mut [T],
    what: &dyn Fn() -> String,
    timeout: Duration,
) -> Result<(), CommError> {
    let send: &'static [T] = Box::leak(buf.to_vec().into_boxed_slice());
    let recv: &'static mut [T] = Box::leak(vec![T::default(); buf.len()].into_boxed_slice());
    let recv_ptr: *mut [T] = recv;
    let send_ptr: *const [T] = send;
    // SAFETY: both buffers are leaked above and only freed after the request completed.
    let mut req = comm.immediate_all_reduce_into(
        StaticScope,
        send,
        unsafe { &mut *recv_ptr },
        SystemOperation::sum(),
    );
    let start = Instant::now();
    loop {
        match req.test() {
            Ok(_) => break,
            Err(r) => req = r,
        }
        if start.elapsed() >= timeout {
            // MPI may still use both buffers: leak them and the request (the run fails and
            // the process ends with MPI_Abort).
            std::mem::forget(req);
            return Err(other(format!(
                "{} timed out after {:.1} s",
                what(),
                timeout.as_secs_f64()
            )));
        }
        std::thread::sleep(POLL_SLEEP);
    }
    // SAFETY: the request completed; the buffers were leaked boxes.
    unsafe {
        buf.copy_from_slice(&*recv_ptr);
        drop(Box::from_raw(recv_ptr));
        drop(Box::from_raw(send_ptr as *mut [T]));
    }
    Ok(())
}

fn reduce_dtype<T: Elem + Equivalence + Default>(
    comm: &SimpleCommunicator,
    ts: &mut [&mut Tensor],
    what: &dyn Fn() -> String,
    timeout: Duration,
) -> Result<(), CommError> {
    let mut buf: Vec<T> = Vec::with_capacity(ts.iter().map(|t| t.len()).sum());
    {
        let refs: Vec<&Tensor> = ts.iter().map(|t| &**t).collect();
        T::flatten(&refs, &mut buf);
    }
    iallreduce(comm, &mut buf, what, timeout)?;
    T::scatter(&buf, ts);
    Ok(())
}

impl Collectives for MpiCollectives {
    fn all_reduce_sum(
        &self,
        ep: &mut dyn Endpoint,
        group: &[usize],
        tag: u32,
        tensors: &mut [Tensor],
        timeout: Duration,
    ) -> Result<(), CommError> {
        if group.len() <= 1 {
            return Ok(());
        }
        let Some(comm) = self.comms.get(group) else {
            return Ring.all_reduce_sum(ep, group, tag, tensors, timeout);
        };
        if let Some(t) = tensors
            .iter()
            .find(|t| !matches!(t.dtype(), DType::F32 | DType::F64 | DType::I64 | DType::I32))
        {
            return Err(other(format!(
                "all-reduce (tag {tag}): cannot sum {} tensors",
                t.dtype()
            )));
        }
        let what = || format!("MPI all-reduce over devices {group:?} (tag {tag})");
        for dt in [DType::F32, DType::F64, DType::I64, DType::I32] {
            let mut ts: Vec<&mut Tensor> = tensors.iter_mut().filter(|t| t.dtype() == dt).collect();
            if ts.is_empty() {
                continue;
            }
            match dt {
                DType::F32 => reduce_dtype::<f32>(comm, &mut ts, &what, timeout)?,
                DType::F64 => reduce_dtype::<f64>(comm, &mut ts, &what, timeout)?,
                DType::I64 => reduce_dtype::<i64>(comm, &mut ts, &what, timeout)?,
                _ => reduce_dtype::<i32>(comm, &mut ts, &what, timeout)?,
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Running one rank.

/// With `opts.nccl`: one NCCL communicator per group of [`ordered_groups`] this rank is in, on
/// the GPU of its local rank; the group's first rank makes the unique id and broadcasts it over
/// the group's MPI communicator (collective: every rank walks the groups in the same order).
fn nccl_collectives(
    s: &Session,
    coll: &MpiCollectives,
    lp: &LoadedProgram,
    opts: &RunOptions,
) -> Result<Option<Box<dyn super::ValueCollectives>>> {
    let Some(gpu) = super::nccl_gpu(opts)? else {
        return Ok(None);
    };
    #[cfg(feature = "cuda")]
    {
        use super::nccl::{check_libraries, unique_id, CommSpec, Nccl};
        let me = s.rank();
        // Every rank learns whether every rank can open the libraries before any collective.
        let local_ok = check_libraries();
        if let Some(r) = s.min_rank(local_ok.is_err()) {
            return Err(DistError::Input(match local_ok {
                Err(e) => e,
                Ok(()) => format!("--transport nccl: rank {r} cannot open CUDA or NCCL"),
            }));
        }
        let mut specs = Vec::new();
        for group in ordered_groups(&lp.program) {
            let Some(pos) = group.iter().position(|&g| g == me) else {
                continue;
            };
            let Some(comm) = coll.comms.get(&group) else {
                continue;
            };
            let mut id = if pos == 0 {
                unique_id().map_err(DistError::Input)?
            } else {
                [0u8; 128]
            };
            comm.process_at_rank(0).broadcast_into(&mut id[..]);
            specs.push(CommSpec {
                size: group.len(),
                group,
                rank: pos,
                id,
            });
        }
        let n = Nccl::new(gpu, vec![me], specs).map_err(DistError::Input)?;
        Ok(Some(Box::new(n)))
    }
    #[cfg(not(feature = "cuda"))]
    {
        // nccl_gpu refused already.
        let _ = (s, coll, lp, gpu);
        Ok(None)
    }
}

/// What `run_rank` returns: the whole run's result on rank 0, nothing on the other ranks.
pub type RankResult = Option<RunResult>;

/// Test hook: `PIPEC_MPI_TEST_FAIL=R` makes rank `R` fail with an error (`R:crash`: exit the
/// process abruptly instead) after half a second, while the other ranks wait for it.
pub const TEST_FAIL_ENV: &str = "PIPEC_MPI_TEST_FAIL";

fn test_hook(rank: usize) -> Result<()> {
    let Ok(v) = std::env::var(TEST_FAIL_ENV) else {
        return Ok(());
    };
    let (r, mode) = v.split_once(':').unwrap_or((v.as_str(), "error"));
    if r.trim().parse::<usize>().ok() != Some(rank) {
        return Ok(());
    }
    std::thread::sleep(Duration::from_millis(500));
    if mode == "crash" {
        eprintln!("rank {rank}: {TEST_FAIL_ENV}: exiting abruptly");
        std::process::exit(3);
    }
    Err(DistError::Device {
        device: rank,
        at: "test hook".into(),
        msg: format!("{TEST_FAIL_ENV}={v}: failing on purpose"),
    })
}

/// Per parameter, the first device (in rank order) that holds it: that device reports it.
fn first_holders(p: &Program) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (d, dp) in p.devices.iter().enumerate() {
        // Its stage and interleaved chunks.
        for s in dp.stages() {
            for x in &p.stages[s].params {
                m.entry(x.clone()).or_insert(d);
            }
        }
    }
    m
}

/// The parameters device `d` reports to rank 0 (those it holds first), sorted: both sides of
/// the result exchange use this order.
fn reported(p: &Program, holders: &BTreeMap<String, usize>, d: usize) -> Vec<String> {
    let mut names: Vec<String> = p.devices[d]
        .stages()
        .into_iter()
        .flat_map(|s| p.stages[s].params.iter())
        .filter(|x| holders.get(*x) == Some(&d))
        .cloned()
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The part of [`RESULT_TAG`] that carries a rank's trace events to rank 0.
const TRACE_PART: u32 = u32::MAX;

/// A rank's trace events as one `[events, 5]` float64 tensor: step, instruction index, start
/// and duration (µs since the rank's start, which the ranks take right after a barrier) and
/// thread CPU time (NaN where unknown). Rank 0 names them from its copy of the program.
fn encode_events(evs: &[Event]) -> Tensor {
    let v: Vec<f64> = evs
        .iter()
        .flat_map(|e| {
            [
                e.step as f64,
                e.index as f64,
                e.start_us,
                e.dur_us,
                e.cpu_us.unwrap_or(f64::NAN),
            ]
        })
        .collect();
    Tensor::F64(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[evs.len(), 5]), v).unwrap_or_default(),
    )
}

/// Inverse of [`encode_events`] for device `src`'s events.
fn decode_events(
    p: &Program,
    src: usize,
    t: &Tensor,
) -> std::result::Result<Vec<Event>, CommError> {
    let Tensor::F64(a) = t else {
        return Err(other(format!(
            "device {src} sent trace events of another dtype"
        )));
    };
    let list = &p.devices[src].instructions;
    let flat: Vec<f64> = a.iter().copied().collect();
    if a.ndim() != 2 || a.shape()[1] != 5 {
        return Err(other(format!("device {src} sent malformed trace events")));
    }
    flat.chunks_exact(5)
        .map(|e| {
            let index = e[1] as usize;
            let ins = list.get(index).ok_or_else(|| {
                other(format!(
                    "device {src} traced instruction {index}, which it has not"
                ))
            })?;
            Ok(Event {
                device: src,
                step: e[0] as usize,
                index,
                name: ins.describe(),
                start_us: e[2],
                dur_us: e[3],
                cpu_us: (!e[4].is_nan()).then_some(e[4]),
            })
        })
        .collect()
}

/// Run this rank's device (rank = device index) on the current thread, then bring every
/// rank's losses, timings and parameters to rank 0. The world size must equal the program's
/// device count (checked by the caller with a clear message; checked again here).
pub fn run_rank(s: &Session, lp: &LoadedProgram, opts: &RunOptions) -> Result<RankResult> {
    let n = lp.program.devices.len();
    if s.size() != n {
        return Err(DistError::Input(format!(
            "the program has {n} devices but MPI started {} ranks (run it with mpirun -np {n})",
            s.size()
        )));
    }
    let rank = s.rank();
    let executor = crate::exec::executor_by_name(&opts.executor)
        .ok_or_else(|| DistError::Input(format!("unknown executor '{}'", opts.executor)))?;
    let data = super::run_data(&lp.program, opts)?;
    // Collective setup, same order on every rank, before the worker starts.
    let mut ep = MpiEndpoint::new(s);
    let coll = MpiCollectives::new(s, &lp.program);
    let nccl = nccl_collectives(s, &coll, lp, opts)?;
    s.barrier();
    let t0 = Instant::now();
    let ctx = DeviceCtx {
        lp,
        device: rank,
        data: &data,
        steps: opts.steps,
        timeout: opts.timeout,
        executor: executor.as_ref(),
        collectives: &coll,
        value_collectives: nccl.as_deref(),
        t0,
        trace: opts.trace,
        steps_done: None,
    };
    test_hook(rank)?;
    let out: DeviceOutcome =
        worker::run_device_catching(&ctx, &mut ep).inspect_err(|_| ep.abort())?;
    let wall_s = t0.elapsed().as_secs_f64();
    let holders = first_holders(&lp.program);
    let gather_err = |e: CommError| DistError::Device {
        device: rank,
        at: "collecting results on rank 0".into(),
        msg: e.to_string(),
    };
    let summary = |o: &DeviceOutcome| -> Tensor {
        let t = &o.timing;
        let mut v = o.losses.clone();
        v.extend([
            t.prepare_s,
            t.compute_s,
            t.comm_s,
            t.other_s,
            t.total_s,
            t.steady_step_s,
            t.cpu_s,
        ]);
        let k = v.len();
        Tensor::F64(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[k]), v).unwrap_or_default())
    };
    let result = if rank != 0 {
        let tag = |part| Tag {
            id: RESULT_TAG,
            part,
        };
        ep.send(0, tag(0), summary(&out)).map_err(gather_err)?;
        for (k, name) in reported(&lp.program, &holders, rank).iter().enumerate() {
            let t = out.params.get(name).ok_or_else(|| {
                gather_err(other(format!("parameter '{name}' is not on this device")))
            })?;
            ep.send(0, tag(k as u32 + 1), t.clone())
                .map_err(gather_err)?;
        }
        if opts.trace {
            ep.send(0, tag(TRACE_PART), encode_events(&out.events))
                .map_err(gather_err)?;
        }
        None
    } else {
        let mut losses = out.losses.clone();
        let mut timings = vec![out.timing.clone()];
        let mut events = out.events.clone();
        let mut params: BTreeMap<String, Tensor> = out
            .params
            .iter()
            .filter(|(k, _)| holders.get(*k) == Some(&0))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for src in 1..n {
            let tag = |part| Tag {
                id: RESULT_TAG,
                part,
            };
            let sm = ep.recv(src, tag(0), opts.timeout).map_err(gather_err)?;
            let v: Vec<f64> = match sm {
                Tensor::F64(a) => a.iter().copied().collect(),
                _ => return Err(gather_err(other("bad result summary"))),
            };
            if v.len() != opts.steps + 7 {
                return Err(gather_err(other(format!(
                    "device {src} sent a summary of {} numbers",
                    v.len()
                ))));
            }
            for (l, x) in losses.iter_mut().zip(&v) {
                *l += x;
            }
            let t = &v[opts.steps..];
            timings.push(DeviceTiming {
                device: src,
                prepare_s: t[0],
                compute_s: t[1],
                comm_s: t[2],
                other_s: t[3],
                total_s: t[4],
                steady_step_s: t[5],
                cpu_s: t[6],
            });
            for (k, name) in reported(&lp.program, &holders, src).into_iter().enumerate() {
                let t = ep
                    .recv(src, tag(k as u32 + 1), opts.timeout)
                    .map_err(gather_err)?;
                params.insert(name, t);
            }
            if opts.trace {
                let t = ep
                    .recv(src, tag(TRACE_PART), opts.timeout)
                    .map_err(gather_err)?;
                events.extend(decode_events(&lp.program, src, &t).map_err(gather_err)?);
            }
        }
        Some(RunResult {
            losses,
            params,
            timings,
            trace: opts
                .trace
                .then_some(super::trace::Trace { devices: n, events }),
            wall_s,
            data,
        })
    };
    ep.finish(opts.timeout).map_err(gather_err)?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    #[test]
    fn messages_round_trip_every_dtype() {
        let ts = [
            Tensor::F32(
                ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.5f32, -2., 0., 3., 4., 5.]).unwrap(),
            ),
            Tensor::F64(ArrayD::from_elem(IxDyn(&[]), 2.25)),
            Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[3]), vec![-1i64, 0, 1 << 40]).unwrap()),
            Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[0, 4]), vec![]).unwrap()),
            Tensor::U8(ArrayD::from_shape_vec(IxDyn(&[2]), vec![7u8, 255]).unwrap()),
            Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![true, false]).unwrap()),
        ];
        for (k, t) in ts.iter().enumerate() {
            let tag = Tag {
                id: u32::MAX - k as u32,
                part: k as u32,
            };
            let (tag2, t2) = decode(&encode(tag, t).unwrap()).unwrap();
            assert_eq!((tag2, &t2), (tag, t));
        }
        // A transposed (non-standard layout) tensor is sent in logical row-major order.
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), (0..6).map(|x| x as f32).collect()).unwrap();
        let t = Tensor::F32(a.clone().reversed_axes());
        let (_, t2) = decode(&encode(Tag::p2p(1), &t).unwrap()).unwrap();
        assert_eq!(
            t2,
            Tensor::F32(a.reversed_axes().as_standard_layout().into_owned())
        );
    }

    #[test]
    fn malformed_messages_are_errors() {
        assert!(decode(&[1, 2, 3]).is_err());
        let mut b = encode(Tag::p2p(1), &Tensor::F32(ArrayD::zeros(IxDyn(&[4])))).unwrap();
        b.pop();
        assert!(decode(&b).is_err());
        b[8] = 99;
        assert!(decode(&b).is_err());
    }
}
