//! `ballast gateway`: an endpoint picker in the request path.
//!
//! Envoy-based gateways (Envoy Gateway, kgateway, Istio, GKE's, or a plain Envoy with the
//! bootstrap in `deploy/envoy/`) call it over Envoy's `ext_proc` for each request, as the
//! Gateway API Inference Extension defines; it answers with the endpoint to send the
//! request to (`x-gateway-destination-endpoint`), or with an error of its own when none
//! should get it. docs/gateway.md is the user's guide.
//!
//! - [`extproc`]: the protocol, one stream per request;
//! - [`pool`]: the endpoints, what the gateway knows of each, the pick;
//! - [`score`]: the score and saturation, as pure functions;
//! - [`prefix`]: prompt blocks and the blocks sent to each endpoint (prefix affinity);
//! - [`scrape`]: the gateway's own scrapes of its endpoints;
//! - [`pods`]: endpoints from the pods of a selector or an InferencePool, as they change;
//! - [`openai`]: what is read of a request body, and the gateway's OpenAI-shaped errors;
//! - [`metrics`]: the gateway's own Prometheus metrics;
//! - [`envoy`]: the checked-in Envoy bootstrap, filled in for fixed addresses.
//!
//! One gRPC port serves `envoy.service.ext_proc.v3.ExternalProcessor` and
//! `grpc.health.v1.Health` (services `liveness`, `readiness`, and the ext_proc service's
//! name); `--metrics-port` serves `/metrics`.

pub mod envoy;
pub mod extproc;
pub mod metrics;
pub mod openai;
pub mod pods;
pub mod pool;
pub mod prefix;
pub mod score;
pub mod scrape;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::server::NamedService;
use tonic_health::ServingStatus;

use ballast_operator::inspect::DialectArg;

use crate::extproc::{Processor, ProcessorConfig, Shared};
use crate::metrics::GatewayMetrics;
use crate::pods::AbortOnDrop;
use crate::pool::{DEFAULT_PREFIX_BLOCKS, Endpoint, Pool};
use crate::prefix::Blocking;
use crate::score::{Scoring, Thresholds, Weights};

/// The gRPC health service that says the process is up.
pub const LIVENESS: &str = "liveness";
/// The gRPC health service that says the endpoint source has been read once.
pub const READINESS: &str = "readiness";

/// `ballast gateway` flags. Exactly one endpoint source: `--endpoints`, `--selector` or
/// `--pool`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["endpoints", "selector", "pool"])))]
pub struct GatewayArgs {
    /// Address of the gRPC port (ext_proc and health); 0.0.0.0 in a pod.
    #[arg(long, env = "BALLAST_GATEWAY_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// The gRPC port Envoy's ext_proc filter calls (0 = any free port).
    #[arg(long, env = "BALLAST_GATEWAY_PORT", default_value_t = 9002)]
    pub port: u16,
    /// The port of `/metrics` (on the same address; 0 = any free port).
    #[arg(long, env = "BALLAST_GATEWAY_METRICS_PORT", default_value_t = 9090)]
    pub metrics_port: u16,
    /// A fixed pool: the engines' `ip:port` addresses, comma-separated.
    #[arg(long, env = "BALLAST_GATEWAY_ENDPOINTS", value_delimiter = ',')]
    pub endpoints: Vec<SocketAddr>,
    /// The pool from pods: a label selector (e.g. `app=smollm2`); ready pods only, re-read
    /// as they change.
    #[arg(long, env = "BALLAST_GATEWAY_SELECTOR")]
    pub selector: Option<String>,
    /// The pool from an InferencePool (`inference.networking.k8s.io/v1`) of this name: its
    /// selector's ready pods on its target ports, both re-read as they change. What the
    /// operator runs for an InferenceService with `spec.gateway.enabled`.
    #[arg(long, env = "BALLAST_GATEWAY_POOL")]
    pub pool: Option<String>,
    /// The namespace of `--selector`'s pods or `--pool`'s InferencePool; the client's
    /// default namespace (the pod's own, in a cluster) when absent.
    #[arg(long, env = "BALLAST_GATEWAY_NAMESPACE")]
    pub namespace: Option<String>,
    /// The engines' HTTP port on each selected pod.
    #[arg(
        long,
        env = "BALLAST_GATEWAY_TARGET_PORT",
        default_value_t = 8000,
        requires = "selector"
    )]
    pub target_port: u16,
    /// A model name the pool serves (repeat or comma-separate); requests for another get
    /// 404. Without any, every model is passed on for the engines to judge.
    #[arg(
        long = "model-name",
        env = "BALLAST_GATEWAY_MODEL_NAME",
        value_delimiter = ','
    )]
    pub model_names: Vec<String>,
    /// The largest request body routed, in bytes; 413 past it.
    #[arg(long, env = "BALLAST_GATEWAY_MAX_BODY_BYTES", default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// `Retry-After` seconds of a 503 for want of an endpoint.
    #[arg(long, env = "BALLAST_GATEWAY_RETRY_AFTER", default_value_t = 1)]
    pub retry_after: u32,
    /// Seconds to let open streams finish after SIGTERM.
    #[arg(long, env = "BALLAST_GATEWAY_DRAIN_SECONDS", default_value_t = 30)]
    pub drain_seconds: u64,
    /// Which series names the engines export.
    #[arg(
        long,
        env = "BALLAST_GATEWAY_DIALECT",
        value_enum,
        default_value = "ballast"
    )]
    pub dialect: DialectArg,
    /// Milliseconds between two scrapes of each endpoint's metrics (0 = none: every pick
    /// on the gateway's in-flight count alone).
    #[arg(
        long,
        env = "BALLAST_GATEWAY_SCRAPE_INTERVAL_MS",
        default_value_t = 100
    )]
    pub scrape_interval_ms: u64,
    /// An endpoint's data older than this many scrape intervals is stale: scored on the
    /// gateway's in-flight count alone, never saturated.
    #[arg(long, env = "BALLAST_GATEWAY_STALE_INTERVALS", default_value_t = 3)]
    pub stale_intervals: u32,
    /// The engines' metrics path.
    #[arg(long, env = "BALLAST_GATEWAY_METRICS_PATH", default_value = "/metrics")]
    pub metrics_path: String,
    /// A file of API keys, one a line (the engines' own `--api-key-file`): the first is
    /// sent as `Authorization: Bearer` on every scrape, so engines that require a key on
    /// `/metrics` are still read. Re-read every 10 s, so a rotated Secret is picked up.
    #[arg(long, env = "BALLAST_GATEWAY_SCRAPE_KEY_FILE", value_name = "PATH")]
    pub scrape_key_file: Option<std::path::PathBuf>,
    /// Score weight of each request waiting for capacity.
    #[arg(long, env = "BALLAST_GATEWAY_WEIGHT_WAITING", default_value_t = Weights::default().waiting)]
    pub weight_waiting: f64,
    /// Score weight of each running request.
    #[arg(long, env = "BALLAST_GATEWAY_WEIGHT_RUNNING", default_value_t = Weights::default().running)]
    pub weight_running: f64,
    /// Score weight of each request sent since the last scrape (of each in flight, for a
    /// stale endpoint).
    #[arg(long, env = "BALLAST_GATEWAY_WEIGHT_IN_FLIGHT", default_value_t = Weights::default().in_flight)]
    pub weight_in_flight: f64,
    /// Score weight of KV usage (0..1).
    #[arg(long, env = "BALLAST_GATEWAY_WEIGHT_KV", default_value_t = Weights::default().kv)]
    pub weight_kv: f64,
    /// Score weight of each recent 429 per second.
    #[arg(long, env = "BALLAST_GATEWAY_WEIGHT_REJECTIONS", default_value_t = Weights::default().rejections)]
    pub weight_rejections: f64,
    /// Score taken off an endpoint per unit of prefix match (the fraction of the prompt's
    /// blocks, from the first, sent there before): a whole match is worth this many
    /// requests running. 0 turns prefix affinity off.
    #[arg(long, env = "BALLAST_GATEWAY_WEIGHT_PREFIX", default_value_t = Weights::default().prefix)]
    pub weight_prefix: f64,
    /// Bytes of prompt per block hashed for prefix affinity (token-id prompts: 4 per id).
    #[arg(long, env = "BALLAST_GATEWAY_PREFIX_BLOCK_BYTES", default_value_t = Blocking::default().block_bytes)]
    pub prefix_block_bytes: usize,
    /// Blocks hashed at most from a prompt's start.
    #[arg(long, env = "BALLAST_GATEWAY_PREFIX_MAX_BLOCKS", default_value_t = Blocking::default().max_blocks)]
    pub prefix_max_blocks: usize,
    /// Prompt blocks remembered per endpoint, most recent first (about 24 bytes each);
    /// 0 remembers none.
    #[arg(long, env = "BALLAST_GATEWAY_PREFIX_CACHE_BLOCKS", default_value_t = DEFAULT_PREFIX_BLOCKS)]
    pub prefix_cache_blocks: usize,
    /// Capacity-waiting requests at or over which an endpoint is saturated.
    #[arg(long, env = "BALLAST_GATEWAY_QUEUE_THRESHOLD", default_value_t = Thresholds::default().queue)]
    pub queue_threshold: f64,
    /// KV usage at or over which an endpoint is saturated.
    #[arg(long, env = "BALLAST_GATEWAY_KV_THRESHOLD", default_value_t = Thresholds::default().kv)]
    pub kv_threshold: f64,
    /// Pick the data-parallel rank too, on each rank's own gauges, and send it as
    /// `X-Data-Parallel-Rank` (vLLM, SGLang and ballast engines honour it); `false` leaves
    /// the rank to the engine and scores each endpoint on its sums over ranks.
    #[arg(
        long,
        env = "BALLAST_GATEWAY_PICK_DP_RANK",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub pick_dp_rank: bool,
    /// The request header with a request's priority (an integer; negative is sheddable:
    /// 429 while every endpoint is saturated).
    #[arg(
        long,
        env = "BALLAST_GATEWAY_PRIORITY_HEADER",
        default_value = "x-ballast-priority"
    )]
    pub priority_header: String,
    /// Most requests held in the gateway while every endpoint is saturated; past it they
    /// are sent on at once.
    #[arg(long, env = "BALLAST_GATEWAY_QUEUE_MAX", default_value_t = 256)]
    pub queue_max: usize,
    /// Longest a request is held while every endpoint is saturated, in milliseconds; then
    /// it is sent on.
    #[arg(long, env = "BALLAST_GATEWAY_QUEUE_TIMEOUT_MS", default_value_t = 2000)]
    pub queue_timeout_ms: u64,
    /// Most requests held while the pool has no endpoint at all (scaled to zero, or not
    /// up yet); past it, 503 with `Retry-After`.
    #[arg(long, env = "BALLAST_GATEWAY_HOLD_MAX", default_value_t = 1024)]
    pub hold_max: usize,
    /// Most request-body bytes held over those requests; past it, 503.
    #[arg(long, env = "BALLAST_GATEWAY_HOLD_MAX_BYTES", default_value_t = 64 << 20)]
    pub hold_max_bytes: usize,
    /// Longest a request is held for want of any endpoint, in milliseconds (a cold start:
    /// a pod scheduled, its image pulled, its model loaded); then 503.
    #[arg(
        long,
        env = "BALLAST_GATEWAY_HOLD_TIMEOUT_MS",
        default_value_t = 240_000
    )]
    pub hold_timeout_ms: u64,
}

impl GatewayArgs {
    /// The scoring the flags ask for.
    pub fn scoring(&self) -> Result<Scoring, GatewayError> {
        let weights = [
            ("--weight-waiting", self.weight_waiting),
            ("--weight-running", self.weight_running),
            ("--weight-in-flight", self.weight_in_flight),
            ("--weight-kv", self.weight_kv),
            ("--weight-rejections", self.weight_rejections),
            ("--weight-prefix", self.weight_prefix),
            ("--queue-threshold", self.queue_threshold),
        ];
        for (flag, w) in weights {
            if !(w.is_finite() && w >= 0.0) {
                return Err(GatewayError::Args(format!(
                    "{flag} must be a number of at least 0, not {w}"
                )));
            }
        }
        if !(self.kv_threshold > 0.0 && self.kv_threshold <= 1.0) {
            return Err(GatewayError::Args(format!(
                "--kv-threshold must be in (0, 1], not {}",
                self.kv_threshold
            )));
        }
        if self.stale_intervals == 0 {
            return Err(GatewayError::Args(
                "--stale-intervals must be at least 1".into(),
            ));
        }
        let interval = Duration::from_millis(self.scrape_interval_ms.max(1));
        Ok(Scoring {
            weights: Weights {
                waiting: self.weight_waiting,
                running: self.weight_running,
                in_flight: self.weight_in_flight,
                kv: self.weight_kv,
                rejections: self.weight_rejections,
                prefix: self.weight_prefix,
            },
            thresholds: Thresholds {
                queue: self.queue_threshold,
                kv: self.kv_threshold,
            },
            stale_after: interval * self.stale_intervals,
            pick_ranks: self.pick_dp_rank,
        })
    }
}

/// Why `ballast gateway` stopped.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A flag's value cannot work.
    #[error("{0}")]
    Args(String),
    /// A port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// No Kubernetes client for `--selector` or `--pool`.
    #[error("no Kubernetes client for --selector or --pool (in-cluster config or KUBECONFIG): {0}")]
    Kube(#[from] kube::Error),
    /// The gRPC server failed.
    #[error("the gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

impl GatewayError {
    /// The process exit code: 2 for bad arguments, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            GatewayError::Args(_) => 2,
            _ => 1,
        }
    }
}

/// Runs the gateway until `shutdown` resolves, then lets open streams finish for
/// `--drain-seconds`.
pub async fn run(
    args: GatewayArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    if args.max_body_bytes == 0 {
        return Err(GatewayError::Args(
            "--max-body-bytes must be at least 1".into(),
        ));
    }
    for (flag, v) in [
        ("--hold-max", args.hold_max as u64),
        ("--hold-max-bytes", args.hold_max_bytes as u64),
        ("--hold-timeout-ms", args.hold_timeout_ms),
    ] {
        if v == 0 {
            return Err(GatewayError::Args(format!(
                "{flag} must be at least 1: with 0 no request could wait for an endpoint (a fleet scaling from zero would lose every one)"
            )));
        }
    }
    if let Some(path) = &args.scrape_key_file {
        scrape::read_key(path).map_err(GatewayError::Args)?;
    }
    if args.prefix_block_bytes == 0 {
        return Err(GatewayError::Args(
            "--prefix-block-bytes must be at least 1".into(),
        ));
    }
    let pool = Arc::new(Pool::new(args.scoring()?, args.prefix_cache_blocks));
    let metrics = Arc::new(GatewayMetrics::new());
    let _scrapes = if args.scrape_interval_ms > 0 {
        let interval = Duration::from_millis(args.scrape_interval_ms);
        // Scrapes run on their own thread: parsing a thousand expositions ten times a
        // second must not queue in front of requests on the request path's threads. If
        // that thread cannot keep up, data goes stale (and is scored as such); requests
        // do not wait.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .thread_name("gateway-scrapes")
            .enable_all()
            .build()
            .map_err(|e| GatewayError::Args(format!("cannot start the scrape thread: {e}")))?;
        let task = runtime.spawn(scrape::run(
            Arc::clone(&pool),
            scrape::ScrapeSettings {
                dialect: args.dialect.into(),
                interval,
                path: args.metrics_path.clone(),
                // A scrape slower than the staleness bound is of no use anyway.
                timeout: (interval * args.stale_intervals).max(Duration::from_millis(250)),
                key_file: args.scrape_key_file.clone(),
            },
            Arc::clone(&metrics),
        ));
        Some(ScrapeThread::start(runtime, task))
    } else {
        None
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
    health
        .set_service_status(READINESS, ServingStatus::NotServing)
        .await;
    let ext_proc_name = <ExternalProcessorServer<Processor> as NamedService>::NAME;
    health
        .set_service_status(ext_proc_name, ServingStatus::NotServing)
        .await;

    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    let _source = match (&args.selector, &args.pool) {
        (None, None) => {
            pool.set(args.endpoints.iter().copied().map(Endpoint::at).collect());
            let _ = synced_tx.send(true);
            None
        }
        (Some(selector), _) => {
            let client = kube::Client::try_default().await?;
            let namespace = args
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string());
            tracing::info!(%namespace, %selector, port = args.target_port, "endpoints from pods");
            Some(AbortOnDrop(tokio::spawn(pods::follow(
                client,
                namespace,
                selector.clone(),
                vec![args.target_port],
                Arc::clone(&pool),
                Arc::new(synced_tx),
            ))))
        }
        (None, Some(name)) => {
            let client = kube::Client::try_default().await?;
            let namespace = args
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string());
            tracing::info!(%namespace, pool = %name, "endpoints from an InferencePool");
            Some(AbortOnDrop(tokio::spawn(pods::follow_pool(
                client,
                namespace,
                name.clone(),
                Arc::clone(&pool),
                synced_tx,
            ))))
        }
    };
    {
        let health = health.clone();
        tokio::spawn(async move {
            if synced.wait_for(|s| *s).await.is_ok() {
                health
                    .set_service_status(READINESS, ServingStatus::Serving)
                    .await;
                health
                    .set_service_status(ext_proc_name, ServingStatus::Serving)
                    .await;
            }
        });
    }

    let grpc_addr = SocketAddr::new(args.host, args.port);
    let grpc = TcpListener::bind(grpc_addr)
        .await
        .map_err(|source| GatewayError::Listen {
            addr: grpc_addr,
            source,
        })?;
    let metrics_addr = SocketAddr::new(args.host, args.metrics_port);
    let metrics_listener =
        TcpListener::bind(metrics_addr)
            .await
            .map_err(|source| GatewayError::Listen {
                addr: metrics_addr,
                source,
            })?;
    // Printed (not logged) so scripts and tests can read the ports.
    println!(
        "ballast gateway listening on {}",
        grpc.local_addr().unwrap_or(grpc_addr)
    );
    println!(
        "ballast gateway metrics on http://{}",
        metrics_listener.local_addr().unwrap_or(metrics_addr)
    );
    let shared = Arc::new(Shared::new(
        Arc::clone(&pool),
        ProcessorConfig {
            max_body_bytes: args.max_body_bytes,
            models: args.model_names.clone(),
            retry_after_secs: args.retry_after,
            priority_header: args.priority_header.to_ascii_lowercase(),
            queue_max: args.queue_max,
            queue_timeout: Duration::from_millis(args.queue_timeout_ms),
            hold_max: args.hold_max,
            hold_max_bytes: args.hold_max_bytes,
            hold_timeout: Duration::from_millis(args.hold_timeout_ms),
            blocking: Blocking {
                block_bytes: args.prefix_block_bytes,
                max_blocks: args.prefix_max_blocks,
            },
        },
        Arc::clone(&metrics),
    ));
    let admin = Connections(ballast_serve::Connections::start(
        metrics_listener,
        admin_router(Admin {
            metrics,
            pool,
            shared: Arc::clone(&shared),
            pool_name: args.pool.clone().unwrap_or_default(),
        }),
        &ballast_operator::ADMIN_HTTP_LIMITS,
    ));
    let processor = Processor::new(shared);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn({
        let health = health.clone();
        async move {
            shutdown.await;
            tracing::info!("stopping: no longer ready, letting open streams finish");
            health
                .set_service_status(READINESS, ServingStatus::NotServing)
                .await;
            health
                .set_service_status(ext_proc_name, ServingStatus::NotServing)
                .await;
            let _ = stop_tx.send(true);
        }
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // Without TCP_NODELAY the second of two small replies (the headers answer, then the
    // body) waits for the data plane's delayed ACK: tens of milliseconds at low rates.
    let incoming = TcpListenerStream::new(grpc).map(|conn| {
        conn.inspect(|c| {
            let _ = c.set_nodelay(true);
        })
    });
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(health_service)
        .add_service(ExternalProcessorServer::new(processor))
        .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone()));
    let drain = Duration::from_secs(args.drain_seconds);
    let result = tokio::select! {
        r = server => r.map_err(GatewayError::from),
        _ = async {
            stopped(stop_rx).await;
            tokio::time::sleep(drain).await;
        } => {
            tracing::warn!(seconds = args.drain_seconds, "streams still open after the drain time; stopping");
            Ok(())
        }
    };
    drop(admin);
    result
}

/// The metrics port's state.
#[derive(Clone)]
struct Admin {
    metrics: Arc<GatewayMetrics>,
    pool: Arc<Pool>,
    shared: Arc<Shared>,
    /// `--pool`, the `pool` label of the hold gauges (empty without one).
    pool_name: String,
}

fn admin_router(admin: Admin) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(a): State<Admin>| async move {
                let members = a.pool.endpoints();
                let present = members.iter().map(|s| s.endpoint.name.as_str()).collect();
                a.metrics.forget_endpoints_except(&present);
                a.metrics.endpoints.set(a.pool.len() as i64);
                a.metrics.unreachable.set(a.pool.unreachable() as i64);
                let blocks: usize = a.pool.endpoints().iter().map(|s| s.prefix_blocks()).sum();
                a.metrics.prefix_blocks.set(blocks as i64);
                let pool = [a.pool_name.as_str()];
                a.metrics
                    .held_requests
                    .with_label_values(&pool)
                    .set(a.shared.held.load(std::sync::atomic::Ordering::Relaxed) as i64);
                let oldest = a
                    .shared
                    .oldest_hold()
                    .map_or(0.0, |at| at.elapsed().as_secs_f64());
                a.metrics.oldest_hold.with_label_values(&pool).set(oldest);
                a.metrics
                    .stale
                    .set(a.pool.stale(std::time::Instant::now()) as i64);
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    a.metrics.render(),
                )
            }),
        )
        .with_state(admin)
}

/// Stops the accept loop of the metrics port when dropped.
struct Connections(ballast_serve::Connections);

impl Drop for Connections {
    fn drop(&mut self) {
        self.0.close_open();
    }
}

/// A background task stopped when its handle is dropped.
/// The scrapes' runtime, driven by a thread of its own until dropped.
struct ScrapeThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ScrapeThread {
    fn start(runtime: tokio::runtime::Runtime, task: tokio::task::JoinHandle<()>) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("gateway-scrapes".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                task.abort();
                runtime.shutdown_background();
            })
            .expect("a thread can be spawned");
        ScrapeThread {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for ScrapeThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
