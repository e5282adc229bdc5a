//! `keda.*`: KEDA's external scaler on the operator, its Service on the leader, and the
//! ScaledObjects that call it, whose trigger metadata is what the operator reads
//! (`ballast_operator::keda`).

use crate::common;

use ballast_operator::keda;
use common::*;
use serde_json::{Value as Json, json};

const KEDA_API: &str = "keda.sh/v1alpha1/ScaledObject";

fn on(values: Json) -> Render {
    let mut v = json!({"keda": {"enabled": true}});
    if let (Some(base), Some(more)) = (v["keda"].as_object_mut(), values["keda"].as_object()) {
        base.extend(more.clone());
    }
    if let (Some(base), Some(more)) = (v.as_object_mut(), values.as_object()) {
        for (k, val) in more {
            if k != "keda" {
                base.insert(k.clone(), val.clone());
            }
        }
    }
    options().values(v)
}

#[test]
fn off_by_default_and_on_it_serves_on_the_leader() {
    let off = render(&options());
    assert!(!args(&off).iter().any(|a| a.starts_with("--keda")));
    assert!(!kinds(&off).iter().any(|(_, n)| n.ends_with("-keda")));

    let r = render(&on(json!({})));
    let a = args(&r);
    assert!(a.contains(&"--keda-port=6000".to_string()), "{a:?}");
    assert!(a.contains(&"--keda-host=$(POD_IP)".to_string()), "{a:?}");
    let ports = container(&r)["ports"].clone();
    assert!(
        ports
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "keda" && p["containerPort"] == 6000),
        "{ports}"
    );
    let svc = r
        .of_kind("Service")
        .unwrap()
        .into_iter()
        .find(|s| s["metadata"]["name"] == "ballast-keda")
        .expect("the scaler's Service");
    assert_eq!(
        svc["spec"]["selector"][ballast_operator::labels::METRICS_API_LEADER],
        "true",
        "the leader alone: a standby has no records"
    );
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "keda");
    check_types(&r);
}

#[test]
fn scaled_objects_carry_the_metadata_the_operator_reads() {
    let r = render(
        &on(json!({"keda": {"scaledObjects": [
            {"name": "chat", "namespace": "ml", "inferenceService": "chat-isvc",
             "metric": "capacity_waiting_per_replica", "target": 2.5, "minReplicaCount": 0,
             "maxReplicaCount": 4,
             "triggers": [{"type": "prometheus", "metadata": {"query": "sum(rate(gateway_requests_total[1m]))", "threshold": "1", "serverAddress": "http://prometheus.monitoring:9090"}}]},
            {"name": "plain", "inferenceService": "embed"}
        ]}}))
        .with_api(KEDA_API),
    );
    let sos = r.of_kind("ScaledObject").unwrap();
    assert_eq!(sos.len(), 2);
    let chat = &sos[0];
    assert_eq!(chat["apiVersion"], "keda.sh/v1alpha1");
    assert_eq!(chat["metadata"]["namespace"], "ml");
    assert_eq!(
        chat["spec"]["scaleTargetRef"],
        json!({"apiVersion": "ballast.dev/v1alpha1", "kind": "InferenceService", "name": "chat-isvc"})
    );
    assert_eq!(
        chat["spec"]["minReplicaCount"], 0,
        "0 is kept, not defaulted"
    );
    assert_eq!(chat["spec"]["maxReplicaCount"], 4);
    let trigger = &chat["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "external");
    assert_eq!(
        trigger["metricType"], "Value",
        "a per-replica value: desired = current × value / target"
    );
    let meta = &trigger["metadata"];
    assert_eq!(
        meta["scalerAddress"],
        "ballast-keda.ballast-system.svc:6000"
    );
    assert_eq!(meta[keda::SERVICE_KEY], "chat-isvc");
    assert_eq!(meta[keda::METRIC_KEY], "capacity_waiting_per_replica");
    assert_eq!(meta[keda::TARGET_KEY], "2.5");
    assert_eq!(chat["spec"]["triggers"][1]["type"], "prometheus");

    let plain = &sos[1];
    assert_eq!(plain["metadata"]["namespace"], "ballast-system");
    assert_eq!(plain["spec"]["minReplicaCount"], 1);
    let meta = &plain["spec"]["triggers"][0]["metadata"];
    assert_eq!(meta[keda::METRIC_KEY], keda::DEFAULT_METRIC.as_str());
    assert_eq!(meta[keda::TARGET_KEY], "1");
    assert_eq!(
        plain["spec"]["triggers"][0]["metricType"], "AverageValue",
        "recommended_replicas / 1 = the replicas asked for"
    );
    // The metric names the schema allows are the operator's service metrics.
    let schema: Json = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let allowed: Vec<String> = schema["properties"]["keda"]["properties"]["scaledObjects"]["items"]
        ["properties"]["metric"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let service: Vec<String> = ballast_operator::metrics_api::values::Metric::SERVICE
        .iter()
        .map(|m| m.as_str().to_string())
        .collect();
    assert_eq!(allowed, service);
}

#[test]
fn what_cannot_work_fails_with_the_values_named() {
    let so = json!({"keda": {"scaledObjects": [{"name": "chat", "inferenceService": "chat"}]}});
    let cases = [
        (
            options().values(so.clone()),
            "keda.scaledObjects needs keda.enabled",
        ),
        (on(so.clone()), "needs KEDA's CRDs (keda.sh/v1alpha1 ScaledObject)"),
        (
            on(json!({"keda": {"scaledObjects": [{"name": "chat"}]}})).with_api(KEDA_API),
            "inferenceService",
        ),
        (
            on(json!({"keda": {"scaledObjects": [{"name": "chat", "inferenceService": "c", "metric": "capacity_waiting"}]}}))
                .with_api(KEDA_API),
            "metric",
        ),
        (
            on(json!({"keda": {"scaledObjects": [{"name": "chat", "inferenceService": "c", "target": 0}]}}))
                .with_api(KEDA_API),
            "target",
        ),
    ];
    for (r, words) in cases {
        let Err(e) = r.try_render() else {
            panic!("rendered: {words}");
        };
        assert!(e.to_string().contains(words), "{words}: {e}");
    }
}

#[test]
fn with_network_policies_only_kedas_namespace_reaches_the_scaler() {
    let r = render(&on(json!({
        "keda": {"namespace": "keda-system"},
        "networkPolicy": {"enabled": true, "engineNamespaces": ["ml"]}
    })));
    let policy = r
        .of_kind("NetworkPolicy")
        .unwrap()
        .into_iter()
        .find(|p| p["metadata"]["name"] == "ballast-operator")
        .unwrap();
    let rules: Vec<&Json> = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|rule| rule["ports"][0]["port"] == "keda")
        .collect();
    assert_eq!(rules.len(), 1, "{policy}");
    assert_eq!(
        rules[0]["from"],
        json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda-system"}}}])
    );
}
