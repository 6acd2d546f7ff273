//! `partition-gpp`: GraphPipe's pipeline stage partitioner (Jeon et al., ASPLOS'25, §5,
//! Algorithm 1): a binary search on the bottleneck time-per-sample (TPS) around a memoised DP over
//! the series-parallel decomposition tree ([`crate::sp_decompose`]).
//!
//! # Contract
//! - **Requires**: a [`CostGraph`], a [`Cluster`] (homogeneous: timed on device 0's kind, memory of
//!   the smallest device), the mini-batch `B` and a micro-batch `b` dividing it.
//! - **Guarantees**: [`search`] returns stages (unit ranges of the coarsened tree with a replica
//!   count each; replica counts sum to the device count, C3) whose bottleneck TPS is within `ε`
//!   (relative) of the smallest any stage graph of the DP's space reaches under the memory
//!   constraint (Eq. 2), and, among those, the smallest source in-flight count (PICKBETTER). Every
//!   stage is a convex union of units (C1) by construction of the tree.
//! - **Errors**: no plan fits in memory ("Eq. 2"), naming the largest static footprint.
//!
//! # The DP (Algorithm 1, lines 23–48)
//! A DP state is a subgraph `G` of the tree (a whole tree node, a prefix `c_0..c_j` of a series
//! node's children, a suffix `c_s..` of a parallel node's children), a device count `d`, and the
//! target `t_max`. With the default uniform micro-batch and 1F1B (`k = 1`), the schedule
//! configuration `c = (i, b, k)` that crosses a boundary reduces to the in-flight count `i`, and by
//! Appendix A.1 row 7 every stage adds one micro-batch to its successors' maximum
//! ([`crate::schedule_gpp::compute_in_flight`]). A sub-plan is therefore summarised by
//! `(δ, σ)`: it turns the in-flight count `i_b` of the stage after its sink into `i_f = i_b + δ` at
//! its source, and it fits in memory iff `i_b ≤ σ` (each stage's memory check, `min(i_b + depth, M)`
//! in flight, is a bound on `i_b`). Instead of one memo entry per `i_b` (Algorithm 1's `c_b`),
//! the DP value is the Pareto set of `(δ, σ)` over feasible sub-plans, which answers every `i_b`
//! at once; PICKBETTER (less memory) is "smallest `δ` with `σ ≥ i_b`".
//! - **Base case** (line 28): all of `G` is one stage on `d` replicas; feasible iff
//!   `TPS ≤ t_max`, `(δ, σ) = (1, cap − 1)` with `cap` the most micro-batches in flight that fit.
//! - **Series split** (lines 33–40): the last segment `c_k..c_{j−1}` gets `d₂` devices and the
//!   prefix `c_0..c_{k−1}` the other `d − d₂`; the segment is solved first and its `i_m` fixes the
//!   prefix's `c_b`: `δ = δ₁ + δ₂`, `σ = min(σ₂, σ₁ − δ₂)`. A segment of one non-unit child
//!   is that child's own DP state (any `d₂`); a segment of units is a single stage with a
//!   power-of-two replica count (the paper's set 𝒟). (A whole subproblem as one stage — the base
//!   case — takes all its `d` devices, any count.)
//! - **Parallel split** (lines 41–47): the first child gets `d₁`, the remaining children `d − d₁`;
//!   both see the same `c_b`, and the larger in-flight count wins: `δ = max`, `σ = min`.
//!
//! # Stage TPS (ESTIMATETPS)
//! For a stage over node set `G` with `r` replicas at micro-batch `b` (each replica gets `b/r`
//! samples): `per_mb = max(F + B, comm)`, where `F + B` is the summed forward and backward time of
//! a slice and `comm = α + (in + out bytes of the micro-batch)/(β·ports)` (activations out and
//! gradients in share the send channel) with `β, α` of the cluster level the device set spans and
//! `ports` the replicas' own links (`r`) inside one node, or the nodes they span
//! (`⌈r / node size⌉`) when the devices span nodes (the simulator's per-node port contention);
//! `TPS = per_mb / b + (AllReduce(params, r) + step) / B`.
//! Memory: [`crate::cost::memory::stage_memory`] with the stage's in-flight count.
//!
//! # Binary search (lines 2–11)
//! `t_r` starts at a feasible plan's bottleneck (the DP at `t = ∞` picks the shallowest plan that
//! fits), `t_l = 0`, and halves until `t_r − t_l ≤ ε·t_r`.
//!
//! # IR pass
//! [`PartitionGpp`] (`partition-gpp`) plans the module with the `gpp` planner (cluster, device
//! count and batch from the module attributes `pipec.cluster` (default `summit`),
//! `pipec.devices` (default 4), `pipec.batch` (default 32) and optional
//! `pipec.micro_batch`), and annotates every op with `pipec.stage`, and the module with
//! `pipec.micro_batch` and, per stage `i`, `pipec.stage{i}.devices`.
//!
//! The sequential mode runs the same DP on a one-level tree: the units linearised in the tree's
//! depth-first order (a topological order), so only chains of stages are possible (SPP).

use crate::cost::comm::allreduce_time;
use crate::cost::memory::step_time;
use crate::cost::{AllReduceAlgo, Cluster, CostGraph, NodeId, Optimizer};
use crate::sp_decompose::{SpKind, SpTree};
use pipec_compiler::{Error, Result};

/// A tree node over unit ranges.
#[derive(Clone, Debug)]
pub struct TNode {
    pub kind: SpKind,
    pub children: Vec<usize>,
    /// Unit range `[lo, hi)` in depth-first order.
    pub lo: usize,
    pub hi: usize,
    /// A parallel node whose last child ends with the join that follows it (see [`UnitGraph::new`]):
    /// the other children feed that child's sink stage, one stage deeper.
    pub join: bool,
    /// For the last child `V` of a join node: the index of the join unit among its children.
    pub join_at: Option<usize>,
    /// For a parallel node: a series of its units in depth-first order (a linearised chain),
    /// whose plans the DP also considers for the whole node (SPP is a special case of GPP).
    pub chain: Option<usize>,
}

/// The partitioner's view of the model: units (in DFS order), the tree over them, unit edges.
#[derive(Clone, Debug)]
pub struct UnitGraph {
    pub units: Vec<Vec<NodeId>>,
    pub tree: Vec<TNode>,
    pub root: usize,
    /// `(a, b, bytes at the reference batch)`, `a < b`.
    pub edges: Vec<(usize, usize, f64)>,
    pub side: Vec<NodeId>,
    /// Unit of each node (`usize::MAX` for side nodes).
    pub unit_of: Vec<usize>,
}

impl UnitGraph {
    /// From a (coarsened) SP tree; `sequential` flattens it into one series of its leaves.
    pub fn new(g: &CostGraph, sp: &SpTree, sequential: bool) -> UnitGraph {
        let leaves = sp.leaves();
        let units: Vec<Vec<NodeId>> = leaves.iter().map(|&l| sp.tree[l].nodes.clone()).collect();
        let mut tree = Vec::new();
        let root = if sequential || sp.tree[sp.root].kind == SpKind::Leaf {
            let kids: Vec<usize> = (0..units.len())
                .map(|i| {
                    tree.push(TNode {
                        kind: SpKind::Leaf,
                        children: Vec::new(),
                        lo: i,
                        hi: i + 1,
                        join: false,
                        join_at: None,
                        chain: None,
                    });
                    tree.len() - 1
                })
                .collect();
            if kids.len() == 1 {
                kids[0]
            } else {
                tree.push(TNode {
                    kind: SpKind::Series,
                    children: kids,
                    lo: 0,
                    hi: units.len(),
                    join: false,
                    join_at: None,
                    chain: None,
                });
                tree.len() - 1
            }
        } else {
            let mut next = 0usize;
            fn build(sp: &SpTree, t: usize, next: &mut usize, out: &mut Vec<TNode>) -> usize {
                let lo = *next;
                let node = &sp.tree[t];
                let children = if node.kind == SpKind::Leaf {
                    *next += 1;
                    Vec::new()
                } else {
                    node.children
                        .iter()
                        .map(|&c| build(sp, c, next, out))
                        .collect()
                };
                out.push(TNode {
                    kind: node.kind,
                    children,
                    lo,
                    hi: *next,
                    join: false,
                    join_at: None,
                    chain: None,
                });
                out.len() - 1
            }
            let r = build(sp, sp.root, &mut next, &mut tree);
            attach_joins(&mut tree);
            attach_chains(&mut tree);
            r
        };
        let mut unit_of = vec![usize::MAX; g.len()];
        for (i, u) in units.iter().enumerate() {
            for &n in u {
                unit_of[n] = i;
            }
        }
        // Unit edges: a node's output counted once per consuming unit (its largest edge there).
        let mut acc: std::collections::BTreeMap<(usize, usize), f64> = Default::default();
        for u in 0..g.len() {
            let a = unit_of[u];
            if a == usize::MAX {
                continue;
            }
            let mut per: std::collections::BTreeMap<usize, f64> = Default::default();
            for &e in g.out_edges(u) {
                let b = unit_of[g.edges[e].dst];
                if b != usize::MAX && b != a {
                    let x = per.entry(b).or_insert(0.0);
                    *x = x.max(g.edges[e].bytes);
                }
            }
            for (b, bytes) in per {
                *acc.entry((a.min(b), a.max(b))).or_insert(0.0) += bytes;
            }
        }
        UnitGraph {
            units,
            tree,
            root,
            edges: acc.into_iter().map(|((a, b), x)| (a, b, x)).collect(),
            side: sp.side.clone(),
            unit_of,
        }
    }
}

/// The merge node after a parallel split belongs to one branch's last stage (GraphPipe's case
/// study: "one stage also holding the concat"; in the paper's vertex form the parallel parts share
/// their sink). In every series `[.., P, L, ..]` with `P` parallel and `L` a unit, `[P, L]` becomes
/// `P' = [c_1, .., c_{n−1}, V]` with `V = series(c_n.., L)`, marked `join`: the DP may then keep
/// `L` with `c_n`'s tail or give it its own stage, and the other branches count one stage deeper.
/// Unit ranges are unchanged (`L` follows `c_n`'s units in depth-first order).
fn attach_joins(tree: &mut Vec<TNode>) {
    for t in 0..tree.len() {
        if tree[t].kind != SpKind::Series {
            continue;
        }
        let mut q = 0;
        while q + 1 < tree[t].children.len() {
            let (p, l) = (tree[t].children[q], tree[t].children[q + 1]);
            if tree[p].kind == SpKind::Parallel && !tree[p].join && tree[l].kind == SpKind::Leaf {
                // the run of units after P
                let mut e = q + 1;
                while e < tree[t].children.len() && tree[tree[t].children[e]].kind == SpKind::Leaf {
                    e += 1;
                }
                let tail: Vec<usize> = tree[t].children[q + 1..e].to_vec();
                let last = *tree[p].children.last().unwrap_or(&p);
                let mut vkids = if tree[last].kind == SpKind::Series {
                    tree[last].children.clone()
                } else {
                    vec![last]
                };
                let q0 = vkids.len();
                vkids.extend(tail.iter().copied());
                let hi = tree[*tail.last().unwrap_or(&l)].hi;
                tree.push(TNode {
                    kind: SpKind::Series,
                    children: vkids,
                    lo: tree[last].lo,
                    hi,
                    join: false,
                    join_at: Some(q0),
                    chain: None,
                });
                let v = tree.len() - 1;
                let mut pkids = tree[p].children.clone();
                pkids.pop();
                pkids.push(v);
                tree.push(TNode {
                    kind: SpKind::Parallel,
                    children: pkids,
                    lo: tree[p].lo,
                    hi,
                    join: true,
                    join_at: None,
                    chain: None,
                });
                let np = tree.len() - 1;
                tree[t].children.splice(q..e, [np]);
            }
            q += 1;
        }
    }
}

/// Give every parallel node a linearised alternative (see [`TNode::chain`]): fresh leaves for
/// its units in depth-first order under one series node; for a join node, the join unit's
/// position is carried over so the DP can count the other branches' depth.
fn attach_chains(tree: &mut Vec<TNode>) {
    for t in 0..tree.len() {
        if tree[t].kind != SpKind::Parallel {
            continue;
        }
        let (lo, hi) = (tree[t].lo, tree[t].hi);
        let join_unit = if tree[t].join {
            tree[t].children.last().and_then(|&v| {
                let q = tree[v].join_at?;
                Some(tree[*tree[v].children.get(q)?].lo)
            })
        } else {
            None
        };
        let mut kids = Vec::with_capacity(hi - lo);
        for u in lo..hi {
            tree.push(TNode {
                kind: SpKind::Leaf,
                children: Vec::new(),
                lo: u,
                hi: u + 1,
                join: false,
                join_at: None,
                chain: None,
            });
            kids.push(tree.len() - 1);
        }
        tree.push(TNode {
            kind: SpKind::Series,
            children: kids,
            lo,
            hi,
            join: false,
            join_at: join_unit.map(|u| u - lo),
            chain: None,
        });
        tree[t].chain = Some(tree.len() - 1);
    }
}

/// Inputs of one search.
#[derive(Clone, Debug)]
pub struct SearchParams {
    pub batch: u64,
    pub micro_batch: u64,
    pub devices: usize,
    pub optimizer: Optimizer,
    pub allreduce: AllReduceAlgo,
    /// Relative tolerance of the binary search.
    pub eps: f64,
    /// Also try targets `t·{1.1, 1.25, 1.5, 2}` above the optimum `t` (shallower plans, since the
    /// DP picks the smallest in-flight count under a target) and return the plan with the best
    /// estimated iteration time `(M + depth − 1)·max per_mb + max sync` (pipeline fill and drain
    /// are not in the bottleneck TPS).
    pub relax: bool,
}

/// One stage of a search result.
#[derive(Clone, Debug, PartialEq)]
pub struct StageChoice {
    /// Unit range `[lo, hi)`.
    pub lo: usize,
    pub hi: usize,
    pub replicas: usize,
    /// The stage's estimated TPS, seconds per sample.
    pub tps: f64,
    /// Seconds per micro-batch (one replica's slice).
    pub per_mb: f64,
    /// All-reduce + optimizer step seconds per iteration.
    pub sync: f64,
}

/// A search result.
#[derive(Clone, Debug)]
pub struct SearchResult {
    pub stages: Vec<StageChoice>,
    /// Bottleneck TPS (seconds per sample).
    pub bottleneck_tps: f64,
    /// Source in-flight micro-batches (the plan's depth in the SP-ized graph).
    pub depth: u32,
    /// Number of DP runs (binary-search steps).
    pub dp_runs: usize,
    /// Estimated iteration time: `(M + depth − 1) · max per_mb + max sync`.
    pub estimate_s: f64,
}

#[derive(Clone, Copy, Debug)]
struct StageEval {
    tps: f64,
    /// Lower bound of the TPS from compute alone (monotone in the range).
    compute_tps: f64,
    per_mb: f64,
    sync: f64,
    /// Most micro-batches in flight that fit in memory (negative: never fits).
    cap: i64,
    static_bytes: f64,
}

#[derive(Clone, Copy, Debug)]
enum Back {
    /// The same plan as another state's entry (a parallel node solved as its chain).
    Alias((usize, usize)),
    Single {
        lo: usize,
        hi: usize,
        r: usize,
    },
    Ser {
        seg: (usize, usize),
        pre: (usize, usize),
    },
    /// A single stage over `[lo, hi)` with `r` replicas after the prefix entry `pre`.
    SerSingle {
        lo: usize,
        hi: usize,
        r: usize,
        pre: (usize, usize),
    },
    Par {
        a: (usize, usize),
        b: (usize, usize),
    },
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    delta: u32,
    sigma: i64,
    /// In a join's last child `V` (and the join node's suffixes): the in-flight offset of the
    /// stage holding the join unit; 0 elsewhere.
    jo: u32,
    back: Back,
}

const INF: i64 = i64::MAX / 4;

/// The search engine for one micro-batch size.
pub struct Search<'a> {
    g: &'a CostGraph,
    ug: &'a UnitGraph,
    cluster: &'a Cluster,
    p: SearchParams,
    m: i64,
    /// `time[r][i]`: prefix sums of fwd+bwd seconds of units `0..i` at slice `b/r`.
    time: Vec<Option<Vec<f64>>>,
    params: Vec<f64>,
    saved: Vec<f64>,
    /// Boundary bytes per range `lo * (U + 1) + hi` (NaN: not computed).
    bnd: Vec<f64>,
    /// Stage evaluations per `(lo * (U + 1) + hi) * (D + 1) + r`.
    evals: Vec<Option<StageEval>>,
    ar_devs: Vec<usize>,
    bw: f64,
    alpha: f64,
    multi_node: bool,
    node_size: usize,
    mem: f64,
    /// Memo: state index -> Pareto entries.
    memo: Vec<Option<Vec<Entry>>>,
    state_base: Vec<usize>,
    t_max: f64,
    pow2: Vec<usize>,
}

impl<'a> Search<'a> {
    pub fn new(g: &'a CostGraph, ug: &'a UnitGraph, cluster: &'a Cluster, p: SearchParams) -> Self {
        let s = g.scale(1.0);
        let mut params = vec![0.0];
        let mut saved = vec![0.0];
        for u in &ug.units {
            let pb: f64 = u.iter().map(|&n| g.nodes[n].parameter_bytes).sum();
            let sb: f64 = u.iter().map(|&n| g.nodes[n].saved_bytes).sum::<f64>() * s;
            params.push(params.last().copied().unwrap_or(0.0) + pb);
            saved.push(saved.last().copied().unwrap_or(0.0) + sb);
        }
        let devs: Vec<usize> = (0..p.devices).collect();
        let (bw, alpha) = match cluster.group_span_level(&devs) {
            Some(l) => cluster.path_to_level(l),
            None => cluster.path_to_level(0),
        };
        let multi_node = cluster.group_span_level(&devs).is_some_and(|l| l > 0);
        let mem = (0..cluster.len())
            .map(|d| cluster.kind_of(d).memory_bytes as f64)
            .fold(f64::INFINITY, f64::min);
        let mut state_base = Vec::with_capacity(ug.tree.len());
        let mut total = 0;
        for t in &ug.tree {
            state_base.push(total);
            total += t.children.len() + 1;
        }
        let d = p.devices;
        let pow2 = (0..).map(|i| 1usize << i).take_while(|&x| x <= d).collect();
        Search {
            g,
            ug,
            cluster,
            m: (p.batch / p.micro_batch.max(1)) as i64,
            p,
            time: vec![None; d + 1],
            params,
            saved,
            bnd: vec![f64::NAN; (ug.units.len() + 1) * (ug.units.len() + 1)],
            evals: vec![None; (ug.units.len() + 1) * (ug.units.len() + 1) * (d + 1)],
            ar_devs: devs,
            bw,
            alpha,
            multi_node,
            node_size: cluster.levels.first().map_or(1, |l| l.size.max(1)),
            mem,
            memo: vec![None; total * (d + 1)],
            state_base,
            t_max: f64::INFINITY,
            pow2,
        }
    }

    fn times(&mut self, r: usize) -> &Vec<f64> {
        let (g, ug, kind) = (self.g, self.ug, self.cluster.kind_of(0));
        let slice = self.p.micro_batch as f64 / r as f64;
        self.time[r].get_or_insert_with(|| {
            let mut v = Vec::with_capacity(ug.units.len() + 1);
            v.push(0.0);
            for u in &ug.units {
                let t: f64 = u
                    .iter()
                    .map(|&n| {
                        let (f, b) = g.times(n, slice, kind);
                        f + b
                    })
                    .sum();
                v.push(v.last().copied().unwrap_or(0.0) + t);
            }
            v
        })
    }

    fn boundary(&mut self, lo: usize, hi: usize) -> f64 {
        let ug = self.ug;
        let i = lo * (ug.units.len() + 1) + hi;
        if self.bnd[i].is_nan() {
            self.bnd[i] = ug
                .edges
                .iter()
                .filter(|(a, b, _)| ((lo..hi).contains(a)) != ((lo..hi).contains(b)))
                .map(|e| e.2)
                .sum();
        }
        self.bnd[i]
    }

    fn eval(&mut self, lo: usize, hi: usize, r: usize) -> StageEval {
        let ei = (lo * (self.ug.units.len() + 1) + hi) * (self.p.devices + 1) + r;
        if let Some(e) = self.evals[ei] {
            return e;
        }
        let b = self.p.micro_batch as f64;
        let slice = b / r as f64;
        let compute = {
            let t = self.times(r);
            t[hi] - t[lo]
        };
        let s = self.g.scale(slice);
        let bnd = self.boundary(lo, hi) * s;
        // Between nodes, every transfer of a node's replicas shares the node's port: the stage's
        // whole micro-batch crosses `ceil(r / node size)` ports; inside one node each replica has
        // its own links.
        let ports = if self.multi_node {
            r.div_ceil(self.node_size) as f64
        } else {
            r as f64
        };
        let comm = if bnd > 0.0 {
            self.alpha + bnd * r as f64 / ports / self.bw
        } else {
            0.0
        };
        let per_mb = compute.max(comm);
        let params = self.params[hi] - self.params[lo];
        let ar = allreduce_time(self.cluster, &self.ar_devs[..r], params, self.p.allreduce);
        let step = step_time(
            params,
            self.cluster.kind_of(0).memory_bandwidth,
            self.p.optimizer,
        );
        let bt = self.p.batch as f64;
        let sync = ar + step;
        let static_bytes = params * (2.0 + self.p.optimizer.state_factor()) + 2.0 * bnd;
        let saved = (self.saved[hi] - self.saved[lo]) * slice;
        let cap = if static_bytes > self.mem {
            -1
        } else if saved <= 0.0 {
            INF
        } else {
            ((self.mem - static_bytes) / saved).floor().min(INF as f64) as i64
        };
        let e = StageEval {
            tps: per_mb / b + sync / bt,
            compute_tps: compute / b,
            per_mb,
            sync,
            cap,
            static_bytes,
        };
        self.evals[ei] = Some(e);
        e
    }

    fn single(&mut self, lo: usize, hi: usize, r: usize) -> Option<Entry> {
        let e = self.eval(lo, hi, r);
        if e.tps > self.t_max || e.cap < 1 {
            return None;
        }
        let sigma = if e.cap >= self.m { INF } else { e.cap - 1 };
        Some(Entry {
            delta: 1,
            sigma,
            jo: 0,
            back: Back::Single { lo, hi, r },
        })
    }

    fn whole(&self, t: usize) -> (usize, usize) {
        let node = &self.ug.tree[t];
        match node.kind {
            SpKind::Leaf => (t, 0),
            SpKind::Series => {
                if node.children.len() == 1 {
                    self.whole(node.children[0])
                } else {
                    (t, node.children.len())
                }
            }
            SpKind::Parallel => {
                if node.children.len() == 1 {
                    self.whole(node.children[0])
                } else {
                    (t, 0)
                }
            }
        }
    }

    fn norm(&self, t: usize, j: usize) -> (usize, usize) {
        let node = &self.ug.tree[t];
        match node.kind {
            SpKind::Series if j == 1 => self.whole(node.children[0]),
            SpKind::Parallel if j + 1 == node.children.len() => {
                self.whole(node.children[node.children.len() - 1])
            }
            _ => (t, j),
        }
    }

    fn idx(&self, t: usize, j: usize, d: usize) -> usize {
        (self.state_base[t] + j) * (self.p.devices + 1) + d
    }

    /// Solve state (t, j, d) (normalised); returns its index in the memo.
    fn solve(&mut self, t: usize, j: usize, d: usize) -> usize {
        let (t, j) = self.norm(t, j);
        let id = self.idx(t, j, d);
        if self.memo[id].is_some() {
            return id;
        }
        let mut out: Vec<Entry> = Vec::new();
        let node = self.ug.tree[t].clone();
        match node.kind {
            SpKind::Leaf => {
                if let Some(e) = self.single(node.lo, node.hi, d) {
                    push_pareto(&mut out, e);
                }
            }
            SpKind::Series => {
                let kids = &node.children;
                let lo = self.ug.tree[kids[0]].lo;
                let hi = self.ug.tree[kids[j - 1]].hi;
                let q0 = node.join_at;
                if let Some(mut e) = self.single(lo, hi, d) {
                    e.jo = u32::from(q0.is_some_and(|q| q < j));
                    push_pareto(&mut out, e);
                }
                if d >= 2 {
                    for k in (1..j).rev() {
                        let seg_lo = self.ug.tree[kids[k]].lo;
                        if k == j - 1 && self.ug.tree[kids[k]].kind != SpKind::Leaf {
                            let (ct, cj) = self.whole(kids[k]);
                            for d2 in 1..d {
                                let s = self.solve(ct, cj, d2);
                                if self.memo[s].as_ref().is_none_or(|v| v.is_empty()) {
                                    continue;
                                }
                                let p = self.solve(t, k, d - d2);
                                self.combine_series(&mut out, s, p, join_rule(q0, k, j));
                            }
                        } else {
                            let mut any = false;
                            let pows: Vec<usize> =
                                self.pow2.iter().copied().filter(|&r| r < d).collect();
                            for &r in pows.iter().rev() {
                                let e = self.eval(seg_lo, hi, r);
                                if e.compute_tps <= self.t_max {
                                    any = true;
                                }
                                if e.tps > self.t_max || e.cap < 1 {
                                    continue;
                                }
                                let Some(se) = self.single(seg_lo, hi, r) else {
                                    continue;
                                };
                                let p = self.solve(t, k, d - r);
                                let pre = self.memo[p].as_deref().unwrap_or(&[]);
                                for (pi, pe) in pre.iter().enumerate() {
                                    let sigma = se.sigma.min(pe.sigma.saturating_sub(1));
                                    if sigma >= 0 {
                                        push_pareto(
                                            &mut out,
                                            Entry {
                                                delta: pe.delta + 1,
                                                sigma,
                                                jo: match join_rule(q0, k, j) {
                                                    JoinAt::Segment => 1,
                                                    JoinAt::Prefix => 1 + pe.jo,
                                                    JoinAt::None => 0,
                                                },
                                                back: Back::SerSingle {
                                                    lo: seg_lo,
                                                    hi,
                                                    r,
                                                    pre: (p, pi),
                                                },
                                            },
                                        );
                                    }
                                }
                            }
                            if !any {
                                break;
                            }
                        }
                    }
                }
            }
            SpKind::Parallel => {
                let kids = &node.children;
                let lo = self.ug.tree[kids[j]].lo;
                let hi = node.hi;
                if let Some(mut e) = self.single(lo, hi, d) {
                    e.jo = u32::from(node.join);
                    push_pareto(&mut out, e);
                }
                if let (0, Some(c)) = (j, node.chain) {
                    let (ct, cj) = self.whole(c);
                    let cid = self.solve(ct, cj, d);
                    let es = self.memo[cid].as_deref().unwrap_or(&[]);
                    for (i, e) in es.iter().enumerate() {
                        push_pareto(
                            &mut out,
                            Entry {
                                back: Back::Alias((cid, i)),
                                ..*e
                            },
                        );
                    }
                }
                let (ct, cj) = self.whole(kids[j]);
                for d1 in 1..d {
                    let a = self.solve(ct, cj, d1);
                    if self.memo[a].as_ref().is_none_or(|v| v.is_empty()) {
                        continue;
                    }
                    let b = self.solve(t, j + 1, d - d1);
                    let (ea, eb) = (
                        self.memo[a].as_deref().unwrap_or(&[]),
                        self.memo[b].as_deref().unwrap_or(&[]),
                    );
                    // In a join node, child j feeds the join's stage (inside the last child).
                    for (ia, x) in ea.iter().enumerate() {
                        for (ib, y) in eb.iter().enumerate() {
                            let shift = if node.join { y.jo.max(1) } else { 0 };
                            let sigma = x.sigma.saturating_sub(shift as i64).min(y.sigma);
                            if sigma >= 0 {
                                push_pareto(
                                    &mut out,
                                    Entry {
                                        delta: (x.delta + shift).max(y.delta),
                                        jo: if node.join { y.jo } else { 0 },
                                        sigma,
                                        back: Back::Par {
                                            a: (a, ia),
                                            b: (b, ib),
                                        },
                                    },
                                );
                            }
                        }
                    }
                }
            }
        }
        self.memo[id] = Some(out);
        id
    }

    fn combine_series(&self, out: &mut Vec<Entry>, s: usize, p: usize, rule: JoinAt) {
        let (es, ep) = (
            self.memo[s].as_deref().unwrap_or(&[]),
            self.memo[p].as_deref().unwrap_or(&[]),
        );
        for (is, x) in es.iter().enumerate() {
            for (ip, y) in ep.iter().enumerate() {
                let sigma = x.sigma.min(y.sigma.saturating_sub(x.delta as i64));
                if sigma >= 0 {
                    push_pareto(
                        out,
                        Entry {
                            delta: x.delta + y.delta,
                            sigma,
                            jo: match rule {
                                JoinAt::Segment => x.jo.max(1),
                                JoinAt::Prefix => x.delta + y.jo,
                                JoinAt::None => 0,
                            },
                            back: Back::Ser {
                                seg: (s, is),
                                pre: (p, ip),
                            },
                        },
                    );
                }
            }
        }
    }
}

/// Where the join unit of a join's last child lies relative to a series split `[0,k) | [k,j)`.
#[derive(Clone, Copy, Debug)]
enum JoinAt {
    Segment,
    Prefix,
    None,
}

fn join_rule(q0: Option<usize>, k: usize, j: usize) -> JoinAt {
    match q0 {
        Some(q) if k <= q && q < j => JoinAt::Segment,
        Some(q) if q < k => JoinAt::Prefix,
        _ => JoinAt::None,
    }
}

/// Insert `e` into a Pareto set on (smaller δ, larger σ, smaller join offset).
fn push_pareto(out: &mut Vec<Entry>, e: Entry) {
    let dominates = |a: &Entry, b: &Entry| a.delta <= b.delta && a.sigma >= b.sigma && a.jo <= b.jo;
    if out.iter().any(|x| dominates(x, &e)) {
        return;
    }
    out.retain(|x| !dominates(&e, x));
    out.push(e);
}

impl Search<'_> {
    /// One DP run at `t_max` (Algorithm 1's SEARCHSTAGEGRAPH): the best top-level entry, if any.
    fn run(&mut self, t_max: f64) -> Option<(u32, Vec<StageChoice>)> {
        self.t_max = t_max;
        for m in self.memo.iter_mut() {
            *m = None;
        }
        let (t, j) = self.whole(self.ug.root);
        let id = self.solve(t, j, self.p.devices);
        let entries = self.memo[id].clone().unwrap_or_default();
        let (ei, best) = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.sigma >= 0)
            .min_by_key(|(_, e)| (e.delta, std::cmp::Reverse(e.sigma)))?;
        let mut stages = Vec::new();
        self.extract((id, ei), &mut stages);
        stages.sort_by_key(|s| s.lo);
        Some((best.delta, stages))
    }

    fn extract(&mut self, (id, ei): (usize, usize), out: &mut Vec<StageChoice>) {
        let Some(e) = self.memo[id].as_ref().and_then(|v| v.get(ei)).copied() else {
            return;
        };
        match e.back {
            Back::Single { lo, hi, r } => self.push_stage(lo, hi, r, out),
            Back::SerSingle { lo, hi, r, pre } => {
                self.push_stage(lo, hi, r, out);
                self.extract(pre, out);
            }
            Back::Ser { seg, pre } => {
                self.extract(seg, out);
                self.extract(pre, out);
            }
            Back::Par { a, b } => {
                self.extract(a, out);
                self.extract(b, out);
            }
            Back::Alias(x) => self.extract(x, out),
        }
    }

    fn push_stage(&mut self, lo: usize, hi: usize, r: usize, out: &mut Vec<StageChoice>) {
        let e = self.eval(lo, hi, r);
        out.push(StageChoice {
            lo,
            hi,
            replicas: r,
            tps: e.tps,
            per_mb: e.per_mb,
            sync: e.sync,
        });
    }

    /// The largest static footprint of a single unit on all devices (for the memory error).
    fn worst_unit(&mut self) -> (usize, f64) {
        let d = self.p.devices;
        (0..self.ug.units.len())
            .map(|u| (u, self.eval(u, u + 1, d).static_bytes))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0))
    }
}

/// Algorithm 1: binary search on the bottleneck TPS around the DP, for one micro-batch size.
pub fn search(
    g: &CostGraph,
    ug: &UnitGraph,
    cluster: &Cluster,
    p: SearchParams,
) -> Result<SearchResult> {
    if p.devices == 0 || p.devices > cluster.len() {
        return Err(Error::Usage(format!(
            "gpp: {} devices requested but the cluster '{}' has {}",
            p.devices,
            cluster.name,
            cluster.len()
        )));
    }
    if p.micro_batch == 0 || !p.batch.is_multiple_of(p.micro_batch) {
        return Err(Error::Usage(format!(
            "gpp: micro-batch {} must be >= 1 and divide the batch {}",
            p.micro_batch, p.batch
        )));
    }
    if ug.units.is_empty() {
        return Err(Error::Usage(
            "gpp: the model has no node to partition".into(),
        ));
    }
    let eps = p.eps;
    let mut s = Search::new(g, ug, cluster, p);
    let mut runs = 0usize;
    // t_r: a feasible bottleneck (the whole model on every device if it fits, else the DP's
    // shallowest feasible plan at t = ∞).
    // Start from the whole model as one stage's TPS and double until a plan fits (cheap: tight
    // targets prune most of the DP); fall back to t = ∞ (memory permitting, any TPS).
    let whole = s.eval(0, ug.units.len(), s.p.devices);
    let mut best = None;
    let mut t = whole.tps;
    for _ in 0..6 {
        runs += 1;
        best = s.run(t);
        if best.is_some() {
            break;
        }
        t *= 2.0;
    }
    if best.is_none() {
        runs += 1;
        best = s.run(f64::INFINITY);
    }
    let Some(mut best) = best else {
        let (u, bytes) = s.worst_unit();
        let name = ug.units[u]
            .first()
            .map(|&n| g.nodes[n].name.clone())
            .unwrap_or_default();
        return Err(Error::Usage(format!(
            "gpp: no plan fits in device memory (Eq. 2, {:.2} GB per device) at micro-batch {}: \
             every stage graph has a stage over its memory; the largest unit (at '{name}') alone \
             needs {:.2} GB of parameters, gradients, optimizer state and buffers",
            s.mem / 1e9,
            s.p.micro_batch,
            bytes / 1e9
        )));
    };
    let bottleneck = |st: &[StageChoice]| st.iter().map(|x| x.tps).fold(0.0, f64::max);
    let mut t_r = bottleneck(&best.1);
    let mut t_l = 0.0;
    while t_r - t_l > eps * t_r {
        let t_m = 0.5 * (t_l + t_r);
        runs += 1;
        match s.run(t_m) {
            None => t_l = t_m,
            Some(r) => {
                t_r = bottleneck(&r.1).min(t_m);
                best = r;
            }
        }
    }
    let m = (s.p.batch / s.p.micro_batch) as f64;
    let estimate = |depth: u32, st: &[StageChoice]| {
        let per_mb = st.iter().map(|x| x.per_mb).fold(0.0, f64::max);
        let sync = st.iter().map(|x| x.sync).fold(0.0, f64::max);
        (m + depth as f64 - 1.0) * per_mb + sync
    };
    let mut best_est = estimate(best.0, &best.1);
    if s.p.relax {
        for f in [1.1, 1.25, 1.5, 2.0] {
            runs += 1;
            if let Some(r) = s.run(t_r * f) {
                let e = estimate(r.0, &r.1);
                if e < best_est * (1.0 - 1e-9) {
                    best_est = e;
                    best = r;
                }
            }
        }
    }
    let (depth, stages) = best;
    Ok(SearchResult {
        bottleneck_tps: bottleneck(&stages),
        estimate_s: best_est,
        stages,
        depth,
        dp_runs: runs,
    })
}

/// The `partition-gpp` IR pass (see the module doc).
pub struct PartitionGpp;

impl pipec_compiler::passmgr::Pass for PartitionGpp {
    fn name(&self) -> &'static str {
        "partition-gpp"
    }
    fn summary(&self) -> &'static str {
        "GraphPipe stage partitioner (Algorithm 1): annotate ops with pipec.stage, stages with devices"
    }
    fn run(
        &self,
        module: &mut pipec_compiler::ir::Module,
        stats: &mut pipec_compiler::passmgr::Stats,
    ) -> Result<()> {
        use crate::planners::Planner;
        use pipec_compiler::ir::Attr;
        let g = ir::cost_graph(module)?;
        let cfg = ir::IrConfig::from_module(module, &g)?;
        let mut opts = crate::plan::PlanOptions::new(cfg.batch);
        opts.micro_batch = cfg.micro_batch;
        let plan = crate::planners::gpp::Gpp::default().plan(&g, &cfg.cluster, &opts)?;
        let specs = plan.specs(&g)?;
        let order = module.graph.order.clone();
        for (s, sp) in specs.iter().enumerate() {
            for &n in &sp.nodes {
                if let Some(&op) = order.get(n) {
                    module.graph.ops[op]
                        .attrs
                        .insert("pipec.stage".into(), Attr::Int(s as i64));
                }
            }
            module.attrs.insert(
                format!("pipec.stage{s}.devices"),
                Attr::Ints(sp.devices.iter().map(|&d| d as i64).collect()),
            );
        }
        module.attrs.insert(
            "pipec.micro_batch".into(),
            Attr::Int(plan.micro_batch as i64),
        );
        module
            .attrs
            .insert("pipec.batch".into(), Attr::Int(plan.batch as i64));
        module
            .attrs
            .insert("pipec.stages".into(), Attr::Int(specs.len() as i64));
        stats.add("stages", specs.len() as u64);
        stats.add("depth", plan.pipeline_depth as u64);
        stats.add("micro-batch", plan.micro_batch);
        Ok(())
    }
}

/// Helpers shared by the GPP IR passes.
pub mod ir {
    use crate::cost::analytic::{from_module, AnalyticOptions};
    use crate::cost::{Cluster, CostGraph};
    use pipec_compiler::ir::{Attr, Module};
    use pipec_compiler::{Error, Result};

    /// The module's cost graph: node `i` is the op `module.graph.order[i]`.
    pub fn cost_graph(module: &Module) -> Result<CostGraph> {
        from_module(module, &AnalyticOptions::default(), &module.graph.name)
    }

    /// Planning inputs read from the module attributes (see [`super::PartitionGpp`]).
    pub struct IrConfig {
        pub cluster: Cluster,
        pub batch: u64,
        pub micro_batch: Option<u64>,
    }

    impl IrConfig {
        pub fn from_module(m: &Module, _g: &CostGraph) -> Result<IrConfig> {
            let name = m
                .attrs
                .get("pipec.cluster")
                .and_then(Attr::as_str)
                .unwrap_or("summit")
                .to_string();
            let devices = m
                .attrs
                .get("pipec.devices")
                .and_then(Attr::as_int)
                .unwrap_or(4);
            if devices < 1 {
                return Err(Error::Usage(format!(
                    "pipec.devices = {devices}: must be >= 1"
                )));
            }
            let cluster = Cluster::resolve(&name, None)?.take(devices as usize)?;
            let batch = m
                .attrs
                .get("pipec.batch")
                .and_then(Attr::as_int)
                .map_or(32, |b| b.max(1) as u64);
            let micro_batch = m
                .attrs
                .get("pipec.micro_batch")
                .and_then(Attr::as_int)
                .map(|b| b.max(0) as u64);
            Ok(IrConfig {
                cluster,
                batch,
                micro_batch,
            })
        }
    }
}
