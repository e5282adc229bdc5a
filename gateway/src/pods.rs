//! Endpoints from the pods of a label selector (`--selector` in `--namespace`), kept as the
//! pods change: a watch of those pods (list, then watch, relisting after a lost watch)
//! rebuilds the pool's endpoint set after every change.
//!
//! A pod is an endpoint when it is Ready, has an IP, is not being deleted, and, when it
//! declares the operator's `ballast.dev/accepting` readiness gate, that condition is
//! `True` (the operator sets it `False` to take a hot pod out of rotation; the pod's Ready
//! follows it only after the kubelet's next status sync, so the gate is read itself).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::pool::{Endpoint, Pool};

/// The operator's readiness gate: `False` while the operator holds the pod out of rotation.
pub const ACCEPTING_GATE: &str = ballast_operator::reconcile::names::ACCEPTING_CONDITION;

/// The endpoint a pod is, if it takes requests now.
pub fn endpoint_of(pod: &Pod, port: u16) -> Option<Endpoint> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let is_true = |kind: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == kind && c.status == "True")
    };
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.condition_type == ACCEPTING_GATE));
    let gate_false = conditions
        .iter()
        .any(|c| c.type_ == ACCEPTING_GATE && c.status != "True");
    if !is_true("Ready") || gate_false || (gated && !is_true(ACCEPTING_GATE)) {
        return None;
    }
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    Some(Endpoint {
        addr: SocketAddr::new(ip, port),
        name: pod.metadata.name.clone().unwrap_or_else(|| ip.to_string()),
    })
}

/// Keeps `pool` to the endpoints of the pods `selector` selects in `namespace`, until the
/// task is dropped. `synced` turns true after the first complete list.
pub async fn follow(
    client: Client,
    namespace: String,
    selector: String,
    port: u16,
    pool: Arc<Pool>,
    synced: watch::Sender<bool>,
) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().labels(&selector);
    let mut events = std::pin::pin!(watcher(api, config).default_backoff().reflect(writer));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitDone) => {
                let _ = synced.send(true);
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, %namespace, %selector, "pod watch failed; retrying");
                continue;
            }
        }
        let endpoints: Vec<Endpoint> = store
            .state()
            .iter()
            .filter_map(|pod| endpoint_of(pod, port))
            .collect();
        tracing::debug!(endpoints = endpoints.len(), "pool updated from pods");
        pool.set(endpoints);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodReadinessGate, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    fn pod(conditions: &[(&str, &str)], gated: bool, ip: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("engine-0".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                readiness_gates: gated.then(|| {
                    vec![PodReadinessGate {
                        condition_type: ACCEPTING_GATE.into(),
                    }]
                }),
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: ip.map(String::from),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| PodCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_ready_pod_is_an_endpoint_at_its_ip() {
        let e = endpoint_of(&pod(&[("Ready", "True")], false, Some("10.1.0.7")), 8000).unwrap();
        assert_eq!(e.addr, "10.1.0.7:8000".parse().unwrap());
        assert_eq!(e.name, "engine-0");
    }

    #[test]
    fn pods_that_take_no_requests_are_not_endpoints() {
        let not = |p: Pod| assert_eq!(endpoint_of(&p, 8000), None, "{p:?}");
        not(pod(&[("Ready", "False")], false, Some("10.1.0.7")));
        not(pod(&[], false, Some("10.1.0.7")));
        not(pod(&[("Ready", "True")], false, None));
        not(pod(&[("Ready", "True")], false, Some("not-an-ip")));
        // Out of rotation: the gate is False, even while Ready has not caught up yet.
        not(pod(
            &[("Ready", "True"), (ACCEPTING_GATE, "False")],
            true,
            Some("10.1.0.7"),
        ));
        // The gate declared but not yet set by the operator.
        not(pod(&[("Ready", "True")], true, Some("10.1.0.7")));
        let mut leaving = pod(&[("Ready", "True")], false, Some("10.1.0.7"));
        leaving.metadata.deletion_timestamp = Some(Time(Default::default()));
        not(leaving);
    }

    #[test]
    fn a_gated_pod_in_rotation_is_an_endpoint() {
        let p = pod(
            &[("Ready", "True"), (ACCEPTING_GATE, "True")],
            true,
            Some("fd00::5"),
        );
        assert_eq!(
            endpoint_of(&p, 80).unwrap().addr,
            "[fd00::5]:80".parse().unwrap()
        );
    }
}
