//! The Prometheus registry served at `GET /metrics`: every family of the metrics contract,
//! registered once at start-up with the `ballast_` prefix, `model_name` and `engine` labels.
//!
//! Families are grouped as the contract groups them: gauges set from each step's snapshot,
//! counters incremented by each step's increments, histograms observed from the compute
//! layer's samples, the data-parallel family, and the HTTP frontend's own series. Per-rank
//! children are resolved once ([`RankSeries`]) so publishing a step does no label hashing.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::config::buckets::{Buckets, Family};

use crate::config::EngineConfig;
use crate::step::RejectReason;
use crate::step::events::FinishReason;

/// The statuses whose `http_requests_total` series exist from start-up for every API route:
/// success, a bad request, admission (429) and draining or a stopped core (503).
pub const STATUSES_FROM_START: [&str; 4] = ["200", "400", "429", "503"];

/// What the registry needs to know about the engine.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// `model_name` label.
    pub model_name: String,
    /// DP ranks (`engine` label values "0".."N-1").
    pub num_ranks: usize,
    /// Histogram buckets.
    pub buckets: Buckets,
    /// `cache_config_info` labels.
    pub block_size: usize,
    /// `cache_config_info` labels.
    pub num_blocks: usize,
    /// `cache_config_info` labels.
    pub enable_prefix_caching: bool,
    /// `cache_config_info` labels and the utilisation gauge.
    pub max_num_seqs: usize,
    /// `cache_config_info` labels.
    pub max_num_batched_tokens: usize,
    /// `cache_config_info` labels.
    pub max_model_len: usize,
    /// `cache_config_info` labels: the KV cache's element type (`f32`, `f16`).
    pub cache_dtype: &'static str,
}

impl MetricsConfig {
    /// What an engine started with `config` registers.
    pub fn for_engine(config: &EngineConfig) -> Self {
        let s = &config.scheduler;
        Self {
            model_name: config.served_model_name.clone(),
            num_ranks: config.data_parallel_size,
            buckets: config.stats.buckets.clone(),
            block_size: s.block_size,
            num_blocks: s.num_blocks,
            enable_prefix_caching: s.enable_prefix_caching,
            max_num_seqs: s.max_num_seqs,
            max_num_batched_tokens: s.max_num_batched_tokens,
            max_model_len: s.max_model_len,
            cache_dtype: config.model.kv_dtype.name(),
        }
    }
}

/// Every family, registered.
pub struct EngineMetrics {
    registry: Registry,
    model_name: String,
    ranks: Vec<RankSeries>,
    rejections: Vec<(RejectReason, IntCounter)>,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    control_refused: Vec<(&'static str, IntCounter)>,
}

/// Why the control API refused a call, as the `reason` label of
/// `ballast_control_requests_refused_total`: no token, a malformed `authorization`
/// value, a token that is none of `--control-token-file`'s.
pub const CONTROL_REFUSAL_REASONS: [&str; 3] = ["missing", "malformed", "wrong"];

/// The children of one rank, resolved once.
#[allow(missing_docs)]
pub struct RankSeries {
    pub running: IntGauge,
    pub waiting: IntGauge,
    pub waiting_capacity: IntGauge,
    pub waiting_deferred: IntGauge,
    pub kv_usage: Gauge,
    pub kv_tokens_available: IntGauge,
    pub kv_tokens_evictable: IntGauge,
    pub kv_tokens_used: IntGauge,
    pub utilization: Gauge,
    pub gen_throughput: Gauge,
    pub prompt_tokens: IntCounter,
    pub prompt_local_compute: IntCounter,
    pub prompt_local_cache_hit: IntCounter,
    pub prompt_external_kv_transfer: IntCounter,
    pub generation_tokens: IntCounter,
    pub preemptions: IntCounter,
    pub success_stop: IntCounter,
    pub success_length: IntCounter,
    pub success_abort: IntCounter,
    pub prefix_queries: IntCounter,
    pub prefix_hits: IntCounter,
    pub prefix_preempted_queries: IntCounter,
    pub prefix_preempted_hits: IntCounter,
    pub retracted_requests: IntCounter,
    pub retracted_input_tokens: IntCounter,
    pub retracted_output_tokens: IntCounter,
    pub flops: IntCounter,
    pub read_bytes: IntCounter,
    pub write_bytes: IntCounter,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub tpot: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub total_queue: Histogram,
    pub prefill: Histogram,
    pub decode: Histogram,
    pub inference: Histogram,
    pub prompt_tokens_hist: Histogram,
    pub generation_tokens_hist: Histogram,
    pub iteration_tokens: Histogram,
    pub kv_block_lifetime: Histogram,
    pub kv_block_idle_before_evict: Histogram,
    pub kv_block_reuse_gap: Histogram,
    pub dp_tokens_scheduled: IntCounter,
    pub dp_tokens_imbalance: IntCounter,
    pub dp_pairs_scheduled: IntCounter,
    pub dp_pairs_imbalance: IntCounter,
    pub dp_steps_active: IntCounter,
    pub dp_steps_idle: IntCounter,
    pub dp_sync_wait: Histogram,
    /// Only rank 0 observes the ratio, so an engine-level sample is not counted N times.
    pub dp_imbalance_ratio: Option<Histogram>,
}

impl RankSeries {
    /// The success counter of a finish reason.
    pub fn success(&self, reason: FinishReason) -> &IntCounter {
        match reason {
            FinishReason::Stop => &self.success_stop,
            FinishReason::Length => &self.success_length,
            FinishReason::Abort => &self.success_abort,
        }
    }
}

struct Reg<'a> {
    registry: &'a Registry,
    buckets: &'a Buckets,
}

const LABELS: [&str; 2] = ["model_name", "engine"];

impl Reg<'_> {
    fn add<C: Collector + Clone + 'static>(&self, c: C) -> C {
        self.registry
            .register(Box::new(c.clone()))
            .expect("metric names are unique");
        c
    }

    fn gauge(&self, name: &str, help: &str, extra: &[&str]) -> GaugeVec {
        self.add(GaugeVec::new(Opts::new(name, help), &labels(extra)).expect("valid gauge"))
    }

    fn int_gauge(&self, name: &str, help: &str, extra: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), &labels(extra)).expect("valid gauge"))
    }

    fn counter(&self, name: &str, help: &str, extra: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), &labels(extra)).expect("valid counter"))
    }

    fn histogram(&self, name: &str, help: &str, family: Family) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(self.buckets.get(family));
        self.add(HistogramVec::new(opts, &LABELS).expect("valid histogram"))
    }
}

fn labels<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    LABELS
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect()
}

impl EngineMetrics {
    /// Registers every family and resolves the children of every rank, so all series
    /// exist (at zero) from start-up.
    pub fn new(cfg: &MetricsConfig) -> Self {
        let registry = Registry::new();
        let r = Reg {
            registry: &registry,
            buckets: &cfg.buckets,
        };
        let p = |s: &str| format!("ballast_{s}");

        let running = r.int_gauge(
            &p("num_requests_running"),
            "Requests in the running batch (snapshot at the end of the step).",
            &[],
        );
        let waiting = r.int_gauge(
            &p("num_requests_waiting"),
            "Requests waiting to run: capacity + deferred.",
            &[],
        );
        let waiting_by_reason = r.int_gauge(
            &p("num_requests_waiting_by_reason"),
            "Waiting requests by reason: capacity (batch slots or KV blocks) or deferred (runnable capacity may exist but the tenant is at its running cap).",
            &["reason"],
        );
        let kv_usage = r.gauge(
            &p("kv_cache_usage_ratio"),
            "KV blocks referenced by live requests / total blocks (evictable cached blocks count as free). Take max over engines, never the mean.",
            &[],
        );
        let kv_tokens = r.int_gauge(
            &p("kv_cache_tokens"),
            "KV cache capacity in tokens by state: available (empty), evictable (cached prefix, unreferenced), used (referenced). The states sum to capacity.",
            &["state"],
        );
        let utilization = r.gauge(
            &p("utilization"),
            "max(running / max_num_seqs, kv_cache_usage_ratio / 0.9).",
            &[],
        );
        let gen_throughput = r.gauge(
            &p("gen_throughput_tokens_per_second"),
            "Generated tokens per second over the log window; 0 after 30 s without decode.",
            &[],
        );
        let info = r.int_gauge(
            &p("cache_config_info"),
            "KV cache and batching configuration (value is always 1).",
            &[
                "block_size",
                "num_blocks",
                "enable_prefix_caching",
                "max_num_seqs",
                "max_num_batched_tokens",
                "max_model_len",
                "cache_dtype",
            ],
        );

        let prompt_tokens = r.counter(
            &p("prompt_tokens_total"),
            "Prompt tokens of requests whose prefill completed.",
            &[],
        );
        let prompt_by_source = r.counter(
            &p("prompt_tokens_by_source_total"),
            "Prompt tokens by where their KV came from: local_compute, local_cache_hit, external_kv_transfer. Sums to prompt_tokens_total.",
            &["source"],
        );
        let generation_tokens = r.counter(&p("generation_tokens_total"), "Generated tokens.", &[]);
        let preemptions = r.counter(
            &p("num_preemptions_total"),
            "Requests preempted (KV freed, recomputed later).",
            &[],
        );
        let success = r.counter(
            &p("request_success_total"),
            "Finished requests by finish reason.",
            &["finished_reason"],
        );
        let prefix_queries = r.counter(
            &p("prefix_cache_queries_total"),
            "Tokens looked up in the prefix cache by new requests.",
            &[],
        );
        let prefix_hits = r.counter(
            &p("prefix_cache_hits_total"),
            "Tokens found in the prefix cache by new requests.",
            &[],
        );
        let prefix_preempted_queries = r.counter(
            &p("prefix_cache_preempted_queries_total"),
            "Tokens looked up in the prefix cache by requests resuming after preemption.",
            &[],
        );
        let prefix_preempted_hits = r.counter(
            &p("prefix_cache_preempted_hits_total"),
            "Tokens found in the prefix cache by requests resuming after preemption.",
            &[],
        );
        let retracted_requests = r.counter(
            &p("retracted_requests_total"),
            "Requests whose computed KV was thrown away by preemption.",
            &[],
        );
        let retracted_input = r.counter(
            &p("retracted_input_tokens_total"),
            "Computed prompt tokens thrown away by preemption.",
            &[],
        );
        let retracted_output = r.counter(
            &p("retracted_output_tokens_total"),
            "Computed output tokens thrown away by preemption.",
            &[],
        );
        let flops = r.counter(
            &p("estimated_flops_per_gpu_total"),
            "Floating-point operations by the analytic per-step model (per rank).",
            &[],
        );
        let read_bytes = r.counter(
            &p("estimated_read_bytes_per_gpu_total"),
            "Bytes read (weights, KV context) by the analytic per-step model.",
            &[],
        );
        let write_bytes = r.counter(
            &p("estimated_write_bytes_per_gpu_total"),
            "Bytes written (new KV) by the analytic per-step model.",
            &[],
        );

        let h = |name: &str, help: &str, f| r.histogram(&p(name), help, f);
        let ttft = h(
            "time_to_first_token_seconds",
            "Arrival to first token, frontend clock.",
            Family::TimeToFirstToken,
        );
        let itl = h(
            "inter_token_latency_seconds",
            "Time between successive tokens of a request, engine clock.",
            Family::InterTokenLatency,
        );
        let tpot = h(
            "request_time_per_output_token_seconds",
            "Decode time / (generated tokens - 1) per finished request with at least 2 tokens.",
            Family::InterTokenLatency,
        );
        let e2e = h(
            "e2e_request_latency_seconds",
            "Arrival to finish, frontend clock.",
            Family::RequestLatency,
        );
        let queue = h(
            "request_queue_time_seconds",
            "First queued to first scheduled.",
            Family::RequestLatency,
        );
        let total_queue = h(
            "request_total_queue_time_seconds",
            "Time waiting across every (re-)queue, including after preemptions.",
            Family::RequestLatency,
        );
        let prefill = h(
            "request_prefill_time_seconds",
            "First scheduled to first token.",
            Family::RequestLatency,
        );
        let decode = h(
            "request_decode_time_seconds",
            "First token to last token.",
            Family::RequestLatency,
        );
        let inference = h(
            "request_inference_time_seconds",
            "First scheduled to last token (prefill + decode).",
            Family::RequestLatency,
        );
        let prompt_hist = h(
            "request_prompt_tokens",
            "Prompt tokens per finished request.",
            Family::RequestTokens,
        );
        let gen_hist = h(
            "request_generation_tokens",
            "Generated tokens per finished request.",
            Family::RequestTokens,
        );
        let iteration = h(
            "iteration_tokens",
            "Tokens computed per step.",
            Family::IterationTokens,
        );
        let lifetime = h(
            "kv_block_lifetime_seconds",
            "Sampled KV blocks: allocation to eviction (with --kv-cache-metrics).",
            Family::KvCacheResidency,
        );
        let idle = h(
            "kv_block_idle_before_evict_seconds",
            "Sampled KV blocks: last use to eviction (with --kv-cache-metrics).",
            Family::KvCacheResidency,
        );
        let reuse = h(
            "kv_block_reuse_gap_seconds",
            "Sampled KV blocks: time between successive uses (with --kv-cache-metrics).",
            Family::KvCacheResidency,
        );

        let dp_tokens = r.counter(
            &p("dp_tokens_total"),
            "Data-parallel tokens per rank: scheduled, and imbalance (max over ranks - this rank).",
            &["kind"],
        );
        let dp_pairs = r.counter(
            &p("dp_attention_pairs_total"),
            "Data-parallel causal attention pairs per rank: scheduled, and imbalance (max - this rank).",
            &["kind"],
        );
        let dp_steps = r.counter(
            &p("dp_steps_total"),
            "Lockstep steps by this rank's state: active (computed tokens) or idle.",
            &["rank_state"],
        );
        let dp_sync = h(
            "dp_sync_wait_seconds",
            "Time this rank waited at the step barrier.",
            Family::DpSyncWait,
        );
        let dp_ratio = h(
            "dp_token_imbalance_ratio",
            "max_tokens * num_ranks / sum_tokens per step (1 = balanced); observed by rank 0 only.",
            Family::DpImbalanceRatio,
        );

        let rejections = r.counter(
            &p("admission_rejections_total"),
            "Requests turned away at the front door with HTTP 429, by reason (attributed to engine 0: no rank was chosen).",
            &["reason"],
        );
        let http_requests = r.add(
            IntCounterVec::new(
                Opts::new(p("http_requests_total"), "HTTP requests by route template, method and status (health and metrics excluded)."),
                &["model_name", "endpoint", "method", "status"],
            )
            .expect("valid counter"),
        );
        let http_duration = r.add(
            HistogramVec::new(
                HistogramOpts::new(
                    p("http_request_duration_seconds"),
                    "HTTP request duration until the response body ended.",
                )
                .buckets(cfg.buckets.get(Family::HttpRequestDuration)),
                &["model_name", "endpoint", "method"],
            )
            .expect("valid histogram"),
        );
        let control_refused = r.add(
            IntCounterVec::new(
                Opts::new(
                    p("control_requests_refused_total"),
                    "Control-API (gRPC) calls refused as UNAUTHENTICATED, by reason: missing, malformed or wrong token.",
                ),
                &["model_name", "reason"],
            )
            .expect("valid counter"),
        );

        let m = cfg.model_name.as_str();
        let control_refused = CONTROL_REFUSAL_REASONS
            .iter()
            .map(|&reason| (reason, control_refused.with_label_values(&[m, reason])))
            .collect();
        let ranks = (0..cfg.num_ranks)
            .map(|rank| {
                let engine = rank.to_string();
                let e = engine.as_str();
                let l = [m, e];
                let with = |extra: &'static str| [m, e, extra];
                info.with_label_values(&[
                    m,
                    e,
                    &cfg.block_size.to_string(),
                    &cfg.num_blocks.to_string(),
                    &cfg.enable_prefix_caching.to_string(),
                    &cfg.max_num_seqs.to_string(),
                    &cfg.max_num_batched_tokens.to_string(),
                    &cfg.max_model_len.to_string(),
                    cfg.cache_dtype,
                ])
                .set(1);
                RankSeries {
                    running: running.with_label_values(&l),
                    waiting: waiting.with_label_values(&l),
                    waiting_capacity: waiting_by_reason.with_label_values(&with("capacity")),
                    waiting_deferred: waiting_by_reason.with_label_values(&with("deferred")),
                    kv_usage: kv_usage.with_label_values(&l),
                    kv_tokens_available: kv_tokens.with_label_values(&with("available")),
                    kv_tokens_evictable: kv_tokens.with_label_values(&with("evictable")),
                    kv_tokens_used: kv_tokens.with_label_values(&with("used")),
                    utilization: utilization.with_label_values(&l),
                    gen_throughput: gen_throughput.with_label_values(&l),
                    prompt_tokens: prompt_tokens.with_label_values(&l),
                    prompt_local_compute: prompt_by_source
                        .with_label_values(&with("local_compute")),
                    prompt_local_cache_hit: prompt_by_source
                        .with_label_values(&with("local_cache_hit")),
                    prompt_external_kv_transfer: prompt_by_source
                        .with_label_values(&with("external_kv_transfer")),
                    generation_tokens: generation_tokens.with_label_values(&l),
                    preemptions: preemptions.with_label_values(&l),
                    success_stop: success.with_label_values(&with("stop")),
                    success_length: success.with_label_values(&with("length")),
                    success_abort: success.with_label_values(&with("abort")),
                    prefix_queries: prefix_queries.with_label_values(&l),
                    prefix_hits: prefix_hits.with_label_values(&l),
                    prefix_preempted_queries: prefix_preempted_queries.with_label_values(&l),
                    prefix_preempted_hits: prefix_preempted_hits.with_label_values(&l),
                    retracted_requests: retracted_requests.with_label_values(&l),
                    retracted_input_tokens: retracted_input.with_label_values(&l),
                    retracted_output_tokens: retracted_output.with_label_values(&l),
                    flops: flops.with_label_values(&l),
                    read_bytes: read_bytes.with_label_values(&l),
                    write_bytes: write_bytes.with_label_values(&l),
                    ttft: ttft.with_label_values(&l),
                    itl: itl.with_label_values(&l),
                    tpot: tpot.with_label_values(&l),
                    e2e: e2e.with_label_values(&l),
                    queue: queue.with_label_values(&l),
                    total_queue: total_queue.with_label_values(&l),
                    prefill: prefill.with_label_values(&l),
                    decode: decode.with_label_values(&l),
                    inference: inference.with_label_values(&l),
                    prompt_tokens_hist: prompt_hist.with_label_values(&l),
                    generation_tokens_hist: gen_hist.with_label_values(&l),
                    iteration_tokens: iteration.with_label_values(&l),
                    kv_block_lifetime: lifetime.with_label_values(&l),
                    kv_block_idle_before_evict: idle.with_label_values(&l),
                    kv_block_reuse_gap: reuse.with_label_values(&l),
                    dp_tokens_scheduled: dp_tokens.with_label_values(&with("scheduled")),
                    dp_tokens_imbalance: dp_tokens.with_label_values(&with("imbalance")),
                    dp_pairs_scheduled: dp_pairs.with_label_values(&with("scheduled")),
                    dp_pairs_imbalance: dp_pairs.with_label_values(&with("imbalance")),
                    dp_steps_active: dp_steps.with_label_values(&with("active")),
                    dp_steps_idle: dp_steps.with_label_values(&with("idle")),
                    dp_sync_wait: dp_sync.with_label_values(&l),
                    dp_imbalance_ratio: (rank == 0).then(|| dp_ratio.with_label_values(&l)),
                }
            })
            .collect();
        let rejections = RejectReason::ALL
            .into_iter()
            .map(|reason| {
                (
                    reason,
                    rejections.with_label_values(&[m, "0", reason.label()]),
                )
            })
            .collect();
        Self {
            registry,
            model_name: cfg.model_name.clone(),
            ranks,
            rejections,
            http_requests,
            http_duration,
            control_refused,
        }
    }

    /// Counts one control-API call refused for `reason` (one of
    /// [`CONTROL_REFUSAL_REASONS`]).
    pub fn observe_control_refusal(&self, reason: &str) {
        if let Some((_, c)) = self.control_refused.iter().find(|(r, _)| *r == reason) {
            c.inc();
        }
    }

    /// The series of `rank`.
    pub fn rank(&self, rank: usize) -> &RankSeries {
        &self.ranks[rank]
    }

    /// Number of ranks.
    pub fn num_ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Counts one request turned away at the front door.
    pub fn observe_rejection(&self, reason: RejectReason) {
        if let Some((_, c)) = self.rejections.iter().find(|(r, _)| *r == reason) {
            c.inc();
        }
    }

    /// Creates the HTTP series of the API routes at zero, so they exist from start-up: the
    /// duration histogram of each (route, method), and the request counter for the statuses
    /// every route can answer with ([`STATUSES_FROM_START`]). Other statuses appear when
    /// first seen.
    pub fn prepare_http(&self, routes: &[(&str, &str)]) {
        let m = self.model_name.as_str();
        for &(endpoint, method) in routes {
            let _ = self.http_duration.with_label_values(&[m, endpoint, method]);
            for status in STATUSES_FROM_START {
                let _ = self
                    .http_requests
                    .with_label_values(&[m, endpoint, method, status]);
            }
        }
    }

    /// Records one finished HTTP request.
    pub fn observe_http(&self, endpoint: &str, method: &str, status: u16, seconds: f64) {
        let m = self.model_name.as_str();
        self.http_requests
            .with_label_values(&[m, endpoint, method, &status.to_string()])
            .inc();
        self.http_duration
            .with_label_values(&[m, endpoint, method])
            .observe(seconds);
    }

    /// The text exposition of every family.
    pub fn render(&self) -> String {
        let mut buf = Vec::with_capacity(64 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("exposition is UTF-8")
    }
}
