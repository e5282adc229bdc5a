//! Where reconciles read the cluster from: the reflector stores of what the operator owns
//! (Deployments, Services, PodDisruptionBudgets, control-token Secrets, engine pods,
//! ServiceMonitors, InferencePools), kept current by watches, so a settled
//! InferenceService costs the API server no request at all; and whether the ServiceMonitor
//! and InferencePool CRDs are installed, asked of the discovery API once and then again
//! every [`DISCOVERY_REFRESH`], or at once after a call answered 404 for the resource.
//!
//! A store is read only once its watch has listed everything (it is *ready*); a reconcile
//! waits up to [`STORE_SYNC_WAIT`] for that. After it, and in a [`Cache`] made without
//! stores (kube's mock API server in tests), reads go to the API server: a GET per object,
//! a LIST for the pods.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::names::{
    INFERENCE_POOL_API, SERVICE_MONITOR_API, inference_pool_resource, owned_selector,
    service_monitor_resource,
};
use crate::labels;

/// How long an answer of the discovery API about the ServiceMonitor CRD is kept: a
/// Prometheus Operator installed after Ballast gets its ServiceMonitors within this. The
/// answer is shared by every InferenceService, so this costs the API server one discovery
/// read per interval, whatever the size of the fleet.
pub const DISCOVERY_REFRESH: Duration = Duration::from_secs(10);

/// How long a Secret that an InferenceService references (`spec.auth`) is kept before it is
/// read again. Such Secrets are the user's, not labelled by the operator, so no watch
/// holds them: one GET per Secret per interval picks up a fix or a new key, at a cost that
/// does not grow with the control period's rate.
pub const REFERENCED_SECRET_REFRESH: Duration = Duration::from_secs(10);

/// How long a reconcile waits for a store that has not synced before it reads the API
/// server instead (a watch that cannot list: RBAC, an overloaded API server).
pub const STORE_SYNC_WAIT: Duration = Duration::from_secs(10);

/// The reflector stores a running operator reads.
#[derive(Clone)]
pub struct Stores {
    /// Every Deployment the Controller watches (an owned one without its labels must
    /// still be found, or its replica count would be taken for a new one's).
    pub deployments: Store<Deployment>,
    /// Engine pods (the operator's label).
    pub pods: Store<Pod>,
    /// Services the operator owns.
    pub services: Store<Service>,
    /// PodDisruptionBudgets the operator owns.
    pub pdbs: Store<PodDisruptionBudget>,
    /// Secrets the operator owns (the control tokens; its label selects them, so no other
    /// Secret of the cluster is ever held in memory).
    pub secrets: Store<Secret>,
    /// HorizontalPodAutoscalers (to tell when one targets an InferenceService whose
    /// built-in autoscaler is on).
    pub autoscalers: Store<HorizontalPodAutoscaler>,
    /// ServiceAccounts the operator owns (the gateway pickers').
    pub service_accounts: Store<ServiceAccount>,
    /// Roles the operator owns (the gateway pickers').
    pub roles: Store<Role>,
    /// RoleBindings the operator owns (the gateway pickers').
    pub role_bindings: Store<RoleBinding>,
}

/// Watcher settings of the owned kinds: only what the operator labelled, without
/// `managedFields` (kept out of memory; nothing compares them).
pub fn owned_watch() -> watcher::Config {
    watcher::Config::default().labels(&owned_selector())
}

/// A watch of `api` feeding a new store, as a stream of applied objects for the
/// Controller (which polls it, keeping the store current), and the store.
pub fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects();
    (store, stream)
}

/// Whether `store` has listed everything once.
fn ready<K>(store: &Store<K>) -> bool
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// A kind served by a CRD that may not be installed (the Prometheus Operator's
/// ServiceMonitor, the Gateway API Inference Extension's InferencePool): whether discovery
/// last found it, and a store of the operator's objects of that kind while it is there.
struct Optional {
    /// The resource.
    resource: ApiResource,
    /// Its API group and version, as discovery serves them.
    group_version: &'static str,
    held: tokio::sync::Mutex<Discovered>,
}

#[derive(Default)]
struct Discovered {
    /// When discovery last answered, and whether the CRD was installed.
    checked: Option<(Instant, bool)>,
    /// The store and the task that keeps it (dropped, and so stopped, with the CRD).
    watch: Option<(Store<DynamicObject>, tokio::task::JoinHandle<()>)>,
}

impl Drop for Discovered {
    fn drop(&mut self) {
        if let Some((_, task)) = self.watch.take() {
            task.abort();
        }
    }
}

impl Optional {
    fn new(resource: ApiResource, group_version: &'static str) -> Self {
        Self {
            resource,
            group_version,
            held: Default::default(),
        }
    }
}

/// What an optional CRD's presence means for a service.
#[derive(Debug, Clone, PartialEq)]
pub enum CrdState {
    /// The CRD is not installed: no object of its kind is built or read.
    NotInstalled,
    /// Installed; the service's object of that kind as the cluster holds it, if any.
    Installed(Option<Arc<DynamicObject>>),
}

impl CrdState {
    /// Whether the CRD is installed.
    pub fn installed(&self) -> bool {
        matches!(self, CrdState::Installed(_))
    }

    /// The live object, if the CRD is installed and there is one.
    pub fn object(&self) -> Option<&DynamicObject> {
        match self {
            CrdState::Installed(o) => o.as_deref(),
            CrdState::NotInstalled => None,
        }
    }
}

/// The reads of every reconcile.
pub struct Cache {
    client: Client,
    /// `None`: read through the API.
    stores: Option<Stores>,
    /// Where the ServiceMonitor watch looks (`None`: every namespace).
    namespace: Option<String>,
    monitors: Optional,
    pools: Optional,
    /// Referenced Secrets by namespace and name: when read, and what was there.
    referenced: std::sync::Mutex<ReferencedSecrets>,
}

type ReferencedSecrets =
    std::collections::HashMap<(String, String), (Instant, Option<Arc<Secret>>)>;

impl Cache {
    /// Reads through the API only.
    pub fn api(client: Client) -> Self {
        Self {
            client,
            stores: None,
            namespace: None,
            monitors: Optional::new(service_monitor_resource(), SERVICE_MONITOR_API),
            pools: Optional::new(inference_pool_resource(), INFERENCE_POOL_API),
            referenced: Default::default(),
        }
    }

    /// Reads from `stores` once they are ready; ServiceMonitors are watched in
    /// `namespace` (`None`: every namespace) while their CRD is installed.
    pub fn with_stores(client: Client, stores: Stores, namespace: Option<String>) -> Self {
        Self {
            client,
            stores: Some(stores),
            namespace,
            monitors: Optional::new(service_monitor_resource(), SERVICE_MONITOR_API),
            pools: Optional::new(inference_pool_resource(), INFERENCE_POOL_API),
            referenced: Default::default(),
        }
    }

    /// A store to read `K` from, when there is one and it is ready. A store that has not
    /// listed everything yet (an operator that just became leader) is waited for, up to
    /// [`STORE_SYNC_WAIT`]: its watch is driven by the Controller alongside this reconcile
    /// and lists within a round trip, so a new leader reads its caches, not the API.
    async fn store<'a, K>(
        &'a self,
        pick: impl Fn(&'a Stores) -> &'a Store<K>,
    ) -> Option<&'a Store<K>>
    where
        K: kube::runtime::reflector::Lookup + Clone + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        let store = self.stores.as_ref().map(pick)?;
        if ready(store) {
            return Some(store);
        }
        match tokio::time::timeout(STORE_SYNC_WAIT, store.wait_until_ready()).await {
            Ok(Ok(())) => Some(store),
            _ => None,
        }
    }

    async fn object<K>(
        &self,
        store: Option<&Store<K>>,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<K>>, kube::Error>
    where
        K: Resource<DynamicType = ()>
            + kube::runtime::reflector::Lookup<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + 'static,
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match store {
            Some(s) => Ok(s.get(&ObjectRef::new(name).within(namespace))),
            None => Ok(Api::<K>::namespaced(self.client.clone(), namespace)
                .get_opt(name)
                .await?
                .map(Arc::new)),
        }
    }

    /// The Deployment `namespace/name`.
    pub async fn deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Deployment>>, kube::Error> {
        self.object(self.store(|s| &s.deployments).await, namespace, name)
            .await
    }

    /// The Service `namespace/name`.
    pub async fn service(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Service>>, kube::Error> {
        self.object(self.store(|s| &s.services).await, namespace, name)
            .await
    }

    /// The PodDisruptionBudget `namespace/name`.
    pub async fn pdb(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<PodDisruptionBudget>>, kube::Error> {
        self.object(self.store(|s| &s.pdbs).await, namespace, name)
            .await
    }

    /// The ServiceAccount `namespace/name`, if the operator owns it.
    pub async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ServiceAccount>>, kube::Error> {
        self.object(self.store(|s| &s.service_accounts).await, namespace, name)
            .await
    }

    /// The Role `namespace/name`, if the operator owns it.
    pub async fn role(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Role>>, kube::Error> {
        self.object(self.store(|s| &s.roles).await, namespace, name)
            .await
    }

    /// The RoleBinding `namespace/name`, if the operator owns it.
    pub async fn role_binding(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<RoleBinding>>, kube::Error> {
        self.object(self.store(|s| &s.role_bindings).await, namespace, name)
            .await
    }

    /// The pods of service `name`'s gateway picker in `namespace`.
    pub async fn picker_pods(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Arc<Pod>>, kube::Error> {
        let selector = labels::picker_selector_labels(name);
        if let Some(store) = self.store(|s| &s.pods).await {
            return Ok(store.state_filter(|p| {
                p.namespace().as_deref() == Some(namespace)
                    && selector.iter().all(|(k, v)| p.labels().get(k) == Some(v))
            }));
        }
        let selector = selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let list = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default().labels(&selector))
            .await?;
        Ok(list.items.into_iter().map(Arc::new).collect())
    }

    /// The Secret `namespace/name`, if the operator owns it (the store holds only those).
    pub async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, kube::Error> {
        self.object(self.store(|s| &s.secrets).await, namespace, name)
            .await
    }

    /// The HorizontalPodAutoscalers in `namespace` whose scale target is InferenceService
    /// `name`, by name. Without the autoscaling/v2 API or the right to list it (404, 403)
    /// there are none.
    pub async fn autoscalers(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<String>, kube::Error> {
        let targets = |h: &HorizontalPodAutoscaler| {
            h.spec.as_ref().is_some_and(|s| {
                let r = &s.scale_target_ref;
                r.kind == "InferenceService"
                    && r.name == name
                    && r.api_version
                        .as_deref()
                        .is_some_and(|v| v.starts_with("ballast.dev/"))
            })
        };
        let mut names: Vec<String> = match self.store(|s| &s.autoscalers).await {
            Some(store) => store
                .state_filter(|h| h.namespace().as_deref() == Some(namespace) && targets(h))
                .iter()
                .map(|h| h.name_any())
                .collect(),
            None => {
                match Api::<HorizontalPodAutoscaler>::namespaced(self.client.clone(), namespace)
                    .list(&ListParams::default())
                    .await
                {
                    Ok(list) => list
                        .items
                        .iter()
                        .filter(|h| targets(h))
                        .map(|h| h.name_any())
                        .collect(),
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => Vec::new(),
                    Err(e) => return Err(e),
                }
            }
        };
        names.sort();
        Ok(names)
    }

    /// The engine pods of service `name` in `namespace` (its selector's labels).
    pub async fn pods(&self, namespace: &str, name: &str) -> Result<Vec<Arc<Pod>>, kube::Error> {
        let selector = labels::selector_labels(name);
        if let Some(store) = self.store(|s| &s.pods).await {
            return Ok(store.state_filter(|p| {
                p.namespace().as_deref() == Some(namespace)
                    && selector.iter().all(|(k, v)| p.labels().get(k) == Some(v))
            }));
        }
        let list = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default().labels(&labels::selector(name)))
            .await?;
        Ok(list.items.into_iter().map(Arc::new).collect())
    }

    /// A Secret a service references (not one the operator owns): read from the API server
    /// at most once per [`REFERENCED_SECRET_REFRESH`], `None` when there is none.
    pub async fn referenced_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, kube::Error> {
        let key = (namespace.to_string(), name.to_string());
        let lock = || self.referenced.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, secret)) = lock().get(&key)
            && at.elapsed() < REFERENCED_SECRET_REFRESH
        {
            return Ok(secret.clone());
        }
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?
            .map(Arc::new);
        let mut held = lock();
        // Secrets no longer asked for go; the map stays as large as what is referenced.
        held.retain(|_, (at, _)| at.elapsed() < REFERENCED_SECRET_REFRESH * 6);
        held.insert(key, (Instant::now(), secret.clone()));
        Ok(secret)
    }

    /// Whether the ServiceMonitor CRD is installed, and if so the service's ServiceMonitor.
    pub async fn service_monitor(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<CrdState, kube::Error> {
        self.optional(&self.monitors, namespace, name).await
    }

    /// A ServiceMonitor call answered 404 for the resource: the CRD may be gone, so the
    /// next reconcile asks discovery again.
    pub async fn service_monitors_gone(&self) {
        self.monitors.held.lock().await.checked = None;
    }

    /// Whether the InferencePool CRD (v1) is installed, and if so the InferencePool `name`.
    pub async fn inference_pool(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<CrdState, kube::Error> {
        self.optional(&self.pools, namespace, name).await
    }

    /// An InferencePool call answered 404 for the resource (see
    /// [`service_monitors_gone`](Self::service_monitors_gone)).
    pub async fn inference_pools_gone(&self) {
        self.pools.held.lock().await.checked = None;
    }

    async fn optional(
        &self,
        kind: &Optional,
        namespace: &str,
        name: &str,
    ) -> Result<CrdState, kube::Error> {
        let mut m = kind.held.lock().await;
        let installed = match m.checked {
            Some((at, installed)) if at.elapsed() < DISCOVERY_REFRESH => installed,
            _ => {
                let installed = self.discover(kind).await?;
                m.checked = Some((Instant::now(), installed));
                installed
            }
        };
        if !installed {
            if let Some((_, task)) = m.watch.take() {
                task.abort();
            }
            return Ok(CrdState::NotInstalled);
        }
        if m.watch.is_none() && self.stores.is_some() {
            m.watch = Some(self.watch_owned(&kind.resource));
        }
        if let Some((store, _)) = m.watch.as_ref().filter(|(s, _)| ready(s)) {
            let key = ObjectRef::new_with(name, kind.resource.clone()).within(namespace);
            return Ok(CrdState::Installed(store.get(&key)));
        }
        drop(m);
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &kind.resource);
        match api.get_opt(name).await {
            Ok(o) => Ok(CrdState::Installed(o.map(Arc::new))),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                // Not the object (that is `Ok(None)`): the resource itself is gone.
                kind.held.lock().await.checked = None;
                Ok(CrdState::NotInstalled)
            }
            Err(e) => Err(e),
        }
    }

    /// Asks the discovery API whether the kind's group and version serve it.
    async fn discover(&self, kind: &Optional) -> Result<bool, kube::Error> {
        match self
            .client
            .list_api_group_resources(kind.group_version)
            .await
        {
            Ok(list) => Ok(list
                .resources
                .iter()
                .any(|r| r.name == kind.resource.plural)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Starts watching the operator's objects of `resource` into a new store.
    fn watch_owned(
        &self,
        resource: &ApiResource,
    ) -> (Store<DynamicObject>, tokio::task::JoinHandle<()>) {
        let api: Api<DynamicObject> = match &self.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        let writer = reflector::store::Writer::new(resource.clone());
        let store = writer.as_reader();
        let stream = watcher(api, owned_watch())
            .default_backoff()
            .modify(|o: &mut DynamicObject| o.managed_fields_mut().clear())
            .reflect(writer);
        let kind = resource.kind.clone();
        let task = tokio::spawn(async move {
            stream
                .for_each(|event| {
                    let kind = kind.clone();
                    async move {
                        if let Err(e) = event {
                            tracing::debug!(target: "ballast::operator", error = %e, %kind, "watch");
                        }
                    }
                })
                .await;
        });
        (store, task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;

    #[test]
    fn a_store_is_ready_once_it_listed_everything() {
        let mut w: Writer<Pod> = Writer::default();
        let s = w.as_reader();
        assert!(!ready(&s));
        w.apply_watcher_event(&watcher::Event::Init);
        assert!(!ready(&s), "still listing");
        w.apply_watcher_event(&watcher::Event::InitDone);
        assert!(ready(&s));
    }
}
