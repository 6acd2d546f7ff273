//! Benchmark of the in-process transport and the ring all-reduce (numbers in
//! `docs/RUNTIME_NOTES.md`). Run: `cargo build --workspace --examples &&
//! target/debug/examples/dist_bench [MB] [DEVICES]` (the dev profile builds pipec-runtime with
//! opt-level 2).

use ndarray::{ArrayD, IxDyn};
use pipec_runtime::dist::{inproc, Collectives, Endpoint, Ring, Tag};
use pipec_runtime::Tensor;
use std::time::{Duration, Instant};

/// The allocator of the `pipec` binary, so that buffers are reused as in `pipec run` (with the
/// system allocator every 16–64 MB chunk is a fresh mapping that page-faults in again).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn tensor(n: usize, v: f32) -> Tensor {
    Tensor::F32(ArrayD::from_elem(IxDyn(&[n]), v))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let devices: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    let bytes = mb << 20;
    let n = bytes / 4;
    let timeout = Duration::from_secs(60);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    println!("{mb} MB f32 tensors, {cores} hardware threads");

    // 1. memcpy bandwidth (best of 5 copies of the buffer).
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let bw = bytes as f64 / best;
    println!(
        "memcpy: {:.2} GB/s ({:.2} ms per copy)",
        bw / 1e9,
        best * 1e3
    );

    // 2. Transport: ping-pong of one 64 MB tensor between two threads (moved, never copied).
    let rounds = 200;
    let mut eps = inproc::endpoints(2);
    let mut b = eps.pop().expect("endpoint");
    let mut a = eps.pop().expect("endpoint");
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            for i in 0..rounds {
                let x = b.recv(0, Tag::p2p(i), timeout).expect("recv");
                b.send(0, Tag::p2p(i), x).expect("send");
            }
        });
        let mut x = tensor(n, 1.0);
        for i in 0..rounds {
            a.send(1, Tag::p2p(i), x).expect("send");
            x = a.recv(1, Tag::p2p(i), timeout).expect("recv");
        }
        std::hint::black_box(&x);
    });
    let el = t.elapsed().as_secs_f64();
    let msgs = 2 * rounds as usize;
    println!(
        "inproc transport: {msgs} messages of {mb} MB in {:.3} s: {:.1} us/message, {:.0} GB/s effective",
        el,
        el / msgs as f64 * 1e6,
        (msgs * bytes) as f64 / el / 1e9
    );

    // 3. Ring all-reduce over `devices` threads, as a training loop calls it: the same threads
    //    and gradient buffers every step, one warm-up call, then `reps` calls each started
    //    together (barrier); a call's time is the slowest device's.
    let group: Vec<usize> = (0..devices).collect();
    let reps = 10;
    let eps = inproc::endpoints(devices);
    let barrier = std::sync::Barrier::new(devices);
    let per_device: Vec<Vec<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .into_iter()
            .enumerate()
            .map(|(d, mut ep)| {
                let (group, barrier) = (&group, &barrier);
                s.spawn(move || {
                    let mut ts = vec![tensor(n, d as f32)];
                    let mut out = Vec::with_capacity(reps);
                    for r in 0..=reps {
                        barrier.wait();
                        let t = Instant::now();
                        Ring.all_reduce_sum(&mut ep, group, r as u32 + 1, &mut ts, timeout)
                            .expect("all-reduce");
                        std::hint::black_box(&ts);
                        if r > 0 {
                            out.push(t.elapsed().as_secs_f64());
                        }
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let mut times: Vec<f64> = (0..reps)
        .map(|r| per_device.iter().map(|v| v[r]).fold(0.0, f64::max))
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[reps / 2];
    let nf = devices as f64;
    // The formula assumes one link per device; devices time-sharing fewer cores share them.
    let ideal = 2.0 * (nf - 1.0) / nf * bytes as f64 / bw;
    let shared = (nf / cores as f64).max(1.0);
    println!(
        "ring all-reduce, {devices} devices x {mb} MB: median {:.1} ms of {reps} (best {:.1}, worst {:.1}); ring formula 2(n-1)/n*bytes/memcpy_bw = {:.1} ms (x{shared} for {devices} devices on {cores} cores: {:.1} ms); ratio {:.1}x",
        median * 1e3,
        times[0] * 1e3,
        times[reps - 1] * 1e3,
        ideal * 1e3,
        ideal * shared * 1e3,
        median / (ideal * shared)
    );
}
