//! `networkPolicy.enabled`: the rendered NetworkPolicies judged by what they must allow and
//! deny. The test node's CNI bridge enforces no policy, so a small evaluator of the
//! NetworkPolicy rules the chart uses (pod and namespace selectors with `matchLabels`,
//! named ports, ingress) runs a table of callers against the rendered objects: who may
//! reach the engines' OpenAI port, their control port, the operator's metrics and its
//! metrics APIs.

use crate::common;

use std::collections::BTreeMap;

use ballast_helm::Error;
use common::*;
use serde_json::{Value as Json, json};

/// A pod somewhere: its namespace, that namespace's labels and its own labels.
#[derive(Debug, Clone)]
struct Pod {
    namespace: &'static str,
    namespace_labels: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
}

fn pod(namespace: &'static str, labels: &[(&str, &str)]) -> Pod {
    pod_in(namespace, &[], labels)
}

fn pod_in(namespace: &'static str, ns_labels: &[(&str, &str)], labels: &[(&str, &str)]) -> Pod {
    let map = |l: &[(&str, &str)]| {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    let mut namespace_labels = map(ns_labels);
    namespace_labels.insert("kubernetes.io/metadata.name".into(), namespace.into());
    Pod {
        namespace,
        namespace_labels,
        labels: map(labels),
    }
}

/// Whether `selector` (`matchLabels` only; anything else would be misjudged here, so it
/// fails the test) selects `labels`. An empty selector selects everything.
fn selects(selector: &Json, labels: &BTreeMap<String, String>) -> bool {
    let keys: Vec<&String> = selector.as_object().map_or(vec![], |o| o.keys().collect());
    assert!(
        keys.iter().all(|k| *k == "matchLabels"),
        "the evaluator knows matchLabels only: {selector}"
    );
    selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
}

/// Whether one `from` entry admits `src` into a policy of namespace `policy_ns`.
fn peer_admits(peer: &Json, policy_ns: &str, src: &Pod) -> bool {
    assert!(peer.get("ipBlock").is_none(), "no ipBlock expected: {peer}");
    match (peer.get("namespaceSelector"), peer.get("podSelector")) {
        (None, Some(p)) => src.namespace == policy_ns && selects(p, &src.labels),
        (Some(n), None) => selects(n, &src.namespace_labels),
        (Some(n), Some(p)) => selects(n, &src.namespace_labels) && selects(p, &src.labels),
        (None, None) => panic!("an empty peer: {peer}"),
    }
}

/// Whether `src` may open a connection to `port` (a port name) of `dst`, under `policies`:
/// allowed when no policy selects `dst`, else when a rule of one that does admits both.
fn allowed(policies: &[Json], src: &Pod, dst: &Pod, port: &str) -> bool {
    let selecting: Vec<&Json> = policies
        .iter()
        .filter(|p| p["metadata"]["namespace"] == dst.namespace)
        .filter(|p| selects(&p["spec"]["podSelector"], &dst.labels))
        .collect();
    if selecting.is_empty() {
        return true;
    }
    selecting.iter().any(|p| {
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress"]), "{p}");
        p["spec"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| {
                let port_ok = rule["ports"].as_array().is_none_or(|ports| {
                    ports
                        .iter()
                        .any(|q| q["port"] == port && q["protocol"] == "TCP")
                });
                let from_ok = rule["from"].as_array().is_none_or(|from| {
                    from.iter()
                        .any(|peer| peer_admits(peer, dst.namespace, src))
                });
                port_ok && from_ok
            })
    })
}

fn policies(values: Json) -> Vec<Json> {
    let r = render(&options().values(values).with_monitoring());
    r.of_kind("NetworkPolicy").unwrap()
}

#[test]
fn the_policies_admit_exactly_whom_they_must() {
    let p = policies(json!({
        "metricsApi": {"enabled": true},
        "networkPolicy": {
            "enabled": true,
            "monitoringNamespace": "monitoring",
            "engineNamespaces": ["ml", "chat"],
            "clientPeers": [{"namespaceSelector": {"matchLabels": {"team": "web"}}}]
        }
    }));
    let names: Vec<(&str, &str)> = p
        .iter()
        .map(|o| {
            (
                o["metadata"]["namespace"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("ballast-system", "ballast-operator"),
            ("ml", "ballast-engines"),
            ("ml", "ballast-pickers"),
            ("chat", "ballast-engines"),
            ("chat", "ballast-pickers"),
        ]
    );
    let operator_labels = [
        ("app.kubernetes.io/name", "ballast"),
        ("app.kubernetes.io/instance", "ballast"),
        ("app.kubernetes.io/component", "operator"),
    ];
    let operator = pod("ballast-system", &operator_labels);
    let engine = pod(
        "ml",
        &[
            ("app.kubernetes.io/name", "ballast-engine"),
            ("app.kubernetes.io/instance", "chat"),
        ],
    );
    let chat_engine = Pod {
        namespace: "chat",
        ..pod("chat", &[("app.kubernetes.io/name", "ballast-engine")])
    };
    let picker = pod(
        "ml",
        &[
            ("app.kubernetes.io/name", "ballast-gateway"),
            ("app.kubernetes.io/instance", "chat"),
        ],
    );
    let client = pod("ml", &[("app", "web")]);
    let prometheus = pod("monitoring", &[("app", "prometheus")]);
    let web = pod_in("frontend", &[("team", "web")], &[("app", "ui")]);
    let stranger = pod("default", &[("app", "curl")]);
    let impostor = pod("ballast-system", &[("app.kubernetes.io/name", "ballast")]);
    let unlisted_engine = pod("other", &[("app.kubernetes.io/name", "ballast-engine")]);
    let apiserver = pod_in("host", &[], &[]);

    // (caller, callee, port, allowed)
    let table: Vec<(&str, &Pod, &Pod, &str, bool)> = vec![
        (
            "a client in the engines' namespace",
            &client,
            &engine,
            "http",
            true,
        ),
        (
            "... but not their control port",
            &client,
            &engine,
            "grpc",
            false,
        ),
        ("the operator scrapes", &operator, &engine, "http", true),
        ("the operator drives", &operator, &engine, "grpc", true),
        (
            "a pod beside the operator without its labels",
            &impostor,
            &engine,
            "grpc",
            false,
        ),
        (
            "Prometheus scrapes engines",
            &prometheus,
            &engine,
            "http",
            true,
        ),
        (
            "... and not their control port",
            &prometheus,
            &engine,
            "grpc",
            false,
        ),
        ("a clientPeers namespace", &web, &engine, "http", true),
        (
            "the picker scrapes and sends on",
            &picker,
            &engine,
            "http",
            true,
        ),
        (
            "... never the control port",
            &picker,
            &engine,
            "grpc",
            false,
        ),
        (
            "a Gateway in clientPeers calls the picker",
            &web,
            &picker,
            "grpc",
            true,
        ),
        (
            "... so may a pod of its namespace",
            &client,
            &picker,
            "grpc",
            true,
        ),
        (
            "the operator reads held requests",
            &operator,
            &picker,
            "metrics",
            true,
        ),
        (
            "Prometheus scrapes the picker",
            &prometheus,
            &picker,
            "metrics",
            true,
        ),
        ("... a client does not", &client, &picker, "metrics", false),
        (
            "any other namespace calls no picker",
            &stranger,
            &picker,
            "grpc",
            false,
        ),
        ("... not the control port", &web, &engine, "grpc", false),
        ("any other namespace", &stranger, &engine, "http", false),
        (
            "a client of ml, to chat's engines",
            &client,
            &chat_engine,
            "http",
            false,
        ),
        (
            "the operator, to chat's engines",
            &operator,
            &chat_engine,
            "grpc",
            true,
        ),
        (
            "Prometheus scrapes the operator",
            &prometheus,
            &operator,
            "metrics",
            true,
        ),
        ("others do not", &stranger, &operator, "metrics", false),
        ("nor do engines", &engine, &operator, "metrics", false),
        (
            "the API server calls the metrics APIs",
            &apiserver,
            &operator,
            "metrics-api",
            true,
        ),
        (
            "engines in a namespace not listed have no policy",
            &stranger,
            &unlisted_engine,
            "grpc",
            true,
        ),
    ];
    for (what, src, dst, port, expected) in table {
        assert_eq!(
            allowed(&p, src, dst, port),
            expected,
            "{what}: {}/{:?} → {}/{:?}:{port}",
            src.namespace,
            src.labels,
            dst.namespace,
            dst.labels
        );
    }

    // Without the metrics APIs their port is closed; without clientPeers only the namespace.
    let p = policies(json!({
        "networkPolicy": {"enabled": true, "monitoringNamespace": "monitoring"},
        "operator": {"watchNamespace": "ml"}
    }));
    assert_eq!(
        p.len(),
        3,
        "the operator's, the watched namespace's engines' and pickers'"
    );
    assert!(!allowed(&p, &apiserver, &operator, "metrics-api"));
    assert!(!allowed(&p, &web, &engine, "http"));
    assert!(!allowed(&p, &web, &picker, "grpc"));
    assert!(allowed(&p, &client, &engine, "http"));
}

#[test]
fn off_by_default_and_values_that_cannot_work_fail_naming_them() {
    assert!(policies(json!({})).is_empty());
    let fail = |values: Json, words: &str| {
        let err = options()
            .values(values)
            .with_monitoring()
            .try_render()
            .unwrap_err();
        match &err {
            Error::Render { message, .. } => assert!(message.contains(words), "{message}"),
            e => panic!("{e}"),
        }
    };
    // Engines everywhere, no namespaces to put their policies in.
    fail(
        json!({"networkPolicy": {"enabled": true, "monitoringNamespace": "monitoring"}}),
        "networkPolicy.engineNamespaces",
    );
    // A ServiceMonitor (on by default) and no namespace for Prometheus to scrape from.
    fail(
        json!({"networkPolicy": {"enabled": true, "engineNamespaces": ["ml"]}}),
        "networkPolicy.monitoringNamespace",
    );
    // Without the monitoring API no ServiceMonitor is made: no namespace needed.
    let r = render(
        &options().values(json!({"networkPolicy": {"enabled": true, "engineNamespaces": ["ml"]}})),
    );
    assert_eq!(r.of_kind("NetworkPolicy").unwrap().len(), 3);
    // A namespace that is not a name is refused by the schema.
    let err = options()
        .values(json!({"networkPolicy": {"enabled": true, "engineNamespaces": ["Not_A_Name"]}}))
        .try_render()
        .unwrap_err();
    assert!(err.to_string().contains("engineNamespaces"), "{err}");
}
