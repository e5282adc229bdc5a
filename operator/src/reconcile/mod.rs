//! The Kubernetes runtime (`ballast operator`): a kube-runtime `Controller` over
//! InferenceServices that runs each one's control loop in the cluster.
//!
//! A reconcile is a pipeline, one module per step:
//!
//! ```text
//! fetch → validate → scrape → decide → build → apply → status
//! ```
//!
//! - [`fetch`]: the Deployment and its pods, each reduced to a [`fetch::PodView`];
//! - validate: the CRD's rules (`InferenceServiceSpec::validate`) and what only a cluster
//!   needs (an image); an invalid spec waits for a change with a condition saying why;
//! - scrape and [`decide`]: the ready pods on their pod IPs with the shared scraper, the
//!   shared decision core on the result (at most once per `scrapeIntervalSeconds`; a
//!   reconcile triggered sooner by a watch event reuses the last decision);
//! - [`build`]: the Deployment, Service, PDB and ServiceMonitor as plain values;
//! - [`apply`]: server-side apply of what differs from the live objects (nothing when the
//!   spec is unchanged), pod rotation through the `ballast.dev/accepting` readiness gate,
//!   deletion costs before a scale-down, DP weights over each pod's control API;
//! - [`status`]: the status subresource, written only when it changed, and an Event for
//!   each decision that changed something and each warning.
//!
//! Memory between reconciles (the decision history, the scrape tracker, control channels)
//! is per resource and in memory: a restarted or new leader starts from the current size,
//! as the decision core's empty-history rule says.

pub mod apply;
pub mod build;
pub mod decide;
pub mod error;
pub mod fetch;
pub mod leader;
pub mod rbac;
mod run;
pub mod status;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_crds::{Action as DecisionAction, InferenceService};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

pub use error::Error;
pub use run::{OperatorArgs, OperatorError, run};

use crate::control::EngineControlClient;
use crate::control::proto::SetDpWeightsRequest;
use crate::decide::{DpWeights, History, Outcome};
use crate::metrics::OperatorMetrics;
use crate::scrape::{ScrapeConfig, Scraper, Tracker};
use crate::signals::{Dialect, FleetSignals};
use crate::status::ConditionSet;

/// Connect and call timeout of an engine's control API.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// What the reconciler is configured with.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Image for `kind: ballast` replicas whose spec names none.
    pub default_engine_image: String,
}

/// One resource's memory between reconciles.
#[derive(Default)]
struct ServiceState {
    history: History,
    tracker: Tracker,
    scraper: Option<(ScrapeConfig, Scraper)>,
    epoch: Option<Instant>,
    /// When the last control period ran, and the replica count it wanted.
    last_period: Option<(Instant, i32)>,
    dp_weights: BTreeMap<String, Vec<f64>>,
    controls: BTreeMap<String, EngineControlClient<Channel>>,
    failures: u32,
}

/// A resource by namespace and name.
type ResourceKey = (String, String);

/// Shared by every reconcile.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Configuration.
    pub config: Config,
    /// The operator's metrics.
    pub metrics: Arc<OperatorMetrics>,
    /// Publishes Events.
    pub recorder: Recorder,
    states: std::sync::Mutex<HashMap<ResourceKey, Arc<Mutex<ServiceState>>>>,
}

impl Context {
    /// A context over `client`.
    pub fn new(
        client: Client,
        config: Config,
        metrics: Arc<OperatorMetrics>,
        recorder: Recorder,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            config,
            metrics,
            recorder,
            states: Default::default(),
        })
    }

    fn state(&self, ns: &str, name: &str) -> Arc<Mutex<ServiceState>> {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            states
                .entry((ns.to_string(), name.to_string()))
                .or_default(),
        )
    }

    fn forget(&self, ns: &str, name: &str) {
        self.states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ns.to_string(), name.to_string()));
    }

    fn count_write(&self, ns: &str, name: &str, object: &str, wrote: bool) {
        if wrote {
            self.metrics
                .api_writes
                .with_label_values(&[ns, name, object])
                .inc();
        }
    }

    async fn event(&self, isvc: &InferenceService, type_: EventType, reason: &str, note: String) {
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

/// The validation a cluster adds to the CRD's rules.
pub fn validate(isvc: &InferenceService, config: &Config) -> Result<(), Vec<String>> {
    let mut errors = isvc.spec.validate().err().unwrap_or_default();
    if isvc.spec.engine.image.is_empty()
        && (isvc.spec.engine.kind != ballast_crds::EngineKind::Ballast
            || config.default_engine_image.is_empty())
    {
        errors.push(
            "spec.engine.image is required (the operator's --engine-image applies to kind ballast only)"
                .into(),
        );
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Reconciles one InferenceService (see the module docs for the steps).
pub async fn reconcile(isvc: Arc<InferenceService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = isvc.namespace().unwrap_or_default();
    let name = isvc.name_any();
    let isvcs: Api<InferenceService> = Api::namespaced(ctx.client.clone(), &ns);
    if isvc.metadata.deletion_timestamp.is_some() {
        // Owner references garbage-collect every owned object.
        ctx.forget(&ns, &name);
        return Ok(Action::await_change());
    }
    let state = ctx.state(&ns, &name);
    let mut state = state.lock().await;
    match reconcile_inner(&isvc, &ctx, &isvcs, &mut state).await {
        Ok(action) => {
            state.failures = 0;
            Ok(action)
        }
        Err(e) => {
            state.failures += 1;
            if state.failures == 1 {
                ctx.event(
                    &isvc,
                    EventType::Warning,
                    "ReconcileFailed",
                    format!("{} ({})", e, e.category()),
                )
                .await;
            }
            Err(e)
        }
    }
}

async fn reconcile_inner(
    isvc: &InferenceService,
    ctx: &Context,
    isvcs: &Api<InferenceService>,
    state: &mut ServiceState,
) -> Result<Action, Error> {
    let ns = isvc.namespace().unwrap_or_default();
    let name = isvc.name_any();
    let client = &ctx.client;
    let now = Time(Timestamp::now());
    let period = Duration::from_secs(isvc.spec.metrics.scrape_interval_seconds.max(1) as u64);

    // validate
    if let Err(errors) = validate(isvc, &ctx.config) {
        let message = errors.join("; ");
        let s = status::status(status::NewStatus {
            isvc,
            counts: Default::default(),
            desired: isvc.status.as_ref().map_or(0, |s| s.desired_replicas),
            decision: None,
            conditions: vec![
                ConditionSet {
                    type_: "ScalingActive",
                    status: false,
                    reason: "InvalidSpec",
                    message: message.clone(),
                },
                ConditionSet {
                    type_: "Degraded",
                    status: true,
                    reason: "InvalidSpec",
                    message: message.clone(),
                },
            ],
            scaled: false,
            now,
        });
        let wrote = status::write(isvcs, isvc, &s).await?;
        ctx.count_write(&ns, &name, "status", wrote);
        if wrote {
            ctx.event(isvc, EventType::Warning, "InvalidSpec", message)
                .await;
        }
        return Ok(Action::await_change());
    }

    // fetch
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let observed = fetch::fetch(&deployments, &pods, &name).await?;
    let counts = observed.counts();
    let current = observed
        .deployment_replicas()
        .unwrap_or_else(|| isvc.spec.initial_replicas());

    // scrape and decide, once per period
    let due = state
        .last_period
        .as_ref()
        .is_none_or(|(at, _)| at.elapsed() >= period);
    let mut fleet = FleetSignals::default();
    let mut decided = None;
    if due {
        let config = ScrapeConfig::from_spec(&isvc.spec.metrics);
        if state.scraper.as_ref().is_none_or(|(c, _)| *c != config) {
            state.scraper = Some((config.clone(), Scraper::new(config)));
        }
        let scraper = &state.scraper.as_ref().expect("just set").1;
        let t0 = Instant::now();
        let outcomes = scraper
            .scrape(
                Dialect::from(isvc.spec.engine.kind),
                &decide::targets(isvc, &observed),
            )
            .await;
        let m = &ctx.metrics;
        m.scrape_duration
            .with_label_values(&[&ns, &name])
            .observe(t0.elapsed().as_secs_f64());
        for o in &outcomes {
            if let Err(e) = &o.result {
                m.scrape_errors
                    .with_label_values(&[&ns, &name, e.reason()])
                    .inc();
            }
        }
        // A leader that just started (or meets a service whose first replicas just became
        // ready) has no previous sample, so no counter rate yet: deciding now would flip
        // conditions to "signal missing" and back one period later, two status writes for
        // nothing. That first period only seeds the tracker.
        let seeding = state.tracker.tracked() == 0 && outcomes.iter().any(|o| o.result.is_ok());
        fleet = state
            .tracker
            .observe_outcomes(Instant::now(), &outcomes, counts.starting as usize);
        if seeding {
            let kept = state.last_period.map_or(current, |(_, d)| d);
            state.last_period = Some((Instant::now(), kept));
        } else {
            let input = decide::input(isvc, &observed, fleet.clone(), &state.dp_weights);
            let epoch = *state.epoch.get_or_insert_with(Instant::now);
            let outcome = crate::decide::decide(&input, &state.history, epoch.elapsed());
            state
                .history
                .record(&outcome.history, outcome.desired_replicas != current);
            state.last_period = Some((Instant::now(), outcome.desired_replicas));
            decided = Some(outcome);
        }
    }
    let desired = state.last_period.map_or(current, |(_, d)| d);

    // build
    let service_monitor_crd = apply::service_monitor_crd(client).await?;
    let objects = build::build(&build::BuildInput {
        isvc,
        replicas: desired,
        default_image: &ctx.config.default_engine_image,
        service_monitor_crd,
    })?;

    // apply: deletion costs first, so the scale-down removes the least-loaded pods
    if desired < current {
        for (pod, cost) in decide::deletion_costs(&observed, &fleet) {
            apply::set_deletion_cost(&pods, &pod, cost).await?;
            ctx.count_write(&ns, &name, "pod", true);
        }
    }
    let wrote = apply::apply(&deployments, &name, &objects.deployment).await?;
    ctx.count_write(&ns, &name, "deployment", wrote);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let wrote = apply::apply(&services, &name, &objects.service).await?;
    ctx.count_write(&ns, &name, "service", wrote);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let wrote = apply::apply(&pdbs, &name, &objects.pdb).await?;
    ctx.count_write(&ns, &name, "pdb", wrote);
    let wrote = apply::service_monitor(
        client,
        &ns,
        &name,
        objects.service_monitor.as_ref(),
        service_monitor_crd,
    )
    .await?;
    ctx.count_write(&ns, &name, "servicemonitor", wrote);

    // rotation: the accepting readiness gate of every ready pod
    let plan = decided
        .as_ref()
        .map(|o| o.rebalance.clone())
        .unwrap_or_default();
    for (pod, accepting) in decide::rotation(&observed, &plan) {
        let (reason, message) = if accepting {
            ("InRotation", "taking new requests")
        } else {
            ("OutOfRotation", "hot: taken out of rotation by rebalancing")
        };
        apply::set_accepting(&pods, &pod, accepting, reason, message).await?;
        ctx.count_write(&ns, &name, "pod", true);
    }
    set_dp_weights(isvc, state, &observed, &plan.dp_weights).await;

    // status and events
    let outcome = decided.as_ref();
    let conditions: Vec<ConditionSet> = outcome
        .map(|o| {
            o.conditions
                .iter()
                .map(|c| ConditionSet {
                    type_: c.kind.as_str(),
                    status: c.status,
                    reason: c.reason,
                    message: c.message.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    let mut conditions = conditions;
    // Pods that cannot run (image, container creation, crash loop) make it Degraded; a
    // spec that was invalid and pods that recovered turn it False again, or it would stay.
    let live_degraded = status::live_condition(isvc, "Degraded");
    let degraded =
        status::degraded_condition(live_degraded, status::start_failure_condition(&observed));
    // An Event when Degraded turns True or changes reason, or recovers from pods that
    // could not run (not when only the message moves, as back-off times do).
    let degraded_event = degraded.as_ref().and_then(|c| {
        let flipped = live_degraded.is_none_or(|l| (l.status == "True") != c.status);
        let changed = flipped || live_degraded.is_some_and(|l| l.reason != c.reason);
        match (c.status, changed) {
            (true, true) => Some((EventType::Warning, c.reason, c.message.clone())),
            (false, true) if c.reason == "EnginesRunning" => {
                Some((EventType::Normal, c.reason, c.message.clone()))
            }
            _ => None,
        }
    });
    conditions.extend(degraded);
    let s = status::status(status::NewStatus {
        isvc,
        counts,
        desired,
        decision: outcome.map(|o| o.to_status_decision(now.0.to_string())),
        conditions,
        scaled: desired != current,
        now,
    });
    let wrote = status::write(isvcs, isvc, &s).await?;
    ctx.count_write(&ns, &name, "status", wrote);
    if let (true, Some((type_, reason, message))) = (wrote, degraded_event) {
        ctx.event(isvc, type_, reason, message).await;
    }
    if let Some(o) = outcome {
        record(ctx, isvc, o).await;
    }
    let m = &ctx.metrics;
    for (label, v) in [
        ("ready", counts.ready),
        ("starting", counts.starting),
        ("draining", counts.draining),
        ("accepting", counts.accepting),
    ] {
        m.replicas
            .with_label_values(&[&ns, &name, label])
            .set(v as i64);
    }
    m.desired_replicas
        .with_label_values(&[&ns, &name])
        .set(desired as i64);
    let a = &isvc.spec.autoscaling;
    m.register_service(&ns, &name);
    m.record_bounds(&ns, &name, a.min_replicas, a.max_replicas);
    m.record_conditions(&ns, &name, &s.conditions);
    let next = state
        .last_period
        .as_ref()
        .map_or(period, |(at, _)| period.saturating_sub(at.elapsed()));
    Ok(Action::requeue(next.max(Duration::from_millis(100))))
}

/// Metrics, a structured log line, and an Event when the decision changed something.
async fn record(ctx: &Context, isvc: &InferenceService, o: &Outcome) {
    let name = isvc.name_any();
    ctx.metrics
        .record_decision(&isvc.namespace().unwrap_or_default(), &name, o);
    tracing::info!(
        target: "ballast::decision",
        namespace = %isvc.namespace().unwrap_or_default(),
        service = %name,
        action = %o.action.as_str(),
        reason = o.reason.as_str(),
        current = o.current_replicas,
        desired = o.desired_replicas,
        message = %o.message,
        "decision"
    );
    if o.action != DecisionAction::Hold {
        ctx.event(
            isvc,
            EventType::Normal,
            o.reason.as_str(),
            o.message.clone(),
        )
        .await;
    }
}

/// Sets DP weights over each pod's control API: one lazily connected channel per pod,
/// calls concurrent and bounded by [`CONTROL_TIMEOUT`].
async fn set_dp_weights(
    isvc: &InferenceService,
    state: &mut ServiceState,
    observed: &fetch::Observed,
    plans: &[DpWeights],
) {
    let ready = observed.ready_pods();
    state
        .controls
        .retain(|pod, _| ready.contains_key(pod.as_str()));
    state
        .dp_weights
        .retain(|pod, _| ready.contains_key(pod.as_str()));
    let port = isvc.spec.engine.grpc_port;
    if plans.is_empty() || port <= 0 || isvc.spec.engine.kind != ballast_crds::EngineKind::Ballast {
        return;
    }
    let mut calls = Vec::new();
    for w in plans {
        let Some(ip) = ready.get(w.replica.as_str()).and_then(|p| p.ip.clone()) else {
            continue;
        };
        let client = match state.controls.get(&w.replica) {
            Some(c) => c.clone(),
            None => {
                let host = if ip.contains(':') {
                    format!("[{ip}]")
                } else {
                    ip
                };
                let Ok(endpoint) = Endpoint::from_shared(format!("http://{host}:{port}")) else {
                    continue;
                };
                let c = EngineControlClient::new(
                    endpoint
                        .connect_timeout(CONTROL_TIMEOUT)
                        .timeout(CONTROL_TIMEOUT)
                        .connect_lazy(),
                );
                state.controls.insert(w.replica.clone(), c.clone());
                c
            }
        };
        let (pod, weights) = (w.replica.clone(), w.weights.clone());
        calls.push(async move {
            let mut client = client;
            let call = client.set_dp_weights(SetDpWeightsRequest {
                weights: weights.clone(),
            });
            let ok = matches!(tokio::time::timeout(CONTROL_TIMEOUT, call).await, Ok(Ok(_)));
            (pod, weights, ok)
        });
    }
    for (pod, weights, ok) in futures::future::join_all(calls).await {
        if ok {
            state.dp_weights.insert(pod, weights);
        } else {
            tracing::warn!(target: "ballast::operator", %pod, "cannot set DP weights");
        }
    }
}

/// After a failed reconcile: count it by category and retry with a backoff that doubles
/// per failure in a row, starting from the category's base.
pub fn error_policy(isvc: Arc<InferenceService>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = isvc.name_any();
    let ns = isvc.namespace().unwrap_or_default();
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[&ns, &name, error.category()])
        .inc();
    let failures = ctx
        .state(&ns, &name)
        .try_lock()
        .map_or(1, |s| s.failures.max(1));
    let delay = error::backoff(error.base_backoff(), failures);
    tracing::warn!(target: "ballast::operator", namespace = %ns, service = %name, category = error.category(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
