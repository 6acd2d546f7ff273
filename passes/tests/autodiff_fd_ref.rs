//! Gradient checks of autodiff rules against central finite differences, run on the
//! reference executor (no python needed): every case is a small graph whose float operands
//! are graph inputs; the loss is `sum(Y * R)` with a fixed random `R` (so no rule can pass by
//! a symmetry of the loss). The training graph runs in float64 and the analytic gradient of
//! every input must match `(L(p + h) - L(p - h)) / 2h` (h = 1e-6) at up to 10 sampled
//! elements to 1e-6 of the gradient's largest magnitude; the same case built in float32 must
//! give the same gradients to 1e-3 (the f32 kernels of every forward and backward op).
//! Values are drawn away from the kinks of piecewise ops by the case's value generator.

use pipec_compiler::ir::{Attr, DType, Graph, Module, OpData, TensorData, TensorType};
use pipec_passes::autodiff::{differentiate, Autodiff};
use pipec_passes::loss::LossKind;
use pipec_runtime::exec::Executor;
use pipec_runtime::reference::Reference;
use pipec_runtime::Tensor;

/// How a float operand's values are drawn.
#[derive(Clone)]
enum Gen {
    /// Standard normal.
    Normal,
    /// Normal values at least `gap` away from each of the points.
    Away(Vec<f64>, f64),
    /// These values.
    Values(Vec<f64>),
}

struct Node {
    op: &'static str,
    ins: Vec<&'static str>,
    outs: Vec<&'static str>,
    attrs: Vec<(&'static str, Attr)>,
}

fn node(op: &'static str, ins: &[&'static str], attrs: Vec<(&'static str, Attr)>) -> Node {
    Node {
        op,
        ins: ins.to_vec(),
        outs: vec!["y"],
        attrs,
    }
}

struct Case {
    name: String,
    opset: i64,
    nodes: Vec<Node>,
    floats: Vec<(&'static str, Vec<usize>, Gen)>,
    ints: Vec<(&'static str, Vec<i64>, Vec<i64>)>,
    /// Float operands that get no gradient (e.g. Clip bounds): fed, not checked.
    fixed: Vec<&'static str>,
}

fn case(name: impl Into<String>, nodes: Vec<Node>) -> Case {
    Case {
        name: name.into(),
        opset: 18,
        nodes,
        floats: Vec::new(),
        ints: Vec::new(),
        fixed: Vec::new(),
    }
}

impl Case {
    fn f(mut self, name: &'static str, shape: &[usize]) -> Self {
        self.floats.push((name, shape.to_vec(), Gen::Normal));
        self
    }
    fn fg(mut self, name: &'static str, shape: &[usize], g: Gen) -> Self {
        self.floats.push((name, shape.to_vec(), g));
        self
    }
    fn i(mut self, name: &'static str, dims: &[i64], vals: &[i64]) -> Self {
        self.ints.push((name, dims.to_vec(), vals.to_vec()));
        self
    }
    /// A float operand that gets no gradient.
    fn fixed(mut self, name: &'static str, vals: &[f64]) -> Self {
        let shape = if vals.len() == 1 {
            vec![]
        } else {
            vec![vals.len()]
        };
        self.floats.push((name, shape, Gen::Values(vals.to_vec())));
        self.fixed.push(name);
        self
    }
    fn opset(mut self, v: i64) -> Self {
        self.opset = v;
        self
    }
}

/// xorshift64* and Box-Muller: deterministic values without a dependency.
struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((v >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    fn draw(&mut self, g: &Gen, n: usize) -> Vec<f64> {
        match g {
            Gen::Values(v) => v.clone(),
            _ => (0..n)
                .map(|_| loop {
                    let x = self.normal();
                    match g {
                        Gen::Away(pts, gap) if pts.iter().any(|p| (x - p).abs() < *gap) => {}
                        _ => break x,
                    }
                })
                .collect(),
        }
    }
}

fn tensor(dt: DType, shape: &[usize], v: &[f64]) -> Tensor {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let dims = shape.iter().map(|d| *d as i64).collect();
    let td = TensorData::from_raw(DType::F64, dims, raw.into()).unwrap();
    Tensor::from_tensor_data(&td).unwrap().cast(dt).unwrap()
}

/// The case's module in element type `dt`, differentiated, and its feeds.
fn training(
    c: &Case,
    vals: &[Vec<f64>],
    dt: DType,
) -> pipec_compiler::Result<(Module, Vec<(String, Tensor)>)> {
    let mut g = Graph::new(&c.name);
    let mut by_name = std::collections::HashMap::new();
    let mut feeds = Vec::new();
    for ((name, shape, _), v) in c.floats.iter().zip(vals) {
        let dims: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
        by_name.insert(*name, g.add_input(*name, TensorType::known(dt, &dims)));
        feeds.push((name.to_string(), tensor(dt, shape, v)));
    }
    for (name, dims, v) in &c.ints {
        by_name.insert(
            *name,
            g.add_initializer(*name, TensorData::from_i64(dims.clone(), v)),
        );
    }
    for (k, n) in c.nodes.iter().enumerate() {
        let inputs = n
            .ins
            .iter()
            .map(|s| (!s.is_empty()).then(|| by_name[s]))
            .collect();
        let data = OpData {
            name: format!("n{k}_{}", n.op),
            op_type: n.op.into(),
            inputs,
            attrs: n
                .attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        };
        let results = n
            .outs
            .iter()
            .map(|o| (o.to_string(), TensorType::unranked(dt)))
            .collect();
        let (_, outs) = g.add_op(data, results);
        for (o, v) in n.outs.iter().zip(outs) {
            by_name.insert(*o, v);
        }
    }
    g.outputs = vec![by_name["y"]];
    let mut m = Module {
        graph: g,
        ir_version: 8,
        ..Default::default()
    };
    m.opset_imports.insert(String::new(), c.opset);
    pipec_compiler::shape::infer_shapes(&mut m)?;
    // Y * R with a fixed random R of Y's shape.
    let y = m.graph.outputs[0];
    let ys = m.graph.ty(y).static_dims().ok_or_else(|| {
        pipec_compiler::Error::msg(format!("no static output shape: {:?}", m.graph.ty(y)))
    })?;
    let mut rng = Rng(0x5eed);
    let n: i64 = ys.iter().product();
    let r = rng.draw(&Gen::Normal, n as usize);
    let ru: Vec<usize> = ys.iter().map(|d| *d as usize).collect();
    let rd = tensor(dt, &ru, &r).to_tensor_data();
    let rv = m.graph.add_initializer("R", rd);
    let (_, outs) = m.graph.add_op(
        OpData {
            name: "weigh".into(),
            op_type: "Mul".into(),
            inputs: vec![Some(y), Some(rv)],
            ..Default::default()
        },
        vec![("yr".into(), TensorType::unranked(dt))],
    );
    m.graph.outputs = outs;
    pipec_compiler::shape::infer_shapes(&mut m)?;
    let opts = Autodiff::with_loss(Some(LossKind::Sum)).wrt_inputs(true);
    differentiate(&mut m, &opts)?;
    pipec_compiler::verify::verify(&m)?;
    Ok((m, feeds))
}

/// Loss and `grad/<input>` of every float input (empty for the case's fixed ones).
fn run(
    m: &Module,
    feeds: &[(String, Tensor)],
    fixed: &[&str],
) -> Result<(f64, Vec<Vec<f64>>), String> {
    let mut p = Reference.prepare(m).map_err(|e| e.to_string())?;
    let out = p.run(feeds).map_err(|e| e.to_string())?;
    let get = |n: &str| -> Result<Vec<f64>, String> {
        out.iter()
            .find(|(k, _)| k == n)
            .map(|(_, t)| t.to_f64().iter().copied().collect())
            .ok_or_else(|| format!("no output '{n}'"))
    };
    let loss = get("loss")?[0];
    let grads = feeds
        .iter()
        .map(|(n, _)| {
            if fixed.contains(&n.as_str()) {
                Ok(Vec::new())
            } else {
                get(&format!("grad/{n}"))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok((loss, grads))
}

/// Check one case; `Err` says what differs.
fn check(c: &Case) -> Result<String, String> {
    let mut rng = Rng(0x1234_5678 ^ c.name.len() as u64);
    let vals: Vec<Vec<f64>> = c
        .floats
        .iter()
        .map(|(_, s, g)| rng.draw(g, s.iter().product()))
        .collect();
    let (m, feeds) = training(c, &vals, DType::F64).map_err(|e| e.to_string())?;
    let (_, an) = run(&m, &feeds, &c.fixed)?;
    let h = 1e-6;
    let mut worst = 0.0f64;
    for (k, (name, shape, _)) in c.floats.iter().enumerate() {
        if c.fixed.contains(name) {
            continue;
        }
        let scale = an[k].iter().fold(1e-3f64, |a, v| a.max(v.abs()));
        let n = vals[k].len();
        let picks: Vec<usize> = if n <= 10 {
            (0..n).collect()
        } else {
            (0..10)
                .map(|_| (rng.uniform() * n as f64) as usize)
                .collect()
        };
        for i in picks {
            let mut lf = [0.0; 2];
            for (s, sign) in [1.0, -1.0].iter().enumerate() {
                let mut v = vals[k].clone();
                v[i] += sign * h;
                let mut f = feeds.clone();
                f[k].1 = tensor(DType::F64, shape, &v);
                lf[s] = run(&m, &f, &c.fixed)?.0;
            }
            let fd = (lf[0] - lf[1]) / (2.0 * h);
            let e = (fd - an[k][i]).abs() / scale;
            // A NaN gradient fails too (NaN compares false with everything).
            if e.is_nan() || e > 1e-6 {
                return Err(format!(
                    "d loss / d {name}[{i}]: analytic {} vs finite difference {fd} (error {e:.1e} of {scale:.2e})",
                    an[k][i]
                ));
            }
            worst = worst.max(e);
        }
    }
    // The same graph in float32.
    let (m32, f32s) = training(c, &vals, DType::F32).map_err(|e| format!("f32: {e}"))?;
    let (_, an32) = run(&m32, &f32s, &c.fixed).map_err(|e| format!("f32: {e}"))?;
    let mut worst32 = 0.0f64;
    for (k, (name, _, _)) in c.floats.iter().enumerate() {
        let scale = an[k].iter().fold(1e-3f64, |a, v| a.max(v.abs()));
        for (i, (a, b)) in an[k].iter().zip(&an32[k]).enumerate() {
            let e = (a - b).abs() / scale;
            if e.is_nan() || e > 1e-3 {
                return Err(format!(
                    "f32 gradient of {name}[{i}] is {b}, f64 gives {a} (error {e:.1e})"
                ));
            }
            worst32 = worst32.max(e);
        }
    }
    Ok(format!("fd {worst:.1e}, f32 {worst32:.1e}"))
}

fn run_cases(cases: Vec<Case>) {
    let mut bad = Vec::new();
    for c in &cases {
        match check(c) {
            Ok(msg) => eprintln!("ok   {:32} {msg}", c.name),
            Err(e) => {
                eprintln!("FAIL {:32} {e}", c.name);
                bad.push(format!("{}: {e}", c.name));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} cases failed:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

fn f(v: f32) -> Attr {
    Attr::Float(v)
}
fn int(v: i64) -> Attr {
    Attr::Int(v)
}
fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}
fn s(v: &str) -> Attr {
    Attr::String(v.into())
}

#[test]
fn activations_match_finite_differences() {
    let away = |p: &[f64]| Gen::Away(p.to_vec(), 1e-3);
    let sh = [3, 5];
    let un = |op: &'static str, attrs: Vec<(&'static str, Attr)>, g: Gen| {
        case(
            format!("{op}{}", if attrs.is_empty() { "" } else { "_attrs" }),
            vec![node(op, &["x"], attrs)],
        )
        .fg("x", &sh, g)
    };
    run_cases(vec![
        un("HardSigmoid", vec![], away(&[-2.5, 2.5])),
        // alpha/beta put both kinks inside the sampled range
        un(
            "HardSigmoid",
            vec![("alpha", f(0.7)), ("beta", f(0.4))],
            away(&[-4.0 / 7.0, 6.0 / 7.0]),
        ),
        un(
            "HardSwish",
            vec![],
            Gen::Values((0..15).map(|i| -4.1 + 0.6 * i as f64).collect()),
        ),
        un("Elu", vec![], away(&[0.0])),
        un("Elu", vec![("alpha", f(0.3))], away(&[0.0])),
        un("Selu", vec![], away(&[0.0])),
        un(
            "Selu",
            vec![("alpha", f(1.2)), ("gamma", f(0.8))],
            away(&[0.0]),
        ),
        un("Celu", vec![], away(&[0.0])),
        un("Celu", vec![("alpha", f(2.5))], away(&[0.0])),
        un("Softplus", vec![], Gen::Normal),
        un("Softsign", vec![], away(&[0.0])),
        un("Mish", vec![], Gen::Normal),
        un("ThresholdedRelu", vec![], away(&[1.0])),
        un("ThresholdedRelu", vec![("alpha", f(-0.4))], away(&[-0.4])),
        un("Gelu", vec![("approximate", s("tanh"))], Gen::Normal).opset(20),
        un("Gelu", vec![], Gen::Normal).opset(20),
        un("Sin", vec![], Gen::Normal),
        un("Cos", vec![], Gen::Normal),
        un("LeakyRelu", vec![("alpha", f(0.2))], away(&[0.0])),
        case("PRelu_channel", vec![node("PRelu", &["x", "s"], vec![])])
            .fg("x", &[2, 3, 4], away(&[0.0]))
            .f("s", &[3, 1]),
        case("PRelu_scalar", vec![node("PRelu", &["x", "s"], vec![])])
            .fg("x", &[2, 3], away(&[0.0]))
            .f("s", &[1]),
        case("CumSum", vec![node("CumSum", &["x", "ax"], vec![])])
            .f("x", &[3, 4])
            .i("ax", &[], &[1]),
        case(
            "CumSum_rev_excl",
            vec![node(
                "CumSum",
                &["x", "ax"],
                vec![("reverse", int(1)), ("exclusive", int(1))],
            )],
        )
        .f("x", &[3, 4])
        .i("ax", &[], &[0]),
        case(
            "ReduceL1",
            vec![node("ReduceL1", &["x", "ax"], vec![("keepdims", int(0))])],
        )
        .fg("x", &[3, 4], away(&[0.0]))
        .i("ax", &[1], &[1]),
        case("Tile", vec![node("Tile", &["x", "r"], vec![])])
            .f("x", &[2, 3])
            .i("r", &[2], &[3, 2]),
    ]);
}

#[test]
fn an_op_without_a_rule_is_refused_with_node_op_and_advice() {
    let c = case("atan", vec![node("Atan", &["x"], vec![])]).f("x", &[2, 3]);
    let Err(e) = training(&c, &[vec![0.5; 6]], DType::F64) else {
        panic!("Atan has no gradient rule, yet autodiff accepted it");
    };
    let e = e.to_string();
    for want in [
        "n0_Atan",
        "no gradient rule for op type 'Atan'",
        "through its operand 'x'",
        "decomposed into ops that have rules",
        "file an issue",
        "Ops with gradient rules: Abs, Add,",
        "ConvTranspose",
        "HardSigmoid",
    ] {
        assert!(e.contains(want), "missing {want:?} in: {e}");
    }
}

#[test]
fn conv_transpose_matches_finite_differences() {
    let ct =
        |name: &str, attrs: Vec<(&'static str, Attr)>, x: &[usize], w: &[usize], bias: bool| {
            let ins: &[&'static str] = if bias { &["x", "w", "b"] } else { &["x", "w"] };
            let mut c = case(
                format!("ConvTranspose_{name}"),
                vec![node("ConvTranspose", ins, attrs)],
            )
            .f("x", x)
            .f("w", w);
            if bias {
                let m = w[1] * attrs_group(&c);
                c = c.f("b", &[m]);
            }
            c
        };
    run_cases(vec![
        ct("2d_plain", vec![], &[2, 3, 4, 5], &[3, 2, 3, 3], true),
        ct(
            "2d_s2_pads_outpad",
            vec![
                ("strides", ints(&[2, 2])),
                ("pads", ints(&[1, 0, 2, 1])),
                ("output_padding", ints(&[1, 0])),
            ],
            &[2, 3, 3, 4],
            &[3, 2, 3, 3],
            true,
        ),
        ct(
            "2d_group2_dil",
            vec![
                ("group", int(2)),
                ("dilations", ints(&[2, 1])),
                ("pads", ints(&[1, 1, 0, 1])),
            ],
            &[1, 4, 3, 4],
            &[4, 3, 3, 2],
            true,
        ),
        ct(
            "2d_depthwise_s2",
            vec![
                ("group", int(3)),
                ("strides", ints(&[2, 2])),
                ("kernel_shape", ints(&[3, 3])),
            ],
            &[2, 3, 3, 3],
            &[3, 1, 3, 3],
            false,
        ),
        ct(
            "2d_output_shape",
            vec![("strides", ints(&[2, 2])), ("output_shape", ints(&[6, 8]))],
            &[1, 2, 3, 4],
            &[2, 2, 3, 3],
            true,
        ),
        ct(
            "2d_output_shape_nchw",
            vec![
                ("strides", ints(&[2, 1])),
                ("output_shape", ints(&[1, 2, 7, 5])),
            ],
            &[1, 2, 3, 4],
            &[2, 2, 3, 3],
            false,
        ),
        ct(
            "2d_same_upper",
            vec![("strides", ints(&[2, 2])), ("auto_pad", s("SAME_UPPER"))],
            &[1, 2, 3, 3],
            &[2, 3, 3, 3],
            true,
        ),
        ct(
            "2d_same_lower",
            vec![("strides", ints(&[2, 2])), ("auto_pad", s("SAME_LOWER"))],
            &[1, 2, 3, 3],
            &[2, 3, 3, 3],
            true,
        ),
        ct(
            "2d_valid",
            vec![("strides", ints(&[2, 3])), ("auto_pad", s("VALID"))],
            &[1, 2, 3, 3],
            &[2, 2, 2, 3],
            false,
        ),
        ct(
            "1d_s3_d2_pads_outpad",
            vec![
                ("strides", ints(&[3])),
                ("dilations", ints(&[2])),
                ("pads", ints(&[2, 1])),
                ("output_padding", ints(&[2])),
            ],
            &[2, 3, 5],
            &[3, 4, 3],
            true,
        ),
        // output_padding >= stride (allowed while < dilation): dX is cut back to X's length
        ct(
            "1d_outpad_ge_stride",
            vec![("dilations", ints(&[3])), ("output_padding", ints(&[2]))],
            &[2, 2, 4],
            &[2, 3, 2],
            true,
        ),
        ct(
            "1d_same_upper_g2",
            vec![
                ("group", int(2)),
                ("strides", ints(&[2])),
                ("auto_pad", s("SAME_UPPER")),
            ],
            &[2, 4, 5],
            &[4, 1, 4],
            true,
        ),
    ]);
}

/// Output channels per group times groups: the `group` attribute of the case's node.
fn attrs_group(c: &Case) -> usize {
    c.nodes[0]
        .attrs
        .iter()
        .find(|(k, _)| *k == "group")
        .and_then(|(_, a)| a.as_int())
        .unwrap_or(1) as usize
}

#[test]
fn normalizations_match_finite_differences() {
    let nrm =
        |name: &str, op: &'static str, attrs: Vec<(&'static str, Attr)>, x: &[usize], sb: usize| {
            case(
                format!("{op}_{name}"),
                vec![node(op, &["x", "s", "b"], attrs)],
            )
            .f("x", x)
            .f("s", &[sb])
            .f("b", &[sb])
        };
    run_cases(vec![
        nrm("4d", "InstanceNormalization", vec![], &[2, 3, 4, 5], 3),
        nrm(
            "3d_eps",
            "InstanceNormalization",
            vec![("epsilon", f(1e-3))],
            &[2, 3, 6],
            3,
        ),
        nrm(
            "opset18_per_group",
            "GroupNormalization",
            vec![("num_groups", int(3))],
            &[2, 6, 3, 2],
            3,
        ),
        nrm(
            "opset21_per_channel",
            "GroupNormalization",
            vec![("num_groups", int(3))],
            &[2, 6, 3, 2],
            6,
        )
        .opset(21),
        nrm(
            "opset21_one_group",
            "GroupNormalization",
            vec![("num_groups", int(1)), ("epsilon", f(1e-4))],
            &[3, 4, 5],
            4,
        )
        .opset(21),
        nrm(
            "opset21_groups_eq_channels",
            "GroupNormalization",
            vec![("num_groups", int(4))],
            &[2, 4, 7],
            4,
        )
        .opset(21),
    ]);
}

#[test]
fn pad_modes_match_finite_differences() {
    let pad = |name: &str, mode: &str, x: &[usize], pads: &[i64]| {
        case(
            format!("Pad_{mode}_{name}"),
            vec![node("Pad", &["x", "p"], vec![("mode", s(mode))])],
        )
        .f("x", x)
        .i("p", &[pads.len() as i64], pads)
    };
    run_cases(vec![
        pad("2d", "constant", &[3, 4], &[1, 0, 2, 3]),
        pad("crop", "constant", &[3, 5], &[-1, 2, 1, -2]),
        case(
            "Pad_constant_value",
            vec![node("Pad", &["x", "p", "v"], vec![])],
        )
        .f("x", &[2, 3])
        .f("v", &[])
        .i("p", &[4], &[1, 1, 0, 2]),
        pad("nchw", "reflect", &[1, 2, 4, 5], &[0, 0, 2, 1, 0, 0, 1, 3]),
        pad("crop", "reflect", &[2, 5], &[0, -1, 0, 3]),
        pad("nchw", "edge", &[1, 2, 3, 4], &[0, 0, 3, 1, 0, 0, 1, 2]),
        pad("nchw", "wrap", &[1, 2, 3, 4], &[0, 0, 2, 1, 0, 0, 1, 3]).opset(19),
        pad("beyond_size", "wrap", &[2, 3], &[0, 4, 0, 5]).opset(19),
        pad("beyond_size", "reflect", &[2, 3], &[0, 5, 0, 4]),
        case(
            "Pad_reflect_axes",
            vec![node(
                "Pad",
                &["x", "p", "", "ax"],
                vec![("mode", s("reflect"))],
            )],
        )
        .f("x", &[2, 3, 4])
        .i("p", &[4], &[1, 2, 2, 1])
        .i("ax", &[2], &[-1, 1]),
        case(
            "Pad_constant_axes",
            vec![node("Pad", &["x", "p", "", "ax"], vec![])],
        )
        .f("x", &[2, 3, 4])
        .i("p", &[2], &[2, 1])
        .i("ax", &[1], &[1]),
    ]);
}

#[test]
fn clip_and_einsum_match_finite_differences() {
    let away = |p: &[f64]| Gen::Away(p.to_vec(), 1e-3);
    let clip = |name: &str, ins: &[&'static str]| {
        case(format!("Clip_{name}"), vec![node("Clip", ins, vec![])]).fg(
            "x",
            &[3, 4],
            away(&[-0.5, 0.7]),
        )
    };
    let es = |name: &str, eq: &str, shapes: &[&[usize]]| {
        let names: &[&'static str] = &["a", "b", "c"];
        let mut c = case(
            format!("Einsum_{name}"),
            vec![node(
                "Einsum",
                &names[..shapes.len()],
                vec![("equation", s(eq))],
            )],
        );
        for (n, sh) in names.iter().zip(shapes) {
            c = c.f(n, sh);
        }
        c
    };
    run_cases(vec![
        clip("none", &["x"]),
        clip("both", &["x", "lo", "hi"])
            .fixed("lo", &[-0.5])
            .fixed("hi", &[0.7]),
        clip("min_only", &["x", "lo"]).fixed("lo", &[-0.5]),
        clip("max_only", &["x", "", "hi"]).fixed("hi", &[0.7]),
        // attention scores and their application (multi-head), linear layers, outer products
        es(
            "attn_scores",
            "bhqd,bhkd->bhqk",
            &[&[2, 2, 3, 4], &[2, 2, 5, 4]],
        ),
        es(
            "attn_apply",
            "bhqk,bhkd->bhqd",
            &[&[2, 2, 3, 5], &[2, 2, 5, 4]],
        ),
        es("linear_ellipsis", "...d,de->...e", &[&[2, 3, 4], &[4, 5]]),
        es("heads_split", "bsd,dhe->bshe", &[&[2, 3, 4], &[4, 2, 3]]),
        es("heads_merge", "bshe,hed->bsd", &[&[2, 3, 2, 3], &[2, 3, 4]]),
        es("outer", "i,j->ij", &[&[3], &[4]]),
        es("transpose", "bij->bji", &[&[2, 3, 4]]),
        es("sum_axis", "ij->j", &[&[3, 4]]),
        es("batched_dot", "bi,bi->b", &[&[3, 4], &[3, 4]]),
        es("implicit_chain", "ij,jk,kl", &[&[2, 3], &[3, 4], &[4, 2]]),
    ]);
}

/// `x[:, :shape(x)[2] - 1]`-style bounds of real exports: `Slice` ends computed by
/// `Shape -> Gather -> Sub -> Unsqueeze` are no `Constant` but shape inference knows them.
#[test]
fn slice_with_shape_computed_bounds_matches_finite_differences() {
    let n = |op: &'static str, ins: &[&'static str], out: &'static str, attrs| Node {
        op,
        ins: ins.to_vec(),
        outs: vec![out],
        attrs,
    };
    run_cases(vec![case(
        "Slice_shape_bounds",
        vec![
            n("Shape", &["x"], "s", vec![]),
            n("Gather", &["s", "two"], "d", vec![("axis", int(0))]),
            n("Sub", &["d", "one"], "e", vec![]),
            n("Unsqueeze", &["e", "zero"], "ends", vec![]),
            n("Slice", &["x", "starts", "ends", "axes"], "y", vec![]),
        ],
    )
    .f("x", &[2, 3, 5])
    .i("two", &[], &[2])
    .i("one", &[], &[1])
    .i("zero", &[1], &[0])
    .i("starts", &[1], &[1])
    .i("axes", &[1], &[2])]);
}

/// Strided slices (Swin's patch merging `x[:, 0::2, 1::2]`, odd sizes, ends past the end).
#[test]
fn strided_slice_matches_finite_differences() {
    let sl = |name: &str, x: &[usize], st: &[i64], en: &[i64], ax: &[i64], sp: &[i64]| {
        let k = st.len() as i64;
        case(
            format!("Slice_step_{name}"),
            vec![node("Slice", &["x", "s", "e", "a", "p"], vec![])],
        )
        .f("x", x)
        .i("s", &[k], st)
        .i("e", &[k], en)
        .i("a", &[k], ax)
        .i("p", &[k], sp)
    };
    run_cases(vec![
        sl(
            "patch_merge",
            &[2, 4, 6, 3],
            &[0, 1],
            &[i64::MAX, i64::MAX],
            &[1, 2],
            &[2, 2],
        ),
        sl("odd", &[2, 7, 5], &[1, 0], &[7, 5], &[1, 2], &[3, 2]),
        sl("with_step_1", &[3, 8], &[1, 2], &[3, -1], &[0, 1], &[1, 4]),
    ]);
}

/// `ScatterND` (Swin V2 zeroes the key bias with it): the data gets dY except at the written
/// slices, the updates get dY gathered there; `reduction = add` passes dY to the data whole.
#[test]
fn scatter_nd_matches_finite_differences() {
    let sc = |name: &str,
              attrs: Vec<(&'static str, Attr)>,
              idx_dims: &[i64],
              idx: &[i64],
              upd: &[usize]| {
        case(
            format!("ScatterND_{name}"),
            vec![node("ScatterND", &["x", "idx", "u"], attrs)],
        )
        .f("x", &[4, 3])
        .i("idx", idx_dims, idx)
        .f("u", upd)
    };
    run_cases(vec![
        // rows 1 and 3 replaced
        sc("rows", vec![], &[2, 1], &[1, 3], &[2, 3]),
        // single elements
        sc("elements", vec![], &[3, 2], &[0, 0, 2, 1, 3, 2], &[3]),
        sc(
            "rows_add",
            vec![("reduction", s("add"))],
            &[2, 1],
            &[1, 3],
            &[2, 3],
        ),
    ]);
}

/// `ReduceL2` of an all-zero row (Swin V2's padded keys): the gradient there is 0, as PyTorch's
/// and the central difference (|h| - |-h|) / 2h say, not 0/0.
#[test]
fn reduce_l2_of_a_zero_row_has_a_zero_gradient() {
    let x = vec![
        0.5, -1.0, 2.0, 0.25, //
        0.0, 0.0, 0.0, 0.0, //
        -0.75, 1.5, 0.3, -2.0,
    ];
    run_cases(vec![case(
        "ReduceL2_zero_row",
        vec![node("ReduceL2", &["x", "axes"], vec![("keepdims", int(1))])],
    )
    .fg("x", &[3, 4], Gen::Values(x))
    .i("axes", &[1], &[1])]);
}
