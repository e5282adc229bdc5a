//! Step 3: what this reconcile will make true. The shared control period
//! ([`crate::period::ControlPeriod`]: scrape → aggregate → decide →
//! record) runs on the snapshot's ready pods when it is due, or decides again on its last
//! signals when the spec changed since its last decision; the plan is the replica count
//! to run and, from the decision, the pods' rotation, deletion costs and DP weights. The
//! helpers are pure.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use kube::ResourceExt;

use ballast_crds::InferenceService;

use super::context::{Context, ServiceState, Wanted};
use super::snapshot::Snapshot;
use super::validate::Valid;
use crate::decide::{DpWeights, Outcome, RebalancePlan};
use crate::metrics_api::values::Record;
use crate::period::{ControlPeriod, Period, Replicas};
use crate::scrape::Target;
use crate::signals::FleetSignals;

/// What the rest of the reconcile makes true.
#[derive(Debug)]
pub struct Plan<'a> {
    /// The resource.
    pub isvc: &'a InferenceService,
    /// Step 1's snapshot.
    pub snapshot: Snapshot,
    /// The size the service runs now.
    pub current: i32,
    /// The size to run, and the generation of the spec it was decided on.
    pub wanted: Wanted,
    /// This reconcile's decision (most reconciles between periods have none).
    pub outcome: Option<Outcome>,
    /// Pods whose accepting condition must change: in rotation (true) or out.
    pub rotation: Vec<(String, bool)>,
    /// Deletion costs to set before a scale-down.
    pub deletion_costs: Vec<(String, i32)>,
    /// DP weights to set.
    pub dp_weights: Vec<DpWeights>,
    /// HorizontalPodAutoscalers that size this service while its built-in autoscaler is
    /// on: the operator then follows `spec.replicas`, which they write, instead of
    /// fighting them (empty: no conflict).
    pub conflicting_autoscalers: Vec<String>,
    /// Advising (`spec.autoscaling.mode: Advise` or `ballast operator --advise`): the
    /// decision is shown, never applied; the size stays `current` and nothing above is
    /// written.
    pub advising: Option<Advising>,
}

/// Why a service is advised rather than acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advising {
    /// Its `spec.autoscaling.mode` is `Advise`.
    Spec,
    /// The operator runs with `--advise`.
    Operator,
}

impl Advising {
    /// Whether `isvc` is advised, and why (the spec first).
    pub fn of(isvc: &InferenceService, operator_advises: bool) -> Option<Advising> {
        if isvc.spec.autoscaling.mode == ballast_crds::AutoscalingMode::Advise {
            Some(Advising::Spec)
        } else if operator_advises {
            Some(Advising::Operator)
        } else {
            None
        }
    }
}

/// What the control period learns of the pods: the size, the ready pods' endpoints, how
/// many start, and which are out of rotation.
pub fn replicas(isvc: &InferenceService, snapshot: &Snapshot) -> Replicas {
    Replicas {
        current: snapshot.current_replicas(isvc),
        targets: targets(isvc, snapshot),
        starting: snapshot.counts().starting.max(0) as usize,
        out_of_rotation: snapshot.out_of_rotation(),
        pickers: picker_targets(isvc, snapshot),
        picker_restarts: if isvc.spec.gateway.enabled {
            snapshot.gateway.restarts.clone()
        } else {
            Default::default()
        },
    }
}

/// The metrics endpoints of the ready gateway pickers, while `spec.gateway` is on.
pub fn picker_targets(isvc: &InferenceService, snapshot: &Snapshot) -> Vec<Target> {
    if !isvc.spec.gateway.enabled {
        return Vec::new();
    }
    let port = super::gateway::METRICS_PORT;
    snapshot
        .gateway
        .pickers
        .iter()
        .map(|(name, ip)| {
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.clone()
            };
            Target::new(name.clone(), format!("http://{host}:{port}"))
        })
        .collect()
}

/// Step 3: runs the control period if due (or decides again for a changed spec) and
/// plans the changes.
pub async fn plan<'a>(ctx: &Context, state: &mut ServiceState, valid: Valid<'a>) -> Plan<'a> {
    let Valid { isvc, snapshot } = valid;
    let ready = snapshot.ready_pods();
    state.period.retain(|pod| ready.contains_key(pod));
    let replicas = replicas(isvc, &snapshot);
    let generation = isvc.metadata.generation;
    let conflicting_autoscalers = conflicting_autoscalers(isvc, &snapshot);
    let deferring;
    let spec = if conflicting_autoscalers.is_empty() {
        &isvc.spec
    } else {
        deferring = deferring_to_them(isvc);
        &deferring
    };
    let decided = if state.period.due(Instant::now()) {
        match state.period.run(spec, &replicas, &ctx.metrics).await {
            Period::Seeded(_) => None,
            Period::Decided { fleet, outcome } => Some((fleet, *outcome)),
        }
    } else if state.wanted.is_some_and(|w| w.generation != generation) {
        state.period.redecide(spec, &replicas, &ctx.metrics)
    } else {
        None
    };
    let (fleet, outcome) = match decided {
        Some((fleet, outcome)) => {
            publish(ctx, state, isvc, &fleet, &outcome);
            state.wanted = Some(Wanted {
                replicas: outcome.desired_replicas,
                generation,
            });
            (fleet, Some(outcome))
        }
        None => (FleetSignals::default(), None),
    };
    let current = replicas.current;
    // Before this process's first decision (a new leader seeding its rates), the size is
    // what the previous one applied, for the generation its status named.
    let wanted = state.wanted.unwrap_or(Wanted {
        replicas: current,
        generation: isvc
            .status
            .as_ref()
            .and_then(|s| s.observed_generation)
            .or(generation),
    });
    let rebalance = outcome
        .as_ref()
        .map(|o| o.rebalance.clone())
        .unwrap_or_default();
    let deletion_costs = if wanted.replicas < current {
        deletion_costs(&snapshot, &fleet)
    } else {
        Vec::new()
    };
    // Advising writes none of the decision's deletion costs or DP weights, and takes no
    // pod out of rotation.
    let advising = Advising::of(isvc, ctx.config.advise);
    let acting = advising.is_none();
    Plan {
        isvc,
        current,
        wanted,
        rotation: rotation_of(&snapshot, &rebalance, acting),
        deletion_costs: if acting { deletion_costs } else { Vec::new() },
        dp_weights: if acting {
            rebalance.dp_weights
        } else {
            Vec::new()
        },
        outcome,
        snapshot,
        conflicting_autoscalers,
        advising,
    }
}

/// HPAs sizing a service whose built-in autoscaler is on: the operator leaves the size to
/// them (follows `spec.replicas`, which they write) rather than undo each of their writes.
fn conflicting_autoscalers(isvc: &InferenceService, snapshot: &Snapshot) -> Vec<String> {
    if isvc.spec.autoscaling.enabled {
        snapshot.autoscalers.clone()
    } else {
        Vec::new()
    }
}

/// The spec as decided while an HPA sizes the service: its built-in autoscaler off.
fn deferring_to_them(isvc: &InferenceService) -> ballast_crds::InferenceServiceSpec {
    let mut s = isvc.spec.clone();
    s.autoscaling.enabled = false;
    s
}

/// Publishes a decision's values for the metrics APIs (what `status.lastDecision.signals`
/// shows, per pod too, and the replicas the autoscaler recommends).
fn publish(
    ctx: &Context,
    state: &ServiceState,
    isvc: &InferenceService,
    fleet: &FleetSignals,
    outcome: &Outcome,
) {
    let name = isvc.name_any();
    let record = Record::of(
        fleet,
        &outcome.signals,
        state.period.recommended_replicas(),
        state.period.scraped_at().unwrap_or_else(SystemTime::now),
        ControlPeriod::interval(&isvc.spec),
        crate::labels::labels(&name),
    );
    ctx.board
        .publish(&isvc.namespace().unwrap_or_default(), &name, record);
}

/// Every ready pod's metrics endpoint, on its pod IP (never the Service's cluster IP).
pub fn targets(isvc: &InferenceService, snapshot: &Snapshot) -> Vec<Target> {
    let port = isvc.spec.engine.port;
    snapshot
        .ready_pods()
        .values()
        .filter_map(|p| {
            let ip = p.ip.as_deref()?;
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.to_string()
            };
            Some(Target::new(p.name.clone(), format!("http://{host}:{port}")))
        })
        .collect()
}

/// The rotation to write: the decision's when acting; advising, every ready pod in (a new
/// pod would otherwise never pass its readiness gate) and none taken out.
fn rotation_of(
    snapshot: &Snapshot,
    rebalance: &RebalancePlan,
    acting: bool,
) -> Vec<(String, bool)> {
    if acting {
        return rotation(snapshot, rebalance);
    }
    let everyone = RebalancePlan {
        restore: snapshot
            .ready_pods()
            .keys()
            .map(|k| k.to_string())
            .collect(),
        ..RebalancePlan::default()
    };
    rotation(snapshot, &everyone)
}

/// The accepting condition each ready pod should have after `plan`, for the pods whose
/// condition must change: taken out → false, restored → true, a new pod (no condition yet)
/// → true unless taken out now.
pub fn rotation(snapshot: &Snapshot, plan: &RebalancePlan) -> Vec<(String, bool)> {
    snapshot
        .ready_pods()
        .values()
        .filter_map(|p| {
            let want = if plan.take_out.contains(&p.name) {
                false
            } else if plan.restore.contains(&p.name) {
                true
            } else {
                p.accepting.unwrap_or(true)
            };
            (p.accepting != Some(want)).then(|| (p.name.clone(), want))
        })
        .collect()
}

/// Deletion costs for a scale-down: each ready pod's load (running plus waiting requests in
/// its latest sample), so the Deployment removes the least-loaded first. Only pods whose
/// annotation differs are returned; pods without a sample are left alone (the Deployment
/// already prefers pods that are not ready).
pub fn deletion_costs(snapshot: &Snapshot, fleet: &FleetSignals) -> Vec<(String, i32)> {
    let load: BTreeMap<&str, f64> = fleet
        .replicas
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.running + r.capacity_waiting + r.deferred_waiting,
            )
        })
        .collect();
    snapshot
        .ready_pods()
        .values()
        .filter_map(|p| {
            let l = load.get(p.name.as_str())?;
            let cost = l.round().clamp(0.0, i32::MAX as f64) as i32;
            (p.deletion_cost.as_deref() != Some(cost.to_string().as_str()))
                .then(|| (p.name.clone(), cost))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::snapshot::PodView;
    use crate::signals::ReplicaSignals;

    fn pod(name: &str, accepting: Option<bool>, cost: Option<&str>) -> PodView {
        PodView {
            name: name.into(),
            ip: Some("127.0.0.2".into()),
            serving: true,
            terminating: false,
            accepting,
            deletion_cost: cost.map(str::to_string),
            start_failure: None,
            control_tls: false,
        }
    }

    fn isvc(yaml_spec: &str) -> InferenceService {
        ballast_crds::parse_yaml(&format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat}}\nspec: {yaml_spec}\n"
        ))
        .unwrap()
        .remove(0)
    }

    #[test]
    fn initial_size_follows_the_spec() {
        let i = |s: &str| isvc(s).spec.initial_replicas();
        let m = "model: {source: x}";
        assert_eq!(i(&format!("{{{m}}}")), 1);
        assert_eq!(
            i(&format!(
                "{{{m}, autoscaling: {{minReplicas: 2, maxReplicas: 5}}}}"
            )),
            2
        );
        assert_eq!(
            i(&format!(
                "{{{m}, replicas: 9, autoscaling: {{maxReplicas: 5}}}}"
            )),
            5
        );
        assert_eq!(
            i(&format!(
                "{{{m}, replicas: 9, autoscaling: {{enabled: false}}}}"
            )),
            9
        );
    }

    #[test]
    fn targets_are_pod_ips_and_the_engine_port() {
        let o = Snapshot {
            pods: vec![
                pod("a", Some(true), None),
                PodView {
                    ip: Some("fd00::5".into()),
                    ..pod("b", None, None)
                },
                PodView {
                    serving: false,
                    ..pod("c", None, None)
                },
            ],
            ..Snapshot::default()
        };
        let t = targets(&isvc("{model: {source: x}, engine: {port: 8080}}"), &o);
        let urls: Vec<&str> = t.iter().map(|t| t.base_url.as_str()).collect();
        assert_eq!(urls, ["http://127.0.0.2:8080", "http://[fd00::5]:8080"]);
    }

    #[test]
    fn rotation_changes_only_what_must_change() {
        let o = Snapshot {
            pods: vec![
                pod("hot", Some(true), None),
                pod("cool", Some(false), None),
                pod("new", None, None),
                pod("steady", Some(true), None),
                pod("out", Some(false), None),
            ],
            ..Snapshot::default()
        };
        let plan = RebalancePlan {
            take_out: vec!["hot".into()],
            restore: vec!["cool".into()],
            dp_weights: vec![],
        };
        let mut got = rotation(&o, &plan);
        got.sort();
        assert_eq!(
            got,
            [
                ("cool".to_string(), true),
                ("hot".to_string(), false),
                ("new".to_string(), true)
            ]
        );
    }

    #[test]
    fn deletion_costs_follow_load_and_skip_unchanged() {
        let o = Snapshot {
            pods: vec![
                pod("busy", Some(true), None),
                pod("idle", Some(true), Some("0")),
                pod("unknown", Some(true), None),
            ],
            ..Snapshot::default()
        };
        let signals = |name: &str, running: f64, waiting: f64| ReplicaSignals {
            name: name.into(),
            running,
            capacity_waiting: waiting,
            ..ReplicaSignals::default()
        };
        let fleet = FleetSignals {
            replicas: vec![signals("busy", 6.0, 2.0), signals("idle", 0.0, 0.0)],
            ..FleetSignals::default()
        };
        assert_eq!(deletion_costs(&o, &fleet), [("busy".to_string(), 8)]);
    }
}
