//! Step 6: the resource's status, written by server-side apply on the status subresource
//! only when it changed, the operator's gauges, and Events: for each decision that changed
//! something, for `Degraded` turning True (or False again after pods could not run), and
//! for a spec that turned invalid.
//!
//! A status describes the cluster as it is: the pods counted as they are (also while the
//! spec is invalid: the pods built before keep serving), `desiredReplicas` with the
//! `observedGeneration` of the spec it was decided on, and `updatedReplicas`, the pods that
//! run the Deployment's latest pod template.

use ballast_crds::{Decision, InferenceService, InferenceServiceStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::apply::Applied;
use super::context::Context;
use super::error::Error;
use super::names::FIELD_MANAGER;
use super::plan::{Advising, Plan};
use super::snapshot::Snapshot;
use super::validate::Invalid;
use crate::period;
use crate::status::{self, ConditionSet, ReplicaCounts, StatusParts};

/// What the new status is made of.
pub struct NewStatus<'a> {
    /// The resource as read (its live status is the base: condition transition times and a
    /// decision that did not change are kept).
    pub isvc: &'a InferenceService,
    /// Pods by state.
    pub counts: ReplicaCounts,
    /// The replica count the operator wants.
    pub desired: i32,
    /// This period's decision, if one was made.
    pub decision: Option<Decision>,
    /// Conditions to set.
    pub conditions: Vec<ConditionSet<'a>>,
    /// Whether the replica count changed now (`lastScaleTime`).
    pub scaled: bool,
    /// The time.
    pub now: Time,
}

/// What a status says about how far the cluster got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// `observedGeneration`: the spec `desiredReplicas` was decided on.
    pub generation: Option<i64>,
    /// `updatedReplicas`: pods running the latest pod template.
    pub updated: i32,
}

/// Two decisions that differ only in their time are the same decision: keeping the older
/// one means an idle, unchanged resource gets no status write every period.
fn same_decision(a: &Decision, b: &Decision) -> bool {
    Decision {
        time: String::new(),
        ..a.clone()
    } == Decision {
        time: String::new(),
        ..b.clone()
    }
}

/// The status the resource should have, when `desired` was decided on its current spec
/// and every pod that is not leaving runs the latest pod template.
pub fn status(n: NewStatus<'_>) -> InferenceServiceStatus {
    let progress = Progress {
        generation: n.isvc.metadata.generation,
        updated: n.counts.ready + n.counts.starting,
    };
    status_at(n, progress)
}

/// The status the resource should have, at `progress`.
pub fn status_at(n: NewStatus<'_>, progress: Progress) -> InferenceServiceStatus {
    let live = n.isvc.status.clone().unwrap_or_default();
    let generation = progress.generation;
    let mut conditions: Vec<Condition> = live.conditions.clone();
    for c in n
        .conditions
        .into_iter()
        .chain(std::iter::once(status::ready_condition(
            n.counts, n.desired,
        )))
    {
        status::set_condition(&mut conditions, c, n.now.clone(), generation);
    }
    let last_decision = match (n.decision, live.last_decision) {
        (Some(new), Some(old)) if same_decision(&new, &old) => Some(old),
        (Some(new), _) => Some(new),
        (None, old) => old,
    };
    let last_scale_time = if n.scaled {
        Some(n.now.0.to_string())
    } else {
        live.last_scale_time
    };
    status::assemble(StatusParts {
        name: n.isvc.metadata.name.as_deref().unwrap_or_default(),
        generation,
        counts: n.counts,
        updated: progress.updated,
        desired: n.desired,
        last_scale_time,
        conditions: &conditions,
        last_decision: last_decision.as_ref(),
    })
}

/// The condition type set when a HorizontalPodAutoscaler targets a service whose built-in
/// autoscaler is on (also the Event's reason).
pub const AUTOSCALER_CONFLICT: &str = "AutoscalerConflict";

/// `AutoscalerConflict=True` naming the HPAs that target a service whose built-in
/// autoscaler is on; `False` once none does, if it was ever set; else nothing.
pub fn autoscaler_conflict(
    hpas: &[String],
    live: Option<&Condition>,
) -> Option<ConditionSet<'static>> {
    if hpas.is_empty() {
        return live.map(|_| ConditionSet {
            type_: AUTOSCALER_CONFLICT,
            status: false,
            reason: "OneAutoscaler",
            message:
                "no HorizontalPodAutoscaler targets this service while autoscaling.enabled is true"
                    .into(),
        });
    }
    Some(ConditionSet {
        type_: AUTOSCALER_CONFLICT,
        status: true,
        reason: "HorizontalPodAutoscaler",
        message: format!(
            "HorizontalPodAutoscaler {} targets this service while autoscaling.enabled is true: following spec.replicas, which it writes, instead of the built-in autoscaler; set autoscaling.enabled: false, or delete the HPA",
            hpas.join(", ")
        ),
    })
}

/// The condition type of a service's gateway (`spec.gateway.enabled`).
pub const GATEWAY_CONDITION: &str = "GatewayReady";
/// Its reason while the InferencePool CRD is not installed (also the Event's reason).
pub const GATEWAY_UNAVAILABLE: &str = "GatewayUnavailable";

/// The condition type of a service whose decisions are advice only.
pub const ADVISING_CONDITION: &str = "Advising";

/// `Advising=True` while the plan advises (reason `AdviseMode` from the spec,
/// `OperatorAdvises` from `--advise`); `None` otherwise (a condition set before is removed).
fn advising_condition(plan: &Plan<'_>) -> Option<ConditionSet<'static>> {
    let (reason, why) = match plan.advising? {
        Advising::Spec => ("AdviseMode", "spec.autoscaling.mode is Advise"),
        Advising::Operator => ("OperatorAdvises", "the operator runs with --advise"),
    };
    Some(ConditionSet {
        type_: ADVISING_CONDITION,
        status: true,
        reason,
        message: format!(
            "{why}: decisions are shown, not applied; desiredReplicas {} is advice, the service runs {} (set spec.autoscaling.mode: Act to apply)",
            plan.wanted.replicas, plan.current
        ),
    })
}

/// The Event of a Degraded condition `c` (the live one `live`): when it turns True or
/// changes reason, or recovers from pods that could not run; not when only the message
/// moves, as back-off times do.
fn degraded_event(
    live: Option<&Condition>,
    c: &ConditionSet<'static>,
) -> Option<(EventType, &'static str, String)> {
    let flipped = live.is_none_or(|l| (l.status == "True") != c.status);
    let changed = flipped || live.is_some_and(|l| l.reason != c.reason);
    match (c.status, changed) {
        (true, true) => Some((EventType::Warning, c.reason, c.message.clone())),
        (false, true) if c.reason == "EnginesRunning" => {
            Some((EventType::Normal, c.reason, c.message.clone()))
        }
        _ => None,
    }
}

/// The AutoscalerConflict condition of `hpas`, and the message of its Event when the
/// conflict starts.
fn conflict_and_event(
    isvc: &InferenceService,
    hpas: &[String],
) -> (Option<ConditionSet<'static>>, Option<String>) {
    let live = live_condition(isvc, AUTOSCALER_CONFLICT);
    let conflict = autoscaler_conflict(hpas, live);
    let event = conflict
        .as_ref()
        .filter(|c| c.status && live.is_none_or(|l| l.status != "True"))
        .map(|c| c.message.clone());
    (conflict, event)
}

/// The Event of a decision that changes something: its reason and message, or, advising,
/// the same prefixed as advice, once per advised size rather than every period it stands.
async fn decision_event(ctx: &Context, plan: &Plan<'_>, o: &crate::decide::Outcome, desired: i32) {
    let isvc = plan.isvc;
    match plan.advising {
        None => {
            ctx.event(
                isvc,
                EventType::Normal,
                o.reason.as_str(),
                o.message.clone(),
            )
            .await
        }
        Some(_) if advised_before(isvc) != Some(desired) => {
            ctx.event(
                isvc,
                EventType::Normal,
                &format!("Advise{}", o.reason.as_str()),
                format!("advice, not applied: {}", o.message),
            )
            .await
        }
        Some(_) => {}
    }
}

/// The size the last written status advised, if it was advising.
fn advised_before(isvc: &InferenceService) -> Option<i32> {
    let status = isvc.status.as_ref()?;
    let advising = status
        .conditions
        .iter()
        .any(|c| c.type_ == ADVISING_CONDITION && c.status == "True");
    advising.then_some(status.desired_replicas)
}

/// Its reason while another resource controls an object named like the picker.
pub const PICKER_NAME_TAKEN: &str = "PickerNameTaken";

/// `GatewayReady` of a service whose spec asks for a gateway: `False` with
/// [`GATEWAY_UNAVAILABLE`] while the InferencePool CRD is missing (the service is served
/// as without a gateway), `False` with [`PICKER_NAME_TAKEN`] while another resource holds
/// the picker's name, `False` with `PickerNotReady` while no picker pod is ready,
/// else `True`. `None` without `spec.gateway.enabled` (a condition set before is removed).
pub fn gateway_condition(
    isvc: &InferenceService,
    snapshot: &Snapshot,
) -> Option<ConditionSet<'static>> {
    let g = &isvc.spec.gateway;
    if !g.enabled {
        return None;
    }
    let ns = isvc.namespace().unwrap_or_default();
    let name = isvc.name_any();
    let picker = super::names::picker_name(&name);
    let live = &snapshot.gateway;
    Some(if !live.pool.installed() {
        ConditionSet {
            type_: GATEWAY_CONDITION,
            status: false,
            reason: GATEWAY_UNAVAILABLE,
            message: format!(
                "spec.gateway.enabled needs the InferencePool CRD ({}, version v1), which this cluster does not serve: install the Gateway API Inference Extension's CRDs; until then the service is served without a gateway",
                ballast_crds::inference_pool::RESOURCE
            ),
        }
    } else if let Some(taken) = live.taken(isvc.uid().as_deref().unwrap_or_default()) {
        ConditionSet {
            type_: GATEWAY_CONDITION,
            status: false,
            reason: PICKER_NAME_TAKEN,
            message: format!(
                "the picker's name {picker} is taken in {ns}: {taken}; the gateway is not made (rename this InferenceService or the other)"
            ),
        }
    } else if live.ready_pickers == 0 {
        ConditionSet {
            type_: GATEWAY_CONDITION,
            status: false,
            reason: "PickerNotReady",
            message: format!(
                "InferencePool {ns}/{name}: no pod of its picker {picker} is ready (0 of {})",
                g.replicas
            ),
        }
    } else {
        ConditionSet {
            type_: GATEWAY_CONDITION,
            status: true,
            reason: "PickerReady",
            message: format!(
                "InferencePool {ns}/{name}: picker {picker} has {} of {} pods ready",
                live.ready_pickers, g.replicas
            ),
        }
    })
}

/// `Degraded=True` when engine pods cannot run: reason `ImagePullFailed`,
/// `ContainerCreateFailed` or `EngineCrashLoop` (the most actionable kind among the failing
/// pods), and a message naming the pod, container, kubelet reason and message (and how
/// the container last exited), with how many pods fail. `None` when every pod runs or
/// starts normally.
pub fn start_failure_condition(snapshot: &Snapshot) -> Option<ConditionSet<'static>> {
    let failing = snapshot.start_failures();
    let (pod, first) = failing.first()?;
    let mut message = first.describe(&pod.name);
    if failing.len() > 1 {
        message.push_str(&format!(
            "; {} of {} pods cannot run",
            failing.len(),
            snapshot.live_pods()
        ));
    }
    Some(ConditionSet {
        type_: "Degraded",
        status: true,
        reason: first.kind.condition_reason(),
        message,
    })
}

/// The `Degraded` condition of a valid spec: `degraded` when pods cannot run; otherwise
/// False, but only when it was True (a resource that never was degraded gets no condition
/// for it), with the reason that says what recovered.
pub fn degraded_condition(
    live: Option<&Condition>,
    degraded: Option<ConditionSet<'static>>,
) -> Option<ConditionSet<'static>> {
    if degraded.is_some() {
        return degraded;
    }
    let was = live.filter(|c| c.status == "True")?;
    Some(if was.reason == "InvalidSpec" {
        ConditionSet {
            type_: "Degraded",
            status: false,
            reason: "SpecValid",
            message: "the spec is valid and reconciled".into(),
        }
    } else {
        ConditionSet {
            type_: "Degraded",
            status: false,
            reason: "EnginesRunning",
            message: "no engine pod is failing to start".into(),
        }
    })
}

/// The live condition of `type_`, if the resource has one.
pub fn live_condition<'a>(isvc: &'a InferenceService, type_: &str) -> Option<&'a Condition> {
    isvc.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

/// Writes `status` unless the live one already equals it. True when it wrote.
pub async fn write(
    api: &Api<InferenceService>,
    isvc: &InferenceService,
    status: &InferenceServiceStatus,
) -> Result<bool, kube::Error> {
    if isvc.status.as_ref() == Some(status) {
        return Ok(false);
    }
    let name = isvc.metadata.name.as_deref().unwrap_or_default();
    let patch = json!({
        "apiVersion": "ballast.dev/v1alpha1",
        "kind": "InferenceService",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(true)
}

/// Pods (not leaving) that run the Deployment's latest pod template, as the Deployment
/// controller counts them (`status.updatedReplicas`), once it has seen the Deployment's
/// latest generation; 0 before that (it has not started a rollout of that spec yet, or
/// one that only changes the size, for the moment it takes to notice).
pub fn updated_replicas(deployment: Option<&Deployment>) -> i32 {
    let Some(d) = deployment else { return 0 };
    let Some(s) = d.status.as_ref() else { return 0 };
    let seen = match (d.metadata.generation, s.observed_generation) {
        (Some(g), Some(o)) => o >= g,
        (Some(_), None) => false,
        (None, _) => true,
    };
    if seen {
        s.updated_replicas.unwrap_or(0).max(0)
    } else {
        0
    }
}

/// Step 6 for a valid spec: the status (with the decision's conditions and `Degraded`
/// from the pods), its Events, and the gauges.
pub async fn report(ctx: &Context, applied: Applied<'_>) -> Result<(), Error> {
    let Applied { plan, deployment } = applied;
    let isvc = plan.isvc;
    let ns = isvc.namespace().unwrap_or_default();
    let name = isvc.name_any();
    let now = Time(Timestamp::now());
    let counts = plan.snapshot.counts();
    let outcome = plan.outcome.as_ref();
    let mut conditions = outcome.map(period::conditions).unwrap_or_default();
    // Pods that cannot run (image, container creation, crash loop) make it Degraded; a
    // spec that was invalid and pods that recovered turn it False again, or it would stay.
    let live_degraded = live_condition(isvc, "Degraded");
    let degraded = degraded_condition(live_degraded, start_failure_condition(&plan.snapshot));
    let degraded_event = degraded
        .as_ref()
        .and_then(|c| degraded_event(live_degraded, c));
    conditions.extend(degraded);
    // An HPA that sizes the service while the built-in autoscaler is on: said in a
    // condition naming it (and an Event when it starts), False again once it is gone.
    let (conflict, conflict_event) = conflict_and_event(isvc, &plan.conflicting_autoscalers);
    conditions.extend(conflict);
    let live_gateway = live_condition(isvc, GATEWAY_CONDITION);
    let gateway = gateway_condition(isvc, &plan.snapshot);
    // Said once when the CRD goes missing, not every period it stays missing.
    let gateway_event = gateway
        .as_ref()
        .filter(|c| {
            c.reason == GATEWAY_UNAVAILABLE && live_gateway.is_none_or(|l| l.reason != c.reason)
        })
        .map(|c| c.message.clone());
    conditions.extend(gateway);
    conditions.extend(advising_condition(&plan));
    let desired = plan.wanted.replicas;
    let mut s = status_at(
        NewStatus {
            isvc,
            counts,
            desired,
            decision: outcome.map(|o| o.to_status_decision(now.0.to_string())),
            conditions,
            scaled: desired != plan.current && plan.advising.is_none(),
            now,
        },
        Progress {
            generation: plan.wanted.generation,
            updated: updated_replicas(deployment.as_deref()),
        },
    );
    // Conditions of what is off now go (set before, they would stay).
    s.conditions.retain(|c| {
        (isvc.spec.gateway.enabled || c.type_ != GATEWAY_CONDITION)
            && (plan.advising.is_some() || c.type_ != ADVISING_CONDITION)
    });
    let wrote = write(&Api::namespaced(ctx.client.clone(), &ns), isvc, &s).await?;
    ctx.count_write(&ns, &name, "status", wrote);
    // Said when the status changed with them, not every period they stand.
    let said = [
        gateway_event.map(|m| (EventType::Warning, GATEWAY_UNAVAILABLE, m)),
        degraded_event,
        conflict_event.map(|m| (EventType::Warning, AUTOSCALER_CONFLICT, m)),
    ];
    for (type_, reason, message) in said.into_iter().flatten().filter(|_| wrote) {
        ctx.event(isvc, type_, reason, message).await;
    }
    if let Some(o) = outcome.filter(|o| o.action != ballast_crds::Action::Hold) {
        decision_event(ctx, &plan, o, desired).await;
    }
    period::record_state(
        &ctx.metrics,
        &ns,
        &name,
        counts,
        desired,
        &isvc.spec.autoscaling,
        &s.conditions,
    );
    Ok(())
}

/// Step 6 for an invalid spec: `Degraded=True` and `ScalingActive=False` with reason
/// `InvalidSpec` and every broken rule, one Warning Event when that is new; the pods are
/// counted as they run, and `desiredReplicas` stays the Deployment's size (nothing is
/// built, nothing is scaled).
pub async fn invalid(ctx: &Context, invalid: Invalid<'_>) -> Result<(), Error> {
    let message = invalid.message();
    let Invalid {
        isvc,
        snapshot,
        reason,
        ..
    } = invalid;
    let ns = isvc.namespace().unwrap_or_default();
    let name = isvc.name_any();
    let counts = snapshot.counts();
    let desired = snapshot.deployment_replicas().unwrap_or(0);
    // One Event per invalid spec, not one per status write (pods still change).
    let new = live_condition(isvc, "Degraded")
        .is_none_or(|c| c.status != "True" || c.reason != reason || c.message != message);
    let s = status_at(
        NewStatus {
            isvc,
            counts,
            desired,
            decision: None,
            conditions: vec![
                ConditionSet {
                    type_: "ScalingActive",
                    status: false,
                    reason,
                    message: message.clone(),
                },
                ConditionSet {
                    type_: "Degraded",
                    status: true,
                    reason,
                    message: message.clone(),
                },
            ],
            scaled: false,
            now: Time(Timestamp::now()),
        },
        Progress {
            generation: isvc.metadata.generation,
            updated: updated_replicas(snapshot.deployment.as_deref()),
        },
    );
    let wrote = write(&Api::namespaced(ctx.client.clone(), &ns), isvc, &s).await?;
    ctx.count_write(&ns, &name, "status", wrote);
    if wrote && new {
        ctx.event(isvc, EventType::Warning, reason, message).await;
    }
    period::record_state(
        &ctx.metrics,
        &ns,
        &name,
        counts,
        desired,
        &isvc.spec.autoscaling,
        &s.conditions,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_crds::{Action, Signals};
    use k8s_openapi::jiff::Timestamp;

    fn isvc() -> InferenceService {
        let mut i = ballast_crds::parse_yaml(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: chat, namespace: d, generation: 2}\nspec: {model: {source: 'synthetic:tiny'}}\n",
        )
        .unwrap()
        .remove(0);
        i.metadata.generation = Some(2);
        i
    }

    fn decision(time: &str, message: &str) -> Decision {
        Decision {
            action: Action::Hold,
            reason: "WithinTolerance".into(),
            message: message.into(),
            time: time.into(),
            signals: Signals::default(),
            recommendations: vec![],
        }
    }

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn an_unchanged_decision_keeps_the_status_byte_for_byte() {
        let mut i = isvc();
        let counts = ReplicaCounts {
            ready: 1,
            accepting: 1,
            ..ReplicaCounts::default()
        };
        let new = |i: &InferenceService, d: Decision, now| {
            status(NewStatus {
                isvc: i,
                counts,
                desired: 1,
                decision: Some(d),
                conditions: vec![],
                scaled: false,
                now,
            })
        };
        let first = new(&i, decision("t1", "holding"), at(100));
        assert_eq!(first.observed_generation, Some(2));
        i.status = Some(first.clone());
        let again = new(&i, decision("t2", "holding"), at(200));
        assert_eq!(again, first, "only the time moved: no write");
        let changed = new(&i, decision("t3", "something else"), at(300));
        assert_ne!(changed, first);
        assert_eq!(changed.last_decision.unwrap().time, "t3");
        // The Ready condition's transition time stays from the first period.
        assert_eq!(again.conditions[0].last_transition_time, at(100));
    }

    #[test]
    fn scaling_sets_the_last_scale_time() {
        let i = isvc();
        let s = status(NewStatus {
            isvc: &i,
            counts: ReplicaCounts::default(),
            desired: 2,
            decision: None,
            conditions: vec![ConditionSet {
                type_: "ScalingActive",
                status: true,
                reason: "ValidMetricFound",
                message: "m".into(),
            }],
            scaled: true,
            now: at(50),
        });
        assert_eq!(s.last_scale_time.as_deref(), Some("1970-01-01T00:00:50Z"));
        assert_eq!(s.desired_replicas, 2);
        let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["ScalingActive", "Ready"]);
    }

    #[test]
    fn degraded_turns_false_only_after_true_with_the_reason_that_recovered() {
        let live = |status: &str, reason: &str| Condition {
            type_: "Degraded".into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: at(1),
            observed_generation: None,
        };
        let failing = ConditionSet {
            type_: "Degraded",
            status: true,
            reason: "ImagePullFailed",
            message: "m".into(),
        };
        // Pods failing: that, whatever was before.
        assert_eq!(
            degraded_condition(Some(&live("True", "InvalidSpec")), Some(failing.clone())),
            Some(failing.clone())
        );
        assert_eq!(
            degraded_condition(None, Some(failing.clone())),
            Some(failing)
        );
        // Recovered: from an invalid spec, or from pods that could not run.
        let reason =
            |l: Option<&Condition>| degraded_condition(l, None).map(|c| (c.status, c.reason));
        assert_eq!(
            reason(Some(&live("True", "InvalidSpec"))),
            Some((false, "SpecValid"))
        );
        assert_eq!(
            reason(Some(&live("True", "EngineCrashLoop"))),
            Some((false, "EnginesRunning"))
        );
        // Never degraded, or already False: nothing to set.
        assert_eq!(reason(None), None);
        assert_eq!(reason(Some(&live("False", "EnginesRunning"))), None);
    }
}
