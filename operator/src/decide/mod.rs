//! The pure decision core (control-plane contract §4): from (spec, signals, history, now)
//! to a decision and its explanation. No clocks, no I/O, no Kubernetes: time is an
//! argument and memory is the [`History`] the caller keeps.
//!
//! # Using it
//! Each control period the runtime:
//! 1. builds a [`DecideInput`] (spec parts, the current size, what is out of rotation, the
//!    [`FleetSignals`](crate::signals::FleetSignals) just scraped);
//! 2. calls [`decide`] with its [`History`] for the resource and `now` (a monotonic
//!    [`Duration`] since any fixed epoch, the same epoch every period);
//! 3. applies the [`Outcome`]: `desired_replicas` to the workload and
//!    `status.desiredReplicas`, `rebalance` to routing, `conditions`, and
//!    [`Outcome::to_status_decision`] to `status.lastDecision`;
//! 4. calls [`History::record`] with `outcome.history` and whether the replica change was
//!    applied.
//!
//! # What is decided
//! Scaling is HPA's algorithm on four signals (the `hpa` and `behavior` source modules
//! state the exact rules and where in Kubernetes they come from), with Ballast's changes:
//! - too few ready replicas reporting (`metrics.minReportingFraction`), or no usable
//!   signal at all → hold with `MetricsAvailable=False` (HPA would assume values instead);
//!   NaN, infinite, negative or out-of-range values are missing, never zero;
//! - waiting mostly deferred (deferred ≥ capacity-waiting, and some deferred) → the
//!   rejection and TTFT signals may not ask for more replicas, and no signal may ask for
//!   fewer: only capacity waiting or KV usage above target still scale up; otherwise hold
//!   with `DeferredWaiting`;
//! - a signal missing → scale-up may proceed on the others, scale-down may not; but a
//!   signal whose family no replica's latest successful scrape carried is *not exported*
//!   by these replicas (an older vLLM without the rejection counter, SGLang): its target
//!   is ignored and status says so (judged per fleet from what it exposes, never from the
//!   engine kind);
//! - an empty history (first period, or after a gap longer than both windows) is seeded
//!   with the current size, so a restart never scales down before a full window passed.
//!
//! Rebalancing (taking hot replicas out of rotation, restoring cooled ones, DP weights) is
//! described in the rebalance module; it never changes the replica count, and its action
//! shows as `Rebalance` only when the count does not change.

#![warn(missing_docs)]

mod behavior;
mod ctx;
mod dp;
mod explain;
mod history;
mod hpa;
mod input;
mod observe;
mod outcome;
mod rebalance;
mod scale;

use std::time::Duration;

use ballast_crds::Action;

pub use history::{History, HistoryUpdate, ScaleEvent, TimedRecommendation};
pub use input::{DecideInput, SignalName};
pub use outcome::{
    ConditionKind, ConditionUpdate, DpWeights, Outcome, Reason, RebalancePlan, SignalReport,
    SignalState,
};

use ctx::Ctx;
use explain::list;
use observe::{Health, Observation, Observed};
use scale::{ScaleStep, autoscale, follow_spec, from_zero, into_range, metrics_problem};

/// Decides one control period. Pure: the same arguments always give the same outcome.
pub fn decide(input: &DecideInput, history: &History, now: Duration) -> Outcome {
    let a = &input.autoscaling;
    let current = input.current_replicas.max(0);
    let max = a.max_replicas.max(0);
    let min = a.min_replicas.clamp(0, max);
    let behavior = a.behavior.resolved();
    let signals = observe::sanitized(&input.fleet);
    let observations = observe::observe(input, &signals);
    let health = Health::of(input);

    let seed = history
        .recommendations
        .is_empty()
        .then_some(TimedRecommendation {
            at: now,
            replicas: current,
        });
    let mut past = history.recommendations.clone();
    past.extend(seed);

    let ctx = Ctx {
        input,
        history,
        now,
        current,
        min,
        max,
        past: &past,
        behavior: &behavior,
        health,
        observations: &observations,
        signals: &signals,
    };
    let idle = health == Health::Ok
        && input.fleet.replicas.iter().all(observe::is_idle)
        && signals.held_requests.is_none_or(|h| h == 0.0);
    let step = if !a.enabled {
        follow_spec(&ctx)
    } else if current < min || current > max {
        into_range(&ctx)
    } else if let Some(held) = signals
        .held_requests
        .filter(|h| *h > 0.0 && health == Health::NoReplicas && max > 0)
    {
        from_zero(&ctx, held)
    } else {
        to_zero_when_idle(&ctx, autoscale(&ctx), idle)
    };

    let usable = health == Health::Ok && observations.iter().any(|o| o.compared().is_some());
    let headroom = usable
        && observations.iter().all(|o| match o.observed {
            Observed::NotExported => true,
            _ => o.compared().is_some_and(|v| v <= o.target),
        });
    let rb = rebalance::plan(input, health == Health::Ok, headroom);

    let desired = step.desired;
    let action = if desired > current {
        Action::ScaleUp
    } else if desired < current {
        Action::ScaleDown
    } else if !rb.plan.is_empty() {
        Action::Rebalance
    } else {
        Action::Hold
    };
    let (reason, message) = match (action, rb.reason) {
        (Action::Rebalance, Some(r)) => (r, format!("{}; {}", rb.message, step.message)),
        _ if rb.message.is_empty() => (step.reason, step.message.clone()),
        _ => (step.reason, format!("{}; {}", step.message, rb.message)),
    };

    let mut conditions = vec![metrics_available(&ctx)];
    conditions.extend(step.conditions.iter().cloned());

    let reports = observations
        .iter()
        .map(|o| report(o, &step, input.fleet.reporting(), a.tolerance))
        .collect();

    let history_update = HistoryUpdate {
        now,
        recommendations: seed
            .into_iter()
            .chain(
                step.record
                    .map(|replicas| TimedRecommendation { at: now, replicas }),
            )
            .collect(),
        scale_event: (a.enabled && desired != current).then_some(ScaleEvent {
            at: now,
            from: current,
            to: desired,
        }),
        keep_recommendations: behavior::window(&behavior.scale_up)
            .max(behavior::window(&behavior.scale_down)),
        keep_scale_events: behavior::longest_period(&behavior),
        busy: !idle,
    };

    Outcome {
        action,
        current_replicas: current,
        desired_replicas: desired,
        reason,
        message,
        signals,
        reports,
        conditions,
        rebalance: rb.plan,
        history: history_update,
    }
}

/// `minReplicas: 0`: zero replicas only after `scaleToZeroAfterSeconds` without a request
/// (then at once, whatever the other signals' windows say); before that, never below one.
fn to_zero_when_idle(c: &Ctx, step: ScaleStep, idle: bool) -> ScaleStep {
    if c.min != 0 || c.current == 0 {
        return step;
    }
    // Zero only while a picker reports held requests: without one (no InferencePool CRD,
    // no ready picker) nothing would see the next request and bring a replica back.
    if c.signals.held_requests.is_none() {
        return at_least_one(
            step,
            "no gateway picker reports held requests, so nothing would bring a replica back from 0",
        );
    }
    let after = Duration::from_secs(c.input.autoscaling.scale_to_zero_after_seconds.max(1) as u64);
    // The period's own idleness counts from the last busy one (or from now, the first).
    let idle_for = match (idle, c.history.busy_at) {
        (true, Some(busy)) => c.now.saturating_sub(busy),
        _ => Duration::ZERO,
    };
    if idle && idle_for >= after {
        return ScaleStep {
            desired: 0,
            reason: Reason::ScaledToZero,
            message: format!(
                "no request for {}s (scaleToZeroAfterSeconds {}): scaling {} → 0; the gateway holds the next request and brings one back",
                idle_for.as_secs(),
                after.as_secs(),
                c.current
            ),
            record: Some(0),
            ..step
        };
    }
    let wait = if idle {
        format!(
            "idle for {}s of {}s, scaleToZeroAfterSeconds",
            idle_for.as_secs(),
            after.as_secs()
        )
    } else {
        "requests in the fleet, scaleToZeroAfterSeconds".to_string()
    };
    at_least_one(step, &wait)
}

/// `step`, raised to one replica (reason `IdleBeforeZero`, saying `why`) if it went to 0.
fn at_least_one(step: ScaleStep, why: &str) -> ScaleStep {
    if step.desired != 0 {
        return step;
    }
    ScaleStep {
        desired: 1,
        reason: Reason::IdleBeforeZero,
        message: format!("{}; at 1 until zero is due ({why})", step.message),
        ..step
    }
}

/// The MetricsAvailable condition.
fn metrics_available(c: &Ctx) -> ConditionUpdate {
    let f = &c.input.fleet;
    let ready = f.ready.max(f.reporting());
    let cond = |status, reason, message: String| ConditionUpdate {
        kind: ConditionKind::MetricsAvailable,
        status,
        reason,
        message,
    };
    if let Some((reason, message)) = metrics_problem(c) {
        let word = match reason {
            Reason::MetricsStale => "MetricsStale",
            _ => "MetricsUnavailable",
        };
        return cond(false, word, message);
    }
    let mut reported = format!("{} of {ready} ready replicas reported", f.reporting());
    let named = |state: Observed| -> Vec<&str> {
        c.observations
            .iter()
            .filter(|o| o.observed == state)
            .map(|o| o.signal.as_str())
            .collect()
    };
    let not_exported = named(Observed::NotExported);
    if !not_exported.is_empty() {
        reported.push_str(&format!(
            "; {} not exported by these replicas, target ignored",
            list(&not_exported)
        ));
    }
    let missing = named(Observed::Missing);
    if missing.is_empty() {
        cond(true, "MetricsReported", reported)
    } else {
        cond(
            true,
            "SomeSignalsMissing",
            format!("{} missing; {reported}", list(&missing)),
        )
    }
}

/// One signal's report for status.
fn report(o: &Observation, step: &ScaleStep, reporting: usize, tolerance: f64) -> SignalReport {
    let observed = o.compared();
    let state = match (o.observed, observed) {
        (Observed::NotExported, _) => SignalState::Unsupported,
        (_, None) => SignalState::Missing,
        (_, Some(v)) => {
            let ratio = v / o.target;
            if hpa::within_tolerance(ratio, tolerance) {
                SignalState::Within
            } else if ratio > 1.0 {
                SignalState::Above
            } else {
                SignalState::Below
            }
        }
    };
    SignalReport {
        signal: o.signal,
        target: o.target,
        observed,
        replicas: step
            .recommendations
            .iter()
            .find(|(s, _)| *s == o.signal)
            .map(|(_, r)| *r),
        state,
        summary: explain::summary(o, reporting),
    }
}
