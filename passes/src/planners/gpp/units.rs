//! GraphPipe's units (Jeon et al., ASPLOS'25, §5): the series-parallel decomposition tree
//! ([`super::sp_tree`]) over ranges of units, the coarsened nodes the partitioner's DP
//! ([`super::dp`]) cuts into stages, and the unit graph's edges.

use super::sp_tree::{SpKind, SpTree};
use crate::cost::{CostGraph, NodeId};

/// The most units a search takes: its stage tables hold every unit range (`(U + 1)²` entries
/// per power-of-two replica count). The planner's coarsening stays below it.
pub const MAX_DP_UNITS: usize = 1024;

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
                        .map(|&c| super::sp_tree::grow(|| build(sp, c, next, out)))
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
