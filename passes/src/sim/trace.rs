//! Chrome / Perfetto trace of a simulation (the JSON "Trace Event Format", `traceEvents` array).
//!
//! One process per device (`pid` = device id) with three threads: `compute` (forward, backward,
//! optimizer step, all-reduce), `send` and `recv`. Times are microseconds. Open the file in
//! `chrome://tracing` or <https://ui.perfetto.dev>.

use super::{Dir, SimResult, TaskKind};
use serde_json::{json, Value};

const COMPUTE: u32 = 0;
const SEND: u32 = 1;
const RECV: u32 = 2;

fn ev(name: String, cat: &str, pid: usize, tid: u32, start: f64, end: f64, args: Value) -> Value {
    json!({
        "name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
        "ts": start * 1e6, "dur": (end - start) * 1e6, "args": args,
    })
}

/// The trace of `res` as a JSON value (deterministic: tasks in simulation order).
pub fn chrome_trace(res: &SimResult) -> Value {
    let mut events = Vec::new();
    for (d, dev) in res.devices.iter().enumerate() {
        if !dev.used {
            continue;
        }
        events.push(json!({"name": "process_name", "ph": "M", "pid": d,
            "args": {"name": format!("device {d}")}}));
        for (tid, name) in [(COMPUTE, "compute"), (SEND, "send"), (RECV, "recv")] {
            events.push(
                json!({"name": "thread_name", "ph": "M", "pid": d, "tid": tid,
                "args": {"name": name}}),
            );
        }
    }
    for t in &res.tasks {
        match &t.kind {
            TaskKind::Forward { stage, mb, device } => events.push(ev(
                format!("F{mb}"),
                "forward",
                *device,
                COMPUTE,
                t.start,
                t.end,
                json!({"stage": stage, "mb": mb}),
            )),
            TaskKind::Backward { stage, mb, device } => events.push(ev(
                format!("B{mb}"),
                "backward",
                *device,
                COMPUTE,
                t.start,
                t.end,
                json!({"stage": stage, "mb": mb}),
            )),
            TaskKind::WeightGrad { stage, mb, device } => events.push(ev(
                format!("W{mb}"),
                "weight-grad",
                *device,
                COMPUTE,
                t.start,
                t.end,
                json!({"stage": stage, "mb": mb}),
            )),
            TaskKind::Step { stage, device } => events.push(ev(
                "step".into(),
                "optimizer",
                *device,
                COMPUTE,
                t.start,
                t.end,
                json!({"stage": stage}),
            )),
            TaskKind::AllReduce {
                stage,
                devices,
                bytes,
            } => {
                for &d in devices {
                    events.push(ev(
                        "allreduce".into(),
                        "allreduce",
                        d,
                        COMPUTE,
                        t.start,
                        t.end,
                        json!({"stage": stage, "bytes": bytes, "group": devices}),
                    ));
                }
            }
            TaskKind::Memory { device } => {
                if t.end > t.start {
                    events.push(ev(
                        "memory".into(),
                        "memory",
                        *device,
                        COMPUTE,
                        t.start,
                        t.end,
                        json!({}),
                    ));
                }
            }
            TaskKind::Transfer {
                dir,
                mb,
                src,
                dst,
                bytes,
            } => {
                if t.end <= t.start {
                    continue;
                }
                let what = match dir {
                    Dir::Act => "act",
                    Dir::Grad => "grad",
                };
                let args = json!({"mb": mb, "bytes": bytes, "src": src, "dst": dst});
                events.push(ev(
                    format!("{what}{mb}->{dst}"),
                    what,
                    *src,
                    SEND,
                    t.start,
                    t.end,
                    args.clone(),
                ));
                events.push(ev(
                    format!("{what}{mb}<-{src}"),
                    what,
                    *dst,
                    RECV,
                    t.start,
                    t.end,
                    args,
                ));
            }
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}
