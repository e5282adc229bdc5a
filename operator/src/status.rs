//! An InferenceService's status, assembled the same way by both runtimes (`ballast local`
//! and `ballast operator`): conditions merged with stable transition times, and the
//! status object the CRD holds.

use ballast_crds::{Decision, InferenceServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition to set: its type, whether it holds, a CamelCase reason and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionSet<'a> {
    /// `Ready`, `ScalingActive`, `ScalingLimited`, `MetricsAvailable`, `Degraded`.
    pub type_: &'a str,
    /// True or False.
    pub status: bool,
    /// A stable CamelCase word.
    pub reason: &'a str,
    /// One line for humans.
    pub message: String,
}

/// Sets a condition in `conditions`: reason and message always follow, the transition
/// time moves only when the status flips (as Kubernetes' `meta.SetStatusCondition`), and
/// `observedGeneration` records the generation it was computed for. Returns whether
/// anything changed, so a runtime can skip writing an unchanged status.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    c: ConditionSet<'_>,
    now: Time,
    generation: Option<i64>,
) -> bool {
    let status = if c.status { "True" } else { "False" };
    match conditions.iter_mut().find(|x| x.type_ == c.type_) {
        Some(x) => {
            let changed = x.status != status
                || x.reason != c.reason
                || x.message != c.message
                || x.observed_generation != generation;
            if x.status != status {
                x.last_transition_time = now;
                x.status = status.to_string();
            }
            x.reason = c.reason.to_string();
            x.message = c.message;
            x.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: c.type_.to_string(),
                status: status.to_string(),
                reason: c.reason.to_string(),
                message: c.message,
                last_transition_time: now,
                observed_generation: generation,
            });
            true
        }
    }
}

/// Replica counts as status reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaCounts {
    /// Serving.
    pub ready: i32,
    /// Started, not serving yet.
    pub starting: i32,
    /// Leaving (draining or stopping).
    pub draining: i32,
    /// Serving and taking new traffic.
    pub accepting: i32,
}

/// Everything a status is made of.
#[derive(Debug, Clone)]
pub struct StatusParts<'a> {
    /// The resource's name.
    pub name: &'a str,
    /// The generation the status describes.
    pub generation: Option<i64>,
    /// Replica counts.
    pub counts: ReplicaCounts,
    /// Replicas (not leaving) that run the latest pod template.
    pub updated: i32,
    /// The replica count the operator wants.
    pub desired: i32,
    /// RFC 3339 time of the last change of `desired`.
    pub last_scale_time: Option<String>,
    /// Conditions, already merged.
    pub conditions: &'a [Condition],
    /// The latest decision.
    pub last_decision: Option<&'a Decision>,
}

/// The status object, exactly as the CRD's `status` holds it. `replicas` counts every
/// replica that exists (ready, starting and leaving), as a Deployment's status does.
pub fn assemble(p: StatusParts<'_>) -> InferenceServiceStatus {
    let c = p.counts;
    InferenceServiceStatus {
        observed_generation: p.generation,
        replicas: c.ready + c.starting + c.draining,
        ready_replicas: c.ready,
        accepting_replicas: c.accepting,
        updated_replicas: p.updated,
        desired_replicas: p.desired,
        selector: crate::labels::selector(p.name),
        last_scale_time: p.last_scale_time,
        conditions: p.conditions.to_vec(),
        last_decision: p.last_decision.cloned(),
    }
}

/// The `Ready` condition for `counts` out of `desired`.
pub fn ready_condition(counts: ReplicaCounts, desired: i32) -> ConditionSet<'static> {
    let message = format!("{} of {desired} replicas ready", counts.ready);
    if counts.ready > 0 {
        ConditionSet {
            type_: "Ready",
            status: true,
            reason: "ReplicasReady",
            message,
        }
    } else if desired == 0 {
        ConditionSet {
            type_: "Ready",
            status: false,
            reason: "NoReplicas",
            message,
        }
    } else {
        ConditionSet {
            type_: "Ready",
            status: false,
            reason: "ReplicasStarting",
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn set(conditions: &mut Vec<Condition>, status: bool, reason: &str, t: i64) -> bool {
        set_condition(
            conditions,
            ConditionSet {
                type_: "Ready",
                status,
                reason,
                message: format!("{reason} message"),
            },
            at(t),
            Some(3),
        )
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let mut c = Vec::new();
        assert!(set(&mut c, false, "ReplicasStarting", 10));
        assert_eq!(c[0].last_transition_time, at(10));
        assert!(
            !set(&mut c, false, "ReplicasStarting", 20),
            "nothing changed"
        );
        assert_eq!(c[0].last_transition_time, at(10));
        assert!(set(&mut c, true, "ReplicasReady", 30));
        assert_eq!(c[0].last_transition_time, at(30));
        assert!(set(&mut c, true, "SomethingElse", 40), "reason changed");
        assert_eq!(c[0].last_transition_time, at(30), "same status, same time");
        assert_eq!(c[0].reason, "SomethingElse");
        assert_eq!(c[0].observed_generation, Some(3));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn status_counts_every_replica_that_exists() {
        let counts = ReplicaCounts {
            ready: 2,
            starting: 1,
            draining: 1,
            accepting: 1,
        };
        let s = assemble(StatusParts {
            name: "chat",
            generation: Some(4),
            counts,
            updated: 2,
            desired: 3,
            last_scale_time: None,
            conditions: &[],
            last_decision: None,
        });
        assert_eq!(
            (
                s.replicas,
                s.ready_replicas,
                s.accepting_replicas,
                s.updated_replicas
            ),
            (4, 2, 1, 2)
        );
        assert_eq!(
            s.selector,
            "app.kubernetes.io/instance=chat,app.kubernetes.io/name=ballast-engine"
        );
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(ready_condition(counts, 3).reason, "ReplicasReady");
        let none = ReplicaCounts::default();
        assert_eq!(ready_condition(none, 2).reason, "ReplicasStarting");
        assert_eq!(ready_condition(none, 0).reason, "NoReplicas");
    }
}
