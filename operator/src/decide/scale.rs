//! The scaling half of a decision: follow `spec.replicas`, correct a size outside
//! [min, max], hold on unusable metrics, or run HPA's pipeline (per-signal proposals, the
//! largest wins, stabilise, rate-limit, clamp) and say why in one line.

use super::behavior::{self, Bounds, Cap};
use super::ctx::Ctx;
use super::explain::{self, list, num};
use super::hpa::{self, Pods};
use super::observe::{self, Health, Observed};
use super::{ConditionKind, ConditionUpdate, Reason, SignalName};

/// The scaling half of a decision.
pub(super) struct ScaleStep {
    pub(super) desired: i32,
    pub(super) reason: Reason,
    pub(super) message: String,
    /// Each signal's recommendation, when computed.
    pub(super) recommendations: Vec<(SignalName, i32)>,
    /// The recommendation to remember for the stabilisation windows.
    pub(super) record: Option<i32>,
    /// ScalingActive and ScalingLimited, where this step has something to say.
    pub(super) conditions: Vec<ConditionUpdate>,
}

impl ScaleStep {
    fn hold(c: &Ctx, reason: Reason, message: String) -> ScaleStep {
        ScaleStep {
            desired: c.current,
            reason,
            message,
            recommendations: Vec::new(),
            record: None,
            conditions: Vec::new(),
        }
    }

    fn with(mut self, kind: ConditionKind, status: bool, reason: &'static str, msg: &str) -> Self {
        self.conditions.push(ConditionUpdate {
            kind,
            status,
            reason,
            message: msg.to_string(),
        });
        self
    }
}

/// Autoscaling disabled: follow `spec.replicas` (set by `kubectl scale`, an HPA or KEDA).
pub(super) fn follow_spec(c: &Ctx) -> ScaleStep {
    let msg = "autoscaling disabled: following spec.replicas";
    match c.input.spec_replicas.filter(|r| *r >= 0) {
        Some(target) if target != c.current => ScaleStep {
            desired: target,
            ..ScaleStep::hold(
                c,
                Reason::FollowingSpecReplicas,
                format!("{msg}: {} → {target}", c.current),
            )
        },
        Some(_) => ScaleStep::hold(
            c,
            Reason::AutoscalingDisabled,
            format!("{msg}: at {}", c.current),
        ),
        None => ScaleStep::hold(
            c,
            Reason::AutoscalingDisabled,
            format!(
                "autoscaling disabled and spec.replicas unset: holding at {}",
                c.current
            ),
        ),
    }
    .with(
        ConditionKind::ScalingActive,
        false,
        "AutoscalingDisabled",
        msg,
    )
}

/// The current size is outside [min, max]: go to the bound, no metrics needed (as HPA).
pub(super) fn into_range(c: &Ctx) -> ScaleStep {
    let (desired, reason, limit, word) = if c.current < c.min {
        (
            c.min,
            Reason::BelowMinReplicas,
            Cap::TooFewReplicas,
            "below minReplicas",
        )
    } else {
        (
            c.max,
            Reason::AboveMaxReplicas,
            Cap::TooManyReplicas,
            "above maxReplicas",
        )
    };
    ScaleStep {
        desired,
        ..ScaleStep::hold(
            c,
            reason,
            format!(
                "{} replicas {word} {desired}: scaling {} → {desired}",
                c.current, c.current
            ),
        )
    }
    .with(
        ConditionKind::ScalingLimited,
        true,
        limit.as_str(),
        limit.message(),
    )
}

/// No replica exists and the gateway holds requests: scale to what they need at
/// `targets.capacityWaitingPerReplica` (1 without that target), at least one, within
/// `maxReplicas`, at once: no replica can report, so HPA's pipeline has nothing to read
/// (and HPA itself never scales from zero on its own).
pub(super) fn from_zero(c: &Ctx, held: f64) -> ScaleStep {
    let per = c
        .input
        .autoscaling
        .targets
        .capacity_waiting_per_replica
        .filter(|t| t.is_finite() && *t > 0.0);
    let need = per.map_or(1.0, |t| (held / t).ceil());
    let desired = (need.min(f64::from(c.max.max(1))) as i32).clamp(1, c.max.max(1));
    ScaleStep {
        desired,
        record: Some(desired),
        ..ScaleStep::hold(
            c,
            Reason::HeldRequests,
            format!(
                "the gateway holds {} requests and no replica exists: scaling {} → {desired}",
                num(held),
                c.current
            ),
        )
    }
}

/// Why the metrics cannot be acted on, if they cannot.
pub(super) fn metrics_problem(c: &Ctx) -> Option<(Reason, String)> {
    let f = &c.input.fleet;
    let holding = format!("holding at {}", c.current);
    let problem = match c.health {
        Health::NoReplicas => (
            Reason::NoReplicas,
            "no replicas exist, so none reports; requests the gateway holds (spec.gateway) or minReplicas > 0 bring one back"
                .to_string(),
        ),
        Health::Starting => (
            Reason::ReplicasStarting,
            format!(
                "{} replicas starting, none ready to report yet; {holding}",
                f.starting
            ),
        ),
        Health::Unavailable => (
            Reason::MetricsUnavailable,
            format!(
                "none of {} ready replicas reported metrics; {holding}",
                f.ready
            ),
        ),
        Health::Stale { reporting, ready } => (
            Reason::MetricsStale,
            format!(
                "only {reporting} of {ready} ready replicas reported (minReportingFraction {}); {holding}",
                num(c.input.metrics.min_reporting_fraction)
            ),
        ),
        Health::Ok if !c.observations.iter().any(|o| o.compared().is_some()) => {
            let names: Vec<&str> = c.observations.iter().map(|o| o.signal.as_str()).collect();
            (
                Reason::MetricsUnavailable,
                if names.is_empty() {
                    format!("no autoscaling target is set; {holding}")
                } else {
                    format!("no usable value for {}; {holding}", list(&names))
                },
            )
        }
        Health::Ok => return None,
    };
    Some(problem)
}

/// HPA's pipeline: per-signal proposals, the largest wins, stabilise, rate-limit, clamp.
pub(super) fn autoscale(c: &Ctx) -> ScaleStep {
    if let Some((reason, message)) = metrics_problem(c) {
        return ScaleStep::hold(c, reason, message.clone()).with(
            ConditionKind::ScalingActive,
            false,
            reason.as_str(),
            &message,
        );
    }
    let a = &c.input.autoscaling;
    let f = &c.input.fleet;
    let reporting = f.reporting();
    let ready = f.ready.max(reporting);
    let sat = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let pods = Pods {
        reporting: sat(reporting),
        missing: sat(ready - reporting),
        starting: sat(f.starting),
    };
    let tolerance = if a.tolerance.is_finite() && a.tolerance >= 0.0 {
        a.tolerance
    } else {
        0.0
    };
    let deferred = observe::deferred_dominates(c.signals);
    let current = c.current;

    let mut recommendations = Vec::new();
    let mut missing = Vec::new();
    let mut held_for_warmup = false;
    for o in c.observations {
        let Some(v) = o.compared() else {
            if o.observed == Observed::Missing {
                missing.push(o.signal.as_str());
            }
            continue;
        };
        // HPA averages a pod metric over the pods that have it and multiplies by that same
        // count; ready pods without it are missing. A replica's 429 rate needs two samples
        // of its counter, so one that just joined reports but has no rate yet.
        let pods = match o.signal {
            SignalName::AdmissionRejectionsPerSecond => {
                let with_rate = f.with_rejection_rate().min(reporting);
                Pods {
                    reporting: sat(with_rate),
                    missing: sat(ready - with_rate),
                    ..pods
                }
            }
            _ => pods,
        };
        let mut r = hpa::propose(v / o.target, current, pods, tolerance);
        if deferred {
            // Deferred requests inflate rejections and TTFT but not capacity: only
            // capacity waiting and KV usage may still ask for more, and none for fewer.
            let measures_capacity = matches!(
                o.signal,
                SignalName::CapacityWaiting | SignalName::KvCacheUsage
            );
            if !measures_capacity {
                r = r.min(current);
            }
            r = r.max(current);
        }
        // A signal above target that asks for no more than the current size is covered
        // by replicas still starting (HPA's rule, or simply ceil(ratio × ready) ≤ size).
        held_for_warmup |= pods.starting > 0 && v / o.target > 1.0 + tolerance && r <= current;
        recommendations.push((o.signal, r));
    }
    // The largest wins; on a tie the first (HPA keeps the first metric with the maximum).
    let Some((winner, raw)) = recommendations
        .iter()
        .copied()
        .reduce(|best, x| if x.1 > best.1 { x } else { best })
    else {
        unreachable!("metrics_problem holds when no signal has a value");
    };
    let summary_of = |s: SignalName| {
        c.observations
            .iter()
            .find(|o| o.signal == s)
            .map(|o| explain::summary(o, reporting))
            .unwrap_or_default()
    };
    let all_summaries = || {
        let v: Vec<String> = c
            .observations
            .iter()
            .filter(|o| o.compared().is_some())
            .map(|o| explain::summary(o, reporting))
            .collect();
        v.join(", ")
    };

    if !missing.is_empty() && raw < current {
        let message = format!(
            "{} missing; the others ({}) would scale down to {raw}, which needs every signal; holding at {current}",
            list(&missing),
            all_summaries()
        );
        return ScaleStep {
            recommendations,
            ..ScaleStep::hold(c, Reason::SignalMissing, message.clone())
        }
        .with(
            ConditionKind::ScalingActive,
            false,
            "SignalMissing",
            &message,
        );
    }

    let stabilized = behavior::stabilize(current, raw, c.past, c.behavior, c.now);
    let bounds = Bounds {
        current,
        min: c.min,
        max: c.max,
    };
    let (desired, limit) = behavior::limit(
        stabilized,
        bounds,
        c.behavior,
        &c.history.scale_events,
        c.now,
    );
    let up_window = c.behavior.scale_up.stabilization_window_seconds;
    let down_window = c.behavior.scale_down.stabilization_window_seconds;
    let limited = limit
        .map(|l| format!(" ({})", l.message()))
        .unwrap_or_default();

    let (reason, message) = if desired > current {
        let mut m = format!("{}; scaling {current} → {desired}", summary_of(winner));
        if stabilized < raw {
            m.push_str(&format!(
                " (lowest recommendation in the {up_window}s scale-up window)"
            ));
        }
        m.push_str(&limited);
        (Reason::scale_up_by(winner), m)
    } else if desired < current {
        let mut m = format!("{}; scaling {current} → {desired}", all_summaries());
        if stabilized > raw {
            m.push_str(&format!(
                " (highest recommendation in the {down_window}s scale-down window)"
            ));
        }
        m.push_str(&limited);
        (Reason::AllSignalsBelowTarget, m)
    } else if raw > current {
        let wants = format!("{} asks for {raw}", summary_of(winner));
        if stabilized == current {
            let m = format!(
                "{wants}; holding at {current}, the lowest recommendation in the {up_window}s scale-up window"
            );
            (Reason::Stabilizing, m)
        } else if current >= c.max {
            (
                Reason::AtMaxReplicas,
                format!("{wants}; already at maxReplicas {}", c.max),
            )
        } else {
            (
                Reason::ScaleRateLimited,
                format!("{wants}; the scale-up policies allow no more replicas now"),
            )
        }
    } else if raw < current {
        let wants = format!("{} ask for {raw}", all_summaries());
        if stabilized == current {
            let m = format!(
                "{wants}; holding at {current}, the highest recommendation in the {down_window}s scale-down window"
            );
            (Reason::Stabilizing, m)
        } else if current <= c.min {
            (
                Reason::AtMinReplicas,
                format!("{wants}; already at minReplicas {}", c.min),
            )
        } else {
            (
                Reason::ScaleRateLimited,
                format!("{wants}; the scale-down policies allow no fewer replicas now"),
            )
        }
    } else if deferred {
        (
            Reason::DeferredWaiting,
            format!(
                "waiting is mostly deferred ({} deferred, {} waiting for capacity): more replicas would not help; {}",
                num(c.signals.deferred_waiting.unwrap_or(0.0)),
                num(c.signals.capacity_waiting.unwrap_or(0.0)),
                all_summaries()
            ),
        )
    } else if held_for_warmup {
        (
            Reason::ReplicasStarting,
            format!(
                "{} replicas still starting cover the load ({}); holding at {current}",
                f.starting,
                all_summaries()
            ),
        )
    } else {
        (
            Reason::WithinTolerance,
            format!(
                "{} (tolerance {}); holding at {current}",
                all_summaries(),
                num(tolerance)
            ),
        )
    };

    let step = ScaleStep {
        desired,
        reason,
        message,
        recommendations,
        record: Some(raw),
        conditions: Vec::new(),
    };
    let active = format!("computed a size from {winner}");
    let step = step.with(
        ConditionKind::ScalingActive,
        true,
        "ValidMetricFound",
        &active,
    );
    match limit {
        Some(l) => step.with(ConditionKind::ScalingLimited, true, l.as_str(), l.message()),
        None => step.with(
            ConditionKind::ScalingLimited,
            false,
            "DesiredWithinRange",
            "the desired count is within the acceptable range",
        ),
    }
}
