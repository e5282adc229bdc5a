//! Publishes the stats feed into the Prometheus registry ([`crate::telemetry::metrics`]): snapshots
//! are set, increments added, computed samples observed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::flops::FlopsModel;
use super::{StatLogger, StepStats};
use crate::runtime::kv::ResidencySample;
use crate::step::events::FinishReason;
use crate::telemetry::metrics::EngineMetrics;

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
    per_request: bool,
    generated: Vec<RateWindow>,
}

impl PrometheusLogger {
    /// A logger over `metrics`; `window` is the generation-throughput window.
    /// `per_request` observes the per-request histograms (latencies, tokens per request);
    /// `--disable-log-stats` turns it off, while gauges and counters stay.
    pub fn new(
        metrics: Arc<EngineMetrics>,
        flops: FlopsModel,
        max_num_seqs: usize,
        window: Duration,
        per_request: bool,
    ) -> Self {
        let n = metrics.num_ranks();
        Self {
            metrics,
            flops,
            max_num_seqs,
            window,
            per_request,
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
            // As vLLM counts an iteration: the whole prompts whose prefill completed in it
            // (cache hits included) plus the tokens it generated, so the histogram's sum is
            // prompt_tokens_total + generation_tokens_total.
            m.iteration_tokens
                .observe((it.prompt_tokens + it.generation_tokens) as f64);
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
        for f in &it.finished {
            m.success(f.finish_reason).inc();
        }
        if self.per_request {
            for &v in &it.ttft {
                m.ttft.observe(v);
            }
            for &v in &it.itl {
                m.itl.observe(v);
            }
            for f in &it.finished {
                // Every finished request, aborts included, is observed once in e2e and
                // the token histograms, so their counts equal request_success_total and
                // their sums the token counters. Engine stages are observed only when the
                // request reached them: a request aborted while queued has no queue time
                // to report, and a 0 would drag every quantile down under overload.
                m.e2e.observe(f.e2e.as_secs_f64());
                m.prompt_tokens_hist.observe(f.prompt_tokens as f64);
                m.generation_tokens_hist.observe(f.generation_tokens as f64);
                let completed = f.finish_reason != FinishReason::Abort;
                if completed || f.scheduled {
                    m.queue.observe(f.queue.as_secs_f64());
                    m.total_queue.observe(f.total_queue.as_secs_f64());
                }
                if completed || f.prefilled {
                    m.prefill.observe(f.prefill.as_secs_f64());
                    m.decode.observe(f.decode.as_secs_f64());
                    m.inference.observe(f.inference.as_secs_f64());
                }
                if let Some(t) = f.tpot {
                    m.tpot.observe(t.as_secs_f64());
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

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
