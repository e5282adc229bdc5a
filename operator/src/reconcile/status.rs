//! Step 7: the resource's status, written by server-side apply on the status subresource
//! only when it changed, and Events for the decisions that changed something.

use ballast_crds::{Decision, InferenceService, InferenceServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::apply::FIELD_MANAGER;
use super::fetch::Observed;
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

/// The status the resource should have.
pub fn status(n: NewStatus<'_>) -> InferenceServiceStatus {
    let live = n.isvc.status.clone().unwrap_or_default();
    let generation = n.isvc.metadata.generation;
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
        desired: n.desired,
        last_scale_time,
        conditions: &conditions,
        last_decision: last_decision.as_ref(),
    })
}

/// `Degraded=True` when engine pods cannot run: reason `ImagePullFailed`,
/// `ContainerCreateFailed` or `EngineCrashLoop` (the most actionable kind among the failing
/// pods), and a message naming the pod, container, kubelet reason and message (and how
/// the container last exited), with how many pods fail. `None` when every pod runs or
/// starts normally.
pub fn start_failure_condition(observed: &Observed) -> Option<ConditionSet<'static>> {
    let failing = observed.start_failures();
    let (pod, first) = failing.first()?;
    let mut message = first.describe(&pod.name);
    if failing.len() > 1 {
        message.push_str(&format!(
            "; {} of {} pods cannot run",
            failing.len(),
            observed.live_pods()
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
