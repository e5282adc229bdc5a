//! Every family of `GET /metrics`, as data: the registry is built from [`FAMILIES`], and
//! the metrics contract test compares a live engine's exposition with the same table.

use crate::config::buckets::Family;

/// The prefix of every family's name.
pub const PREFIX: &str = "ballast_";

/// What a family's series are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A float gauge.
    Gauge,
    /// An integer gauge.
    IntGauge,
    /// An integer counter (its name ends in `_total`).
    Counter,
    /// A histogram with the buckets of a bucket family (`--custom-histogram-buckets`).
    Histogram(Family),
}

impl Kind {
    /// The type a `# TYPE` line gives it.
    pub fn exposition_type(self) -> &'static str {
        match self {
            Kind::Gauge | Kind::IntGauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram(_) => "histogram",
        }
    }
}

/// One family: its name without [`PREFIX`], HELP text, kind and labels, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyDef {
    /// The name after [`PREFIX`].
    pub name: &'static str,
    /// The `# HELP` text.
    pub help: &'static str,
    /// Gauge, counter or histogram (with its buckets).
    pub kind: Kind,
    /// Every label, in order.
    pub labels: &'static [&'static str],
}

impl FamilyDef {
    /// The name on the wire, with [`PREFIX`].
    pub fn full_name(&self) -> String {
        format!("{PREFIX}{}", self.name)
    }
}

/// The labels of a per-engine family: the served model and the DP rank.
const ENGINE: &[&str] = &["model_name", "engine"];

/// Every family, grouped as the metrics contract groups them: snapshot gauges, counters,
/// histograms, the data-parallel family, then the front door's own series.
pub const FAMILIES: &[FamilyDef] = &[
    FamilyDef {
        name: "num_requests_running",
        help: "Requests in the running batch (snapshot at the end of the step).",
        kind: Kind::IntGauge,
        labels: ENGINE,
    },
    FamilyDef {
        name: "num_requests_waiting",
        help: "Requests waiting to run: capacity + deferred.",
        kind: Kind::IntGauge,
        labels: ENGINE,
    },
    FamilyDef {
        name: "num_requests_waiting_by_reason",
        help: "Waiting requests by reason: capacity (batch slots or KV blocks) or deferred (runnable capacity may exist but the tenant is at its running cap).",
        kind: Kind::IntGauge,
        labels: &["model_name", "engine", "reason"],
    },
    FamilyDef {
        name: "kv_cache_usage_ratio",
        help: "KV blocks referenced by live requests / total blocks (evictable cached blocks count as free). Take max over engines, never the mean.",
        kind: Kind::Gauge,
        labels: ENGINE,
    },
    FamilyDef {
        name: "kv_cache_tokens",
        help: "KV cache capacity in tokens by state: available (empty), evictable (cached prefix, unreferenced), used (referenced). The states sum to capacity.",
        kind: Kind::IntGauge,
        labels: &["model_name", "engine", "state"],
    },
    FamilyDef {
        name: "utilization",
        help: "max(running / max_num_seqs, kv_cache_usage_ratio / 0.9).",
        kind: Kind::Gauge,
        labels: ENGINE,
    },
    FamilyDef {
        name: "gen_throughput_tokens_per_second",
        help: "Generated tokens per second over the log window; 0 after 30 s without decode.",
        kind: Kind::Gauge,
        labels: ENGINE,
    },
    FamilyDef {
        name: "cache_config_info",
        help: "KV cache and batching configuration (value is always 1).",
        kind: Kind::IntGauge,
        labels: &[
            "model_name",
            "engine",
            "block_size",
            "num_blocks",
            "enable_prefix_caching",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "cache_dtype",
        ],
    },
    FamilyDef {
        name: "prompt_tokens_total",
        help: "Prompt tokens of requests whose prefill completed.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "prompt_tokens_by_source_total",
        help: "Prompt tokens by where their KV came from: local_compute, local_cache_hit, external_kv_transfer. Sums to prompt_tokens_total.",
        kind: Kind::Counter,
        labels: &["model_name", "engine", "source"],
    },
    FamilyDef {
        name: "generation_tokens_total",
        help: "Generated tokens.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "num_preemptions_total",
        help: "Requests preempted (KV freed, recomputed later).",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_success_total",
        help: "Finished requests by finish reason.",
        kind: Kind::Counter,
        labels: &["model_name", "engine", "finished_reason"],
    },
    FamilyDef {
        name: "prefix_cache_queries_total",
        help: "Tokens looked up in the prefix cache by new requests.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "prefix_cache_hits_total",
        help: "Tokens found in the prefix cache by new requests.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "prefix_cache_preempted_queries_total",
        help: "Tokens looked up in the prefix cache by requests resuming after preemption.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "prefix_cache_preempted_hits_total",
        help: "Tokens found in the prefix cache by requests resuming after preemption.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "retracted_requests_total",
        help: "Requests whose computed KV was thrown away by preemption.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "retracted_input_tokens_total",
        help: "Computed prompt tokens thrown away by preemption.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "retracted_output_tokens_total",
        help: "Computed output tokens thrown away by preemption.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "estimated_flops_per_gpu_total",
        help: "Floating-point operations by the analytic per-step model (per rank).",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "estimated_read_bytes_per_gpu_total",
        help: "Bytes read (weights, KV context) by the analytic per-step model.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "estimated_write_bytes_per_gpu_total",
        help: "Bytes written (new KV) by the analytic per-step model.",
        kind: Kind::Counter,
        labels: ENGINE,
    },
    FamilyDef {
        name: "time_to_first_token_seconds",
        help: "Arrival to first token, frontend clock.",
        kind: Kind::Histogram(Family::TimeToFirstToken),
        labels: ENGINE,
    },
    FamilyDef {
        name: "inter_token_latency_seconds",
        help: "Time between successive tokens of a request, engine clock.",
        kind: Kind::Histogram(Family::InterTokenLatency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_time_per_output_token_seconds",
        help: "Decode time / (generated tokens - 1) per finished request with at least 2 tokens.",
        kind: Kind::Histogram(Family::InterTokenLatency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "e2e_request_latency_seconds",
        help: "Arrival to finish, frontend clock.",
        kind: Kind::Histogram(Family::RequestLatency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_queue_time_seconds",
        help: "First queued to first scheduled.",
        kind: Kind::Histogram(Family::RequestLatency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_total_queue_time_seconds",
        help: "Time waiting across every (re-)queue, including after preemptions.",
        kind: Kind::Histogram(Family::RequestLatency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_prefill_time_seconds",
        help: "First scheduled to first token.",
        kind: Kind::Histogram(Family::RequestLatency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_decode_time_seconds",
        help: "First token to last token.",
        kind: Kind::Histogram(Family::RequestLatency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_inference_time_seconds",
        help: "First scheduled to last token (prefill + decode).",
        kind: Kind::Histogram(Family::RequestLatency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_prompt_tokens",
        help: "Prompt tokens per finished request.",
        kind: Kind::Histogram(Family::RequestTokens),
        labels: ENGINE,
    },
    FamilyDef {
        name: "request_generation_tokens",
        help: "Generated tokens per finished request.",
        kind: Kind::Histogram(Family::RequestTokens),
        labels: ENGINE,
    },
    FamilyDef {
        name: "iteration_tokens",
        help: "Tokens computed per step.",
        kind: Kind::Histogram(Family::IterationTokens),
        labels: ENGINE,
    },
    FamilyDef {
        name: "kv_block_lifetime_seconds",
        help: "Sampled KV blocks: allocation to eviction (with --kv-cache-metrics).",
        kind: Kind::Histogram(Family::KvCacheResidency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "kv_block_idle_before_evict_seconds",
        help: "Sampled KV blocks: last use to eviction (with --kv-cache-metrics).",
        kind: Kind::Histogram(Family::KvCacheResidency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "kv_block_reuse_gap_seconds",
        help: "Sampled KV blocks: time between successive uses (with --kv-cache-metrics).",
        kind: Kind::Histogram(Family::KvCacheResidency),
        labels: ENGINE,
    },
    FamilyDef {
        name: "dp_tokens_total",
        help: "Data-parallel tokens per rank: scheduled, and imbalance (max over ranks - this rank).",
        kind: Kind::Counter,
        labels: &["model_name", "engine", "kind"],
    },
    FamilyDef {
        name: "dp_attention_pairs_total",
        help: "Data-parallel causal attention pairs per rank: scheduled, and imbalance (max - this rank).",
        kind: Kind::Counter,
        labels: &["model_name", "engine", "kind"],
    },
    FamilyDef {
        name: "dp_steps_total",
        help: "Lockstep steps by this rank's state: active (computed tokens) or idle.",
        kind: Kind::Counter,
        labels: &["model_name", "engine", "rank_state"],
    },
    FamilyDef {
        name: "dp_sync_wait_seconds",
        help: "Time this rank waited at the step barrier.",
        kind: Kind::Histogram(Family::DpSyncWait),
        labels: ENGINE,
    },
    FamilyDef {
        name: "dp_token_imbalance_ratio",
        help: "max_tokens * num_ranks / sum_tokens per step (1 = balanced); observed by rank 0 only.",
        kind: Kind::Histogram(Family::DpImbalanceRatio),
        labels: ENGINE,
    },
    FamilyDef {
        name: "admission_rejections_total",
        help: "Requests turned away at the front door with HTTP 429, by reason (attributed to engine 0: no rank was chosen).",
        kind: Kind::Counter,
        labels: &["model_name", "engine", "reason"],
    },
    FamilyDef {
        name: "http_requests_total",
        help: "HTTP requests by route template, method and status (health and metrics excluded).",
        kind: Kind::Counter,
        labels: &["model_name", "endpoint", "method", "status"],
    },
    FamilyDef {
        name: "http_request_duration_seconds",
        help: "HTTP request duration until the response body ended.",
        kind: Kind::Histogram(Family::HttpRequestDuration),
        labels: &["model_name", "endpoint", "method"],
    },
    FamilyDef {
        name: "control_requests_refused_total",
        help: "Control-API (gRPC) calls refused as UNAUTHENTICATED, by reason: missing, malformed or wrong token.",
        kind: Kind::Counter,
        labels: &["model_name", "reason"],
    },
];
