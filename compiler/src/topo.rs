//! The project's one topological sort: Kahn's algorithm that always takes the lowest-numbered
//! ready node.
//!
//! That rule makes the order the lexicographically smallest topological order, a function of
//! the graph alone: the same whatever order the successor lists are in and however often an edge
//! repeats. The IR's op order, the cost graph's node order and the stage DAGs' orders all come
//! from it, so a graph that is already in topological order keeps its order, and textual IR,
//! snapshots, plans and programs are deterministic. (`petgraph::algo::toposort` is a depth-first
//! search: its order differs, e.g. `[1, 0, 2]` for the edge `0 → 2` beside an isolated `1`,
//! and it names another node of a cycle.)

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A graph with a cycle: the nodes ordered before the sort got stuck, and the lowest-numbered
/// node left (on a cycle, or after one). Which nodes get ordered does not depend on the order
/// ties are taken in, so `stuck` is a property of the graph too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cycle {
    pub partial: Vec<usize>,
    pub stuck: usize,
}

/// The topological order of nodes `0..n`, each node's successors given by `succs` (repeated
/// edges count as often as they appear): among the nodes whose predecessors are all placed,
/// the lowest-numbered comes next. `O((n + e) log n)`.
pub fn topo_order<I>(n: usize, succs: impl Fn(usize) -> I) -> Result<Vec<usize>, Cycle>
where
    I: IntoIterator<Item = usize>,
{
    let mut indeg = vec![0usize; n];
    for u in 0..n {
        for v in succs(u) {
            indeg[v] += 1;
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&u| indeg[u] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(u)) = ready.pop() {
        order.push(u);
        for v in succs(u) {
            indeg[v] -= 1;
            if indeg[v] == 0 {
                ready.push(Reverse(v));
            }
        }
    }
    match (0..n).find(|&u| indeg[u] > 0) {
        None => Ok(order),
        Some(stuck) => Err(Cycle {
            partial: order,
            stuck,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(succ: &[Vec<usize>]) -> Result<Vec<usize>, Cycle> {
        topo_order(succ.len(), |u| succ[u].iter().copied())
    }

    #[test]
    fn lowest_ready_first() {
        // 0 → 2 beside an isolated 1: [0, 1, 2] (a depth-first sort gives [1, 0, 2]).
        assert_eq!(order(&[vec![2], vec![], vec![]]), Ok(vec![0, 1, 2]));
        // 3 → 0, 2 → 1: ready {2, 3} then 1 is ready before 3 is taken.
        assert_eq!(
            order(&[vec![], vec![], vec![1], vec![0]]),
            Ok(vec![2, 1, 3, 0])
        );
        // Successor order and repeated edges do not matter.
        assert_eq!(
            order(&[vec![3, 1, 1], vec![2], vec![], vec![2]]),
            order(&[vec![1, 3], vec![2, 2], vec![], vec![2]])
        );
        assert_eq!(order(&[]), Ok(vec![]));
    }

    #[test]
    fn cycles_name_the_lowest_stuck_node() {
        // 0 → 1 → 2 → 1, 3 after 2.
        let e = order(&[vec![1], vec![2], vec![1, 3], vec![]]).unwrap_err();
        assert_eq!(
            e,
            Cycle {
                partial: vec![0],
                stuck: 1
            }
        );
        // A self-loop.
        let e = order(&[vec![], vec![1]]).unwrap_err();
        assert_eq!(
            e,
            Cycle {
                partial: vec![0],
                stuck: 1
            }
        );
    }
}
