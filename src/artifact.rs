//! OUTDIR, the compiled program's folder: written and read only here.
//!
//! An [`Artifact`] is what `pipec compile` produces: the typed plan, the program (per-device
//! instruction lists, `pipec_compiler::program`), the stage pieces and reference modules, the
//! initial weights and the resolved cluster the plan was made for. [`Artifact::write`] puts it
//! in a folder atomically (a temporary sibling renamed into place: a failed compile leaves no
//! OUTDIR, and an existing one is replaced whole); [`OutDir::open`] reads one back for `pipec
//! run` and `pipec simulate`.
//!
//! # Layout (format version [`FORMAT_VERSION`])
//! - `artifact.json` — `{"format": "pipec-outdir", "version": N}`: what reads the rest.
//! - `cluster.json` — the resolved cluster (device kinds, link levels, devices; after
//!   `--devices`, `--device-kind` and `--profile`), so a replay needs no flags to rebuild it.
//! - `plan.json` — the plan as `pipec plan --json` prints it, less the measured `search_time_s`.
//! - `schedule.json` — the program (`Program::to_json`).
//! - `weights.npz` — initial parameters; `stages/s{i}.{fwd,bwd,step}.onnx` — the pieces;
//!   `reference/{train,step}.onnx` — the unpartitioned program `pipec run --check` compares with.
//! - `program.mlir` — every piece as MLIR plus the schedule (for reading; nothing reads it back).
//!
//! Everything in OUTDIR is a function of the inputs: two compiles write byte-identical folders.
//! A folder without `artifact.json` (written before it existed) reads as version 1 without a
//! recorded cluster.

use anyhow::{anyhow, bail, Context, Result};
use pipec_compiler::program::Program;
use pipec_passes::codegen::Compiled;
use pipec_passes::cost::Cluster;
use pipec_passes::plan::PlanReport;
use std::path::{Path, PathBuf};

/// The OUTDIR format this build writes (and the newest it reads).
pub const FORMAT_VERSION: u32 = 2;

/// `artifact.json`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Manifest {
    format: String,
    version: u32,
}

const FORMAT_NAME: &str = "pipec-outdir";

/// A compiled program: everything OUTDIR holds.
pub struct Artifact {
    /// The plan it was compiled from, as `plan.json` records it.
    pub plan: PlanReport,
    /// The cluster the plan was made for (its first `plan.devices` devices).
    pub cluster: Cluster,
    /// The program, its pieces and initial weights.
    pub compiled: Compiled,
}

impl Artifact {
    /// Write OUTDIR `out` atomically: into a temporary sibling directory, then renamed into place
    /// (an existing `out` is replaced).
    pub fn write(&self, out: &Path) -> Result<()> {
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let base = out
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .ok_or_else(|| anyhow!("-o {}: not a directory name", out.display()))?;
        if !parent.exists() {
            bail!("-o {}: parent directory does not exist", out.display());
        }
        let tmp = parent.join(format!(".{base}.tmp{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let result = self.write_files(&tmp);
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e.context(format!(
                "{}: cannot write the compiled program",
                out.display()
            )));
        }
        if out.exists() {
            std::fs::remove_dir_all(out).with_context(|| {
                format!("{}: cannot replace the existing directory", out.display())
            })?;
        }
        std::fs::rename(&tmp, out).with_context(|| {
            let _ = std::fs::remove_dir_all(&tmp);
            format!(
                "{}: cannot move the compiled program into place",
                out.display()
            )
        })?;
        Ok(())
    }

    fn write_files(&self, dir: &Path) -> Result<()> {
        let c = &self.compiled;
        std::fs::create_dir_all(dir.join("stages"))?;
        std::fs::create_dir_all(dir.join("reference"))?;
        let manifest = Manifest {
            format: FORMAT_NAME.to_string(),
            version: FORMAT_VERSION,
        };
        std::fs::write(
            dir.join("artifact.json"),
            serde_json::to_string_pretty(&manifest)?,
        )?;
        std::fs::write(
            dir.join("cluster.json"),
            serde_json::to_string_pretty(&self.cluster)?,
        )?;
        std::fs::write(dir.join("plan.json"), plan_json(&self.plan)?)?;
        std::fs::write(dir.join("schedule.json"), c.program.to_json())?;
        pipec_runtime::npz::write_npz(&dir.join("weights.npz"), &c.weights)
            .map_err(|e| anyhow!("weights.npz: {e}"))?;
        for (file, md) in &c.modules {
            pipec_compiler::onnx::export::save(md, &dir.join(file))
                .with_context(|| format!("{file}: cannot export"))?;
        }
        std::fs::write(dir.join("program.mlir"), program_mlir(&c.program, c))?;
        Ok(())
    }
}

/// OUTDIR's `plan.json`: the plan as `plan --json` prints it, less `search_time_s`. OUTDIR
/// holds only what the inputs determine (two compiles give byte-identical files); the search
/// time is a measurement, which `pipec plan --json` reports.
fn plan_json(plan: &PlanReport) -> Result<String> {
    let mut v = serde_json::to_value(plan)?;
    if let Some(o) = v.as_object_mut() {
        o.remove("search_time_s");
    }
    Ok(serde_json::to_string_pretty(&v)?)
}

/// A compiled program's folder, opened for reading: the program and what is recorded beside it.
/// The pieces and weights stay on disk; the runtime loads them from [`OutDir::dir`].
pub struct OutDir {
    /// The folder.
    pub dir: PathBuf,
    /// Its format version (1 for a folder written before `artifact.json` existed).
    pub version: u32,
    /// `schedule.json`, parsed.
    pub program: Program,
    /// `plan.json`, when present and readable as this version's plan.
    pub plan: Option<PlanReport>,
    /// `plan.json` as JSON, when present (for fields that an older plan may lack).
    pub plan_raw: Option<serde_json::Value>,
    /// `cluster.json`, when present (format 2 on).
    pub cluster: Option<Cluster>,
}

impl OutDir {
    /// Open OUTDIR: its manifest, program, plan and cluster. A folder that is not the output of
    /// `pipec compile`, or one of a newer format, is an error that says so.
    pub fn open(dir: &Path) -> Result<OutDir> {
        if !dir.is_dir() {
            bail!(
                "{}: not a directory (OUTDIR must be the output of `pipec compile`)",
                dir.display()
            );
        }
        let version = match std::fs::read_to_string(dir.join("artifact.json")) {
            Err(_) => 1,
            Ok(text) => {
                let path = dir.join("artifact.json");
                let m: Manifest = serde_json::from_str(&text)
                    .with_context(|| format!("{}: not a pipec OUTDIR manifest", path.display()))?;
                if m.format != FORMAT_NAME {
                    bail!(
                        "{}: format '{}', expected '{FORMAT_NAME}'",
                        path.display(),
                        m.format
                    );
                }
                if m.version > FORMAT_VERSION {
                    bail!(
                        "{}: written by a newer pipec (format {}; this one reads up to {FORMAT_VERSION})",
                        path.display(),
                        m.version
                    );
                }
                m.version
            }
        };
        let sched_path = dir.join("schedule.json");
        let text = std::fs::read_to_string(&sched_path).with_context(|| {
            format!(
                "{}: cannot read (is {} the output of `pipec compile`?)",
                sched_path.display(),
                dir.display()
            )
        })?;
        let program = Program::from_json(&text, &sched_path.display().to_string())?;
        let plan_value: Option<serde_json::Value> = std::fs::read_to_string(dir.join("plan.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        let plan = plan_value
            .clone()
            .and_then(|v| serde_json::from_value(v).ok());
        let cluster = match std::fs::read_to_string(dir.join("cluster.json")) {
            Err(_) => None,
            Ok(text) => Some(serde_json::from_str(&text).with_context(|| {
                format!("{}: not a cluster", dir.join("cluster.json").display())
            })?),
        };
        Ok(OutDir {
            dir: dir.to_path_buf(),
            version,
            program,
            plan,
            plan_raw: plan_value,
            cluster,
        })
    }

    /// BaPipe's intra-layer splits recorded in `dir`'s `plan.json` (`[]` when there is no
    /// plan.json; only this field is read, so a plan of another version still gives them).
    pub fn intra_splits(dir: &Path) -> Result<Vec<pipec_passes::plan::IntraSplitReport>> {
        let plan_path = dir.join("plan.json");
        let Ok(text) = std::fs::read_to_string(&plan_path) else {
            return Ok(Vec::new());
        };
        #[derive(serde::Deserialize)]
        struct Splits {
            #[serde(default)]
            intra_splits: Vec<pipec_passes::plan::IntraSplitReport>,
        }
        let plan: Splits = serde_json::from_str(&text)
            .with_context(|| format!("{}: cannot read intra_splits", plan_path.display()))?;
        Ok(plan.intra_splits)
    }

    /// The final parameters for `-o`, by the model's parameter names: a parameter that BaPipe's
    /// intra-layer split cut in two (`plan.json`'s `intra_splits[].params`: `W.split0` + `W.split1`
    /// on an axis) is concatenated back into `W`, at the place of its first part.
    pub fn model_params(
        outdir: &Path,
        params: &std::collections::BTreeMap<String, pipec_runtime::Tensor>,
    ) -> Result<Vec<(String, pipec_runtime::Tensor)>> {
        let mut entries: Vec<(String, pipec_runtime::Tensor)> =
            params.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let splits = OutDir::intra_splits(outdir)?;
        for sp in splits.iter().flat_map(|s| &s.params) {
            let idx: Vec<usize> = sp
                .parts
                .iter()
                .filter_map(|p| entries.iter().position(|(k, _)| k == p))
                .collect();
            let [i0, i1] = idx[..] else {
                continue; // not trained (e.g. a frozen parameter)
            };
            let joined = pipec_runtime::dist::data::concat(
                &[entries[i0].1.clone(), entries[i1].1.clone()],
                sp.axis,
            )
            .map_err(|e| anyhow::anyhow!("-o: cannot rejoin '{}': {e}", sp.name))?;
            entries[i0] = (sp.name.clone(), joined);
            entries.remove(i1);
        }
        Ok(entries)
    }

    /// The path of `plan.json` (for messages).
    pub fn plan_path(&self) -> PathBuf {
        self.dir.join("plan.json")
    }
}

/// The whole program as MLIR (accepted by `mlir-opt --allow-unregistered-dialect`): every piece
/// as a nested `builtin.module` named after its file (`@stages_s0_fwd`), then `module @schedule`
/// with one function per device whose body is its instruction list as generic `pipec.*` ops
/// (`"pipec.send"() {tensor = "...", peer = 1, tag = 7, mb = 0} : () -> ()`).
fn program_mlir(p: &Program, compiled: &Compiled) -> String {
    let q = |x: &str| serde_json::to_string(x).unwrap_or_default();
    let ints = |v: &[i64]| {
        let items: Vec<String> = v.iter().map(|x| format!("{x} : i64")).collect();
        format!("[{}]", items.join(", "))
    };
    let mut s = format!(
        "// pipec program: {} on {} devices, {} stages, {} micro-batches of {}, schedule {}\nmodule {{\n",
        p.model,
        p.devices.len(),
        p.stages.len(),
        p.micro_batches,
        p.micro_batch,
        p.schedule
    );
    for (file, md) in &compiled.modules {
        let sym: String = file
            .trim_end_matches(".onnx")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        s.push_str(&format!("  module @{sym} {{\n"));
        for line in pipec_compiler::text::print(md).lines() {
            s.push_str("    ");
            s.push_str(line);
            s.push('\n');
        }
        s.push_str("  }\n");
    }
    s.push_str("  module @schedule {\n");
    for d in &p.devices {
        // Interleaved 1F1B's further chunks, when the device runs several stages.
        let chunks = if d.chunks.is_empty() {
            String::new()
        } else {
            let c: Vec<i64> = d.chunks.iter().map(|&c| c as i64).collect();
            format!(", pipec.chunks = {}", ints(&c))
        };
        s.push_str(&format!(
            "    func.func @device{}() attributes {{pipec.stage = {} : i64, pipec.replica = {} : i64{chunks}}} {{\n",
            d.device, d.stage, d.replica
        ));
        for ins in &d.instructions {
            use pipec_compiler::program::Instr as I;
            let attrs = match ins {
                I::Load { mb, input, samples } => (
                    "load",
                    format!("mb = {mb} : i64, input = {}, samples = {}", q(input), ints(&[samples[0] as i64, samples[1] as i64])),
                ),
                I::Compute { pass, mb } => (
                    "compute",
                    format!("mb = {mb} : i64, pass = {}", q(&format!("{pass:?}").to_lowercase())),
                ),
                I::Send { mb, tensor, peer, slice, tag, dtype, shape } => (
                    "send",
                    format!(
                        "mb = {mb} : i64, tensor = {}, peer = {peer} : i64, tag = {tag} : i64, dtype = {}, shape = {}{}",
                        q(tensor),
                        q(dtype),
                        ints(shape),
                        slice.map(|sl| format!(
                            ", slice = {}{}",
                            ints(&[sl.lo as i64, sl.hi as i64, sl.of as i64]),
                            if sl.axis != 0 { format!(", slice_axis = {} : i64", sl.axis) } else { String::new() }
                        )).unwrap_or_default()
                    ),
                ),
                I::Recv { mb, tensor, peer, tag, dtype, shape } => (
                    "recv",
                    format!(
                        "mb = {mb} : i64, tensor = {}, peer = {peer} : i64, tag = {tag} : i64, dtype = {}, shape = {}",
                        q(tensor),
                        q(dtype),
                        ints(shape)
                    ),
                ),
                I::Concat { mb, inputs, output, .. } | I::Sum { mb, inputs, output } => (
                    if matches!(ins, I::Concat { .. }) { "concat" } else { "sum" },
                    format!(
                        "mb = {mb} : i64, inputs = [{}], output = {}{}",
                        inputs.iter().map(|x| q(x)).collect::<Vec<_>>().join(", "),
                        q(output),
                        match ins {
                            I::Concat { axis, .. } if *axis != 0 => format!(", axis = {axis} : i64"),
                            _ => String::new(),
                        }
                    ),
                ),
                I::Zeros { mb, output, dtype, shape } => (
                    "zeros",
                    format!(
                        "mb = {mb} : i64, output = {}, dtype = {}, shape = {}",
                        q(output),
                        q(dtype),
                        ints(shape)
                    ),
                ),
                I::Accumulate { mb, tensors } | I::Free { mb, tensors } | I::Stash { mb, tensors } => (
                    match ins {
                        I::Accumulate { .. } => "accumulate",
                        I::Stash { .. } => "stash",
                        _ => "free",
                    },
                    format!(
                        "mb = {mb} : i64, tensors = [{}]",
                        tensors.iter().map(|x| q(x)).collect::<Vec<_>>().join(", ")
                    ),
                ),
                I::AllReduce { group, tensors, tag } => (
                    "all_reduce",
                    format!(
                        "group = {}, tag = {tag} : i64, tensors = [{}]",
                        ints(&group.iter().map(|g| *g as i64).collect::<Vec<_>>()),
                        tensors.iter().map(|x| q(x)).collect::<Vec<_>>().join(", ")
                    ),
                ),
                I::Step => ("step", String::new()),
                I::Stage { stage } => ("stage", format!("stage = {stage} : i64")),
            };
            let body = if attrs.1.is_empty() {
                String::new()
            } else {
                format!(" {{{}}}", attrs.1)
            };
            s.push_str(&format!("      \"pipec.{}\"(){body} : () -> ()\n", attrs.0));
        }
        s.push_str("      return\n    }\n");
    }
    s.push_str("  }\n}\n");
    s
}

#[cfg(test)]
mod tests {
    /// `cluster.json` gives back the cluster compile planned for, exactly (the oversubscribed
    /// `cpu` preset's shared host cores included).
    #[test]
    fn cluster_json_round_trips() {
        for (spec, n) in [("cpu", 8), ("summit", 16), ("8@25e9,2@3e9", 16)] {
            let c = crate::driver::resolve_cluster(spec, None, Some(n)).unwrap();
            let text = serde_json::to_string_pretty(&c).unwrap();
            let back: pipec_passes::cost::Cluster = serde_json::from_str(&text).unwrap();
            assert_eq!(back, c, "{spec}");
        }
    }
}
