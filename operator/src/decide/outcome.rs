//! What one decision says: the action and size, why, what to change in routing, which
//! conditions to set, and what to remember.

use std::fmt;

use ballast_crds::{Action, Decision, Recommendation, Signals};

use super::history::HistoryUpdate;
use super::input::SignalName;

/// The stable CamelCase word of a decision (`status.lastDecision.reason`, the `reason`
/// label of `ballast_operator_decisions_total`). Words are never renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Scale-up: capacity waiting per replica above target.
    CapacityWaiting,
    /// Scale-up: fleet KV cache usage above target.
    KvCacheHot,
    /// Scale-up: admission rejections per replica above target.
    AdmissionRejections,
    /// Scale-up: fleet TTFT p99 above target.
    TtftHigh,
    /// Scale-down: every signal below target for the whole scale-down window.
    AllSignalsBelowTarget,
    /// Scale-up to `minReplicas` from below it (no metrics needed).
    BelowMinReplicas,
    /// Scale-down to `maxReplicas` from above it (no metrics needed).
    AboveMaxReplicas,
    /// Autoscaling disabled: following `spec.replicas`.
    FollowingSpecReplicas,
    /// Autoscaling disabled and `spec.replicas` already met (or unset).
    AutoscalingDisabled,
    /// Hold: waiting is mostly deferred by tenant caps; more replicas would not help.
    DeferredWaiting,
    /// Hold: every signal within tolerance of its target.
    WithinTolerance,
    /// Hold: a scale-up is wanted but the fleet is at `maxReplicas`.
    AtMaxReplicas,
    /// Hold: a scale-down is wanted but the fleet is at `minReplicas`.
    AtMinReplicas,
    /// Hold: the stabilisation window keeps the current size.
    Stabilizing,
    /// Hold: a rate policy (or `selectPolicy: Disabled`) allows no change now.
    ScaleRateLimited,
    /// Hold: replicas are starting; the load is already covered by them.
    ReplicasStarting,
    /// Hold: a signal is missing, and the others alone would scale down.
    SignalMissing,
    /// Hold: fewer ready replicas reported than `minReportingFraction`.
    MetricsStale,
    /// Hold: no usable signal at all.
    MetricsUnavailable,
    /// Hold: there are no replicas to report (scale from zero needs an external trigger).
    NoReplicas,
    /// Scale-up from zero: the gateway holds requests and no replica exists to serve them.
    HeldRequests,
    /// Scale-down to zero: no request for `scaleToZeroAfterSeconds` (`minReplicas: 0`).
    ScaledToZero,
    /// Hold at one: a scale to zero waits for `scaleToZeroAfterSeconds` without requests.
    IdleBeforeZero,
    /// Rebalance: a hot replica taken out of rotation.
    ReplicaHot,
    /// Rebalance: a replica cooled down and returns to rotation.
    ReplicaCooled,
    /// Rebalance: new DP dispatch weights inside a replica.
    DpImbalance,
    /// Rebalance: replicas returned so that `minAccepting` replicas take traffic.
    MinAccepting,
    /// Rebalance: rebalancing is disabled; replicas still out return to rotation.
    RebalancingDisabled,
}

impl Reason {
    /// The CamelCase word.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::CapacityWaiting => "CapacityWaiting",
            Reason::KvCacheHot => "KvCacheHot",
            Reason::AdmissionRejections => "AdmissionRejections",
            Reason::TtftHigh => "TtftHigh",
            Reason::AllSignalsBelowTarget => "AllSignalsBelowTarget",
            Reason::BelowMinReplicas => "BelowMinReplicas",
            Reason::AboveMaxReplicas => "AboveMaxReplicas",
            Reason::FollowingSpecReplicas => "FollowingSpecReplicas",
            Reason::AutoscalingDisabled => "AutoscalingDisabled",
            Reason::DeferredWaiting => "DeferredWaiting",
            Reason::WithinTolerance => "WithinTolerance",
            Reason::AtMaxReplicas => "AtMaxReplicas",
            Reason::AtMinReplicas => "AtMinReplicas",
            Reason::Stabilizing => "Stabilizing",
            Reason::ScaleRateLimited => "ScaleRateLimited",
            Reason::ReplicasStarting => "ReplicasStarting",
            Reason::SignalMissing => "SignalMissing",
            Reason::MetricsStale => "MetricsStale",
            Reason::MetricsUnavailable => "MetricsUnavailable",
            Reason::NoReplicas => "NoReplicas",
            Reason::HeldRequests => "HeldRequests",
            Reason::ScaledToZero => "ScaledToZero",
            Reason::IdleBeforeZero => "IdleBeforeZero",
            Reason::ReplicaHot => "ReplicaHot",
            Reason::ReplicaCooled => "ReplicaCooled",
            Reason::DpImbalance => "DpImbalance",
            Reason::MinAccepting => "MinAccepting",
            Reason::RebalancingDisabled => "RebalancingDisabled",
        }
    }

    /// The scale-up reason when `signal` asked for the most replicas.
    pub fn scale_up_by(signal: SignalName) -> Reason {
        match signal {
            SignalName::CapacityWaiting => Reason::CapacityWaiting,
            SignalName::KvCacheUsage => Reason::KvCacheHot,
            SignalName::AdmissionRejectionsPerSecond => Reason::AdmissionRejections,
            SignalName::TtftP99Seconds => Reason::TtftHigh,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a signal stands against its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalState {
    /// Above target by more than the tolerance.
    Above,
    /// Within tolerance of the target.
    Within,
    /// Below target by more than the tolerance.
    Below,
    /// Configured but without a usable value this period.
    Missing,
    /// Configured, but no replica's latest successful scrape carried the signal's family:
    /// these replicas do not export it, and the target is ignored.
    Unsupported,
}

/// One configured signal this period.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalReport {
    /// Which signal.
    pub signal: SignalName,
    /// Its target.
    pub target: f64,
    /// The value compared with the target (per replica for capacity waiting); `None`
    /// when missing.
    pub observed: Option<f64>,
    /// Replicas it recommends (HPA's per-metric proposal, after Ballast's deferred rule);
    /// `None` when it could not recommend.
    pub replicas: Option<i32>,
    /// Where it stands.
    pub state: SignalState,
    /// A phrase for people, e.g. "capacity waiting 14 over 2 replicas > target 4 per
    /// replica".
    pub summary: String,
}

/// A condition type the decision sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConditionKind {
    /// Whether enough replicas report usable signals.
    MetricsAvailable,
    /// Whether the autoscaler can compute a size.
    ScalingActive,
    /// Whether the size was capped by min/max or a rate policy.
    ScalingLimited,
}

impl ConditionKind {
    /// The condition `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionKind::MetricsAvailable => "MetricsAvailable",
            ConditionKind::ScalingActive => "ScalingActive",
            ConditionKind::ScalingLimited => "ScalingLimited",
        }
    }
}

/// A condition to set; the runtime adds the transition time and generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    /// Condition type.
    pub kind: ConditionKind,
    /// True or False.
    pub status: bool,
    /// CamelCase reason.
    pub reason: &'static str,
    /// One line for people.
    pub message: String,
}

/// New DP dispatch weights for one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct DpWeights {
    /// The replica.
    pub replica: String,
    /// One weight per rank, summing to 1, none zero.
    pub weights: Vec<f64>,
    /// The imbalance ratio that prompted them.
    pub imbalance_ratio: f64,
}

/// Routing changes: who takes new traffic and how a replica spreads it over its ranks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RebalancePlan {
    /// Replicas to take out of rotation (stop routing new requests to them).
    pub take_out: Vec<String>,
    /// Replicas to return to rotation.
    pub restore: Vec<String>,
    /// Replicas whose DP dispatch weights to change.
    pub dp_weights: Vec<DpWeights>,
}

impl RebalancePlan {
    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        self.take_out.is_empty() && self.restore.is_empty() && self.dp_weights.is_empty()
    }
}

/// One decision and its explanation.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// ScaleUp, ScaleDown, Rebalance or Hold. A scale action may come with routing changes
    /// in `rebalance` (restores, DP weights); `Rebalance` means routing changes only.
    pub action: Action,
    /// The size the decision started from (`DecideInput::current_replicas`).
    pub current_replicas: i32,
    /// The size to run: write it to `status.desiredReplicas` and the workload.
    pub desired_replicas: i32,
    /// The stable reason word.
    pub reason: Reason,
    /// One line for people.
    pub message: String,
    /// The signals the decision was made on (garbage shown as null).
    pub signals: Signals,
    /// Each configured signal's state and recommendation.
    pub reports: Vec<SignalReport>,
    /// Conditions to set on the resource.
    pub conditions: Vec<ConditionUpdate>,
    /// Routing changes to apply.
    pub rebalance: RebalancePlan,
    /// What to record in the [`History`](super::History) after acting.
    pub history: HistoryUpdate,
}

impl Outcome {
    /// The per-signal recommendations as written to status (signals that could
    /// recommend).
    pub fn recommendations(&self) -> Vec<Recommendation> {
        self.reports
            .iter()
            .filter_map(|r| {
                r.replicas.map(|replicas| Recommendation {
                    signal: r.signal.as_str().to_string(),
                    replicas,
                })
            })
            .collect()
    }

    /// `status.lastDecision`, stamped with `time` (RFC 3339).
    pub fn to_status_decision(&self, time: impl Into<String>) -> Decision {
        Decision {
            action: self.action,
            reason: self.reason.as_str().to_string(),
            message: self.message.clone(),
            time: time.into(),
            signals: self.signals.clone(),
            recommendations: self.recommendations(),
        }
    }

    /// The condition of `kind` this decision sets, if any.
    pub fn condition(&self, kind: ConditionKind) -> Option<&ConditionUpdate> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}
