//! One InferenceService run locally: its replicas, and the control loop that scrapes
//! them, decides with the shared decision core, and acts by starting, draining and
//! re-routing processes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ballast_crds::{InferenceService, InferenceServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::admin::{OperatorMetrics, StatusMap};
use super::replica::{Phase, Replica};
use super::router::{Backend, RouteTable, ServiceRoutes};
use super::view::View;
use crate::control::EngineControlClient;
use crate::control::proto::SetDpWeightsRequest;
use crate::decide::{ConditionUpdate, DecideInput, History, Outcome, decide};
use crate::scrape::{ScrapeConfig, Scraper, Target, Tracker};
use crate::signals::Dialect;

/// How often replicas are checked for readiness and exits between decisions.
const HOUSEKEEPING: Duration = Duration::from_millis(200);

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
    /// The live view.
    pub view: Arc<Mutex<View>>,
}

/// A service and its replicas.
pub struct Service {
    isvc: InferenceService,
    name: String,
    shared: Shared,
    replicas: Vec<Replica>,
    in_flight: BTreeMap<String, Arc<AtomicUsize>>,
    next_index: usize,
    desired: i32,
    history: History,
    tracker: Tracker,
    scraper: Scraper,
    dialect: Dialect,
    dp_weights: BTreeMap<String, Vec<f64>>,
    conditions: Vec<Condition>,
    last_scale_time: Option<String>,
    last_decision: Option<ballast_crds::Decision>,
    epoch: Instant,
}

fn now_rfc3339() -> String {
    Timestamp::now().to_string()
}

impl Service {
    /// A service with no replicas yet; `run` starts them.
    pub fn new(isvc: InferenceService, shared: Shared) -> Result<Self, String> {
        let name = isvc.metadata.name.clone().unwrap_or_default();
        let spec = &isvc.spec;
        let initial = if spec.autoscaling.enabled {
            spec.replicas
                .unwrap_or(spec.autoscaling.min_replicas)
                .clamp(spec.autoscaling.min_replicas, spec.autoscaling.max_replicas)
        } else {
            spec.replicas.unwrap_or(1)
        };
        let scraper =
            Scraper::new(ScrapeConfig::from_spec(&spec.metrics)).map_err(|e| e.to_string())?;
        Ok(Self {
            dialect: spec.engine.kind.into(),
            name,
            shared,
            replicas: Vec::new(),
            in_flight: BTreeMap::new(),
            next_index: 0,
            desired: initial.max(0),
            history: History::default(),
            tracker: Tracker::new(),
            scraper,
            dp_weights: BTreeMap::new(),
            conditions: Vec::new(),
            last_scale_time: None,
            last_decision: None,
            epoch: Instant::now(),
            isvc,
        })
    }

    /// Runs the control loop until `stop` resolves, then drains every replica.
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

    /// Readiness, exits, replica count, routes and status counts.
    fn housekeeping(&mut self) {
        let mut i = 0;
        while i < self.replicas.len() {
            let r = &mut self.replicas[i];
            if let Err(e) = r.poll_ready() {
                tracing::warn!(target: "ballast::local", service = %self.name, replica = %r.name, error = %e, log = %r.log.display(), "replica failed to start; replacing it");
                self.remove(i);
                continue;
            }
            if let Some(status) = r.exited() {
                let (name, draining) = (r.name.clone(), r.phase == Phase::Draining);
                if draining {
                    tracing::info!(target: "ballast::local", service = %self.name, replica = %name, %status, "replica drained and stopped");
                } else {
                    tracing::warn!(target: "ballast::local", service = %self.name, replica = %name, %status, log = %r.log.display(), "replica exited unexpectedly; replacing it");
                    self.set_condition(
                        "Degraded",
                        true,
                        "ReplicaExited",
                        format!("replica {name} exited ({status}); replaced"),
                    );
                }
                self.remove(i);
                continue;
            }
            i += 1;
        }
        self.reconcile_count();
        self.publish_routes();
        self.publish_status();
    }

    fn remove(&mut self, i: usize) {
        let r = self.replicas.remove(i);
        self.in_flight.remove(&r.name);
        self.dp_weights.remove(&r.name);
    }

    /// Starts or drains replicas until the non-draining count is the desired count.
    fn reconcile_count(&mut self) {
        let live = self
            .replicas
            .iter()
            .filter(|r| r.phase != Phase::Draining)
            .count() as i32;
        for _ in live..self.desired {
            let name = format!("{}-{}", self.name, self.next_index);
            self.next_index += 1;
            match Replica::spawn(
                &self.shared.engine_bin,
                &self.isvc,
                name.clone(),
                &self.shared.log_dir,
            ) {
                Ok(r) => {
                    tracing::info!(target: "ballast::local", service = %self.name, replica = %name, "starting replica");
                    self.replicas.push(r);
                }
                Err(e) => {
                    tracing::error!(target: "ballast::local", service = %self.name, error = %e, "cannot start a replica");
                    self.set_condition("Degraded", true, "SpawnFailed", e.to_string());
                    return;
                }
            }
        }
        if live > self.desired {
            // Remove what serves least first: starting replicas, then those out of
            // rotation, then the newest.
            let mut order: Vec<usize> = (0..self.replicas.len())
                .filter(|&i| self.replicas[i].phase != Phase::Draining)
                .collect();
            order.sort_by_key(|&i| {
                let r = &self.replicas[i];
                (
                    r.phase == Phase::Ready,
                    r.accepting,
                    std::cmp::Reverse(r.started),
                )
            });
            for &i in order.iter().take((live - self.desired) as usize) {
                let r = &mut self.replicas[i];
                tracing::info!(target: "ballast::local", service = %self.name, replica = %r.name, "draining replica");
                r.drain();
            }
        }
    }

    fn publish_routes(&mut self) {
        let mut backends = Vec::new();
        for r in &self.replicas {
            if r.phase == Phase::Ready
                && r.accepting
                && let Some(url) = r.base_url()
            {
                let in_flight = Arc::clone(self.in_flight.entry(r.name.clone()).or_default());
                backends.push(Backend {
                    name: r.name.clone(),
                    url,
                    in_flight,
                });
            }
        }
        self.shared.routes.publish(ServiceRoutes {
            name: self.name.clone(),
            served_name: self.isvc.served_name(),
            backends,
        });
    }

    fn counts(&self) -> (i32, i32, i32, i32) {
        let count = |p: Phase| self.replicas.iter().filter(|r| r.phase == p).count() as i32;
        let accepting = self
            .replicas
            .iter()
            .filter(|r| r.phase == Phase::Ready && r.accepting)
            .count() as i32;
        (
            count(Phase::Ready),
            count(Phase::Starting),
            count(Phase::Draining),
            accepting,
        )
    }

    fn publish_status(&mut self) {
        let (ready, starting, draining, accepting) = self.counts();
        let m = &self.shared.metrics;
        for (state, v) in [
            ("ready", ready),
            ("starting", starting),
            ("draining", draining),
            ("accepting", accepting),
        ] {
            m.replicas
                .with_label_values(&[&self.name, state])
                .set(v as i64);
        }
        m.desired_replicas
            .with_label_values(&[&self.name])
            .set(self.desired as i64);
        let ready_ok = ready > 0;
        let msg = format!("{ready} of {} replicas ready", self.desired);
        self.set_condition(
            "Ready",
            ready_ok,
            if ready_ok {
                "ReplicasReady"
            } else {
                "ReplicasStarting"
            },
            msg,
        );
        let status = InferenceServiceStatus {
            observed_generation: self.isvc.metadata.generation.or(Some(1)),
            replicas: ready + starting + draining,
            ready_replicas: ready,
            accepting_replicas: accepting,
            desired_replicas: self.desired,
            selector: format!("app.kubernetes.io/instance={}", self.name),
            last_scale_time: self.last_scale_time.clone(),
            conditions: self.conditions.clone(),
            last_decision: self.last_decision.clone(),
        };
        self.shared
            .status
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.name.clone(), status);
        self.shared
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replicas(
                &self.name,
                ready,
                starting,
                draining,
                accepting,
                self.desired,
            );
    }

    /// Sets a condition, keeping its transition time when the status does not change.
    fn set_condition(&mut self, type_: &str, status: bool, reason: &str, message: String) {
        let status = if status { "True" } else { "False" }.to_string();
        let now = Time(Timestamp::now());
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status;
                c.reason = reason.to_string();
                c.message = message;
            }
            None => self.conditions.push(Condition {
                type_: type_.to_string(),
                status,
                reason: reason.to_string(),
                message,
                last_transition_time: now,
                observed_generation: self.isvc.metadata.generation,
            }),
        }
    }

    /// Scrape, decide, act, record.
    async fn control_period(&mut self) {
        let targets: Vec<Target> = self
            .replicas
            .iter()
            .filter(|r| r.phase == Phase::Ready)
            .filter_map(|r| Some(Target::new(r.name.clone(), r.base_url()?)))
            .collect();
        let starting = self
            .replicas
            .iter()
            .filter(|r| r.phase == Phase::Starting)
            .count();
        let t0 = Instant::now();
        let outcomes = self.scraper.scrape(self.dialect, &targets).await;
        let m = &self.shared.metrics;
        m.scrape_duration
            .with_label_values(&[&self.name])
            .observe(t0.elapsed().as_secs_f64());
        for o in &outcomes {
            if let Err(e) = &o.result {
                m.scrape_errors
                    .with_label_values(&[&self.name, e.reason()])
                    .inc();
            }
        }
        let fleet = self
            .tracker
            .observe_outcomes(Instant::now(), &outcomes, starting);
        let mut input = DecideInput::new(&self.isvc.spec, self.desired, fleet);
        input.out_of_rotation = self
            .replicas
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
        for r in &mut self.replicas {
            if plan.take_out.contains(&r.name) {
                r.accepting = false;
            }
            if plan.restore.contains(&r.name) {
                r.accepting = true;
            }
        }
        for w in &plan.dp_weights {
            let Some(grpc) = self
                .replicas
                .iter()
                .find(|r| r.name == w.replica)
                .and_then(|r| r.grpc)
            else {
                continue;
            };
            match set_dp_weights(grpc, &w.weights).await {
                Ok(()) => {
                    self.dp_weights.insert(w.replica.clone(), w.weights.clone());
                }
                Err(e) => {
                    tracing::warn!(target: "ballast::local", service = %self.name, replica = %w.replica, error = %e, "cannot set DP weights")
                }
            }
        }
        self.history.record(&outcome.history, scaled);
        for c in &outcome.conditions {
            let ConditionUpdate {
                kind,
                status,
                reason,
                message,
            } = c;
            self.set_condition(kind.as_str(), *status, reason, message.clone());
        }
        let decision = outcome.to_status_decision(now_rfc3339());
        let m = &self.shared.metrics;
        let action = format!("{:?}", outcome.action);
        m.decisions
            .with_label_values(&[&self.name, &action, outcome.reason.as_str()])
            .inc();
        let s = &outcome.signals;
        for (signal, v) in [
            ("capacityWaiting", s.capacity_waiting),
            ("deferredWaiting", s.deferred_waiting),
            ("kvCacheUsage", s.kv_cache_usage),
            (
                "admissionRejectionsPerSecond",
                s.admission_rejections_per_second,
            ),
            ("ttftP99Seconds", s.ttft_p99_seconds),
        ] {
            m.signal
                .with_label_values(&[&self.name, signal])
                .set(v.unwrap_or(f64::NAN));
        }
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
            .decision(&self.name, &decision);
        self.last_decision = Some(decision);
        self.reconcile_count();
        self.publish_routes();
        self.publish_status();
    }

    /// Drains every replica and waits for them (killing what does not stop in time).
    async fn shutdown(&mut self) {
        self.desired = 0;
        self.shared.routes.publish(ServiceRoutes {
            name: self.name.clone(),
            served_name: self.isvc.served_name(),
            backends: Vec::new(),
        });
        for r in &mut self.replicas {
            r.drain();
        }
        for r in &mut self.replicas {
            if tokio::time::timeout(Duration::from_secs(60), r.wait())
                .await
                .is_err()
            {
                r.kill().await;
            }
        }
        self.replicas.clear();
        self.publish_status();
    }
}

async fn set_dp_weights(addr: std::net::SocketAddr, weights: &[f64]) -> Result<(), String> {
    let mut client = EngineControlClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| e.to_string())?;
    client
        .set_dp_weights(SetDpWeightsRequest {
            weights: weights.to_vec(),
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}
