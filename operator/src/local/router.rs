//! A small OpenAI-compatible router in front of the local replicas: each request goes to
//! the least-loaded replica in rotation of the service its `model` names.
//!
//! "Least loaded" is the fewest requests the router itself has in flight to a replica.
//!
//! What a client never sees, because the router absorbs it:
//! - **start-up**: every service is known from the moment `ballast local` starts. While a
//!   service has replicas starting and none ready, a request waits (up to [`HOLD_LIMIT`],
//!   or until the client goes away) and is sent on when one is ready; only then does it
//!   get a 503 with a JSON body;
//! - **refusals**: a replica that refuses before accepting (connection refused, 503 while
//!   draining or stopped) is skipped and the next one tried, so a scale-down never loses a
//!   request;
//! - **a replica dying**: a request that failed before any response byte reached the client
//!   (the connection dropped before the response, or before its first body chunk) is
//!   retried once on another replica. The router holds the response head until the first
//!   body chunk arrives to make that possible; only a request already streaming can fail.
//!
//! A 429 is passed through, because it is the admission signal the operator scales on.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ballast_serve::BodyError;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::watch;

/// How long a request may wait for a service's first ready replica.
pub const HOLD_LIMIT: Duration = Duration::from_secs(60);

/// The router's connection limits: an engine's defaults, since it is the front door
/// clients call as they would call an engine.
pub const LIMITS: ballast_serve::HttpLimits = ballast_serve::HttpLimits {
    max_connections: 4096,
    header_timeout: Duration::from_secs(10),
    body_timeout: Duration::from_secs(60),
    idle_timeout: Duration::from_secs(120),
};

/// Largest request body the router accepts: the engine's own limit
/// (`ballast_engine::api::http::MAX_BODY_BYTES`, held equal by a test), so the router never
/// refuses what a replica would take, nor forwards what it would refuse.
pub const MAX_BODY_BYTES: usize = 8 << 20;

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
    /// Replicas starting (or being replaced): requests wait for them when none is in
    /// rotation.
    pub starting: usize,
}

impl ServiceRoutes {
    /// Whether a request should wait rather than fail: nothing in rotation, but replicas
    /// are on their way.
    fn worth_waiting(&self) -> bool {
        self.backends.is_empty() && self.starting > 0
    }
}

/// What the control loops publish for the router, one entry per service. Every change
/// bumps a version that waiting requests watch.
#[derive(Debug)]
pub struct RouteTable {
    services: RwLock<BTreeMap<String, ServiceRoutes>>,
    changed: watch::Sender<u64>,
}

impl Default for RouteTable {
    fn default() -> Self {
        Self {
            services: RwLock::default(),
            changed: watch::Sender::new(0),
        }
    }
}

impl RouteTable {
    /// Replaces one service's routes (its control loop calls this after each change).
    pub fn publish(&self, routes: ServiceRoutes) {
        self.services
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(routes.name.clone(), routes);
        self.changed.send_modify(|v| *v += 1);
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

/// Why the router could not build its HTTP client.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// No process-wide TLS crypto provider: the program must install one first (the
    /// `ballast` binary does in `main`).
    #[error(
        "no TLS crypto provider is installed; the program must install one before starting the router"
    )]
    NoCryptoProvider,
    /// reqwest refused the configuration.
    #[error("cannot build the router's HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

#[derive(Clone)]
struct AppState {
    table: Arc<RouteTable>,
    client: reqwest::Client,
    hold: Duration,
}

/// The router's HTTP routes; requests wait at most `hold` for a starting service.
pub fn router(table: Arc<RouteTable>, hold: Duration) -> Result<Router, RouterError> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        return Err(RouterError::NoCryptoProvider);
    }
    let client = reqwest::Client::builder().no_proxy().build()?;
    Ok(Router::new()
        .route("/v1/completions", post(forward_completions))
        .route("/v1/chat/completions", post(forward_chat))
        .route("/v1/models", get(models))
        .route(
            "/health",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .with_state(AppState {
            table,
            client,
            hold,
        }))
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
    body: Body,
) -> Response {
    forward(s, headers, body, "/v1/completions").await
}

async fn forward_chat(State(s): State<AppState>, headers: HeaderMap, body: Body) -> Response {
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

impl InFlight {
    fn start(backend: &Backend) -> Self {
        backend.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(&backend.in_flight))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The service a request's `model` names; `Err` is the response to send.
fn pick_service(
    services: &[ServiceRoutes],
    model: Option<&str>,
) -> Result<ServiceRoutes, Box<Response>> {
    let found = match (model, services.len()) {
        (Some(m), _) => services.iter().find(|svc| svc.served_name == m),
        (None, 1) => services.first(),
        (None, _) => None,
    };
    found.cloned().ok_or_else(|| {
        Box::new(match model {
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
        })
    })
}

/// What one attempt on one replica came to.
enum Attempt {
    /// The response to send: its head and first body chunk arrived.
    Done(Response),
    /// The replica refused without accepting (connection refused, 503): try the next.
    Refused,
    /// The replica accepted, then failed before any response byte: the request may be
    /// retried elsewhere.
    Failed(String),
}

async fn forward(s: AppState, headers: HeaderMap, body: Body, path: &str) -> Response {
    // Read whole within a size and a time, as an engine reads it: a client trickling its
    // body holds no task for ever.
    let body = match ballast_serve::read_body(body, MAX_BODY_BYTES, LIMITS.body_timeout).await {
        Ok(b) => b,
        Err(e @ BodyError::TooLarge(_)) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                e.to_string(),
            );
        }
        Err(e @ BodyError::Timeout(_)) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                e.to_string(),
            );
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_json", e.to_string()),
    };
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_string));
    let deadline = tokio::time::Instant::now() + s.hold;
    let mut changes = s.table.changed.subscribe();
    let service = loop {
        // Mark the current version seen before reading, so a publish between the read and
        // the wait below is not missed.
        changes.borrow_and_update();
        let service = match pick_service(&s.table.snapshot(), model.as_deref()) {
            Ok(svc) => svc,
            Err(resp) => return *resp,
        };
        if !service.worth_waiting() {
            break service;
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_replica",
                format!(
                    "no replica of {} became ready within {} s",
                    service.name,
                    s.hold.as_secs()
                ),
            );
        }
    };

    // Least in flight first; ties in table order.
    let mut order: Vec<&Backend> = service.backends.iter().collect();
    order.sort_by_key(|b| b.in_flight.load(Ordering::SeqCst));
    let mut retried = false;
    let mut last_failure = None;
    for backend in order {
        match attempt(&s.client, backend, &headers, &body, path).await {
            Attempt::Done(resp) => return resp,
            Attempt::Refused => continue,
            Attempt::Failed(why) if !retried => {
                tracing::warn!(target: "ballast::local", replica = %backend.name, error = %why, "request failed before any response byte; retrying once on another replica");
                retried = true;
                last_failure = Some(format!("{}: {why}", backend.name));
            }
            Attempt::Failed(why) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    format!("{}: {why} (after a retry)", backend.name),
                );
            }
        }
    }
    match last_failure {
        Some(why) => error(StatusCode::BAD_GATEWAY, "upstream_error", why),
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_replica",
            format!("no replica of {} is accepting requests", service.name),
        ),
    }
}

async fn attempt(
    client: &reqwest::Client,
    backend: &Backend,
    headers: &HeaderMap,
    body: &Bytes,
    path: &str,
) -> Attempt {
    let guard = InFlight::start(backend);
    let mut req = client
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
        Err(e) if e.is_connect() => return Attempt::Refused,
        Err(e) => return Attempt::Failed(e.to_string()),
    };
    let status = resp.status();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return Attempt::Refused; // draining or stopped: it refused without accepting
    }
    let mut out = Response::builder().status(status);
    for (name, value) in resp.headers() {
        if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING {
            out = out.header(name, value);
        }
    }
    out = out.header("x-ballast-replica", backend.name.as_str());
    let mut upstream = resp.bytes_stream();
    // Nothing has reached the client until the first chunk is here.
    let first = match upstream.next().await {
        Some(Ok(chunk)) => Some(chunk),
        None => None,
        Some(Err(e)) => return Attempt::Failed(e.to_string()),
    };
    let rest = upstream.map(move |chunk| {
        let _keep = &guard;
        chunk
    });
    let stream = futures::stream::iter(first.map(Ok)).chain(rest);
    Attempt::Done(
        out.body(Body::from_stream(stream))
            .unwrap_or_else(|e| error(StatusCode::BAD_GATEWAY, "upstream_error", e.to_string())),
    )
}
