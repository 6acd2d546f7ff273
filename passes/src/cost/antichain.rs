//! Linearisation of a DAG model for the chain planners (PipeDream, DAPPLE, BaPipe).
//!
//! A pipeline stage boundary in a DAG is a *cut*: a down-set (every node before the cut, closed
//! under predecessors) followed by the rest. PipeDream (Narayanan et al., SOSP'19, §3.1 and its
//! `graph.antichain_dag()`) enumerates such cuts as **antichains**: a state is an antichain
//! (the maximal nodes of a down-set), and a stage is the difference of two comparable states'
//! down-sets, `D(j) \ D(i)`. Skips and branches then cross stage boundaries correctly, because
//! every stage is convex and the stage graph follows the state order.
//!
//! [`Linearization`] is that set of states, in a topological order of the *state DAG*, with for
//! every state its down-set (a node bitset) and its ancestor states, so a DP can consider every
//! split `k → j` with `k` an ancestor of `j`. Two constructions:
//! - [`Linearization::antichain_dag`]: PipeDream's construction, reproduced step for step
//!   (augmented antichains, one-node advances, de-augmentation, BFS from the first source, then a
//!   depth-first topological sort), so a planner on it sees exactly the states PipeDream's
//!   optimizer sees. It can blow up on very wide graphs, so it takes a state budget.
//! - [`Linearization::topo_chain`]: the prefixes of the graph's topological order, coarsened to at
//!   most a given number of positions (a chain: state `k` is an ancestor of every later state).
//!   Always small; used when the antichain DAG exceeds its budget (models with thousands of ops).
//!
//! [`Linearization::for_graph`] tries the first and falls back to the second.
//!
//! [`Cuts`] is the form the DAPPLE search uses: a family of down-sets (the antichain DAG's states
//! together with given prefixes of the topological order), sorted by size, where a stage is
//! `D(j) \ D(i)` for any nested pair `D(i) ⊊ D(j)`, with per-position prefix sums ([`CutSums`]).
//!
//! Nodes can be *excluded* (PipeDream drops `Input*` sources and `__getitem__` sinks before
//! building the states); excluded nodes are in no down-set and the planner places them itself.

use super::{CostGraph, NodeId};
use std::collections::HashMap;

/// A fixed-size bitset.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BitSet(Vec<u64>);

impl BitSet {
    /// An empty set over `0..n`.
    pub fn new(n: usize) -> BitSet {
        BitSet(vec![0; n.div_ceil(64)])
    }
    /// Insert `i`.
    pub fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    /// Remove `i`.
    pub fn remove(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    /// Whether `i` is in the set.
    pub fn contains(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 == 1
    }
    /// In-place union.
    pub fn union_with(&mut self, o: &BitSet) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a |= b;
        }
    }
    /// Whether the sets share an element.
    pub fn intersects(&self, o: &BitSet) -> bool {
        self.0.iter().zip(&o.0).any(|(a, b)| a & b != 0)
    }
    /// The elements, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &bits)| {
            let mut b = bits;
            std::iter::from_fn(move || {
                if b == 0 {
                    return None;
                }
                let t = b.trailing_zeros() as usize;
                b &= b - 1;
                Some(w * 64 + t)
            })
        })
    }
    /// Number of elements.
    pub fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    /// Whether every element of `self` is in `o`.
    pub fn is_subset(&self, o: &BitSet) -> bool {
        self.0.iter().zip(&o.0).all(|(a, b)| a & !b == 0)
    }
}

/// How [`Linearization::antichain_dag_ordered`] numbers the states (a depth-first topological
/// sort either way: reverse post-order, roots in the state table's order, i.e. first appearance
/// in an edge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateOrder {
    /// Successors in the order their edges were found (pipec's PipeDream planner).
    PipeDream,
    /// Roots and successors stably sorted by the module description (`op`) of the first node of
    /// the state's antichain, as `Graph.topological_sort` in HPGO's importer does
    /// (`--dapple-reference hpgo`).
    Descriptions,
}

/// One state: a cut of the graph.
#[derive(Clone, Debug)]
pub struct State {
    /// The nodes that define the state (for the antichain DAG: PipeDream's *augmented* antichain,
    /// the antichain plus the predecessors that still feed a node outside the down-set; for a
    /// chain: the last node of the prefix).
    pub antichain: Vec<NodeId>,
    /// The down-set: every node at or before the cut.
    pub down: BitSet,
}

/// Cut candidates of a DAG, in a topological order of the state DAG. See the module doc.
#[derive(Clone, Debug)]
pub struct Linearization {
    /// States in topological order; the last one's down-set holds every included node.
    pub states: Vec<State>,
    /// `ancestors[j]`: the states from which `j` is reachable (strict), ascending.
    ancestors: Vec<Vec<u32>>,
    ancestor_bits: Vec<BitSet>,
    /// Nodes in no state (see the module doc).
    pub excluded: Vec<bool>,
    /// True for the antichain DAG, false for the coarsened topological chain.
    pub is_antichain_dag: bool,
}

/// Transitive predecessor and successor sets (strict) of the included nodes.
fn closures(g: &CostGraph, excluded: &[bool]) -> (Vec<BitSet>, Vec<BitSet>) {
    let n = g.len();
    let mut pred = vec![BitSet::new(n); n];
    for &u in g.topo_order() {
        if excluded[u] {
            continue;
        }
        let mut p = BitSet::new(n);
        for v in g.preds(u).filter(|&v| !excluded[v]) {
            p.insert(v);
            p.union_with(&pred[v]);
        }
        pred[u] = p;
    }
    let mut succ = vec![BitSet::new(n); n];
    for &u in g.topo_order().iter().rev() {
        if excluded[u] {
            continue;
        }
        let mut s = BitSet::new(n);
        for v in g.succs(u).filter(|&v| !excluded[v]) {
            s.insert(v);
            s.union_with(&succ[v]);
        }
        succ[u] = s;
    }
    (pred, succ)
}

impl Linearization {
    /// Number of states.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// True when there is no state.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// The strict ancestors of state `j` in the state DAG, ascending.
    pub fn ancestors(&self, j: usize) -> &[u32] {
        &self.ancestors[j]
    }

    /// Whether state `k` is a strict ancestor of state `j`.
    pub fn is_ancestor(&self, k: usize, j: usize) -> bool {
        self.ancestor_bits[j].contains(k)
    }

    /// `out[j] = Σ_{n ∈ D(j)} f(n)` for every state: the down-set sums the DPs take differences of.
    pub fn down_sums(&self, f: impl Fn(NodeId) -> f64) -> Vec<f64> {
        self.states
            .iter()
            .map(|s| s.down.iter().map(&f).sum())
            .collect()
    }

    /// `out[j] = Σ_{n ∈ antichain(j)} f(n)` (PipeDream's `output_activation_size` of a state).
    pub fn antichain_sums(&self, f: impl Fn(NodeId) -> f64) -> Vec<f64> {
        self.states
            .iter()
            .map(|s| s.antichain.iter().map(|&n| f(n)).sum())
            .collect()
    }

    fn finish(
        states: Vec<State>,
        preds: Vec<Vec<usize>>,
        excluded: Vec<bool>,
        is_antichain_dag: bool,
    ) -> Linearization {
        let s = states.len();
        let mut ancestor_bits: Vec<BitSet> = Vec::with_capacity(s);
        for ps in &preds {
            let mut b = BitSet::new(s);
            for &p in ps {
                b.insert(p);
                b.union_with(&ancestor_bits[p]);
            }
            ancestor_bits.push(b);
        }
        let ancestors = ancestor_bits
            .iter()
            .map(|b| b.iter().map(|k| k as u32).collect())
            .collect();
        Linearization {
            states,
            ancestors,
            ancestor_bits,
            excluded,
            is_antichain_dag,
        }
    }

    /// PipeDream's antichain DAG of `g` without the `excluded` nodes, or `None` when it has more
    /// than `max_states` states (or no node is included).
    ///
    /// Construction (PipeDream's `Graph.antichain_dag`): start from the antichain holding the
    /// first source (lowest node index); *augment* an antichain `A` with every strict predecessor
    /// `p` of some `a ∈ A` that has an out-edge to a node that is neither `a` nor a predecessor of
    /// `a`; each next antichain replaces one augmented node `x` by an out-neighbour `y ∉ A` none
    /// of whose successors is in the augmented set, then drops every node that has a successor in
    /// the set. States are visited breadth-first and numbered by a depth-first topological sort.
    pub fn antichain_dag(
        g: &CostGraph,
        excluded: &[bool],
        max_states: usize,
    ) -> Option<Linearization> {
        Linearization::antichain_dag_ordered(g, excluded, max_states, StateOrder::PipeDream)
    }

    /// [`Linearization::antichain_dag`] with the states numbered by `order`.
    pub fn antichain_dag_ordered(
        g: &CostGraph,
        excluded: &[bool],
        max_states: usize,
        order_by: StateOrder,
    ) -> Option<Linearization> {
        let n = g.len();
        let (pred, succ) = closures(g, excluded);
        let first = (0..n).find(|&u| !excluded[u] && g.preds(u).all(|v| excluded[v]))?;
        let out: Vec<Vec<NodeId>> = (0..n)
            .map(|u| g.succs(u).filter(|&v| !excluded[v]).collect())
            .collect();
        let key = |a: &[NodeId]| {
            let mut b = BitSet::new(n);
            for &x in a {
                b.insert(x);
            }
            b
        };
        let augment = |a: &[NodeId]| -> Vec<NodeId> {
            let mut extra = BitSet::new(n);
            for &x in a {
                for p in pred[x].iter() {
                    if out[p].iter().any(|&o| o != x && !pred[x].contains(o)) {
                        extra.insert(p);
                    }
                }
            }
            let mut v: Vec<NodeId> = extra.iter().collect();
            v.extend_from_slice(a);
            v
        };
        let deaugment = |aug: &[NodeId]| -> Vec<NodeId> {
            let mut set = BitSet::new(n);
            for &x in aug {
                set.insert(x);
            }
            let mut res: Vec<NodeId> = Vec::new();
            for &x in aug {
                if !succ[x].intersects(&set) && !res.contains(&x) {
                    res.push(x);
                }
            }
            res
        };
        // States in order of creation; `aug[s]` its augmented antichain.
        let mut ids: HashMap<BitSet, usize> = HashMap::new();
        let mut antichains: Vec<Vec<NodeId>> = vec![vec![first]];
        let mut augs: Vec<Vec<NodeId>> = vec![augment(&[first])];
        ids.insert(key(&[first]), 0);
        let mut expanded = vec![false];
        // Edges (from, to) in insertion order; node order of first appearance in an edge.
        let mut edges: Vec<(usize, usize)> = Vec::new();
        let mut queue = std::collections::VecDeque::from([0usize]);
        while let Some(s) = queue.pop_front() {
            if expanded[s] {
                continue;
            }
            expanded[s] = true;
            let a = antichains[s].clone();
            let aug = augs[s].clone();
            let mut aug_set = BitSet::new(n);
            for &x in &aug {
                aug_set.insert(x);
            }
            for &x in &aug {
                for &y in &out[x] {
                    if a.contains(&y) || succ[y].intersects(&aug_set) {
                        continue;
                    }
                    let replaced: Vec<NodeId> =
                        aug.iter().map(|&z| if z == x { y } else { z }).collect();
                    let next = deaugment(&replaced);
                    let k = key(&next);
                    let t = match ids.get(&k) {
                        Some(&t) => t,
                        None => {
                            let t = antichains.len();
                            if t >= max_states {
                                return None;
                            }
                            ids.insert(k, t);
                            augs.push(augment(&next));
                            antichains.push(next);
                            expanded.push(false);
                            t
                        }
                    };
                    edges.push((s, t));
                    queue.push_back(t);
                }
            }
        }
        let s_count = antichains.len();
        // Node order of the DAG's node table: first appearance in `add_edge(from, to)`.
        let mut order: Vec<usize> = Vec::with_capacity(s_count);
        let mut seen = vec![false; s_count];
        for &(a, b) in &edges {
            for x in [a, b] {
                if !std::mem::replace(&mut seen[x], true) {
                    order.push(x);
                }
            }
        }
        if order.is_empty() {
            order.push(0);
        }
        let mut adj = vec![Vec::new(); s_count];
        for &(a, b) in &edges {
            adj[a].push(b);
        }
        if order_by == StateOrder::Descriptions {
            // HPGO's importer: roots and successors stably sorted by the module description of
            // the first node of each state's antichain.
            let desc = |s: usize| g.nodes[antichains[s][0]].op.as_str();
            order.sort_by(|&a, &b| desc(a).cmp(desc(b)));
            for v in &mut adj {
                v.sort_by(|&a, &b| desc(a).cmp(desc(b)));
            }
        }
        // Depth-first topological sort: reverse post-order, roots in table order.
        let mut marked = vec![false; s_count];
        let mut post: Vec<usize> = Vec::with_capacity(s_count);
        for &root in &order {
            if marked[root] {
                continue;
            }
            marked[root] = true;
            let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
            while let Some(top) = stack.last_mut() {
                let (u, i) = *top;
                if i < adj[u].len() {
                    top.1 += 1;
                    let v = adj[u][i];
                    if !marked[v] {
                        marked[v] = true;
                        stack.push((v, 0));
                    }
                } else {
                    post.push(u);
                    stack.pop();
                }
            }
        }
        post.reverse();
        let mut pos = vec![0usize; s_count];
        for (i, &s) in post.iter().enumerate() {
            pos[s] = i;
        }
        let mut preds = vec![Vec::new(); s_count];
        for &(a, b) in &edges {
            preds[pos[b]].push(pos[a]);
        }
        for p in &mut preds {
            p.sort_unstable();
            p.dedup();
        }
        let states = post
            .iter()
            .map(|&s| {
                let mut down = BitSet::new(n);
                for &x in &augs[s] {
                    down.insert(x);
                    down.union_with(&pred[x]);
                }
                State {
                    antichain: augs[s].clone(),
                    down,
                }
            })
            .collect();
        Some(Linearization::finish(
            states,
            preds,
            excluded.to_vec(),
            true,
        ))
    }

    /// The prefixes of `g`'s topological order (without the `excluded` nodes) as a chain of
    /// states, coarsened to at most `max_positions` states by cutting only where the running
    /// `weight` (e.g. compute time) crosses a multiple of `total / max_positions`; zero-weight
    /// nodes never end a state on their own. Every state is an ancestor of every later one.
    pub fn topo_chain(
        g: &CostGraph,
        excluded: &[bool],
        max_positions: usize,
        weight: impl Fn(NodeId) -> f64,
    ) -> Linearization {
        let n = g.len();
        let order: Vec<NodeId> = g
            .topo_order()
            .iter()
            .copied()
            .filter(|&u| !excluded[u])
            .collect();
        let total: f64 = order.iter().map(|&u| weight(u)).sum();
        let cap = max_positions.max(1);
        let mut ends: Vec<usize> = Vec::new();
        if order.len() <= cap {
            ends = (1..=order.len()).collect();
        } else {
            let step = total / cap as f64;
            let mut acc = 0.0;
            let mut next = step;
            for (i, &u) in order.iter().enumerate() {
                acc += weight(u);
                if acc >= next && i + 1 < order.len() {
                    ends.push(i + 1);
                    while next <= acc {
                        next += step;
                    }
                }
            }
            ends.push(order.len());
        }
        let mut states = Vec::with_capacity(ends.len());
        let mut down = BitSet::new(n);
        let mut at = 0;
        for &e in &ends {
            for &u in &order[at..e] {
                down.insert(u);
            }
            at = e;
            states.push(State {
                antichain: vec![order[e - 1]],
                down: down.clone(),
            });
        }
        let preds = (0..states.len())
            .map(|j| if j == 0 { vec![] } else { vec![j - 1] })
            .collect();
        Linearization::finish(states, preds, excluded.to_vec(), false)
    }

    /// The antichain DAG when it has at most `max_states` states, else the topological chain
    /// coarsened to `max_states` positions by `weight`.
    pub fn for_graph(
        g: &CostGraph,
        excluded: &[bool],
        max_states: usize,
        weight: impl Fn(NodeId) -> f64,
    ) -> Linearization {
        Linearization::antichain_dag(g, excluded, max_states)
            .unwrap_or_else(|| Linearization::topo_chain(g, excluded, max_states, weight))
    }

    /// A topological order of every node of `g` through the longest chain of nested states
    /// `D(s_1) ⊊ D(s_2) ⊊ ...` (ties: the least summed `cut_bytes` of its states), each step's
    /// new nodes in [`CostGraph::topo_order`], excluded and leftover nodes last: every state of
    /// the chain is a prefix of the order, so a chain planner cutting it (BaPipe) has the
    /// antichain states among its cut candidates.
    pub fn chain_order(&self, g: &CostGraph, cut_bytes: impl Fn(usize) -> f64) -> Vec<NodeId> {
        let s = self.states.len();
        // (states on the longest chain ending at j, −summed cut bytes), predecessor.
        let mut best: Vec<(usize, f64)> = Vec::with_capacity(s);
        let mut prev: Vec<Option<usize>> = vec![None; s];
        for (j, pj) in prev.iter_mut().enumerate() {
            let mut b = (1usize, -cut_bytes(j));
            for &k in self.ancestors(j) {
                let k = k as usize;
                let c = (best[k].0 + 1, best[k].1 - cut_bytes(j));
                if c.0 > b.0 || (c.0 == b.0 && c.1 > b.1) {
                    b = c;
                    *pj = Some(k);
                }
            }
            best.push(b);
        }
        let mut path = Vec::new();
        let mut at = (0..s).max_by(|&a, &b| {
            best[a]
                .0
                .cmp(&best[b].0)
                .then(best[a].1.total_cmp(&best[b].1))
                .then(b.cmp(&a))
        });
        while let Some(j) = at {
            path.push(j);
            at = prev[j];
        }
        path.reverse();
        let n = g.len();
        let mut placed = vec![false; n];
        let mut order = Vec::with_capacity(n);
        for &j in &path {
            for &u in g.topo_order() {
                if !placed[u] && self.states[j].down.contains(u) {
                    placed[u] = true;
                    order.push(u);
                }
            }
        }
        for &u in g.topo_order() {
            if !placed[u] {
                order.push(u);
            }
        }
        order
    }

    /// The nodes of `D(b) \ D(a)` (`a = None`: all of `D(b)`), ascending.
    pub fn nodes_between(&self, a: Option<usize>, b: usize) -> Vec<NodeId> {
        self.states[b]
            .down
            .iter()
            .filter(|&x| a.is_none_or(|a| !self.states[a].down.contains(x)))
            .collect()
    }
}

/// The stage of every node when stage `s` ends at state `ends[s]` (increasing state indices):
/// each stage takes the nodes of its end state's down-set that no earlier stage took; nodes in
/// no down-set (excluded inputs and sources) go to the first stage, anything else left over to
/// the stage of its latest producer.
pub fn stage_of_nodes(g: &CostGraph, lin: &Linearization, ends: &[usize]) -> Vec<usize> {
    let mut stage_of = vec![usize::MAX; g.len()];
    for (s, &end) in ends.iter().enumerate() {
        for x in lin.states[end].down.iter() {
            if stage_of[x] == usize::MAX {
                stage_of[x] = s;
            }
        }
    }
    for &u in g.topo_order() {
        if stage_of[u] == usize::MAX {
            stage_of[u] = if g.nodes[u].is_input || g.preds(u).next().is_none() {
                0
            } else {
                g.preds(u).map(|p| stage_of[p]).max().unwrap_or(0)
            };
        }
    }
    stage_of
}

/// Cut candidates for planners that cut a DAG into a sequence of stages `D(p_1) \ D(p_0)`,
/// `D(p_2) \ D(p_1)`, ... with nested down-sets `∅ = D(p_0) ⊊ D(p_1) ⊊ ... ⊊ D(p_k) = V`
/// (DAPPLE, §4: "contiguous" stages of a DAG). Positions are sorted by down-set size, so `i < j`
/// whenever `D(i) ⊊ D(j)`; position 0 is `∅`, the last is every node. Every stage such a sequence
/// defines is convex (a difference of two down-sets), so skips and branches cross stage
/// boundaries correctly, and the bytes crossing a boundary are those leaving `D(p)` ([`CutSums`]).
#[derive(Clone, Debug)]
pub struct Cuts {
    /// The down-set of every position.
    pub down: Vec<BitSet>,
    /// `below[j]`: the positions `i` with `D(i) ⊊ D(j)`.
    below: Vec<BitSet>,
    /// How many positions are antichain-DAG states (0 when the DAG was over its budget).
    pub antichain_states: usize,
    /// `boundary[p]`: the nodes of `D(p)` with a successor outside it (whose output crosses the
    /// cut); with `params` (of `D(p)`) the parts of [`Cuts::sums`] that do not depend on the
    /// batch, computed once.
    boundary: Vec<Vec<NodeId>>,
    params: Vec<f64>,
}

/// Prefix sums over the positions of a [`Cuts`] family at one batch and device kind: the same
/// figures as [`super::Chain`], with `[i, j)` meaning `D(j) \ D(i)` (valid when
/// [`Cuts::valid`]`(i, j)`).
#[derive(Clone, Debug)]
pub struct CutSums {
    pub fwd: Vec<f64>,
    pub bwd: Vec<f64>,
    pub params: Vec<f64>,
    pub saved: Vec<f64>,
    /// Bytes leaving `D(p)` (every output of a node in `D(p)` read outside it, once per node).
    pub cut: Vec<f64>,
}

impl CutSums {
    /// The last position (positions are `0..=len()`, as for [`super::Chain`]).
    pub fn len(&self) -> usize {
        self.fwd.len().saturating_sub(1)
    }
    /// True when there is no node.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Forward + backward seconds of `D(j) \ D(i)`.
    pub fn compute(&self, i: usize, j: usize) -> f64 {
        (self.fwd[j] - self.fwd[i]) + (self.bwd[j] - self.bwd[i])
    }
    /// Parameter bytes of `D(j) \ D(i)`.
    pub fn parameter_bytes(&self, i: usize, j: usize) -> f64 {
        self.params[j] - self.params[i]
    }
    /// Saved activation bytes of `D(j) \ D(i)`.
    pub fn saved_bytes(&self, i: usize, j: usize) -> f64 {
        self.saved[j] - self.saved[i]
    }
}

impl Cuts {
    /// The antichain DAG's states of `g` (no node excluded) when there are at most
    /// `max_antichain_states`, together with the prefixes of [`CostGraph::topo_order`] of the
    /// given lengths, plus `∅` and every node; duplicates removed, sorted by size (ties: the
    /// antichain states first, in their order, then the prefixes).
    pub fn new(g: &CostGraph, topo_prefixes: &[usize], max_antichain_states: usize) -> Cuts {
        let n = g.len();
        let mut sets: Vec<BitSet> = vec![BitSet::new(n)];
        let mut antichain_states = 0;
        if let Some(lin) = Linearization::antichain_dag(g, &vec![false; n], max_antichain_states) {
            for st in &lin.states {
                // Only predecessor-closed sets are cuts.
                if st
                    .down
                    .iter()
                    .all(|u| g.preds(u).all(|v| st.down.contains(v)))
                {
                    sets.push(st.down.clone());
                    antichain_states += 1;
                }
            }
        }
        let order = g.topo_order();
        for &len in topo_prefixes {
            let mut d = BitSet::new(n);
            for &u in &order[..len.min(n)] {
                d.insert(u);
            }
            sets.push(d);
        }
        let mut all = BitSet::new(n);
        for u in 0..n {
            all.insert(u);
        }
        sets.push(all);
        let mut seen: std::collections::HashSet<BitSet> = Default::default();
        let mut uniq: Vec<(usize, usize, BitSet)> = Vec::with_capacity(sets.len());
        for (i, d) in sets.into_iter().enumerate() {
            if seen.insert(d.clone()) {
                uniq.push((d.count(), i, d));
            }
        }
        uniq.sort_by_key(|(c, i, _)| (*c, *i));
        let down: Vec<BitSet> = uniq.into_iter().map(|(_, _, d)| d).collect();
        let p = down.len();
        let below = (0..p)
            .map(|j| {
                let mut b = BitSet::new(p);
                for (i, d) in down.iter().enumerate().take(j) {
                    if d.is_subset(&down[j]) {
                        b.insert(i);
                    }
                }
                b
            })
            .collect();
        let boundary = down
            .iter()
            .map(|d| {
                d.iter()
                    .filter(|&u| g.succs(u).any(|v| !d.contains(v)))
                    .collect()
            })
            .collect();
        let params = down
            .iter()
            .map(|d| d.iter().fold(0.0, |a, u| a + g.nodes[u].parameter_bytes))
            .collect();
        Cuts {
            down,
            below,
            antichain_states,
            boundary,
            params,
        }
    }

    /// Number of positions (`∅` and the full set included).
    pub fn positions(&self) -> usize {
        self.down.len()
    }

    /// The last position (every node).
    pub fn last(&self) -> usize {
        self.down.len() - 1
    }

    /// Whether `D(i) ⊊ D(j)`, i.e. `[i, j)` is a stage.
    pub fn valid(&self, i: usize, j: usize) -> bool {
        self.below[j].contains(i)
    }

    /// The nodes of `D(j) \ D(i)`, ascending.
    pub fn nodes(&self, i: usize, j: usize) -> Vec<NodeId> {
        self.down[j]
            .iter()
            .filter(|&u| !self.down[i].contains(u))
            .collect()
    }

    /// Prefix sums at `batch` samples on `kind`.
    pub fn sums(&self, g: &CostGraph, batch: f64, kind: &super::DeviceKind) -> CutSums {
        let n = g.len();
        let s = g.scale(batch);
        let per: Vec<(f64, f64)> = (0..n).map(|u| g.times(u, batch, kind)).collect();
        let out_bytes: Vec<f64> = (0..n)
            .map(|u| {
                g.out_edges(u)
                    .iter()
                    .map(|&e| g.edges[e].bytes)
                    .fold(0.0, f64::max)
                    * s
            })
            .collect();
        let p = self.down.len();
        let mut out = CutSums {
            fwd: Vec::with_capacity(p),
            bwd: Vec::with_capacity(p),
            params: Vec::with_capacity(p),
            saved: Vec::with_capacity(p),
            cut: Vec::with_capacity(p),
        };
        for (p, d) in self.down.iter().enumerate() {
            let (mut f, mut b, mut sa) = (0.0, 0.0, 0.0);
            for u in d.iter() {
                f += per[u].0;
                b += per[u].1;
                sa += g.nodes[u].saved_bytes * s + g.nodes[u].saved_fixed_bytes;
            }
            out.fwd.push(f);
            out.bwd.push(b);
            out.params.push(self.params[p]);
            out.saved.push(sa);
            out.cut
                .push(self.boundary[p].iter().fold(0.0, |c, &u| c + out_bytes[u]));
        }
        out
    }
}

/// PipeDream's exclusions: `Input*` sources (pinned to the first stage) and sinks whose module is
/// `__getitem__` (unused outputs of multi-output nodes).
pub fn pipedream_exclusions(g: &CostGraph) -> Vec<bool> {
    (0..g.len())
        .map(|u| {
            let node = &g.nodes[u];
            let source = g.preds(u).next().is_none();
            let sink = g.succs(u).next().is_none();
            (source && (node.is_input || node.op.trim_start().starts_with("Input")))
                || (sink && node.op.trim_start().starts_with("__getitem__"))
        })
        .collect()
}
