//! `pipec run --check`: run the unpartitioned [`ReferenceProgram`] on one device with the
//! same data, optimizer and number of steps, and compare every parameter.
//!
//! The reference step: for each micro-batch `m`, rows `[m*b, (m+1)*b)` of every data input
//! (along its batch axis) and the parameters feed `train`; its `grads` outputs are summed
//! into `grad/P`; then `step` runs with the same conventions as a stage step (state buffers
//! created as zeros before the first step, the step counter = 1-based step number as a 0-D
//! tensor of the parameters' dtype, `updates` replace global buffers, gradients dropped).
//!
//! Under per-micro-batch steps ([`Program::per_micro_batch_step`], PipeDream's asynchronous
//! 1F1B) the reference is an **emulation of PipeDream's update rule** instead: micro-batch `m`'s
//! gradients are computed with each parameter at the version the pipeline's computes of `m`
//! read (the number of optimizer steps before its stash or forward on the parameter's stage,
//! read from the program: [`read_versions`]), and applied at once to the newest parameters
//! with the step counter counting updates. Its numerics differ from synchronous training by
//! design (stale weights), so this is the oracle those programs must equal.
//!
//! Comparison, per parameter `P` (distributed `a`, reference `b`):
//! `abs(P) = max|a - b|`, `rel(P) = abs(P) / max(max|b|, 1e-12)` — a norm-style relative error
//! (the largest difference relative to the largest reference magnitude, so elements near zero
//! do not blow it up). `max_abs_diff` and `max_rel_diff` are the maxima over parameters; the
//! check fails if `max_rel_diff > 1e-4` ([`TOLERANCE`]). It also fails, saying so, when the
//! reference training itself diverged (a non-finite loss or parameter, or a loss more than
//! [`BLOW_UP`] times the first step's): then the difference says nothing about the program.

use super::data::{self, Data};
use super::{DistError, LoadedProgram, Result, RunResult};
use crate::exec::Executor;
use crate::tensor::{max_abs_diff, Tensor};
use pipec_compiler::ir::DType;
use pipec_compiler::program::{Program, ReferenceProgram};
use std::collections::{BTreeMap, HashMap};

/// The bound on `max_rel_diff`.
pub const TOLERANCE: f64 = 1e-4;

/// A reference loss this many times its first step's loss is divergence, finite or not.
pub const BLOW_UP: f64 = 1e4;

/// The reference training blew up while staying finite: a later loss is more than [`BLOW_UP`]
/// times the first (a first loss of at least `1e-3`, so that a loss near zero does not count).
/// Float32 rounding differences grow with such a run as fast as its parameters, so a
/// comparison with it cannot tell a wrong program from rounding.
fn loss_blow_up(ref_losses: &[f64]) -> Option<String> {
    let first = *ref_losses.first()?;
    if first.abs() < 1e-3 || !first.is_finite() {
        return None;
    }
    let (i, l) = ref_losses
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, l)| l.abs() > BLOW_UP * first.abs())?;
    Some(format!(
        "its loss grew from {first:.3e} at step 1 to {l:.3e} at step {}, more than {BLOW_UP:.0e} times",
        i + 1
    ))
}

/// Outcome of a check.
#[derive(Clone, Debug)]
pub struct CheckReport {
    /// The reference loss of each step.
    pub ref_losses: Vec<f64>,
    /// Per parameter: `(name, abs, rel)`.
    pub params: Vec<(String, f64, f64)>,
    pub max_abs_diff: f64,
    pub max_rel_diff: f64,
    /// `max_rel_diff <= TOLERANCE` and the reference did not diverge.
    pub ok: bool,
    /// Why the comparison cannot judge the program: the single-device reference training itself
    /// left the finite numbers (a loss or a parameter is infinite or NaN), e.g. a learning rate
    /// too large for the model's loss scale. `None` when the reference stayed finite.
    pub diverged: Option<String>,
}

fn err(msg: impl Into<String>) -> DistError {
    DistError::Device {
        device: 0,
        at: "reference run (--check)".into(),
        msg: msg.into(),
    }
}

/// Run the reference program for `steps` steps on `data`; returns the losses and every global
/// buffer at the end (parameters and optimizer state). It runs on the reference interpreter,
/// whatever executor ran the pipeline, so that a check of another engine (tract, ONNX Runtime)
/// compares it with pipec's own kernels and not with itself.
pub fn reference_run(
    lp: &LoadedProgram,
    data: &Data,
    steps: usize,
) -> Result<(Vec<f64>, HashMap<String, Tensor>)> {
    let p = &lp.program;
    let r: &ReferenceProgram = p.reference.as_ref().ok_or_else(|| {
        DistError::Input(format!(
            "{}: the program has no reference program for --check",
            lp.outdir.join("schedule.json").display()
        ))
    })?;
    let ex = crate::reference::Reference;
    let mut train_m = super::import_piece(&lp.outdir, &r.train)?;
    let mut step_m = super::import_piece(&lp.outdir, &r.step)?;
    if lp.f64 {
        let w = |m: &pipec_compiler::ir::Module| {
            crate::exec::to_f64(m).map_err(|e| DistError::Input(e.to_string()))
        };
        train_m = w(&train_m)?;
        step_m = w(&step_m)?;
    }
    let mut train = ex
        .prepare(&train_m)
        .map_err(|e| err(format!("{}: {e}", r.train.file)))?;
    let mut step = ex
        .prepare(&step_m)
        .map_err(|e| err(format!("{}: {e}", r.step.file)))?;
    let names = |m: &pipec_compiler::ir::Module| -> Vec<String> {
        m.graph
            .inputs
            .iter()
            .map(|v| m.graph.name(*v).to_string())
            .collect()
    };
    let (train_in, step_in) = (names(&train_m), names(&step_m));
    let mut globals: HashMap<String, Tensor> = lp
        .weights
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (s, par) in &r.state_init {
        let like = lp
            .weights
            .get(par)
            .ok_or_else(|| err(format!("no parameter '{par}' for state '{s}'")))?;
        let z = Tensor::zeros(like.dtype(), like.shape()).map_err(|e| err(e.to_string()))?;
        globals.insert(s.clone(), z);
    }
    let pdtype = r
        .grads
        .first()
        .and_then(|(_, par)| lp.weights.get(par))
        .map(|t| t.dtype())
        .unwrap_or(DType::F32);
    let b = p.micro_batch as usize;
    let nmb = p.micro_batches as usize;
    // Under per-micro-batch steps (PipeDream's asynchronous 1F1B): the parameter version each
    // micro-batch reads, as the program's devices read it.
    let versions = p.per_micro_batch_step.then(|| read_versions(p));
    let updated: std::collections::HashSet<&str> =
        r.updates.iter().map(|(_, q)| q.as_str()).collect();
    // The step piece reads the gradient as `grad/P` or by the train output's name.
    let by_out: HashMap<&str, &str> = r
        .grads
        .iter()
        .map(|(g, par)| (g.as_str(), par.as_str()))
        .collect();
    let mut losses = Vec::with_capacity(steps);
    // One optimizer step; the step counter counts them.
    let mut updates = 0usize;
    let mut update = |grads: &mut HashMap<String, Tensor>,
                      globals: &mut HashMap<String, Tensor>| {
        updates += 1;
        run_step(
            &mut step, &step_in, r, &by_out, grads, globals, pdtype, updates,
        )
    };
    for s in 0..steps {
        let mut loss = 0.0;
        let mut grads: HashMap<String, Tensor> = HashMap::new();
        // Per-micro-batch steps: every parameter version of this run, oldest first.
        let mut history: HashMap<String, Vec<Tensor>> = HashMap::new();
        if versions.is_some() {
            for par in lp.weights.keys() {
                if let Some(t) = globals.get(par) {
                    history.insert(par.clone(), vec![t.clone()]);
                }
            }
        }
        for m in 0..nmb {
            let mut feeds = Vec::with_capacity(train_in.len());
            for x in &train_in {
                let t = if let Some(di) = p.data_inputs.iter().find(|d| &d.name == x) {
                    let t = data
                        .get(x)
                        .ok_or_else(|| err(format!("no data for '{x}'")))?;
                    match di.batch_axis {
                        Some(ax) => data::slice_axis(t, ax, m * b, (m + 1) * b).map_err(err)?,
                        None => t.clone(),
                    }
                } else if let (Some(v), Some(h)) = (&versions, history.get(x)) {
                    // The version the pipeline's forward of `m` reads: `k` updates into the run.
                    // One the emulation cannot take is an error, not the nearest version.
                    match v.get(x).and_then(|per_mb| per_mb.get(m)).copied().flatten() {
                        Some(k) if k < h.len() => h[k].clone(),
                        Some(k) => {
                            return Err(err(format!(
                                "step {} micro-batch {m}: the program reads version {k} of '{x}' (after {k} updates of this step), but only {} updates come before micro-batch {m} in PipeDream's update rule",
                                s + 1,
                                h.len() - 1
                            )))
                        }
                        // A parameter no step updates has one version.
                        None if !updated.contains(x.as_str()) => h[h.len() - 1].clone(),
                        None => {
                            return Err(err(format!(
                                "step {} micro-batch {m}: no device's program reads a version of '{x}' for micro-batch {m}",
                                s + 1
                            )))
                        }
                    }
                } else {
                    globals
                        .get(x)
                        .ok_or_else(|| err(format!("train input '{x}' has no value")))?
                        .clone()
                };
                feeds.push((x.clone(), t));
            }
            let outs: HashMap<String, Tensor> = train
                .run(&feeds)
                .map_err(|e| err(format!("step {} micro-batch {m}: {e}", s + 1)))?
                .into_iter()
                .collect();
            let l = outs
                .get(&r.loss.0)
                .ok_or_else(|| err(format!("train has no output '{}'", r.loss.0)))?;
            loss += r.loss.1 * data::sum_f64(l);
            for (g, par) in &r.grads {
                let t = outs
                    .get(g)
                    .ok_or_else(|| err(format!("train has no output '{g}'")))?;
                let key = format!("grad/{par}");
                match grads.get_mut(&key) {
                    Some(acc) => data::add_assign(acc, t).map_err(err)?,
                    None => {
                        grads.insert(key, t.clone());
                    }
                }
            }
            if versions.is_some() {
                // PipeDream's update rule: this micro-batch's gradients, computed on the
                // versions it read, update the newest parameters at once.
                update(&mut grads, &mut globals)
                    .map_err(|e| err(format!("step {} micro-batch {m}: {e}", s + 1)))?;
                for (par, h) in history.iter_mut() {
                    if let Some(t) = globals.get(par) {
                        h.push(t.clone());
                    }
                }
            }
        }
        losses.push(loss);
        if versions.is_none() {
            update(&mut grads, &mut globals).map_err(|e| err(format!("step {}: {e}", s + 1)))?;
        }
    }
    Ok((losses, globals))
}

/// One optimizer step of the reference: `step` on the summed gradients `grads` (taken), the
/// global buffers and the step counter `t` (1-based); its updates replace global buffers.
#[allow(clippy::too_many_arguments)]
fn run_step(
    step: &mut Box<dyn crate::exec::Prepared>,
    step_in: &[String],
    r: &ReferenceProgram,
    by_out: &HashMap<&str, &str>,
    grads: &mut HashMap<String, Tensor>,
    globals: &mut HashMap<String, Tensor>,
    pdtype: DType,
    t: usize,
) -> std::result::Result<(), String> {
    let mut feeds = Vec::with_capacity(step_in.len());
    for x in step_in {
        let v = if r.step_counter.as_deref() == Some(x.as_str()) {
            data::scalar(pdtype, t as f64)?
        } else if let Some(v) = grads.get(x) {
            v.clone()
        } else if let Some(v) = by_out
            .get(x.as_str())
            .and_then(|par| grads.get(&format!("grad/{par}")))
        {
            v.clone()
        } else if let Some(v) = globals.get(x) {
            v.clone()
        } else if let Some(pt) = x.strip_prefix("grad/").and_then(|par| globals.get(par)) {
            Tensor::zeros(pt.dtype(), pt.shape()).map_err(|e| e.to_string())?
        } else {
            return Err(format!("step input '{x}' has no value"));
        };
        feeds.push((x.clone(), v));
    }
    let mut outs: HashMap<String, Tensor> = step
        .run(&feeds)
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    for (out, target) in &r.updates {
        let v = outs
            .remove(out)
            .ok_or_else(|| format!("step has no output '{out}'"))?;
        globals.insert(target.clone(), v);
    }
    grads.clear();
    Ok(())
}

/// Per parameter and micro-batch: how many optimizer steps of the run (under per-micro-batch
/// steps) came before the version the pipeline's computes of that micro-batch read — counted on
/// the first device holding the parameter ([`pipec_compiler::program::read_versions`]: at its
/// stash for the micro-batch if there is one, else at the forward). The verifier checks that
/// its backward reads the same; a tied parameter's other holders stash the same version, else
/// the comparison fails. `None` where that device has no forward of the micro-batch.
fn read_versions(p: &Program) -> HashMap<String, Vec<Option<usize>>> {
    let mut out: HashMap<String, Vec<Option<usize>>> = HashMap::new();
    for d in &p.devices {
        let Some(st) = p.stages.get(d.stage) else {
            continue;
        };
        let at = pipec_compiler::program::read_versions(p, d);
        for q in &st.params {
            out.entry(q.clone()).or_insert_with(|| {
                (0..p.micro_batches as u32)
                    .map(|m| at.get(&(q.clone(), m)).copied())
                    .collect()
            });
        }
    }
    out
}

/// Compare a distributed run's parameters with the reference run on the same data and steps.
pub fn check(lp: &LoadedProgram, run: &RunResult) -> Result<CheckReport> {
    let steps = run.losses.len();
    let (ref_losses, globals) = reference_run(lp, &run.data, steps)?;
    compare(&run.params, &globals, &lp.weights, ref_losses)
}

/// How far a float32 run and its float32 reference each are from exact training
/// (`pipec run --check --accuracy`).
#[derive(Clone, Debug)]
pub struct Accuracy {
    /// The distributed run against the float64 reference (`max_rel_diff`'s norm).
    pub pipeline: f64,
    /// The float32 reference against the float64 reference.
    pub reference: f64,
}

/// [`check`], and also the reference run in float64 (pieces, weights and float data widened as
/// by `--precision f64`; float64 rounding is ~1e-13 here, so it stands for exact training): the
/// two float32 results are compared with it. When `--check` fails in float32 this tells
/// rounding from a wrong program: both equally far from exact training (the float32 difference
/// is rounding that the training amplifies, e.g. Adam on a near-zero gradient), or the pipeline
/// farther than the reference (a program error).
pub fn check_accuracy(lp: &LoadedProgram, run: &RunResult) -> Result<(CheckReport, Accuracy)> {
    if lp.f64 {
        return Err(DistError::Input(
            "--accuracy compares a float32 run with float64 training: drop --precision f64".into(),
        ));
    }
    let steps = run.losses.len();
    let (ref_losses, ref32) = reference_run(lp, &run.data, steps)?;
    let rep = compare(&run.params, &ref32, &lp.weights, ref_losses)?;
    let mut wide = lp.clone();
    wide.widen_to_f64()?;
    let mut data = run.data.clone();
    data::widen_f32(&mut data).map_err(err)?;
    let (losses64, exact) = reference_run(&wide, &data, steps)?;
    let pipeline = compare(&run.params, &exact, &lp.weights, losses64.clone())?.max_rel_diff;
    let ref32: BTreeMap<String, Tensor> = ref32.into_iter().collect();
    let reference = compare(&ref32, &exact, &lp.weights, losses64)?.max_rel_diff;
    Ok((
        rep,
        Accuracy {
            pipeline,
            reference,
        },
    ))
}

/// Compare `got` with `reference` on every parameter of `weights` (see the module doc).
pub fn compare(
    got: &BTreeMap<String, Tensor>,
    reference: &HashMap<String, Tensor>,
    weights: &BTreeMap<String, Tensor>,
    ref_losses: Vec<f64>,
) -> Result<CheckReport> {
    let mut params = Vec::new();
    let (mut max_abs, mut max_rel) = (0f64, 0f64);
    let mut diverged = ref_losses
        .iter()
        .position(|l| !l.is_finite())
        .map(|i| format!("its loss at step {} is {}", i + 1, ref_losses[i]))
        .or_else(|| loss_blow_up(&ref_losses));
    for name in weights.keys() {
        let a = got
            .get(name)
            .ok_or_else(|| err(format!("the distributed run holds no parameter '{name}'")))?;
        let b = reference
            .get(name)
            .ok_or_else(|| err(format!("the reference run holds no parameter '{name}'")))?;
        if diverged.is_none() && !b.to_f64().iter().all(|x| x.is_finite()) {
            diverged = Some(format!(
                "parameter '{name}' is not finite after the last step"
            ));
        }
        let (d, m) = max_abs_diff(a, b).map_err(|e| err(format!("parameter '{name}': {e}")))?;
        let rel = d / m.max(1e-12);
        max_abs = max_abs.max(d);
        max_rel = max_rel.max(rel);
        params.push((name.clone(), d, rel));
    }
    Ok(CheckReport {
        ref_losses,
        params,
        max_abs_diff: max_abs,
        max_rel_diff: max_rel,
        ok: max_rel <= TOLERANCE && diverged.is_none(),
        diverged,
    })
}

#[cfg(test)]
mod tests {
    use super::loss_blow_up;

    #[test]
    fn a_loss_that_grows_ten_thousandfold_is_divergence() {
        // mobilenet_v3_large at lr 1e-4 on random weights: 45.1 then 1.86e9.
        let why = loss_blow_up(&[45.1, 1.857e9]).expect("diverged");
        assert!(why.contains("step 2"), "{why}");
        // Ordinary training, and a rising loss that stays within the bound.
        assert_eq!(loss_blow_up(&[2.3, 2.1, 1.9]), None);
        assert_eq!(loss_blow_up(&[2.3, 2.3e3]), None);
        // A loss near zero may grow by any factor without counting.
        assert_eq!(loss_blow_up(&[1e-9, 1e-3]), None);
        assert_eq!(loss_blow_up(&[]), None);
    }
}
