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

mod families;

use std::collections::HashMap;

pub use families::{FAMILIES, FamilyDef, Kind, PREFIX};

use crate::config::buckets::Buckets;

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

/// The registered families of [`FAMILIES`], by name.
struct Registered(HashMap<&'static str, Series>);

/// One registered family.
enum Series {
    Gauge(GaugeVec),
    IntGauge(IntGaugeVec),
    Counter(IntCounterVec),
    Histogram(HistogramVec),
}

impl Registered {
    /// Registers every family of [`FAMILIES`] in `registry`.
    fn new(registry: &Registry, buckets: &Buckets) -> Self {
        let mut out = HashMap::new();
        for def in FAMILIES {
            let opts = Opts::new(def.full_name(), def.help);
            let series = match def.kind {
                Kind::Gauge => Series::Gauge(GaugeVec::new(opts, def.labels).expect("valid gauge")),
                Kind::IntGauge => {
                    Series::IntGauge(IntGaugeVec::new(opts, def.labels).expect("valid gauge"))
                }
                Kind::Counter => {
                    Series::Counter(IntCounterVec::new(opts, def.labels).expect("valid counter"))
                }
                Kind::Histogram(family) => {
                    let opts = HistogramOpts::from(opts).buckets(buckets.get(family));
                    Series::Histogram(HistogramVec::new(opts, def.labels).expect("valid histogram"))
                }
            };
            let collector: Box<dyn Collector> = match &series {
                Series::Gauge(c) => Box::new(c.clone()),
                Series::IntGauge(c) => Box::new(c.clone()),
                Series::Counter(c) => Box::new(c.clone()),
                Series::Histogram(c) => Box::new(c.clone()),
            };
            registry
                .register(collector)
                .expect("family names are unique");
            out.insert(def.name, series);
        }
        Registered(out)
    }

    /// The family `name`, which the table declares (a name or kind that disagrees with
    /// [`FAMILIES`] is a bug the unit tests catch at once).
    fn get(&self, name: &str) -> &Series {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not in FAMILIES"))
    }

    fn gauge(&self, name: &str) -> GaugeVec {
        match self.get(name) {
            Series::Gauge(c) => c.clone(),
            _ => panic!("{name} is not a float gauge in FAMILIES"),
        }
    }

    fn int_gauge(&self, name: &str) -> IntGaugeVec {
        match self.get(name) {
            Series::IntGauge(c) => c.clone(),
            _ => panic!("{name} is not an integer gauge in FAMILIES"),
        }
    }

    fn counter(&self, name: &str) -> IntCounterVec {
        match self.get(name) {
            Series::Counter(c) => c.clone(),
            _ => panic!("{name} is not a counter in FAMILIES"),
        }
    }

    fn histogram(&self, name: &str) -> HistogramVec {
        match self.get(name) {
            Series::Histogram(c) => c.clone(),
            _ => panic!("{name} is not a histogram in FAMILIES"),
        }
    }
}

impl EngineMetrics {
    /// Registers every family and resolves the children of every rank, so all series
    /// exist (at zero) from start-up.
    pub fn new(cfg: &MetricsConfig) -> Self {
        let registry = Registry::new();
        let f = Registered::new(&registry, &cfg.buckets);
        let running = f.int_gauge("num_requests_running");
        let waiting = f.int_gauge("num_requests_waiting");
        let waiting_by_reason = f.int_gauge("num_requests_waiting_by_reason");
        let kv_usage = f.gauge("kv_cache_usage_ratio");
        let kv_tokens = f.int_gauge("kv_cache_tokens");
        let utilization = f.gauge("utilization");
        let gen_throughput = f.gauge("gen_throughput_tokens_per_second");
        let info = f.int_gauge("cache_config_info");
        let prompt_tokens = f.counter("prompt_tokens_total");
        let prompt_by_source = f.counter("prompt_tokens_by_source_total");
        let generation_tokens = f.counter("generation_tokens_total");
        let preemptions = f.counter("num_preemptions_total");
        let success = f.counter("request_success_total");
        let prefix_queries = f.counter("prefix_cache_queries_total");
        let prefix_hits = f.counter("prefix_cache_hits_total");
        let prefix_preempted_queries = f.counter("prefix_cache_preempted_queries_total");
        let prefix_preempted_hits = f.counter("prefix_cache_preempted_hits_total");
        let retracted_requests = f.counter("retracted_requests_total");
        let retracted_input = f.counter("retracted_input_tokens_total");
        let retracted_output = f.counter("retracted_output_tokens_total");
        let flops = f.counter("estimated_flops_per_gpu_total");
        let read_bytes = f.counter("estimated_read_bytes_per_gpu_total");
        let write_bytes = f.counter("estimated_write_bytes_per_gpu_total");
        let ttft = f.histogram("time_to_first_token_seconds");
        let itl = f.histogram("inter_token_latency_seconds");
        let tpot = f.histogram("request_time_per_output_token_seconds");
        let e2e = f.histogram("e2e_request_latency_seconds");
        let queue = f.histogram("request_queue_time_seconds");
        let total_queue = f.histogram("request_total_queue_time_seconds");
        let prefill = f.histogram("request_prefill_time_seconds");
        let decode = f.histogram("request_decode_time_seconds");
        let inference = f.histogram("request_inference_time_seconds");
        let prompt_hist = f.histogram("request_prompt_tokens");
        let gen_hist = f.histogram("request_generation_tokens");
        let iteration = f.histogram("iteration_tokens");
        let lifetime = f.histogram("kv_block_lifetime_seconds");
        let idle = f.histogram("kv_block_idle_before_evict_seconds");
        let reuse = f.histogram("kv_block_reuse_gap_seconds");
        let dp_tokens = f.counter("dp_tokens_total");
        let dp_pairs = f.counter("dp_attention_pairs_total");
        let dp_steps = f.counter("dp_steps_total");
        let dp_sync = f.histogram("dp_sync_wait_seconds");
        let dp_ratio = f.histogram("dp_token_imbalance_ratio");
        let rejections = f.counter("admission_rejections_total");
        let http_requests = f.counter("http_requests_total");
        let http_duration = f.histogram("http_request_duration_seconds");
        let control_refused = f.counter("control_requests_refused_total");

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
