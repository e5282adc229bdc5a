//! KEDA's external scaler (`ballast operator --keda-port`): the gRPC service of KEDA's
//! `externalscaler.proto` (vendored in `proto/keda/`), answering from the same
//! control-period record as the metrics APIs ([`Board`]), so a `ScaledObject` sees the
//! values an HPA on the metrics APIs and `status.lastDecision` see.
//!
//! A ScaledObject names what to read in its `external` trigger's metadata:
//!
//! | key | meaning | default |
//! | --- | --- | --- |
//! | `scalerAddress` | this server (KEDA's own key) | required by KEDA |
//! | `inferenceService` | the InferenceService, in the ScaledObject's namespace | required |
//! | `metric` | one of the metrics APIs' service metrics ([`Metric::SERVICE`]) | `recommended_replicas` |
//! | `target` | the HPA's target for it (`targetSizeFloat`) | `1` |
//!
//! `IsActive` is true while the last period saw requests running or waiting on the
//! service's replicas. With no replica there is nothing to scrape and the service is
//! inactive: waking a service scaled to zero takes a second trigger on a signal that
//! exists without replicas, such as the gateway's request rate (docs/autoscalers.md).
//!
//! Only the leader has records; a standby answers `Unavailable`, and the chart's Service
//! selects the leader alone.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::Stream;
use tonic::{Request, Response, Status};

use crate::metrics_api::values::{Board, Metric, Record};

/// Generated protobuf types, the server trait and the client.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("externalscaler");
}

use proto::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};

/// Trigger metadata key naming the InferenceService.
pub const SERVICE_KEY: &str = "inferenceService";
/// Trigger metadata key naming the metric.
pub const METRIC_KEY: &str = "metric";
/// Trigger metadata key giving the target.
pub const TARGET_KEY: &str = "target";
/// The metric when the trigger names none: the replicas the operator's decision asks for,
/// which with a target of 1 makes the HPA follow the decision.
pub const DEFAULT_METRIC: Metric = Metric::RecommendedReplicas;

/// How often `StreamIsActive` looks at the record; it sends only changes.
const STREAM_EVERY: Duration = Duration::from_secs(1);

/// What a ScaledObject's trigger asks for.
#[derive(Debug, Clone, PartialEq)]
struct Trigger {
    namespace: String,
    service: String,
    metric: Metric,
    target: f64,
}

impl Trigger {
    fn of(r: &ScaledObjectRef) -> Result<Trigger, Status> {
        if r.namespace.is_empty() {
            return Err(Status::invalid_argument(
                "the ScaledObject reference has no namespace",
            ));
        }
        let service = r
            .scaler_metadata
            .get(SERVICE_KEY)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "trigger metadata `{SERVICE_KEY}` is required: the InferenceService to read"
                ))
            })?
            .clone();
        let metric = match r.scaler_metadata.get(METRIC_KEY) {
            None => DEFAULT_METRIC,
            Some(name) => parse_metric(name)?,
        };
        let target = match r.scaler_metadata.get(TARGET_KEY) {
            None => 1.0,
            Some(t) => t
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|t| t.is_finite() && *t > 0.0)
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "trigger metadata `{TARGET_KEY}` must be a number above 0, not {t:?}"
                    ))
                })?,
        };
        Ok(Trigger {
            namespace: r.namespace.clone(),
            service,
            metric,
            target,
        })
    }
}

/// A service metric by name, or an error listing them.
fn parse_metric(name: &str) -> Result<Metric, Status> {
    Metric::SERVICE
        .iter()
        .copied()
        .find(|m| m.as_str() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Metric::SERVICE.iter().map(|m| m.as_str()).collect();
            Status::invalid_argument(format!(
                "unknown metric {name:?}: one of {}",
                names.join(", ")
            ))
        })
}

/// The service: KEDA's calls, answered from `board` while `leading`.
#[derive(Clone)]
pub struct Scaler {
    board: Arc<Board>,
    leading: Arc<AtomicBool>,
}

impl Scaler {
    /// A scaler reading `board`, answering while `leading` is set.
    pub fn new(board: Arc<Board>, leading: Arc<AtomicBool>) -> Scaler {
        Scaler { board, leading }
    }

    /// The trigger's service's fresh record, or why there is none.
    fn record(&self, t: &Trigger) -> Result<Option<Record>, Status> {
        if !self.leading.load(Ordering::SeqCst) {
            return Err(Status::unavailable(
                "this operator replica is not the leader: it has no records",
            ));
        }
        Ok(self.board.get(&t.namespace, &t.service, Instant::now()))
    }

    fn active(&self, t: &Trigger) -> Result<bool, Status> {
        Ok(self
            .record(t)?
            .and_then(|r| r.in_flight)
            .is_some_and(|n| n > 0.0))
    }
}

type ActiveStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;
type SpecStream = Pin<Box<dyn Stream<Item = Result<GetMetricSpecResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Scaler {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let t = Trigger::of(request.get_ref())?;
        Ok(Response::new(IsActiveResponse {
            result: self.active(&t)?,
        }))
    }

    type StreamIsActiveStream = ActiveStream;

    /// The current answer at once, then each change.
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<ActiveStream>, Status> {
        let t = Trigger::of(request.get_ref())?;
        let first = self.active(&t)?;
        let scaler = self.clone();
        let stream = futures::stream::unfold(
            (scaler, t, None::<bool>, first),
            |(scaler, t, sent, mut now)| async move {
                loop {
                    if sent != Some(now) {
                        let item = Ok(IsActiveResponse { result: now });
                        return Some((item, (scaler, t, Some(now), now)));
                    }
                    tokio::time::sleep(STREAM_EVERY).await;
                    now = match scaler.active(&t) {
                        Ok(a) => a,
                        // Leadership lost: end the stream with the reason; KEDA reconnects
                        // through the Service, to the new leader.
                        Err(e) => return Some((Err(e), (scaler, t, None, false))),
                    };
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let t = Trigger::of(request.get_ref())?;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: t.metric.as_str().to_string(),
                // The deprecated integer, for KEDA versions that read only it.
                target_size: t.target.ceil() as i64,
                target_size_float: t.target,
            }],
        }))
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let req = request.get_ref();
        let reference = req.scaled_object_ref.as_ref().ok_or_else(|| {
            Status::invalid_argument("GetMetrics without a ScaledObject reference")
        })?;
        let t = Trigger::of(reference)?;
        let metric = if req.metric_name.is_empty() {
            t.metric
        } else {
            parse_metric(&req.metric_name)?
        };
        let record = self.record(&t)?.ok_or_else(|| {
            Status::not_found(format!(
                "no fresh control period for InferenceService {}/{}: it has no replica that reported, or does not exist",
                t.namespace, t.service
            ))
        })?;
        let value = record.values.get(&metric).copied().ok_or_else(|| {
            Status::not_found(format!(
                "{} is absent for {}/{}: its replicas do not export the family behind it (docs/autoscalers.md)",
                metric.as_str(),
                t.namespace,
                t.service
            ))
        })?;
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: metric.as_str().to_string(),
                metric_value: value.round() as i64,
                metric_value_float: value,
            }],
        }))
    }

    type StreamMetricSpecStream = SpecStream;

    /// Optional in the protocol; KEDA falls back to `GetMetricSpec`, whose answer never
    /// changes for a trigger.
    async fn stream_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<SpecStream>, Status> {
        Err(Status::unimplemented(
            "the metric spec follows the trigger's metadata only: use GetMetricSpec",
        ))
    }
}

/// Serves `scaler` on `listener` until the process ends; returns the bound address.
pub fn serve(listener: tokio::net::TcpListener, scaler: Scaler) -> std::io::Result<SocketAddr> {
    let addr = listener.local_addr()?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(ExternalScalerServer::new(scaler))
            .serve_with_incoming(incoming)
            .await
        {
            tracing::error!(target: "ballast::keda", error = %e, "KEDA's external scaler stopped");
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn reference(meta: &[(&str, &str)]) -> ScaledObjectRef {
        ScaledObjectRef {
            name: "so".into(),
            namespace: "ml".into(),
            scaler_metadata: meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
        }
    }

    #[test]
    fn a_trigger_reads_its_metadata_and_refuses_what_cannot_work() {
        let t = Trigger::of(&reference(&[(SERVICE_KEY, "chat")])).unwrap();
        assert_eq!((t.metric, t.target), (DEFAULT_METRIC, 1.0));
        let t = Trigger::of(&reference(&[
            (SERVICE_KEY, "chat"),
            (METRIC_KEY, "capacity_waiting_per_replica"),
            (TARGET_KEY, "2.5"),
        ]))
        .unwrap();
        assert_eq!(t.metric, Metric::CapacityWaitingPerReplica);
        assert_eq!(t.target, 2.5);
        for (meta, words) in [
            (vec![], "`inferenceService` is required"),
            (
                vec![(SERVICE_KEY, "chat"), (METRIC_KEY, "capacity_waiting")],
                "unknown metric \"capacity_waiting\": one of capacity_waiting_per_replica",
            ),
            (
                vec![(SERVICE_KEY, "chat"), (TARGET_KEY, "0")],
                "must be a number above 0",
            ),
            (
                vec![(SERVICE_KEY, "chat"), (TARGET_KEY, "NaN")],
                "must be a number above 0",
            ),
        ] {
            let e = Trigger::of(&reference(&meta)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{meta:?}");
            assert!(e.message().contains(words), "{meta:?}: {}", e.message());
        }
        let mut no_ns = reference(&[(SERVICE_KEY, "chat")]);
        no_ns.namespace.clear();
        assert_eq!(
            Trigger::of(&no_ns).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
