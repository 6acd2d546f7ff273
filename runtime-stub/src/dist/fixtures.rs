//! Hand-built compiled programs for tests and examples (no codegen needed): a two-stage
//! linear model `y = (x W1) W2` with the loss `sum(y^2)`, stage 0 (`x W1`) on `replicas0`
//! devices and stage 1 (`h W2`, loss) on the last device, a GPipe order, SGD with a `lr / t`
//! decay (exercises the step counter) and optional momentum (exercises optimizer state), and
//! the matching reference program. [`write_linear`] writes a complete `OUTDIR`.

use crate::tensor::Tensor;
use ndarray::{ArrayD, IxDyn};
use pipec_compiler::ir::{Attr, DType, Dim, Graph, Module, OpData, TensorData, TensorType, Value};
use pipec_compiler::program::{
    DataInput, DeviceProgram, Instr, Piece, PieceKind, Program, ReferenceProgram, Slice,
    StageProgram, PROGRAM_VERSION,
};
use std::path::Path;

/// Shape of the fixture.
#[derive(Clone, Copy, Debug)]
pub struct LinearSpec {
    /// Global batch.
    pub batch: u64,
    pub micro_batches: u64,
    /// Replicas of stage 0 (devices `0..replicas0`); stage 1 runs on device `replicas0`.
    pub replicas0: usize,
    /// SGD with momentum 0.9 (else plain SGD).
    pub momentum: bool,
    pub lr: f32,
}

impl Default for LinearSpec {
    fn default() -> Self {
        LinearSpec {
            batch: 8,
            micro_batches: 2,
            replicas0: 1,
            momentum: false,
            lr: 0.01,
        }
    }
}

/// Dimensions of the fixture: `x: [B, IN]`, `W1: [IN, HID]`, `W2: [HID, OUT]`.
pub const IN: i64 = 4;
pub const HID: i64 = 3;
pub const OUT: i64 = 2;

struct G {
    g: Graph,
}

impl G {
    fn new(name: &str) -> Self {
        G {
            g: Graph::new(name),
        }
    }
    fn input(&mut self, name: &str, dims: &[Option<i64>]) -> Value {
        let shape = dims
            .iter()
            .map(|d| match d {
                Some(k) => Dim::Known(*k),
                None => Dim::sym("n"),
            })
            .collect();
        self.g.add_input(name, TensorType::new(DType::F32, shape))
    }
    fn scalar_input(&mut self, name: &str) -> Value {
        self.g.add_input(name, TensorType::known(DType::F32, &[]))
    }
    fn konst(&mut self, name: &str, v: f32) -> Value {
        self.g
            .add_initializer(name, TensorData::from_f32(vec![], &[v]))
    }
    fn op(&mut self, op_type: &str, ins: &[Value], out: &str, attrs: &[(&str, Attr)]) -> Value {
        let data = OpData {
            name: format!("{op_type}_{out}"),
            op_type: op_type.into(),
            inputs: ins.iter().map(|v| Some(*v)).collect(),
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        };
        self.g
            .add_op(
                data,
                vec![(out.to_string(), TensorType::unranked(DType::F32))],
            )
            .1[0]
    }
    fn t(&mut self, x: Value, out: &str) -> Value {
        self.op("Transpose", &[x], out, &[("perm", Attr::Ints(vec![1, 0]))])
    }
    fn finish(mut self, outs: &[Value]) -> Module {
        self.g.outputs = outs.to_vec();
        let mut m = Module {
            graph: self.g,
            ir_version: 8,
            ..Default::default()
        };
        m.opset_imports.insert(String::new(), 17);
        m
    }
}

fn save(m: &Module, outdir: &Path, file: &str) -> std::io::Result<Piece> {
    let path = outdir.join(file);
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    pipec_compiler::onnx::export::save(m, &path).map_err(std::io::Error::other)?;
    let names = |vs: &[Value]| vs.iter().map(|v| m.graph.name(*v).to_string()).collect();
    Ok(Piece {
        file: file.into(),
        inputs: names(&m.graph.inputs),
        outputs: names(&m.graph.outputs),
    })
}

/// `(step module, updates, state_init)` of SGD over `params`.
#[allow(clippy::type_complexity)]
fn step_module(
    params: &[&str],
    spec: &LinearSpec,
    shapes: &[&[i64]],
) -> (Module, Vec<(String, String)>, Vec<(String, String)>) {
    let mut g = G::new("step");
    let t = g.scalar_input("step_t");
    let lr = g.konst("lr", spec.lr);
    let lr_t = g.op("Div", &[lr, t], "lr_t", &[]);
    let mom = g.konst("momentum", 0.9);
    let mut outs = Vec::new();
    let mut updates = Vec::new();
    let mut state = Vec::new();
    for (p, shape) in params.iter().zip(shapes) {
        let dims: Vec<Option<i64>> = shape.iter().map(|d| Some(*d)).collect();
        let w = g.input(p, &dims);
        let gr = g.input(&format!("grad/{p}"), &dims);
        let dir = if spec.momentum {
            let m = g.input(&format!("opt/{p}/m"), &dims);
            let mm = g.op("Mul", &[m, mom], &format!("opt/{p}/m.scaled"), &[]);
            let mo = g.op("Add", &[mm, gr], &format!("opt/{p}/m.out"), &[]);
            outs.push(mo);
            updates.push((format!("opt/{p}/m.out"), format!("opt/{p}/m")));
            state.push((format!("opt/{p}/m"), p.to_string()));
            mo
        } else {
            gr
        };
        let d = g.op("Mul", &[dir, lr_t], &format!("delta/{p}"), &[]);
        let u = g.op("Sub", &[w, d], &format!("update/{p}"), &[]);
        outs.push(u);
        updates.push((format!("update/{p}"), p.to_string()));
    }
    (g.finish(&outs), updates, state)
}

/// Deterministic initial weights.
pub fn initial_weights() -> Vec<(String, Tensor)> {
    let w = |r: i64, c: i64, s: f32| {
        let v: Vec<f32> = (0..r * c)
            .map(|i| ((i as f32 * 0.37 + s).sin()) * 0.5)
            .collect();
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[r as usize, c as usize]), v).unwrap_or_default())
    };
    vec![
        ("W1".to_string(), w(IN, HID, 0.1)),
        ("W2".to_string(), w(HID, OUT, 1.3)),
    ]
}

/// Write a complete OUTDIR for `spec` (pieces, weights, schedule with reference program).
/// Returns the program. `spec.batch` must be divisible by `micro_batches * replicas0`.
pub fn write_linear(outdir: &Path, spec: &LinearSpec) -> std::io::Result<Program> {
    std::fs::create_dir_all(outdir)?;
    let r0 = spec.replicas0.max(1);
    // Stage 0.
    let mut g = G::new("s0_fwd");
    let x = g.input("x", &[None, Some(IN)]);
    let w1 = g.input("W1", &[Some(IN), Some(HID)]);
    let h = g.op("MatMul", &[x, w1], "h", &[]);
    let s0f = save(&g.finish(&[h]), outdir, "stages/s0.fwd.onnx")?;
    let mut g = G::new("s0_bwd");
    let x = g.input("x", &[None, Some(IN)]);
    let dh = g.input("dh", &[None, Some(HID)]);
    let xt = g.t(x, "xT");
    let gw1 = g.op("MatMul", &[xt, dh], "grad/W1", &[]);
    let s0b = save(&g.finish(&[gw1]), outdir, "stages/s0.bwd.onnx")?;
    let (m, up0, st0) = step_module(&["W1"], spec, &[&[IN, HID]]);
    let s0s = save(&m, outdir, "stages/s0.step.onnx")?;
    // Stage 1.
    let mut g = G::new("s1_fwd");
    let h = g.input("h", &[None, Some(HID)]);
    let w2 = g.input("W2", &[Some(HID), Some(OUT)]);
    let y = g.op("MatMul", &[h, w2], "y", &[]);
    let sq = g.op("Mul", &[y, y], "sq", &[]);
    let loss = g.op("ReduceSum", &[sq], "loss", &[("keepdims", Attr::Int(0))]);
    let s1f = save(&g.finish(&[y, loss]), outdir, "stages/s1.fwd.onnx")?;
    let mut g = G::new("s1_bwd");
    let h = g.input("h", &[None, Some(HID)]);
    let y = g.input("y", &[None, Some(OUT)]);
    let w2 = g.input("W2", &[Some(HID), Some(OUT)]);
    let dy = g.op("Add", &[y, y], "dy", &[]);
    let ht = g.t(h, "hT");
    let gw2 = g.op("MatMul", &[ht, dy], "grad/W2", &[]);
    let w2t = g.t(w2, "W2T");
    let dh = g.op("MatMul", &[dy, w2t], "dh", &[]);
    let s1b = save(&g.finish(&[gw2, dh]), outdir, "stages/s1.bwd.onnx")?;
    let (m, up1, st1) = step_module(&["W2"], spec, &[&[HID, OUT]]);
    let s1s = save(&m, outdir, "stages/s1.step.onnx")?;
    // Reference.
    let mut g = G::new("train");
    let x = g.input("x", &[None, Some(IN)]);
    let w1 = g.input("W1", &[Some(IN), Some(HID)]);
    let w2 = g.input("W2", &[Some(HID), Some(OUT)]);
    let h = g.op("MatMul", &[x, w1], "h", &[]);
    let y = g.op("MatMul", &[h, w2], "y", &[]);
    let sq = g.op("Mul", &[y, y], "sq", &[]);
    let loss = g.op("ReduceSum", &[sq], "loss", &[("keepdims", Attr::Int(0))]);
    let dy = g.op("Add", &[y, y], "dy", &[]);
    let ht = g.t(h, "hT");
    let gw2 = g.op("MatMul", &[ht, dy], "grad/W2", &[]);
    let w2t = g.t(w2, "W2T");
    let dh = g.op("MatMul", &[dy, w2t], "dh", &[]);
    let xt = g.t(x, "xT");
    let gw1 = g.op("MatMul", &[xt, dh], "grad/W1", &[]);
    let train = save(&g.finish(&[loss, gw1, gw2]), outdir, "reference/train.onnx")?;
    let (m, rup, rst) = step_module(&["W1", "W2"], spec, &[&[IN, HID], &[HID, OUT]]);
    let rstep = save(&m, outdir, "reference/step.onnx")?;
    crate::npz::write(&outdir.join("weights.npz"), &initial_weights())
        .map_err(std::io::Error::other)?;

    // Schedule.
    let (bsz, mbs) = (spec.batch, spec.micro_batches);
    let b = bsz / mbs;
    let rows = b / r0 as u64;
    let s1dev = r0;
    let mut tag = 0u32;
    let mut next = || {
        tag += 1;
        tag
    };
    let mut lists: Vec<Vec<Instr>> = vec![Vec::new(); r0 + 1];
    let mut h_tags = vec![vec![0u32; r0]; mbs as usize];
    let mut dh_tags = vec![vec![0u32; r0]; mbs as usize];
    for (hs, dhs) in h_tags.iter_mut().zip(dh_tags.iter_mut()) {
        for (h, dh) in hs.iter_mut().zip(dhs.iter_mut()) {
            *h = next();
            *dh = next();
        }
    }
    let f32s = || "f32".to_string();
    for k in 0..r0 {
        let l = &mut lists[k];
        for m in 0..mbs as u32 {
            let lo = m as u64 * b + k as u64 * rows;
            l.push(Instr::Load {
                mb: m,
                input: "x".into(),
                samples: [lo, lo + rows],
            });
            l.push(Instr::Compute {
                pass: PieceKind::Fwd,
                mb: m,
            });
            l.push(Instr::Send {
                mb: m,
                tensor: "h".into(),
                peer: s1dev,
                slice: None,
                tag: h_tags[m as usize][k],
                dtype: f32s(),
                shape: vec![rows as i64, HID],
            });
        }
        for m in 0..mbs as u32 {
            l.push(Instr::Recv {
                mb: m,
                tensor: "dh".into(),
                peer: s1dev,
                tag: dh_tags[m as usize][k],
                dtype: f32s(),
                shape: vec![rows as i64, HID],
            });
            l.push(Instr::Compute {
                pass: PieceKind::Bwd,
                mb: m,
            });
            l.push(Instr::Accumulate {
                mb: m,
                tensors: vec!["grad/W1".into()],
            });
            l.push(Instr::Free {
                mb: m,
                tensors: vec!["x".into(), "h".into(), "dh".into()],
            });
        }
        if r0 > 1 {
            l.push(Instr::AllReduce {
                group: (0..r0).collect(),
                tensors: vec!["grad/W1".into()],
                tag: 10_000,
            });
        }
        l.push(Instr::Step);
    }
    let l = &mut lists[s1dev];
    for m in 0..mbs as u32 {
        for (k, &tag) in h_tags[m as usize].iter().enumerate() {
            l.push(Instr::Recv {
                mb: m,
                tensor: if r0 > 1 { format!("h.{k}") } else { "h".into() },
                peer: k,
                tag,
                dtype: f32s(),
                shape: vec![rows as i64, HID],
            });
        }
        if r0 > 1 {
            l.push(Instr::Concat {
                mb: m,
                inputs: (0..r0).map(|k| format!("h.{k}")).collect(),
                output: "h".into(),
                axis: 0,
            });
        }
        l.push(Instr::Compute {
            pass: PieceKind::Fwd,
            mb: m,
        });
        l.push(Instr::Compute {
            pass: PieceKind::Bwd,
            mb: m,
        });
        for (k, &tag) in dh_tags[m as usize].iter().enumerate() {
            l.push(Instr::Send {
                mb: m,
                tensor: "dh".into(),
                peer: k,
                slice: (r0 > 1).then_some(Slice {
                    lo: k as u64,
                    hi: k as u64 + 1,
                    of: r0 as u64,
                    axis: 0,
                }),
                tag,
                dtype: f32s(),
                shape: vec![rows as i64, HID],
            });
        }
        l.push(Instr::Accumulate {
            mb: m,
            tensors: vec!["grad/W2".into()],
        });
        l.push(Instr::Free {
            mb: m,
            tensors: vec!["h".into(), "y".into(), "loss".into(), "dh".into()],
        });
    }
    l.push(Instr::Step);

    let stage =
        |id: usize, devices: Vec<usize>, fwd, bwd, step, p: &str, up, st, loss| StageProgram {
            id,
            devices,
            fwd,
            bwd: Some(bwd),
            bwd_b: None,
            bwd_w: None,
            step: Some(step),
            params: vec![p.to_string()],
            updates: up,
            state_init: st,
            step_counter: Some("step_t".into()),
            loss,
        };
    let program = Program {
        version: PROGRAM_VERSION,
        model: "linear-fixture".into(),
        planner: "hand".into(),
        schedule: "gpipe".into(),
        batch: bsz,
        micro_batch: b,
        micro_batches: mbs,
        loss: "sum".into(),
        optimizer: if spec.momentum {
            format!("sgd:lr={},momentum=0.9", spec.lr)
        } else {
            format!("sgd:lr={}", spec.lr)
        },
        data_inputs: vec![DataInput {
            name: "x".into(),
            dtype: "f32".into(),
            shape: vec![bsz as i64, IN],
            batch_axis: Some(0),
            high: None,
        }],
        weights: "weights.npz".into(),
        stages: vec![
            stage(0, (0..r0).collect(), s0f, s0b, s0s, "W1", up0, st0, None),
            stage(
                1,
                vec![s1dev],
                s1f,
                s1b,
                s1s,
                "W2",
                up1,
                st1,
                Some(("loss".to_string(), 1.0)),
            ),
        ],
        devices: lists
            .into_iter()
            .enumerate()
            .map(|(d, instructions)| DeviceProgram {
                device: d,
                stage: usize::from(d == s1dev),
                replica: if d == s1dev { 0 } else { d },
                instructions,
                chunks: Vec::new(),
            })
            .collect(),
        reference: Some(ReferenceProgram {
            train,
            step: rstep,
            updates: rup,
            state_init: rst,
            step_counter: Some("step_t".into()),
            loss: ("loss".into(), 1.0),
            grads: vec![
                ("grad/W1".into(), "W1".into()),
                ("grad/W2".into(), "W2".into()),
            ],
        }),
        per_micro_batch_step: false,
        vertical_sync: false,
    };
    std::fs::write(outdir.join("schedule.json"), program.to_json())?;
    Ok(program)
}
