//! The operator's own observability: Prometheus metrics (contract §4 names) and
//! `GET /status`, each service's status exactly as the CRD's `status` would hold it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use ballast_crds::InferenceServiceStatus;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The operator's metric families.
pub struct OperatorMetrics {
    registry: Registry,
    /// `ballast_operator_decisions_total{name, action, reason}`.
    pub decisions: IntCounterVec,
    /// `ballast_operator_desired_replicas{name}`.
    pub desired_replicas: IntGaugeVec,
    /// `ballast_operator_replicas{name, state}`: ready, starting, draining, accepting.
    pub replicas: IntGaugeVec,
    /// `ballast_operator_signal{name, signal}`: the aggregated signals decided on.
    pub signal: GaugeVec,
    /// `ballast_operator_scrape_errors_total{name, reason}`.
    pub scrape_errors: IntCounterVec,
    /// `ballast_operator_scrape_duration_seconds{name}`: one control period's scrape.
    pub scrape_duration: HistogramVec,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorMetrics {
    /// Registers every family.
    pub fn new() -> Self {
        let registry = Registry::new();
        let decisions = IntCounterVec::new(
            Opts::new(
                "ballast_operator_decisions_total",
                "Decisions by service, action and reason.",
            ),
            &["name", "action", "reason"],
        )
        .expect("valid");
        let desired_replicas = IntGaugeVec::new(
            Opts::new(
                "ballast_operator_desired_replicas",
                "Replicas the operator wants per service.",
            ),
            &["name"],
        )
        .expect("valid");
        let replicas = IntGaugeVec::new(
            Opts::new(
                "ballast_operator_replicas",
                "Replicas per service by state: ready, starting, draining, accepting.",
            ),
            &["name", "state"],
        )
        .expect("valid");
        let signal = GaugeVec::new(
            Opts::new(
                "ballast_operator_signal",
                "Aggregated fleet signals the last decision used.",
            ),
            &["name", "signal"],
        )
        .expect("valid");
        let scrape_errors = IntCounterVec::new(
            Opts::new(
                "ballast_operator_scrape_errors_total",
                "Failed replica scrapes by reason.",
            ),
            &["name", "reason"],
        )
        .expect("valid");
        let scrape_duration = HistogramVec::new(
            HistogramOpts::new(
                "ballast_operator_scrape_duration_seconds",
                "Time to scrape every replica of a service once.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["name"],
        )
        .expect("valid");
        for c in [
            Box::new(decisions.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(desired_replicas.clone()),
            Box::new(replicas.clone()),
            Box::new(signal.clone()),
            Box::new(scrape_errors.clone()),
            Box::new(scrape_duration.clone()),
        ] {
            registry.register(c).expect("unique");
        }
        Self {
            registry,
            decisions,
            desired_replicas,
            replicas,
            signal,
            scrape_errors,
            scrape_duration,
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encodes");
        String::from_utf8(buf).expect("UTF-8")
    }
}

/// Status per service name, as the CRD would hold it.
pub type StatusMap = Arc<RwLock<BTreeMap<String, InferenceServiceStatus>>>;

/// One replica as `GET /replicas` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaInfo {
    /// `<service>-<n>`.
    pub name: String,
    /// `Starting`, `Ready`, `Draining` or `Failed`.
    pub phase: &'static str,
    /// Ready and in the router's rotation.
    pub accepting: bool,
    /// The engine's HTTP API, once it announced it.
    pub url: Option<String>,
    /// The engine's control API, once it announced it.
    pub grpc: Option<String>,
    /// DP dispatch weights the operator set, if any.
    pub dp_weights: Option<Vec<f64>>,
}

/// Replicas per service name.
pub type ReplicaMap = Arc<RwLock<BTreeMap<String, Vec<ReplicaInfo>>>>;

#[derive(Clone)]
struct AdminState {
    metrics: Arc<OperatorMetrics>,
    status: StatusMap,
    replicas: ReplicaMap,
}

/// `/metrics`, `/status` (each service's status as the CRD holds it), `/replicas` (each
/// service's replicas: phase, rotation, addresses) and `/healthz`.
pub fn router(metrics: Arc<OperatorMetrics>, status: StatusMap, replicas: ReplicaMap) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AdminState>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    s.metrics.render(),
                )
            }),
        )
        .route(
            "/status",
            get(|State(s): State<AdminState>| async move {
                let map = s.status.read().unwrap_or_else(|e| e.into_inner()).clone();
                axum::Json(map).into_response()
            }),
        )
        .route(
            "/replicas",
            get(|State(s): State<AdminState>| async move {
                let map = s.replicas.read().unwrap_or_else(|e| e.into_inner()).clone();
                axum::Json(map).into_response()
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(AdminState {
            metrics,
            status,
            replicas,
        })
}
