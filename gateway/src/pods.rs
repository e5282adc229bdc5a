//! Endpoints from the pods of a label selector (`--selector` in `--namespace`), or of an
//! InferencePool's selector and target ports (`--pool`), kept as the pods change: a watch
//! of those pods (list, then watch, relisting after a lost watch) rebuilds the pool's
//! endpoint set after every change, and a watch of the InferencePool starts that pod
//! watch again when its selector or ports change.
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

use ballast_crds::inference_pool::InferencePool;

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

/// The endpoints of `pods` on each of `ports` (one port: named like the pod; more:
/// `pod:port`).
pub fn endpoints_of<'a>(pods: impl IntoIterator<Item = &'a Pod>, ports: &[u16]) -> Vec<Endpoint> {
    pods.into_iter()
        .flat_map(|pod| {
            ports.iter().filter_map(move |&port| {
                let mut e = endpoint_of(pod, port)?;
                if ports.len() > 1 {
                    e.name = format!("{}:{port}", e.name);
                }
                Some(e)
            })
        })
        .collect()
}

/// Keeps `pool` to the endpoints of the pods `selector` selects in `namespace`, on each of
/// `ports`, until the task is dropped. `synced` turns true after the first complete list.
pub async fn follow(
    client: Client,
    namespace: String,
    selector: String,
    ports: Vec<u16>,
    pool: Arc<Pool>,
    synced: Arc<watch::Sender<bool>>,
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
        let endpoints = endpoints_of(store.state().iter().map(|p| &**p), &ports);
        tracing::debug!(endpoints = endpoints.len(), "pool updated from pods");
        pool.set(endpoints);
    }
}

/// What of an InferencePool decides its endpoints: the selector and the target ports.
fn pool_source(p: &InferencePool) -> (String, Vec<u16>) {
    let ports = p
        .spec
        .target_ports
        .iter()
        .filter_map(|p| u16::try_from(p.number).ok().filter(|n| *n > 0))
        .collect();
    (p.spec.selector.to_selector_string(), ports)
}

/// Keeps `pool` to the endpoints of the InferencePool `name` in `namespace` (`--pool`): a
/// watch of that one InferencePool, and under it a pod watch ([`follow`]) of its selector
/// on its target ports, started again when either changes. While the InferencePool does
/// not exist (or selects nothing) the pool is empty. `synced` turns true once the pods of
/// the first InferencePool seen were listed, or once the list says there is none.
pub async fn follow_pool(
    client: Client,
    namespace: String,
    name: String,
    pool: Arc<Pool>,
    synced: watch::Sender<bool>,
) {
    let synced = Arc::new(synced);
    let api: Api<InferencePool> = Api::namespaced(client.clone(), &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut source: Option<(String, Vec<u16>)> = None;
    let mut pods: Option<AbortOnDrop> = None;
    let mut listed: Option<InferencePool> = None;
    while let Some(event) = events.next().await {
        let current = match event {
            Ok(watcher::Event::Apply(p)) => Some(p),
            Ok(watcher::Event::Delete(_)) => None,
            Ok(watcher::Event::Init) => {
                listed = None;
                continue;
            }
            Ok(watcher::Event::InitApply(p)) => {
                listed = Some(p);
                continue;
            }
            Ok(watcher::Event::InitDone) => listed.take(),
            Err(e) => {
                tracing::warn!(error = %e, %namespace, pool = %name, "InferencePool watch failed; retrying");
                continue;
            }
        };
        let next = current.as_ref().map(pool_source);
        if next == source && pods.is_some() {
            continue;
        }
        pods = None;
        match &next {
            Some((selector, ports)) if !selector.is_empty() && !ports.is_empty() => {
                tracing::info!(pool = %name, %selector, ?ports, "endpoints from the InferencePool's pods");
                pods = Some(AbortOnDrop(tokio::spawn(follow(
                    client.clone(),
                    namespace.clone(),
                    selector.clone(),
                    ports.clone(),
                    Arc::clone(&pool),
                    Arc::clone(&synced),
                ))));
            }
            Some(_) => {
                tracing::warn!(pool = %name, "the InferencePool selects nothing (no labels or no target ports)");
                pool.set(Vec::new());
                let _ = synced.send(true);
            }
            None => {
                tracing::warn!(pool = %name, %namespace, "no such InferencePool: no endpoints");
                pool.set(Vec::new());
                let _ = synced.send(true);
            }
        }
        source = next;
    }
}

/// Aborts the task when dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
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
    fn each_target_port_of_a_pod_is_an_endpoint() {
        let p = pod(&[("Ready", "True")], false, Some("10.1.0.7"));
        let one = endpoints_of([&p], &[8000]);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "engine-0");
        let two = endpoints_of([&p], &[8000, 8001]);
        let names: Vec<_> = two.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["engine-0:8000", "engine-0:8001"]);
        assert_eq!(two[1].addr, "10.1.0.7:8001".parse().unwrap());
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
