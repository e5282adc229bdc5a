//! One InferenceService run locally: the control loop that supervises its replicas
//! ([`Fleet`]), scrapes them, decides with the shared decision core, and acts by starting,
//! draining and re-routing processes and by setting DP weights over the control API.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ballast_crds::InferenceService;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use tonic::transport::{Channel, Endpoint};

use super::LocalError;
use super::admin::{OperatorMetrics, ReplicaInfo, ReplicaMap, StatusMap, TimelineHandle};
use super::fleet::{Fleet, FleetEvent};
use super::replica::Phase;
use super::router::{RouteTable, ServiceRoutes};
use super::view::View;
use crate::control::EngineControlClient;
use crate::control::proto::SetDpWeightsRequest;
use crate::decide::{ConditionUpdate, DecideInput, History, Outcome, decide};
use crate::scrape::{ScrapeConfig, Scraper, Target, Tracker};
use crate::signals::Dialect;
use crate::status::{self, ConditionSet, ReplicaCounts, StatusParts};

/// The `namespace` label of every service's series in `ballast local` (and of its engines'
/// targets on `/prometheus/targets`).
pub const LOCAL_NAMESPACE: &str = "local";

/// How often replicas are checked (readiness, health, exits) between decisions.
const HOUSEKEEPING: Duration = Duration::from_millis(200);

/// Connect and call timeout of the engine control API: a hung replica costs the control
/// period at most this much.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a replica may take to drain when `ballast local` stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(60);

/// Everything shared by the services of one `ballast local`.
#[derive(Clone)]
pub struct Shared {
    /// Engine binary.
    pub engine_bin: PathBuf,
    /// Engine logs.
    pub log_dir: PathBuf,
    /// The router's routes.
    pub routes: Arc<RouteTable>,
    /// Operator metrics.
    pub metrics: Arc<OperatorMetrics>,
    /// Statuses served on /status.
    pub status: StatusMap,
    /// Replicas served on /replicas.
    pub replicas: ReplicaMap,
    /// What the live page plots.
    pub timeline: TimelineHandle,
    /// The live view.
    pub view: Arc<Mutex<View>>,
    /// Polls the replicas' `/health`.
    pub health_client: reqwest::Client,
}

/// A service, its replicas and its control-loop state.
pub struct Service {
    isvc: InferenceService,
    name: String,
    shared: Shared,
    fleet: Fleet,
    desired: i32,
    history: History,
    tracker: Tracker,
    scraper: Scraper,
    dialect: Dialect,
    dp_weights: BTreeMap<String, Vec<f64>>,
    /// One control API channel per replica, made on first use and reused.
    controls: BTreeMap<String, EngineControlClient<Channel>>,
    conditions: Vec<Condition>,
    last_scale_time: Option<String>,
    last_decision: Option<ballast_crds::Decision>,
    epoch: Instant,
}

fn now_rfc3339() -> String {
    Timestamp::now().to_string()
}

impl Service {
    /// A service with no replicas yet (`run` starts them). It is published at once: the
    /// router knows it (requests wait for its first replica) and `/status` lists it.
    pub fn new(isvc: InferenceService, shared: Shared) -> Result<Self, LocalError> {
        let name = isvc.metadata.name.clone().unwrap_or_default();
        let scraper = Scraper::new(ScrapeConfig::from_spec(&isvc.spec.metrics));
        let fleet = Fleet::new(
            isvc.clone(),
            shared.engine_bin.clone(),
            shared.log_dir.clone(),
            shared.health_client.clone(),
        );
        let mut svc = Self {
            dialect: isvc.spec.engine.kind.into(),
            desired: isvc.spec.initial_replicas(),
            name,
            shared,
            fleet,
            history: History::default(),
            tracker: Tracker::new(),
            scraper,
            dp_weights: BTreeMap::new(),
            controls: BTreeMap::new(),
            conditions: Vec::new(),
            last_scale_time: None,
            last_decision: None,
            epoch: Instant::now(),
            isvc,
        };
        svc.shared
            .timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add_service(&svc.name);
        svc.publish();
        Ok(svc)
    }

    /// Runs the control loop until `stop` turns true, then drains every replica.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let period =
            Duration::from_secs(self.isvc.spec.metrics.scrape_interval_seconds.max(1) as u64);
        let mut next_decision = Instant::now() + period;
        let mut tick = tokio::time::interval(HOUSEKEEPING);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            self.housekeeping();
            if Instant::now() >= next_decision {
                next_decision += period;
                self.control_period().await;
            }
        }
        self.shutdown().await;
    }

    /// Supervision between decisions: readiness, health, exits, the replica count.
    fn housekeeping(&mut self) {
        for event in self.fleet.supervise(self.desired) {
            self.on_fleet_event(event);
        }
        let live: BTreeSet<&str> = self
            .fleet
            .replicas()
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        self.controls.retain(|name, _| live.contains(name.as_str()));
        self.dp_weights
            .retain(|name, _| live.contains(name.as_str()));
        self.publish();
    }

    fn on_fleet_event(&mut self, event: FleetEvent) {
        let svc = self.name.clone();
        match event {
            FleetEvent::Started { replica } => {
                tracing::info!(target: "ballast::local", service = %svc, %replica, "starting replica");
            }
            FleetEvent::Ready { replica } => {
                tracing::info!(target: "ballast::local", service = %svc, %replica, "replica ready");
            }
            FleetEvent::Drained { replica } => {
                tracing::info!(target: "ballast::local", service = %svc, %replica, "replica drained and stopped");
            }
            FleetEvent::SpawnFailed { error } => {
                tracing::error!(target: "ballast::local", service = %svc, %error, "cannot start a replica");
                self.degraded("SpawnFailed", format!("cannot start a replica: {error}"));
            }
            FleetEvent::FailedToStart {
                replica,
                error,
                log,
            } => {
                tracing::warn!(target: "ballast::local", service = %svc, %replica, %error, log = %log.display(), "replica failed to start; replacing it");
                self.degraded(
                    "ReplicaFailedToStart",
                    format!("replica {replica} failed to start ({error}); replaced"),
                );
            }
            FleetEvent::Unhealthy { replica, why } => {
                tracing::warn!(target: "ballast::local", service = %svc, %replica, %why, "replica unhealthy; stopping and replacing it");
                self.degraded(
                    "ReplicaUnhealthy",
                    format!("replica {replica} unhealthy ({why}); replaced"),
                );
            }
            FleetEvent::Exited {
                replica,
                status,
                log,
            } => {
                tracing::warn!(target: "ballast::local", service = %svc, %replica, %status, log = %log.display(), "replica exited unexpectedly; replacing it");
                self.degraded(
                    "ReplicaExited",
                    format!("replica {replica} exited ({status}); replaced"),
                );
            }
            FleetEvent::Killed { replica } => {
                tracing::warn!(target: "ballast::local", service = %svc, %replica, "replica did not stop after SIGTERM; killed");
            }
        }
    }

    fn degraded(&mut self, reason: &str, message: String) {
        self.set_condition(ConditionSet {
            type_: "Degraded",
            status: true,
            reason,
            message,
        });
    }

    fn set_condition(&mut self, c: ConditionSet<'_>) {
        status::set_condition(
            &mut self.conditions,
            c,
            Time(Timestamp::now()),
            self.isvc.metadata.generation,
        );
    }

    fn counts(&self) -> ReplicaCounts {
        let c = self.fleet.counts();
        ReplicaCounts {
            ready: c.ready,
            starting: c.starting,
            draining: c.draining,
            accepting: c.accepting,
        }
    }

    /// Publishes routes, status, replicas, metrics and the view from the current state.
    fn publish(&mut self) {
        let counts = self.counts();
        // Before the first housekeeping no replica exists yet, but `desired` are about to
        // start: requests wait for them rather than fail.
        let starting = if self.fleet.replicas().is_empty() {
            self.desired.max(0) as usize
        } else {
            counts.starting as usize
        };
        self.shared.routes.publish(ServiceRoutes {
            name: self.name.clone(),
            served_name: self.isvc.served_name(),
            backends: self.fleet.backends(),
            starting,
        });
        let m = &self.shared.metrics;
        for (state, v) in [
            ("ready", counts.ready),
            ("starting", counts.starting),
            ("draining", counts.draining),
            ("accepting", counts.accepting),
        ] {
            m.replicas
                .with_label_values(&[LOCAL_NAMESPACE, &self.name, state])
                .set(v as i64);
        }
        m.desired_replicas
            .with_label_values(&[LOCAL_NAMESPACE, &self.name])
            .set(self.desired as i64);
        let a = &self.isvc.spec.autoscaling;
        m.register_service(LOCAL_NAMESPACE, &self.name);
        m.record_bounds(LOCAL_NAMESPACE, &self.name, a.min_replicas, a.max_replicas);
        self.set_condition(status::ready_condition(counts, self.desired));
        // A replaced replica degraded the service until the fleet is whole again.
        let degraded = self
            .conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "True");
        if degraded && counts.starting == 0 && counts.ready == self.desired {
            self.set_condition(ConditionSet {
                type_: "Degraded",
                status: false,
                reason: "ReplicasRecovered",
                message: format!("all {} replicas ready again", self.desired),
            });
        }
        self.shared
            .metrics
            .record_conditions(LOCAL_NAMESPACE, &self.name, &self.conditions);
        let status = status::assemble(StatusParts {
            name: &self.name,
            generation: self.isvc.metadata.generation.or(Some(1)),
            counts,
            desired: self.desired,
            last_scale_time: self.last_scale_time.clone(),
            conditions: &self.conditions,
            last_decision: self.last_decision.as_ref(),
        });
        self.shared
            .status
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.name.clone(), status);
        let replicas = self
            .fleet
            .replicas()
            .iter()
            .map(|r| ReplicaInfo {
                name: r.name.clone(),
                phase: match r.phase {
                    Phase::Starting => "Starting",
                    Phase::Ready => "Ready",
                    Phase::Draining => "Draining",
                    Phase::Failed => "Failed",
                },
                accepting: r.phase == Phase::Ready && r.accepting,
                url: r.base_url(),
                grpc: r.grpc.map(|a| format!("http://{a}")),
                dp_weights: self.dp_weights.get(&r.name).cloned(),
            })
            .collect();
        self.shared
            .replicas
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.name.clone(), replicas);
        self.shared
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replicas(
                &self.name,
                counts.ready,
                counts.starting,
                counts.draining,
                counts.accepting,
                self.desired,
            );
    }

    /// Scrape, decide, act, record.
    async fn control_period(&mut self) {
        let targets: Vec<Target> = self
            .fleet
            .replicas()
            .iter()
            .filter(|r| r.phase == Phase::Ready)
            .filter_map(|r| Some(Target::new(r.name.clone(), r.base_url()?)))
            .collect();
        let counts = self.counts();
        let t0 = Instant::now();
        let outcomes = self.scraper.scrape(self.dialect, &targets).await;
        let m = &self.shared.metrics;
        m.scrape_duration
            .with_label_values(&[LOCAL_NAMESPACE, &self.name])
            .observe(t0.elapsed().as_secs_f64());
        for o in &outcomes {
            if let Err(e) = &o.result {
                m.scrape_errors
                    .with_label_values(&[LOCAL_NAMESPACE, &self.name, e.reason()])
                    .inc();
            }
        }
        let fleet =
            self.tracker
                .observe_outcomes(Instant::now(), &outcomes, counts.starting as usize);
        let mut input = DecideInput::new(&self.isvc.spec, self.desired, fleet);
        input.out_of_rotation = self
            .fleet
            .replicas()
            .iter()
            .filter(|r| r.phase == Phase::Ready && !r.accepting)
            .map(|r| r.name.clone())
            .collect();
        input.dp_weights = self.dp_weights.clone();
        let outcome = decide(&input, &self.history, self.epoch.elapsed());
        self.apply(&outcome).await;
    }

    async fn apply(&mut self, outcome: &Outcome) {
        let scaled = outcome.desired_replicas != self.desired;
        if scaled {
            self.desired = outcome.desired_replicas;
            self.last_scale_time = Some(now_rfc3339());
        }
        let plan = &outcome.rebalance;
        self.fleet.set_accepting(&plan.take_out, &plan.restore);
        self.set_dp_weights(&plan.dp_weights).await;
        self.history.record(&outcome.history, scaled);
        for c in &outcome.conditions {
            let ConditionUpdate {
                kind,
                status,
                reason,
                message,
            } = c;
            self.set_condition(ConditionSet {
                type_: kind.as_str(),
                status: *status,
                reason,
                message: message.clone(),
            });
        }
        let decision = outcome.to_status_decision(now_rfc3339());
        self.record_decision(outcome, &decision);
        self.last_decision = Some(decision);
        for event in self.fleet.supervise(self.desired) {
            self.on_fleet_event(event);
        }
        self.publish();
        let c = self.counts();
        self.shared
            .timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(
                &self.name,
                super::timeline::unix_now(),
                super::timeline::Replicas {
                    ready: c.ready,
                    starting: c.starting,
                    draining: c.draining,
                    accepting: c.accepting,
                    desired: self.desired,
                },
                outcome,
            );
    }

    /// Sets DP weights on every replica that needs new ones, concurrently, each call
    /// bounded by [`CONTROL_TIMEOUT`]: one hung replica delays the period by that much at
    /// most, never more.
    async fn set_dp_weights(&mut self, plans: &[crate::decide::DpWeights]) {
        let mut calls = Vec::new();
        for w in plans {
            let Some(client) = self.control(&w.replica) else {
                continue;
            };
            let weights = w.weights.clone();
            let replica = w.replica.clone();
            calls.push(async move {
                let mut client = client;
                let call = client.set_dp_weights(SetDpWeightsRequest {
                    weights: weights.clone(),
                });
                let result = match tokio::time::timeout(CONTROL_TIMEOUT, call).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(status)) => Err(status.message().to_string()),
                    Err(_) => Err(format!("no answer within {CONTROL_TIMEOUT:?}")),
                };
                (replica, weights, result)
            });
        }
        for (replica, weights, result) in futures::future::join_all(calls).await {
            match result {
                Ok(()) => {
                    self.dp_weights.insert(replica, weights);
                }
                Err(error) => {
                    tracing::warn!(target: "ballast::local", service = %self.name, %replica, %error, "cannot set DP weights")
                }
            }
        }
    }

    /// The replica's control API client: one lazily connected channel per replica, with
    /// connect and call timeouts, reused for every call.
    fn control(&mut self, replica: &str) -> Option<EngineControlClient<Channel>> {
        if let Some(c) = self.controls.get(replica) {
            return Some(c.clone());
        }
        let addr = self
            .fleet
            .replicas()
            .iter()
            .find(|r| r.name == replica)
            .and_then(|r| r.grpc)?;
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .ok()?
            .connect_timeout(CONTROL_TIMEOUT)
            .timeout(CONTROL_TIMEOUT)
            .connect_lazy();
        let client = EngineControlClient::new(channel);
        self.controls.insert(replica.to_string(), client.clone());
        Some(client)
    }

    /// Metrics, the structured log line and the view for one decision.
    fn record_decision(&self, outcome: &Outcome, decision: &ballast_crds::Decision) {
        let action = outcome.action.as_str();
        self.shared
            .metrics
            .record_decision(LOCAL_NAMESPACE, &self.name, outcome);
        let recs: Vec<String> = decision
            .recommendations
            .iter()
            .map(|r| format!("{}={}", r.signal, r.replicas))
            .collect();
        tracing::info!(
            target: "ballast::decision",
            service = %self.name,
            action = %action,
            reason = outcome.reason.as_str(),
            current = outcome.current_replicas,
            desired = outcome.desired_replicas,
            recommendations = %recs.join(","),
            message = %outcome.message,
            "decision"
        );
        self.shared
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .decision(&self.name, decision);
    }

    /// Drains every replica and waits for them (killing what does not stop in time).
    async fn shutdown(&mut self) {
        self.desired = 0;
        self.shared.routes.publish(ServiceRoutes {
            name: self.name.clone(),
            served_name: self.isvc.served_name(),
            backends: Vec::new(),
            starting: 0,
        });
        self.fleet.shutdown(SHUTDOWN_GRACE).await;
        self.publish();
    }
}
