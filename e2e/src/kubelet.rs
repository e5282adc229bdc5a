//! A *process kubelet* for tests: it registers a Node and runs every pod bound to it as a
//! local process, the way a kubelet runs a container, on a loopback address of its own.
//!
//! For each pod: an IP 127.0.0.N; the first container's `command` and `args` (the command's
//! first word mapped to a local executable, `$(VAR)` expanded from the container's `env`,
//! whose downward-API fields `status.podIP`, `metadata.name`, `metadata.namespace` and
//! `spec.nodeName` are resolved); its readiness probe (HTTP GET, at most every second);
//! the pod's phase, IP, container status and conditions, with `Ready` True only when the
//! container is ready **and** every readiness gate's condition is True; a container that
//! exits is restarted (its restart count grows). A pod being deleted gets SIGTERM, then
//! SIGKILL after its grace period, and is removed from the API.
//!
//! A pod's ServiceAccount credentials come as `KUBECONFIG` (see
//! [`KubeletConfig::credentials`]) rather than a mounted token.
//!
//! A pod's ServiceAccount credentials come as `KUBECONFIG` (see
//! [`KubeletConfig::credentials`]) rather than as a mounted token.
//!
//! What it does not do: images, volumes, liveness and startup probes, resource limits,
//! security contexts, several containers. The pods of these tests need none of that to
//! run; the API server still validates every field of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;

/// How the kubelet runs pods.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// The Node's name.
    pub node: String,
    /// A container command's first word → the executable that runs it.
    pub commands: BTreeMap<String, PathBuf>,
    /// Where each container's stdout and stderr go (`NAMESPACE_POD.log`).
    pub log_dir: PathBuf,
    /// When set, a pod with a `serviceAccountName` (and token automount not turned off)
    /// gets `KUBECONFIG` pointing at a kubeconfig for that ServiceAccount: what a real
    /// kubelet's projected token volume gives an in-cluster client.
    pub credentials: Option<crate::cluster::Credentials>,
}

/// A running kubelet; stops (killing every pod process) when dropped.
pub struct Kubelet {
    task: tokio::task::JoinHandle<()>,
    pods: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<PodMsg>>>>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
        for (_, tx) in self.pods.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            let _ = tx.send(PodMsg::Stop);
        }
    }
}

enum PodMsg {
    Update(Box<Pod>),
    Gone,
    Stop,
}

/// Registers the Node (Ready, untainted) and starts running its pods.
pub async fn start(client: Client, config: KubeletConfig) -> Result<Kubelet, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(&config.node).await?.is_none() {
        nodes
            .create(
                &PostParams::default(),
                &Node {
                    metadata: ObjectMeta {
                        name: Some(config.node.clone()),
                        labels: Some(BTreeMap::from([(
                            "kubernetes.io/hostname".to_string(),
                            config.node.clone(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    ..Node::default()
                },
            )
            .await?;
    }
    let now = Timestamp::now().to_string();
    let capacity = json!({"cpu": "64", "memory": "256Gi", "pods": "250"});
    nodes
        .patch_status(
            &config.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "process kubelet", "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "capacity": capacity, "allocatable": capacity,
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            }})),
        )
        .await?;
    // The API server taints a new Node not-ready; a real kubelet's Ready lifts it through
    // the node lifecycle controller, which this cluster does not run.
    nodes
        .patch(
            &config.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": []}})),
        )
        .await?;

    let pods_map: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<PodMsg>>>> = Arc::default();
    let ips: Arc<Mutex<BTreeSet<u8>>> = Arc::default();
    let map = Arc::clone(&pods_map);
    let task = tokio::spawn(async move {
        let api: Api<Pod> = Api::all(client.clone());
        let wc = watcher::Config::default().fields(&format!("spec.nodeName={}", config.node));
        let mut events = Box::pin(watcher(api, wc));
        while let Some(event) = events.next().await {
            let (pod, deleted) = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                Ok(watcher::Event::Delete(p)) => (p, true),
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(target: "ballast::e2e", error = %e, "kubelet watch");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
            if deleted {
                if let Some(tx) = map.remove(&key) {
                    let _ = tx.send(PodMsg::Gone);
                }
                continue;
            }
            let tx = map.entry(key.clone()).or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                let runtime = PodRuntime {
                    client: client.clone(),
                    config: config.clone(),
                    ips: Arc::clone(&ips),
                    key,
                };
                tokio::spawn(runtime.run(rx));
                tx
            });
            let _ = tx.send(PodMsg::Update(Box::new(pod)));
        }
    });
    Ok(Kubelet {
        task,
        pods: pods_map,
    })
}

/// What a pod's status shows of its container.
#[derive(Clone, Copy)]
struct Shown<'a> {
    ip: &'a str,
    started: &'a str,
    container_ready: bool,
    restarts: i32,
    waiting: Option<&'a str>,
}

/// What was last reported: readiness, restarts and the gates' conditions.
type Reported = (bool, i32, Vec<(String, String)>);

struct PodRuntime {
    client: Client,
    config: KubeletConfig,
    ips: Arc<Mutex<BTreeSet<u8>>>,
    key: String,
}

/// `$(VAR)` references of `s` replaced from `env` (unknown ones are left as written, and
/// `$$` is a literal `$`, as Kubernetes expands them).
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix('(')
            && let Some(end) = r.find(')')
            && let Some(v) = env.get(&r[..end])
        {
            out.push_str(v);
            rest = &r[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment with downward-API fields resolved for `pod` at `ip`.
fn environment(pod: &Pod, c: &Container, ip: &str, node: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => Some(expand(v, &env)),
            (None, Some(from)) => {
                from.field_ref
                    .as_ref()
                    .and_then(|f| match f.field_path.as_str() {
                        "status.podIP" => Some(ip.to_string()),
                        "metadata.name" => pod.metadata.name.clone(),
                        "metadata.namespace" => pod.metadata.namespace.clone(),
                        "spec.nodeName" => Some(node.to_string()),
                        _ => None,
                    })
            }
            (None, None) => Some(String::new()),
        };
        if let Some(v) = value {
            env.insert(e.name.clone(), v);
        }
    }
    env
}

/// The conditions of the pod's readiness gates, as (type, status).
fn gate_states(pod: &Pod) -> Vec<(String, String)> {
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref());
    gates
        .into_iter()
        .flatten()
        .map(|g| {
            let status = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == g.condition_type))
                .map_or("Unknown".to_string(), |c| c.status.clone());
            (g.condition_type.clone(), status)
        })
        .collect()
}

/// The readiness probe's URL, when the container has an HTTP one.
fn probe_url(c: &Container, ip: &str) -> Option<String> {
    let get = c.readiness_probe.as_ref()?.http_get.as_ref()?;
    let port = match &get.port {
        IntOrString::Int(p) => *p,
        IntOrString::String(name) => {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))?
                .container_port
        }
    };
    Some(format!(
        "http://{ip}:{port}{}",
        get.path.as_deref().unwrap_or("/")
    ))
}

impl PodRuntime {
    fn take_ip(&self) -> String {
        let mut used = self.ips.lock().unwrap_or_else(|e| e.into_inner());
        let n = (2..=254u8)
            .find(|n| !used.contains(n))
            .expect("a free 127.0.0.N");
        used.insert(n);
        format!("127.0.0.{n}")
    }

    fn free_ip(&self, ip: &str) {
        if let Some(n) = ip.rsplit('.').next().and_then(|n| n.parse::<u8>().ok()) {
            self.ips
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&n);
        }
    }

    fn spawn(&self, pod: &Pod, ip: &str) -> Result<tokio::process::Child, String> {
        let spec = pod.spec.as_ref().ok_or("no spec")?;
        let c = spec.containers.first().ok_or("no container")?;
        let env = environment(pod, c, ip, &self.config.node);
        let command = c.command.clone().unwrap_or_default();
        let (head, rest) = command
            .split_first()
            .ok_or("the container has no command (image entrypoints are not supported)")?;
        let exe = self
            .config
            .commands
            .get(head)
            .ok_or_else(|| format!("no local executable for command {head:?}"))?;
        let args: Vec<String> = rest
            .iter()
            .chain(c.args.iter().flatten())
            .map(|a| expand(a, &env))
            .collect();
        let mut env = env;
        if let (Some(creds), Some(sa)) = (&self.config.credentials, &spec.service_account_name)
            && spec.automount_service_account_token != Some(false)
        {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let path = creds.kubeconfig(ns, sa)?;
            env.insert("KUBECONFIG".into(), path.display().to_string());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(
                self.config
                    .log_dir
                    .join(format!("{}.log", self.key.replace('/', "_"))),
            )
            .map_err(|e| e.to_string())?;
        tokio::process::Command::new(exe)
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(&env)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", exe.display()))
    }

    async fn report(&self, pods: &Api<Pod>, pod: &Pod, c: &Shown<'_>) {
        let Shown {
            ip,
            started,
            container_ready,
            restarts,
            waiting,
        } = *c;
        let gates_true = pod
            .spec
            .as_ref()
            .and_then(|s| s.readiness_gates.as_ref())
            .is_none_or(|gates| {
                gates.iter().all(|g| {
                    pod.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == g.condition_type))
                        .is_some_and(|c| c.status == "True")
                })
            });
        let ready = container_ready && gates_true && pod.metadata.deletion_timestamp.is_none();
        let b = |v: bool| if v { "True" } else { "False" };
        let container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .cloned()
            .unwrap_or_default();
        let state = match waiting {
            Some(reason) => {
                json!({"waiting": {"reason": "CreateContainerError", "message": reason}})
            }
            None => json!({"running": {"startedAt": started}}),
        };
        let patch = json!({"status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": started,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": b(container_ready)},
                {"type": "Ready", "status": b(ready)},
            ],
            "containerStatuses": [{
                "name": container.name, "image": container.image.unwrap_or_default(), "imageID": "",
                "ready": container_ready, "started": waiting.is_none(), "restartCount": restarts,
                "state": state,
            }],
        }});
        if let Err(e) = pods
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            tracing::debug!(target: "ballast::e2e", pod = %self.key, error = %e, "kubelet status");
        }
    }

    async fn run(self, mut rx: mpsc::UnboundedReceiver<PodMsg>) {
        let Some(PodMsg::Update(first)) = rx.recv().await else {
            return;
        };
        let mut pod = *first;
        if pod.metadata.deletion_timestamp.is_some() {
            return self.finish(&pod, None).await;
        }
        let ns = pod.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let ip = self.take_ip();
        let started = Timestamp::now().to_string();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(1))
            .build()
            .ok();
        let container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .cloned();
        let url = container.as_ref().and_then(|c| probe_url(c, &ip));
        let period = container
            .as_ref()
            .and_then(|c| c.readiness_probe.as_ref())
            .and_then(|p| p.period_seconds)
            .map_or(Duration::from_secs(1), |s| {
                Duration::from_secs(s.max(1) as u64).min(Duration::from_secs(1))
            });
        let mut restarts = 0;
        let mut child = match self.spawn(&pod, &ip) {
            Ok(c) => Some(c),
            Err(e) => {
                let shown = Shown {
                    ip: &ip,
                    started: &started,
                    container_ready: false,
                    restarts: 0,
                    waiting: Some(&e),
                };
                self.report(&pods, &pod, &shown).await;
                None
            }
        };
        let mut ready = false;
        let mut reported: Option<Reported> = None;
        let mut tick = tokio::time::interval(period);
        loop {
            let exited = async {
                match child.as_mut() {
                    Some(c) => c.wait().await.ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(PodMsg::Update(p)) => {
                        pod = *p;
                        if pod.metadata.deletion_timestamp.is_some() {
                            let shown = Shown { ip: &ip, started: &started, container_ready: false, restarts, waiting: None };
                            self.report(&pods, &pod, &shown).await;
                            self.finish(&pod, child.take()).await;
                            self.free_ip(&ip);
                            return;
                        }
                    }
                    Some(PodMsg::Gone) | Some(PodMsg::Stop) | None => {
                        if let Some(mut c) = child.take() {
                            let _ = c.kill().await;
                        }
                        self.free_ip(&ip);
                        return;
                    }
                },
                status = exited => {
                    tracing::info!(target: "ballast::e2e", pod = %self.key, ?status, "container exited; restarting");
                    restarts += 1;
                    ready = false;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    child = self.spawn(&pod, &ip).ok();
                }
                _ = tick.tick() => {
                    if let (Some(http), Some(url)) = (&http, &url) {
                        ready = child.is_some()
                            && http.get(url).send().await.is_ok_and(|r| r.status().is_success());
                    }
                }
            }
            // Report when anything the status shows changed, the readiness gates included.
            let now = (ready, restarts, gate_states(&pod));
            if reported.as_ref() != Some(&now) {
                let shown = Shown {
                    ip: &ip,
                    started: &started,
                    container_ready: ready,
                    restarts,
                    waiting: None,
                };
                self.report(&pods, &pod, &shown).await;
                reported = Some(now);
            }
        }
    }

    /// SIGTERM, the grace period, SIGKILL, then the pod is removed from the API.
    async fn finish(&self, pod: &Pod, child: Option<tokio::process::Child>) {
        if let Some(mut c) = child {
            if let Some(pid) = c.id() {
                // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGTERM);
                }
            }
            let grace = pod
                .metadata
                .deletion_grace_period_seconds
                .or_else(|| {
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                })
                .unwrap_or(30)
                .max(0) as u64;
            if tokio::time::timeout(Duration::from_secs(grace), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
        let pods: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let _ = pods
            .delete(
                &pod.name_any(),
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_expand_as_kubernetes_expands_them() {
        let env = BTreeMap::from([("POD_IP".to_string(), "127.0.0.7".to_string())]);
        assert_eq!(expand("--host=$(POD_IP)", &env), "--host=127.0.0.7");
        assert_eq!(
            expand("$(NOPE) and $$(POD_IP)", &env),
            "$(NOPE) and $(POD_IP)"
        );
        assert_eq!(expand("cost $5", &env), "cost $5");
    }
}
