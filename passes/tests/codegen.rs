//! Codegen on hand-made stage splits (no planner in between): what the planners may produce
//! but rarely do.

use pipec_compiler::ir::{DType, Dim, Module, OpData, TensorData, TensorType, Value};
use pipec_compiler::program::{self, Instr};
use pipec_passes::codegen::{compile, CompileOptions};
use pipec_passes::loss::LossKind;
use pipec_passes::plan::StageSpec;
use pipec_passes::sim::ScheduleKind;

fn act(n: i64) -> TensorType {
    TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(n)])
}

fn op(m: &mut Module, ty: &str, ins: &[Value], out: TensorType) -> Value {
    let name = format!("{}{}", ty.to_lowercase(), m.graph.order.len());
    let data = OpData {
        name: name.clone(),
        op_type: ty.into(),
        inputs: ins.iter().map(|v| Some(*v)).collect(),
        ..Default::default()
    };
    m.graph.add_op(data, vec![(format!("{name}_out"), out)]).1[0]
}

fn options(micro_batch: u64) -> CompileOptions {
    CompileOptions {
        model_name: "m".into(),
        planner: "straight".into(),
        micro_batch: pipec_passes::plan::MicroBatch::new(8, micro_batch).unwrap(),
        schedule: ScheduleKind::OneFOneB,
        loss: LossKind::MeanSquare,
        optimizer: "sgd:lr=0.1".parse().unwrap(),
        optimizer_spec: "sgd:lr=0.1".into(),
        per_stage: None,
        vertical_sync: false,
        pass_orders: None,
    }
}

/// Stage 0 only preprocesses the data (no parameter); stage 1 trains on the result. The value
/// crossing the stages is float but depends on no parameter, so no cotangent goes back for it
/// (stage 0 has no backward to receive one): before, stage 1 sent `grad/<value>` that nobody
/// received and the verifier refused the program (the DLRM dense-feature `Slice` under bapipe).
#[test]
fn a_parameter_free_activation_gets_no_cotangent() {
    let mut m = Module {
        ir_version: 8,
        opset_imports: [(String::new(), 17)].into(),
        ..Default::default()
    };
    let x = m.graph.add_input("x", act(4));
    let w = m
        .graph
        .add_initializer("w", TensorData::from_f32(vec![4, 3], &[0.25; 12]));
    let pre = op(&mut m, "Neg", &[x], act(4));
    let y = op(&mut m, "MatMul", &[pre, w], act(3));
    m.graph.outputs.push(y);
    let specs = vec![
        StageSpec {
            nodes: vec![0],
            devices: vec![0],
        },
        StageSpec {
            nodes: vec![1],
            devices: vec![1, 2],
        },
    ];
    let c = compile(&m, &specs, &options(4)).expect("compiles");
    program::verify(&c.program).unwrap();
    assert!(c.program.stages[0].bwd.is_none());
    let grads_sent: Vec<&Instr> = c
        .program
        .devices
        .iter()
        .flat_map(|d| &d.instructions)
        .filter(|i| matches!(i, Instr::Send { tensor, .. } if tensor.starts_with("grad/")))
        .collect();
    assert!(grads_sent.is_empty(), "{grads_sent:?}");
    // The activation itself still goes forward, split over stage 1's two replicas.
    let fwd_sends = c.program.devices[0]
        .instructions
        .iter()
        .filter(|i| matches!(i, Instr::Send { .. }))
        .count();
    assert_eq!(fwd_sends, 2 * 2, "2 micro-batches x 2 replicas");
    // Stage 1 still trains `w`.
    assert_eq!(c.program.stages[1].params, vec!["w".to_string()]);
}

/// Stage 0 computes `a0` (read by stage 2) and `a1` (read by stage 1); stage 2 adds `a0` to
/// stage 1's result. The backward pieces are seeded with the cotangents directly: stage 0's
/// backward reads neither sent value (a `MatMul`'s backward reads its operands, not its
/// result), so the runtime frees them at the send. Sends and receives are grouped by peer
/// stage in stage order, as the plan's simulator sends one stage edge after another: stage 0
/// sends to stage 1 before stage 2 although `a0` comes first.
#[test]
fn backward_reads_no_sent_value_and_sends_go_in_stage_order() {
    let mut m = Module {
        ir_version: 8,
        opset_imports: [(String::new(), 17)].into(),
        ..Default::default()
    };
    let x = m.graph.add_input("x", act(4));
    let w = |m: &mut Module, n: &str, r: usize| {
        m.graph.add_initializer(
            n,
            TensorData::from_f32(vec![r as i64, 3], &vec![0.25; r * 3]),
        )
    };
    let (w0, w1, w2) = (w(&mut m, "w0", 4), w(&mut m, "w1", 4), w(&mut m, "w2", 3));
    let a0 = op(&mut m, "MatMul", &[x, w0], act(3));
    let a1 = op(&mut m, "MatMul", &[x, w1], act(3));
    let z = op(&mut m, "MatMul", &[a1, w2], act(3));
    let y = op(&mut m, "Add", &[a0, z], act(3));
    m.graph.outputs.push(y);
    let spec = |nodes: Vec<usize>, d: usize| StageSpec {
        nodes,
        devices: vec![d],
    };
    let specs = vec![spec(vec![0, 1], 0), spec(vec![2], 1), spec(vec![3], 2)];
    let c = compile(&m, &specs, &options(4)).expect("compiles");
    program::verify(&c.program).unwrap();
    let bwd0 = c.program.stages[0]
        .bwd
        .as_ref()
        .expect("stage 0 trains w0, w1");
    for sent in ["matmul0_out", "matmul1_out"] {
        assert!(!bwd0.inputs.iter().any(|i| i == sent), "{:?}", bwd0.inputs);
    }
    let peers = |d: usize, grad: bool| -> Vec<usize> {
        c.program.devices[d]
            .instructions
            .iter()
            .filter_map(|i| match i {
                Instr::Send { peer, tensor, .. } if tensor.starts_with("grad/") == grad => {
                    Some(*peer)
                }
                _ => None,
            })
            .collect()
    };
    // Device 0: per micro-batch, a1 to stage 1, then a0 to stage 2.
    let fwd = peers(0, false);
    assert_eq!(fwd.len(), 4, "{fwd:?}");
    assert!(fwd.chunks(2).all(|p| p == [1, 2]), "{fwd:?}");
    // Device 2 (stage 2) sends the cotangents back: to stage 0 before stage 1.
    let bwd = peers(2, true);
    assert!(bwd.chunks(2).all(|p| p == [0, 1]), "{bwd:?}");
}
