//! Chrome / Perfetto trace of a run: one process (track) per device, one complete event
//! (`"ph": "X"`) per executed instruction with its `describe()` text, real timestamps in
//! microseconds from the start of the run, and (Linux) the thread's CPU time in the
//! instruction as `args.cpu_us`.

use serde_json::{json, Value};

/// One executed instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub device: usize,
    /// 1-based step.
    pub step: usize,
    /// Index in the device's instruction list.
    pub index: usize,
    pub name: String,
    pub start_us: f64,
    pub dur_us: f64,
    /// CPU time the device's thread spent in the instruction (Linux; `None` elsewhere): with
    /// several workers time-sharing a core, `dur_us` also counts the others' slices.
    pub cpu_us: Option<f64>,
}

/// The events of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub devices: usize,
    pub events: Vec<Event>,
}

impl Trace {
    /// The Chrome trace JSON object (`{"traceEvents": [...]}`), events ordered by device then
    /// time.
    pub fn to_json(&self) -> Value {
        let mut evs: Vec<Value> = (0..self.devices)
            .map(|d| {
                json!({"name": "process_name", "ph": "M", "pid": d, "tid": 0,
                       "args": {"name": format!("device {d}")}})
            })
            .collect();
        let mut sorted: Vec<&Event> = self.events.iter().collect();
        sorted.sort_by_key(|e| (e.device, e.step, e.index));
        for e in sorted {
            let cat = e.name.split_whitespace().next().unwrap_or("instr");
            evs.push(json!({
                "name": e.name, "cat": cat, "ph": "X", "pid": e.device, "tid": 0,
                "ts": (e.start_us * 1000.0).round() / 1000.0,
                "dur": (e.dur_us * 1000.0).round() / 1000.0,
                "args": match e.cpu_us {
                    Some(c) => json!({"step": e.step, "index": e.index,
                                      "cpu_us": (c * 1000.0).round() / 1000.0}),
                    None => json!({"step": e.step, "index": e.index}),
                },
            }));
        }
        json!({"traceEvents": evs, "displayTimeUnit": "ms"})
    }
}
