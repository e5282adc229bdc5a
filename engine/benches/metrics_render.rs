//! Time to render `/metrics` of an engine with 8 data-parallel ranks after a workload.
//!
//! Every family is fed through the real publish path (the Prometheus stat logger) with a
//! synthetic workload, so histograms have spread-out values and every series exists. The
//! exposition is written to `target/metrics-8-ranks.prom` so `scripts/bench-metrics-render.sh`
//! can have Python's prometheus_client render the same series and values for comparison.
//!
//! `cargo bench -p ballast-engine --bench metrics_render`

use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_engine::compute::model::ModelSpec;
use ballast_engine::config::buckets::Buckets;
use ballast_engine::runtime::dp::DpBalance;
use ballast_engine::runtime::kv::{PoolCounts, PrefixCacheStats, ResidencySample};
use ballast_engine::step::events::{FinishReason, SchedulerSnapshot, StepCounters};
use ballast_engine::telemetry::metrics::{EngineMetrics, MetricsConfig};
use ballast_engine::telemetry::stats::flops::FlopsModel;
use ballast_engine::telemetry::stats::timeline::FinishedRequestStats;
use ballast_engine::telemetry::stats::{IterationStats, PrometheusLogger, StatLogger, StepStats};
use ballast_rng::SplitMix64;

const RANKS: usize = 8;

fn main() {
    let spec = ModelSpec::synthetic("small").unwrap();
    let metrics = Arc::new(EngineMetrics::new(&MetricsConfig {
        model_name: "synthetic:small".into(),
        num_ranks: RANKS,
        buckets: Buckets::defaults(spec.max_model_len),
        block_size: 16,
        num_blocks: 1024,
        enable_prefix_caching: true,
        max_num_seqs: 256,
        max_num_batched_tokens: 2048,
        max_model_len: spec.max_model_len,
        cache_dtype: "f32",
    }));
    let mut logger = PrometheusLogger::new(
        Arc::clone(&metrics),
        FlopsModel::new(&spec, 4),
        256,
        Duration::from_secs(5),
        true,
    );
    let mut rng = SplitMix64::new(7);
    let ms = |rng: &mut SplitMix64, scale: f64| Duration::from_secs_f64(rng.next_f64() * scale);
    let t0 = Instant::now();
    for step in 0..20_000u64 {
        let rank = (step % RANKS as u64) as usize;
        let finished = (0..(step % 3))
            .map(|_| FinishedRequestStats {
                finish_reason: if rng.below(10) == 0 {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                },
                e2e: ms(&mut rng, 20.0),
                queue: ms(&mut rng, 2.0),
                total_queue: ms(&mut rng, 3.0),
                prefill: ms(&mut rng, 1.0),
                decode: ms(&mut rng, 15.0),
                inference: ms(&mut rng, 16.0),
                tpot: Some(ms(&mut rng, 0.1)),
                prompt_tokens: rng.below(4000) as u32,
                generation_tokens: rng.below(1000) as u32,
                cached_tokens: 0,
                num_preemptions: 0,
                scheduled: true,
                prefilled: true,
            })
            .collect::<Vec<_>>();
        let it = IterationStats {
            ttft: (0..2).map(|_| rng.next_f64() * 2.0).collect(),
            itl: (0..16).map(|_| rng.next_f64() * 0.2).collect(),
            finished,
            generation_tokens: 16,
            prompt_tokens: 512,
            prompt_cached_tokens: 128,
        };
        let counters = StepCounters {
            scheduled_tokens: 1 + rng.below(2048) as u32,
            prefill_tokens: 500,
            preemptions: (rng.below(50) == 0) as u32,
            prefix_cache: PrefixCacheStats {
                requests: 2,
                queries: 600,
                hits: 200,
                ..Default::default()
            },
            sampled: 16,
            attention_pairs: 40_000,
            context_tokens: 8_000,
            ..Default::default()
        };
        let snapshot = SchedulerSnapshot {
            running: rng.below(256) as u32,
            waiting_capacity: rng.below(20) as u32,
            waiting_deferred: rng.below(5) as u32,
            kv_blocks: PoolCounts {
                used: 600,
                evictable: 200,
                available: 224,
                total: 1024,
            },
            block_size: 16,
            kv_usage: rng.next_f64(),
        };
        let dp = DpBalance {
            rank,
            num_ranks: RANKS,
            local_tokens: 100 + rng.below(100),
            max_tokens: 250,
            sum_tokens: 1200,
            local_attention_pairs: 10_000,
            max_attention_pairs: 30_000,
            sync_wait: ms(&mut rng, 0.01),
        };
        let residency = [
            ResidencySample::Lifetime(ms(&mut rng, 100.0)),
            ResidencySample::ReuseGap(ms(&mut rng, 10.0)),
        ];
        logger.record(&StepStats {
            rank,
            ts: t0 + Duration::from_millis(step),
            snapshot: &snapshot,
            counters: &counters,
            iteration: &it,
            dp: Some(&dp),
            residency: &residency,
        });
    }
    for i in 0..20 {
        metrics.observe_http(
            "/v1/completions",
            "POST",
            if i % 5 == 0 { 429 } else { 200 },
            0.5,
        );
    }

    let text = metrics.render();
    let samples = text.lines().filter(|l| !l.starts_with('#')).count();
    let reps = 300;
    let start = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(metrics.render());
    }
    let per = start.elapsed() / reps;
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/metrics-8-ranks.prom");
    std::fs::write(&out, &text).expect("write exposition");
    println!(
        "render /metrics, {RANKS} DP ranks: {samples} samples, {} bytes",
        text.len()
    );
    println!(
        "ballast (Rust, prometheus crate): {:.1} µs per render",
        per.as_secs_f64() * 1e6
    );
    println!("exposition written to {}", out.display());
}
