//! The `pipedream` planner against PipeDream's own optimizer (`optimizer_graph_hierarchical.py`,
//! outputs in `onnx-models/profiles/pipedream-reference/`), plan invariants, its options, and the
//! shared linearisation (`cost::antichain`).

use pipec_passes::cost::antichain::{pipedream_exclusions, Linearization};
use pipec_passes::cost::cluster::{v100_16gb, Cluster};
use pipec_passes::cost::profile::{load_profile, parse_profile};
use pipec_passes::cost::CostGraph;
use pipec_passes::plan::{Plan, PlanOptions};
use pipec_passes::planners::pipedream::{hierarchy, PipeDream, PipeDreamOptions};
use pipec_passes::planners::{by_name, Planner};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../onnx-models/profiles")
}

fn profile(name: &str) -> CostGraph {
    load_profile(&root().join(name), 64.0)
        .expect("profile")
        .graph
}

/// `--cluster` for a tag suffix of the reference runs (their README's table).
fn cluster_for(tag: &str) -> &'static str {
    match tag {
        "n4" => "4@1250000000",
        "n8" => "8@1250000000",
        "n16" => "16@3125000000",
        "n8x2" => "8@25000000000,2@3125000000",
        "n8x4" => "8@25000000000,4@1250000000",
        t => panic!("unknown tag {t}"),
    }
}

/// `(model, tag, objective_s)` of every row of the reference summary.
fn reference_rows() -> Vec<(String, String, f64)> {
    let text = std::fs::read_to_string(root().join("pipedream-reference/summary.txt"))
        .expect("summary.txt");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let tag = l.split_whitespace().next().expect("tag");
            let (model, suffix) = tag.split_once("__").expect("model__tag");
            let obj = l
                .split_whitespace()
                .find_map(|f| f.strip_prefix("objective_s="))
                .expect("objective_s")
                .parse()
                .expect("number");
            (model.to_string(), suffix.to_string(), obj)
        })
        .collect()
}

/// Invariants every PipeDream plan keeps: it verifies, uses every device, stages come in
/// pipeline order, the Input node is in the first stage, and a replicated stage spans either
/// whole level-0 groups or part of one.
fn check_plan(plan: &Plan, g: &CostGraph, c: &Cluster) {
    plan.verify(g, c).expect("plan verifies");
    assert_eq!(plan.planner, "pipedream");
    assert_eq!(plan.devices(), c.len(), "every device is used");
    for (s, st) in plan.stages.iter().enumerate() {
        assert!(st.predecessors.iter().all(|&p| p < s), "stage order");
    }
    let input = g.node_by_name("node1").expect("node1");
    assert!(g.nodes[input].is_input);
    assert!(plan.stages[0].nodes.contains(&input));
    let group = c.levels[0].size;
    for (s, st) in plan.stages.iter().enumerate() {
        let nodes: std::collections::BTreeSet<usize> =
            st.devices.iter().map(|&d| d / group).collect();
        if nodes.len() > 1 {
            assert_eq!(
                st.devices.len() % group,
                0,
                "stage {s} spans partial groups"
            );
        }
    }
    assert!(plan.iteration_time_s.is_finite() && plan.iteration_time_s > 0.0);
    assert!(plan.objective_s > 0.0);
}

#[test]
fn every_reference_row_within_0_1_percent() {
    let rows = reference_rows();
    assert_eq!(rows.len(), 15, "vgg16, resnet50, gnmt x 5 settings");
    let opts = PlanOptions::new(64);
    let mut graphs = std::collections::HashMap::new();
    for (model, tag, want) in rows {
        let g = graphs
            .entry(model.clone())
            .or_insert_with(|| profile(&format!("{model}.txt")));
        let c = Cluster::from_inline(cluster_for(&tag), v100_16gb()).expect("cluster");
        let plan = PipeDream::default().plan(g, &c, &opts).expect("plan");
        let err = (plan.objective_s - want).abs() / want;
        assert!(
            err < 1e-3,
            "{model} {tag}: objective {} vs PipeDream's {want} (rel. error {err:.2e})",
            plan.objective_s
        );
        check_plan(&plan, g, &c);
    }
}

#[test]
fn by_name_and_inception() {
    let g = profile("inception_v3.txt");
    let c = Cluster::from_inline("8@1250000000", v100_16gb()).expect("cluster");
    let plan = by_name("pipedream")
        .expect("registered")
        .plan(&g, &c, &PlanOptions::new(64))
        .expect("plan");
    check_plan(&plan, &g, &c);
    // Eight workers can do no better than a perfect split of the single-worker time.
    let (f, b) = g.total_time(64.0, c.kind_of(0));
    assert!(plan.objective_s >= (f + b) / 8.0 * (1.0 - 1e-12));
}

#[test]
fn straight_pipeline_replicates_nothing() {
    let g = profile("vgg16.txt");
    let opts = PlanOptions::new(64);
    for spec in ["8@1250000000", "4@25000000000,2@1250000000"] {
        let c = Cluster::from_inline(spec, v100_16gb()).expect("cluster");
        let replicated = PipeDream::default().plan(&g, &c, &opts).expect("plan");
        let straight = PipeDream {
            options: PipeDreamOptions {
                straight_pipeline: true,
                ..Default::default()
            },
        }
        .plan(&g, &c, &opts)
        .expect("straight plan");
        check_plan(&straight, &g, &c);
        assert!(straight.stages.iter().all(|s| s.devices.len() == 1));
        assert_eq!(straight.stages.len(), 8);
        assert!(straight.objective_s >= replicated.objective_s * (1.0 - 1e-12));
        // A straight pipeline's time is its slowest stage's compute.
        let slowest = straight
            .stages
            .iter()
            .map(|s| {
                let m = g.mask(&s.nodes);
                let gc = g.group_cost(&m, 64.0, c.kind_of(0));
                gc.fwd_s + gc.bwd_s
            })
            .fold(0.0, f64::max);
        assert!((straight.objective_s - slowest).abs() <= 1e-9 * slowest);
    }
}

#[test]
fn memory_constraint_and_activation_transfer() {
    let g = profile("resnet50.txt");
    let c = Cluster::from_inline("8@1250000000", v100_16gb()).expect("cluster");
    let opts = PlanOptions::new(64);
    let base = PipeDream::default().plan(&g, &c, &opts).expect("plan");
    let with = |o: PipeDreamOptions| PipeDream { options: o }.plan(&g, &c, &opts);
    let roomy = with(PipeDreamOptions {
        memory_limit_bytes: Some(1e15),
        ..Default::default()
    })
    .expect("plan");
    assert_eq!(roomy.objective_s, base.objective_s);
    // 16 GB per worker (the optimizer's default --memory_size) binds for ResNet-50's stashes.
    let tight = with(PipeDreamOptions {
        memory_limit_bytes: Some(16e9),
        ..Default::default()
    })
    .expect("plan");
    assert!(tight.objective_s >= base.objective_s);
    // The optimizer's stash count ⌈(N − m)/m⌉ is 0 for a stage on all N workers, so with no
    // memory to spare only pure data parallelism is left: (C + 4(N−1)|w|/(B N)) / N.
    let dp = with(PipeDreamOptions {
        memory_limit_bytes: Some(1.0),
        ..Default::default()
    })
    .expect("plan");
    assert_eq!(dp.stages.len(), 1);
    assert_eq!(dp.stages[0].devices.len(), 8);
    let (f, b) = g.total_time(64.0, c.kind_of(0));
    let w: f64 = g
        .nodes
        .iter()
        .filter(|n| !n.is_input)
        .map(|n| n.parameter_bytes)
        .sum();
    let want = (f + b + 4.0 * 7.0 * w / (1.25e9 * 8.0)) / 8.0;
    assert!((dp.objective_s - want).abs() <= 1e-9 * want);
    // The paper's 2·C_i term can only slow stages down.
    let comm = with(PipeDreamOptions {
        activation_compression: Some(1.0),
        ..Default::default()
    })
    .expect("plan");
    check_plan(&comm, &g, &c);
    assert!(comm.objective_s >= base.objective_s);
}

#[test]
fn hierarchy_follows_the_cluster_levels() {
    let c = Cluster::from_inline("8@25000000000,4@1250000000", v100_16gb()).expect("cluster");
    let h = hierarchy(&c);
    assert_eq!(h.len(), 2);
    assert_eq!((h[0].machines, h[1].machines), (8, 4));
    assert_eq!((h[0].bandwidth, h[1].bandwidth), (25e9, 1.25e9));
    // After --devices the levels no longer multiply out: one level at the slowest link.
    let h = hierarchy(&c.take(12).expect("take"));
    assert_eq!(h.len(), 1);
    assert_eq!((h[0].machines, h[0].bandwidth), (12, 1.25e9));
}

const DIAMOND: &str = "\
node1 -- Input -- forward_compute_time=0, backward_compute_time=0, activation_size=8, parameter_size=0
node2 -- A -- forward_compute_time=1, backward_compute_time=2, activation_size=4, parameter_size=16
node3 -- B -- forward_compute_time=1, backward_compute_time=2, activation_size=4, parameter_size=16
node4 -- C -- forward_compute_time=5, backward_compute_time=5, activation_size=4, parameter_size=16
node5 -- D -- forward_compute_time=1, backward_compute_time=2, activation_size=4, parameter_size=16
\tnode1 -- node2
\tnode2 -- node3
\tnode2 -- node4
\tnode3 -- node5
\tnode4 -- node5
";

/// Every state is a down-set, ancestors have smaller down-sets, the last state holds every
/// included node.
fn check_linearization(g: &CostGraph, lin: &Linearization) {
    let included: Vec<usize> = (0..g.len()).filter(|&n| !lin.excluded[n]).collect();
    for (j, s) in lin.states.iter().enumerate() {
        for x in s.down.iter() {
            assert!(!lin.excluded[x]);
            for p in g.preds(x) {
                assert!(
                    lin.excluded[p] || s.down.contains(p),
                    "state {j} not a down-set"
                );
            }
        }
        for &k in lin.ancestors(j) {
            let k = k as usize;
            assert!(k < j, "ancestors precede in the order");
            assert!(lin.is_ancestor(k, j));
            let dk = &lin.states[k].down;
            assert!(dk.iter().all(|x| s.down.contains(x)) && dk.count() < s.down.count());
        }
    }
    let last = &lin.states[lin.len() - 1].down;
    assert_eq!(last.count(), included.len());
}

#[test]
fn antichain_dag_of_a_diamond() {
    let g = parse_profile(DIAMOND, "d.txt", "d", 1.0)
        .expect("parse")
        .graph;
    let ex = pipedream_exclusions(&g);
    assert_eq!(ex, vec![true, false, false, false, false]);
    let lin = Linearization::antichain_dag(&g, &ex, 100).expect("small");
    assert!(lin.is_antichain_dag);
    check_linearization(&g, &lin);
    // Cuts: {A}, {A,B}, {A,C}, {A,B,C}, everything; the branch states are incomparable.
    let downs: Vec<usize> = lin.states.iter().map(|s| s.down.count()).collect();
    assert_eq!(lin.len(), 5, "{downs:?}");
    let two: Vec<usize> = (0..lin.len()).filter(|&j| downs[j] == 2).collect();
    assert_eq!(two.len(), 2);
    assert!(!lin.is_ancestor(two[0], two[1]) && !lin.is_ancestor(two[1], two[0]));
    // A node-sum over a stage is the difference of down-set sums.
    let c = lin.down_sums(|n| g.times(n, 1.0, &v100_16gb()).0);
    assert!((c[lin.len() - 1] - 8e-3).abs() < 1e-12);
    let stage = lin.nodes_between(Some(0), lin.len() - 1);
    assert_eq!(stage.len(), 3);
    assert!(
        Linearization::antichain_dag(&g, &ex, 3).is_none(),
        "budget respected"
    );
}

#[test]
fn linearizations_of_the_real_profiles() {
    // State counts as printed by PipeDream's optimizer ("Total number of states").
    for (name, states) in [("vgg16.txt", 40), ("resnet50.txt", 240), ("gnmt.txt", 99)] {
        let g = profile(name);
        let ex = pipedream_exclusions(&g);
        let lin = Linearization::antichain_dag(&g, &ex, 10_000).expect("antichain dag");
        assert_eq!(lin.len(), states, "{name}");
        check_linearization(&g, &lin);
    }
    // Too many states for the budget: a chain of topological prefixes, coarsened.
    let g = profile("inception_v3.txt");
    let ex = pipedream_exclusions(&g);
    let lin = Linearization::for_graph(&g, &ex, 50, |n| g.times(n, 64.0, &v100_16gb()).1);
    assert!(!lin.is_antichain_dag);
    assert!(lin.len() <= 50 && lin.len() > 10);
    check_linearization(&g, &lin);
    for j in 1..lin.len() {
        assert!(lin.is_ancestor(j - 1, j) && lin.is_ancestor(0, j));
    }
    // ... and the planner still plans on it.
    let c = Cluster::from_inline("8@25000000000,2@3125000000", v100_16gb()).expect("cluster");
    let plan = PipeDream {
        options: PipeDreamOptions {
            max_states: 50,
            ..Default::default()
        },
    }
    .plan(&g, &c, &PlanOptions::new(64))
    .expect("plan");
    check_plan(&plan, &g, &c);
}

/// A wide DAG (blocks of parallel branches, 2000+ nodes): its antichain DAG is far beyond any
/// budget, so the planner plans on the coarsened topological chain, quickly and validly.
#[test]
fn wide_graphs_fall_back_to_a_coarsened_chain() {
    use pipec_passes::cost::{CostEdge, CostNode, Work};
    use pipec_passes::planners::pipedream::{dp_work, states_for_budget};
    let (blocks, branches, depth) = (40, 5, 10);
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    let node = |i: usize| CostNode {
        name: format!("n{i}"),
        op: "Layer".into(),
        work: Work::Measured {
            fwd_s: 1e-3 * (1.0 + (i % 7) as f64 / 7.0),
            bwd_s: 2e-3,
        },
        activation_bytes: 1e6,
        saved_bytes: 1e6,
        saved_fixed_bytes: 0.0,
        parameter_bytes: 1e5 * (i % 3) as f64,
        is_input: false,
        side: false,
    };
    nodes.push(node(0));
    let mut join = 0;
    for _ in 0..blocks {
        let mut ends = Vec::new();
        for _ in 0..branches {
            let mut prev = join;
            for _ in 0..depth {
                let id = nodes.len();
                nodes.push(node(id));
                edges.push(CostEdge::new(prev, id, 1e6));
                prev = id;
            }
            ends.push(prev);
        }
        let id = nodes.len();
        nodes.push(node(id));
        for e in ends {
            edges.push(CostEdge::new(e, id, 1e6));
        }
        join = id;
    }
    let g = CostGraph::new("wide", 64.0, nodes, edges, "wide").expect("graph");
    assert!(g.len() > 2000);
    let c = Cluster::from_inline("8@25000000000,2@3125000000", v100_16gb()).expect("cluster");
    let levels = hierarchy(&c);
    let budget = 2e7;
    let cap = states_for_budget(&levels, budget);
    assert!(dp_work(cap, &levels) <= budget && dp_work(cap + 1, &levels) > budget);
    let ex = pipedream_exclusions(&g);
    assert!(Linearization::antichain_dag(&g, &ex, cap).is_none());
    let plan = PipeDream {
        options: PipeDreamOptions {
            max_work: budget,
            ..Default::default()
        },
    }
    .plan(&g, &c, &PlanOptions::new(64))
    .expect("plan");
    plan.verify(&g, &c).expect("verifies");
    assert_eq!(plan.devices(), 16);
    let (f, b) = g.total_time(64.0, c.kind_of(0));
    assert!(plan.objective_s >= (f + b) / 16.0 * (1.0 - 1e-12));
    assert!(plan.search_time_s < 30.0);
}

/// On one level the plan realises its objective: the slowest stage's
/// `(C_s + 4(r−1)|w_s|/(B r)) / r` (the optimizer's stage time, `r` replicas) equals `objective_s`.
#[test]
fn single_level_plans_realise_their_objective() {
    let opts = PipeDream::default();
    for model in ["vgg16", "resnet50", "gnmt"] {
        let g = profile(&format!("{model}.txt"));
        let ex = pipedream_exclusions(&g);
        for (spec, bw) in [("4@1250000000", 1.25e9), ("16@3125000000", 3.125e9)] {
            let c = Cluster::from_inline(spec, v100_16gb()).expect("cluster");
            let plan = opts.plan(&g, &c, &PlanOptions::new(64)).expect("plan");
            let worst = plan
                .stages
                .iter()
                .map(|st| {
                    let (mut t, mut w) = (0.0, 0.0);
                    for &n in &st.nodes {
                        if !ex[n] {
                            let (f, b) = g.times(n, 64.0, c.kind_of(0));
                            t += f + b;
                            w += g.nodes[n].parameter_bytes;
                        }
                    }
                    let r = st.devices.len() as f64;
                    (t + 4.0 * (r - 1.0) * w / (bw * r)) / r
                })
                .fold(0.0, f64::max);
            let err = (worst - plan.objective_s).abs() / plan.objective_s;
            assert!(
                err < 1e-9,
                "{model} {spec}: {worst} vs {}",
                plan.objective_s
            );
        }
    }
}
