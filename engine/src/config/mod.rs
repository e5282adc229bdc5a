//! `ballast engine` flags and the validated configuration built from them.

pub mod buckets;
pub mod runtime;
pub mod tls;

use runtime::{AdmissionLimits, DispatchPolicy, SchedulerConfig};

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;

use crate::compute::backend::KvDtype;
use crate::compute::device::Device;
use crate::compute::model::{ModelError, ModelSource, ModelSpec, ResolvedModel};
use crate::config::buckets::Buckets;

/// Flags of `ballast engine`. Names follow vLLM where a vLLM user would look for them; every
/// flag also reads the `BALLAST_*` environment variable shown in `--help`.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Model to serve: `synthetic:tiny`, `synthetic:small` (CPU), `synthetic:llama-3-8b`
    /// (reserved for the CUDA backend), `smollm2-135m` (the default real model, from the model
    /// cache), a path to a Llama GGUF file, or a Hugging Face Llama directory.
    #[arg(
        long,
        env = "BALLAST_MODEL",
        value_name = "M",
        default_value = "synthetic:tiny"
    )]
    pub model: String,

    /// Name clients send as `model`, and the `model_name` metric label [default: --model].
    #[arg(long, env = "BALLAST_SERVED_MODEL_NAME", value_name = "NAME")]
    pub served_model_name: Option<String>,

    /// Address to listen on for HTTP (OpenAI API, /health, /metrics).
    #[arg(
        long,
        env = "BALLAST_HOST",
        value_name = "ADDR",
        default_value = "127.0.0.1"
    )]
    pub host: IpAddr,

    /// HTTP port; 0 picks a free port (the chosen one is printed on stdout).
    #[arg(
        long,
        env = "BALLAST_PORT",
        value_name = "PORT",
        default_value_t = 8000
    )]
    pub port: u16,

    /// Port of the gRPC control API (stats, DP weights, drain/resume, prefix-cache reset);
    /// 0 disables it.
    #[arg(
        long,
        env = "BALLAST_GRPC_PORT",
        value_name = "PORT",
        default_value_t = 0
    )]
    pub grpc_port: u16,

    /// File of control tokens, one a line: every control-API call must then carry
    /// `authorization: Bearer TOKEN` with one of them (the operator mounts one per
    /// InferenceService). Re-read every 2 s when its content changes, so a token rotates
    /// without a restart; a missing, empty or unreadable file at start is an error.
    /// Without it the control API answers anyone who reaches --grpc-port.
    #[arg(long, env = "BALLAST_CONTROL_TOKEN_FILE", value_name = "PATH")]
    pub control_token_file: Option<PathBuf>,

    /// PEM certificate chain (leaf first) for the control API: with --control-tls-key the
    /// control API speaks gRPC over TLS only, so its token never crosses the network in
    /// clear text. Both files are re-read every 2 s and a changed pair serves the next
    /// connections, so a renewed certificate needs no restart; a missing or bad file at
    /// start is an error, and one that breaks later keeps the last good pair.
    #[arg(
        long,
        env = "BALLAST_CONTROL_TLS_CERT",
        value_name = "PATH",
        requires = "control_tls_key"
    )]
    pub control_tls_cert: Option<PathBuf>,

    /// The PEM private key of --control-tls-cert.
    #[arg(
        long,
        env = "BALLAST_CONTROL_TLS_KEY",
        value_name = "PATH",
        requires = "control_tls_cert"
    )]
    pub control_tls_key: Option<PathBuf>,

    /// Data-parallel ranks in this process, each with its own scheduler and KV pool,
    /// stepping in lockstep. Metric label `engine` is the rank.
    #[arg(
        long,
        env = "BALLAST_DATA_PARALLEL_SIZE",
        value_name = "N",
        default_value_t = 1
    )]
    pub data_parallel_size: usize,

    /// How requests are assigned to data-parallel ranks.
    #[arg(
        long,
        env = "BALLAST_DISPATCH_POLICY",
        value_name = "POLICY",
        value_enum,
        default_value = "least-tokens"
    )]
    pub dispatch_policy: DispatchPolicy,

    /// Most requests in a rank's running batch.
    #[arg(
        long,
        env = "BALLAST_MAX_NUM_SEQS",
        value_name = "N",
        default_value_t = 256
    )]
    pub max_num_seqs: usize,

    /// Most tokens a rank computes per step (decode tokens plus prefill chunks).
    #[arg(
        long,
        env = "BALLAST_MAX_NUM_BATCHED_TOKENS",
        value_name = "N",
        default_value_t = 2048
    )]
    pub max_num_batched_tokens: usize,

    /// Longest prompt + output accepted [default: the model's context length].
    #[arg(long, env = "BALLAST_MAX_MODEL_LEN", value_name = "N")]
    pub max_model_len: Option<usize>,

    /// Requests allowed to wait before new ones get HTTP 429 (reason max_num_queued_reqs),
    /// or `unlimited`. The default is four full batches of the default --max-num-seqs:
    /// further back in the queue a request would wait minutes for its first token, and a
    /// 429 lets the client or router try another replica at once.
    #[arg(
        long,
        env = "BALLAST_MAX_QUEUED_REQUESTS",
        value_name = "N",
        default_value = "1024",
        value_parser = queue_limit
    )]
    pub max_queued_requests: QueueLimit,

    /// Prompt tokens allowed to wait before new requests get HTTP 429 (reason
    /// max_num_queued_tokens).
    #[arg(long, env = "BALLAST_MAX_QUEUED_TOKENS", value_name = "N")]
    pub max_queued_tokens: Option<usize>,

    /// Running requests per tenant (OpenAI `user` field, or header `x-tenant`); more wait
    /// as *deferred*.
    #[arg(long, env = "BALLAST_MAX_RUNNING_PER_TENANT", value_name = "N")]
    pub max_running_per_tenant: Option<u32>,

    /// KV blocks per rank [default: what 256 MiB of f32 K/V holds, at least one full
    /// context].
    #[arg(long, env = "BALLAST_NUM_KV_BLOCKS", value_name = "N")]
    pub num_kv_blocks: Option<usize>,

    /// Tokens per KV block.
    #[arg(
        long,
        env = "BALLAST_BLOCK_SIZE",
        value_name = "N",
        default_value_t = 16
    )]
    pub block_size: usize,

    /// Share KV blocks between requests with equal prefixes.
    #[arg(
        long,
        env = "BALLAST_ENABLE_PREFIX_CACHING",
        default_value_t = true,
        overrides_with = "no_enable_prefix_caching"
    )]
    pub enable_prefix_caching: bool,

    /// Turn prefix caching off.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    pub no_enable_prefix_caching: bool,

    /// Seed of the synthetic weights and of requests that do not set their own.
    #[arg(long, env = "BALLAST_SEED", value_name = "N", default_value_t = 0)]
    pub seed: u64,

    /// Threads for CPU kernels [default: one per core].
    #[arg(long, env = "BALLAST_CPU_THREADS", value_name = "N")]
    pub cpu_threads: Option<usize>,

    /// Device that runs the model: `cpu`, or `cuda` (GPU 0; refused with the reason on a
    /// machine without an NVIDIA GPU, its driver, NVRTC or cuBLAS).
    #[arg(long, env = "BALLAST_DEVICE", value_enum, default_value_t = Device::Cpu)]
    pub device: Device,

    /// Element type of the KV cache: `auto` (f16 for GGUF files on the CPU, as llama.cpp
    /// does; f32 otherwise), `f32`, or `f16` (half the memory per token and half the bytes
    /// attention reads; the CPU backend only for now).
    #[arg(
        long,
        env = "BALLAST_KV_CACHE_DTYPE",
        value_enum,
        default_value_t = KvCacheDtype::Auto
    )]
    pub kv_cache_dtype: KvCacheDtype,

    /// With `--device cuda`: replay decode steps from CUDA graphs captured at batch sizes
    /// 1, 2, 4, … 128 (one launch per step). Off until measured on a GPU.
    #[arg(long, env = "BALLAST_CUDA_GRAPHS", value_parser = BoolishValueParser::new())]
    pub cuda_graphs: bool,

    /// Seconds between the per-engine stats log lines (and generation-throughput window).
    #[arg(
        long,
        env = "BALLAST_LOG_STATS_INTERVAL",
        value_name = "SECS",
        default_value_t = 5.0
    )]
    pub log_stats_interval: f64,

    /// Turn off the stats log line and per-request statistics (latency and token
    /// histograms); gauges and counters on /metrics stay.
    #[arg(long, env = "BALLAST_DISABLE_LOG_STATS", value_parser = BoolishValueParser::new())]
    pub disable_log_stats: bool,

    /// Log one line summed over all data-parallel engines (KV usage as the max) instead of
    /// one line per engine.
    #[arg(long, env = "BALLAST_AGGREGATE_ENGINE_LOGGING", value_parser = BoolishValueParser::new())]
    pub aggregate_engine_logging: bool,

    /// Replace histogram bucket families, e.g. '{"time_to_first_token": [0.05, 0.1, 0.5]}'.
    /// Families: request_latency, time_to_first_token, inter_token_latency, iteration_tokens,
    /// request_tokens, kv_cache_residency, dp_sync_wait, dp_imbalance_ratio,
    /// http_request_duration.
    #[arg(long, env = "BALLAST_CUSTOM_HISTOGRAM_BUCKETS", value_name = "JSON")]
    pub custom_histogram_buckets: Option<String>,

    /// Export KV residency histograms (block lifetime, idle before eviction, reuse gap) for
    /// a sample of blocks.
    #[arg(long, env = "BALLAST_KV_CACHE_METRICS", value_parser = BoolishValueParser::new())]
    pub kv_cache_metrics: bool,

    /// Fraction of block allocations (0..1) that --kv-cache-metrics follows.
    #[arg(
        long,
        env = "BALLAST_KV_CACHE_METRICS_SAMPLE",
        value_name = "F",
        default_value_t = 0.01
    )]
    pub kv_cache_metrics_sample: f64,

    /// Export one trace per request (root span plus queue, prefill and decode spans) over
    /// OTLP/gRPC to this collector, e.g. http://127.0.0.1:4317. An incoming W3C
    /// `traceparent` is continued and the request's own is returned in the response.
    #[arg(long, env = "BALLAST_OTLP_TRACES_ENDPOINT", value_name = "URL")]
    pub otlp_traces_endpoint: Option<String>,

    /// On SIGTERM, seconds to keep admitting new requests before draining: every response
    /// says `Connection: close` and `/health` answers 503, so load balancers and pooled
    /// client connections move to other replicas first. 0 (a bare process: nothing routes
    /// to it after the signal) drains at once; behind a Kubernetes Service use a few
    /// seconds, longer than the endpoint update takes to reach every node.
    #[arg(
        long,
        env = "BALLAST_SHUTDOWN_DELAY",
        value_name = "SECS",
        default_value_t = 0.0
    )]
    pub shutdown_delay: f64,

    /// On SIGTERM, after --shutdown-delay, seconds to wait for in-flight requests before
    /// aborting them.
    #[arg(
        long,
        env = "BALLAST_DRAIN_TIMEOUT",
        value_name = "SECS",
        default_value_t = 600.0
    )]
    pub drain_timeout: f64,

    /// File of API keys, one a line (several, so a key can be rotated): `/v1/*` then
    /// requires `Authorization: Bearer KEY`. Re-read every 2 s when its content changes
    /// (a mounted Kubernetes Secret); a missing or empty file at start is an error.
    #[arg(
        long,
        env = "BALLAST_API_KEY_FILE",
        value_name = "PATH",
        conflicts_with = "api_key"
    )]
    pub api_key_file: Option<PathBuf>,

    /// One API key, as vLLM's --api-key. Prefer the environment variable or
    /// --api-key-file: a flag's value is visible to every user of the machine (`ps`).
    #[arg(
        long,
        env = "BALLAST_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub api_key: Option<SecretArg>,

    /// Require the API key on `/metrics` too (open by default, so a scraper needs no key;
    /// `/health` is always open). Needs --api-key or --api-key-file.
    #[arg(long, env = "BALLAST_METRICS_REQUIRE_KEY", value_parser = BoolishValueParser::new())]
    pub metrics_require_key: bool,

    /// Most open HTTP connections. At the limit the connection that has waited longest
    /// for a request (idle, or still sending its head) is closed to make room, so slow
    /// clients cannot lock others out; lowered at start to what the open-files limit allows.
    #[arg(
        long,
        env = "BALLAST_MAX_CONNECTIONS",
        value_name = "N",
        default_value_t = 4096
    )]
    pub max_connections: usize,

    /// Seconds a client has to send a whole request head: from the connection's start, or
    /// from the first byte after an idle wait. Bounds slow-loris clients.
    #[arg(
        long,
        env = "BALLAST_HTTP_HEADER_TIMEOUT",
        value_name = "SECS",
        default_value_t = 10.0
    )]
    pub http_header_timeout: f64,

    /// Seconds a client has to send a whole request body, from the end of its head
    /// (HTTP 408 after that).
    #[arg(
        long,
        env = "BALLAST_HTTP_BODY_TIMEOUT",
        value_name = "SECS",
        default_value_t = 60.0
    )]
    pub http_body_timeout: f64,

    /// Seconds a kept-alive connection may sit idle between requests before it is closed;
    /// longer than the 90 s idle pools of common HTTP clients, so they close first.
    #[arg(
        long,
        env = "BALLAST_HTTP_IDLE_TIMEOUT",
        value_name = "SECS",
        default_value_t = 120.0
    )]
    pub http_idle_timeout: f64,
}

/// `--max-queued-requests`: a number of requests, or no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueLimit {
    /// At most this many (at least 1).
    At(usize),
    /// `unlimited`.
    Unlimited,
}

impl QueueLimit {
    /// The limit, `None` when unlimited.
    pub fn get(self) -> Option<usize> {
        match self {
            QueueLimit::At(n) => Some(n),
            QueueLimit::Unlimited => None,
        }
    }
}

fn queue_limit(s: &str) -> Result<QueueLimit, String> {
    if s.eq_ignore_ascii_case("unlimited") {
        return Ok(QueueLimit::Unlimited);
    }
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1 (or `unlimited`)".into()),
        Ok(n) => Ok(QueueLimit::At(n)),
        Err(_) => Err("expected a number of requests or `unlimited`".into()),
    }
}

/// A secret given on the command line or in the environment: its `Debug` never shows it,
/// so printing the flags (`{:?}`) cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretArg(String);

impl SecretArg {
    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretArg(<redacted>)")
    }
}

impl std::str::FromStr for SecretArg {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(SecretArg(s.to_string()))
    }
}

impl Default for EngineArgs {
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: EngineArgs,
        }
        <Wrapper as clap::Parser>::parse_from(["engine"]).args
    }
}

/// `--kv-cache-dtype` as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KvCacheDtype {
    /// f16 for GGUF files on the CPU (their weights are quantized already; llama.cpp's
    /// default), f32 otherwise.
    #[default]
    Auto,
    /// f32.
    F32,
    /// f16.
    F16,
}

/// A flag whose value cannot work; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {message}")]
pub struct ConfigError {
    /// Flag name without dashes.
    pub flag: &'static str,
    /// What is wrong and what would work.
    pub message: String,
}

fn bad(flag: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        flag,
        message: message.into(),
    }
}

impl From<ModelError> for ConfigError {
    fn from(e: ModelError) -> Self {
        bad("model", e.to_string())
    }
}

/// A non-negative number of seconds as a duration; NaN, negatives and values too large for
/// a duration are refused (never a panic).
fn seconds(flag: &'static str, secs: f64) -> Result<std::time::Duration, ConfigError> {
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(bad(flag, "must be a non-negative number of seconds"));
    }
    std::time::Duration::try_from_secs_f64(secs)
        .map_err(|_| bad(flag, format!("{secs} seconds is too long")))
}

/// A positive, finite number of seconds as a duration (a timeout: zero would refuse every
/// client, so it is refused too).
fn timeout(flag: &'static str, secs: f64) -> Result<Duration, ConfigError> {
    if !(secs.is_finite() && secs > 0.0) {
        return Err(bad(flag, "must be a positive number of seconds"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| bad(flag, format!("{secs} seconds is too long")))
}

/// One API key: printable ASCII without spaces (it travels in an HTTP header). Its `Debug`
/// never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Box<[u8]>);

impl ApiKey {
    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Longest accepted key, far above any generated key and far below the header limit.
pub const MAX_API_KEY_BYTES: usize = 4096;

/// Largest key file read: a file beyond it is not a key file.
pub const MAX_API_KEY_FILE_BYTES: u64 = 1 << 20;

/// Why a key or a key file cannot be used. The messages never show a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// No key at all.
    #[error("holds no key (one key a line)")]
    Empty,
    /// A key with a byte that cannot be sent as a bearer token.
    #[error(
        "line {line}: a key must be printable ASCII without spaces (it is sent in an HTTP header)"
    )]
    BadByte {
        /// 1-based line.
        line: usize,
    },
    /// A key longer than [`MAX_API_KEY_BYTES`].
    #[error("line {line}: a key must have at most {MAX_API_KEY_BYTES} bytes")]
    TooLong {
        /// 1-based line.
        line: usize,
    },
    /// The file is larger than [`MAX_API_KEY_FILE_BYTES`].
    #[error("is larger than {MAX_API_KEY_FILE_BYTES} bytes: not a key file")]
    TooLarge,
    /// The file cannot be read.
    #[error("cannot be read: {0}")]
    Unreadable(String),
}

/// Parses key-file text: one key a line; surrounding whitespace (and a CR before the LF)
/// is trimmed and blank lines are skipped.
pub fn parse_api_keys(text: &[u8]) -> Result<Vec<ApiKey>, KeyError> {
    let mut keys = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let key = line.trim_ascii();
        if key.is_empty() {
            continue;
        }
        if !key.iter().all(|b| b.is_ascii_graphic()) {
            return Err(KeyError::BadByte { line: i + 1 });
        }
        if key.len() > MAX_API_KEY_BYTES {
            return Err(KeyError::TooLong { line: i + 1 });
        }
        keys.push(ApiKey(key.into()));
    }
    if keys.is_empty() {
        return Err(KeyError::Empty);
    }
    Ok(keys)
}

/// Reads and parses a key file (at most [`MAX_API_KEY_FILE_BYTES`]); also returns the raw
/// bytes, so a poller can tell when they change.
pub fn read_api_key_file(path: &std::path::Path) -> Result<(Vec<u8>, Vec<ApiKey>), KeyError> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_API_KEY_FILE_BYTES + 1).read_to_end(&mut text))
        .map_err(|e| KeyError::Unreadable(e.to_string()))?;
    if text.len() as u64 > MAX_API_KEY_FILE_BYTES {
        return Err(KeyError::TooLarge);
    }
    let keys = parse_api_keys(&text)?;
    Ok((text, keys))
}

/// Where the API keys come from. Its `Debug` shows how many keys, never their text.
#[derive(Clone, PartialEq, Eq)]
pub enum ApiKeys {
    /// No key: the API is open to whoever reaches the port.
    None,
    /// `--api-key` / `BALLAST_API_KEY`: one key for the life of the process.
    Fixed(Vec<ApiKey>),
    /// `--api-key-file`: the keys read at start; the server re-reads the file.
    File {
        /// The file.
        path: PathBuf,
        /// Its content at start.
        text: Vec<u8>,
        /// Its keys at start.
        keys: Vec<ApiKey>,
    },
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiKeys::None => f.write_str("None"),
            ApiKeys::Fixed(keys) => write!(f, "Fixed({} key, redacted)", keys.len()),
            ApiKeys::File { path, keys, .. } => f
                .debug_struct("File")
                .field("path", path)
                .field("keys", &format_args!("{} keys, redacted", keys.len()))
                .finish(),
        }
    }
}

impl ApiKeys {
    /// Whether any key is required.
    pub fn required(&self) -> bool {
        !matches!(self, ApiKeys::None)
    }
}

/// Limits of the HTTP server (docs/security.md says why each default): the accept loop's
/// own, which every Ballast server shares.
pub use ballast_serve::HttpLimits;

/// Default KV memory per rank when `--num-kv-blocks` is not given.
const DEFAULT_KV_BYTES: usize = 256 << 20;

/// A validated engine configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Model shapes (with `max_model_len` already applied).
    pub model: ModelSpec,
    /// Where the weights come from.
    pub source: ModelSource,
    /// The device the model runs on (`--device`): checked for its libraries while
    /// validating, opened only where the engine starts ([`crate::compute::device::ComputeBackend::open`]).
    pub device: Device,
    /// Replay CUDA decode steps from graphs (`--cuda-graphs`).
    pub cuda_graphs: bool,
    /// `model` field clients must send, and the `model_name` label.
    pub served_model_name: String,
    /// HTTP address.
    pub host: IpAddr,
    /// HTTP port (0: any).
    pub port: u16,
    /// Control API port (0: disabled).
    pub grpc_port: u16,
    /// `--control-token-file`: the tokens the control API requires (`None`: it is open).
    pub control_tokens: ApiKeys,
    /// `--control-tls-cert` and `--control-tls-key`: the control API's TLS pair, checked
    /// at start (`None`: plain HTTP/2).
    pub control_tls: Option<tls::TlsFiles>,
    /// DP ranks.
    pub data_parallel_size: usize,
    /// Rank assignment.
    pub dispatch_policy: DispatchPolicy,
    /// Per-rank scheduler limits.
    pub scheduler: SchedulerConfig,
    /// Front-door limits.
    pub admission: AdmissionLimits,
    /// Per-tenant running cap.
    pub max_running_per_tenant: Option<u32>,
    /// Weights and default sampling seed.
    pub seed: u64,
    /// CPU kernel threads.
    pub cpu_threads: Option<usize>,
    /// How long after SIGTERM new requests are still admitted (with `Connection: close`)
    /// before the drain starts.
    pub shutdown_delay: std::time::Duration,
    /// Drain limit on SIGTERM (after the shutdown delay).
    pub drain_timeout: std::time::Duration,
    /// Statistics and logging.
    pub stats: StatsConfig,
    /// The keys `/v1/*` requires.
    pub api_keys: ApiKeys,
    /// Whether `/metrics` requires a key too.
    pub metrics_require_key: bool,
    /// Limits of the HTTP server.
    pub http: HttpLimits,
}

/// How the engine computes and publishes statistics.
#[derive(Debug, Clone)]
pub struct StatsConfig {
    /// Log line interval; also the generation-throughput window.
    pub log_interval: std::time::Duration,
    /// No log line, no per-request statistics.
    pub disable_log_stats: bool,
    /// One log line for all engines.
    pub aggregate_engine_logging: bool,
    /// Histogram buckets.
    pub buckets: Buckets,
    /// Sampling rate of KV residency tracking, when on.
    pub kv_residency_sample: Option<f64>,
    /// OTLP/gRPC collector for request traces.
    pub otlp_traces_endpoint: Option<String>,
}

impl EngineConfig {
    /// Validates flags into a configuration.
    pub fn from_args(a: &EngineArgs) -> Result<Self, ConfigError> {
        let ResolvedModel {
            spec: mut model,
            source,
        } = ResolvedModel::resolve_on(&a.model, a.device == Device::Cuda)?;
        if a.data_parallel_size == 0 || a.data_parallel_size > 64 {
            return Err(bad("data-parallel-size", "must be between 1 and 64"));
        }
        if a.max_num_seqs == 0 {
            return Err(bad("max-num-seqs", "must be at least 1"));
        }
        if a.max_num_batched_tokens == 0 {
            return Err(bad("max-num-batched-tokens", "must be at least 1"));
        }
        if a.block_size == 0 || a.block_size > 1024 {
            return Err(bad("block-size", "must be between 1 and 1024"));
        }
        if let Some(len) = a.max_model_len {
            if len < 2 || len > model.max_model_len {
                return Err(bad(
                    "max-model-len",
                    format!(
                        "must be between 2 and {} (the model's context length)",
                        model.max_model_len
                    ),
                ));
            }
            model.max_model_len = len;
        }
        if a.max_queued_requests == QueueLimit::At(0) {
            return Err(bad(
                "max-queued-requests",
                "must be at least 1 (or `unlimited`)",
            ));
        }
        if a.max_queued_tokens == Some(0) {
            return Err(bad(
                "max-queued-tokens",
                "must be at least 1 (omit it for no limit)",
            ));
        }
        if a.max_running_per_tenant == Some(0) {
            return Err(bad(
                "max-running-per-tenant",
                "must be at least 1 (omit it for no cap)",
            ));
        }
        if a.cpu_threads == Some(0) {
            return Err(bad("cpu-threads", "must be at least 1"));
        }
        if a.cuda_graphs && a.device != Device::Cuda {
            return Err(bad(
                "cuda-graphs",
                "replays CUDA graphs; it needs --device cuda",
            ));
        }
        model.kv_dtype = match (a.kv_cache_dtype, a.device) {
            (KvCacheDtype::F16, Device::Cuda) => {
                return Err(bad(
                    "kv-cache-dtype",
                    "f16 is not supported with --device cuda yet (its cache is f32); use f32 or auto",
                ));
            }
            (KvCacheDtype::F16, Device::Cpu) => KvDtype::F16,
            (KvCacheDtype::F32, _) => KvDtype::F32,
            (KvCacheDtype::Auto, Device::Cpu) if matches!(source, ModelSource::Gguf { .. }) => {
                KvDtype::F16
            }
            (KvCacheDtype::Auto, _) => KvDtype::F32,
        };
        crate::compute::device::check(a.device).map_err(|m| bad("device", m))?;
        let drain_timeout = seconds("drain-timeout", a.drain_timeout)?;
        let shutdown_delay = seconds("shutdown-delay", a.shutdown_delay)?;
        let per_token = 2 * model.num_layers * model.kv_size() * model.kv_dtype.size();
        let min_blocks = model.max_model_len.div_ceil(a.block_size);
        let num_blocks = match a.num_kv_blocks {
            Some(n) if n < min_blocks => {
                return Err(bad(
                    "num-kv-blocks",
                    format!(
                        "{n} blocks of {} tokens cannot hold one {}-token sequence; use at least {min_blocks} or lower --max-model-len",
                        a.block_size, model.max_model_len
                    ),
                ));
            }
            Some(n) => n,
            None => (DEFAULT_KV_BYTES / (per_token * a.block_size)).max(min_blocks),
        };
        if !(a.log_stats_interval.is_finite() && a.log_stats_interval > 0.0) {
            return Err(bad(
                "log-stats-interval",
                "must be a positive number of seconds",
            ));
        }
        if !(0.0..=1.0).contains(&a.kv_cache_metrics_sample) {
            return Err(bad("kv-cache-metrics-sample", "must be between 0 and 1"));
        }
        let buckets = match &a.custom_histogram_buckets {
            Some(json) => Buckets::with_custom(model.max_model_len, json)
                .map_err(|e| bad("custom-histogram-buckets", e.to_string()))?,
            None => Buckets::defaults(model.max_model_len),
        };
        if let Some(url) = &a.otlp_traces_endpoint
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(bad(
                "otlp-traces-endpoint",
                "must be an http:// or https:// URL, e.g. http://127.0.0.1:4317",
            ));
        }
        let enable_prefix_caching = a.enable_prefix_caching && !a.no_enable_prefix_caching;
        let api_keys = api_keys(a)?;
        if a.metrics_require_key && !api_keys.required() {
            return Err(bad(
                "metrics-require-key",
                "needs a key to require: give --api-key-file or --api-key",
            ));
        }
        if a.max_connections == 0 {
            return Err(bad("max-connections", "must be at least 1"));
        }
        let http = HttpLimits {
            max_connections: a.max_connections,
            header_timeout: timeout("http-header-timeout", a.http_header_timeout)?,
            body_timeout: timeout("http-body-timeout", a.http_body_timeout)?,
            idle_timeout: timeout("http-idle-timeout", a.http_idle_timeout)?,
        };
        Ok(Self {
            served_model_name: a
                .served_model_name
                .clone()
                .unwrap_or_else(|| a.model.clone()),
            host: a.host,
            port: a.port,
            grpc_port: a.grpc_port,
            control_tokens: control_tokens(a)?,
            control_tls: control_tls(a)?,
            data_parallel_size: a.data_parallel_size,
            dispatch_policy: a.dispatch_policy,
            scheduler: SchedulerConfig {
                max_num_seqs: a.max_num_seqs,
                max_num_batched_tokens: a.max_num_batched_tokens,
                max_model_len: model.max_model_len,
                block_size: a.block_size,
                num_blocks,
                enable_prefix_caching,
            },
            admission: AdmissionLimits {
                max_queued_requests: a.max_queued_requests.get(),
                max_queued_tokens: a.max_queued_tokens,
            },
            max_running_per_tenant: a.max_running_per_tenant,
            seed: a.seed,
            cpu_threads: a.cpu_threads,
            shutdown_delay,
            drain_timeout,
            stats: StatsConfig {
                log_interval: std::time::Duration::from_secs_f64(a.log_stats_interval),
                disable_log_stats: a.disable_log_stats,
                aggregate_engine_logging: a.aggregate_engine_logging,
                buckets,
                kv_residency_sample: a.kv_cache_metrics.then_some(a.kv_cache_metrics_sample),
                otlp_traces_endpoint: a.otlp_traces_endpoint.clone(),
            },
            api_keys,
            metrics_require_key: a.metrics_require_key,
            http,
            model,
            source,
            device: a.device,
            cuda_graphs: a.cuda_graphs,
        })
    }

    /// Longest accepted sequence.
    pub fn max_model_len(&self) -> usize {
        self.scheduler.max_model_len
    }
}

/// The control tokens of `--control-token-file`: a missing, empty or unreadable file is
/// an error naming the file (and never its content).
fn control_tokens(a: &EngineArgs) -> Result<ApiKeys, ConfigError> {
    let Some(path) = &a.control_token_file else {
        return Ok(ApiKeys::None);
    };
    let (text, keys) = read_api_key_file(path)
        .map_err(|e| bad("control-token-file", format!("{}: {e}", path.display())))?;
    Ok(ApiKeys::File {
        path: path.clone(),
        text,
        keys,
    })
}

/// The control API's TLS pair, read and checked now so a bad file is an error at start
/// that names it.
fn control_tls(a: &EngineArgs) -> Result<Option<tls::TlsFiles>, ConfigError> {
    let (Some(cert), Some(key)) = (&a.control_tls_cert, &a.control_tls_key) else {
        return Ok(None);
    };
    let files = tls::TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
    };
    tls::load(&files).map_err(|e| bad("control-tls-cert", e.to_string()))?;
    Ok(Some(files))
}

/// The API keys the flags name. Never falls back to no key when one was meant: an empty
/// key, an empty `BALLAST_API_KEY` or a missing or empty key file are errors.
fn api_keys(a: &EngineArgs) -> Result<ApiKeys, ConfigError> {
    if let Some(path) = &a.api_key_file {
        let (text, keys) = read_api_key_file(path)
            .map_err(|e| bad("api-key-file", format!("{}: {e}", path.display())))?;
        return Ok(ApiKeys::File {
            path: path.clone(),
            text,
            keys,
        });
    }
    let given = match &a.api_key {
        Some(key) => Some(key.expose().to_string()),
        // clap treats an empty variable as unset; here that would mean no authentication
        // for a deployment whose Secret came out empty.
        None => std::env::var_os("BALLAST_API_KEY").map(|v| v.to_string_lossy().into_owned()),
    };
    match given {
        None => Ok(ApiKeys::None),
        Some(key) if key.contains('\n') => Err(bad(
            "api-key",
            "holds one key; give several in --api-key-file",
        )),
        Some(key) => match parse_api_keys(key.as_bytes()) {
            Ok(keys) => Ok(ApiKeys::Fixed(keys)),
            Err(KeyError::Empty) => Err(bad(
                "api-key",
                "is empty (BALLAST_API_KEY set but empty?); give a key, or no --api-key for an open API",
            )),
            Err(e) => Err(bad(
                "api-key",
                e.to_string().trim_start_matches("line 1: ").to_string(),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: EngineArgs,
    }

    fn parse(args: &[&str]) -> EngineArgs {
        Cli::try_parse_from(std::iter::once("engine").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn kv_cache_dtype_sizes_the_pool_and_is_refused_on_cuda() {
        let auto = EngineConfig::from_args(&parse(&["--model", "synthetic:small"])).unwrap();
        assert_eq!(
            auto.model.kv_dtype,
            KvDtype::F32,
            "synthetic models keep f32"
        );
        let f32s = EngineConfig::from_args(&parse(&[
            "--model",
            "synthetic:small",
            "--kv-cache-dtype",
            "f32",
        ]))
        .unwrap();
        let f16s = EngineConfig::from_args(&parse(&[
            "--model",
            "synthetic:small",
            "--kv-cache-dtype",
            "f16",
        ]))
        .unwrap();
        assert_eq!(f16s.model.kv_dtype, KvDtype::F16);
        // The same default byte budget holds twice the blocks.
        assert_eq!(auto.scheduler.num_blocks, f32s.scheduler.num_blocks);
        assert_eq!(f16s.scheduler.num_blocks, 2 * f32s.scheduler.num_blocks);
        let e = EngineConfig::from_args(&parse(&["--kv-cache-dtype", "f16", "--device", "cuda"]))
            .unwrap_err();
        assert_eq!(e.flag, "kv-cache-dtype", "{e}");
        assert!(Cli::try_parse_from(["engine", "--kv-cache-dtype", "int8"]).is_err());
    }

    #[test]
    fn shutdown_delay_and_drain_timeout_are_durations_or_named_errors() {
        let c = EngineConfig::from_args(&parse(&[])).unwrap();
        assert_eq!(
            c.shutdown_delay,
            std::time::Duration::ZERO,
            "a bare process"
        );
        assert_eq!(c.drain_timeout, std::time::Duration::from_secs(600));
        let c = EngineConfig::from_args(&parse(&["--shutdown-delay", "2.5"])).unwrap();
        assert_eq!(c.shutdown_delay, std::time::Duration::from_millis(2500));
        for flag in ["shutdown-delay", "drain-timeout"] {
            for bad in ["-1", "NaN", "inf", "1e300"] {
                let e =
                    EngineConfig::from_args(&parse(&[&format!("--{flag}={bad}")])).expect_err(bad);
                assert_eq!(e.flag, flag, "{bad}: {e}");
            }
        }
    }

    #[test]
    fn defaults_validate() {
        let c = EngineConfig::from_args(&parse(&[])).unwrap();
        assert_eq!(c.served_model_name, "synthetic:tiny");
        assert!(c.scheduler.enable_prefix_caching);
        assert!(c.scheduler.num_blocks * c.scheduler.block_size >= c.max_model_len());
    }

    #[test]
    fn cuda_device_is_refused_by_name_not_by_panic() {
        let e = EngineConfig::from_args(&parse(&["--device", "cuda"])).unwrap_err();
        assert_eq!(e.flag, "device");
        assert!(e.message.contains("--device cpu"), "{e}");
        assert!(EngineConfig::from_args(&parse(&["--device", "cpu"])).is_ok());
        let e = EngineConfig::from_args(&parse(&["--cuda-graphs"])).unwrap_err();
        assert_eq!(e.flag, "cuda-graphs");
        assert!(e.message.contains("--device cuda"), "{e}");
    }

    #[test]
    fn the_queue_has_a_finite_default_and_can_be_unlimited() {
        let c = EngineConfig::from_args(&parse(&[])).unwrap();
        assert_eq!(c.admission.max_queued_requests, Some(1024));
        assert_eq!(c.admission.max_queued_tokens, None);
        let c = EngineConfig::from_args(&parse(&["--max-queued-requests", "unlimited"])).unwrap();
        assert_eq!(c.admission.max_queued_requests, None);
        let c = EngineConfig::from_args(&parse(&["--max-queued-requests", "7"])).unwrap();
        assert_eq!(c.admission.max_queued_requests, Some(7));
        for bad in ["0", "-1", "lots", ""] {
            let e = Cli::try_parse_from(["engine".into(), format!("--max-queued-requests={bad}")])
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(e.to_string().contains("--max-queued-requests"), "{e}");
        }
    }

    #[test]
    fn http_limits_default_and_refuse_what_cannot_work() {
        let c = EngineConfig::from_args(&parse(&[])).unwrap();
        assert_eq!(c.http, HttpLimits::default());
        assert_eq!(c.http.max_connections, 4096);
        assert_eq!(c.http.header_timeout, Duration::from_secs(10));
        assert_eq!(c.http.body_timeout, Duration::from_secs(60));
        assert_eq!(c.http.idle_timeout, Duration::from_secs(120));
        let c = EngineConfig::from_args(&parse(&[
            "--max-connections",
            "10",
            "--http-header-timeout",
            "0.5",
            "--http-body-timeout",
            "2",
            "--http-idle-timeout",
            "3",
        ]))
        .unwrap();
        assert_eq!(
            c.http,
            HttpLimits {
                max_connections: 10,
                header_timeout: Duration::from_millis(500),
                body_timeout: Duration::from_secs(2),
                idle_timeout: Duration::from_secs(3),
            }
        );
        for flag in [
            "http-header-timeout",
            "http-body-timeout",
            "http-idle-timeout",
        ] {
            for bad in ["0", "-1", "NaN", "inf", "1e300"] {
                let e =
                    EngineConfig::from_args(&parse(&[&format!("--{flag}={bad}")])).expect_err(bad);
                assert_eq!(e.flag, flag, "{bad}: {e}");
            }
        }
        let e = EngineConfig::from_args(&parse(&["--max-connections", "0"])).unwrap_err();
        assert_eq!(e.flag, "max-connections");
    }

    fn key_file(name: &str, text: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ballast-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn api_keys_come_from_the_flag_or_the_file() {
        let c = EngineConfig::from_args(&parse(&[])).unwrap();
        assert_eq!(c.api_keys, ApiKeys::None);
        assert!(!c.api_keys.required());
        let c = EngineConfig::from_args(&parse(&["--api-key", " sk-one "])).unwrap();
        match &c.api_keys {
            ApiKeys::Fixed(keys) => {
                assert_eq!(keys.len(), 1);
                assert_eq!(keys[0].as_bytes(), b"sk-one", "trimmed");
            }
            other => panic!("{other:?}"),
        }
        let path = key_file("two.keys", b"sk-old\r\n\n  sk-new  \n");
        let c = EngineConfig::from_args(&parse(&[
            "--api-key-file",
            path.to_str().unwrap(),
            "--metrics-require-key",
        ]))
        .unwrap();
        assert!(c.metrics_require_key);
        match &c.api_keys {
            ApiKeys::File { keys, .. } => {
                let keys: Vec<&[u8]> = keys.iter().map(ApiKey::as_bytes).collect();
                assert_eq!(keys, [&b"sk-old"[..], b"sk-new"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            Cli::try_parse_from(["engine", "--api-key", "a", "--api-key-file", "/x"]).is_err(),
            "one source of keys"
        );
        assert_eq!(
            c.control_tokens,
            ApiKeys::None,
            "the control API is open by default"
        );
        let path = key_file("control.token", b"tok-new\ntok-old\n");
        let c = EngineConfig::from_args(&parse(&["--control-token-file", path.to_str().unwrap()]))
            .unwrap();
        assert!(matches!(&c.control_tokens, ApiKeys::File { keys, .. } if keys.len() == 2));
        assert_eq!(c.api_keys, ApiKeys::None, "control tokens are no API keys");
    }

    #[test]
    fn bad_keys_and_key_files_name_the_flag_and_never_the_key() {
        let secret = "sk-SECRET-VALUE";
        let cases: Vec<(Vec<String>, &str, &str)> = vec![
            (
                vec!["--api-key-file".into(), "/no/such/ballast.keys".into()],
                "api-key-file",
                "/no/such/ballast.keys: cannot be read",
            ),
            (
                vec![
                    "--api-key-file".into(),
                    key_file("empty.keys", b" \n\n").display().to_string(),
                ],
                "api-key-file",
                "holds no key",
            ),
            (
                vec![
                    "--api-key-file".into(),
                    key_file("bad.keys", format!("{secret}\n{secret} x\n").as_bytes())
                        .display()
                        .to_string(),
                ],
                "api-key-file",
                "line 2: a key must be printable ASCII",
            ),
            (
                vec![
                    "--api-key-file".into(),
                    key_file("utf8.keys", "sk-\u{e9}\n".as_bytes())
                        .display()
                        .to_string(),
                ],
                "api-key-file",
                "line 1",
            ),
            (
                vec![
                    "--control-token-file".into(),
                    "/no/such/control.token".into(),
                ],
                "control-token-file",
                "/no/such/control.token: cannot be read",
            ),
            (
                vec![
                    "--control-token-file".into(),
                    key_file("empty.token", b"\n").display().to_string(),
                ],
                "control-token-file",
                "holds no key",
            ),
            (
                vec![
                    "--control-token-file".into(),
                    key_file("bad.token", format!("{secret} x\n").as_bytes())
                        .display()
                        .to_string(),
                ],
                "control-token-file",
                "line 1",
            ),
            (vec!["--api-key".into(), " ".into()], "api-key", "is empty"),
            (
                vec!["--api-key".into(), format!("{secret} {secret}")],
                "api-key",
                "printable ASCII",
            ),
            (
                vec!["--api-key".into(), format!("{secret}\n{secret}")],
                "api-key",
                "holds one key",
            ),
            (
                vec!["--api-key".into(), "k".repeat(MAX_API_KEY_BYTES + 1)],
                "api-key",
                "at most",
            ),
        ];
        for (args, flag, needle) in cases {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let e = EngineConfig::from_args(&parse(&args)).unwrap_err();
            assert_eq!(e.flag, flag, "{args:?}");
            let text = e.to_string();
            assert!(text.contains(needle), "{args:?}: {text}");
            assert!(!text.contains(secret), "{text}");
        }
    }

    #[test]
    fn debug_output_never_shows_a_key() {
        let secret = "sk-DEBUG-SECRET";
        let args = parse(&["--api-key", secret]);
        let c = EngineConfig::from_args(&args).unwrap();
        let path = key_file("debug.keys", secret.as_bytes());
        let f =
            EngineConfig::from_args(&parse(&["--api-key-file", path.to_str().unwrap()])).unwrap();
        // The key as text, and as the list of bytes a derived `Debug` of bytes would print.
        let as_bytes = format!("{:?}", secret.as_bytes());
        let as_bytes = as_bytes.trim_matches(['[', ']']);
        for text in [format!("{args:?}"), format!("{c:?}"), format!("{f:?}")] {
            assert!(!text.contains(secret), "{text}");
            assert!(!text.contains(as_bytes), "{text}");
        }
        assert!(format!("{f:?}").contains("redacted"));
    }

    #[test]
    fn key_file_text_parses_line_by_line() {
        let keys = parse_api_keys(b"a\n\n\tb\t\r\nc").unwrap();
        assert_eq!(
            keys.iter().map(ApiKey::as_bytes).collect::<Vec<_>>(),
            [&b"a"[..], b"b", b"c"]
        );
        assert_eq!(parse_api_keys(b""), Err(KeyError::Empty));
        assert_eq!(parse_api_keys(b"\r\n \n"), Err(KeyError::Empty));
        assert_eq!(
            parse_api_keys(b"ok\nnot ok\n"),
            Err(KeyError::BadByte { line: 2 })
        );
        assert_eq!(parse_api_keys(b"\x00"), Err(KeyError::BadByte { line: 1 }));
    }

    #[test]
    fn prefix_caching_can_be_turned_off() {
        let c = EngineConfig::from_args(&parse(&["--no-enable-prefix-caching"])).unwrap();
        assert!(!c.scheduler.enable_prefix_caching);
    }

    #[test]
    fn errors_name_the_flag() {
        let cases: [(&[&str], &str); 9] = [
            (
                &["--custom-histogram-buckets", r#"{"ttft": [1]}"#],
                "custom-histogram-buckets",
            ),
            (
                &[
                    "--custom-histogram-buckets",
                    r#"{"request_latency": [2, 1]}"#,
                ],
                "custom-histogram-buckets",
            ),
            (
                &["--kv-cache-metrics-sample", "2"],
                "kv-cache-metrics-sample",
            ),
            (&["--num-kv-blocks", "3"], "num-kv-blocks"),
            (&["--data-parallel-size", "0"], "data-parallel-size"),
            (&["--model", "synthetic:nope"], "model"),
            (&["--max-model-len", "99999"], "max-model-len"),
            (&["--metrics-require-key"], "metrics-require-key"),
            (&["--log-stats-interval", "0"], "log-stats-interval"),
        ];
        for (args, flag) in cases {
            let e = EngineConfig::from_args(&parse(args)).unwrap_err();
            assert_eq!(e.flag, flag, "{args:?}");
            assert!(e.to_string().starts_with(&format!("--{flag}:")));
        }
    }
}
