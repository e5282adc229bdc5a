//! The admin port of `ballast local`: the live fleet page at `/` and the timeline it
//! plots, the operator's metrics ([`OperatorMetrics`]),
//! `GET /status` (each service's status exactly as the CRD's `status` would hold it) and
//! `GET /replicas`, and `GET /prometheus/targets` for Prometheus's HTTP service discovery.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::routing::get;
use ballast_crds::InferenceServiceStatus;

pub use crate::local::timeline::Timeline;
pub use crate::metrics::OperatorMetrics;

/// The `namespace` label of every service's series in `ballast local` (and of its engines'
/// targets on `/prometheus/targets`).
pub const LOCAL_NAMESPACE: &str = "local";

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

/// One target group of Prometheus's HTTP service discovery (`http_sd_configs`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TargetGroup {
    /// `host:port` of each target.
    pub targets: Vec<String>,
    /// Labels every series scraped from these targets gets.
    pub labels: BTreeMap<String, String>,
}

/// `GET /prometheus/targets`: every replica that announced its HTTP address, one group
/// each, labelled as a Kubernetes scrape would label an engine pod (`namespace` is
/// `local`, `service` the InferenceService, `pod` the replica), so the chart's dashboards
/// and alerts work unchanged against a local fleet.
pub fn prometheus_targets(replicas: &BTreeMap<String, Vec<ReplicaInfo>>) -> Vec<TargetGroup> {
    let mut groups = Vec::new();
    for (service, list) in replicas {
        for r in list {
            let Some(url) = &r.url else { continue };
            let host_port = url
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string();
            groups.push(TargetGroup {
                targets: vec![host_port],
                labels: BTreeMap::from([
                    ("namespace".to_string(), LOCAL_NAMESPACE.to_string()),
                    ("service".to_string(), service.clone()),
                    ("pod".to_string(), r.name.clone()),
                ]),
            });
        }
    }
    groups
}

/// Every service's history for the live page.
pub type TimelineHandle = Arc<std::sync::Mutex<Timeline>>;

/// What the admin port serves from.
#[derive(Clone)]
pub struct AdminState {
    /// The operator's metrics.
    pub metrics: Arc<OperatorMetrics>,
    /// Each service's status.
    pub status: StatusMap,
    /// Each service's replicas.
    pub replicas: ReplicaMap,
    /// Each service's samples and decisions.
    pub timeline: TimelineHandle,
}

/// The live fleet page: one self-contained HTML document (styles and script inline, no
/// build step, nothing fetched from elsewhere).
const PAGE: &str = include_str!("page.html");

/// Query of `GET /api/timeline`.
#[derive(Debug, serde::Deserialize)]
struct Since {
    /// Unix seconds; only what is newer is returned.
    #[serde(default)]
    since: f64,
}

/// `GET /api/timeline` answer.
#[derive(serde::Serialize)]
struct TimelineAnswer {
    /// Unix seconds when answered.
    now: f64,
    services: BTreeMap<String, crate::local::timeline::ServiceTimeline>,
}

/// `/` (the live fleet page), `/api/timeline?since=T` (what it plots), `/metrics`,
/// `/status` (each service's status as the CRD holds it), `/replicas` (each service's
/// replicas: phase, rotation, addresses), `/prometheus/targets` and `/healthz`.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async {
                (
                    [
                        (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
                        (axum::http::header::CACHE_CONTROL, "no-cache"),
                    ],
                    PAGE,
                )
            }),
        )
        .route(
            "/api/timeline",
            get(
                |State(s): State<AdminState>, Query(q): Query<Since>| async move {
                    let services = s
                        .timeline
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .since(q.since);
                    axum::Json(TimelineAnswer {
                        now: crate::local::timeline::unix_now(),
                        services,
                    })
                    .into_response()
                },
            ),
        )
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
        .route(
            "/prometheus/targets",
            get(|State(s): State<AdminState>| async move {
                let map = s.replicas.read().unwrap_or_else(|e| e.into_inner()).clone();
                axum::Json(prometheus_targets(&map)).into_response()
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(name: &str, url: Option<&str>) -> ReplicaInfo {
        ReplicaInfo {
            name: name.into(),
            phase: "Ready",
            accepting: true,
            url: url.map(str::to_string),
            grpc: None,
            dp_weights: None,
        }
    }

    #[test]
    fn targets_are_the_replicas_with_an_address_labelled_like_pods() {
        let map = BTreeMap::from([(
            "chat".to_string(),
            vec![
                replica("chat-0", Some("http://127.0.0.1:4100")),
                replica("chat-1", None),
            ],
        )]);
        let groups = prometheus_targets(&map);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].targets, ["127.0.0.1:4100"]);
        assert_eq!(groups[0].labels["service"], "chat");
        assert_eq!(groups[0].labels["pod"], "chat-0");
        assert_eq!(groups[0].labels["namespace"], "local");
    }
}
