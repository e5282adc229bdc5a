//! `ballast operator`: the Kubernetes client, leader election, the Controller, and the
//! operator's own HTTP endpoints (`/metrics`, `/healthz`, `/readyz`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use ballast_crds::InferenceService;
use clap::Args;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde::de::DeserializeOwned;

use super::cache::{Cache, Stores, owned_watch, reflect};
use super::context::{Config, Context};
use super::leader::Elector;
use super::pipeline::{error_policy, reconcile};
use super::snapshot::PodView;
use crate::metrics::OperatorMetrics;
use crate::metrics_api::server::{self, MetricsApiArgs, StartError};
use crate::metrics_api::values::Board;

use crate::labels::METRICS_API_LEADER as LEADER_LABEL;

/// Sets or clears [`LEADER_LABEL`] on this replica's own pod.
struct LeaderLabel {
    pods: Api<Pod>,
    name: String,
}

impl LeaderLabel {
    fn new(pods: Api<Pod>, name: String) -> Self {
        Self { pods, name }
    }

    /// Sets the label (`true`) or removes it; a failure is logged (the pod may not be
    /// ours to label, outside a cluster).
    async fn set(&self, leading: bool) {
        let value = if leading {
            serde_json::json!("true")
        } else {
            serde_json::Value::Null
        };
        let patch = serde_json::json!({"metadata": {"labels": {LEADER_LABEL: value}}});
        if let Err(e) = self
            .pods
            .patch(
                &self.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            tracing::warn!(target: "ballast::operator", pod = %self.name, error = %e, "cannot label this operator pod as the leader (metrics APIs, KEDA scaler)");
        }
    }
}

/// Flags of `ballast operator`.
#[derive(Debug, Clone, Args)]
pub struct OperatorArgs {
    /// Watch InferenceServices in this namespace only [default: every namespace].
    #[arg(long, env = "BALLAST_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,

    /// Port of `/metrics`, `/healthz` and `/readyz`.
    #[arg(
        long,
        env = "BALLAST_METRICS_PORT",
        value_name = "PORT",
        default_value_t = 8080
    )]
    pub metrics_port: u16,

    /// Address those endpoints bind to.
    #[arg(
        long,
        env = "BALLAST_METRICS_HOST",
        value_name = "HOST",
        default_value = "0.0.0.0"
    )]
    pub metrics_host: std::net::IpAddr,

    /// Image of `engine.kind: ballast` replicas whose spec names none.
    #[arg(
        long,
        env = "BALLAST_ENGINE_IMAGE",
        value_name = "IMAGE",
        default_value = ""
    )]
    pub engine_image: String,

    /// Advise on every InferenceService, as `spec.autoscaling.mode: Advise` does for one:
    /// scrape, decide and explain (status, conditions, Events, metrics, the metrics APIs),
    /// but write no replica count, deletion cost or DP weight and take no pod out of
    /// rotation.
    #[arg(long, env = "BALLAST_ADVISE")]
    pub advise: bool,

    /// Run without leader election (one operator replica only).
    #[arg(long, env = "BALLAST_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "BALLAST_LEASE_NAME",
        value_name = "NAME",
        default_value = "ballast-operator"
    )]
    pub lease_name: String,

    /// Namespace of the Lease [default: the pod's namespace (POD_NAMESPACE), else `default`].
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    pub lease_namespace: Option<String>,

    /// Seconds a leader holds the Lease without renewing it.
    #[arg(
        long,
        env = "BALLAST_LEASE_SECONDS",
        value_name = "SECS",
        default_value_t = 15
    )]
    pub lease_seconds: u64,

    /// This replica's identity in the Lease [default: the pod's name (POD_NAME), else the
    /// host name and process id].
    #[arg(long, env = "POD_NAME", value_name = "ID")]
    pub identity: Option<String>,

    /// The metrics APIs for HPA and KEDA.
    #[command(flatten)]
    pub metrics_api: MetricsApiArgs,

    /// Serve KEDA's external-scaler gRPC protocol on this port (plain HTTP/2; the leader
    /// answers) [default: off].
    #[arg(long, env = "BALLAST_KEDA_PORT", value_name = "PORT")]
    pub keda_port: Option<u16>,

    /// Address the external scaler binds to.
    #[arg(
        long,
        env = "BALLAST_KEDA_HOST",
        value_name = "HOST",
        default_value = "0.0.0.0"
    )]
    pub keda_host: std::net::IpAddr,
}

/// Why `ballast operator` stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// No Kubernetes configuration (neither in-cluster nor KUBECONFIG).
    #[error("cannot configure a Kubernetes client: {0}")]
    Config(#[source] kube::Error),
    /// The metrics port cannot be bound.
    #[error("cannot listen on {addr} (--metrics-port): {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The external scaler's port cannot be bound.
    #[error("cannot listen on {addr} (--keda-port): {source}")]
    KedaListen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The leader lease was lost: another replica acts now; this one exits so that it
    /// restarts as a candidate.
    #[error("lost the leader lease")]
    LostLease,
    /// The metrics APIs cannot start.
    #[error(transparent)]
    MetricsApi(#[from] StartError),
}

impl OperatorError {
    /// Process exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            OperatorError::Config(_) | OperatorError::MetricsApi(StartError::Cert(_)) => 2,
            OperatorError::Listen { .. }
            | OperatorError::KedaListen { .. }
            | OperatorError::LostLease
            | OperatorError::MetricsApi(StartError::Listen { .. }) => 1,
        }
    }
}

/// What `/readyz` says.
const STARTING: u8 = 0;
const STANDBY: u8 = 1;
const LEADING: u8 = 2;

#[derive(Clone)]
struct Admin {
    metrics: Arc<OperatorMetrics>,
    role: Arc<AtomicU8>,
}

fn admin_router(admin: Admin) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(a): State<Admin>| async move { a.metrics.http_response() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(a): State<Admin>| async move {
                match a.role.load(Ordering::SeqCst) {
                    LEADING => (StatusCode::OK, "leader").into_response(),
                    STANDBY => (StatusCode::OK, "standby").into_response(),
                    _ => (StatusCode::SERVICE_UNAVAILABLE, "starting").into_response(),
                }
            }),
        )
        .with_state(admin)
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "ballast-operator".into());
    format!("{host}-{}", std::process::id())
}

/// Runs the operator until `shutdown` resolves (the binary passes SIGTERM/SIGINT) or the
/// leader lease is lost: its own port, the leader's endpoints (metrics APIs, KEDA's
/// scaler), the wait for the Lease, then the controller.
pub async fn run(
    args: OperatorArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), OperatorError> {
    // A bad certificate file is a flag error: said before anything else starts.
    let serving_cert = match args.metrics_api.metrics_api_port {
        Some(_) => Some(server::serving_cert(&args.metrics_api)?),
        None => None,
    };
    let client = Client::try_default().await.map_err(OperatorError::Config)?;
    let metrics = Arc::new(OperatorMetrics::new());
    let role = Arc::new(AtomicU8::new(STARTING));
    // As an engine does: connections and watches need descriptors.
    ballast_serve::raise_open_files_limit();
    // Each server is held until `run` returns: dropping one closes its port.
    let _admin = serve_admin(&args, &metrics, &role).await?;
    let board = Arc::new(Board::default());
    let leading = Arc::new(AtomicBool::new(false));
    let pod = leader_label(&args, &client);
    let _metrics_api =
        serve_leader_endpoints(&args, &client, serving_cert, &board, &leading, pod.as_ref())
            .await?;

    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let Some(elector) = lead(
        &args,
        &client,
        &identity,
        (&role, &leading, &metrics),
        pod.as_ref(),
        stop_rx.clone(),
    )
    .await
    else {
        return Ok(());
    };
    let controller = control(&args, client, metrics, board, &identity, stop_rx);
    let lost = async {
        match &elector {
            Some(e) => e.hold().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = controller => Ok(()),
        _ = lost => Err(OperatorError::LostLease),
    }
}

/// Resolves once `rx` says stop.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// `/metrics`, `/healthz` and `/readyz` on `--metrics-host:--metrics-port`, on the
/// engine's accept loop (a connection cap, header and idle timeouts).
async fn serve_admin(
    args: &OperatorArgs,
    metrics: &Arc<OperatorMetrics>,
    role: &Arc<AtomicU8>,
) -> Result<ballast_serve::Connections, OperatorError> {
    let addr = std::net::SocketAddr::new(args.metrics_host, args.metrics_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| OperatorError::Listen { addr, source })?;
    // Printed (not logged) so scripts and tests can read the port.
    println!(
        "ballast operator metrics listening on http://{}",
        listener
            .local_addr()
            .map_err(|source| OperatorError::Listen { addr, source })?
    );
    let app = admin_router(Admin {
        metrics: Arc::clone(metrics),
        role: Arc::clone(role),
    });
    Ok(ballast_serve::Connections::start(
        listener,
        app,
        &crate::ADMIN_HTTP_LIMITS,
    ))
}

/// This replica's own pod, to label while it leads, when a Service must select the
/// leader alone (the metrics APIs, KEDA's scaler) and the pod is known.
fn leader_label(args: &OperatorArgs, client: &Client) -> Option<LeaderLabel> {
    match (std::env::var("POD_NAME"), &args.lease_namespace) {
        (Ok(name), Some(ns))
            if args.metrics_api.metrics_api_port.is_some() || args.keda_port.is_some() =>
        {
            Some(LeaderLabel::new(Api::namespaced(client.clone(), ns), name))
        }
        _ => None,
    }
}

/// The metrics APIs and KEDA's scaler, which answer from the first request on (health,
/// discovery) and with values only while this replica leads (docs/autoscalers.md says
/// why); the pod's leader label is cleared until then. Returns the metrics-API server.
async fn serve_leader_endpoints(
    args: &OperatorArgs,
    client: &Client,
    serving_cert: Option<Arc<crate::metrics_api::tls::ServingCert>>,
    board: &Arc<Board>,
    leading: &Arc<AtomicBool>,
    pod: Option<&LeaderLabel>,
) -> Result<Option<(std::net::SocketAddr, ballast_serve::Connections)>, OperatorError> {
    if let Some(pod) = pod {
        pod.set(false).await;
    }
    let mut metrics_api = None;
    if let (Some(port), Some(cert)) = (args.metrics_api.metrics_api_port, serving_cert) {
        let lease_ns = args.lease_namespace.as_deref().unwrap_or("default");
        if let Some(settings) = args.metrics_api.cert_settings(lease_ns) {
            crate::metrics_api::certs::keep(client.clone(), settings, Arc::clone(&cert));
        }
        metrics_api = Some(
            server::start(
                &args.metrics_api,
                port,
                cert,
                Arc::clone(board),
                Arc::clone(leading),
                client.clone(),
            )
            .await?,
        );
    }
    if let Some(port) = args.keda_port {
        let addr = std::net::SocketAddr::new(args.keda_host, port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| OperatorError::KedaListen { addr, source })?;
        let bound = crate::keda::serve(
            listener,
            crate::keda::Scaler::new(Arc::clone(board), Arc::clone(leading)),
        )
        .map_err(|source| OperatorError::KedaListen { addr, source })?;
        // Printed (not logged) so scripts and tests can read the port.
        println!("ballast operator KEDA external scaler listening on {bound}");
    }
    Ok(metrics_api)
}

/// Waits for the Lease (unless leader election is off), then marks this replica the
/// leader everywhere it shows: `/readyz`, the endpoints' flag, the pod's label, the
/// metric. `None` when told to stop first; else the elector, if any, to hold the Lease.
async fn lead(
    args: &OperatorArgs,
    client: &Client,
    identity: &str,
    (role, leading, metrics): (&AtomicU8, &AtomicBool, &OperatorMetrics),
    pod: Option<&LeaderLabel>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Option<Option<Elector>> {
    let elector = (!args.no_leader_election).then(|| {
        let ns = args.lease_namespace.as_deref().unwrap_or("default");
        Elector::new(
            Api::<Lease>::namespaced(client.clone(), ns),
            &args.lease_name,
            identity,
            Duration::from_secs(args.lease_seconds.max(3)),
        )
    });
    if let Some(e) = &elector {
        role.store(STANDBY, Ordering::SeqCst);
        metrics.leader.set(0);
        tracing::info!(target: "ballast::operator", identity = %e.identity(), lease = %args.lease_name, "waiting for the leader lease");
        tokio::select! {
            _ = e.acquire(e.renew_every()) => {}
            _ = stopped(stop) => return None,
        }
    }
    role.store(LEADING, Ordering::SeqCst);
    leading.store(true, Ordering::SeqCst);
    if let Some(pod) = pod {
        pod.set(true).await;
    }
    metrics.leader.set(1);
    tracing::info!(target: "ballast::operator", identity = %identity, "leading: reconciling InferenceServices");
    Some(elector)
}

/// `--namespace`, or every namespace.
fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The HorizontalPodAutoscalers, for the store only: a reconcile reads whether one targets
/// its service each period (AutoscalerConflict).
fn autoscalers(
    client: &Client,
    ns: Option<&str>,
) -> kube::runtime::reflector::Store<HorizontalPodAutoscaler> {
    let (store, events) = reflect(
        api::<HorizontalPodAutoscaler>(client, ns),
        watcher::Config::default(),
    );
    tokio::spawn(events.for_each(|event| async move {
        if let Err(e) = event {
            tracing::debug!(target: "ballast::operator", error = %e, "HorizontalPodAutoscaler watch");
        }
    }));
    store
}

/// The controller: the watches that feed the stores reconciles read and trigger them,
/// and the reconcile loop, until `stop`.
fn control(
    args: &OperatorArgs,
    client: Client,
    metrics: Arc<OperatorMetrics>,
    board: Arc<Board>,
    identity: &str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> {
    let ns = args.namespace.as_deref();
    // One watch per owned kind feeds the store reconciles read and triggers a reconcile of
    // the owner when an object changes (a deleted Service is put back at once). Every
    // Deployment is watched, as the Controller's `owns` did: an owned one a user relabelled
    // must still be found, or its size would be taken for a new service's. A pod triggers
    // its service's reconcile only when what the status shows of it changes (a container
    // that cannot start, readiness, deletion: [`PodView::signature`]), so `Degraded`
    // follows the kubelet within seconds, not at the next period, and the pod updates a
    // busy fleet makes all the time cost nothing.
    let (deployments, deployment_events) =
        reflect(api::<Deployment>(&client, ns), watcher::Config::default());
    let (services, service_events) = reflect(api::<Service>(&client, ns), owned_watch());
    let (pdbs, pdb_events) = reflect(api::<PodDisruptionBudget>(&client, ns), owned_watch());
    // Only the Secrets the operator labelled (the control tokens): a deleted one is put
    // back, and a settled service reads its token from memory, never from the API server.
    let (secrets, secret_events) = reflect(api::<Secret>(&client, ns), owned_watch());
    let (pods, pod_events) = reflect(api::<Pod>(&client, ns), owned_watch());
    // The gateway's picker runs as an account of its own with a Role of its own.
    let (service_accounts, service_account_events) =
        reflect(api::<ServiceAccount>(&client, ns), owned_watch());
    let (roles, role_events) = reflect(api::<Role>(&client, ns), owned_watch());
    let (role_bindings, role_binding_events) =
        reflect(api::<RoleBinding>(&client, ns), owned_watch());
    let pod_triggers = pod_events.filter(changed_pods());
    let stores = Stores {
        deployments,
        pods,
        services,
        pdbs,
        secrets,
        autoscalers: autoscalers(&client, ns),
        service_accounts,
        roles,
        role_bindings,
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ballast-operator".into(),
            instance: Some(identity.to_string()),
        },
    );
    let ctx = Context::with_cache(
        client.clone(),
        Cache::with_stores(client.clone(), stores, args.namespace.clone()),
        Config {
            default_engine_image: args.engine_image.clone(),
            advise: args.advise,
        },
        metrics,
        recorder,
        board,
    );
    Controller::new(
        api::<InferenceService>(&client, ns),
        watcher::Config::default(),
    )
    .owns_stream(deployment_events)
    .owns_stream(service_events)
    .owns_stream(pdb_events)
    .owns_stream(secret_events)
    .owns_stream(service_account_events)
    .owns_stream(role_events)
    .owns_stream(role_binding_events)
    .watches_stream(pod_triggers, |pod: Pod| {
        let service = pod.labels().get(crate::labels::INSTANCE)?.clone();
        Some(ObjectRef::new(&service).within(&pod.namespace()?))
    })
    .graceful_shutdown_on(stopped(stop))
    .run(reconcile, error_policy, ctx)
    .for_each(|result| async move {
        if let Err(e) = result {
            tracing::debug!(target: "ballast::operator", error = %e, "controller event");
        }
    })
}

/// How many pods [`changed_pods`] remembers before it forgets them all (each then triggers
/// one reconcile more, no harm): deleted pods leave no event to forget them by.
const REMEMBERED_PODS: usize = 50_000;

/// A filter for the pod watch that passes a pod only when its [`PodView::signature`]
/// differs from the last one seen for it (and every watch error, which the Controller
/// logs).
fn changed_pods() -> impl FnMut(&Result<Pod, watcher::Error>) -> futures::future::Ready<bool> {
    type Signature = (Option<String>, bool, bool);
    let mut seen: std::collections::HashMap<String, Signature> = Default::default();
    move |event| {
        let pass = match event {
            Ok(pod) => {
                let view = PodView::of(pod);
                let (failure, serving, leaving) = view.signature();
                let signature = (failure.map(str::to_string), serving, leaving);
                if seen.len() >= REMEMBERED_PODS {
                    seen.clear();
                }
                let key = pod
                    .metadata
                    .uid
                    .clone()
                    .unwrap_or_else(|| view.name.clone());
                seen.insert(key, signature.clone()) != Some(signature)
            }
            Err(_) => true,
        };
        futures::future::ready(pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodCondition, PodStatus,
    };

    fn pod(uid: &str, ready: &str, waiting: Option<&str>, ip: &str) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("pod-{uid}")),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                conditions: Some(vec![PodCondition {
                    type_: "ContainersReady".into(),
                    status: ready.into(),
                    ..PodCondition::default()
                }]),
                container_statuses: Some(vec![ContainerStatus {
                    name: "engine".into(),
                    state: waiting.map(|r| ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(r.into()),
                            message: Some("back-off".into()),
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn a_pod_triggers_a_reconcile_only_when_what_the_status_shows_of_it_changes() {
        let mut filter = changed_pods();
        let mut pass = |p: Pod| filter(&Ok(p)).into_inner();
        assert!(pass(pod("a", "False", None, "10.0.0.1")), "first sight");
        assert!(!pass(pod("a", "False", None, "10.0.0.1")), "nothing new");
        assert!(pass(pod("a", "False", Some("ErrImagePull"), "10.0.0.1")));
        assert!(pass(pod(
            "a",
            "False",
            Some("ImagePullBackOff"),
            "10.0.0.1"
        )));
        assert!(!pass(pod(
            "a",
            "False",
            Some("ImagePullBackOff"),
            "10.0.0.1"
        )));
        assert!(
            pass(pod("a", "True", None, "10.0.0.1")),
            "running and ready"
        );
        // An IP alone (or any other field) is not what the status shows.
        assert!(!pass(pod("a", "True", None, "10.0.0.9")));
        assert!(pass(pod("b", "True", None, "10.0.0.2")), "another pod");
        assert!(filter(&Err(watcher::Error::NoResourceVersion)).into_inner());
    }
}
