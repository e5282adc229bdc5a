//! HTTP metrics of the frontend: requests by route template, method and status, and their
//! duration until the response body ended (streams included). `/health` and `/metrics`
//! are excluded so probes and scrapes do not drown the API traffic.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::runtime::engine::Engine;
use crate::telemetry::metrics::EngineMetrics;

/// Routes never counted.
const EXCLUDED: [&str; 2] = ["/health", "/metrics"];

/// Middleware: counts the request when its response body is done (or dropped).
pub async fn track(State(engine): State<Engine>, req: Request, next: Next) -> Response {
    // The route template, never the raw path: bounded label values.
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    if EXCLUDED.contains(&endpoint.as_str()) {
        return next.run(req).await;
    }
    let method = req.method().as_str().to_string();
    let start = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    let (parts, body) = resp.into_parts();
    let timed = TimedBody {
        inner: body,
        done: Some(Done {
            metrics: Arc::clone(engine.metrics_arc()),
            endpoint,
            method,
            status,
            start,
        }),
    };
    Response::from_parts(parts, Body::new(timed))
}

struct Done {
    metrics: Arc<EngineMetrics>,
    endpoint: String,
    method: String,
    status: u16,
    start: Instant,
}

/// A body that records its request once, when it ends or is dropped.
struct TimedBody {
    inner: Body,
    done: Option<Done>,
}

impl TimedBody {
    fn finish(&mut self) {
        if let Some(d) = self.done.take() {
            d.metrics.observe_http(
                &d.endpoint,
                &d.method,
                d.status,
                d.start.elapsed().as_secs_f64(),
            );
        }
    }
}

impl HttpBody for TimedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(poll, Poll::Ready(None)) {
            self.finish();
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        self.finish();
    }
}
