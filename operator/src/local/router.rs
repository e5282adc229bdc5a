//! A small OpenAI-compatible router in front of the local replicas: each request goes to
//! the least-loaded replica in rotation of the service its `model` names.
//!
//! "Least loaded" is the fewest requests the router itself has in flight to a replica.
//! A replica that refuses before accepting (connection error, 503 while draining) is
//! skipped and the next one tried, so a scale-down never loses a request; a 429 is passed
//! through, because it is the admission signal the operator scales on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::json;

/// A replica the router may send to.
#[derive(Debug, Clone)]
pub struct Backend {
    /// Replica name.
    pub name: String,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Requests the router has in flight to it.
    pub in_flight: Arc<AtomicUsize>,
}

/// One service's replicas in rotation.
#[derive(Debug, Clone, Default)]
pub struct ServiceRoutes {
    /// InferenceService name.
    pub name: String,
    /// The `model` clients send.
    pub served_name: String,
    /// Replicas in rotation.
    pub backends: Vec<Backend>,
}

/// What the control loops publish for the router, one entry per service.
#[derive(Debug, Default)]
pub struct RouteTable {
    services: RwLock<std::collections::BTreeMap<String, ServiceRoutes>>,
}

impl RouteTable {
    /// Replaces one service's routes (its control loop calls this after each change).
    pub fn publish(&self, routes: ServiceRoutes) {
        self.services
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(routes.name.clone(), routes);
    }

    /// Whether every service has at least one replica in rotation.
    pub fn all_serving(&self) -> bool {
        let services = self.services.read().unwrap_or_else(|e| e.into_inner());
        !services.is_empty() && services.values().all(|s| !s.backends.is_empty())
    }

    fn snapshot(&self) -> Vec<ServiceRoutes> {
        self.services
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

#[derive(Clone)]
struct AppState {
    table: Arc<RouteTable>,
    client: reqwest::Client,
}

/// The router's HTTP routes.
pub fn router(table: Arc<RouteTable>) -> Router {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("HTTP client");
    Router::new()
        .route("/v1/completions", post(forward_completions))
        .route("/v1/chat/completions", post(forward_chat))
        .route("/v1/models", get(models))
        .route(
            "/health",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .with_state(AppState { table, client })
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"message": message.into(), "type": "invalid_request_error", "param": null, "code": code}});
    let mut r = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

async fn forward_completions(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    forward(s, headers, body, "/v1/completions").await
}

async fn forward_chat(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    forward(s, headers, body, "/v1/chat/completions").await
}

async fn models(State(s): State<AppState>) -> Response {
    let data: Vec<_> = s
        .table
        .snapshot()
        .iter()
        .map(|svc| json!({"id": svc.served_name, "object": "model", "owned_by": "ballast", "service": svc.name}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// Decrements a backend's in-flight count when the response (body included) is done.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn forward(s: AppState, headers: HeaderMap, body: Bytes, path: &str) -> Response {
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_string));
    let services = s.table.snapshot();
    let service = match (&model, services.len()) {
        (Some(m), _) => services.iter().find(|svc| &svc.served_name == m),
        (None, 1) => services.first(),
        (None, _) => None,
    };
    let Some(service) = service else {
        return match model {
            Some(m) => error(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("The model `{m}` does not exist."),
            ),
            None => error(
                StatusCode::BAD_REQUEST,
                "invalid_value",
                "`model` is required when several services run",
            ),
        };
    };
    // Least in flight first; ties in table order.
    let mut order: Vec<&Backend> = service.backends.iter().collect();
    order.sort_by_key(|b| b.in_flight.load(Ordering::SeqCst));
    for backend in order {
        backend.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(Arc::clone(&backend.in_flight));
        let mut req = s
            .client
            .post(format!("{}{path}", backend.url))
            .body(body.clone());
        for (name, value) in headers.iter() {
            if name == header::HOST || name == header::CONTENT_LENGTH {
                continue;
            }
            req = req.header(name, value);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            // Not accepted anywhere yet: safe to try the next replica.
            Err(e) if e.is_connect() => continue,
            Err(e) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    format!("{}: {e}", backend.name),
                );
            }
        };
        if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
            continue; // draining or stopped: it refused without accepting
        }
        let status = resp.status();
        let mut out = Response::builder().status(status);
        for (name, value) in resp.headers() {
            if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING {
                out = out.header(name, value);
            }
        }
        out = out.header("x-ballast-replica", backend.name.as_str());
        let stream = resp.bytes_stream().map(move |chunk| {
            let _keep = &guard;
            chunk
        });
        return out
            .body(Body::from_stream(stream))
            .unwrap_or_else(|e| error(StatusCode::BAD_GATEWAY, "upstream_error", e.to_string()));
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_replica",
        format!("no replica of {} is accepting requests", service.name),
    )
}
