//! The OpenAI-compatible HTTP frontend: `/v1/completions`, `/v1/chat/completions`,
//! `/v1/models`, `/health`, `/metrics`; API keys; the connection limits and timeouts; and
//! the SIGTERM shutdown (delay, then drain).

pub mod auth;
pub mod error;
mod generate;
mod http_metrics;
pub mod protocol;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Uri, header};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ballast_serve::{BodyError, Connections};
use serde_json::json;

pub use error::ApiError;
use generate::{Endpoint, Job, unix_now};
use protocol::{
    Fields, MAX_CHOICES, MAX_TENANT_LEN, PromptInput, parse_gen_params, parse_messages,
    parse_prompts,
};

use crate::runtime::engine::{Engine, ShutdownPhase};
use crate::telemetry::spans::TraceContext;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 8 << 20;

/// The API routes (template, method) counted by the HTTP metrics.
const API_ROUTES: [(&str, &str); 3] = [
    ("/v1/completions", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/v1/models", "GET"),
];

/// The HTTP routes over `engine`. With API keys configured, `/v1/*` (and `/metrics` with
/// `--metrics-require-key`) answers 401 without a right key; with `--api-key-file` the
/// file is re-read while the router lives (see [`auth::Auth::new`]).
pub fn router(engine: Engine) -> Router {
    engine.metrics().prepare_http(&API_ROUTES);
    let cfg = engine.config();
    let auth = auth::Auth::new(&cfg.api_keys, cfg.metrics_require_key);
    let fallback_auth = auth.clone();
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        // An unknown `/v1/` path needs the key too, so only a caller with one learns
        // which routes exist.
        .fallback(move |uri: Uri, headers: HeaderMap| async move {
            if fallback_auth.guards(uri.path())
                && let Err(refusal) = fallback_auth.check(&headers)
            {
                return refusal.into_response();
            }
            ApiError::no_route(uri.path()).into_response()
        })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Inside the metrics layer: a refused request is counted with its 401.
        .route_layer(axum::middleware::from_fn_with_state(
            auth,
            auth::require_key,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            http_metrics::track,
        ))
        .layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            close_when_shutting_down,
        ))
        .with_state(engine)
}

/// Serves until `shutdown` resolves (the binary passes SIGTERM/SIGINT), then shuts down in
/// phases, each logged:
///
/// 1. *shutdown delay* (`--shutdown-delay`): new requests are still admitted, but every
///    HTTP/1 response says `Connection: close` (so clients' pooled connections move to
///    other replicas) and `/health` answers 503 `terminating` (so readiness probes and load
///    balancers take this one out of rotation) — while endpoint updates still travel, no
///    client that reaches this replica is refused;
/// 2. *drain*: new requests get 503 `draining`, idle keep-alive connections are closed and
///    busy ones close after their response; in-flight requests finish, or are aborted after
///    `--drain-timeout`;
/// 3. the connections close, the rank threads stop, and it returns.
///
/// Throughout, connections are served with the limits of [`ballast_serve::Connections`]: `--max-connections`,
/// the header and idle timeouts, and (in the handlers) the body timeout.
pub async fn serve(
    engine: Engine,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(engine.clone());
    let cfg = engine.config();
    // One accept loop serves every phase: at the drain the connections open then are
    // closed (idle ones at once), while later ones are still accepted and answered (503,
    // `Connection: close`) rather than refused.
    let connections = Connections::start(listener, app, &cfg.http);
    tracing::info!(
        max_connections = connections.cap(),
        header_timeout_s = cfg.http.header_timeout.as_secs_f64(),
        body_timeout_s = cfg.http.body_timeout.as_secs_f64(),
        idle_timeout_s = cfg.http.idle_timeout.as_secs_f64(),
        api_keys = match &cfg.api_keys {
            crate::config::ApiKeys::None => "none: the API is open",
            crate::config::ApiKeys::Fixed(_) => "--api-key",
            crate::config::ApiKeys::File { .. } => "--api-key-file",
        },
        metrics_require_key = cfg.metrics_require_key,
        "HTTP server limits"
    );
    shutdown.await;
    let delay = cfg.shutdown_delay;
    if !delay.is_zero() {
        engine.advance_shutdown(ShutdownPhase::Delaying);
        tracing::info!(
            delay_s = delay.as_secs_f64(),
            in_flight = engine.in_flight(),
            "shutting down: still admitting for the shutdown delay; responses say Connection: close, /health answers 503"
        );
        tokio::time::sleep(delay).await;
    }
    engine.advance_shutdown(ShutdownPhase::Draining);
    tracing::info!(
        in_flight = engine.in_flight(),
        "draining: new requests get 503, idle connections are closed, in-flight requests finish"
    );
    connections.close_open();
    drain(&engine).await;
    if connections.stop(CLOSE_GRACE).await? {
        tracing::warn!(
            grace = ?CLOSE_GRACE,
            "connections still open after the drain; closing them"
        );
    }
    tracing::info!("connections closed; stopping the engine");
    tokio::task::spawn_blocking(move || engine.shutdown())
        .await
        .map_err(std::io::Error::other)
}

/// How long connections may stay open once every request is done (a client that sends
/// half a request, say) before the process stops anyway.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Waits for the requests in flight, aborting them after `--drain-timeout`.
async fn drain(engine: &Engine) {
    let timeout = engine.config().drain_timeout;
    if !engine.wait_idle(timeout).await {
        tracing::warn!(
            in_flight = engine.in_flight(),
            ?timeout,
            "drain timeout: aborting the rest"
        );
        engine.abort_all();
        engine.wait_idle(Duration::from_secs(10)).await;
    }
    tracing::info!("drained");
}

/// Middleware: from the shutdown signal on, every HTTP/1 response carries `Connection:
/// close`, so hyper closes the connection after it and the client's next request opens a
/// new one, which the Service sends to another replica. (HTTP/2 has no such header; its
/// connections get a GOAWAY when the drain starts.)
async fn close_when_shutting_down(
    State(engine): State<Engine>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let http1 = req.version() <= axum::http::Version::HTTP_11;
    let mut resp = next.run(req).await;
    if http1 && engine.shutdown_phase() != ShutdownPhase::Running {
        resp.headers_mut().insert(
            header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    resp
}

async fn completions(State(engine): State<Engine>, headers: HeaderMap, body: Body) -> Response {
    respond(&engine, &headers, body, Endpoint::Completions).await
}

async fn chat_completions(
    State(engine): State<Engine>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(&engine, &headers, body, Endpoint::Chat).await
}

/// Reads a request body whole: at most [`MAX_BODY_BYTES`] (413 beyond, at once when the
/// declared length is over), within `timeout` of the handler's start (408 after it, so a
/// client trickling its body cannot hold a connection and a task for ever).
async fn read_body(body: Body, timeout: Duration) -> Result<Bytes, ApiError> {
    ballast_serve::read_body(body, MAX_BODY_BYTES, timeout)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge(max) => ApiError::too_large(max),
            BodyError::Timeout(d) => ApiError::body_timeout(d),
            BodyError::Read(_) => ApiError::malformed(e.to_string()),
        })
}

async fn respond(engine: &Engine, headers: &HeaderMap, body: Body, endpoint: Endpoint) -> Response {
    let body = read_body(body, engine.config().http.body_timeout).await;
    // Arrival is stamped before parsing and tokenization, as the metrics contract requires.
    let arrival = (std::time::SystemTime::now(), std::time::Instant::now());
    let mut job = match prepare(engine, headers, body, endpoint, arrival) {
        Ok(job) => job,
        Err(e) => return e.into_response(),
    };
    job.trace = engine.tracing_enabled().then(|| {
        let incoming = headers.get("traceparent").and_then(|v| v.to_str().ok());
        TraceContext::from_traceparent(incoming)
    });
    let traceparent = job.trace.map(|t| t.traceparent());
    let mut resp = respond_job(engine, job).await;
    if let Some(tp) = traceparent.and_then(|t| axum::http::HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert("traceparent", tp);
    }
    resp
}

async fn respond_job(engine: &Engine, job: Job) -> Response {
    if job.params.stream {
        match generate::stream_events(engine, job) {
            Ok(events) => Sse::new(events)
                .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
                .into_response(),
            Err(e) => e.into_response(),
        }
    } else {
        match generate::complete(engine, job).await {
            Ok(body) => Json(body).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

/// Validates a request body into a job, or the error to answer with.
fn prepare(
    engine: &Engine,
    headers: &HeaderMap,
    body: Result<Bytes, ApiError>,
    endpoint: Endpoint,
    arrival: (std::time::SystemTime, std::time::Instant),
) -> Result<Job, ApiError> {
    if engine.is_draining() {
        return Err(ApiError::unavailable(
            "the server is draining and accepts no new requests",
            "draining",
        ));
    }
    let body = body?;
    let f = Fields::parse(&body)?;
    let cfg = engine.config();
    let served = cfg.served_model_name.as_str();
    let model = match f.get::<String>("model")? {
        Some(m) if m != served => return Err(ApiError::unknown_model(&m)),
        _ => served.to_string(),
    };
    let tok = engine.tokenizer();
    let (params, prompts, prefix) = match endpoint {
        Endpoint::Completions => {
            let params = parse_gen_params(&f, &["max_tokens"])?;
            let prompts = parse_prompts(&f)?
                .into_iter()
                .map(|p| match p {
                    PromptInput::Text(t) => Ok(tok.encode(&t, true)),
                    PromptInput::Tokens(ids) => {
                        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= tok.vocab_size()) {
                            return Err(ApiError::invalid(
                                "prompt",
                                format!(
                                    "token id {bad} is out of range (vocabulary size {})",
                                    tok.vocab_size()
                                ),
                            ));
                        }
                        if ids.is_empty() {
                            return Err(ApiError::invalid(
                                "prompt",
                                "a prompt must have at least one token",
                            ));
                        }
                        Ok(ids)
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            (params, prompts, "cmpl")
        }
        Endpoint::Chat => {
            let params = parse_gen_params(&f, &["max_completion_tokens", "max_tokens"])?;
            let messages = parse_messages(&f)?;
            // A template may refuse a conversation (raise_exception): the client's error.
            let prompt = tok
                .try_apply_chat_template(&messages)
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
            // The rendered prompt already has whatever special tokens the template writes
            // (vLLM adds none either), so no BOS is added to it.
            (params, vec![tok.encode(&prompt, false)], "chatcmpl")
        }
    };
    let choices = prompts.len() * params.n;
    if choices > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!(
                "at most {MAX_CHOICES} sequences per request (prompts × n), got {} × {} = {choices}",
                prompts.len(),
                params.n
            ),
        ));
    }
    if let Some(&bad) = params
        .stop_token_ids
        .iter()
        .find(|&&t| t as usize >= tok.vocab_size())
    {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!(
                "token id {bad} is out of range (vocabulary size {})",
                tok.vocab_size()
            ),
        ));
    }
    let max_len = cfg.max_model_len();
    let prompt_param = match endpoint {
        Endpoint::Completions => "prompt",
        Endpoint::Chat => "messages",
    };
    let max_tokens = prompts
        .iter()
        .map(|p| {
            if p.len() >= max_len {
                return Err(ApiError::context_length(prompt_param, format!(
                    "This model's maximum context length is {max_len} tokens, and the prompt has {} tokens.",
                    p.len()
                )));
            }
            let want = params.max_tokens.unwrap_or(match endpoint {
                // OpenAI's completions default; chat defaults to the rest of the context.
                Endpoint::Completions => 16,
                Endpoint::Chat => (max_len - p.len()) as u32,
            });
            if p.len() + want as usize > max_len {
                return Err(ApiError::context_length(prompt_param, format!(
                    "This model's maximum context length is {max_len} tokens. However, you requested {} tokens ({} in the prompt, {want} for the completion).",
                    p.len() + want as usize,
                    p.len()
                )));
            }
            if params.min_tokens > want {
                return Err(ApiError::invalid(
                    "min_tokens",
                    format!("`min_tokens` ({}) must not exceed `max_tokens` ({want})", params.min_tokens),
                ));
            }
            Ok(want)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tenant = match headers.get("x-tenant") {
        Some(v) => {
            let t = v.to_str().map_err(|_| {
                ApiError::invalid("x-tenant", "header x-tenant must be visible ASCII")
            })?;
            if t.is_empty() || t.len() > MAX_TENANT_LEN {
                return Err(ApiError::invalid(
                    "x-tenant",
                    format!("header x-tenant must have 1 to {MAX_TENANT_LEN} bytes"),
                ));
            }
            Some(t.into())
        }
        None => params.user.as_deref().map(Into::into),
    };
    let rank = data_parallel_rank(headers, cfg.data_parallel_size)?;
    let nonce = unix_now();
    Ok(Job {
        endpoint,
        model,
        id: format!("{prefix}-{nonce:x}{:08x}", rand_suffix()),
        created: nonce,
        prompts,
        max_tokens,
        params,
        tenant,
        arrival,
        trace: None,
        rank,
    })
}

/// The header vLLM and SGLang take a data-parallel rank from, which a gateway that picks
/// ranks sends.
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";

/// The rank `X-Data-Parallel-Rank` asks for: an integer in `0..ranks`, else a 400.
fn data_parallel_rank(headers: &HeaderMap, ranks: usize) -> Result<Option<usize>, ApiError> {
    let Some(v) = headers.get(DP_RANK_HEADER) else {
        return Ok(None);
    };
    match v.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(rank) if rank < ranks => Ok(Some(rank)),
        _ => Err(ApiError::invalid(
            "X-Data-Parallel-Rank",
            format!(
                "header X-Data-Parallel-Rank must be a rank of this engine, 0 to {} ({ranks} data-parallel ranks)",
                ranks - 1
            ),
        )),
    }
}

/// A per-process counter mixed into response ids so they do not repeat within a second.
fn rand_suffix() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9E37_79B9)
}

async fn models(State(engine): State<Engine>) -> Json<serde_json::Value> {
    let cfg = engine.config();
    Json(json!({
        "object": "list",
        "data": [{
            "id": cfg.served_model_name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "ballast",
            "root": match &cfg.source {
                crate::compute::model::ModelSource::Gguf { path, .. }
                | crate::compute::model::ModelSource::Safetensors { path, .. } => {
                    path.display().to_string()
                }
                crate::compute::model::ModelSource::Synthetic => cfg.model.name.clone(),
            },
            "max_model_len": cfg.max_model_len(),
        }],
    }))
}

async fn health(State(engine): State<Engine>) -> Response {
    if engine.shutdown_phase() == ShutdownPhase::Delaying {
        ApiError::unavailable(
            "terminating: the shutdown signal came; requests are still served until the shutdown delay ends, then it drains",
            "terminating",
        )
        .into_response()
    } else if engine.is_draining() {
        ApiError::unavailable("draining", "draining").into_response()
    } else if !engine.core_alive() {
        ApiError::unavailable("the engine core stopped", "engine_stopped").into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics(State(engine): State<Engine>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        engine.metrics().render(),
    )
        .into_response()
}
