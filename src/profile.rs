//! The profiling engine behind `pipec profile MODEL [--batch b] [--repeat N] [--warmup N] -o
//! prof.json` (issue 4): time every op of the model, forward and backward, on the CPU executor,
//! and return a measured profile that `pipec plan --profile` and `pipec compare --profile` use in
//! place of the analytic costs.
//!
//! # Method
//! 1. MODEL is imported (shapes inferred, verified) and costed by the analytic model; the
//!    profile has one node per node of that cost graph (one per op of the program order, named
//!    by the ONNX node name made unique), in its order.
//! 2. A copy is specialised to batch `b` (the leading dim of the first graph input) and
//!    differentiated (`autodiff`, mean-square loss on the first output). Every op of the
//!    training graph is attributed: forward ops to their own node, backward ops to the forward
//!    op whose gradient rule made them (plus the accumulation of its results' gradients; a
//!    parameter's gradient accumulation goes to the parameter's first reader), loss ops and the
//!    backward seed to no node (`pipec_passes::cost::measured`).
//! 3. Inputs are random and fixed by `--seed`: floats uniform in [-1, 1); an integer input that
//!    reaches a `Gather`'s indices (through views such as `Reshape`) is uniform in
//!    `[0, rows of the gathered table)`, any other integer input is all ones (attention masks).
//! 4. The reference interpreter runs the training graph `--warmup` times untimed, then
//!    `--repeat` times with a timer around every op (`Prepared::run_profiled`; kernel time, not
//!    freeing of dead values) and one around the whole run. Each op's time is its median over the
//!    repeats, scaled by `run_s / kernel_s` (the median whole run over the sum of the op medians,
//!    when above 1) so that the ops carry the executor's own work between them (dispatch,
//!    freeing dead values) as a layer profiler's per-layer times do; a node's `fwd_s` is its op's
//!    time, `bwd_s` the sum of the times of the backward ops attributed to it.
//!    The reference interpreter is single-threaded, so a profile is one core's times: the `cpu`
//!    preset's devices.
//! 5. Then one thread per host core runs the training graph at once, `--repeat` times each:
//!    `concurrent_run_s` (their median run) over `run_s` is how much slower a device computes
//!    when every core is busy; `pipec plan/compile/compare --profile` give it to the simulator as
//!    `Cluster::host_slowdown` when the `cpu` preset is oversubscribed.
//! 6. Two threads on different cores ping-pong a small tensor through `pipec run`'s in-process
//!    transport: `message_latency_s` is the median one-way time (a blocked receiver's wake-up,
//!    ~0.1 ms on a VM, far above the shared-memory link's nominal 1 µs); `--profile` on the `cpu`
//!    preset makes it the link latency α of every transfer.
//!
//! Output (`-o`): `{"model", "batch", "executor", "repeat", "warmup", "nodes": [{"name",
//! "op_type", "fwd_s", "bwd_s", "output_bytes", "parameter_bytes"}], "total_fwd_s",
//! "total_bwd_s", "loss_s", "unattributed_s", "run_s", "kernel_s", "host_threads",
//! "concurrent_run_s", "message_latency_s", "loss_node"}`; everything but the measured seconds is
//! deterministic.
//!
//! `--compare-analytic` prints the analytic (roofline on `--device-kind`, default `cpu-core`)
//! against measured error table; `--from prof.json` takes the measurements from an earlier
//! profile instead of running. `--calibrate` measures this machine's effective FLOP/s and
//! memory bandwidth on the reference executor (the figures of the `cpu-core` device kind).

use anyhow::{anyhow, bail, Context, Result};
use pipec_compiler::ir::{Attr, DType, Dim, Graph, Module, OpData, TensorData, TensorType, Value};
use pipec_passes::autodiff::{differentiate, Autodiff};
use pipec_passes::cost::analytic::{self, AnalyticOptions};
use pipec_passes::cost::measured::{attribute, median, node_times, MeasuredNode, MeasuredProfile};
use pipec_passes::cost::CostGraph;
use pipec_runtime::Tensor;
use std::path::Path;
use std::time::Instant;

/// What to measure (the CLI's `pipec profile` flags).
#[derive(Clone, Debug)]
pub struct ProfileOptions {
    /// Samples per run (the leading dim of the first graph input; default: its static size,
    /// else 1).
    pub batch: Option<u64>,
    /// Timed runs; each op's time is the median over them.
    pub repeat: u32,
    /// Untimed runs before the timed ones.
    pub warmup: u32,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Executor backend (only `reference` can time single ops).
    pub executor: String,
}

impl Default for ProfileOptions {
    fn default() -> ProfileOptions {
        ProfileOptions {
            batch: None,
            repeat: 5,
            warmup: 1,
            seed: 1,
            executor: "reference".into(),
        }
    }
}

/// Progress of [`measure`]: `done` of `total` runs (warm-up included) at `batch` samples.
#[derive(Clone, Copy, Debug)]
pub struct RunProgress {
    pub done: u32,
    pub total: u32,
    pub batch: u64,
}

/// The model at `path` as `pipec profile` profiles it: imported, lowered, and its analytic
/// cost graph (one node per op, the profile's nodes).
pub fn load(path: &Path) -> Result<(Module, CostGraph)> {
    let mut m = crate::frontend::load_module(path)?;
    pipec_passes::lower::lower(&mut m)
        .with_context(|| format!("{}: lowering (pass 'lower') failed", path.display()))?;
    let g = analytic::from_module(&m, &AnalyticOptions::default(), &path.display().to_string())?;
    Ok((m, g))
}

/// The batch to profile at and the symbol it binds (`None` for a static leading dim).
fn resolve_batch(m: &Module, batch: Option<u64>) -> Result<(u64, Option<String>)> {
    let g = &m.graph;
    let first = g
        .inputs
        .iter()
        .copied()
        .find(|v| !g.initializers.contains_key(v));
    let lead = first.and_then(|v| g.ty(v).shape.as_ref().and_then(|s| s.first().cloned()));
    match lead {
        Some(Dim::Known(k)) => {
            let k = k.max(1) as u64;
            match batch {
                Some(b) if b != k => bail!(
                    "--batch {b}: the model's batch dim is fixed at {k} (input '{}')",
                    first.map(|v| g.name(v)).unwrap_or("")
                ),
                _ => Ok((k, None)),
            }
        }
        Some(Dim::Sym(s)) if s.coeff == 1 && s.syms.len() == 1 => match batch {
            Some(0) => bail!("--batch 0: must be >= 1"),
            b => Ok((b.unwrap_or(1), Some(s.syms[0].clone()))),
        },
        _ => match batch {
            Some(0) => bail!("--batch 0: must be >= 1"),
            b => Ok((b.unwrap_or(1), None)),
        },
    }
}

/// Bind the batch symbol of every graph input; any other symbolic dim is an error.
fn specialise(m: &mut Module, sym: Option<&str>, batch: u64) -> Result<()> {
    let g = &mut m.graph;
    for &v in &g.inputs.clone() {
        if g.initializers.contains_key(&v) {
            continue;
        }
        let name = g.name(v).to_string();
        let Some(shape) = g.values[v].ty.shape.clone() else {
            bail!("input '{name}': unranked; pipec profile needs the input shapes");
        };
        let mut dims = Vec::with_capacity(shape.len());
        for d in shape {
            dims.push(match d {
                Dim::Known(k) => Dim::Known(k),
                Dim::Sym(s) if s.syms.iter().all(|x| Some(x.as_str()) == sym) => {
                    Dim::Known(s.coeff * (batch as i64).pow(s.syms.len() as u32))
                }
                Dim::Sym(s) => bail!(
                    "input '{name}': symbolic dim '{}' (only the batch dim{} may be symbolic)",
                    s.syms.join("*"),
                    sym.map(|s| format!(" '{s}'")).unwrap_or_default()
                ),
            });
        }
        g.values[v].ty.shape = Some(dims);
    }
    pipec_compiler::shape::infer_shapes(m).context("shape inference at the profiled batch")?;
    Ok(())
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// Rows of the table a `Gather` indexes with `v` (following views), if any.
fn gather_bound(g: &Graph, v: Value) -> Option<i64> {
    let mut frontier = vec![v];
    let mut seen = std::collections::HashSet::new();
    let mut bound: Option<i64> = None;
    while let Some(x) = frontier.pop() {
        if !seen.insert(x) {
            continue;
        }
        for &op in &g.order {
            let d: &OpData = &g.ops[op];
            for (i, inp) in d.inputs.iter().enumerate() {
                if *inp != Some(x) {
                    continue;
                }
                match (d.op_type.as_str(), i) {
                    ("Gather", 1) => {
                        let axis = d.int_attr("axis").unwrap_or(0);
                        let rows = d.input(0).and_then(|t| {
                            let s = g.ty(t).shape.as_ref()?;
                            let a = if axis < 0 {
                                axis + s.len() as i64
                            } else {
                                axis
                            };
                            s.get(usize::try_from(a).ok()?)?.known()
                        });
                        if let Some(r) = rows {
                            bound = Some(bound.map_or(r, |b| b.min(r)));
                        }
                    }
                    ("Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity", 0) => {
                        frontier.extend(d.outputs.iter().copied());
                    }
                    _ => {}
                }
            }
        }
    }
    bound.filter(|&b| b > 0)
}

fn random_input(g: &Graph, v: Value, rng: &mut Rng) -> Result<Tensor> {
    let name = g.name(v);
    let ty: &TensorType = g.ty(v);
    let dims: Vec<i64> = ty
        .shape
        .as_ref()
        .map(|s| s.iter().map(|d| d.known().unwrap_or(1).max(0)).collect())
        .unwrap_or_default();
    let n: usize = dims.iter().map(|&d| d as usize).product();
    let data = match ty.dtype {
        DType::F32 | DType::F64 => {
            let vals: Vec<f32> = (0..n).map(|_| rng.unit() as f32).collect();
            TensorData::from_f32(dims, &vals)
        }
        DType::I64 | DType::I32 | DType::Bool | DType::U8 => {
            let vals: Vec<i64> = match gather_bound(g, v).filter(|_| ty.dtype != DType::Bool) {
                Some(b) => (0..n).map(|_| (rng.next() % b as u64) as i64).collect(),
                None => vec![1; n],
            };
            TensorData::from_i64(dims, &vals)
        }
        other => bail!("input '{name}': dtype {other} is not supported by pipec profile"),
    };
    let t = Tensor::from_tensor_data(&data).map_err(|e| anyhow!("input '{name}': {e}"))?;
    Ok(if t.dtype() == ty.dtype {
        t
    } else {
        t.cast(ty.dtype)
            .map_err(|e| anyhow!("input '{name}': {e}"))?
    })
}

/// Profile the module `m` (its cost graph `g`, `name` for messages) as the module doc says;
/// `on_run` hears of every run of the training graph, warm-up runs included, and once more
/// when all are done.
pub fn measure(
    m: &Module,
    g: &CostGraph,
    name: &str,
    a: &ProfileOptions,
    on_run: &mut dyn FnMut(RunProgress),
) -> Result<MeasuredProfile> {
    let (batch, sym) = resolve_batch(m, a.batch)?;
    let fwd_ops = m.graph.order.clone();
    // The loss is taken of the first output: its producer's stage computes it.
    let loss_node = m
        .graph
        .outputs
        .first()
        .and_then(|&v| m.graph.producer(v))
        .and_then(|op| fwd_ops.iter().position(|&o| o == op))
        .and_then(|i| g.nodes.get(i))
        .map(|n| n.name.clone());
    if fwd_ops.len() != g.len() {
        bail!(
            "internal: the cost graph has {} nodes for {} ops",
            g.len(),
            fwd_ops.len()
        );
    }
    let mut t = m.clone();
    specialise(&mut t, sym.as_deref(), batch)?;
    let tg = differentiate(&mut t, &Autodiff::default())
        .with_context(|| format!("{name}: cannot build the training graph"))?;
    pipec_compiler::verify::verify(&t).context("the training graph does not verify")?;
    let roles = attribute(&t, &fwd_ops, &tg.grad_of);
    let mut rng = Rng::new(a.seed);
    let mut inputs = Vec::new();
    for &v in &t.graph.inputs {
        if t.graph.initializers.contains_key(&v) {
            continue;
        }
        inputs.push((
            t.graph.name(v).to_string(),
            random_input(&t.graph, v, &mut rng)?,
        ));
    }
    let exec = pipec_runtime::executor_by_name(&a.executor)
        .ok_or_else(|| anyhow!("executor '{}': unknown", a.executor))?;
    let mut prog = exec.prepare(&t)?;
    let n_ops = t.graph.order.len();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(a.repeat as usize); n_ops];
    let mut walls: Vec<f64> = Vec::with_capacity(a.repeat as usize);
    let total = a.warmup + a.repeat;
    for i in 0..total {
        let warm = i < a.warmup;
        on_run(RunProgress {
            done: i,
            total,
            batch,
        });
        let t0 = Instant::now();
        let (_, times) = prog
            .run_profiled(&inputs)
            .with_context(|| format!("{name}: the training graph failed to run"))?;
        if !warm {
            walls.push(t0.elapsed().as_secs_f64());
            for (s, t) in samples.iter_mut().zip(times) {
                s.push(t);
            }
        }
    }
    on_run(RunProgress {
        done: total,
        total,
        batch,
    });
    let (host_threads, concurrent_run_s) = concurrent_runs(exec.as_ref(), &t, &inputs, a.repeat)
        .with_context(|| format!("{name}: the concurrent runs failed"))?;
    let message_latency_s = message_latency().context("the transport's ping-pong failed")?;
    let mut med: Vec<f64> = samples.iter().map(|s| median(s)).collect();
    let kernel_s: f64 = med.iter().sum();
    let run_s = median(&walls);
    if kernel_s > 0.0 && run_s > kernel_s {
        let f = run_s / kernel_s;
        med.iter_mut().for_each(|t| *t *= f);
    }
    let (per, loss_s, unattributed_s) = node_times(&roles, &med, g.len());
    let b = batch as f64;
    let nodes: Vec<MeasuredNode> = g
        .nodes
        .iter()
        .enumerate()
        .zip(&per)
        .map(|((i, n), &(f, bw))| MeasuredNode {
            name: n.name.clone(),
            op_type: n.op.clone(),
            fwd_s: f,
            bwd_s: bw,
            output_bytes: g.activation_bytes(i, b),
            parameter_bytes: n.parameter_bytes,
        })
        .collect();
    Ok(MeasuredProfile {
        model: name.to_string(),
        batch,
        executor: exec.name().to_string(),
        repeat: a.repeat,
        warmup: a.warmup,
        total_fwd_s: per.iter().map(|p| p.0).sum(),
        total_bwd_s: per.iter().map(|p| p.1).sum(),
        nodes,
        loss_s,
        unattributed_s,
        run_s,
        kernel_s,
        host_threads,
        concurrent_run_s,
        message_latency_s,
        loss_node,
    })
}

/// One-way latency of a small message between two worker threads on different cores through the
/// in-process transport (what every `pipec run` send/receive pays on top of the bytes): the
/// median over 20 batches of 25 round trips, after 25 warm-up round trips. 0 on a one-core host.
fn message_latency() -> Result<f64> {
    use pipec_runtime::dist::pinning::{allowed_cpus, pin_to};
    use pipec_runtime::dist::transport::{Endpoint, Tag};
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        return Ok(0.0);
    }
    let (batches, per, warm) = (20usize, 25usize, 25usize);
    let rounds = warm + batches * per;
    let small = pipec_runtime::Tensor::zeros(pipec_compiler::ir::DType::F32, &[16])?;
    let timeout = std::time::Duration::from_secs(10);
    let mut eps = pipec_runtime::dist::inproc::endpoints(2);
    let mut b = eps.pop().context("endpoint")?;
    let mut a = eps.pop().context("endpoint")?;
    let (ca, cb) = (cpus[0], cpus[1]);
    std::thread::scope(|sc| -> Result<f64> {
        let echo = sc.spawn(move || -> Result<()> {
            pin_to(cb);
            for _ in 0..rounds {
                let t = b.recv(0, Tag::p2p(1), timeout)?;
                b.send(0, Tag::p2p(2), t)?;
            }
            Ok(())
        });
        let ping = sc.spawn(move || -> Result<Vec<f64>> {
            pin_to(ca);
            let mut marks = Vec::with_capacity(batches + 1);
            for i in 0..rounds {
                if i >= warm && (i - warm) % per == 0 {
                    marks.push(Instant::now());
                }
                a.send(1, Tag::p2p(1), small.clone())?;
                a.recv(1, Tag::p2p(2), timeout)?;
            }
            marks.push(Instant::now());
            Ok(marks
                .windows(2)
                .map(|w| (w[1] - w[0]).as_secs_f64() / (2 * per) as f64)
                .collect())
        });
        let times = ping
            .join()
            .map_err(|_| anyhow!("the ping thread panicked"))??;
        echo.join()
            .map_err(|_| anyhow!("the echo thread panicked"))??;
        Ok(median(&times))
    })
}

/// The training graph run by one thread per host core at once, `repeat` times each after one
/// warm-up: `(threads, median wall seconds of one run)`, `(0, 0)` on a one-core host. This is
/// how `pipec run`'s workers load the machine when devices outnumber cores; the ratio to the
/// single-threaded run is the simulator's `Cluster::host_slowdown`.
fn concurrent_runs(
    exec: &dyn pipec_runtime::Executor,
    t: &Module,
    inputs: &[(String, pipec_runtime::Tensor)],
    repeat: u32,
) -> Result<(u32, f64)> {
    // One thread per core, each pinned to its own (as `pipec run` pins its workers): left to
    // the OS, two fresh threads sometimes share a core for a whole short measurement, which
    // read as a 1.2–1.4× slowdown on a 2-core VM that runs two such processes side by side
    // without any. The cores are the affinity mask's (what `pipec run` pins to), at most
    // `available_parallelism` of them (which also counts a cgroup CPU quota).
    let cpus = pipec_runtime::dist::pinning::allowed_cpus();
    let mut n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !cpus.is_empty() {
        n = n.min(cpus.len());
    }
    if n < 2 {
        return Ok((0, 0.0));
    }
    let barrier = std::sync::Barrier::new(n);
    let walls: Vec<Result<Vec<f64>>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let barrier = &barrier;
                let cpu = cpus.get(i).copied();
                sc.spawn(move || -> Result<Vec<f64>> {
                    if let Some(c) = cpu {
                        pipec_runtime::dist::pinning::pin_to(c);
                    }
                    let mut prog = exec.prepare(t)?;
                    prog.run_profiled(inputs)?;
                    barrier.wait();
                    let mut w = Vec::with_capacity(repeat as usize);
                    for _ in 0..repeat.max(1) {
                        let t0 = Instant::now();
                        prog.run_profiled(inputs)?;
                        w.push(t0.elapsed().as_secs_f64());
                    }
                    Ok(w)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a profiling thread panicked")))
            })
            .collect()
    });
    let mut all = Vec::new();
    for w in walls {
        all.extend(w?);
    }
    Ok((n as u32, median(&all)))
}

/// One-op module `out = op(a, b)` over f32 inputs of the given shapes.
fn one_op(op_type: &str, a: &[i64], b: &[i64], out: &[i64]) -> Module {
    let mut g = Graph::default();
    let ty = |d: &[i64]| TensorType::known(DType::F32, d);
    let x = g.add_input("a", ty(a));
    let y = g.add_input("b", ty(b));
    let (_, outs) = g.add_op(
        OpData {
            name: op_type.to_string(),
            op_type: op_type.to_string(),
            inputs: vec![Some(x), Some(y)],
            attrs: [("pipec.phase".to_string(), Attr::String("fwd".into()))].into(),
            ..Default::default()
        },
        vec![("out".into(), ty(out))],
    );
    g.outputs = outs;
    let mut m = Module {
        graph: g,
        ..Default::default()
    };
    m.opset_imports.insert(String::new(), 17);
    m
}

/// Best (minimum) seconds of `repeat` runs of a one-op module on the reference executor.
fn time_one_op(m: &Module, repeat: u32) -> Result<f64> {
    let mut rng = Rng::new(7);
    let inputs: Vec<(String, Tensor)> = m
        .graph
        .inputs
        .iter()
        .map(|&v| {
            Ok((
                m.graph.name(v).to_string(),
                random_input(&m.graph, v, &mut rng)?,
            ))
        })
        .collect::<Result<_>>()?;
    let mut prog = pipec_runtime::default_executor().prepare(m)?;
    let mut best = f64::INFINITY;
    for _ in 0..repeat + 1 {
        let (_, times) = prog.run_profiled(&inputs)?;
        best = best.min(times.iter().sum::<f64>());
    }
    Ok(best)
}

/// Effective f32 FLOP/s of a 1024³ MatMul and memory bandwidth of an Add over
/// 2²⁴-element arrays (3 × 64 MiB moved: two reads, one write), best of `repeat` runs each.
pub fn calibrate(repeat: u32) -> Result<String> {
    let n = 1024i64;
    let mm = one_op("MatMul", &[n, n], &[n, n], &[n, n]);
    let t_mm = time_one_op(&mm, repeat)?;
    let flops = 2.0 * (n * n * n) as f64;
    let e = 1i64 << 24;
    let add = one_op("Add", &[e], &[e], &[e]);
    let t_add = time_one_op(&add, repeat)?;
    let bytes = 3.0 * 4.0 * e as f64;
    Ok(format!(
        "matmul {n}x{n}x{n} f32: {t_mm:.4} s, {:.3e} FLOP/s\nadd 2^24 f32 (3 x 64 MiB): {t_add:.4} s, {:.3e} B/s\n",
        flops / t_mm,
        bytes / t_add
    ))
}
