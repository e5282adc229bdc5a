//! The compute and publish layers of the metrics pipeline.
//!
//! The step loop records ([`crate::events`]); the output router computes, per step, an
//! [`IterationStats`] (TTFT and ITL samples, finished requests, token counts) from each
//! request's [`timeline::RequestTimeline`]; then every [`StatLogger`] gets the same
//! [`StepStats`] view: one feed, many loggers. Two loggers exist: the Prometheus registry
//! ([`PrometheusLogger`]) and the periodic human log line ([`LogLineLogger`]).

pub mod buckets;
pub mod flops;
pub mod timeline;
pub mod window;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dp::DpBalance;
use crate::events::{SchedulerSnapshot, StepCounters};
use crate::kv::ResidencySample;
use crate::metrics::EngineMetrics;
use flops::FlopsModel;
use timeline::FinishedRequestStats;
use window::HitRateWindow;

/// What one step of one rank produced, computed from its outputs by the output router.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IterationStats {
    /// Time to first token of requests whose first token came in this step (seconds).
    pub ttft: Vec<f64>,
    /// Inter-token latencies of this step's later tokens (seconds).
    pub itl: Vec<f64>,
    /// Requests that finished in this step.
    pub finished: Vec<FinishedRequestStats>,
    /// Tokens generated in this step.
    pub generation_tokens: u64,
    /// Prompt tokens of requests whose prefill completed in this step.
    pub prompt_tokens: u64,
    /// Of those, tokens served from the prefix cache.
    pub prompt_cached_tokens: u64,
}

/// The view every logger receives for one step (or idle report) of one rank.
#[derive(Debug, Clone, Copy)]
pub struct StepStats<'a> {
    /// The rank.
    pub rank: usize,
    /// The step's NEW_TOKENS time.
    pub ts: Instant,
    /// End-of-step state (gauges).
    pub snapshot: &'a SchedulerSnapshot,
    /// Step increments (counters).
    pub counters: &'a StepCounters,
    /// Computed per-request samples.
    pub iteration: &'a IterationStats,
    /// Data-parallel balance when a lockstep step ran; `None` for an idle report.
    pub dp: Option<&'a DpBalance>,
    /// Sampled KV residency events (with `--kv-cache-metrics`).
    pub residency: &'a [ResidencySample],
}

/// A consumer of the stats feed.
pub trait StatLogger: Send {
    /// One step (or idle report) of one rank.
    fn record(&mut self, s: &StepStats<'_>);
    /// Called every `--log-stats-interval`.
    fn tick(&mut self, _now: Instant) {}
}

/// Generated tokens over a sliding time window.
#[derive(Debug, Default)]
struct RateWindow {
    entries: VecDeque<(Instant, u64)>,
    sum: u64,
    last_token: Option<Instant>,
}

/// Without decode for this long the generation throughput reads 0.
const THROUGHPUT_DECAY: Duration = Duration::from_secs(30);

impl RateWindow {
    fn push(&mut self, ts: Instant, tokens: u64) {
        if tokens > 0 {
            self.entries.push_back((ts, tokens));
            self.sum += tokens;
            self.last_token = Some(ts);
        }
    }

    fn rate(&mut self, now: Instant, window: Duration) -> f64 {
        while let Some(&(ts, n)) = self.entries.front() {
            if now.saturating_duration_since(ts) <= window {
                break;
            }
            self.entries.pop_front();
            self.sum -= n;
        }
        match self.last_token {
            Some(t) if now.saturating_duration_since(t) < THROUGHPUT_DECAY => {
                self.sum as f64 / window.as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

/// Publishes the feed into the Prometheus registry.
pub struct PrometheusLogger {
    metrics: Arc<EngineMetrics>,
    flops: FlopsModel,
    max_num_seqs: usize,
    window: Duration,
    generated: Vec<RateWindow>,
}

impl PrometheusLogger {
    /// A logger over `metrics`; `window` is the generation-throughput window.
    pub fn new(
        metrics: Arc<EngineMetrics>,
        flops: FlopsModel,
        max_num_seqs: usize,
        window: Duration,
    ) -> Self {
        let n = metrics.num_ranks();
        Self {
            metrics,
            flops,
            max_num_seqs,
            window,
            generated: (0..n).map(|_| RateWindow::default()).collect(),
        }
    }
}

impl StatLogger for PrometheusLogger {
    fn record(&mut self, s: &StepStats<'_>) {
        let m = self.metrics.rank(s.rank);
        let (snap, c, it) = (s.snapshot, s.counters, s.iteration);

        // Snapshot: set, never add.
        m.running.set(snap.running as i64);
        m.waiting.set(snap.waiting() as i64);
        m.waiting_capacity.set(snap.waiting_capacity as i64);
        m.waiting_deferred.set(snap.waiting_deferred as i64);
        m.kv_usage.set(snap.kv_usage);
        let bs = snap.block_size as i64;
        m.kv_tokens_available
            .set(snap.kv_blocks.available as i64 * bs);
        m.kv_tokens_evictable
            .set(snap.kv_blocks.evictable as i64 * bs);
        m.kv_tokens_used.set(snap.kv_blocks.used as i64 * bs);
        m.utilization
            .set((snap.running as f64 / self.max_num_seqs as f64).max(snap.kv_usage / 0.9));

        // Increments: add, never set.
        m.preemptions.inc_by(c.preemptions as u64);
        m.retracted_requests.inc_by(c.preemptions as u64);
        m.retracted_input_tokens
            .inc_by(c.retracted_input_tokens as u64);
        m.retracted_output_tokens
            .inc_by(c.retracted_output_tokens as u64);
        let p = &c.prefix_cache;
        m.prefix_queries.inc_by(p.queries);
        m.prefix_hits.inc_by(p.hits);
        m.prefix_preempted_queries.inc_by(p.preempted_queries);
        m.prefix_preempted_hits.inc_by(p.preempted_hits);
        if c.scheduled_tokens > 0 {
            m.iteration_tokens.observe(c.scheduled_tokens as f64);
            let w = self.flops.step(
                c.scheduled_tokens as u64,
                c.sampled as u64,
                c.attention_pairs,
                c.context_tokens,
            );
            m.flops.inc_by(w.flops);
            m.read_bytes.inc_by(w.read_bytes);
            m.write_bytes.inc_by(w.write_bytes);
        }

        // Computed samples.
        m.generation_tokens.inc_by(it.generation_tokens);
        m.prompt_tokens.inc_by(it.prompt_tokens);
        m.prompt_local_cache_hit.inc_by(it.prompt_cached_tokens);
        m.prompt_local_compute
            .inc_by(it.prompt_tokens - it.prompt_cached_tokens);
        // No KV arrives from other engines yet; the series exists so the sources always sum.
        m.prompt_external_kv_transfer.inc_by(0);
        for &v in &it.ttft {
            m.ttft.observe(v);
        }
        for &v in &it.itl {
            m.itl.observe(v);
        }
        for f in &it.finished {
            m.success(f.finish_reason).inc();
            if f.finish_reason == crate::events::FinishReason::Abort {
                // An aborted request's latencies describe no completed work.
                continue;
            }
            m.e2e.observe(f.e2e.as_secs_f64());
            m.queue.observe(f.queue.as_secs_f64());
            m.total_queue.observe(f.total_queue.as_secs_f64());
            m.prefill.observe(f.prefill.as_secs_f64());
            m.decode.observe(f.decode.as_secs_f64());
            m.inference.observe(f.inference.as_secs_f64());
            if let Some(t) = f.tpot {
                m.tpot.observe(t.as_secs_f64());
            }
            m.prompt_tokens_hist.observe(f.prompt_tokens as f64);
            m.generation_tokens_hist.observe(f.generation_tokens as f64);
        }
        for r in s.residency {
            match *r {
                ResidencySample::Lifetime(d) => m.kv_block_lifetime.observe(d.as_secs_f64()),
                ResidencySample::IdleBeforeEvict(d) => {
                    m.kv_block_idle_before_evict.observe(d.as_secs_f64())
                }
                ResidencySample::ReuseGap(d) => m.kv_block_reuse_gap.observe(d.as_secs_f64()),
            }
        }

        if let Some(b) = s.dp {
            m.dp_tokens_scheduled.inc_by(b.local_tokens);
            m.dp_tokens_imbalance.inc_by(b.token_imbalance());
            m.dp_pairs_scheduled.inc_by(b.local_attention_pairs);
            m.dp_pairs_imbalance.inc_by(b.attention_pair_imbalance());
            if b.is_active() {
                m.dp_steps_active.inc();
            } else {
                m.dp_steps_idle.inc();
            }
            m.dp_sync_wait.observe(b.sync_wait.as_secs_f64());
            if let Some(h) = &m.dp_imbalance_ratio {
                h.observe(b.token_imbalance_ratio());
            }
        }

        let g = &mut self.generated[s.rank];
        g.push(s.ts, it.generation_tokens);
        m.gen_throughput.set(g.rate(s.ts, self.window));
    }

    fn tick(&mut self, now: Instant) {
        for (rank, g) in self.generated.iter_mut().enumerate() {
            self.metrics
                .rank(rank)
                .gen_throughput
                .set(g.rate(now, self.window));
        }
    }
}

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
    prefix_resets: Option<(Arc<std::sync::atomic::AtomicU64>, u64)>,
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
            prefix_resets: None,
        }
    }

    /// Clears the hit-rate windows whenever `resets` changes (a prefix-cache reset).
    pub fn watch_prefix_resets(mut self, resets: Arc<std::sync::atomic::AtomicU64>) -> Self {
        let seen = resets.load(std::sync::atomic::Ordering::SeqCst);
        self.prefix_resets = Some((resets, seen));
        self
    }

    /// Forgets the hit-rate windows (the prefix cache was reset).
    pub fn reset_prefix_cache(&mut self) {
        self.windows.iter_mut().for_each(HitRateWindow::reset);
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
        if let Some((resets, seen)) = &mut self.prefix_resets {
            let now = resets.load(std::sync::atomic::Ordering::SeqCst);
            if now != *seen {
                *seen = now;
                self.reset_prefix_cache();
            }
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
    use super::*;
    use crate::kv::{PoolCounts, PrefixCacheStats};

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

    #[test]
    fn generation_rate_window_and_decay() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        w.push(t0, 50);
        w.push(t0 + Duration::from_secs(2), 50);
        let win = Duration::from_secs(5);
        assert_eq!(w.rate(t0 + Duration::from_secs(3), win), 20.0);
        assert_eq!(
            w.rate(t0 + Duration::from_secs(6), win),
            10.0,
            "the first entry left the window"
        );
        assert_eq!(
            w.rate(t0 + Duration::from_secs(40), Duration::from_secs(60)),
            0.0,
            "30 s without decode reads 0"
        );
    }
}
