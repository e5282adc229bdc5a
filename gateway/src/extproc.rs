//! Envoy's `ext_proc` protocol as the Gateway API Inference Extension's endpoint picker
//! speaks it: one gRPC stream per HTTP request.
//!
//! With the request body in `FULL_DUPLEX_STREAMED` mode (and request trailers `SEND`, which
//! that mode requires) a stream goes:
//!
//! ```text
//! Envoy ─ request_headers ─▶ kept (the subset hint read)
//!       ─ request_body …  ─▶ buffered, capped (413 past --max-body-bytes)
//!       ─ last chunk / trailers ─▶ read `model`, pick an endpoint
//!       ◀─ headers response: x-gateway-destination-endpoint (and envoy.lb metadata),
//!          clear_route_cache
//!       ◀─ the body again, in StreamedBodyResponse chunks of ≤ 62,000 bytes
//!       ─ response_headers / response_body … (when Envoy sends them) ─▶ passed on
//! ```
//!
//! A request the gateway does not route gets an `ImmediateResponse` with an OpenAI-shaped
//! JSON error (400, 404, 413, 503) and the stream ends. A request with no body (a `GET`) is
//! routed at its headers. The request counts in flight on its endpoint until its response
//! ends (Envoy sends response messages) or the stream closes (it does not), whichever comes
//! first.
//!
//! The protocol itself is [`Exchange`], a plain state machine from each message Envoy sends
//! to the messages to answer, so it is tested without gRPC; [`Processor`] runs one per
//! stream.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3 as ep;
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use ep::external_processor_server::ExternalProcessor;
use ep::processing_request::Request as In;
use ep::processing_response::Response as Out;
use ep::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpBody,
    HttpHeaders, ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse,
    TrailersResponse, body_mutation,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::metrics::GatewayMetrics;
use crate::openai::{self, Refusal};
use crate::pool::{InFlight, NoPick, Pool};
use crate::prefix::{self, Blocking};

/// The header (and `envoy.lb` metadata key) that names the picked endpoint, `ip:port`.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The dynamic metadata namespace the destination is written to.
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// The metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The request header naming the data-parallel rank picked within the endpoint, as vLLM,
/// SGLang and ballast engines read it. A client's own value is replaced when the gateway
/// picks the rank, and kept when it does not.
pub const DP_RANK: &str = "x-data-parallel-rank";
/// The subset hint's key (in [`SUBSET_NAMESPACE`]) and header: the endpoints the request
/// may go to.
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// The largest body chunk sent back to Envoy: below gRPC's default 64 KiB message size
/// with the message's own framing.
pub const MAX_CHUNK: usize = 62_000;

/// How the gateway answers, whatever the pool.
#[derive(Debug, Clone)]
pub struct ProcessorConfig {
    /// The largest request body routed; 413 past it.
    pub max_body_bytes: usize,
    /// The model names the pool serves; empty: any (the engines answer for themselves).
    pub models: Vec<String>,
    /// `Retry-After` of a 503 for want of an endpoint, and of a 429 when shedding, in
    /// seconds.
    pub retry_after_secs: u32,
    /// The request header that carries a priority (an integer, 0 when absent); a negative
    /// one is sheddable.
    pub priority_header: String,
    /// Most requests held in the gateway while the pool is saturated; past it, requests
    /// are sent on at once.
    pub queue_max: usize,
    /// Longest a request is held; then it is sent on, saturated or not.
    pub queue_timeout: Duration,
    /// How prompts are cut into blocks for prefix affinity.
    pub blocking: Blocking,
    /// Most requests held while the pool has no endpoint at all (a fleet scaled to zero,
    /// or not up yet); past it, 503 with `Retry-After`.
    pub hold_max: usize,
    /// Most request-body bytes held, over those requests; past it, 503.
    pub hold_max_bytes: usize,
    /// Longest a request is held for want of any endpoint; then 503.
    pub hold_timeout: Duration,
}

/// What every stream shares.
#[derive(Debug)]
pub struct Shared {
    /// The endpoints and the picker.
    pub pool: Arc<Pool>,
    /// How to answer.
    pub config: ProcessorConfig,
    /// The gateway's metrics.
    pub metrics: Arc<GatewayMetrics>,
    /// Requests held now, for either reason.
    pub held: AtomicUsize,
    /// Requests held now for want of any endpoint, and their body bytes.
    held_empty: AtomicUsize,
    held_bytes: AtomicUsize,
    /// When each held request was held, by a number of its own: the oldest hold's age is
    /// demand the operator reads (`ballast_gateway_oldest_hold_seconds`).
    holds: Mutex<BTreeSet<(Instant, u64)>>,
    next_hold: AtomicU64,
}

impl Shared {
    /// What every stream shares, with nothing held yet.
    pub fn new(pool: Arc<Pool>, config: ProcessorConfig, metrics: Arc<GatewayMetrics>) -> Shared {
        Shared {
            pool,
            config,
            metrics,
            held: AtomicUsize::new(0),
            held_empty: AtomicUsize::new(0),
            held_bytes: AtomicUsize::new(0),
            holds: Mutex::new(BTreeSet::new()),
            next_hold: AtomicU64::new(0),
        }
    }

    /// When the longest-held request still held was held; `None` when none is.
    pub fn oldest_hold(&self) -> Option<Instant> {
        let holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.first().map(|(at, _)| *at)
    }

    fn start_hold(&self, at: Instant) -> u64 {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.insert((at, id));
        id
    }

    fn end_hold(&self, at: Instant, id: u64) {
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.remove(&(at, id));
    }
}

/// The `envoy.service.ext_proc.v3.ExternalProcessor` service.
#[derive(Debug, Clone)]
pub struct Processor {
    shared: Arc<Shared>,
}

impl Processor {
    /// A processor over `shared`.
    pub fn new(shared: Arc<Shared>) -> Processor {
        Processor { shared }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(run_stream(Arc::clone(&self.shared), inbound, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One stream: Envoy's messages through an [`Exchange`] until either side ends it.
async fn run_stream(
    shared: Arc<Shared>,
    mut inbound: Streaming<ProcessingRequest>,
    tx: mpsc::Sender<Result<ProcessingResponse, Status>>,
) {
    let mut exchange = Exchange::new(&shared);
    let outcome = loop {
        let message = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break exchange.closed(),
            Err(status) => {
                tracing::debug!(%status, "ext_proc stream reset by the data plane");
                break "error";
            }
        };
        let mut step = exchange.on(message);
        if step.hold {
            match hold(&shared, &mut exchange, &mut inbound).await {
                Some(released) => step = released,
                None => break exchange.closed(),
            }
        }
        let mut gone = false;
        for reply in step.replies {
            if tx.send(Ok(reply)).await.is_err() {
                gone = true;
                break;
            }
        }
        if gone {
            break "error";
        }
        if step.done {
            break exchange.outcome();
        }
    };
    shared.metrics.streams.with_label_values(&[outcome]).inc();
}

/// Holds a request while the pool stays saturated, at most `--queue-timeout-ms`, then
/// picks. `None` when the stream ended meanwhile (the client went away).
async fn hold(
    shared: &Shared,
    exchange: &mut Exchange<'_>,
    inbound: &mut Streaming<ProcessingRequest>,
) -> Option<Step> {
    let empty = exchange.held_for_empty();
    let timeout = if empty {
        shared.config.hold_timeout
    } else {
        shared.config.queue_timeout
    };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        // Registered before the check, so a change between the two is not missed.
        let changed = shared.pool.changed().notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        let waiting = if empty {
            shared.pool.is_empty()
        } else {
            shared.pool.saturated(exchange.subset(), Instant::now())
        };
        if !waiting {
            break;
        }
        tokio::select! {
            _ = &mut changed => {}
            _ = tokio::time::sleep_until(deadline) => {
                if empty {
                    return Some(exchange.expire(Instant::now()));
                }
                break;
            }
            message = inbound.message() => match message {
                // Nothing else is expected before the answer; what comes changes nothing.
                Ok(Some(m)) => {
                    exchange.on(m);
                }
                Ok(None) | Err(_) => return None,
            },
        }
    }
    Some(exchange.release(Instant::now()))
}

/// Where a stream is.
#[derive(Debug)]
enum Phase {
    /// Waiting for the request headers.
    Headers,
    /// Buffering the request body.
    Body,
    /// Read and valid, held while the pool is saturated.
    Held,
    /// Routed: the request is on its way; response messages are passed on.
    Routed,
    /// Answered by the gateway itself; nothing more to do.
    Refused,
}

/// What to send back for one message, and whether the stream is over for the gateway.
#[derive(Debug, Default)]
pub struct Step {
    /// The messages to send, in order.
    pub replies: Vec<ProcessingResponse>,
    /// Whether to end the stream after them.
    pub done: bool,
    /// Whether the request is held: nothing to send until [`Exchange::release`].
    pub hold: bool,
}

/// One request's conversation with Envoy.
#[derive(Debug)]
pub struct Exchange<'a> {
    shared: &'a Shared,
    phase: Phase,
    /// The endpoints the request may go to, from its subset hint.
    subset: Option<Vec<SocketAddr>>,
    body: Vec<u8>,
    /// The request on its endpoint, from the pick until the response ends.
    in_flight: Option<InFlight>,
    /// Its priority; negative is sheddable.
    priority: i64,
    /// A held request's body and whether it had trailers, and when it was held.
    held: Option<(Option<Vec<u8>>, bool, Instant)>,
    /// Its entry in [`Shared`]'s holds while held.
    hold: Option<(Instant, u64)>,
    /// Held for want of any endpoint (not for saturation): the body bytes it holds.
    empty_hold: Option<usize>,
    /// The block hashes of its prompt (empty: none read).
    prompt: Vec<u64>,
}

impl<'a> Exchange<'a> {
    /// A new stream's exchange.
    pub fn new(shared: &'a Shared) -> Exchange<'a> {
        Exchange {
            shared,
            phase: Phase::Headers,
            subset: None,
            body: Vec::new(),
            in_flight: None,
            priority: 0,
            held: None,
            hold: None,
            empty_hold: None,
            prompt: Vec::new(),
        }
    }

    /// The endpoints the request may go to, when its subset hint says.
    pub fn subset(&self) -> Option<&[SocketAddr]> {
        self.subset.as_deref()
    }

    /// The answer to one message from Envoy.
    pub fn on(&mut self, message: ProcessingRequest) -> Step {
        let Some(request) = message.request else {
            return Step::default();
        };
        match (&self.phase, request) {
            (Phase::Headers, In::RequestHeaders(h)) => {
                self.subset = subset_hint(message.metadata_context.as_ref(), &h);
                match priority(&h, &self.shared.config.priority_header) {
                    Ok(p) => self.priority = p,
                    Err(refusal) => return self.refuse(refusal, Instant::now()),
                }
                if h.end_of_stream {
                    // No body (a GET): route on the headers alone.
                    return self.route(None, false, Instant::now());
                }
                self.phase = Phase::Body;
                Step::default()
            }
            (Phase::Body, In::RequestBody(b)) => self.on_body(b),
            (Phase::Body, In::RequestTrailers(_)) => {
                let body = std::mem::take(&mut self.body);
                self.route(Some(body), true, Instant::now())
            }
            (Phase::Routed, In::ResponseHeaders(h)) => {
                let eos = h.end_of_stream;
                if header_value(&h, ":status") == Some(b"429")
                    && let Some(f) = &self.in_flight
                {
                    f.state().observe_429(Instant::now());
                }
                self.response_ended_if(eos);
                Step {
                    replies: vec![reply(Out::ResponseHeaders(HeadersResponse::default()))],
                    ..Step::default()
                }
            }
            (Phase::Routed, In::ResponseBody(b)) => {
                self.response_ended_if(b.end_of_stream);
                Step {
                    replies: body_replies(&b.body, b.end_of_stream, Out::ResponseBody),
                    ..Step::default()
                }
            }
            (Phase::Routed, In::ResponseTrailers(_)) => {
                self.response_ended_if(true);
                Step {
                    replies: vec![reply(Out::ResponseTrailers(TrailersResponse::default()))],
                    ..Step::default()
                }
            }
            // After a refusal Envoy may still send what it had buffered; out-of-order
            // messages change nothing.
            (phase, other) => {
                if !matches!(phase, Phase::Refused | Phase::Held) {
                    tracing::debug!(
                        ?phase,
                        message = kind(&other),
                        "unexpected ext_proc message"
                    );
                }
                Step::default()
            }
        }
    }

    /// The stream closed by Envoy: how it ended.
    pub fn closed(&mut self) -> &'static str {
        self.response_ended_if(true);
        match self.phase {
            Phase::Headers | Phase::Body => "ended_early",
            Phase::Held => "abandoned",
            Phase::Routed => "routed",
            Phase::Refused => "refused",
        }
    }

    /// How the stream ended, when the gateway ends it.
    fn outcome(&self) -> &'static str {
        match self.phase {
            Phase::Refused => "refused",
            Phase::Routed => "routed",
            Phase::Held => "abandoned",
            Phase::Headers | Phase::Body => "ended_early",
        }
    }

    fn on_body(&mut self, b: HttpBody) -> Step {
        let max = self.shared.config.max_body_bytes;
        if self.body.len() + b.body.len() > max {
            self.body = Vec::new();
            return self.refuse(Refusal::too_large(max), Instant::now());
        }
        self.body.extend_from_slice(&b.body);
        if !b.end_of_stream {
            return Step::default();
        }
        let body = std::mem::take(&mut self.body);
        self.route(Some(body), false, Instant::now())
    }

    /// The request read whole: checked, then sent on, shed or held.
    fn route(&mut self, body: Option<Vec<u8>>, trailers: bool, started: Instant) -> Step {
        let config = &self.shared.config;
        if let Some(body) = &body {
            let routing = match openai::read(body) {
                Ok(r) => r,
                Err(refusal) => return self.refuse(refusal, started),
            };
            if let Some(model) = &routing.model
                && !config.models.is_empty()
                && !config.models.contains(model)
            {
                return self.refuse(Refusal::unknown_model(model, &config.models), started);
            }
            self.prompt =
                prefix::block_hashes(routing.model.as_deref(), &routing.prompt, config.blocking);
        }
        if self.shared.pool.is_empty() {
            return self.hold_for_empty(body, trailers, started);
        }
        if !self.shared.pool.saturated(self.subset(), started) {
            return self.pick(body, trailers, started, false);
        }
        if self.priority < 0 {
            return self.refuse(Refusal::shed(config.retry_after_secs), started);
        }
        let held = &self.shared.held;
        let room = held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < config.queue_max).then_some(n + 1)
            })
            .is_ok();
        if !room {
            return self.pick(body, trailers, started, true);
        }
        self.shared.metrics.queue_length.inc();
        self.hold = Some((started, self.shared.start_hold(started)));
        self.phase = Phase::Held;
        self.held = Some((body, trailers, started));
        Step {
            hold: true,
            ..Step::default()
        }
    }

    /// A request that finds no endpoint at all: held (the pool may be scaling from zero)
    /// within `--hold-max` requests and `--hold-max-bytes`, else 503 with `Retry-After`.
    fn hold_for_empty(&mut self, body: Option<Vec<u8>>, trailers: bool, started: Instant) -> Step {
        let config = &self.shared.config;
        let bytes = body.as_ref().map_or(0, Vec::len);
        let count_ok = self
            .shared
            .held_empty
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < config.hold_max).then_some(n + 1)
            })
            .is_ok();
        let bytes_ok = count_ok
            && self
                .shared
                .held_bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n + bytes <= config.hold_max_bytes).then_some(n + bytes)
                })
                .is_ok();
        if !bytes_ok {
            if count_ok {
                self.shared.held_empty.fetch_sub(1, Ordering::Relaxed);
            }
            let r = Refusal::no_endpoint(
                "hold_full",
                "no endpoint is ready and the gateway holds as many requests as it may; retry later",
                config.retry_after_secs,
            );
            return self.refuse(r, started);
        }
        self.shared.held.fetch_add(1, Ordering::Relaxed);
        self.shared.metrics.queue_length.inc();
        self.hold = Some((started, self.shared.start_hold(started)));
        self.empty_hold = Some(bytes);
        self.phase = Phase::Held;
        self.held = Some((body, trailers, started));
        Step {
            hold: true,
            ..Step::default()
        }
    }

    /// Whether the request is held for want of any endpoint (not for saturation).
    pub fn held_for_empty(&self) -> bool {
        self.empty_hold.is_some()
    }

    /// A request held for want of any endpoint that waited `--hold-timeout-ms`: 503.
    pub fn expire(&mut self, now: Instant) -> Step {
        let Some((_, _, held_at)) = self.held.take() else {
            return Step::default();
        };
        self.unhold();
        let r = Refusal::no_endpoint(
            "hold_timeout",
            "no endpoint became ready while the request was held; retry later",
            self.shared.config.retry_after_secs,
        );
        self.refuse(r, held_at.min(now))
    }

    /// A held request sent on: the pool is no longer saturated, or it waited its longest.
    pub fn release(&mut self, now: Instant) -> Step {
        let Some((body, trailers, held_at)) = self.held.take() else {
            return Step::default();
        };
        let saturated = !self.held_for_empty();
        self.unhold();
        self.shared
            .metrics
            .queue_wait
            .observe(now.saturating_duration_since(held_at).as_secs_f64());
        self.pick(body, trailers, now, saturated)
    }

    fn unhold(&mut self) {
        if let Some((at, id)) = self.hold.take() {
            self.shared.end_hold(at, id);
        }
        if let Some(bytes) = self.empty_hold.take() {
            self.shared.held_empty.fetch_sub(1, Ordering::Relaxed);
            self.shared.held_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        self.shared.held.fetch_sub(1, Ordering::Relaxed);
        self.shared.metrics.queue_length.dec();
    }

    /// The pick, and the messages that send the request on (or refuse it).
    fn pick(
        &mut self,
        body: Option<Vec<u8>>,
        trailers: bool,
        started: Instant,
        saturated: bool,
    ) -> Step {
        let config = &self.shared.config;
        let picked = match self.shared.pool.pick(
            self.subset.as_deref(),
            Instant::now(),
            saturated,
            &self.prompt,
        ) {
            Ok(p) => p,
            Err(NoPick::Empty) => {
                let r = Refusal::no_endpoint(
                    "no_endpoints",
                    "no endpoint is ready to serve this request",
                    config.retry_after_secs,
                );
                return self.refuse(r, started);
            }
            Err(NoPick::NotInSubset) => {
                let r = Refusal::no_endpoint(
                    "no_endpoint_in_subset",
                    "no endpoint of the request's subset hint is in the pool",
                    config.retry_after_secs,
                );
                return self.refuse(r, started);
            }
        };
        let metrics = &self.shared.metrics;
        let addr = picked.endpoint().addr.to_string();
        metrics
            .picks
            .with_label_values(&[picked.endpoint().name.as_str(), picked.reason.as_str()])
            .inc();
        let mut set_headers = vec![header(DESTINATION, &addr)];
        if let Some(rank) = picked.rank {
            set_headers.push(header(DP_RANK, &rank.to_string()));
            metrics
                .rank_picks
                .with_label_values(&[picked.endpoint().name.as_str(), &rank.to_string()])
                .inc();
        }
        if !self.prompt.is_empty() {
            metrics.prefix_match.observe(picked.prefix);
        }
        metrics.in_flight.inc();
        self.in_flight = Some(picked);
        self.phase = Phase::Routed;

        let mut replies = vec![ProcessingResponse {
            response: Some(Out::RequestHeaders(HeadersResponse {
                response: Some(CommonResponse {
                    header_mutation: Some(HeaderMutation {
                        set_headers,
                        remove_headers: Vec::new(),
                    }),
                    clear_route_cache: true,
                    ..Default::default()
                }),
            })),
            dynamic_metadata: Some(destination_metadata(&addr)),
            ..Default::default()
        }];
        if let Some(body) = body {
            replies.extend(body_replies(&body, !trailers, Out::RequestBody));
        }
        if trailers {
            replies.push(reply(Out::RequestTrailers(TrailersResponse::default())));
        }
        metrics
            .pick_duration
            .with_label_values(&["routed"])
            .observe(started.elapsed().as_secs_f64());
        Step {
            replies,
            ..Step::default()
        }
    }

    fn refuse(&mut self, refusal: Refusal, started: Instant) -> Step {
        self.phase = Phase::Refused;
        let metrics = &self.shared.metrics;
        metrics
            .refusals
            .with_label_values(&[refusal.status.to_string().as_str(), refusal.code])
            .inc();
        metrics
            .pick_duration
            .with_label_values(&["refused"])
            .observe(started.elapsed().as_secs_f64());
        tracing::debug!(
            status = refusal.status,
            code = refusal.code,
            "{}",
            refusal.message
        );
        Step {
            replies: vec![reply(Out::ImmediateResponse(immediate(&refusal)))],
            done: true,
            hold: false,
        }
    }

    fn response_ended_if(&mut self, ended: bool) {
        if ended && self.in_flight.take().is_some() {
            self.shared.metrics.in_flight.dec();
        }
    }
}

impl Drop for Exchange<'_> {
    fn drop(&mut self) {
        if self.in_flight.take().is_some() {
            self.shared.metrics.in_flight.dec();
        }
        if self.held.take().is_some() {
            self.unhold();
        }
    }
}

/// The request's priority from `name` (0 when absent); not an integer is a 400.
fn priority(headers: &HttpHeaders, name: &str) -> Result<i64, Refusal> {
    let Some(raw) = header_value(headers, name) else {
        return Ok(0);
    };
    std::str::from_utf8(raw)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Refusal::bad_header(name, "an integer (negative: sheddable)"))
}

fn kind(r: &In) -> &'static str {
    match r {
        In::RequestHeaders(_) => "request_headers",
        In::ResponseHeaders(_) => "response_headers",
        In::RequestBody(_) => "request_body",
        In::ResponseBody(_) => "response_body",
        In::RequestTrailers(_) => "request_trailers",
        In::ResponseTrailers(_) => "response_trailers",
    }
}

fn reply(response: Out) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// `body` as streamed body responses of at most [`MAX_CHUNK`] bytes; the last carries
/// `end_of_stream`. An empty body that ends the stream is one empty chunk.
fn body_replies(
    body: &[u8],
    end_of_stream: bool,
    wrap: fn(BodyResponse) -> Out,
) -> Vec<ProcessingResponse> {
    let chunks: Vec<&[u8]> = if body.is_empty() {
        vec![&[][..]]
    } else {
        body.chunks(MAX_CHUNK).collect()
    };
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            reply(wrap(BodyResponse {
                response: Some(CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::StreamedResponse(
                            StreamedBodyResponse {
                                body: chunk.to_vec(),
                                end_of_stream: end_of_stream && i == last,
                                ..Default::default()
                            },
                        )),
                    }),
                    ..Default::default()
                }),
            }))
        })
        .collect()
}

fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": addr}}`.
fn destination_metadata(addr: &str) -> Struct {
    let inner = Struct {
        fields: [(DESTINATION.to_string(), string_value(addr))].into(),
    };
    Struct {
        fields: [(
            DESTINATION_NAMESPACE.to_string(),
            Value {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into(),
    }
}

fn immediate(refusal: &Refusal) -> ImmediateResponse {
    let mut set_headers = vec![header("content-type", "application/json")];
    if let Some(secs) = refusal.retry_after {
        set_headers.push(header("retry-after", &secs.to_string()));
    }
    ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(refusal.status),
        }),
        headers: Some(HeaderMutation {
            set_headers,
            remove_headers: Vec::new(),
        }),
        body: refusal.body(),
        details: format!("ballast_gateway_{}", refusal.code),
        ..Default::default()
    }
}

/// A header's value: Envoy sends `raw_value` (bytes), older versions `value`.
fn header_value<'h>(headers: &'h HttpHeaders, name: &str) -> Option<&'h [u8]> {
    headers
        .headers
        .as_ref()?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| {
            if h.raw_value.is_empty() {
                h.value.as_bytes()
            } else {
                h.raw_value.as_slice()
            }
        })
}

/// The request's subset hint, from the `envoy.lb.subset_hint` metadata (a list of
/// `ip:port` strings, or one comma-separated string) or else the header of the same key.
/// `Some(empty)` when a hint is present but names no address: nothing may be picked.
fn subset_hint(
    metadata: Option<&envoy_types::pb::envoy::config::core::v3::Metadata>,
    headers: &HttpHeaders,
) -> Option<Vec<SocketAddr>> {
    let from_metadata = metadata
        .and_then(|m| m.filter_metadata.get(SUBSET_NAMESPACE))
        .and_then(|s| s.fields.get(SUBSET))
        .map(|v| {
            let mut out = Vec::new();
            collect_addrs(v, &mut out);
            out
        });
    from_metadata.or_else(|| {
        let raw = header_value(headers, SUBSET)?;
        Some(parse_addrs(&String::from_utf8_lossy(raw)))
    })
}

fn collect_addrs(v: &Value, out: &mut Vec<SocketAddr>) {
    match &v.kind {
        Some(Kind::StringValue(s)) => out.extend(parse_addrs(s)),
        Some(Kind::ListValue(list)) => list.values.iter().for_each(|v| collect_addrs(v, out)),
        _ => {}
    }
}

fn parse_addrs(s: &str) -> Vec<SocketAddr> {
    s.split(',').filter_map(|a| a.trim().parse().ok()).collect()
}

#[cfg(test)]
mod tests;
