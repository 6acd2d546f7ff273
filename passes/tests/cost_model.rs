//! Cluster descriptions, communication costs and profile loading.

use pipec_passes::cost::cluster::{v100_16gb, Cluster, PRESETS};
use pipec_passes::cost::comm::{
    allreduce_time, hierarchical_allreduce, p2p_time, redistribute, ring_allreduce,
    ring_allreduce_on,
};
use pipec_passes::cost::profile::{load_profile, parse_profile, profile_batch_from_name};
use pipec_passes::cost::{AllReduceAlgo, Precision};
use std::path::{Path, PathBuf};

fn profiles() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../onnx-models/profiles")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
}

/// Every preset builds from its compiled-in description, is named as it is listed, has a summary,
/// and writes out as TOML that reads back as the same cluster.
#[test]
fn presets_are_data_that_round_trip() {
    for p in PRESETS {
        let c = p.build();
        assert_eq!(c.name, p.name, "preset {} names itself {}", p.name, c.name);
        assert!(!p.summary().is_empty(), "preset {} has no summary", p.name);
        let text = c.to_toml(&p.summary());
        let back = Cluster::from_toml_str(&text, "written.toml").expect(&text);
        assert_eq!(back, c, "{}:\n{text}", p.name);
        assert_eq!(
            Cluster::from_toml_str(&p.toml(), "p.toml").expect("toml"),
            c
        );
    }
}

/// A `[[device_kind]]` with only a name is the known kind; partial figures are an error that says
/// what to give; an unknown name lists the known ones.
#[test]
fn device_kinds_by_name_in_toml() {
    let level = "[[level]]\nsize = 2\nbandwidth = 1e9\n";
    let c = Cluster::from_toml_str(
        &format!("[[device_kind]]\nname = \"H100-80GB\"\n{level}"),
        "a.toml",
    )
    .expect("by name");
    assert_eq!(c.kinds[0], pipec_passes::cost::cluster::h100_80gb());
    let e = Cluster::from_toml_str(
        &format!("[[device_kind]]\nname = \"X\"\nmemory_bytes = 1e9\n{level}"),
        "b.toml",
    )
    .expect_err("partial figures");
    assert!(
        e.to_string()
            .contains("b.toml: device_kind 'X': give all of"),
        "{e}"
    );
    let e = Cluster::from_toml_str(
        &format!("[[device_kind]]\nname = \"A100\"\n{level}"),
        "c.toml",
    )
    .expect_err("unknown kind");
    assert!(
        e.to_string()
            .contains("not a known kind (V100-16GB, TitanX-12GB, H100-80GB, cpu-core)"),
        "{e}"
    );
}

#[test]
fn presets_match_the_papers() {
    let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
    for want in [
        "dapple-a",
        "dapple-b",
        "dapple-c",
        "pipedream-a",
        "pipedream-b",
        "summit",
        "bapipe-pcie",
        "dgx-h100",
        "cpu",
    ] {
        assert!(names.contains(&want), "missing preset {want}");
    }
    let a = Cluster::preset("dapple-a").expect("dapple-a");
    assert_eq!(a.len(), 16);
    assert_eq!(a.levels[0].size, 8);
    assert_eq!(a.levels[1].bandwidth, 25e9 / 8.0);
    assert_eq!(a.kind_of(0).name, "V100-16GB");
    // Same node: NVLink; across nodes: the 25 Gbps link is the slowest on the path.
    assert_eq!(a.path(0, 7).map(|p| p.0), Some(130e9));
    assert_eq!(a.path(0, 8).map(|p| p.0), Some(25e9 / 8.0));
    assert_eq!(
        Cluster::preset("dapple-c").expect("c").levels[1].bandwidth,
        10e9 / 8.0
    );
    let s = Cluster::preset("summit").expect("summit");
    assert_eq!(s.levels[0].size, 4);
    assert_eq!(s.levels[1].bandwidth, 12.5e9);
    let h = Cluster::preset("dgx-h100").expect("dgx");
    assert_eq!(h.kind_of(0).memory_bytes, 80 << 30);
    assert!(h.kind_of(0).peak(Precision::Bf16) > h.kind_of(0).peak(Precision::F32));
    assert_eq!(
        Cluster::preset("pipedream-a")
            .expect("pa")
            .kind_of(3)
            .memory_bytes,
        12 << 30
    );
    let cpu = Cluster::preset("cpu").expect("cpu");
    assert!(!cpu.is_empty());
}

#[test]
fn devices_flag_takes_the_first_n() {
    let a = Cluster::preset("dapple-a")
        .expect("a")
        .take(10)
        .expect("take");
    assert_eq!(a.len(), 10);
    assert_eq!(a.node_of(9), 1);
    let e = Cluster::preset("dapple-a")
        .expect("a")
        .take(17)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("devices 17: ") && e.contains("16"), "{e}");
    assert!(Cluster::preset("bapipe-pcie").expect("b").take(0).is_err());
}

#[test]
fn inline_hierarchy() {
    let c = Cluster::from_inline("8@25000000000,4@1250000000", v100_16gb()).expect("inline");
    assert_eq!(c.len(), 32);
    assert_eq!(c.span_level(0, 7), Some(0));
    assert_eq!(c.span_level(0, 8), Some(1));
    assert!(close(p2p_time(&c, 0, 31, 1.25e9), 1.0));
    assert!(close(p2p_time(&c, 0, 1, 25e9), 1.0));
    assert_eq!(p2p_time(&c, 3, 3, 1e9), 0.0);
    for bad in ["8", "8@", "0@1e9", "8@0", "8@-5", "x@1e9", "8@1e9,"] {
        let e = Cluster::from_inline(bad, v100_16gb())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("cluster {bad}: ")), "{bad}: {e}");
    }
}

const GOOD: &str = r#"
name = "mixed"
[[device_kind]]
name = "big"
memory_bytes = 80e9
memory_bandwidth = 2e12
peak_flops = { f32 = 60e12, f16 = 900e12 }
[[device_kind]]
name = "small"
memory_bytes = 16e9
memory_bandwidth = 9e11
peak_flops = { f32 = 15e12 }
[[level]]
name = "nvlink"
size = 4
bandwidth = 1e11
latency = 1e-6
[[level]]
name = "ib"
size = 3
bandwidth = 1e10
latency = 5e-6
[[node]]
kind = "big"
count = 1
[[node]]
kind = "small"
count = 2
"#;

#[test]
fn toml_cluster_heterogeneous() {
    let c = Cluster::from_toml_str(GOOD, "mixed.toml").expect("parse");
    assert_eq!(c.name, "mixed");
    assert_eq!(c.len(), 12);
    assert_eq!(c.kind_of(0).name, "big");
    assert_eq!(c.kind_of(4).name, "small");
    assert_eq!(c.kind_of(11).name, "small");
    // α-β across nodes: both levels' latencies, the slowest bandwidth.
    assert!(close(p2p_time(&c, 0, 4, 1e10), 1e-6 + 5e-6 + 1.0));
}

#[test]
fn bad_cluster_files_give_clear_errors() {
    // (text to replace, replacement): a missing field, zero bandwidth, negative sizes, ...
    let cases: &[(&str, &str)] = &[
        ("memory_bandwidth = 9e11\n", ""),
        ("bandwidth = 1e10\n", ""),
        ("bandwidth = 1e11", "bandwidth = 0"),
        ("memory_bytes = 16e9", "memory_bytes = -16e9"),
        ("size = 3", "size = -3"),
        ("size = 4", "size = 0"),
        ("count = 2", "count = 5"),
        ("kind = \"small\"", "kind = \"tiny\""),
        ("latency = 5e-6", "latency = -1"),
        (
            "peak_flops = { f32 = 15e12 }",
            "peak_flops = { f16 = 15e12 }",
        ),
        ("peak_flops = { f32 = 15e12 }", "peak_flops = { f32 = 0 }"),
        ("name = \"ib\"", "name = \"ib\"\nspeed = 3"),
    ];
    for (from, to) in cases {
        let text = GOOD.replacen(from, to, 1);
        assert_ne!(text, GOOD, "fixture {from}");
        let e = Cluster::from_toml_str(&text, "bad.toml")
            .err()
            .unwrap_or_else(|| panic!("{from} -> {to} should fail"))
            .to_string();
        assert!(e.starts_with("bad.toml"), "error must name the file: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
        println!("{e}");
    }
    let e = Cluster::from_toml_str("this is not toml", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("x.toml"), "{e}");
    let e = Cluster::resolve("no-such-cluster", None)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cluster no-such-cluster: ") && e.contains("dapple-a"),
        "{e}"
    );
}

/// Ring all-reduce: 2(n−1)/n · bytes/bw + 2(n−1)·α.
#[test]
fn ring_allreduce_closed_form() {
    for n in [2usize, 3, 4, 8, 16] {
        let (bytes, bw, lat) = (1e9, 1e10, 1e-5);
        let want = 2.0 * (n as f64 - 1.0) / n as f64 * bytes / bw + 2.0 * (n as f64 - 1.0) * lat;
        assert!(close(ring_allreduce(n, bytes, bw, lat), want));
    }
    assert_eq!(ring_allreduce(1, 1e9, 1e10, 1e-5), 0.0);
    let c = Cluster::preset("dapple-a").expect("a");
    let devs: Vec<usize> = (0..16).collect();
    let (bw, lat) = (25e9 / 8.0, 5e-6 + 50e-6);
    assert!(close(
        ring_allreduce_on(&c, &devs, 1e9),
        ring_allreduce(16, 1e9, bw, lat)
    ));
    // Hierarchical: 2 × intra reduce-scatter/all-gather on NVLink + inter ring on 1/8 of the data.
    let intra = 7.0 / 8.0 * 1e9 / 130e9 + 7.0 * 5e-6;
    let inter = ring_allreduce(2, 1e9 / 8.0, bw, lat);
    assert!(close(
        hierarchical_allreduce(&c, &devs, 1e9),
        2.0 * intra + inter
    ));
    assert!(hierarchical_allreduce(&c, &devs, 1e9) < ring_allreduce_on(&c, &devs, 1e9));
    assert!(close(
        allreduce_time(&c, &devs, 1e9, AllReduceAlgo::Auto),
        hierarchical_allreduce(&c, &devs, 1e9)
    ));
    // Inside one node both algorithms are the same ring.
    let node: Vec<usize> = (0..8).collect();
    assert!(close(
        hierarchical_allreduce(&c, &node, 1e9),
        ring_allreduce_on(&c, &node, 1e9)
    ));
}

#[test]
fn split_concat_traffic() {
    assert_eq!(redistribute(1, 1, 6.0), vec![(0, 0, 6.0)]);
    assert_eq!(
        redistribute(1, 3, 6.0),
        vec![(0, 0, 2.0), (0, 1, 2.0), (0, 2, 2.0)]
    );
    assert_eq!(
        redistribute(3, 1, 6.0),
        vec![(0, 0, 2.0), (1, 0, 2.0), (2, 0, 2.0)]
    );
    assert_eq!(redistribute(2, 2, 6.0), vec![(0, 0, 3.0), (1, 1, 3.0)]);
    let r = redistribute(2, 3, 6.0);
    assert_eq!(r, vec![(0, 0, 2.0), (0, 1, 1.0), (1, 1, 1.0), (1, 2, 2.0)]);
    let total: f64 = redistribute(7, 5, 35.0).iter().map(|x| x.2).sum();
    assert!(close(total, 35.0));
}

#[test]
fn all_profiles_load() {
    let cases = [
        ("vgg16.txt", 41, None),
        ("resnet50.txt", 177, None),
        ("inception_v3.txt", 326, None),
        ("gnmt.txt", 48, None),
        ("vgg-19-pbs-32.txt", 26, Some(32)),
        ("gnmt-16-pbs-64.txt", 96, Some(64)),
    ];
    for (file, nodes, pbs) in cases {
        let path = profiles().join(file);
        assert_eq!(profile_batch_from_name(&path), pbs, "{file}");
        let p = load_profile(&path, pbs.unwrap_or(1) as f64).expect(file);
        let g = &p.graph;
        assert_eq!(g.len(), nodes, "{file}");
        assert_eq!(g.topo_order().len(), nodes);
        assert!(
            g.nodes.iter().any(|n| n.is_input),
            "{file} has an input node"
        );
        assert!(!g.edges.is_empty());
        assert!(g.total_parameter_bytes() > 0.0);
    }
    // VGG-16 on one worker: PipeDream's single_stage_s (0.672535 s for the profiled batch).
    let p = load_profile(&profiles().join("vgg16.txt"), 64.0).expect("vgg16");
    let (f, b) = p.graph.total_time(64.0, &v100_16gb());
    assert!((f + b - 0.672535).abs() < 1e-6, "{}", f + b);
    // The same for the other two profiles PipeDream's reference covers.
    for (f, want) in [("resnet50.txt", 0.443419), ("gnmt.txt", 0.089416)] {
        let g = load_profile(&profiles().join(f), 64.0).expect(f).graph;
        let (f1, b1) = g.total_time(64.0, &v100_16gb());
        assert!((f1 + b1 - want).abs() < 1e-6, "{f}: {}", f1 + b1);
    }
    // Linear scaling from the profiled batch.
    let (f2, b2) = p.graph.total_time(32.0, &v100_16gb());
    assert!(close(f2 + b2, (f + b) / 2.0));
    // The ReLU after the first conv: 64·64·224·224·4 bytes.
    let relu = p
        .graph
        .nodes
        .iter()
        .find(|n| n.activation_bytes == 822083584.0);
    assert!(relu.is_some());
}

#[test]
fn multi_output_and_stage_ids_and_errors() {
    let text = "node1 -- Input -- forward_compute_time=1.0, backward_compute_time=0.0, activation_size=[10.0; 20.0], parameter_size=0.0 -- stage_id=0\n\
                node2 -- Linear(a=1, b=2) -- forward_compute_time=2.0, backward_compute_time=3.0, activation_size=5.0, parameter_size=8.0 -- stage_id=1\n\
                \tnode1 -- node2\n";
    let p = parse_profile(text, "t.txt", "t", 2.0).expect("parse");
    assert_eq!(p.graph.nodes[0].activation_bytes, 30.0);
    assert_eq!(p.graph.edges[0].bytes, 30.0);
    assert_eq!(p.stage_ids, vec![Some(0), Some(1)]);
    assert_eq!(p.graph.nodes[1].op, "Linear(a=1, b=2)");
    for (bad, what) in [
        ("node1 -- X -- backward_compute_time=1.0\n", "forward_compute_time"),
        ("node1 -- X -- forward_compute_time=abc, backward_compute_time=0, activation_size=1, parameter_size=0\n", "abc"),
        ("node1 -- X -- forward_compute_time=1, backward_compute_time=0, activation_size=1\n", "parameter_size"),
        ("node1 -- X -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n\tnode1 -- node9\n", "node9"),
        ("node1 -- X -- forward_compute_time=-1, backward_compute_time=0, activation_size=1, parameter_size=0\n", ">= 0"),
        ("", "no node"),
    ] {
        let e = parse_profile(bad, "bad.txt", "b", 1.0).unwrap_err().to_string();
        assert!(e.starts_with("bad.txt") && e.contains(what), "{e}");
    }
    let cyc = "a1 -- X -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n\
               a2 -- X -- forward_compute_time=1, backward_compute_time=0, activation_size=1, parameter_size=0\n\
               \ta1 -- a2\n\ta2 -- a1\n";
    let e = parse_profile(cyc, "cyc.txt", "c", 1.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cycle"), "{e}");
}

/// Memory per device: w + w (gradients) + optimizer state (SGD 0, momentum w, Adam 2w) +
/// activations × in-flight + boundary buffers (in + out). Adam on fp32 is 16 bytes per parameter
/// (DAPPLE Table VIII).
#[test]
fn memory_model() {
    use pipec_passes::cost::memory::{stage_memory, step_time};
    use pipec_passes::cost::Optimizer;
    let params = 4.0 * 1e6; // 1M fp32 parameters
    let adam = stage_memory(params, 10.0, 3, 5.0, Optimizer::Adam);
    assert_eq!(
        adam.parameters + adam.gradients + adam.optimizer_state,
        16.0 * 1e6
    );
    assert_eq!(adam.activations, 30.0);
    assert_eq!(adam.comm_buffers, 5.0);
    assert_eq!(adam.total(), 16e6 + 35.0);
    assert_eq!(
        stage_memory(params, 0.0, 0, 0.0, Optimizer::Sgd).total(),
        8e6
    );
    assert_eq!(
        stage_memory(params, 0.0, 0, 0.0, Optimizer::Momentum).total(),
        12e6
    );
    assert_eq!(
        Optimizer::parse("sgd:lr=0.01,momentum=0.9").ok(),
        Some(Optimizer::Momentum)
    );
    assert_eq!(Optimizer::parse("sgd:lr=0.01").ok(), Some(Optimizer::Sgd));
    assert_eq!(
        Optimizer::parse("adam:lr=0.001").ok(),
        Some(Optimizer::Adam)
    );
    assert!(Optimizer::parse("lion").is_err());
    // The emitted Adam step is 14 unfused elementwise ops: 33 passes over the parameter bytes.
    assert!(close(
        step_time(params, 1e9, Optimizer::Adam),
        33.0 * params / 1e9
    ));
}

#[test]
fn chain_prefix_sums_and_cuts() {
    let g = load_profile(&profiles().join("vgg16.txt"), 64.0)
        .expect("vgg16")
        .graph;
    let ch = g.chain(64.0, &v100_16gb());
    let n = ch.len();
    assert_eq!(n, 41);
    assert!((ch.compute(0, n) - 0.672535).abs() < 1e-6);
    assert!(close(ch.parameter_bytes(0, n), g.total_parameter_bytes()));
    assert_eq!(ch.cut[0], 0.0);
    assert_eq!(ch.cut[n], 0.0);
    // VGG-16 is almost a chain: the cut before position i carries the output of position i−1,
    // except around `Size(0)`, which reads the pool output that `View` reads too.
    let mut equal = 0;
    for i in 1..n {
        let prev = g.nodes[ch.order[i - 1]].activation_bytes;
        assert!(ch.cut[i] >= prev, "cut {i}");
        equal += usize::from(ch.cut[i] == prev);
    }
    assert_eq!(equal, n - 2);
    // ResNet-50's skips: a cut inside a residual block carries two tensors.
    let r = load_profile(&profiles().join("resnet50.txt"), 64.0)
        .expect("r50")
        .graph;
    let ch = r.chain(64.0, &v100_16gb());
    let wider = (1..ch.len()).any(|i| ch.cut[i] > r.nodes[ch.order[i - 1]].activation_bytes);
    assert!(wider);
}

/// The planners' optimizer-step time ([`step_time`]) is the replay's time of the step piece that
/// codegen emits for the same parameters (every op of the update costed by the roofline), on
/// every device kind of the presets and for each optimizer.
#[test]
fn step_time_is_the_emitted_step_piece() {
    use pipec_compiler::ir::{DType, TensorType};
    use pipec_passes::codegen::pieces::step_piece;
    use pipec_passes::cost::analytic::{from_module, AnalyticOptions};
    use pipec_passes::cost::memory::{step_time, Optimizer};
    use pipec_passes::optimizer::OptimizerKind;
    let opset = pipec_compiler::onnx::import::load(&profiles().join("../mlp4.onnx")).expect("mlp4");
    let params: Vec<(String, TensorType)> = vec![
        ("w0".into(), TensorType::known(DType::F32, &[512, 1024])),
        ("b0".into(), TensorType::known(DType::F32, &[1024])),
    ];
    let bytes = 4.0 * (512.0 * 1024.0 + 1024.0);
    for (spec, opt) in [
        ("sgd", Optimizer::Sgd),
        ("sgd:momentum=0.9", Optimizer::Momentum),
        ("adam", Optimizer::Adam),
    ] {
        let kind: OptimizerKind = spec.parse().expect("optimizer");
        let piece = step_piece(&params, &kind, &opset, "step").expect("step piece");
        let g = from_module(&piece.module, &AnalyticOptions::default(), "step").expect("cost");
        for preset in ["summit", "dgx-h100", "cpu"] {
            let c = Cluster::preset(preset).expect("preset");
            let dk = c.kind_of(0);
            let replay: f64 = (0..g.len())
                .map(|n| g.times(n, g.reference_batch, dk).0)
                .sum();
            let plan = step_time(bytes, dk.memory_bandwidth, opt);
            assert!(
                (plan / replay - 1.0).abs() < 0.01,
                "{spec} on {preset}: planned step {plan:e} s, emitted piece {replay:e} s"
            );
        }
    }
}
