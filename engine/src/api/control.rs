//! The engine control API (tonic gRPC, `--grpc-port`): stats snapshots and a stats stream
//! for the operator, DP dispatch weights, drain and resume of admission, and prefix-cache
//! reset. The .proto lives in `engine/proto/` and is compiled by protox in build.rs.
//!
//! With `--control-token-file` every call must carry `authorization: Bearer TOKEN` with one
//! of the file's tokens ([`ControlAuth`]); without it the API is open and the engine says so
//! in its log at start.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::Stream;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::api::http::auth::{KeyRing, Refusal};
use crate::runtime::engine::Engine;

/// Generated protobuf types and gRPC stubs.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("ballast.control.v1");
}

use proto::engine_control_server::{EngineControl, EngineControlServer};

/// The gRPC service over an engine.
pub struct ControlService {
    engine: Engine,
}

impl ControlService {
    /// The service behind its token check ([`ControlAuth`], from the engine's
    /// `--control-token-file`), ready to add to a tonic server. Inside a Tokio runtime the
    /// token file is re-read while the service lives.
    pub fn server(engine: Engine) -> InterceptedService<EngineControlServer<Self>, ControlAuth> {
        let auth = ControlAuth::new(&engine);
        EngineControlServer::with_interceptor(Self { engine }, auth)
    }
}

/// The control API's token check: with `--control-token-file`, a call without
/// `authorization: Bearer TOKEN` metadata naming one of the file's tokens is refused as
/// `UNAUTHENTICATED` before it reaches the service, and counted in
/// `ballast_control_requests_refused_total` by reason. Tokens are compared in constant time
/// and never logged or echoed.
#[derive(Clone)]
pub struct ControlAuth {
    /// `None`: the API is open.
    tokens: Option<Arc<KeyRing>>,
    engine: Engine,
}

impl ControlAuth {
    /// The check of `engine`'s configuration. Logs a warning when the API is open.
    pub fn new(engine: &Engine) -> Self {
        let tokens = KeyRing::new(&engine.config().control_tokens, "control token file");
        if tokens.is_none() {
            tracing::warn!(
                "the control API is open: anyone who reaches --grpc-port can drain this engine \
                 or change its DP weights; give --control-token-file to require a token"
            );
        }
        Self {
            tokens,
            engine: engine.clone(),
        }
    }

    /// Whether a call with this metadata may go on.
    pub fn check(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Refusal> {
        let Some(tokens) = &self.tokens else {
            return Ok(());
        };
        let mut values = metadata.get_all("authorization").iter();
        let first = values.next();
        tokens.check(first.map(|v| v.as_bytes()), values.next().is_some())
    }
}

impl Interceptor for ControlAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match self.check(req.metadata()) {
            Ok(()) => Ok(req),
            Err(refusal) => {
                self.engine
                    .metrics()
                    .observe_control_refusal(refusal.label());
                let message = match refusal {
                    Refusal::Missing => {
                        "missing control token: send `authorization: Bearer TOKEN` metadata"
                    }
                    Refusal::Malformed => {
                        "malformed authorization metadata: expected `Bearer TOKEN`"
                    }
                    Refusal::Wrong => "invalid control token",
                };
                Err(Status::unauthenticated(message))
            }
        }
    }
}

fn snapshot(engine: &Engine) -> proto::StatsSnapshot {
    let weights = engine.dispatcher().weights();
    let outstanding = engine.dispatcher().outstanding();
    let queued = engine.admission().queued();
    let ranks = engine
        .control_board()
        .ranks()
        .into_iter()
        .enumerate()
        .map(|(rank, r)| proto::RankStats {
            rank: rank as u32,
            running: r.snapshot.running,
            waiting_capacity: r.snapshot.waiting_capacity,
            waiting_deferred: r.snapshot.waiting_deferred,
            kv_usage: r.snapshot.kv_usage,
            kv_blocks_used: r.snapshot.kv_blocks.used as u64,
            kv_blocks_evictable: r.snapshot.kv_blocks.evictable as u64,
            kv_blocks_total: r.snapshot.kv_blocks.total as u64,
            dispatch_weight: weights[rank],
            outstanding_tokens: outstanding[rank],
            tokens_scheduled: r.tokens_scheduled,
        })
        .collect();
    proto::StatsSnapshot {
        model_name: engine.config().served_model_name.clone(),
        ranks,
        draining: engine.is_draining(),
        in_flight: engine.in_flight() as u64,
        queued_requests: queued.requests as u64,
        queued_tokens: queued.tokens as u64,
        unix_ms: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<proto::StatsSnapshot, Status>> + Send>>;

#[tonic::async_trait]
impl EngineControl for ControlService {
    async fn get_stats(
        &self,
        _: Request<proto::GetStatsRequest>,
    ) -> Result<Response<proto::StatsSnapshot>, Status> {
        Ok(Response::new(snapshot(&self.engine)))
    }

    type StreamStatsStream = SnapshotStream;

    async fn stream_stats(
        &self,
        req: Request<proto::StreamStatsRequest>,
    ) -> Result<Response<Self::StreamStatsStream>, Status> {
        let every = Duration::from_millis(req.into_inner().interval_ms.max(50) as u64);
        let engine = self.engine.clone();
        let stream = futures::stream::unfold(tokio::time::interval(every), move |mut tick| {
            let engine = engine.clone();
            async move {
                tick.tick().await;
                Some((Ok(snapshot(&engine)), tick))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn set_dp_weights(
        &self,
        req: Request<proto::SetDpWeightsRequest>,
    ) -> Result<Response<proto::SetDpWeightsResponse>, Status> {
        let weights = req.into_inner().weights;
        self.engine
            .dispatcher()
            .set_weights(&weights)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(proto::SetDpWeightsResponse {
            weights: self.engine.dispatcher().weights(),
        }))
    }

    async fn drain(
        &self,
        _: Request<proto::DrainRequest>,
    ) -> Result<Response<proto::DrainResponse>, Status> {
        self.engine.begin_drain();
        Ok(Response::new(proto::DrainResponse {
            in_flight: self.engine.in_flight() as u64,
        }))
    }

    async fn resume(
        &self,
        _: Request<proto::ResumeRequest>,
    ) -> Result<Response<proto::ResumeResponse>, Status> {
        self.engine.resume();
        Ok(Response::new(proto::ResumeResponse {}))
    }

    async fn reset_prefix_cache(
        &self,
        _: Request<proto::ResetPrefixCacheRequest>,
    ) -> Result<Response<proto::ResetPrefixCacheResponse>, Status> {
        let engine = self.engine.clone();
        // Ranks answer between steps; waiting for them must not block a runtime thread.
        let ok = tokio::task::spawn_blocking(move || engine.reset_prefix_cache())
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(proto::ResetPrefixCacheResponse { ok }))
    }
}
