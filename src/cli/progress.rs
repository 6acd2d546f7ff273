//! Progress on stderr for the commands that can take a while (indicatif). Drawn only when stderr
//! is a terminal: scripts, pipes, CI logs and tests see nothing, and stdout is never touched.
//!
//! - [`spinner`]: a phase without a known length (importing, planning, compiling), with the
//!   elapsed time; its message changes as the command moves on.
//! - [`bar`]: a count (profiling runs, planners compared, training steps) with an ETA.
//!
//! Both return a [`Progress`] that clears its line when dropped, so an error that ends the
//! command early is not printed after a stale progress line.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Duration;

/// A progress line, cleared when dropped.
pub struct Progress(ProgressBar);

impl std::ops::Deref for Progress {
    type Target = ProgressBar;
    fn deref(&self) -> &ProgressBar {
        &self.0
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// A spinner showing `msg` and the elapsed time.
pub fn spinner(msg: impl Into<String>) -> Progress {
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    pb.set_style(style("{spinner} {msg} ({elapsed})"));
    pb.set_message(msg.into());
    pb.enable_steady_tick(Duration::from_millis(100));
    Progress(pb)
}

/// A bar of `len` units (`unit`: "runs", "steps", ...) labelled `msg`.
pub fn bar(len: u64, msg: impl Into<String>, unit: &str) -> Progress {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    pb.set_style(style(&format!(
        "{{msg}} [{{bar:24}}] {{pos}}/{{len}} {unit} ({{elapsed}}, eta {{eta}})"
    )));
    pb.set_message(msg.into());
    pb.enable_steady_tick(Duration::from_millis(200));
    Progress(pb)
}
