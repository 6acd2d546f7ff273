//! GraphPipe's `ComputeInFlight` (Jeon et al., ASPLOS'25, Appendix A.1): how many samples each
//! stage of a stage DAG keeps in flight, given every stage's micro-batch size `b_s` and `k_s` (of
//! `k_sFk_sB`), computed sinks first. The simulator's GPP schedules
//! ([`crate::sim::schedule`]), the partitioner's DP ([`crate::planners::gpp::dp`]) and the
//! `schedule-gpp` pass ([`crate::graphpipe::schedule_gpp`], which documents the rules) all use it; it
//! depends on nothing else in the crate, so the simulator does not depend on a pass.

/// Appendix A.1's table: in-flight **samples** of stage `x` (micro-batch `bx`, `kx`F`kx`B) given
/// its successor `y` (micro-batch `by`, `ky`F`ky`B, `iy` in-flight samples).
pub fn compute_in_flight(kx: u64, bx: u64, ky: u64, by: u64, iy: u64) -> u64 {
    let (kxbx, kyby) = (kx * bx, ky * by);
    let m = bx.max(by);
    if m < kxbx && kxbx < kyby {
        iy + 2 * m
    } else if m == kxbx && kxbx < kyby {
        iy + m
    } else if bx <= by && by < kyby && kyby < kxbx {
        iy + kxbx - kyby + 2 * by
    } else if bx <= by && by == kyby && kyby < kxbx {
        iy + kxbx
    } else if by <= bx && bx < kyby && kyby < kxbx {
        iy + kxbx - kyby + 2 * bx
    } else if by <= bx && bx == kyby && kyby < kxbx {
        iy + kxbx
    } else if m == kyby && kyby == kxbx {
        iy + kyby
    } else if m < kyby && kyby == kxbx {
        iy + 2 * m
    } else if bx <= kxbx && kxbx < by && by <= kyby {
        iy + by
    } else {
        // b_y <= k_y b_y < b_x <= k_x b_x (the last row; also the fallback)
        (iy + kxbx + bx).saturating_sub(kyby)
    }
}

/// In-flight samples per stage of the stage DAG `succ` (successor lists), with micro-batch `b[s]`
/// and `k[s]` per stage, computed in reverse topological order; sinks hold `k·b`.
pub fn in_flight_samples(succ: &[Vec<usize>], b: &[u64], k: &[u64]) -> Vec<u64> {
    let order = reverse_topo(succ);
    let mut i = vec![0u64; succ.len()];
    for &x in &order {
        i[x] = if succ[x].is_empty() {
            k[x] * b[x]
        } else {
            succ[x]
                .iter()
                .map(|&y| compute_in_flight(k[x], b[x], k[y], b[y], i[y]))
                .max()
                .unwrap_or(0)
        };
    }
    i
}

/// `argmin_k max_y ComputeInFlight(k, b_x, k_y, b_y, i_y)` over `candidates` (ties: smaller k).
pub fn choose_k(bx: u64, succs: &[(u64, u64, u64)], candidates: &[u64]) -> u64 {
    candidates
        .iter()
        .copied()
        .min_by_key(|&kx| {
            (
                succs
                    .iter()
                    .map(|&(ky, by, iy)| compute_in_flight(kx, bx, ky, by, iy))
                    .max()
                    .unwrap_or(kx * bx),
                kx,
            )
        })
        .unwrap_or(1)
}

/// Stages in reverse topological order (sinks first) of a DAG given by successor lists.
pub fn reverse_topo(succ: &[Vec<usize>]) -> Vec<usize> {
    let n = succ.len();
    let mut outdeg: Vec<usize> = succ.iter().map(Vec::len).collect();
    let mut pred = vec![Vec::new(); n];
    for (s, ss) in succ.iter().enumerate() {
        for &t in ss {
            pred[t].push(s);
        }
    }
    let mut stack: Vec<usize> = (0..n).filter(|&s| outdeg[s] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(s) = stack.pop() {
        order.push(s);
        for &p in &pred[s] {
            outdeg[p] -= 1;
            if outdeg[p] == 0 {
                stack.push(p);
            }
        }
    }
    order
}

/// Per-stage in-flight micro-batches of the default GPP schedule (uniform micro-batch, 1F1B),
/// capped at `m` micro-batches: `min(i_s / b, m)`.
pub fn default_in_flight(succ: &[Vec<usize>], m: usize) -> Vec<usize> {
    let n = succ.len();
    let i = in_flight_samples(succ, &vec![1; n], &vec![1; n]);
    i.into_iter()
        .map(|x| (x as usize).clamp(1, m.max(1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows() {
        // row 7 (default 1F1B, uniform b): i_y + b
        assert_eq!(compute_in_flight(1, 4, 1, 4, 8), 12);
        // row 1: max < kx bx < ky by
        assert_eq!(compute_in_flight(2, 2, 4, 2, 0), 4);
        // row 2: max = kx bx < ky by
        assert_eq!(compute_in_flight(1, 2, 2, 2, 0), 2);
        // row 9: bx <= kx bx < by <= ky by (Fig. 5: S2 needs two of S1's micro-batches)
        assert_eq!(compute_in_flight(1, 1, 1, 2, 2), 4);
        // row 4: bx <= by = ky by < kx bx
        assert_eq!(compute_in_flight(4, 1, 1, 2, 2), 6);
    }

    #[test]
    fn chain_and_dag() {
        // chain of 3: 3, 2, 1 micro-batches in flight
        let succ = vec![vec![1], vec![2], vec![]];
        assert_eq!(default_in_flight(&succ, 100), vec![3, 2, 1]);
        // diamond 0 -> {1, 2 -> 3}: depth 3 at the source
        let succ = vec![vec![1, 2], vec![], vec![3], vec![]];
        assert_eq!(default_in_flight(&succ, 100), vec![3, 1, 2, 1]);
        assert_eq!(default_in_flight(&succ, 2), vec![2, 1, 2, 1]);
    }
}
