//! One InferenceService run locally: supervision of its replicas ([`Fleet`]: start, ready,
//! replace, drain) and, every period, the shared control period
//! ([`ControlPeriod`](crate::period::ControlPeriod)) on them. What is local is how the
//! replicas are learned (from the processes) and how a decision is applied (start or
//! drain processes, take replicas out of the router's rotation or put them back, DP
//! weights over each replica's control API); the [`Publisher`] writes the result where the
//! router, the admin port and the view read it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ballast_crds::{Decision, InferenceService};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::admin::LOCAL_NAMESPACE;
use super::fleet::{Fleet, FleetEvent};
use super::publish::{Outputs, Publisher, State};
use super::replica::Phase;
use crate::decide::Outcome;
use crate::period::{self, ControlPeriod, Period, Replicas};
use crate::scrape::Target;
use crate::status::{self, ConditionSet, ReplicaCounts};

/// How often replicas are checked (readiness, health, exits) between decisions.
const HOUSEKEEPING: Duration = Duration::from_millis(200);

/// How long a replica may take to drain when `ballast local` stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(60);

/// What starting a replica needs.
#[derive(Clone)]
pub struct Launch {
    /// Engine binary.
    pub engine_bin: PathBuf,
    /// Engine logs.
    pub log_dir: PathBuf,
    /// Polls the replicas' `/health`.
    pub health_client: reqwest::Client,
    /// The run's control-token file, given to every replica (`--control-token-file`).
    pub control_token_file: PathBuf,
    /// Its token, which the control loop sends.
    pub control_tokens: crate::control::ControlTokens,
}

/// A service, its replicas and its control loop.
pub struct Supervisor {
    isvc: InferenceService,
    name: String,
    fleet: Fleet,
    desired: i32,
    period: ControlPeriod,
    conditions: Vec<Condition>,
    last_scale_time: Option<String>,
    last_decision: Option<Decision>,
    publisher: Publisher,
}

impl Supervisor {
    /// A service with no replicas yet (`run` starts them). It is published at once: the
    /// router knows it (requests wait for its first replica) and `/status` lists it.
    pub fn new(isvc: InferenceService, launch: &Launch, outputs: Outputs) -> Self {
        let name = isvc.metadata.name.clone().unwrap_or_default();
        let fleet = Fleet::new(
            isvc.clone(),
            launch.engine_bin.clone(),
            launch.log_dir.clone(),
            launch.health_client.clone(),
            launch.control_token_file.clone(),
        );
        // The first period one interval in: replicas are only starting before that.
        let first = Instant::now() + ControlPeriod::interval(&isvc.spec);
        let mut s = Self {
            desired: isvc.spec.initial_replicas(),
            period: ControlPeriod::new(LOCAL_NAMESPACE, &name, Some(first)),
            publisher: Publisher::new(&name, isvc.served_name(), outputs),
            name,
            fleet,
            conditions: Vec::new(),
            last_scale_time: None,
            last_decision: None,
            isvc,
        };
        s.period.set_control_tokens(launch.control_tokens.clone());
        s.publish();
        s
    }

    /// Runs the control loop until `stop` turns true, then drains every replica.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(HOUSEKEEPING);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            self.housekeeping();
            if self.period.due(Instant::now()) {
                self.control_period().await;
            }
        }
        self.shutdown().await;
    }

    /// Supervision between decisions: readiness, health, exits, the replica count.
    fn housekeeping(&mut self) {
        self.supervise();
        let fleet = &self.fleet;
        self.period
            .retain(|r| fleet.replicas().iter().any(|x| x.name == r));
        self.publish();
    }

    /// Advances the fleet toward `desired`, turning what happened into logs and
    /// conditions.
    fn supervise(&mut self) {
        for event in self.fleet.supervise(self.desired) {
            self.on_fleet_event(event);
        }
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

    /// `Ready` from the counts, and `Degraded` back to False once a replaced replica's
    /// fleet is whole again.
    fn refresh_conditions(&mut self, counts: ReplicaCounts) {
        self.set_condition(status::ready_condition(counts, self.desired));
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
    }

    /// Hands the current state to the publisher.
    fn publish(&mut self) {
        let counts = self.fleet.counts();
        self.refresh_conditions(counts);
        // Before the first housekeeping no replica exists yet, but `desired` are about to
        // start: requests wait for them rather than fail.
        let starting = if self.fleet.replicas().is_empty() {
            self.desired.max(0) as usize
        } else {
            counts.starting.max(0) as usize
        };
        let backends = self.fleet.backends();
        self.publisher.publish(State {
            counts,
            desired: self.desired,
            generation: self.isvc.metadata.generation.or(Some(1)),
            conditions: &self.conditions,
            last_scale_time: self.last_scale_time.clone(),
            last_decision: self.last_decision.as_ref(),
            replicas: self.fleet.replicas(),
            backends,
            starting,
            dp_weights: self.period.dp_weights(),
            autoscaling: &self.isvc.spec.autoscaling,
        });
    }

    /// What the control period learns of the processes.
    fn replicas(&self) -> Replicas {
        let ready = || {
            self.fleet
                .replicas()
                .iter()
                .filter(|r| r.phase == Phase::Ready)
        };
        Replicas {
            current: self.desired,
            targets: ready()
                .filter_map(|r| Some(Target::new(r.name.clone(), r.base_url()?)))
                .collect(),
            starting: self.fleet.counts().starting.max(0) as usize,
            pickers: Vec::new(),
            picker_restarts: Default::default(),
            out_of_rotation: ready()
                .filter(|r| !r.accepting)
                .map(|r| r.name.clone())
                .collect(),
        }
    }

    /// The shared control period, then this runtime's way of acting on its decision.
    async fn control_period(&mut self) {
        let replicas = self.replicas();
        let period = self
            .period
            .run(&self.isvc.spec, &replicas, self.publisher.metrics())
            .await;
        if let Period::Decided { outcome, .. } = period {
            self.apply(&outcome).await;
        }
    }

    /// The replica count (processes start or drain at once), the router's rotation and
    /// the DP weights of a decision.
    async fn act(&mut self, outcome: &Outcome) {
        if outcome.desired_replicas != self.desired {
            self.desired = outcome.desired_replicas;
            self.last_scale_time = Some(Timestamp::now().to_string());
        }
        let plan = &outcome.rebalance;
        self.fleet.set_accepting(&plan.take_out, &plan.restore);
        let fleet = &self.fleet;
        let metrics = self.publisher.metrics();
        self.period
            .set_dp_weights(metrics, &plan.dp_weights, |replica| {
                let r = fleet.replicas().iter().find(|r| r.name == replica)?;
                Some(format!("http://{}", r.grpc?))
            })
            .await;
    }

    /// Acts on a decision (or, advising, only says it): the replica count, the router's
    /// rotation, DP weights, conditions and status.
    async fn apply(&mut self, outcome: &Outcome) {
        if self.isvc.spec.autoscaling.mode == ballast_crds::AutoscalingMode::Advise {
            // Advice: shown in the decision and the condition, nothing acted on.
            self.set_condition(ConditionSet {
                type_: "Advising",
                status: true,
                reason: "AdviseMode",
                message: format!(
                    "spec.autoscaling.mode is Advise: decisions are shown, not applied; {} replicas advised, the fleet runs {}",
                    outcome.desired_replicas, self.desired
                ),
            });
        } else {
            self.act(outcome).await;
        }
        for c in period::conditions(outcome) {
            status::set_condition(
                &mut self.conditions,
                c,
                Time(Timestamp::now()),
                self.isvc.metadata.generation,
            );
        }
        let decision = outcome.to_status_decision(Timestamp::now().to_string());
        self.last_decision = Some(decision.clone());
        self.supervise();
        self.publish();
        self.publisher
            .decision(outcome, &decision, self.fleet.counts(), self.desired);
    }

    /// Drains every replica and waits for them (killing what does not stop in time).
    async fn shutdown(&mut self) {
        self.desired = 0;
        self.publisher.withdraw();
        self.fleet.shutdown(SHUTDOWN_GRACE).await;
        self.publish();
    }
}
