//! Graph analyses shared by the CLI and passes.

use crate::ir::{Graph, Op, ValueDef};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Ops on some path from a graph input to a graph output (constant side computations and dead
/// ops are left out).
pub fn ops_on_io_paths(g: &Graph) -> Vec<Op> {
    let uses = g.uses();
    // forward reachability from graph inputs
    let mut fwd: HashSet<Op> = HashSet::new();
    for &op in &g.order {
        let from_input = g.ops[op]
            .inputs
            .iter()
            .flatten()
            .any(|v| match g.values[*v].def {
                ValueDef::Input(_) => true,
                ValueDef::Result(p, _) => fwd.contains(&p),
                ValueDef::Initializer => false,
            });
        if from_input {
            fwd.insert(op);
        }
    }
    // backward reachability from graph outputs
    let mut bwd: HashSet<Op> = HashSet::new();
    let outs: HashSet<_> = g.outputs.iter().copied().collect();
    for &op in g.order.iter().rev() {
        let reaches = g.ops[op]
            .outputs
            .iter()
            .any(|v| outs.contains(v) || uses[*v].iter().any(|(u, _)| bwd.contains(u)));
        if reaches {
            bwd.insert(op);
        }
    }
    g.order
        .iter()
        .copied()
        .filter(|o| fwd.contains(o) && bwd.contains(o))
        .collect()
}

/// Whether the op graph between the graph inputs and outputs is two-terminal series-parallel
/// (GraphPipe §4.1: every subgraph has a unique source and sink; a series split joins the sink of
/// one part to the source of the next, a parallel split shares both).
///
/// Method: each op `v` becomes an edge `v.in -> v.out` (node splitting turns the vertex form into
/// the edge form), a super-source feeds every op reading a graph input and every op producing a
/// graph output feeds a super-sink. The multigraph is TTSP iff repeated series reductions (a
/// vertex with one in- and one out-neighbour is replaced by an edge) and parallel reductions
/// (duplicate edges merged) leave the single edge source -> sink (Valdes, Tarjan & Lawler 1982).
pub fn is_series_parallel(g: &Graph) -> bool {
    let ops = ops_on_io_paths(g);
    if ops.is_empty() {
        return true;
    }
    let idx: HashMap<Op, usize> = ops.iter().enumerate().map(|(i, o)| (*o, i)).collect();
    let n = ops.len();
    // node ids: 0 = source, 1 = sink, 2+2i = op i in, 3+2i = op i out
    let (src, snk) = (0usize, 1usize);
    let total = 2 + 2 * n;
    let mut succ: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); total];
    let mut pred: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); total];
    let mut add = |a: usize, b: usize, succ: &mut Vec<BTreeSet<usize>>| {
        succ[a].insert(b);
        pred[b].insert(a);
    };
    let outs: HashSet<_> = g.outputs.iter().copied().collect();
    for (i, &op) in ops.iter().enumerate() {
        add(2 + 2 * i, 3 + 2 * i, &mut succ);
        for v in g.ops[op].inputs.iter().flatten() {
            match g.values[*v].def {
                ValueDef::Input(_) => add(src, 2 + 2 * i, &mut succ),
                ValueDef::Result(p, _) => {
                    if let Some(&j) = idx.get(&p) {
                        add(3 + 2 * j, 2 + 2 * i, &mut succ);
                    }
                }
                ValueDef::Initializer => {}
            }
        }
        if g.ops[op].outputs.iter().any(|v| outs.contains(v)) {
            add(3 + 2 * i, snk, &mut succ);
        }
    }
    // An op reading a graph input must still hang off the source even if it also reads other ops.
    let mut alive = vec![true; total];
    let mut work: Vec<usize> = (2..total).collect();
    while let Some(x) = work.pop() {
        if !alive[x] || pred[x].len() != 1 || succ[x].len() != 1 {
            continue;
        }
        let p = *pred[x].iter().next().unwrap_or(&src);
        let s = *succ[x].iter().next().unwrap_or(&snk);
        alive[x] = false;
        succ[p].remove(&x);
        pred[s].remove(&x);
        succ[x].clear();
        pred[x].clear();
        // the set insert is the parallel reduction
        succ[p].insert(s);
        pred[s].insert(p);
        if p >= 2 {
            work.push(p);
        }
        if s >= 2 {
            work.push(s);
        }
    }
    let remaining = alive.iter().skip(2).filter(|a| **a).count();
    remaining == 0 && succ[src].len() == 1 && succ[src].contains(&snk)
}
