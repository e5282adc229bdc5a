//! KEDA's external-scaler protocol as KEDA calls it: a tonic client built from the same
//! vendored `externalscaler.proto`, over real HTTP/2 on loopback, against the operator's
//! server reading a board of control-period records.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use ballast_operator::keda::proto::external_scaler_client::ExternalScalerClient;
use ballast_operator::keda::proto::{GetMetricsRequest, ScaledObjectRef};
use ballast_operator::keda::{self, Scaler};
use ballast_operator::metrics_api::values::{Board, Metric, Record};
use futures::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

fn record(values: &[(Metric, f64)], in_flight: Option<f64>) -> Record {
    Record {
        scraped_at: SystemTime::now(),
        published: Instant::now(),
        interval: Duration::from_secs(60),
        values: values.iter().copied().collect::<BTreeMap<_, _>>(),
        pods: vec![],
        pod_labels: BTreeMap::new(),
        in_flight,
    }
}

fn reference(service: &str, meta: &[(&str, &str)]) -> ScaledObjectRef {
    let mut scaler_metadata: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    scaler_metadata.insert("scalerAddress".into(), "ballast-keda.ops:6000".into());
    scaler_metadata.insert(keda::SERVICE_KEY.into(), service.into());
    ScaledObjectRef {
        name: format!("{service}-so"),
        namespace: "ml".into(),
        scaler_metadata,
    }
}

async fn start(board: Arc<Board>, leading: Arc<AtomicBool>) -> ExternalScalerClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = keda::serve(listener, Scaler::new(board, leading)).unwrap();
    ExternalScalerClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

#[tokio::test]
async fn keda_reads_the_control_periods_values_and_activity() {
    let board = Arc::new(Board::default());
    board.publish(
        "ml",
        "busy",
        record(
            &[
                (Metric::CapacityWaitingPerReplica, 2.5),
                (Metric::RecommendedReplicas, 3.0),
            ],
            Some(7.0),
        ),
    );
    board.publish(
        "ml",
        "idle",
        record(&[(Metric::RecommendedReplicas, 1.0)], Some(0.0)),
    );
    let leading = Arc::new(AtomicBool::new(true));
    let mut c = start(Arc::clone(&board), Arc::clone(&leading)).await;

    // IsActive: requests running or waiting; none, or no record (scaled to zero), is not.
    for (service, want) in [("busy", true), ("idle", false), ("gone", false)] {
        let r = c.is_active(reference(service, &[])).await.unwrap();
        assert_eq!(r.get_ref().result, want, "{service}");
    }

    // GetMetricSpec: the trigger's metric and target, default recommended_replicas at 1.
    let spec = c
        .get_metric_spec(reference(
            "busy",
            &[
                (keda::METRIC_KEY, "capacity_waiting_per_replica"),
                (keda::TARGET_KEY, "2"),
            ],
        ))
        .await
        .unwrap()
        .into_inner()
        .metric_specs;
    assert_eq!(spec.len(), 1);
    assert_eq!(spec[0].metric_name, "capacity_waiting_per_replica");
    assert_eq!((spec[0].target_size_float, spec[0].target_size), (2.0, 2));
    let default = c
        .get_metric_spec(reference("busy", &[]))
        .await
        .unwrap()
        .into_inner()
        .metric_specs;
    assert_eq!(default[0].metric_name, "recommended_replicas");
    assert_eq!(default[0].target_size_float, 1.0);

    // GetMetrics: the record's value, by the name KEDA passes back (prefix removed).
    let get = |service: &str, metric: &str| GetMetricsRequest {
        scaled_object_ref: Some(reference(service, &[(keda::METRIC_KEY, metric)])),
        metric_name: metric.into(),
    };
    let v = c
        .get_metrics(get("busy", "capacity_waiting_per_replica"))
        .await
        .unwrap()
        .into_inner()
        .metric_values;
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].metric_name, "capacity_waiting_per_replica");
    assert_eq!((v[0].metric_value_float, v[0].metric_value), (2.5, 3));
    let v = c
        .get_metrics(get("busy", "recommended_replicas"))
        .await
        .unwrap()
        .into_inner()
        .metric_values;
    assert_eq!(v[0].metric_value_float, 3.0);

    // Absent is an error, never a 0 an HPA would scale down on.
    for (req, code, words) in [
        (
            get("idle", "kv_cache_usage"),
            Code::NotFound,
            "kv_cache_usage is absent for ml/idle",
        ),
        (
            get("gone", "recommended_replicas"),
            Code::NotFound,
            "no fresh control period for InferenceService ml/gone",
        ),
        (
            get("busy", "bogus"),
            Code::InvalidArgument,
            "unknown metric \"bogus\"",
        ),
        (
            GetMetricsRequest {
                scaled_object_ref: None,
                metric_name: "recommended_replicas".into(),
            },
            Code::InvalidArgument,
            "without a ScaledObject reference",
        ),
    ] {
        let e = c.get_metrics(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{}", e.message());
        assert!(e.message().contains(words), "{}", e.message());
    }

    // StreamIsActive: the answer at once, then each change.
    let mut stream = c
        .stream_is_active(reference("idle", &[]))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(1), stream.next())
        .await
        .expect("the first answer at once")
        .unwrap()
        .unwrap();
    assert!(!first.result);
    board.publish(
        "ml",
        "idle",
        record(&[(Metric::RecommendedReplicas, 1.0)], Some(1.0)),
    );
    let changed = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the change within a few seconds")
        .unwrap()
        .unwrap();
    assert!(changed.result);

    // StreamMetricSpec is optional: Unimplemented, and KEDA falls back to GetMetricSpec.
    let Err(e) = c.stream_metric_spec(reference("busy", &[])).await else {
        panic!("StreamMetricSpec answered");
    };
    assert_eq!(e.code(), Code::Unimplemented);

    // A standby has no records: Unavailable, so KEDA retries through the Service.
    leading.store(false, Ordering::SeqCst);
    let e = c.is_active(reference("busy", &[])).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{}", e.message());
}
