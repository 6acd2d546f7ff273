//! `optimizer`: appends the parameter update of one training step (SGD or Adam, PyTorch
//! semantics) to a training graph made by [`crate::transforms::autodiff`], as standard ONNX ops
//! (`pipec.phase = opt`).
//!
//! - **Requires**: module attrs `pipec.params` / `pipec.grads` (parallel name lists), as
//!   `autodiff` records them.
//! - **Guarantees**: for every parameter `P` (an initializer, its current value) with gradient `G`:
//!   - gradient accumulation over `M` micro-batches (`micro_batches`, default 1): with `M > 1`
//!     a graph input `grad_acc/P` holds the sum of the gradients of the first `M-1`
//!     micro-batches and the update uses `g = (grad_acc/P + G) / M` (sum then scale by `1/M`);
//!     with `M = 1`, `g = G`;
//!   - weight decay (L2, as `torch.optim`): `g <- g + wd * P`;
//!   - **SGD**: with `momentum > 0`, state input `opt/P/momentum` (`buf`) and output
//!     `opt/P/momentum.out` = `momentum * buf + g` (zeros as the first state reproduce PyTorch's
//!     first step); `P' = P - lr * buf'` (or `P - lr * g` without momentum);
//!   - **Adam** (Kingma & Ba 2015, Alg. 1): state inputs `opt/P/m`, `opt/P/v`, one shared 0-D
//!     input `opt/step` (the 1-based step number `t`, same element type as the parameters);
//!     `m' = b1 m + (1 - b1) g`, `v' = b2 v + (1 - b2) g^2`,
//!     `P' = P - lr * (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps)`;
//!     outputs `opt/P/m.out`, `opt/P/v.out`;
//!   - the updated parameter is the graph output `update/P`.
//!
//!   New graph inputs come after the existing ones; new outputs after the existing ones, per
//!   parameter in `pipec.params` order: `update/P`, then its state outputs. Module attrs
//!   `pipec.optimizer` (the options), `pipec.opt_inputs` (every input added: `opt/step`,
//!   `grad_acc/P`, state) and `pipec.opt_state_outputs` (the new state values) record the wiring;
//!   a state output `X.out` is fed back as input `X` on the next step.
//! - **Invalidates**: graph inputs and outputs.
//! - **Statistics**: `updated-params`, `state-tensors`.
//! - **Options**: [`OptimizerKind`] (`sgd:lr=0.01[,momentum=0.9][,weight_decay=0]`,
//!   `adam:lr=0.001[,beta1=0.9][,beta2=0.999][,eps=1e-8][,weight_decay=0]`) and the number of
//!   micro-batches.

use crate::transforms::autodiff::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{Attr, DType, Module, TensorType, Value};
use pipec_compiler::passmgr::{OptionKind, PassInfo, PassOption};
use pipec_compiler::passmgr::{Pass, Stats};
use pipec_compiler::Result;
use std::str::FromStr;

/// Which update rule, with its hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum OptimizerKind {
    Sgd {
        lr: f64,
        momentum: f64,
        weight_decay: f64,
    },
    Adam {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

impl FromStr for OptimizerKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        let mut kv = std::collections::BTreeMap::new();
        for part in rest.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                Error::Usage(format!("optimizer option '{part}' is not KEY=VALUE"))
            })?;
            let v: f64 = v.parse().map_err(|_| {
                Error::Usage(format!("optimizer option '{k}': '{v}' is not a number"))
            })?;
            kv.insert(k.to_string(), v);
        }
        let mut take = |k: &str, d: f64| kv.remove(k).unwrap_or(d);
        let out = match kind {
            "sgd" => OptimizerKind::Sgd {
                lr: take("lr", 0.01),
                momentum: take("momentum", 0.0),
                weight_decay: take("weight_decay", 0.0),
            },
            "adam" => OptimizerKind::Adam {
                lr: take("lr", 0.001),
                beta1: take("beta1", 0.9),
                beta2: take("beta2", 0.999),
                eps: take("eps", 1e-8),
                weight_decay: take("weight_decay", 0.0),
            },
            _ => {
                return Err(Error::Usage(format!(
                    "unknown optimizer '{kind}' (known: sgd, adam)"
                )))
            }
        };
        if let Some(k) = kv.keys().next() {
            return Err(Error::Usage(format!(
                "unknown option '{k}' for optimizer '{kind}'"
            )));
        }
        Ok(out)
    }
}

/// The `optimizer` pass.
#[derive(Clone, Debug)]
pub struct Optimizer {
    pub kind: OptimizerKind,
    /// Micro-batches whose gradients are accumulated before the step (>= 1).
    pub micro_batches: u32,
}

impl Default for Optimizer {
    fn default() -> Self {
        Optimizer {
            kind: OptimizerKind::Sgd {
                lr: 0.01,
                momentum: 0.0,
                weight_decay: 0.0,
            },
            micro_batches: 1,
        }
    }
}

impl Optimizer {
    /// An optimizer step of `kind` after `micro_batches` micro-batches.
    pub fn new(kind: OptimizerKind, micro_batches: u32) -> Self {
        Optimizer {
            kind,
            micro_batches,
        }
    }
}

/// The contract of `optimizer` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "optimizer",
    summary:
        "appends the SGD/Adam parameter update (with gradient accumulation) to a training graph",
    options: &[
        PassOption {
            name: "type",
            kind: OptionKind::OneOf(&["sgd", "adam"]),
            default: "sgd",
            help: "the update rule",
        },
        PassOption {
            name: "micro-batches",
            kind: OptionKind::Count,
            default: "1",
            help: "micro-batches whose gradients are accumulated before the step",
        },
        PassOption {
            name: "lr",
            kind: OptionKind::Number,
            default: "0.01 (sgd), 0.001 (adam)",
            help: "learning rate",
        },
        PassOption {
            name: "momentum",
            kind: OptionKind::Number,
            default: "0",
            help: "SGD momentum",
        },
        PassOption {
            name: "weight_decay",
            kind: OptionKind::Number,
            default: "0",
            help: "L2 weight decay",
        },
        PassOption {
            name: "beta1",
            kind: OptionKind::Number,
            default: "0.9",
            help: "Adam's first-moment decay",
        },
        PassOption {
            name: "beta2",
            kind: OptionKind::Number,
            default: "0.999",
            help: "Adam's second-moment decay",
        },
        PassOption {
            name: "eps",
            kind: OptionKind::Number,
            default: "1e-8",
            help: "Adam's epsilon",
        },
    ],
    statistics: &["state-tensors", "updated-params"],
    requires: &[("pipec.params", "autodiff")],
    provides: &[],
    invalidates: &["pipec.stages"],
};

impl Pass for Optimizer {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(&self, module: &mut Module, stats: &mut Stats) -> Result<()> {
        let (n, s) = add_optimizer(module, self)?;
        stats.add("updated-params", n as u64);
        stats.add("state-tensors", s as u64);
        Ok(())
    }
}

fn names_attr(m: &Module, key: &str) -> Result<Vec<String>> {
    match m.attrs.get(key) {
        Some(Attr::Strings(v)) => Ok(v.clone()),
        _ => Err(Error::msg(format!(
            "optimizer: the module has no '{key}' attribute (run autodiff first)"
        ))),
    }
}

/// Append the update ops (see the module doc); returns (parameters updated, state tensors).
pub fn add_optimizer(m: &mut Module, opt: &Optimizer) -> Result<(usize, usize)> {
    if opt.micro_batches == 0 {
        return Err(Error::Usage("optimizer: micro_batches must be >= 1".into()));
    }
    let params = names_attr(m, "pipec.params")?;
    let grads = names_attr(m, "pipec.grads")?;
    if params.len() != grads.len() {
        return Err(Error::msg(
            "optimizer: pipec.params and pipec.grads differ in length",
        ));
    }
    let by_name = |g: &pipec_compiler::ir::Graph, n: &str| -> Result<Value> {
        g.values_by_name()
            .get(n)
            .copied()
            .ok_or_else(|| Error::named(n, "optimizer: no such value"))
    };
    let mut pairs = Vec::new();
    for (p, gname) in params.iter().zip(&grads) {
        pairs.push((by_name(&m.graph, p)?, by_name(&m.graph, gname)?));
    }
    let dt = pairs
        .first()
        .map(|(p, _)| m.graph.ty(*p).dtype)
        .unwrap_or(DType::F32);
    // New inputs first (before the builder reserves names).
    let mut state_in: Vec<String> = Vec::new();
    let mut state_out: Vec<String> = Vec::new();
    let step = match opt.kind {
        OptimizerKind::Adam { .. } => {
            Some(m.graph.add_input("opt/step", TensorType::known(dt, &[])))
        }
        _ => None,
    };
    let mut ins = Vec::new();
    for (p, _) in &pairs {
        let ty = m.graph.ty(*p).clone();
        let name = m.graph.name(*p).to_string();
        let mut add = |suffix: &str, m: &mut Module| {
            let n = format!("{suffix}{name}");
            state_in.push(n.clone());
            m.graph.add_input(n, ty.clone())
        };
        let acc = (opt.micro_batches > 1).then(|| add("grad_acc/", m));
        let st: Vec<Value> = match opt.kind {
            OptimizerKind::Sgd { momentum, .. } if momentum > 0.0 => {
                let n = format!("opt/{name}/momentum");
                state_in.push(n.clone());
                vec![m.graph.add_input(n, ty.clone())]
            }
            OptimizerKind::Sgd { .. } => vec![],
            OptimizerKind::Adam { .. } => {
                let a = format!("opt/{name}/m");
                let b = format!("opt/{name}/v");
                state_in.push(a.clone());
                state_in.push(b.clone());
                vec![
                    m.graph.add_input(a, ty.clone()),
                    m.graph.add_input(b, ty.clone()),
                ]
            }
        };
        ins.push((acc, st));
    }
    if step.is_some() {
        state_in.insert(0, "opt/step".into());
    }
    let mut b = Builder::new(&mut m.graph, "opt");
    let mut new_outputs = Vec::new();
    let mut n_state = 0;
    for ((p, gv), (acc, st)) in pairs.iter().zip(ins) {
        let pname = b.g.name(*p).to_string();
        b.prefix = format!("opt/{pname}");
        let pdt = b.dt(*p);
        let mut g = *gv;
        if let Some(acc) = acc {
            let s = b.add(acc, g);
            let k = b.scalar(pdt, 1.0 / opt.micro_batches as f64)?;
            g = b.mul(s, k);
        }
        let wd = match opt.kind {
            OptimizerKind::Sgd { weight_decay, .. } | OptimizerKind::Adam { weight_decay, .. } => {
                weight_decay
            }
        };
        if wd != 0.0 {
            let k = b.scalar(pdt, wd)?;
            let t = b.mul(*p, k);
            g = b.add(g, t);
        }
        let mut outs: Vec<(Value, String)> = Vec::new();
        let newp = match opt.kind {
            OptimizerKind::Sgd { lr, momentum, .. } => {
                let dir = if momentum > 0.0 {
                    let mo = b.scalar(pdt, momentum)?;
                    let t = b.mul(st[0], mo);
                    let buf = b.add(t, g);
                    outs.push((buf, format!("opt/{pname}/momentum.out")));
                    buf
                } else {
                    g
                };
                let k = b.scalar(pdt, lr)?;
                let t = b.mul(dir, k);
                b.sub(*p, t)
            }
            OptimizerKind::Adam {
                lr,
                beta1,
                beta2,
                eps,
                ..
            } => {
                let t = step.ok_or_else(|| Error::msg("optimizer: no step input"))?;
                let (b1, b2) = (b.scalar(pdt, beta1)?, b.scalar(pdt, beta2)?);
                let (c1, c2) = (b.scalar(pdt, 1.0 - beta1)?, b.scalar(pdt, 1.0 - beta2)?);
                let one = b.scalar(pdt, 1.0)?;
                let x = b.mul(st[0], b1);
                let y = b.mul(g, c1);
                let m1 = b.add(x, y);
                let g2 = b.mul(g, g);
                let x = b.mul(st[1], b2);
                let y = b.mul(g2, c2);
                let v1 = b.add(x, y);
                let tt = b.cast(t, pdt);
                let p1 = b.bin("Pow", b1, tt);
                let bc1 = b.sub(one, p1);
                let p2 = b.bin("Pow", b2, tt);
                let bc2 = b.sub(one, p2);
                let mhat = b.div(m1, bc1);
                let vhat = b.div(v1, bc2);
                let sq = b.un("Sqrt", vhat);
                let e = b.scalar(pdt, eps)?;
                let den = b.add(sq, e);
                let upd = b.div(mhat, den);
                let k = b.scalar(pdt, lr)?;
                let upd = b.mul(upd, k);
                outs.push((m1, format!("opt/{pname}/m.out")));
                outs.push((v1, format!("opt/{pname}/v.out")));
                b.sub(*p, upd)
            }
        };
        outs.insert(0, (newp, format!("update/{pname}")));
        for (i, (v, name)) in outs.into_iter().enumerate() {
            // A fresh Identity gives every output its documented name.
            let dtv = b.dt(v);
            let o = b.op1("Identity", &[v], vec![], dtv);
            let n = b.fresh(&name);
            b.g.values[o].name = n.clone();
            if i > 0 {
                state_out.push(n);
                n_state += 1;
            }
            new_outputs.push(o);
        }
    }
    let count = pairs.len();
    m.graph.outputs.extend(new_outputs);
    let spec = format!("{:?}", opt.kind);
    m.attrs.insert("pipec.optimizer".into(), Attr::String(spec));
    m.attrs
        .insert("pipec.opt_inputs".into(), Attr::Strings(state_in));
    m.attrs
        .insert("pipec.opt_state_outputs".into(), Attr::Strings(state_out));
    pipec_compiler::shape::infer_shapes(m)?;
    Ok((count, n_state))
}
