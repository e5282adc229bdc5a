//! Step 1: what the cluster holds for a service: its Deployment and its pods, each pod
//! reduced to what the later steps need ([`PodView`]). The classification is pure and
//! tested on plain `Pod` values.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::build::{ACCEPTING_CONDITION, DELETION_COST};
use crate::labels;
use crate::status::ReplicaCounts;

/// One engine pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Pod name.
    pub name: String,
    /// Its IP, once it has one.
    pub ip: Option<String>,
    /// Its containers are ready (`/health` answers): it serves.
    pub serving: bool,
    /// It is being deleted (draining).
    pub terminating: bool,
    /// The accepting readiness gate: `Some(true)` in rotation, `Some(false)` taken out,
    /// `None` not set yet (a new pod).
    pub accepting: Option<bool>,
    /// Its `controller.kubernetes.io/pod-deletion-cost`, if set.
    pub deletion_cost: Option<String>,
}

impl PodView {
    /// Reads what matters of a pod.
    pub fn of(pod: &Pod) -> PodView {
        let status = pod.status.as_ref();
        let condition = |type_: &str| {
            status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
                .map(|c| c.status == "True")
        };
        PodView {
            name: pod.metadata.name.clone().unwrap_or_default(),
            ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            serving: condition("ContainersReady").unwrap_or(false),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            accepting: condition(ACCEPTING_CONDITION),
            deletion_cost: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DELETION_COST).cloned()),
        }
    }

    /// Serving and not leaving: scraped, and a candidate for rotation.
    pub fn ready(&self) -> bool {
        self.serving && !self.terminating && self.ip.is_some()
    }
}

/// The service's objects as the cluster holds them.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The engine Deployment, when it exists.
    pub deployment: Option<Deployment>,
    /// Its pods, by name.
    pub pods: Vec<PodView>,
}

impl Observed {
    /// The replica count last applied to the Deployment.
    pub fn deployment_replicas(&self) -> Option<i32> {
        self.deployment
            .as_ref()
            .and_then(|d| d.spec.as_ref())
            .and_then(|s| s.replicas)
    }

    /// Pods by state: ready (serving), starting, leaving, and accepting (ready and in
    /// rotation; a new pod whose gate is not set yet will be put in rotation this period).
    pub fn counts(&self) -> ReplicaCounts {
        let mut c = ReplicaCounts::default();
        for p in &self.pods {
            if p.terminating {
                c.draining += 1;
            } else if p.ready() {
                c.ready += 1;
                c.accepting += (p.accepting != Some(false)) as i32;
            } else {
                c.starting += 1;
            }
        }
        c
    }

    /// Ready pods taken out of rotation.
    pub fn out_of_rotation(&self) -> std::collections::BTreeSet<String> {
        self.pods
            .iter()
            .filter(|p| p.ready() && p.accepting == Some(false))
            .map(|p| p.name.clone())
            .collect()
    }

    /// Ready pods by name.
    pub fn ready_pods(&self) -> BTreeMap<&str, &PodView> {
        self.pods
            .iter()
            .filter(|p| p.ready())
            .map(|p| (p.name.as_str(), p))
            .collect()
    }
}

/// Reads the Deployment (same name as the service) and the pods its selector matches.
pub async fn fetch(
    deployments: &Api<Deployment>,
    pods: &Api<Pod>,
    name: &str,
) -> Result<Observed, kube::Error> {
    let deployment = deployments.get_opt(name).await?;
    let selector = labels::selector(name);
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    let mut views: Vec<PodView> = list.items.iter().map(PodView::of).collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Observed {
        deployment,
        pods: views,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    fn pod(name: &str, conditions: &[(&str, &str)], ip: Option<&str>, deleting: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| PodCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..PodCondition::default()
                        })
                        .collect(),
                ),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn pods_are_counted_by_state() {
        let ip = Some("127.0.0.2");
        let pods = [
            pod(
                "a",
                &[("ContainersReady", "True"), (ACCEPTING_CONDITION, "True")],
                ip,
                false,
            ),
            pod(
                "b",
                &[("ContainersReady", "True"), (ACCEPTING_CONDITION, "False")],
                ip,
                false,
            ),
            pod("c", &[("ContainersReady", "True")], ip, false),
            pod("d", &[("ContainersReady", "False")], ip, false),
            pod("e", &[], None, false),
            pod("f", &[("ContainersReady", "True")], ip, true),
            pod("g", &[("ContainersReady", "True")], None, false),
        ];
        let o = Observed {
            deployment: None,
            pods: pods.iter().map(PodView::of).collect(),
        };
        assert_eq!(
            o.counts(),
            ReplicaCounts {
                ready: 3,
                starting: 3,
                draining: 1,
                accepting: 2,
            },
            "a new pod (c) counts as accepting; no IP yet (g) is starting"
        );
        assert_eq!(o.out_of_rotation().into_iter().collect::<Vec<_>>(), ["b"]);
        assert_eq!(
            o.ready_pods().keys().copied().collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
    }
}
