//! PipeDream `graph.txt` profiles as a [`CostGraph`].
//!
//! Grammar (see `shared/profiles/README.md`): one node per line,
//! `nodeN -- <module repr> -- forward_compute_time=<ms>, backward_compute_time=<ms>,
//! activation_size=<bytes or [a; b]>, parameter_size=<bytes>`, optionally followed by
//! ` -- stage_id=K`; then edges, indented, `nodeA -- nodeB`. The repr may contain ` -- `-free text
//! with commas and `=`: the id is the first field, the key=value list is the field that starts
//! with `forward_compute_time=`, and the repr is everything between.
//!
//! Times are milliseconds for the profiled batch; they become seconds at the reference batch
//! (the profile batch, `--profile-batch` or `pbs-N` in the file name) and scale linearly from there
//! ([`CostGraph::times`]). The activation of a multi-output node is the sum of its outputs; every
//! out-edge carries that sum (the format does not say which output goes where). Nodes are sorted by
//! the number in their id (`node2` before `node10`), so results do not depend on line order.
//! `Input*` nodes get zero compute time: their profiled time is data loading, which PipeDream's
//! optimizer leaves out too (so a whole-model sum matches its `single_stage_s`).

use super::{CostEdge, CostGraph, CostNode, Work};
use pipec_compiler::{Error, Result};
use std::path::Path;

/// A parsed profile: the graph, plus the `stage_id` a partitioner appended to each node, if any.
#[derive(Clone, Debug)]
pub struct Profile {
    pub graph: CostGraph,
    /// `stage_ids[n]` for node `n` of `graph` (all `None` for a plain profile).
    pub stage_ids: Vec<Option<usize>>,
}

/// The profile batch given by `pbs-N` in a file name (`gnmt-16-pbs-64.txt` → 64).
pub fn profile_batch_from_name(path: &Path) -> Option<u64> {
    let stem = path.file_name()?.to_str()?;
    let at = stem.find("pbs-")?;
    let digits: String = stem[at + 4..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok().filter(|n| *n > 0)
}

/// Read a profile file. `profile_batch` is the batch it was measured at.
pub fn load_profile(path: &Path, profile_batch: f64) -> Result<Profile> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    parse_profile(&text, &path.display().to_string(), &name, profile_batch)
}

fn natural_key(id: &str) -> (String, u64, String) {
    let digits_at = id
        .char_indices()
        .find(|(_, c)| c.is_ascii_digit())
        .map(|(i, _)| i)
        .unwrap_or(id.len());
    let prefix = id[..digits_at].to_string();
    let num: String = id[digits_at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    (prefix, num.parse().unwrap_or(0), id.to_string())
}

fn parse_num(v: &str, file: &str, line: usize, key: &str) -> Result<f64> {
    let x: f64 = v.trim().parse().map_err(|_| {
        Error::Usage(format!(
            "{file}:{line}: {key}: '{}' is not a number",
            v.trim()
        ))
    })?;
    if !(x.is_finite() && x >= 0.0) {
        return Err(Error::Usage(format!(
            "{file}:{line}: {key} must be >= 0, got {x}"
        )));
    }
    Ok(x)
}

/// Parse profile text; `file` names it in errors, `name` becomes the graph name.
pub fn parse_profile(text: &str, file: &str, name: &str, profile_batch: f64) -> Result<Profile> {
    struct Raw {
        id: String,
        repr: String,
        fwd_ms: f64,
        bwd_ms: f64,
        act: f64,
        params: f64,
        stage: Option<usize>,
    }
    let mut raws: Vec<Raw> = Vec::new();
    let mut raw_edges: Vec<(String, String, usize)> = Vec::new();
    for (ln0, line) in text.lines().enumerate() {
        let ln = ln0 + 1;
        if line.trim().is_empty() {
            continue;
        }
        let indented = line.starts_with(char::is_whitespace);
        let fields: Vec<&str> = line.trim().split(" -- ").collect();
        if indented {
            if fields.len() != 2 {
                return Err(Error::Usage(format!(
                    "{file}:{ln}: an edge line must be 'nodeA -- nodeB'"
                )));
            }
            raw_edges.push((fields[0].trim().into(), fields[1].trim().into(), ln));
            continue;
        }
        let kv_at = fields
            .iter()
            .position(|f| f.trim_start().starts_with("forward_compute_time="))
            .ok_or_else(|| {
                Error::Usage(format!(
                    "{file}:{ln}: node line without 'forward_compute_time=...' field"
                ))
            })?;
        if kv_at == 0 {
            return Err(Error::Usage(format!(
                "{file}:{ln}: node line without an id"
            )));
        }
        let id = fields[0].trim().to_string();
        let repr = fields[1..kv_at].join(" -- ");
        let (mut fwd, mut bwd, mut act, mut par) = (None, None, None, None);
        for kv in fields[kv_at].split(", ") {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| Error::Usage(format!("{file}:{ln}: '{kv}' is not key=value")))?;
            let k = k.trim();
            match k {
                "forward_compute_time" => fwd = Some(parse_num(v, file, ln, k)?),
                "backward_compute_time" => bwd = Some(parse_num(v, file, ln, k)?),
                "parameter_size" => par = Some(parse_num(v, file, ln, k)?),
                "activation_size" => {
                    let v = v.trim();
                    let sum = if let Some(list) = v.strip_prefix('[') {
                        let list = list.strip_suffix(']').ok_or_else(|| {
                            Error::Usage(format!("{file}:{ln}: activation_size list lacks ']'"))
                        })?;
                        let mut s = 0.0;
                        for x in list.split(';').filter(|x| !x.trim().is_empty()) {
                            s += parse_num(x, file, ln, k)?;
                        }
                        s
                    } else {
                        parse_num(v, file, ln, k)?
                    };
                    act = Some(sum);
                }
                _ => {} // unknown keys are ignored (forward compatible)
            }
        }
        let mut stage = None;
        for f in &fields[kv_at + 1..] {
            if let Some(v) = f.trim().strip_prefix("stage_id=") {
                stage = Some(v.trim().parse::<usize>().map_err(|_| {
                    Error::Usage(format!("{file}:{ln}: stage_id '{v}' is not an integer"))
                })?);
            }
        }
        let missing = |k: &str| Error::Usage(format!("{file}:{ln}: node '{id}' lacks {k}"));
        raws.push(Raw {
            fwd_ms: fwd.ok_or_else(|| missing("forward_compute_time"))?,
            bwd_ms: bwd.ok_or_else(|| missing("backward_compute_time"))?,
            act: act.ok_or_else(|| missing("activation_size"))?,
            params: par.ok_or_else(|| missing("parameter_size"))?,
            id,
            repr,
            stage,
        });
    }
    if raws.is_empty() {
        return Err(Error::Usage(format!(
            "{file}: no node lines (not a graph.txt profile?)"
        )));
    }
    raws.sort_by_key(|r| natural_key(&r.id));
    let index: std::collections::HashMap<&str, usize> = raws
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    let mut edges = Vec::with_capacity(raw_edges.len());
    let mut seen = std::collections::HashSet::new();
    for (a, b, ln) in &raw_edges {
        let find = |x: &str| {
            index
                .get(x)
                .copied()
                .ok_or_else(|| Error::Usage(format!("{file}:{ln}: edge names unknown node '{x}'")))
        };
        let (s, d) = (find(a)?, find(b)?);
        if seen.insert((s, d)) {
            edges.push(CostEdge::new(s, d, raws[s].act));
        }
    }
    let stage_ids = raws.iter().map(|r| r.stage).collect();
    let nodes = raws
        .into_iter()
        .map(|r| {
            let is_input = r.id.starts_with("Input") || r.repr.trim_start().starts_with("Input");
            // An input node's "compute" is data loading: PipeDream's optimizer leaves it out.
            let (f, b) = if is_input {
                (0.0, 0.0)
            } else {
                (r.fwd_ms, r.bwd_ms)
            };
            CostNode {
                is_input,
                side: false,
                name: r.id,
                op: r.repr,
                work: Work::Measured {
                    fwd_s: f / 1e3,
                    bwd_s: b / 1e3,
                },
                activation_bytes: r.act,
                saved_bytes: r.act,
                saved_fixed_bytes: 0.0,
                parameter_bytes: r.params,
            }
        })
        .collect();
    let graph = CostGraph::new(name, profile_batch, nodes, edges, file)?;
    Ok(Profile { graph, stage_ids })
}
