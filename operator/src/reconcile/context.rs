//! What every reconcile shares ([`Context`]: the client, the caches, the metrics, the
//! Event recorder) and what each InferenceService keeps between reconciles
//! ([`ServiceState`]). Below the steps: they use it, it uses none of them.

use std::collections::HashMap;
use std::sync::Arc;

use ballast_crds::InferenceService;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::Mutex;

use super::cache::Cache;
use crate::metrics::OperatorMetrics;
use crate::metrics_api::values::Board;
use crate::period::ControlPeriod;

/// What the reconciler is configured with.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Image for `kind: ballast` replicas whose spec names none.
    pub default_engine_image: String,
    /// `--advise`: every service is advised, as with `spec.autoscaling.mode: Advise`.
    pub advise: bool,
}

/// The replica count a decision wanted, and the generation of the spec it decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// Replicas to run.
    pub replicas: i32,
    /// `metadata.generation` of the spec decided on.
    pub generation: Option<i64>,
}

/// One resource's memory between reconciles. In memory only: a restarted or new leader
/// starts from the current size, as the decision core's empty-history rule says.
pub struct ServiceState {
    /// The control period: history, tracker, scraper, schedule, DP weights and clients.
    pub period: ControlPeriod,
    /// What this process's last decision wanted (`None` before its first).
    pub wanted: Option<Wanted>,
    /// Failed reconciles in a row.
    pub failures: u32,
}

/// A resource by namespace and name.
type ResourceKey = (String, String);

/// Shared by every reconcile.
pub struct Context {
    /// The Kubernetes client (writes; reads go through [`Context::cache`]).
    pub client: Client,
    /// Where reconciles read the cluster from.
    pub cache: Cache,
    /// Configuration.
    pub config: Config,
    /// The operator's metrics.
    pub metrics: Arc<OperatorMetrics>,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Each service's values from its last control period, for the metrics APIs.
    pub board: Arc<Board>,
    states: std::sync::Mutex<HashMap<ResourceKey, Arc<Mutex<ServiceState>>>>,
}

impl Context {
    /// A context over `client` that reads through the API (a GET or LIST per object per
    /// reconcile): for a client without watches, as kube's mock API server in tests.
    /// `ballast operator` reads its reflector stores instead ([`Context::with_cache`]).
    pub fn new(
        client: Client,
        config: Config,
        metrics: Arc<OperatorMetrics>,
        recorder: Recorder,
    ) -> Arc<Self> {
        let cache = Cache::api(client.clone());
        Self::with_cache(client, cache, config, metrics, recorder, Arc::default())
    }

    /// A context that reads from `cache` and publishes each period's values on `board`.
    pub fn with_cache(
        client: Client,
        cache: Cache,
        config: Config,
        metrics: Arc<OperatorMetrics>,
        recorder: Recorder,
        board: Arc<Board>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            cache,
            config,
            metrics,
            recorder,
            board,
            states: Default::default(),
        })
    }

    /// The memory of `ns/name`, made on first use.
    pub fn state(&self, ns: &str, name: &str) -> Arc<Mutex<ServiceState>> {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            states
                .entry((ns.to_string(), name.to_string()))
                .or_insert_with(|| {
                    Arc::new(Mutex::new(ServiceState {
                        period: ControlPeriod::new(ns, name, None),
                        wanted: None,
                        failures: 0,
                    }))
                }),
        )
    }

    /// Forgets `ns/name` (it was deleted).
    pub fn forget(&self, ns: &str, name: &str) {
        self.board.forget(ns, name);
        self.states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ns.to_string(), name.to_string()));
    }

    /// Counts a write to the API server (`ballast_operator_api_writes_total`).
    pub fn count_write(&self, ns: &str, name: &str, object: &str, wrote: bool) {
        if wrote {
            self.metrics
                .api_writes
                .with_label_values(&[ns, name, object])
                .inc();
        }
    }

    /// Publishes an Event about `isvc` (a note cut to 1,000 characters); a failure is
    /// logged, never an error of the reconcile.
    pub async fn event(
        &self,
        isvc: &InferenceService,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        match self.recorder.publish(&ev, &isvc.object_ref(&())).await {
            Ok(()) => self.count_write(
                &isvc.namespace().unwrap_or_default(),
                &isvc.name_any(),
                "event",
                true,
            ),
            Err(e) => {
                tracing::warn!(target: "ballast::operator", error = %e, "cannot publish an event")
            }
        }
    }
}
