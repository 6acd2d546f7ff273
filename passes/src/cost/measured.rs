//! Measured per-op profiles (`pipec profile`'s `prof.json`): the file format, attributing the ops
//! of a training graph to the nodes of a [`CostGraph`], replacing the analytic works by the
//! measured seconds (`--profile` of the planners), and the analytic-vs-measured error table.
//!
//! # Method (what `pipec profile` does)
//! 1. The model is imported and costed by [`super::analytic::from_module`]: node `i` of the
//!    [`CostGraph`] is op `i` of `m.graph.order`, named as the cost graph names it (the ONNX
//!    node name, made unique).
//! 2. A copy of the module, its batch dim bound to `b`, is differentiated
//!    ([`crate::transforms::autodiff::differentiate`], mean-square loss): forward ops keep their `Op` ids,
//!    and every backward op is mapped to the forward op it belongs to
//!    ([`crate::transforms::autodiff::TrainingGraph::grad_of`]: the ops of that op's gradient rule, the
//!    accumulation of the gradients of its results, and a parameter's gradient accumulation,
//!    given to the parameter's first reader, which owns the parameter in the cost graph).
//!    [`attribute`] turns that into one [`Role`] per op of the training graph's order. (The
//!    backward ops' `<forward name>/grad/...` names say the same for named forward ops, which
//!    the unit tests check, but the accumulation `Add`/`Sum` ops are made before the prefix
//!    changes and cached constants carry no prefix, so the names alone under-attribute.)
//! 3. The training graph runs on the reference executor with random inputs (`--warmup` runs,
//!    then `--repeat` timed runs, each op timed by `Prepared::run_profiled`); each op's time is
//!    the **median** over the repeats. A node's forward time is its own op's median; its
//!    backward time is the sum of the medians of the backward ops attributed to it. Loss ops and
//!    unattributed backward ops (the `dL/dL = 1` seed) are reported as totals only.
//!
//! # Using a profile
//! [`apply`] replaces every node's [`Work`] by `Work::Measured`, converted from the profile's
//! batch to the cost graph's reference batch linearly (`t_ref = t_b · ref / b`; the cost graph
//! then scales it linearly to any batch, as for PipeDream profiles). The profile's node names must
//! be the cost graph's, in the same order. The loss's seconds (and the unattributed seed's) go to
//! the node that produces the first graph output (`loss_node`), whose stage computes the loss.

use super::{CostGraph, DeviceKind, NodeId, Work};
use pipec_compiler::ir::{Attr, Module, Op};
use pipec_compiler::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// One node of a measured profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeasuredNode {
    /// The cost graph's node name.
    pub name: String,
    pub op_type: String,
    /// Median seconds of the node's forward op at the profile's batch.
    pub fwd_s: f64,
    /// Sum of the median seconds of the backward ops attributed to the node.
    pub bwd_s: f64,
    /// Bytes of the node's outputs at the profile's batch.
    pub output_bytes: f64,
    /// Bytes of the parameters the node owns.
    pub parameter_bytes: f64,
}

/// A measured profile (`prof.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeasuredProfile {
    /// The model file as given on the command line.
    pub model: String,
    /// Samples per run.
    pub batch: u64,
    /// The executor backend that ran it (`reference`).
    pub executor: String,
    /// Timed runs (each op's time is the median over them).
    pub repeat: u32,
    /// Untimed runs before them.
    #[serde(default)]
    pub warmup: u32,
    pub nodes: Vec<MeasuredNode>,
    pub total_fwd_s: f64,
    pub total_bwd_s: f64,
    /// Median seconds of the loss ops (not part of any node).
    #[serde(default)]
    pub loss_s: f64,
    /// Median seconds of backward ops attributed to no node.
    #[serde(default)]
    pub unattributed_s: f64,
    /// Median wall seconds of one whole timed run of the training graph (every op, plus the
    /// executor's work between them: dispatch, freeing dead values). 0 in older profiles.
    #[serde(default)]
    pub run_s: f64,
    /// Sum of the ops' median kernel seconds. The op times above are the kernel medians scaled
    /// by `run_s / kernel_s` (when above 1), so that they add up to a real run. 0 in older
    /// profiles (unscaled).
    #[serde(default)]
    pub kernel_s: f64,
    /// Host threads that ran the training graph at once for [`MeasuredProfile::concurrent_run_s`]
    /// (0: not measured).
    #[serde(default)]
    pub host_threads: u32,
    /// Median wall seconds of one whole run while `host_threads` copies run at the same time
    /// (one per core, as `pipec run`'s workers on an oversubscribed `cpu` cluster). 0 in older
    /// profiles.
    #[serde(default)]
    pub concurrent_run_s: f64,
    /// Median one-way seconds of a small message between two worker threads on different cores
    /// through the in-process transport (a blocked receiver's wake-up). 0: not measured.
    #[serde(default)]
    pub message_latency_s: f64,
    /// The node whose output the loss is taken of (the first graph output's producer): [`apply`]
    /// gives it the loss and unattributed seconds, which its stage runs. `None` in older
    /// profiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_node: Option<String>,
}

impl MeasuredProfile {
    /// How much slower a run is with every host core busy than alone (≥ 1; 1 if not measured).
    pub fn host_slowdown(&self) -> f64 {
        if self.host_threads >= 2 && self.run_s > 0.0 && self.concurrent_run_s > 0.0 {
            (self.concurrent_run_s / self.run_s).max(1.0)
        } else {
            1.0
        }
    }
}

impl MeasuredProfile {
    /// Parse a `prof.json`; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<MeasuredProfile> {
        let p: MeasuredProfile = serde_json::from_str(text)
            .map_err(|e| Error::Usage(format!("{file}: not a pipec profile: {e}")))?;
        if p.batch == 0 {
            return Err(Error::Usage(format!("{file}: batch must be >= 1")));
        }
        for n in &p.nodes {
            for (what, v) in [("fwd_s", n.fwd_s), ("bwd_s", n.bwd_s)] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(Error::Usage(format!(
                        "{file}: node '{}': {what} must be a finite number >= 0, got {v}",
                        n.name
                    )));
                }
            }
        }
        Ok(p)
    }
}

/// What an op of the training graph is, for attribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The forward op of cost-graph node `n`.
    Fwd(NodeId),
    /// A backward op attributed to node `n`.
    Bwd(NodeId),
    /// An op of the loss (`pipec.phase = loss`) or of the loss's backward.
    Loss,
    /// Anything else (the backward seed).
    Other,
}

/// One [`Role`] per op of `train.graph.order`. `fwd_ops[i]` is the op of cost-graph node `i`
/// (the forward module's order, whose `Op` ids the training graph keeps); `grad_of` maps backward
/// ops to forward ops ([`crate::transforms::autodiff::TrainingGraph::grad_of`]).
pub fn attribute(train: &Module, fwd_ops: &[Op], grad_of: &HashMap<Op, Op>) -> Vec<Role> {
    let node_of: HashMap<Op, NodeId> = fwd_ops.iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let g = &train.graph;
    g.order
        .iter()
        .map(|op| {
            if let Some(&n) = node_of.get(op) {
                return Role::Fwd(n);
            }
            let is_loss = |o: &Op| matches!(g.ops[*o].attrs.get("pipec.phase"), Some(Attr::String(s)) if s == "loss");
            match grad_of.get(op) {
                Some(f) if node_of.contains_key(f) => Role::Bwd(node_of[f]),
                // The backward of the loss ops.
                Some(f) if is_loss(f) => Role::Loss,
                _ if is_loss(op) => Role::Loss,
                _ => Role::Other,
            }
        })
        .collect()
}

/// Per-node forward and backward seconds from per-op seconds (`times[k]` for op `k` of the
/// order, `roles` from [`attribute`]); also returns the loss and unattributed seconds.
pub fn node_times(roles: &[Role], times: &[f64], nodes: usize) -> (Vec<(f64, f64)>, f64, f64) {
    let mut per = vec![(0.0, 0.0); nodes];
    let (mut loss, mut other) = (0.0, 0.0);
    for (r, &t) in roles.iter().zip(times) {
        match *r {
            Role::Fwd(n) if n < nodes => per[n].0 += t,
            Role::Bwd(n) if n < nodes => per[n].1 += t,
            Role::Loss => loss += t,
            _ => other += t,
        }
    }
    (per, loss, other)
}

/// The median of a non-empty list (mean of the two middle values for an even count).
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Check that the profile describes `g` (same node names in the same order) and replace every
/// node's work by the measured seconds, converted to `g`'s reference batch. `file` names the
/// profile in errors, which name the first mismatching node.
pub fn apply(g: &mut CostGraph, p: &MeasuredProfile, file: &str) -> Result<()> {
    for (i, n) in g.nodes.iter().enumerate() {
        match p.nodes.get(i) {
            Some(pn) if pn.name == n.name => {}
            Some(pn) => {
                return Err(Error::Usage(format!(
                    "{file}: node {i} is '{}' but the model's node {i} is '{}' (the profile was taken of another model?)",
                    pn.name, n.name
                )))
            }
            None => {
                return Err(Error::Usage(format!(
                    "{file}: the profile has {} nodes; the model's node '{}' (node {i}) is missing",
                    p.nodes.len(),
                    n.name
                )))
            }
        }
    }
    if let Some(extra) = p.nodes.get(g.nodes.len()) {
        return Err(Error::Usage(format!(
            "{file}: node '{}' (node {}) is not in the model ({} nodes)",
            extra.name,
            g.nodes.len(),
            g.nodes.len()
        )));
    }
    let s = g.reference_batch / p.batch as f64;
    for (n, pn) in g.nodes.iter_mut().zip(&p.nodes) {
        let (mut f, mut b) = (pn.fwd_s, pn.bwd_s);
        if p.loss_node.as_deref() == Some(pn.name.as_str()) {
            // The loss and the gradient seed run where the output is produced.
            f += p.loss_s;
            b += p.unattributed_s;
        }
        n.work = Work::Measured {
            fwd_s: f * s,
            bwd_s: b * s,
        };
    }
    Ok(())
}

/// One node's analytic and measured times (seconds, at the profile's batch).
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorRow {
    pub name: String,
    pub op_type: String,
    pub analytic_fwd_s: f64,
    pub measured_fwd_s: f64,
    pub analytic_bwd_s: f64,
    pub measured_bwd_s: f64,
}

impl ErrorRow {
    /// analytic / measured forward, if both are > 0.
    pub fn fwd_ratio(&self) -> Option<f64> {
        ratio(self.analytic_fwd_s, self.measured_fwd_s)
    }
    /// analytic / measured backward, if both are > 0.
    pub fn bwd_ratio(&self) -> Option<f64> {
        ratio(self.analytic_bwd_s, self.measured_bwd_s)
    }
}

fn ratio(a: f64, m: f64) -> Option<f64> {
    (a > 0.0 && m > 0.0).then(|| a / m)
}

/// Analytic (roofline on `kind`) against measured times for every node of `g` (the analytic cost
/// graph of the profiled model), at the profile's batch.
pub fn error_rows(g: &CostGraph, p: &MeasuredProfile, kind: &DeviceKind) -> Vec<ErrorRow> {
    let b = p.batch as f64;
    g.nodes
        .iter()
        .enumerate()
        .zip(&p.nodes)
        .map(|((i, n), pn)| {
            let (af, ab) = g.times(i, b, kind);
            ErrorRow {
                name: n.name.clone(),
                op_type: n.op.clone(),
                analytic_fwd_s: af,
                measured_fwd_s: pn.fwd_s,
                analytic_bwd_s: ab,
                measured_bwd_s: pn.bwd_s,
            }
        })
        .collect()
}

/// Summary of a set of ratios analytic/measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RatioStats {
    pub count: usize,
    /// Median of the ratio (the bias: < 1 the model is optimistic).
    pub median_ratio: f64,
    /// Percentiles of |ln ratio| (0 is exact; ln 2 = 0.69 is a factor of 2).
    pub p10_abs_log: f64,
    pub median_abs_log: f64,
    pub p90_abs_log: f64,
    /// Share of the measured time covered by these ops.
    pub measured_s: f64,
    pub analytic_s: f64,
}

/// Nearest-rank percentile `q` in [0, 1] of a sorted list.
fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let k = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[k - 1]
}

/// Statistics of `(analytic, measured)` pairs (pairs with a zero side are left out).
pub fn ratio_stats(pairs: &[(f64, f64)]) -> RatioStats {
    let ratios: Vec<f64> = pairs.iter().filter_map(|&(a, m)| ratio(a, m)).collect();
    let mut logs: Vec<f64> = ratios.iter().map(|r| r.ln().abs()).collect();
    logs.sort_by(f64::total_cmp);
    let (a, m) = pairs
        .iter()
        .filter(|(a, m)| *a > 0.0 && *m > 0.0)
        .fold((0.0, 0.0), |(sa, sm), (a, m)| (sa + a, sm + m));
    RatioStats {
        count: ratios.len(),
        median_ratio: median(&ratios),
        p10_abs_log: pct(&logs, 0.1),
        median_abs_log: median(&logs),
        p90_abs_log: pct(&logs, 0.9),
        measured_s: m,
        analytic_s: a,
    }
}

/// The error table printed by `pipec profile --compare-analytic`: overall forward and backward
/// statistics, per op type, and the worst ops by |ln ratio|.
pub fn error_report(rows: &[ErrorRow], worst: usize) -> String {
    let fwd: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.analytic_fwd_s, r.measured_fwd_s))
        .collect();
    let bwd: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.analytic_bwd_s, r.measured_bwd_s))
        .collect();
    let mut s = String::new();
    let head = format!(
        "{:<22} {:>5} {:>9} {:>8} {:>8} {:>8} {:>11} {:>11}\n",
        "", "ops", "med a/m", "p10|ln|", "med|ln|", "p90|ln|", "measured s", "analytic s"
    );
    let line = |label: &str, st: &RatioStats| {
        format!(
            "{:<22} {:>5} {:>9.3} {:>8.2} {:>8.2} {:>8.2} {:>11.4e} {:>11.4e}\n",
            label,
            st.count,
            st.median_ratio,
            st.p10_abs_log,
            st.median_abs_log,
            st.p90_abs_log,
            st.measured_s,
            st.analytic_s
        )
    };
    s.push_str(&head);
    s.push_str(&line("all fwd", &ratio_stats(&fwd)));
    s.push_str(&line("all bwd", &ratio_stats(&bwd)));
    // op type -> ((analytic, measured) forward pairs, backward pairs)
    type Pairs = Vec<(f64, f64)>;
    let mut by_type: BTreeMap<&str, (Pairs, Pairs)> = BTreeMap::new();
    for r in rows {
        let e = by_type.entry(r.op_type.as_str()).or_default();
        e.0.push((r.analytic_fwd_s, r.measured_fwd_s));
        e.1.push((r.analytic_bwd_s, r.measured_bwd_s));
    }
    for (t, (f, b)) in &by_type {
        let (sf, sb) = (ratio_stats(f), ratio_stats(b));
        if sf.count > 0 {
            s.push_str(&line(&format!("{t} fwd"), &sf));
        }
        if sb.count > 0 {
            s.push_str(&line(&format!("{t} bwd"), &sb));
        }
    }
    let mut all: Vec<(f64, &str, &str, &str, f64, f64)> = Vec::new();
    for r in rows {
        if let Some(x) = r.fwd_ratio() {
            all.push((
                x,
                &r.name,
                &r.op_type,
                "fwd",
                r.analytic_fwd_s,
                r.measured_fwd_s,
            ));
        }
        if let Some(x) = r.bwd_ratio() {
            all.push((
                x,
                &r.name,
                &r.op_type,
                "bwd",
                r.analytic_bwd_s,
                r.measured_bwd_s,
            ));
        }
    }
    all.sort_by(|a, b| {
        b.0.ln()
            .abs()
            .total_cmp(&a.0.ln().abs())
            .then_with(|| a.1.cmp(b.1))
    });
    s.push_str(&format!("worst {} (by |ln a/m|):\n", worst.min(all.len())));
    for (x, name, t, phase, a, m) in all.iter().take(worst) {
        s.push_str(&format!(
            "  {phase} {name} ({t}): analytic {a:.3e} s, measured {m:.3e} s, ratio {x:.3}\n"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::analytic::{from_module, AnalyticOptions};
    use crate::transforms::autodiff::{differentiate, Autodiff};
    use pipec_compiler::ir::{DType, Dim, Graph, OpData, TensorData, TensorType};

    /// x[batch,4] -> MatMul(W0) -> Relu -> MatMul(W1) -> Add(b1) -> Tanh -> y, with W0 also
    /// read by a second MatMul summed in (a parameter with two readers).
    fn mlp() -> Module {
        let mut g = Graph::default();
        let x = g.add_input(
            "x",
            TensorType {
                dtype: DType::F32,
                shape: Some(vec![Dim::sym("batch"), Dim::Known(4)]),
            },
        );
        let w = |n: &str, dims: &[i64], g: &mut Graph| {
            let k: i64 = dims.iter().product();
            let vals: Vec<f32> = (0..k).map(|i| 0.1 * (i % 7) as f32 - 0.3).collect();
            g.add_initializer(n, TensorData::from_f32(dims.to_vec(), &vals))
        };
        let w0 = w("w0", &[4, 4], &mut g);
        let w1 = w("w1", &[4, 3], &mut g);
        let b1 = w("b1", &[3], &mut g);
        let op = |g: &mut Graph, name: &str, t: &str, ins: &[Value]| -> Value {
            let (_, outs) = g.add_op(
                OpData {
                    name: name.into(),
                    op_type: t.into(),
                    inputs: ins.iter().map(|v| Some(*v)).collect(),
                    ..Default::default()
                },
                vec![(format!("{name}_out"), TensorType::unranked(DType::F32))],
            );
            outs[0]
        };
        let h = op(&mut g, "mm0", "MatMul", &[x, w0]);
        let h2 = op(&mut g, "mm0b", "MatMul", &[x, w0]);
        let h = op(&mut g, "sum", "Add", &[h, h2]);
        let h = op(&mut g, "relu", "Relu", &[h]);
        let h = op(&mut g, "mm1", "MatMul", &[h, w1]);
        let h = op(&mut g, "bias", "Add", &[h, b1]);
        let y = op(&mut g, "tanh", "Tanh", &[h]);
        g.outputs.push(y);
        let mut m = Module {
            graph: g,
            ..Default::default()
        };
        m.opset_imports.insert(String::new(), 17);
        pipec_compiler::shape::infer_shapes(&mut m).expect("shapes");
        m
    }

    use pipec_compiler::ir::Value;

    #[test]
    fn every_backward_op_is_attributed_and_agrees_with_the_name_prefix() {
        let m = mlp();
        let fwd_ops = m.graph.order.clone();
        let g = from_module(&m, &AnalyticOptions::default(), "t").expect("cost graph");
        assert_eq!(g.len(), fwd_ops.len());
        let mut t = m.clone();
        let tg = differentiate(&mut t, &Autodiff::default()).expect("autodiff");
        let roles = attribute(&t, &fwd_ops, &tg.grad_of);
        assert_eq!(roles.len(), t.graph.order.len());
        let mut bwd_per_node = vec![0usize; fwd_ops.len()];
        let (mut mislabelled, mut unprefixed) = (0, 0);
        for (k, (&op, r)) in t.graph.order.iter().zip(&roles).enumerate() {
            let d = &t.graph.ops[op];
            let phase = d.str_attr("pipec.phase").unwrap_or("");
            match *r {
                Role::Fwd(n) => {
                    assert_eq!(phase, "fwd");
                    assert_eq!(g.nodes[n].name, d.name);
                    assert_eq!(k, n, "forward ops keep their positions");
                }
                Role::Bwd(n) => {
                    assert_eq!(phase, "bwd", "{}", d.name);
                    bwd_per_node[n] += 1;
                    // A prefixed name names the op it is attributed to, except for the
                    // accumulation of a result's gradients, made before the prefix changes
                    // (here `loss/Mul/grad/Add` sums the two gradients of `tanh`'s output).
                    if let Some((fwd, _)) = d.name.rsplit_once("/grad/") {
                        if fwd != g.nodes[n].name {
                            assert!(matches!(d.op_type.as_str(), "Add" | "Sum"), "{}", d.name);
                            mislabelled += 1;
                        }
                    } else {
                        unprefixed += 1;
                    }
                }
                Role::Loss => assert!(phase == "loss" || phase == "bwd", "{}", d.name),
                Role::Other => {
                    assert_eq!(phase, "bwd");
                    assert_eq!(d.op_type, "Constant", "only the seed is unattributed");
                }
            }
        }
        // The name prefix alone would misattribute (the accumulation of tanh's and w0's
        // gradients) or leave out (cached constants, `grad/w0`'s accumulation) some ops.
        assert!(
            mislabelled >= 1 && unprefixed >= 1,
            "{mislabelled} {unprefixed}"
        );
        // Every differentiable forward op on the path to the loss has backward ops, but `sum`
        // (an Add of equal shapes passes its output gradient through: no op).
        for (i, n) in g.nodes.iter().enumerate() {
            let want = n.name != "sum";
            assert_eq!(bwd_per_node[i] > 0, want, "node {}", n.name);
        }
        // The gradient of w0 (two readers) is accumulated and given to its first reader, mm0.
        let gw0 = tg.grads[0].1;
        let acc = t.graph.producer(gw0).expect("an op");
        assert_eq!(tg.grad_of.get(&acc), Some(&fwd_ops[0]));
        // Every op named `<node>/grad/...` is attributed.
        for &op in &t.graph.order {
            if t.graph.ops[op].name.contains("/grad/") {
                assert!(tg.grad_of.contains_key(&op), "{}", t.graph.ops[op].name);
            }
        }
    }

    #[test]
    fn node_times_sum_backward_ops_per_node() {
        let roles = [
            Role::Fwd(0),
            Role::Fwd(1),
            Role::Loss,
            Role::Other,
            Role::Bwd(1),
            Role::Bwd(0),
            Role::Bwd(1),
        ];
        let times = [1.0, 2.0, 0.5, 0.25, 3.0, 4.0, 5.0];
        let (per, loss, other) = node_times(&roles, &times, 2);
        assert_eq!(per, vec![(1.0, 4.0), (2.0, 8.0)]);
        assert_eq!((loss, other), (0.5, 0.25));
    }

    #[test]
    fn median_and_percentiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let st = ratio_stats(&[(1.0, 1.0), (2.0, 1.0), (1.0, 4.0), (0.0, 1.0)]);
        assert_eq!(st.count, 3);
        assert_eq!(st.median_ratio, 1.0);
        assert!((st.p90_abs_log - 4f64.ln()).abs() < 1e-12);
        assert_eq!(st.p10_abs_log, 0.0);
    }

    fn profile_of(g: &CostGraph, batch: u64) -> MeasuredProfile {
        MeasuredProfile {
            model: "t".into(),
            batch,
            executor: "reference".into(),
            repeat: 1,
            warmup: 0,
            nodes: g
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| MeasuredNode {
                    name: n.name.clone(),
                    op_type: n.op.clone(),
                    fwd_s: (i + 1) as f64,
                    bwd_s: 2.0 * (i + 1) as f64,
                    output_bytes: 0.0,
                    parameter_bytes: n.parameter_bytes,
                })
                .collect(),
            total_fwd_s: 0.0,
            total_bwd_s: 0.0,
            loss_s: 0.0,
            unattributed_s: 0.0,
            run_s: 0.0,
            kernel_s: 0.0,
            host_threads: 0,
            concurrent_run_s: 0.0,
            message_latency_s: 0.0,
            loss_node: None,
        }
    }

    #[test]
    fn apply_scales_from_the_profile_batch_and_names_a_mismatch() {
        let m = mlp();
        let mut g = from_module(&m, &AnalyticOptions::default(), "t").expect("cost graph");
        assert_eq!(g.reference_batch, 1.0);
        let p = profile_of(&g, 4);
        let text = serde_json::to_string(&p).expect("json");
        let p = MeasuredProfile::parse(&text, "p.json").expect("parse");
        apply(&mut g, &p, "p.json").expect("apply");
        let kind = crate::cost::cluster::cpu_core(1 << 30);
        // At the profile's batch the times are the measured ones; linear elsewhere.
        assert_eq!(g.times(1, 4.0, &kind), (2.0, 4.0));
        assert_eq!(g.times(1, 8.0, &kind), (4.0, 8.0));

        let mut g2 = from_module(&m, &AnalyticOptions::default(), "t").expect("cost graph");
        let mut bad = p.clone();
        bad.nodes[2].name = "other".into();
        let e = apply(&mut g2, &bad, "p.json").unwrap_err().to_string();
        assert!(e.contains("'other'") && e.contains("'sum'"), "{e}");
        let mut short = p.clone();
        short.nodes.pop();
        let e = apply(&mut g2, &short, "p.json").unwrap_err().to_string();
        assert!(e.contains("'tanh'") && e.contains("missing"), "{e}");
        let e = MeasuredProfile::parse("{}", "p.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.json: not a pipec profile"), "{e}");

        // The loss and seed seconds go to the loss node only (and survive the JSON round trip).
        let mut with_loss = p.clone();
        with_loss.loss_s = 0.5;
        with_loss.unattributed_s = 0.25;
        with_loss.loss_node = Some(with_loss.nodes[1].name.clone());
        let text = serde_json::to_string(&with_loss).expect("json");
        let with_loss = MeasuredProfile::parse(&text, "p.json").expect("parse");
        let mut g3 = from_module(&m, &AnalyticOptions::default(), "t").expect("cost graph");
        apply(&mut g3, &with_loss, "p.json").expect("apply");
        assert_eq!(g3.times(1, 4.0, &kind), (2.5, 4.25));
        assert_eq!(g3.times(0, 4.0, &kind), g.times(0, 4.0, &kind));
    }

    #[test]
    fn error_rows_compare_the_roofline_with_the_profile() {
        let m = mlp();
        let g = from_module(&m, &AnalyticOptions::default(), "t").expect("cost graph");
        let p = profile_of(&g, 2);
        let kind = crate::cost::cluster::cpu_core(1 << 30);
        let rows = error_rows(&g, &p, &kind);
        assert_eq!(rows.len(), g.len());
        assert_eq!(rows[0].analytic_fwd_s, g.times(0, 2.0, &kind).0);
        let text = error_report(&rows, 3);
        assert!(
            text.contains("all fwd") && text.contains("MatMul bwd"),
            "{text}"
        );
        assert!(text.contains("worst 3"), "{text}");
    }
}
