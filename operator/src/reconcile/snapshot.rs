//! Step 1: what the cluster holds for a service, read from the caches (see [`Cache`]):
//! its Deployment, Service, PodDisruptionBudget and ServiceMonitor (or that its CRD is not
//! installed), and its pods, each reduced to what the later steps need ([`PodView`]).
//! The classification is pure and tested on plain `Pod` values.

use std::collections::BTreeMap;
use std::sync::Arc;

use ballast_crds::InferenceService;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;

use super::cache::{Cache, CrdState};
use super::names::{ACCEPTING_CONDITION, DELETION_COST};
use crate::scrape::ScrapeKey;
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
    /// A container that cannot run (image, creation, crash loop), as the kubelet says.
    pub start_failure: Option<StartFailure>,
    /// Its engine serves the control API over TLS (the container sets
    /// `BALLAST_CONTROL_TLS_CERT`).
    pub control_tls: bool,
}

/// What keeps a container from running, by what the user has to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StartFailureKind {
    /// The image cannot be pulled or is not on the node: `ErrImagePull`,
    /// `ImagePullBackOff`, `ErrImageNeverPull`, `InvalidImageName`.
    ImagePull,
    /// The container cannot be created: `CreateContainerConfigError` (a missing Secret or
    /// ConfigMap, say), `CreateContainerError`.
    CreateContainer,
    /// It starts and exits, again and again: `CrashLoopBackOff`.
    CrashLoop,
}

impl StartFailureKind {
    /// The kind a kubelet `state.waiting.reason` means, if it is one of these.
    pub fn of_waiting_reason(reason: &str) -> Option<Self> {
        match reason {
            "ErrImagePull" | "ImagePullBackOff" | "ErrImageNeverPull" | "InvalidImageName" => {
                Some(Self::ImagePull)
            }
            "CreateContainerConfigError" | "CreateContainerError" => Some(Self::CreateContainer),
            "CrashLoopBackOff" => Some(Self::CrashLoop),
            _ => None,
        }
    }

    /// The reason of the `Degraded` condition it sets.
    pub fn condition_reason(self) -> &'static str {
        match self {
            Self::ImagePull => "ImagePullFailed",
            Self::CreateContainer => "ContainerCreateFailed",
            Self::CrashLoop => "EngineCrashLoop",
        }
    }
}

/// Longest piece of kubelet text kept in a message (termination messages can be 4 KiB).
const MAX_DETAIL_CHARS: usize = 300;

/// One container of a pod that cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFailure {
    /// The container's name.
    pub container: String,
    /// What to fix.
    pub kind: StartFailureKind,
    /// The kubelet's `state.waiting.reason`, e.g. `ImagePullBackOff`.
    pub reason: String,
    /// The kubelet's `state.waiting.message` (may be empty).
    pub message: String,
    /// For a container that ran before: how it last ended (exit code, reason and the last
    /// line of its termination message, which the engine container fills from its log).
    pub last_exit: Option<String>,
}

/// The last non-empty line of `text`, cut to [`MAX_DETAIL_CHARS`].
fn last_line(text: &str) -> Option<String> {
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    Some(match line.char_indices().nth(MAX_DETAIL_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    })
}

impl StartFailure {
    /// The failure a container status shows, if any.
    pub fn of(status: &ContainerStatus) -> Option<StartFailure> {
        let waiting = status.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        let kind = StartFailureKind::of_waiting_reason(reason)?;
        let last_exit = status
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| {
                let mut exit = format!("exit code {}", t.exit_code);
                if let Some(r) = t.reason.as_deref().filter(|r| !r.is_empty()) {
                    exit.push_str(&format!(" ({r})"));
                }
                if let Some(m) = t.message.as_deref().and_then(last_line) {
                    exit.push_str(&format!(": {m}"));
                }
                exit
            });
        Some(StartFailure {
            container: status.name.clone(),
            kind,
            reason: reason.to_string(),
            message: waiting
                .message
                .as_deref()
                .and_then(last_line)
                .unwrap_or_default(),
            last_exit,
        })
    }

    /// One line: pod, container, reason, the kubelet's message and the last exit.
    pub fn describe(&self, pod: &str) -> String {
        let mut s = format!("pod {pod} container {}: {}", self.container, self.reason);
        if !self.message.is_empty() {
            s.push_str(&format!(": {}", self.message));
        }
        if let Some(exit) = &self.last_exit {
            s.push_str(&format!(" (last exit: {exit})"));
        }
        s
    }
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
        // Init containers first: while one fails, the others have not started.
        let start_failure = status
            .into_iter()
            .flat_map(|s| {
                s.init_container_statuses
                    .iter()
                    .flatten()
                    .chain(s.container_statuses.iter().flatten())
            })
            .find_map(StartFailure::of);
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
            start_failure,
            control_tls: pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .filter(|c| c.name == "engine")
                .flat_map(|c| c.env.iter().flatten())
                .any(|v| v.name == super::build::CONTROL_TLS_CERT_ENV),
        }
    }

    /// What of the pod the status shows at once: the kubelet's reason it cannot start
    /// (`Degraded`), whether it serves (`Ready`, `readyReplicas`) and whether it is
    /// leaving. A pod whose signature changes makes its service reconcile now rather than
    /// at the next control period.
    pub fn signature(&self) -> (Option<&str>, bool, bool) {
        (
            self.start_failure.as_ref().map(|f| f.reason.as_str()),
            self.serving,
            self.terminating,
        )
    }

    /// Serving and not leaving: scraped, and a candidate for rotation.
    pub fn ready(&self) -> bool {
        self.serving && !self.terminating && self.ip.is_some()
    }
}

/// The service's objects as the cluster holds them.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The engine Deployment, when it exists.
    pub deployment: Option<Arc<Deployment>>,
    /// Its Service, when it exists.
    pub service: Option<Arc<Service>>,
    /// Its PodDisruptionBudget, when it exists.
    pub pdb: Option<Arc<PodDisruptionBudget>>,
    /// Whether ServiceMonitors can exist, and its own.
    pub service_monitor: CrdState,
    /// Its pods, by name.
    pub pods: Vec<PodView>,
    /// HorizontalPodAutoscalers that target it, by name.
    pub autoscalers: Vec<String>,
    /// Its API keys, as the Secret `spec.auth` names holds them.
    pub api_keys: ApiKeys,
    /// Its gateway's objects.
    pub gateway: GatewayLive,
}

/// A service's gateway as the cluster holds it: whether InferencePools can exist and its
/// own, and the picker's objects (`NAME-epp`), each `None` when there is none.
#[derive(Debug, Clone)]
pub struct GatewayLive {
    /// Whether the InferencePool CRD is installed, and the service's pool.
    pub pool: CrdState,
    /// The picker's ServiceAccount.
    pub service_account: Option<Arc<ServiceAccount>>,
    /// Its Role.
    pub role: Option<Arc<Role>>,
    /// Its RoleBinding.
    pub role_binding: Option<Arc<RoleBinding>>,
    /// The picker Deployment.
    pub deployment: Option<Arc<Deployment>>,
    /// The picker Service.
    pub service: Option<Arc<Service>>,
    /// The picker PodDisruptionBudget.
    pub pdb: Option<Arc<PodDisruptionBudget>>,
    /// Picker pods that are Ready and not leaving.
    pub ready_pickers: i32,
    /// Those pods' names and IPs (the operator reads their held requests).
    pub pickers: Vec<(String, String)>,
    /// Every picker pod, ready or not, with its containers' restarts.
    pub restarts: BTreeMap<String, i32>,
}

impl Default for GatewayLive {
    fn default() -> Self {
        GatewayLive {
            pool: CrdState::NotInstalled,
            service_account: None,
            role: None,
            role_binding: None,
            deployment: None,
            service: None,
            pdb: None,
            ready_pickers: 0,
            pickers: Vec::new(),
            restarts: BTreeMap::new(),
        }
    }
}

impl GatewayLive {
    /// Whether any of the gateway's objects exists.
    pub fn any(&self) -> bool {
        self.pool.object().is_some()
            || self.service_account.is_some()
            || self.role.is_some()
            || self.role_binding.is_some()
            || self.deployment.is_some()
            || self.service.is_some()
            || self.pdb.is_some()
    }

    /// An object named like the picker that another resource controls (an InferenceService
    /// named `NAME-epp` has engine objects of that name): `"KIND NAME (controlled by
    /// KIND NAME)"`. The picker then yields: the operator writes none of the gateway's
    /// objects for the service whose `uid` is given.
    pub fn taken(&self, uid: &str) -> Option<String> {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        use kube::Resource;
        let metas: [(&str, Option<&ObjectMeta>); 6] = [
            (
                "ServiceAccount",
                self.service_account.as_deref().map(|o| o.meta()),
            ),
            ("Role", self.role.as_deref().map(|o| o.meta())),
            (
                "RoleBinding",
                self.role_binding.as_deref().map(|o| o.meta()),
            ),
            ("Deployment", self.deployment.as_deref().map(|o| o.meta())),
            ("Service", self.service.as_deref().map(|o| o.meta())),
            ("PodDisruptionBudget", self.pdb.as_deref().map(|o| o.meta())),
        ];
        metas.into_iter().find_map(|(kind, meta)| {
            let meta = meta?;
            let owner = meta
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))?;
            (owner.uid != uid).then(|| {
                format!(
                    "{kind} {} (controlled by {} {})",
                    meta.name.as_deref().unwrap_or_default(),
                    owner.kind,
                    owner.name
                )
            })
        })
    }

    /// Reads the gateway of service `name` in `ns` from the caches.
    pub async fn read(cache: &Cache, ns: &str, name: &str) -> Result<GatewayLive, kube::Error> {
        let picker = super::names::picker_name(name);
        let pods = cache.picker_pods(ns, name).await?;
        let restarts = pods
            .iter()
            .map(|p| {
                let statuses = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref());
                let n = statuses.map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
                (p.name_any(), n)
            })
            .collect();
        let ready: Vec<Arc<Pod>> = pods
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
            })
            .collect();
        let mut pickers: Vec<(String, String)> = ready
            .iter()
            .filter_map(|p| {
                let ip = p
                    .status
                    .as_ref()?
                    .pod_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())?;
                Some((p.name_any(), ip))
            })
            .collect();
        pickers.sort();
        let ready_pickers = ready.len() as i32;
        Ok(GatewayLive {
            pool: cache.inference_pool(ns, name).await?,
            service_account: cache.service_account(ns, &picker).await?,
            role: cache.role(ns, &picker).await?,
            role_binding: cache.role_binding(ns, &picker).await?,
            deployment: cache.deployment(ns, &picker).await?,
            service: cache.service(ns, &picker).await?,
            pdb: cache.pdb(ns, &picker).await?,
            ready_pickers,
            pickers,
            restarts,
        })
    }
}

/// A service's API keys (`spec.auth.apiKeySecretRef`) as the cluster holds them. Nothing
/// here shows a key: its `Debug` is [`ScrapeKey`]'s.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ApiKeys {
    /// No `spec.auth`: the API is open.
    #[default]
    NotRequired,
    /// The Secret holds the key; the first API key in it is what scrapes send.
    Found(ScrapeKey),
    /// The Secret, its key, or an API key in it is missing: why, naming what.
    Missing(String),
}

impl ApiKeys {
    /// Judges `secret` (`None`: there is none) as the holder of `spec.auth`'s keys.
    pub fn of(isvc: &InferenceService, secret: Option<&Secret>) -> ApiKeys {
        let Some(auth) = &isvc.spec.auth else {
            return ApiKeys::NotRequired;
        };
        let r = &auth.api_key_secret_ref;
        let ns = isvc.namespace().unwrap_or_default();
        let Some(secret) = secret else {
            return ApiKeys::Missing(format!(
                "spec.auth.apiKeySecretRef: Secret {ns}/{} not found",
                r.name
            ));
        };
        // `stringData` is write-only: the API server returns everything in `data`.
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .map(|v| v.0.as_slice());
        let Some(value) = value else {
            return ApiKeys::Missing(format!(
                "spec.auth.apiKeySecretRef: Secret {ns}/{} has no key {:?}",
                r.name, r.key
            ));
        };
        match ScrapeKey::first_of(value) {
            Some(key) => ApiKeys::Found(key),
            None => ApiKeys::Missing(format!(
                "spec.auth.apiKeySecretRef: key {:?} of Secret {ns}/{} holds no API key (one a \
                 line, printable ASCII without spaces)",
                r.key, r.name
            )),
        }
    }

    /// The key scrapes send, if any.
    pub fn scrape_key(&self) -> Option<ScrapeKey> {
        match self {
            ApiKeys::Found(k) => Some(k.clone()),
            _ => None,
        }
    }
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            deployment: None,
            service: None,
            pdb: None,
            service_monitor: CrdState::NotInstalled,
            pods: Vec::new(),
            autoscalers: Vec::new(),
            api_keys: ApiKeys::NotRequired,
            gateway: GatewayLive::default(),
        }
    }
}

impl Snapshot {
    /// The replica count last applied to the Deployment.
    pub fn deployment_replicas(&self) -> Option<i32> {
        self.deployment
            .as_ref()
            .and_then(|d| d.spec.as_ref())
            .and_then(|s| s.replicas)
    }

    /// The size the service runs now: the Deployment's, or for a new service the size
    /// its spec starts with.
    pub fn current_replicas(&self, isvc: &InferenceService) -> i32 {
        self.deployment_replicas()
            .unwrap_or_else(|| isvc.spec.initial_replicas())
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

    /// The pods (not leaving) with a container that cannot run, most actionable kind
    /// first (image, then creation, then crash loop), then by name.
    pub fn start_failures(&self) -> Vec<(&PodView, &StartFailure)> {
        let mut failing: Vec<_> = self
            .pods
            .iter()
            .filter(|p| !p.terminating)
            .filter_map(|p| p.start_failure.as_ref().map(|f| (p, f)))
            .collect();
        failing.sort_by(|a, b| (a.1.kind, &a.0.name).cmp(&(b.1.kind, &b.0.name)));
        failing
    }

    /// Pods not leaving.
    pub fn live_pods(&self) -> usize {
        self.pods.iter().filter(|p| !p.terminating).count()
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

/// Step 1: reads the service's objects (same name as the service) and the pods its
/// selector matches.
pub async fn read(cache: &Cache, isvc: &InferenceService) -> Result<Snapshot, kube::Error> {
    let ns = isvc.namespace().unwrap_or_default();
    let name = isvc.name_any();
    let mut pods: Vec<PodView> = cache
        .pods(&ns, &name)
        .await?
        .iter()
        .map(|p| PodView::of(p))
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    let api_keys = match &isvc.spec.auth {
        None => ApiKeys::NotRequired,
        Some(auth) => {
            let secret = cache
                .referenced_secret(&ns, &auth.api_key_secret_ref.name)
                .await?;
            ApiKeys::of(isvc, secret.as_deref())
        }
    };
    Ok(Snapshot {
        api_keys,
        deployment: cache.deployment(&ns, &name).await?,
        service: cache.service(&ns, &name).await?,
        pdb: cache.pdb(&ns, &name).await?,
        service_monitor: cache.service_monitor(&ns, &name).await?,
        autoscalers: cache.autoscalers(&ns, &name).await?,
        gateway: GatewayLive::read(cache, &ns, &name).await?,
        pods,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn a_picker_name_held_by_another_service_is_taken() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owned_by = |uid: &str, controller: bool| Deployment {
            metadata: ObjectMeta {
                name: Some("chat-epp".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "ballast.dev/v1alpha1".into(),
                    kind: "InferenceService".into(),
                    name: if uid == "mine" { "chat" } else { "chat-epp" }.into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            ..Deployment::default()
        };
        let live = |d: Deployment| GatewayLive {
            deployment: Some(Arc::new(d)),
            ..GatewayLive::default()
        };
        assert_eq!(
            live(owned_by("theirs", true)).taken("mine").as_deref(),
            Some("Deployment chat-epp (controlled by InferenceService chat-epp)")
        );
        assert_eq!(live(owned_by("mine", true)).taken("mine"), None);
        assert_eq!(live(owned_by("theirs", false)).taken("mine"), None);
        assert_eq!(GatewayLive::default().taken("mine"), None);
    }

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
        let o = Snapshot {
            pods: pods.iter().map(PodView::of).collect(),
            ..Snapshot::default()
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

    /// A pod as the kubelet reports it, from JSON.
    fn pod_json(name: &str, status: serde_json::Value, deleting: bool) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": status,
        }))
        .unwrap();
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        p
    }

    fn waiting(container: &str, reason: &str, message: &str) -> serde_json::Value {
        serde_json::json!({"name": container, "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": reason, "message": message}}})
    }

    #[test]
    fn every_kubelet_reason_that_keeps_a_container_from_running_is_classified() {
        use StartFailureKind::*;
        // Table: the kubelet's waiting reason and the kind (None: a normal wait).
        let cases = [
            ("ErrImagePull", Some(ImagePull)),
            ("ImagePullBackOff", Some(ImagePull)),
            ("ErrImageNeverPull", Some(ImagePull)),
            ("InvalidImageName", Some(ImagePull)),
            ("CreateContainerConfigError", Some(CreateContainer)),
            ("CreateContainerError", Some(CreateContainer)),
            ("CrashLoopBackOff", Some(CrashLoop)),
            ("ContainerCreating", None),
            ("PodInitializing", None),
            ("", None),
        ];
        for (reason, want) in cases {
            assert_eq!(
                StartFailureKind::of_waiting_reason(reason),
                want,
                "{reason}"
            );
            let p = pod_json(
                "p",
                serde_json::json!({"containerStatuses": [waiting("engine", reason, "m")]}),
                false,
            );
            assert_eq!(
                PodView::of(&p).start_failure.map(|f| f.kind),
                want,
                "{reason}"
            );
        }
        assert_eq!(ImagePull.condition_reason(), "ImagePullFailed");
        assert_eq!(CreateContainer.condition_reason(), "ContainerCreateFailed");
        assert_eq!(CrashLoop.condition_reason(), "EngineCrashLoop");
    }

    #[test]
    fn a_failure_names_its_container_the_kubelets_message_and_the_last_exit() {
        let never = pod_json(
            "chat-1",
            serde_json::json!({"containerStatuses": [waiting("engine", "ErrImageNeverPull",
                "Container image \"ballast:dev\" is not present with pull policy of Never")]}),
            false,
        );
        let f = PodView::of(&never).start_failure.unwrap();
        assert_eq!(
            f.describe("chat-1"),
            "pod chat-1 container engine: ErrImageNeverPull: Container image \"ballast:dev\" is not present with pull policy of Never"
        );
        // A crash loop: the last termination, its exit code and the last line of the
        // termination message (the end of the engine's log), cut to a bounded length.
        let mut looping = waiting(
            "engine",
            "CrashLoopBackOff",
            "back-off 10s restarting failed container=engine pod=chat-2",
        );
        let long = "x".repeat(1000);
        looping["lastState"] = serde_json::json!({"terminated": {"exitCode": 2, "reason": "Error",
            "message": format!("starting\nerror: --model: unknown model {long}\n\n")}});
        let p = pod_json(
            "chat-2",
            serde_json::json!({"containerStatuses": [looping]}),
            false,
        );
        let f = PodView::of(&p).start_failure.unwrap();
        assert_eq!(f.kind, StartFailureKind::CrashLoop);
        let exit = f.last_exit.as_deref().unwrap();
        assert!(
            exit.starts_with("exit code 2 (Error): error: --model: unknown model xxx"),
            "{exit}"
        );
        assert!(exit.ends_with('…') && exit.chars().count() < 400, "{exit}");
        let d = f.describe("chat-2");
        assert!(
            d.starts_with("pod chat-2 container engine: CrashLoopBackOff: back-off 10s")
                && d.contains("(last exit: exit code 2 (Error)"),
            "{d}"
        );
        // An init container that fails is found before the (not started) main one; one
        // without a message still names its reason.
        let p = pod_json(
            "chat-3",
            serde_json::json!({
                "initContainerStatuses": [waiting("fetch-model", "CreateContainerConfigError", "")],
                "containerStatuses": [waiting("engine", "PodInitializing", "")],
            }),
            false,
        );
        assert_eq!(
            PodView::of(&p).start_failure.unwrap().describe("chat-3"),
            "pod chat-3 container fetch-model: CreateContainerConfigError"
        );
    }

    #[test]
    fn start_failures_skip_leaving_pods_and_put_the_most_actionable_first() {
        let o = Snapshot {
            pods: [
                pod_json(
                    "a",
                    serde_json::json!({"containerStatuses": [waiting("engine", "CrashLoopBackOff", "")]}),
                    false,
                ),
                pod_json(
                    "b",
                    serde_json::json!({"containerStatuses": [waiting("engine", "ImagePullBackOff", "")]}),
                    false,
                ),
                pod_json(
                    "c",
                    serde_json::json!({"containerStatuses": [waiting("engine", "ErrImagePull", "")]}),
                    true,
                ),
                pod("d", &[("ContainersReady", "True")], Some("10.0.0.4"), false),
            ]
            .iter()
            .map(PodView::of)
            .collect(),
            ..Snapshot::default()
        };
        let names: Vec<&str> = o
            .start_failures()
            .iter()
            .map(|(p, _)| p.name.as_str())
            .collect();
        assert_eq!(names, ["b", "a"], "image before crash loop; c is leaving");
        assert_eq!(o.live_pods(), 3);
    }
}
