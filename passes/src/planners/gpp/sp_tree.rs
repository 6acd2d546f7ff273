//! The series-parallel (SP) decomposition tree of a model's forward graph, the input of
//! GraphPipe's partitioner (Jeon et al., ASPLOS'25, §5 "Series-parallel decomposition":
//! every DP subproblem is a subgraph with a unique source and sink; a *series* split joins the sink
//! of G1 to the source of G2, a *parallel* split shares both).
//!
//! # Contract
//! - **Requires**: a [`CostGraph`] (an ONNX module costed by [`crate::cost::analytic`], or a
//!   profile: a profile is a DAG too). The IR pass `sp-decompose` ([`crate::graphpipe::sp_decompose`])
//!   builds one from the module itself.
//! - **Guarantees**: [`decompose`] always succeeds on a DAG and returns an [`SpTree`] whose leaves
//!   (units) partition the *skeleton* nodes, plus the list of *side* nodes, such that
//!   (a) the children of a `Series` node are ordered and every graph edge between two children goes
//!   from an earlier child to a later one; (b) there is no edge between two children of a
//!   `Parallel` node; hence (c) every tree node, every contiguous run of a series node's children
//!   and every union of a parallel node's children is a **convex** node set (GraphPipe's C1), so any
//!   stage the partitioner builds from them is valid. Leaves in depth-first order form a
//!   topological order of the units (the linearised "sequential" chain uses it).
//!
//! # Method: making a real DAG series-parallel without losing its parallelism
//! Exported graphs are rarely SP: masks, position ids and shape arithmetic feed every layer,
//! DenseNet concatenates everything, Inception and U-Net skip across blocks. Three steps:
//!
//! 1. **Duplicate cheap side computations.** A node is *side* when it has no parameters, its work
//!    is negligible (≤ 10⁻⁴ of the model's), and each of its inputs is a graph input, a constant or
//!    another side node — or it is a `Shape`/`Size` op (its value depends only on shapes, which
//!    every stage knows for its micro-batch), except one through which a skeleton node reads an
//!    activation it has no skeleton path from (see [`side_nodes`]). Side nodes (constants, shape arithmetic, attention
//!    masks, position ids) are taken out of the skeleton; conceptually each consumer gets its own
//!    copy hung off the consumer's source, which adds no edge to the SP structure. In a plan, a
//!    side node goes to the stage that is the nearest common ancestor of its consumers' stages (or
//!    the first of them in stage topological order when they have none), so its edges only follow
//!    existing stage dependencies (see [`assign_side_nodes`]).
//! 2. **Series splits at cut nodes, with skip edges relaxed.** For a weakly connected node set in
//!    topological order (ordered by earliest start time on the critical path), a *cut node* is one
//!    that every other node of the set is an ancestor or a descendant of: it is found in O(n + e)
//!    from edge-crossing counts (node `v` at position `p` is a cut node iff the edges crossing the
//!    gap before `p` all enter `v` and the edges crossing the gap after `p` all leave `v`, with
//!    virtual edges from a virtual source to every local source and from every local sink to a
//!    virtual sink). The set is split in series at every cut node. An edge that skips over a cut
//!    node (ResNet/U-Net skips, DenseNet's concatenations) goes forward in the series order and is
//!    kept: it is the same as routing the value through identity relays in the stages between,
//!    which is how it is costed (the value crosses the stage boundaries). Weakly connected
//!    components of a set are the children of a parallel split.
//! 3. **Synchronising edges, placed by cost.** A connected set of ≥ 2 nodes with no cut node is
//!    not SP (e.g. two branches with a cross edge). It is split in series at the prefix `P` of the
//!    topological order that minimises the critical path of the result, `cp(P) + cp(rest)` (each
//!    computed in O(1) per candidate from finish and tail times, which do not depend on the cut),
//!    ties broken by the bytes crossing the cut, then by balance. This adds the synchronising
//!    edges "all of `P` before all of the rest" exactly where they lengthen the critical path
//!    least; [`SpTree::forced_splits`] counts them. Recursion then finds parallel structure on
//!    both sides again.
//!
//! The result for a genuinely SP graph is its canonical decomposition (flattened: no series child
//! of a series node, no parallel child of a parallel node).
//!
//! # Coarsening ([`SpTree::coarsen`])
//! So that the partitioner's search scales, units are grouped: any subtree whose work is at most
//! `θ` becomes one unit, and consecutive unit children of a series node (chains between SP
//! boundaries) are merged while their summed work stays ≤ `θ`. A node's backward pass is always in
//! the same unit as its forward (a [`CostGraph`] node carries both). Parallel children are sorted
//! by decreasing work, so small branches end up adjacent and can share a stage.

use crate::cost::{CostGraph, DeviceKind, NodeId};

/// Kind of an SP tree node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpKind {
    /// One unit (a group of nodes treated as one by the partitioner).
    Leaf,
    /// Ordered children; edges go from earlier to later children only.
    Series,
    /// Children with no edge between them.
    Parallel,
}

/// A node of the SP tree.
#[derive(Clone, Debug, PartialEq)]
pub struct SpNode {
    pub kind: SpKind,
    /// Child tree nodes (empty for a leaf).
    pub children: Vec<usize>,
    /// Graph nodes of a leaf (empty otherwise).
    pub nodes: Vec<NodeId>,
}

/// The SP decomposition of a [`CostGraph`]'s skeleton (see the module doc).
#[derive(Clone, Debug)]
pub struct SpTree {
    pub tree: Vec<SpNode>,
    pub root: usize,
    /// Side nodes (cheap computations duplicated per consumer), not in any leaf.
    pub side: Vec<NodeId>,
    /// Number of forced series splits (synchronising edges added by cost).
    pub forced_splits: usize,
}

impl SpTree {
    /// Leaves in depth-first order (a topological order of the units).
    pub fn leaves(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut stack = vec![self.root];
        while let Some(t) = stack.pop() {
            if self.tree[t].kind == SpKind::Leaf {
                out.push(t);
            } else {
                stack.extend(self.tree[t].children.iter().rev());
            }
        }
        out
    }

    /// All graph nodes under tree node `t`.
    pub fn nodes_under(&self, t: usize) -> Vec<NodeId> {
        let mut out = Vec::new();
        let mut stack = vec![t];
        while let Some(x) = stack.pop() {
            out.extend_from_slice(&self.tree[x].nodes);
            stack.extend(self.tree[x].children.iter().rev());
        }
        out
    }

    /// (leaves, series nodes, parallel nodes, depth).
    pub fn shape(&self) -> (usize, usize, usize, usize) {
        let (mut l, mut s, mut p, mut depth) = (0, 0, 0, 0);
        let mut stack = vec![(self.root, 1usize)];
        while let Some((t, d)) = stack.pop() {
            depth = depth.max(d);
            match self.tree[t].kind {
                SpKind::Leaf => l += 1,
                SpKind::Series => s += 1,
                SpKind::Parallel => p += 1,
            }
            for &c in &self.tree[t].children {
                stack.push((c, d + 1));
            }
        }
        (l, s, p, depth)
    }

    /// Coarsen (see the module doc) with threshold `theta` on the node weights `w`, and sort
    /// parallel children by decreasing work. Returns the coarsened tree.
    pub fn coarsen(&self, w: &[f64], theta: f64) -> SpTree {
        let mut out = SpTree {
            tree: Vec::new(),
            root: 0,
            side: self.side.clone(),
            forced_splits: self.forced_splits,
        };
        // Work under every tree node, children before parents (one pass, not one walk per node).
        let mut work = vec![0.0f64; self.tree.len()];
        let mut stack = vec![(self.root, false)];
        while let Some((t, done)) = stack.pop() {
            if done {
                let own: f64 = self.tree[t].nodes.iter().map(|&n| w[n]).sum();
                work[t] = own + self.tree[t].children.iter().map(|&c| work[c]).sum::<f64>();
            } else {
                stack.push((t, true));
                stack.extend(self.tree[t].children.iter().map(|&c| (c, false)));
            }
        }
        let (root, _) = self.coarsen_rec(self.root, &work, theta, &mut out.tree);
        out.root = root;
        out
    }

    fn coarsen_rec(
        &self,
        t: usize,
        work: &[f64],
        theta: f64,
        out: &mut Vec<SpNode>,
    ) -> (usize, f64) {
        let node = &self.tree[t];
        let total = work[t];
        if node.kind == SpKind::Leaf || total <= theta {
            let mut nodes = self.nodes_under(t);
            nodes.sort_unstable();
            out.push(SpNode {
                kind: SpKind::Leaf,
                children: Vec::new(),
                nodes,
            });
            return (out.len() - 1, total);
        }
        let mut kids: Vec<(usize, f64)> = node
            .children
            .iter()
            .map(|&c| grow(|| self.coarsen_rec(c, work, theta, out)))
            .collect();
        if node.kind == SpKind::Series {
            // Merge runs of consecutive leaves while their sum stays <= theta.
            let mut merged: Vec<(usize, f64)> = Vec::with_capacity(kids.len());
            for (c, cw) in kids {
                if let Some(&(p, pw)) = merged.last() {
                    if out[p].kind == SpKind::Leaf
                        && out[c].kind == SpKind::Leaf
                        && pw + cw <= theta
                    {
                        let extra = std::mem::take(&mut out[c].nodes);
                        out[p].nodes.extend(extra);
                        out[p].nodes.sort_unstable();
                        if let Some(last) = merged.last_mut() {
                            last.1 += cw;
                        }
                        continue;
                    }
                }
                merged.push((c, cw));
            }
            kids = merged;
        } else {
            kids.sort_by(|a, b| b.1.total_cmp(&a.1));
        }
        if kids.len() == 1 {
            return kids[0];
        }
        out.push(SpNode {
            kind: node.kind,
            children: kids.iter().map(|k| k.0).collect(),
            nodes: Vec::new(),
        });
        (out.len() - 1, total)
    }
}

/// Per-node work (forward + backward seconds at the reference batch on `kind`).
pub fn node_work(g: &CostGraph, kind: &DeviceKind) -> Vec<f64> {
    (0..g.len())
        .map(|n| {
            let (f, b) = g.times(n, g.reference_batch, kind);
            f + b
        })
        .collect()
}

/// Which nodes are side nodes (see the module doc, step 1).
///
/// A `Shape`/`Size` of a skeleton value `X` stays in the skeleton when some skeleton node `R`
/// depends on `X` only through it (BART's position ids read `Shape(embeddings)`; Swin's window
/// reshapes read `Shape` of an earlier block): as a side node it would leave no skeleton edge
/// from `X` to `R`, the decomposition could put `R` in a stage before `X`'s, and the `Shape`,
/// which must run where `X` is, would then send its value backwards (a cyclic stage graph; the
/// schedule deadlocks). Kept in the skeleton, it carries the edge `X -> R`.
pub fn side_nodes(g: &CostGraph, w: &[f64]) -> Vec<bool> {
    let total: f64 = w.iter().sum();
    let eps = 1e-4 * total;
    let mut keep = vec![false; g.len()];
    loop {
        let side = mark_side(g, w, eps, &keep);
        if side.iter().all(|s| *s) {
            // Nothing but side computations: keep them all as the skeleton.
            return vec![false; g.len()];
        }
        let more = shapes_carrying_order(g, &side);
        if more.is_empty() {
            return side;
        }
        for s in more {
            keep[s] = true;
        }
    }
}

/// One marking pass: `Shape`/`Size` ops (unless `keep`) and cheap parameter-free nodes whose
/// inputs are all side nodes.
fn mark_side(g: &CostGraph, w: &[f64], eps: f64, keep: &[bool]) -> Vec<bool> {
    let mut side = vec![false; g.len()];
    for &n in g.topo_order() {
        let node = &g.nodes[n];
        let shape_op = matches!(node.op.as_str(), "Shape" | "Size") && !keep[n];
        let cheap = node.parameter_bytes == 0.0 && w[n] <= eps && !node.is_input;
        side[n] = shape_op || (cheap && g.preds(n).all(|p| side[p]));
    }
    side
}

/// The side `Shape`/`Size` ops of a skeleton value `X` through which a skeleton node `R` reads
/// `X` while no path of skeleton edges leads from `X` to `R` (see [`side_nodes`]).
fn shapes_carrying_order(g: &CostGraph, side: &[bool]) -> Vec<NodeId> {
    const MAX_ROOTS: usize = 64;
    let n = g.len();
    let topo_pos = g.topo_positions();
    // roots[u] for a side node: (X, the Shape op reading X) for every skeleton X it reads
    // through shape ops.
    let mut roots: Vec<Vec<(NodeId, NodeId)>> = vec![Vec::new(); n];
    for &u in g.topo_order() {
        if !side[u] {
            continue;
        }
        let mut r: Vec<(NodeId, NodeId)> = Vec::new();
        let shape_op = matches!(g.nodes[u].op.as_str(), "Shape" | "Size");
        for p in g.preds(u) {
            if side[p] {
                r.extend(roots[p].iter().copied());
            } else if shape_op && !g.nodes[p].is_input {
                // (a graph input is loaded wherever it is read: no order to carry)
                r.push((p, u));
            }
        }
        r.sort_unstable();
        r.dedup();
        r.truncate(MAX_ROOTS);
        roots[u] = r;
    }
    let mut out = Vec::new();
    // `seen[v] == query`: v visited by the current path search.
    let mut seen = vec![usize::MAX; n];
    let mut stack = Vec::new();
    let mut query = 0;
    // Is there a path of skeleton edges from x to r? Backwards from r, never before x.
    let mut skeleton_path = |x: NodeId, r: NodeId| -> bool {
        query += 1;
        stack.clear();
        stack.push(r);
        seen[r] = query;
        while let Some(v) = stack.pop() {
            for p in g.preds(v) {
                if p == x {
                    return true;
                }
                if side[p] || seen[p] == query || topo_pos[p] < topo_pos[x] {
                    continue;
                }
                seen[p] = query;
                stack.push(p);
            }
        }
        false
    };
    for &r in g.topo_order() {
        if side[r] {
            continue;
        }
        let mut pairs: Vec<(NodeId, NodeId)> = g
            .preds(r)
            .filter(|&p| side[p])
            .flat_map(|p| roots[p].iter().copied())
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        // One search per X: the pairs are sorted by X, and one kept Shape of X carries the
        // order (the next round sees the path through it).
        let mut last_x = None;
        for (x, sh) in pairs {
            if x == r || last_x == Some(x) {
                continue;
            }
            last_x = Some(x);
            if !skeleton_path(x, r) {
                out.push(sh);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Decompose `g` (see the module doc). `kind` is the device kind the node work is timed on.
pub fn decompose(g: &CostGraph, kind: &DeviceKind) -> SpTree {
    let w = node_work(g, kind);
    let side = side_nodes(g, &w);
    decompose_with(g, &w, &side)
}

/// Runs `f` (a recursive step over the tree) with room on the stack: nested series and
/// parallel splits can be thousands of levels deep, more than a thread's stack holds, so the
/// stack grows in 16-MiB segments when less than 64 KiB are left (the `stacker` crate).
pub(crate) fn grow<R>(f: impl FnOnce() -> R) -> R {
    stacker::maybe_grow(64 << 10, 16 << 20, f)
}

/// The root of `x` in the union-find forest `p` (with path halving).
pub(crate) fn find(p: &mut [usize], mut x: usize) -> usize {
    while p[x] != x {
        p[x] = p[p[x]];
        x = p[x];
    }
    x
}

/// [`Ctx::decompose`]'s per-call arrays, kept between calls.
#[derive(Default)]
struct Scratch {
    parent: Vec<usize>,
    comp_of: Vec<usize>,
    indeg: Vec<usize>,
    outdeg: Vec<usize>,
    diff: Vec<i64>,
    bytes_diff: Vec<f64>,
    cross: Vec<i64>,
    cross_bytes: Vec<f64>,
    cut: Vec<bool>,
    finish: Vec<f64>,
    tail: Vec<f64>,
    pre: Vec<f64>,
    suf: Vec<f64>,
}

/// `v` cleared and refilled with `n` copies of `x`.
fn fill<T: Clone>(v: &mut Vec<T>, n: usize, x: T) -> &mut Vec<T> {
    v.clear();
    v.resize(n, x);
    v
}

struct Ctx<'a> {
    g: &'a CostGraph,
    w: &'a [f64],
    scratch: Scratch,
    /// Local index of each node in the set being processed (usize::MAX: not in it).
    local: Vec<usize>,
    tree: Vec<SpNode>,
    forced: usize,
}

/// Decompose with given weights and side mask.
pub fn decompose_with(g: &CostGraph, w: &[f64], side: &[bool]) -> SpTree {
    // Global order: by earliest start (longest weighted path from a source), then topo position.
    let n = g.len();
    let mut start = vec![0.0f64; n];
    for &u in g.topo_order() {
        if side[u] {
            continue;
        }
        for v in g.succs(u) {
            if !side[v] {
                start[v] = start[v].max(start[u] + w[u]);
            }
        }
    }
    let topo_pos = g.topo_positions();
    let mut skel: Vec<NodeId> = (0..n).filter(|&u| !side[u]).collect();
    skel.sort_by(|&a, &b| {
        start[a]
            .total_cmp(&start[b])
            .then(topo_pos[a].cmp(&topo_pos[b]))
    });
    let mut ctx = Ctx {
        g,
        w,
        local: vec![usize::MAX; n],
        tree: Vec::new(),
        forced: 0,
        scratch: Scratch::default(),
    };
    let root = if skel.is_empty() {
        ctx.tree.push(SpNode {
            kind: SpKind::Series,
            children: Vec::new(),
            nodes: Vec::new(),
        });
        0
    } else {
        ctx.decompose(&skel)
    };
    SpTree {
        tree: ctx.tree,
        root,
        side: (0..n).filter(|&u| side[u]).collect(),
        forced_splits: ctx.forced,
    }
}

impl Ctx<'_> {
    fn push(&mut self, kind: SpKind, children: Vec<usize>) -> usize {
        // Flatten same-kind children.
        let mut flat = Vec::with_capacity(children.len());
        for c in children {
            if self.tree[c].kind == kind {
                let cc = std::mem::take(&mut self.tree[c].children);
                flat.extend(cc);
            } else {
                flat.push(c);
            }
        }
        if flat.len() == 1 {
            return flat[0];
        }
        self.tree.push(SpNode {
            kind,
            children: flat,
            nodes: Vec::new(),
        });
        self.tree.len() - 1
    }

    fn leaf(&mut self, u: NodeId) -> usize {
        self.tree.push(SpNode {
            kind: SpKind::Leaf,
            children: Vec::new(),
            nodes: vec![u],
        });
        self.tree.len() - 1
    }

    fn mark(&mut self, set: &[NodeId]) {
        for (i, &u) in set.iter().enumerate() {
            self.local[u] = i;
        }
    }
    fn unmark(&mut self, set: &[NodeId]) {
        for &u in set {
            self.local[u] = usize::MAX;
        }
    }

    /// `set` is in (global) topological order.
    fn decompose(&mut self, set: &[NodeId]) -> usize {
        // Forced splits may recurse deeply on big graphs: grow the stack on demand ([`grow`])
        // instead of running every decomposition on a big-stack thread (a thread
        // start was a visible share of a few-ms GraphPipe search).
        grow(|| self.decompose_in(set))
    }

    fn decompose_in(&mut self, set: &[NodeId]) -> usize {
        if set.len() == 1 {
            return self.leaf(set[0]);
        }
        let g = self.g;
        self.mark(set);
        let n = set.len();
        // The per-call arrays live in `scratch` (one allocation for the whole recursion; they
        // are dead before every recursive call).
        let mut sc = std::mem::take(&mut self.scratch);
        // Weakly connected components (union-find over local indices).
        let parent = &mut sc.parent;
        parent.clear();
        parent.extend(0..n);
        for (i, &u) in set.iter().enumerate() {
            for v in g.succs(u) {
                let j = self.local[v];
                if j != usize::MAX {
                    let (a, b) = (find(parent, i), find(parent, j));
                    if a != b {
                        parent[a.max(b)] = a.min(b);
                    }
                }
            }
        }
        let comp_of = fill(&mut sc.comp_of, n, usize::MAX);
        let mut comps: Vec<Vec<NodeId>> = Vec::new();
        for (i, &u) in set.iter().enumerate() {
            let r = find(parent, i);
            if comp_of[r] == usize::MAX {
                comp_of[r] = comps.len();
                comps.push(Vec::new());
            }
            comps[comp_of[r]].push(u);
        }
        if comps.len() > 1 {
            self.scratch = sc;
            self.unmark(set);
            let kids: Vec<usize> = comps.iter().map(|c| self.decompose(c)).collect();
            return self.push(SpKind::Parallel, kids);
        }
        // Connected: crossing counts with virtual terminals.
        let indeg = fill(&mut sc.indeg, n, 0usize);
        let outdeg = fill(&mut sc.outdeg, n, 0usize);
        let diff = fill(&mut sc.diff, n + 2, 0i64);
        let bytes_diff = fill(&mut sc.bytes_diff, n + 2, 0.0f64);
        for (i, &u) in set.iter().enumerate() {
            for &e in g.out_edges(u) {
                let j = self.local[g.edges[e].dst];
                if j != usize::MAX {
                    outdeg[i] += 1;
                    indeg[j] += 1;
                    diff[i + 1] += 1;
                    diff[j + 1] -= 1;
                    bytes_diff[i + 1] += g.edges[e].bytes;
                    bytes_diff[j + 1] -= g.edges[e].bytes;
                }
            }
        }
        for i in 0..n {
            if indeg[i] == 0 {
                // virtual source -> i crosses gaps 0..=i
                indeg[i] = 1;
                diff[0] += 1;
                diff[i + 1] -= 1;
            }
            if outdeg[i] == 0 {
                // i -> virtual sink crosses gaps i+1..=n
                outdeg[i] = 1;
                diff[i + 1] += 1;
                diff[n + 1] -= 1;
            }
        }
        let cross = fill(&mut sc.cross, n + 1, 0i64);
        let cross_bytes = fill(&mut sc.cross_bytes, n + 1, 0.0f64);
        let (mut run, mut runb) = (0i64, 0.0f64);
        for gap in 0..=n {
            run += diff[gap];
            runb += bytes_diff[gap];
            cross[gap] = run;
            cross_bytes[gap] = runb;
        }
        let cut = &mut sc.cut;
        cut.clear();
        cut.extend((0..n).map(|p| cross[p] == indeg[p] as i64 && cross[p + 1] == outdeg[p] as i64));
        if cut.iter().any(|c| *c) {
            let mut chunks: Vec<Vec<NodeId>> = Vec::new();
            let mut cur: Vec<NodeId> = Vec::new();
            for (p, &u) in set.iter().enumerate() {
                if cut[p] {
                    if !cur.is_empty() {
                        chunks.push(std::mem::take(&mut cur));
                    }
                    chunks.push(vec![u]);
                } else {
                    cur.push(u);
                }
            }
            if !cur.is_empty() {
                chunks.push(cur);
            }
            self.scratch = sc;
            self.unmark(set);
            let kids: Vec<usize> = chunks.iter().map(|c| self.decompose(c)).collect();
            return self.push(SpKind::Series, kids);
        }
        // Not SP here: force a series split where it lengthens the critical path least.
        let finish = fill(&mut sc.finish, n, 0.0f64);
        for (i, &u) in set.iter().enumerate() {
            let s = g
                .preds(u)
                .filter_map(|p| {
                    let j = self.local[p];
                    (j != usize::MAX).then(|| finish[j])
                })
                .fold(0.0, f64::max);
            finish[i] = s + self.w[u];
        }
        let tail = fill(&mut sc.tail, n, 0.0f64);
        for (i, &u) in set.iter().enumerate().rev() {
            let s = g
                .succs(u)
                .filter_map(|v| {
                    let j = self.local[v];
                    (j != usize::MAX).then(|| tail[j])
                })
                .fold(0.0, f64::max);
            tail[i] = s + self.w[u];
        }
        let pre = fill(&mut sc.pre, n + 1, 0.0f64);
        for i in 0..n {
            pre[i + 1] = pre[i].max(finish[i]);
        }
        let suf = fill(&mut sc.suf, n + 1, 0.0f64);
        for i in (0..n).rev() {
            suf[i] = suf[i + 1].max(tail[i]);
        }
        let mut best = 1usize;
        let mut best_key = (f64::INFINITY, f64::INFINITY, usize::MAX);
        for k in 1..n {
            let cp = pre[k] + suf[k];
            let bal = (2 * k).abs_diff(n);
            let key = (cp, cross_bytes[k], bal);
            let better = key.0 < best_key.0 * (1.0 - 1e-12)
                || (key.0 <= best_key.0 * (1.0 + 1e-12)
                    && (key.1 < best_key.1 || (key.1 == best_key.1 && key.2 < best_key.2)));
            if better {
                best = k;
                best_key = key;
            }
        }
        self.scratch = sc;
        self.forced += 1;
        self.unmark(set);
        let a = self.decompose(&set[..best]);
        let b = self.decompose(&set[best..]);
        self.push(SpKind::Series, vec![a, b])
    }
}

/// Check the guarantees (a)-(b) of the module doc against `g`: leaves partition the skeleton,
/// series edges go forward, no edge joins parallel children. Returns a description of the first
/// violation.
pub fn check_tree(g: &CostGraph, t: &SpTree) -> std::result::Result<(), String> {
    let n = g.len();
    let mut leaf_of = vec![usize::MAX; n];
    let leaves = t.leaves();
    for (i, &l) in leaves.iter().enumerate() {
        for &u in &t.tree[l].nodes {
            if leaf_of[u] != usize::MAX {
                return Err(format!("node '{}' in two units", g.nodes[u].name));
            }
            leaf_of[u] = i;
        }
    }
    for &u in &t.side {
        if leaf_of[u] != usize::MAX {
            return Err(format!("side node '{}' also in a unit", g.nodes[u].name));
        }
        leaf_of[u] = usize::MAX - 1;
    }
    if let Some(u) = (0..n).find(|&u| leaf_of[u] == usize::MAX) {
        return Err(format!("node '{}' in no unit", g.nodes[u].name));
    }
    // Leaf ranges of every tree node.
    let mut range = vec![(usize::MAX, 0usize); t.tree.len()];
    for (i, &l) in leaves.iter().enumerate() {
        range[l] = (i, i + 1);
    }
    fn fill(t: &SpTree, x: usize, range: &mut Vec<(usize, usize)>) -> (usize, usize) {
        if t.tree[x].kind == SpKind::Leaf {
            return range[x];
        }
        let mut r = (usize::MAX, 0);
        for &c in &t.tree[x].children {
            let cr = grow(|| fill(t, c, range));
            r = (r.0.min(cr.0), r.1.max(cr.1));
        }
        range[x] = r;
        r
    }
    fill(t, t.root, &mut range);
    for e in &g.edges {
        let (a, b) = (leaf_of[e.src], leaf_of[e.dst]);
        if a >= usize::MAX - 1 || b >= usize::MAX - 1 {
            continue;
        }
        if a > b {
            return Err(format!(
                "edge {} -> {} goes backward in the unit order",
                g.nodes[e.src].name, g.nodes[e.dst].name
            ));
        }
        // The lowest tree node containing both must not be parallel with them in distinct children.
        let mut x = t.root;
        loop {
            if t.tree[x].kind == SpKind::Leaf {
                break;
            }
            let kids = &t.tree[x].children;
            let ca = kids.iter().position(|&c| range[c].0 <= a && a < range[c].1);
            let cb = kids.iter().position(|&c| range[c].0 <= b && b < range[c].1);
            match (ca, cb) {
                (Some(i), Some(j)) if i == j => x = kids[i],
                (Some(i), Some(j)) => {
                    if t.tree[x].kind == SpKind::Parallel {
                        return Err(format!(
                            "edge {} -> {} joins two parallel branches",
                            g.nodes[e.src].name, g.nodes[e.dst].name
                        ));
                    }
                    if i > j {
                        return Err(format!(
                            "edge {} -> {} goes backward in a series",
                            g.nodes[e.src].name, g.nodes[e.dst].name
                        ));
                    }
                    break;
                }
                _ => return Err("leaf ranges are inconsistent".into()),
            }
        }
    }
    Ok(())
}

/// Assign side nodes to stages: `stage_of[n]` is set for skeleton nodes; `stage_topo` is a
/// topological order of the stages and `reach[a][b]` whether stage `a` reaches `b` (reflexive).
///
/// A side node can read skeleton values (a `Shape` of an activation), so it may not go before
/// any of its producers: its *earliest* position in `stage_topo` is the latest position of the
/// stages of its skeleton inputs (through side inputs too). Each side node goes to the deepest
/// stage (latest in `stage_topo`) at or after its earliest position that reaches all its
/// consumers' stages, else to the consumer stage earliest in `stage_topo` (when it is not before
/// the earliest position); a side node without a consumer (dead shape arithmetic, e.g. left
/// behind by `lower`'s Resize rewrite) goes to the stage at its earliest position. Every added
/// stage edge then goes forward in `stage_topo`, so the stage graph stays acyclic. (Placing a
/// consumer-less `Shape` of the last stage's output in the first stage made a cycle: the
/// simulator deadlocked with no task able to run.) The one case with no forward placement, a
/// skeleton value reaching an earlier stage's node only through side nodes, keeps the
/// consumer-side choice.
pub fn assign_side_nodes(
    g: &CostGraph,
    side: &[NodeId],
    stage_of: &mut [usize],
    stage_topo: &[usize],
    reach: &[Vec<bool>],
) {
    let mut pos = vec![0usize; stage_topo.len()];
    for (i, &s) in stage_topo.iter().enumerate() {
        pos[s] = i;
    }
    let mut is_side = vec![false; g.len()];
    for &u in side {
        is_side[u] = true;
    }
    // Earliest position of each side node: after the stages of all its skeleton inputs.
    let mut earliest = vec![0usize; g.len()];
    for &u in g.topo_order() {
        if !is_side[u] {
            continue;
        }
        earliest[u] = g
            .preds(u)
            .map(|p| {
                if is_side[p] {
                    earliest[p]
                } else if stage_of[p] < pos.len() {
                    pos[stage_of[p]]
                } else {
                    0
                }
            })
            .max()
            .unwrap_or(0);
    }
    for &u in g.topo_order().iter().rev() {
        if !is_side[u] {
            continue;
        }
        let lo = earliest[u];
        let cons: Vec<usize> = g
            .succs(u)
            .map(|v| stage_of[v])
            .filter(|&s| s != usize::MAX)
            .collect();
        let s = if cons.is_empty() {
            stage_topo.get(lo).copied().unwrap_or(0)
        } else {
            stage_topo
                .iter()
                .enumerate()
                .rev()
                .take_while(|&(i, _)| i >= lo)
                .map(|(_, &a)| a)
                .find(|&a| cons.iter().all(|&c| reach[a][c]))
                .unwrap_or_else(|| cons.iter().copied().min_by_key(|&c| pos[c]).unwrap_or(0))
        };
        stage_of[u] = s;
    }
}
