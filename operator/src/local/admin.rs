//! The admin port of `ballast local`: the operator's metrics ([`OperatorMetrics`]),
//! `GET /status` (each service's status exactly as the CRD's `status` would hold it) and
//! `GET /replicas`.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use ballast_crds::InferenceServiceStatus;

pub use crate::metrics::OperatorMetrics;

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
            get(|State(s): State<AdminState>| async move { s.metrics.http_response() }),
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
