//! A one-line progress bar on stderr.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::runner::{Stop, Tally};

const WIDTH: usize = 20;
/// Redrawing more often only costs CPU next to the requests being measured.
const INTERVAL: Duration = Duration::from_millis(100);

/// Counts shown in one frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Frame {
    pub ok: u64,
    pub rejected: u64,
    pub failed: u64,
    pub elapsed: Duration,
}

/// Renders one frame, e.g. `[#####...............] 25/100  ok 24  429 1  fail 0  12.3 req/s`.
/// With a `--duration` the position is elapsed/total seconds instead of a count.
pub(crate) fn render(frame: Frame, stop: Stop) -> String {
    let done = frame.ok + frame.rejected + frame.failed;
    let secs = frame.elapsed.as_secs_f64();
    let (fraction, position) = match (stop.duration, stop.max_requests) {
        (Some(total), max) => {
            let by_time = secs / total.as_secs_f64();
            let by_count = max.map_or(0.0, |m| done as f64 / m as f64);
            (
                by_time.max(by_count),
                format!("{secs:.1}/{:.0}s", total.as_secs_f64()),
            )
        }
        (None, Some(m)) => (done as f64 / m as f64, format!("{done}/{m}")),
        (None, None) => (0.0, done.to_string()),
    };
    let filled = ((fraction.clamp(0.0, 1.0) * WIDTH as f64).round() as usize).min(WIDTH);
    let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
    format!(
        "[{}{}] {position}  ok {}  429 {}  fail {}  {rate:.1} req/s",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        frame.ok,
        frame.rejected,
        frame.failed,
    )
}

/// The redraw task; dropped or finished, it stops drawing.
pub(crate) struct Progress {
    task: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts redrawing, only if `enabled` and stderr is a terminal (a bar
    /// full of `\r` would garble logs and CI output).
    pub(crate) fn start(enabled: bool, tally: Arc<Tally>, stop: Stop) -> Self {
        if !enabled || !std::io::stderr().is_terminal() {
            return Progress { task: None };
        }
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let frame = Frame {
                    ok: tally.ok.load(Ordering::Relaxed),
                    rejected: tally.rejected.load(Ordering::Relaxed),
                    failed: tally.failed.load(Ordering::Relaxed),
                    elapsed: started.elapsed(),
                };
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r{}\x1b[K", render(frame, stop));
                let _ = err.flush();
            }
        });
        Progress { task: Some(task) }
    }

    /// Stops drawing and clears the line.
    pub(crate) fn finish(mut self) {
        if let Some(task) = self.task.take() {
            // The task only yields between whole writes, so aborting it
            // cannot leave half a line behind.
            task.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ok: u64, rejected: u64, failed: u64, secs: u64) -> Frame {
        Frame {
            ok,
            rejected,
            failed,
            elapsed: Duration::from_secs(secs),
        }
    }

    #[test]
    fn count_mode_line() {
        let stop = Stop {
            max_requests: Some(100),
            duration: None,
        };
        assert_eq!(
            render(frame(40, 8, 2, 4), stop),
            "[##########..........] 50/100  ok 40  429 8  fail 2  12.5 req/s"
        );
        assert_eq!(
            render(frame(0, 0, 0, 0), stop),
            "[....................] 0/100  ok 0  429 0  fail 0  0.0 req/s"
        );
    }

    #[test]
    fn duration_mode_shows_seconds_and_clamps_when_draining() {
        let stop = Stop {
            max_requests: None,
            duration: Some(Duration::from_secs(60)),
        };
        assert_eq!(
            render(frame(30, 0, 0, 15), stop),
            "[#####...............] 15.0/60s  ok 30  429 0  fail 0  2.0 req/s"
        );
        // Waiting for in-flight requests after the deadline: bar stays full.
        assert!(render(frame(1, 0, 0, 70), stop).starts_with(&format!("[{}]", "#".repeat(WIDTH))));
    }
}
