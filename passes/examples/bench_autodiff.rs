//! Benchmark: autodiff (loss + backward, including its shape-inference runs) and a final
//! verifier-free shape inference on an ONNX model; prints op counts of the forward and training
//! graphs. `cargo run --release -p pipec-passes --example bench_autodiff -- MODEL.onnx [REPEATS]`

use pipec_passes::autodiff::{differentiate, Autodiff};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: bench_autodiff MODEL.onnx [REPEATS]")?;
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let t0 = Instant::now();
    let mut base = pipec_compiler::onnx::import::load(std::path::Path::new(path))?;
    pipec_compiler::shape::infer_shapes(&mut base)?;
    let import = t0.elapsed();
    let fwd_ops = base.graph.order.len();
    let mut best = f64::INFINITY;
    let mut best_ad = f64::INFINITY;
    let mut train_ops = 0;
    let mut stats = None;
    for _ in 0..reps {
        let mut m = base.clone();
        let t = Instant::now();
        let tg = differentiate(&mut m, &Autodiff::default())?;
        let ad = t.elapsed().as_secs_f64();
        pipec_compiler::shape::infer_shapes(&mut m)?;
        let total = t.elapsed().as_secs_f64();
        best = best.min(total);
        best_ad = best_ad.min(ad);
        train_ops = m.graph.order.len();
        stats = Some((tg.grads.len(), tg.saved.len(), tg.backward_ops));
    }
    let (params, saved, bwd) = stats.unwrap_or_default();
    println!(
        "{path}: import+infer {:.1} ms; autodiff (incl. its shape inference) {:.1} ms; autodiff + extra shape inference {:.1} ms (best of {reps}); forward ops {fwd_ops}, training ops {train_ops} ({:.2}x), backward ops {bwd}, params {params}, saved values {saved}",
        import.as_secs_f64() * 1e3,
        best_ad * 1e3,
        best * 1e3,
        train_ops as f64 / fwd_ops as f64
    );
    Ok(())
}
