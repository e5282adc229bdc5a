//! The periodic human log line (contract §8), per engine or aggregated over engines.

use std::fmt::Write as _;
use std::time::Instant;

use super::window::HitRateWindow;
use super::{StatLogger, StepStats};
use crate::step::events::SchedulerSnapshot;

#[derive(Debug, Default, Clone)]
struct LogAccum {
    prompt_computed: u64,
    generated: u64,
    preemptions: u64,
    snapshot: SchedulerSnapshot,
    active: bool,
}

/// The periodic human log line, per engine or aggregated over engines.
pub struct LogLineLogger {
    ranks: Vec<LogAccum>,
    windows: Vec<HitRateWindow>,
    aggregate: bool,
    last: Instant,
    quiet: bool,
}

impl LogLineLogger {
    /// A logger for `num_ranks` ranks; `aggregate` prints one line for all of them.
    pub fn new(num_ranks: usize, aggregate: bool, now: Instant) -> Self {
        Self {
            ranks: vec![LogAccum::default(); num_ranks],
            windows: (0..num_ranks).map(|_| HitRateWindow::new(1000)).collect(),
            aggregate,
            last: now,
            quiet: false,
        }
    }

    /// The lines for the interval ending at `now`, resetting the interval's counts. Empty
    /// when nothing happened and nothing is queued (after one quiet line).
    pub fn lines(&mut self, now: Instant) -> Vec<String> {
        let secs = now
            .saturating_duration_since(self.last)
            .as_secs_f64()
            .max(1e-9);
        self.last = now;
        let busy = self
            .ranks
            .iter()
            .any(|a| a.active || a.snapshot.running > 0 || a.snapshot.waiting() > 0);
        if !busy && self.quiet {
            return Vec::new();
        }
        self.quiet = !busy;
        let line = |label: String, a: &LogAccum, kv: f64, hit: f64| {
            let mut s = format!(
                "{label}: Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, Running: {} reqs, Waiting: {} reqs",
                a.prompt_computed as f64 / secs,
                a.generated as f64 / secs,
                a.snapshot.running,
                a.snapshot.waiting(),
            );
            if a.snapshot.waiting_deferred > 0 {
                let _ = write!(s, ", Deferred: {} reqs", a.snapshot.waiting_deferred);
            }
            if a.preemptions > 0 {
                let _ = write!(s, ", Preemptions: {}", a.preemptions);
            }
            let _ = write!(
                s,
                ", KV cache usage: {:.1}%, Prefix cache hit rate: {:.1}%",
                kv * 100.0,
                hit * 100.0
            );
            s
        };
        let out = if self.aggregate {
            let mut sum = LogAccum::default();
            let mut kv_max = 0.0f64;
            let (mut hits, mut queries) = (0u64, 0u64);
            for (a, w) in self.ranks.iter().zip(&self.windows) {
                sum.prompt_computed += a.prompt_computed;
                sum.generated += a.generated;
                sum.preemptions += a.preemptions;
                sum.snapshot.running += a.snapshot.running;
                sum.snapshot.waiting_capacity += a.snapshot.waiting_capacity;
                sum.snapshot.waiting_deferred += a.snapshot.waiting_deferred;
                // KV usage is per-rank capacity: the fullest rank is what limits admission,
                // so the aggregate shows the max, never the mean.
                kv_max = kv_max.max(a.snapshot.kv_usage);
                hits += w.hits();
                queries += w.queries();
            }
            let hit = if queries > 0 {
                hits as f64 / queries as f64
            } else {
                0.0
            };
            let n = self.ranks.len();
            vec![line(
                format!("Engines 0-{} (sum, KV max)", n - 1),
                &sum,
                kv_max,
                hit,
            )]
        } else {
            self.ranks
                .iter()
                .zip(&self.windows)
                .enumerate()
                .map(|(r, (a, w))| {
                    line(
                        format!("Engine {r:03}"),
                        a,
                        a.snapshot.kv_usage,
                        w.hit_rate(),
                    )
                })
                .collect()
        };
        for a in &mut self.ranks {
            a.prompt_computed = 0;
            a.generated = 0;
            a.preemptions = 0;
            a.active = false;
        }
        out
    }
}

impl StatLogger for LogLineLogger {
    fn record(&mut self, s: &StepStats<'_>) {
        // A rank reports its own prefix-cache resets like any other counter, so the window
        // starts over whoever asked for the reset (control API, HTTP, a test).
        if s.counters.prefix_cache.resets > 0 {
            self.windows[s.rank].reset();
        }
        let a = &mut self.ranks[s.rank];
        a.prompt_computed += s.counters.prefill_tokens as u64;
        a.generated += s.iteration.generation_tokens;
        a.preemptions += s.counters.preemptions as u64;
        a.snapshot = *s.snapshot;
        a.active |= s.counters.scheduled_tokens > 0;
        let p = &s.counters.prefix_cache;
        self.windows[s.rank].observe(p.requests, p.queries, p.hits);
    }

    fn tick(&mut self, now: Instant) {
        for line in self.lines(now) {
            tracing::info!(target: "ballast::stats", "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::runtime::kv::{PoolCounts, PrefixCacheStats};
    use crate::step::events::StepCounters;
    use crate::telemetry::stats::IterationStats;

    fn snapshot(running: u32, capacity: u32, deferred: u32, kv: f64) -> SchedulerSnapshot {
        SchedulerSnapshot {
            running,
            waiting_capacity: capacity,
            waiting_deferred: deferred,
            kv_blocks: PoolCounts::default(),
            block_size: 16,
            kv_usage: kv,
        }
    }

    fn feed(
        l: &mut LogLineLogger,
        rank: usize,
        snap: SchedulerSnapshot,
        prefill: u32,
        generated: u64,
        hits: (u64, u64),
    ) {
        let counters = StepCounters {
            scheduled_tokens: prefill + generated as u32,
            prefill_tokens: prefill,
            prefix_cache: PrefixCacheStats {
                requests: (hits.1 > 0) as u64,
                queries: hits.1,
                hits: hits.0,
                ..Default::default()
            },
            ..Default::default()
        };
        let it = IterationStats {
            generation_tokens: generated,
            ..Default::default()
        };
        l.record(&StepStats {
            rank,
            ts: Instant::now(),
            snapshot: &snap,
            counters: &counters,
            iteration: &it,
            dp: None,
            residency: &[],
        });
    }

    #[test]
    fn per_engine_lines_show_throughput_deferred_and_hit_rate() {
        let t0 = Instant::now();
        let mut l = LogLineLogger::new(2, false, t0);
        feed(&mut l, 0, snapshot(3, 1, 2, 0.5), 100, 10, (30, 100));
        feed(&mut l, 1, snapshot(1, 0, 0, 0.25), 0, 5, (0, 0));
        let lines = l.lines(t0 + Duration::from_secs(10));
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            "Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 3 reqs, Waiting: 3 reqs, Deferred: 2 reqs, KV cache usage: 50.0%, Prefix cache hit rate: 30.0%"
        );
        assert!(
            !lines[1].contains("Deferred"),
            "only when non-zero: {}",
            lines[1]
        );
        // The interval's counts reset; the window and snapshot stay.
        let next = l.lines(t0 + Duration::from_secs(20));
        assert!(
            next[0].contains("Avg prompt throughput: 0.0 tokens/s"),
            "{}",
            next[0]
        );
        assert!(next[0].contains("Prefix cache hit rate: 30.0%"));
    }

    #[test]
    fn aggregated_line_sums_counts_and_shows_max_kv() {
        let t0 = Instant::now();
        let mut l = LogLineLogger::new(2, true, t0);
        feed(&mut l, 0, snapshot(3, 1, 0, 0.9), 0, 10, (10, 20));
        feed(&mut l, 1, snapshot(1, 2, 0, 0.1), 0, 10, (0, 20));
        let lines = l.lines(t0 + Duration::from_secs(1));
        assert_eq!(lines.len(), 1);
        let line = &lines[0];
        assert!(line.contains("Running: 4 reqs, Waiting: 3 reqs"), "{line}");
        assert!(line.contains("Avg generation throughput: 20.0"), "{line}");
        assert!(
            line.contains("KV cache usage: 90.0%"),
            "max, not mean: {line}"
        );
        assert!(line.contains("Prefix cache hit rate: 25.0%"), "{line}");
    }

    #[test]
    fn idle_intervals_are_logged_once() {
        let t0 = Instant::now();
        let mut l = LogLineLogger::new(1, false, t0);
        feed(&mut l, 0, snapshot(0, 0, 0, 0.0), 0, 0, (0, 0));
        assert_eq!(l.lines(t0 + Duration::from_secs(5)).len(), 1);
        assert!(l.lines(t0 + Duration::from_secs(10)).is_empty());
        feed(&mut l, 0, snapshot(1, 0, 0, 0.1), 4, 1, (0, 4));
        assert_eq!(l.lines(t0 + Duration::from_secs(15)).len(), 1);
    }

    /// A rank that reports a prefix-cache reset starts its hit-rate window over, whoever
    /// asked for the reset; other ranks keep theirs.
    #[test]
    fn a_reported_prefix_cache_reset_clears_that_ranks_window() {
        let t0 = Instant::now();
        let mut l = LogLineLogger::new(2, false, t0);
        feed(&mut l, 0, snapshot(0, 0, 0, 0.0), 0, 0, (50, 100));
        feed(&mut l, 1, snapshot(0, 0, 0, 0.0), 0, 0, (25, 100));
        let counters = StepCounters {
            prefix_cache: PrefixCacheStats {
                resets: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        l.record(&StepStats {
            rank: 0,
            ts: Instant::now(),
            snapshot: &snapshot(0, 0, 0, 0.0),
            counters: &counters,
            iteration: &IterationStats::default(),
            dp: None,
            residency: &[],
        });
        let lines = l.lines(t0 + Duration::from_secs(1));
        assert!(
            lines[0].contains("Prefix cache hit rate: 0.0%"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains("Prefix cache hit rate: 25.0%"),
            "{}",
            lines[1]
        );
    }
}
