//! Scaling decisions: Ballast's decision table (contract §4) on hand-computed numbers.

use crate::decide_support as support;

use ballast_crds::Action;
use ballast_operator::decide::{ConditionKind, History, Reason, SignalName, SignalState, decide};
use ballast_operator::signals::Family;
use support::*;

/// One row: replicas' (KV, capacity waiting), current size, expected size and reason.
struct Row {
    name: &'static str,
    kv: Vec<f64>,
    waiting: Vec<f64>,
    current: i32,
    max: i32,
    want: i32,
    reason: Reason,
}

#[test]
fn capacity_load_scales_by_the_hpa_formula() {
    // Defaults: 4 waiting per replica, KV 0.85, tolerance 0.1; scale-up: +4 or +100 % / 15 s.
    let rows = [
        Row {
            // 14 over 2 = 7 per replica, ratio 1.75 → ceil(1.75 × 2) = 4.
            name: "contract example",
            kv: vec![0.5, 0.5],
            waiting: vec![7.0, 7.0],
            current: 2,
            max: 10,
            want: 4,
            reason: Reason::CapacityWaiting,
        },
        Row {
            // 15 over 3 = 5, ratio 1.25 → ceil(3.75) = 4.
            name: "uneven replicas sum",
            kv: vec![0.4, 0.4, 0.4],
            waiting: vec![9.0, 6.0, 0.0],
            current: 3,
            max: 10,
            want: 4,
            reason: Reason::CapacityWaiting,
        },
        Row {
            // 8.6 over 2 = 4.3, ratio 1.075: within tolerance.
            name: "within tolerance",
            kv: vec![0.5, 0.5],
            waiting: vec![4.3, 4.3],
            current: 2,
            max: 10,
            want: 2,
            reason: Reason::WithinTolerance,
        },
        Row {
            // ratio 5 → 15, capped at maxReplicas 4.
            name: "clamped at max",
            kv: vec![0.5, 0.5, 0.5],
            waiting: vec![20.0, 20.0, 20.0],
            current: 3,
            max: 4,
            want: 4,
            reason: Reason::CapacityWaiting,
        },
        Row {
            // ratio 10 → 10, but +4 / +100 % per 15 s from 1 allows 5.
            name: "rate limited",
            kv: vec![0.5],
            waiting: vec![40.0],
            current: 1,
            max: 10,
            want: 5,
            reason: Reason::CapacityWaiting,
        },
        Row {
            name: "already at max",
            kv: vec![0.5; 4],
            waiting: vec![20.0; 4],
            current: 4,
            max: 4,
            want: 4,
            reason: Reason::AtMaxReplicas,
        },
        Row {
            // KV 0.95 / 0.85 = 1.118 → ceil(4.47) = 5 beats capacity (1 per replica).
            name: "largest recommendation wins",
            kv: vec![0.95; 4],
            waiting: vec![1.0; 4],
            current: 4,
            max: 10,
            want: 5,
            reason: Reason::KvCacheHot,
        },
    ];
    for row in rows {
        let mut sp = spec();
        sp.autoscaling.max_replicas = row.max;
        let reps = row
            .kv
            .iter()
            .zip(&row.waiting)
            .enumerate()
            .map(|(i, (k, w))| replica(&format!("r{i}"), *k, *w))
            .collect();
        let out = decide(
            &input(&sp, row.current, fleet(reps)),
            &History::default(),
            s(0),
        );
        assert_eq!(
            out.desired_replicas, row.want,
            "{}: {}",
            row.name, out.message
        );
        assert_eq!(out.reason, row.reason, "{}: {}", row.name, out.message);
        let expected_action = match row.want.cmp(&row.current) {
            std::cmp::Ordering::Greater => Action::ScaleUp,
            std::cmp::Ordering::Less => Action::ScaleDown,
            std::cmp::Ordering::Equal => Action::Hold,
        };
        assert_eq!(out.action, expected_action, "{}", row.name);
    }
}

#[test]
fn the_message_and_status_say_why() {
    let out = decide(
        &input(&spec(), 2, fleet(replicas(2, 0.5, 7.0))),
        &History::default(),
        s(0),
    );
    assert_eq!(
        out.message,
        "capacity waiting 14 over 2 replicas > target 4 per replica; scaling 2 → 4"
    );
    let d = out.to_status_decision("2026-01-01T00:00:00Z");
    assert_eq!(d.action, Action::ScaleUp);
    assert_eq!(d.reason, "CapacityWaiting");
    assert_eq!(d.signals.capacity_waiting, Some(14.0));
    assert_eq!(d.signals.kv_cache_usage, Some(0.5));
    let recs: Vec<(&str, i32)> = d
        .recommendations
        .iter()
        .map(|r| (r.signal.as_str(), r.replicas))
        .collect();
    // KV 0.5 / 0.85 → ceil(0.59 × 2) = 2; rejections 0 → 0.
    assert_eq!(
        recs,
        [
            ("capacityWaiting", 4),
            ("kvCacheUsage", 2),
            ("admissionRejectionsPerSecond", 0)
        ]
    );
    let active = out.condition(ConditionKind::ScalingActive).unwrap();
    assert!(active.status);
    let limited = out.condition(ConditionKind::ScalingLimited).unwrap();
    assert!(!limited.status);
}

#[test]
fn other_signals_scale_up_with_their_own_reason() {
    // Rejections 0.2/s per replica against 0.05: ratio 4 → 8, rate-limited to 2 + 4 = 6.
    let mut reps = replicas(2, 0.3, 0.0);
    for r in &mut reps {
        r.rejections_per_second = Some(0.2);
    }
    let mut sp = spec();
    sp.autoscaling.max_replicas = 10;
    let out = decide(&input(&sp, 2, fleet(reps)), &History::default(), s(0));
    assert_eq!(
        (out.action, out.desired_replicas, out.reason),
        (Action::ScaleUp, 6, Reason::AdmissionRejections)
    );
    assert_eq!(
        out.condition(ConditionKind::ScalingLimited).unwrap().reason,
        "ScaleUpLimit"
    );

    // TTFT p99 3 s against 1 s over 2 replicas → 6.
    sp.autoscaling.targets.ttft_p99_seconds = Some(1.0);
    let mut f = fleet(replicas(2, 0.3, 0.0));
    f.ttft_p99_seconds = Some(3.0);
    let out = decide(&input(&sp, 2, f), &History::default(), s(0));
    assert_eq!(
        (out.action, out.desired_replicas, out.reason),
        (Action::ScaleUp, 6, Reason::TtftHigh)
    );
    assert!(
        out.message.starts_with("TTFT p99 3s > target 1s"),
        "{}",
        out.message
    );
}

#[test]
fn deferred_waiting_holds() {
    // Deferred-only load: nothing waits for capacity, 20 requests wait on tenant caps,
    // which also pushes 429s and TTFT over target. More replicas would not help.
    let mut sp = spec();
    sp.autoscaling.targets.ttft_p99_seconds = Some(1.0);
    let mut reps = replicas(2, 0.3, 0.0);
    for r in &mut reps {
        r.deferred_waiting = 10.0;
        r.rejections_per_second = Some(0.5);
    }
    let mut f = fleet(reps);
    f.ttft_p99_seconds = Some(5.0);
    let out = decide(&input(&sp, 2, f.clone()), &History::default(), s(0));
    assert_eq!(out.action, Action::Hold, "{}", out.message);
    assert_eq!(out.reason, Reason::DeferredWaiting);
    assert_eq!(out.desired_replicas, 2);
    assert!(out.message.contains("20 deferred"), "{}", out.message);
    assert!(out.recommendations().iter().all(|r| r.replicas == 2));

    // The same signals without the deferred requests would scale up.
    let mut undeferred = f.clone();
    undeferred.deferred_waiting = Some(0.0);
    let out = decide(&input(&sp, 2, undeferred), &History::default(), s(0));
    assert_eq!(out.action, Action::ScaleUp);

    // Deferred dominating but capacity waiting above target still scales: 12 over 2 = 6
    // per replica (> 4), 30 deferred ≥ 12.
    for (r, w) in f.replicas.iter_mut().zip([6.0, 6.0]) {
        r.capacity_waiting = w;
        r.deferred_waiting = 15.0;
    }
    let f = fleet(f.replicas);
    let out = decide(&input(&sp, 2, f), &History::default(), s(0));
    assert_eq!(
        (out.action, out.desired_replicas, out.reason),
        (Action::ScaleUp, 3, Reason::CapacityWaiting)
    );
}

#[test]
fn deferred_waiting_blocks_scale_down() {
    let mut sp = spec();
    sp.autoscaling
        .behavior
        .scale_down
        .stabilization_window_seconds = Some(0);
    let mut reps = replicas(4, 0.1, 0.0);
    for r in &mut reps {
        r.deferred_waiting = 3.0;
    }
    let out = decide(&input(&sp, 4, fleet(reps)), &History::default(), s(0));
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::DeferredWaiting)
    );
    // Without deferred requests the same fleet scales down.
    let out = decide(
        &input(&sp, 4, fleet(replicas(4, 0.1, 0.0))),
        &History::default(),
        s(0),
    );
    assert_eq!(out.action, Action::ScaleDown);
}

#[test]
fn stale_or_garbage_metrics_hold_with_metrics_unavailable() {
    let sp = spec();
    let metrics_available = |out: &ballast_operator::decide::Outcome| {
        let c = out.condition(ConditionKind::MetricsAvailable).unwrap();
        (c.status, c.reason)
    };

    // 1 of 4 ready replicas reported (minReportingFraction 0.5), and it is overloaded.
    let mut f = fleet(vec![replica("r0", 0.99, 50.0)]);
    f.ready = 4;
    let out = decide(&input(&sp, 4, f), &History::default(), s(0));
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::MetricsStale)
    );
    assert_eq!(metrics_available(&out), (false, "MetricsStale"));
    assert!(out.message.contains("only 1 of 4"), "{}", out.message);
    assert_eq!(
        out.history.recommendations.len(),
        1,
        "only the initial seed is recorded, no recommendation"
    );

    // Nobody reported.
    let mut f = fleet(vec![]);
    f.ready = 3;
    let out = decide(&input(&sp, 3, f), &History::default(), s(0));
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::MetricsUnavailable)
    );
    assert_eq!(metrics_available(&out), (false, "MetricsUnavailable"));

    // Everyone reported garbage: NaN KV, negative waiting, infinite rejections.
    let mut reps = replicas(3, f64::NAN, -5.0);
    for r in &mut reps {
        r.rejections_per_second = Some(f64::INFINITY);
    }
    let out = decide(&input(&sp, 3, fleet(reps)), &History::default(), s(0));
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::MetricsUnavailable)
    );
    assert_eq!(metrics_available(&out), (false, "MetricsUnavailable"));
    let st = out.to_status_decision("t").signals;
    assert_eq!(
        (
            st.capacity_waiting,
            st.kv_cache_usage,
            st.admission_rejections_per_second
        ),
        (None, None, None),
        "garbage is shown as null, never as 0"
    );

    // Two of three ready replicas reporting is enough (≥ 0.5).
    let mut f = fleet(replicas(2, 0.5, 7.0));
    f.ready = 3;
    let out = decide(&input(&sp, 3, f), &History::default(), s(0));
    assert_eq!(metrics_available(&out), (true, "MetricsReported"));
}

#[test]
fn a_missing_signal_allows_scale_up_but_blocks_scale_down() {
    let mut sp = spec();
    sp.autoscaling
        .behavior
        .scale_down
        .stabilization_window_seconds = Some(0);

    // KV is NaN on one replica (so the fleet mean is garbage); capacity is high.
    let mut reps = replicas(2, 0.5, 7.0);
    reps[1].kv_usage = f64::NAN;
    let out = decide(&input(&sp, 2, fleet(reps)), &History::default(), s(0));
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleUp, 4));
    let c = out.condition(ConditionKind::MetricsAvailable).unwrap();
    assert_eq!((c.status, c.reason), (true, "SomeSignalsMissing"));

    // Rejection rates not known yet (first scrape of each replica); all else is low.
    let mut reps = replicas(4, 0.1, 0.0);
    for r in &mut reps {
        r.rejections_per_second = None;
    }
    let out = decide(
        &input(&sp, 4, fleet(reps.clone())),
        &History::default(),
        s(0),
    );
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::SignalMissing)
    );
    assert!(
        out.message
            .starts_with("admissionRejectionsPerSecond missing"),
        "{}",
        out.message
    );
    assert!(
        out.history.recommendations.iter().all(|r| r.replicas == 4),
        "no scale-down recommendation is remembered"
    );

    // Replicas that do not export the signal at all: its target is ignored, scale-down
    // proceeds, and status says why.
    let mut f = fleet(reps);
    f.exported = Some([Family::Waiting, Family::KvUsage, Family::Ttft].into());
    let out = decide(&input(&sp, 4, f), &History::default(), s(0));
    assert_eq!(out.action, Action::ScaleDown, "{}", out.message);
    let report = out
        .reports
        .iter()
        .find(|r| r.signal == SignalName::AdmissionRejectionsPerSecond)
        .unwrap();
    assert_eq!(report.state, SignalState::Unsupported);
    assert_eq!(
        report.summary,
        "admissionRejectionsPerSecond not exported by these replicas (target ignored)"
    );
    let c = out.condition(ConditionKind::MetricsAvailable).unwrap();
    assert_eq!(c.reason, "MetricsReported");
    assert!(
        c.message.ends_with(
            "; admissionRejectionsPerSecond not exported by these replicas, target ignored"
        ),
        "{}",
        c.message
    );
}

#[test]
fn the_rejection_rate_is_averaged_and_multiplied_over_the_same_replicas() {
    // Rejections only, so the recommendation is that signal's alone.
    let mut sp = capacity_only(4.0, 1, 20);
    let t = &mut sp.autoscaling.targets;
    t.capacity_waiting_per_replica = None;
    t.admission_rejections_per_second = Some(0.05);
    sp.autoscaling
        .behavior
        .scale_down
        .stabilization_window_seconds = Some(0);
    let rejection_recommendation = |out: &ballast_operator::decide::Outcome| {
        out.reports
            .iter()
            .find(|r| r.signal == SignalName::AdmissionRejectionsPerSecond)
            .and_then(|r| r.replicas)
    };

    // Three replicas report; r2 just joined and has one sample of its counter, no rate.
    // The fleet value is the mean over r0 and r1: 0.2/s, ratio 4. HPA multiplies by the
    // pods that have the metric: ceil(4 × 2) = 8, not ceil(4 × 3) = 12.
    let mut reps = replicas(3, 0.1, 0.0);
    reps[0].rejections_per_second = Some(0.2);
    reps[1].rejections_per_second = Some(0.2);
    reps[2].rejections_per_second = None;
    let f = fleet(reps.clone());
    assert_eq!(f.rejections_per_second_per_replica, Some(0.2));
    let out = decide(&input(&sp, 3, f), &History::default(), s(0));
    assert_eq!(rejection_recommendation(&out), Some(8), "{}", out.message);
    assert_eq!(
        (out.action, out.desired_replicas),
        (Action::ScaleUp, 7),
        "the larger of +4 pods and +100 % per 15 s from 3"
    );

    // Going down, the replica without a rate is one of HPA's missing pods, assumed at the
    // target: (2 × 0.2 + 1) / 3 of the target over 3 → ceil(1.4) = 2, where the plain
    // rule over the same two would say 1 and over all three ceil(0.6) = 1.
    reps[0].rejections_per_second = Some(0.01);
    reps[1].rejections_per_second = Some(0.01);
    let out = decide(&input(&sp, 3, fleet(reps)), &History::default(), s(0));
    assert_eq!(rejection_recommendation(&out), Some(2), "{}", out.message);
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleDown, 2));
}

#[test]
fn a_starting_replica_prevents_a_second_scale_up() {
    let mut sim = Sim::new(spec(), 2);
    sim.spec.autoscaling.max_replicas = 10;
    // Period 1: 14 waiting over 2 → 4.
    let out = sim.step(fleet(replicas(2, 0.5, 7.0)), s(15));
    assert_eq!(out.desired_replicas, 4);

    // While the 2 new replicas load the model, the queue on the 2 ready ones grows to 17.
    // Alone that is ceil(17 / 4) = 5; counting the starting ones (at no load) it is
    // 17 / 4 / 4 = 1.06, within tolerance: no second scale-up.
    let warming = || {
        let mut f = fleet(replicas(2, 0.5, 8.5));
        f.starting = 2;
        f
    };
    for _ in 0..4 {
        let out = sim.step(warming(), s(15));
        assert_eq!(out.action, Action::Hold, "{}", out.message);
        assert_eq!(out.reason, Reason::ReplicasStarting, "{}", out.message);
        assert_eq!(sim.current, 4);
    }

    // The rule is what holds: the same ready replicas without starting ones scale up.
    let mut ready_only = warming();
    ready_only.starting = 0;
    let out = decide(&input(&sim.spec, 4, ready_only), &sim.history, sim.now);
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleUp, 5));
}

#[test]
fn oscillating_load_does_not_flap() {
    // Inside tolerance: ±8 % around the target for 40 periods → always the same size.
    let mut sim = Sim::new(spec(), 3);
    for i in 0..40 {
        let w = if i % 2 == 0 { 4.32 } else { 3.68 };
        let out = sim.step(fleet(replicas(3, 0.5, w)), s(15));
        assert_eq!(out.action, Action::Hold, "period {i}: {}", out.message);
        assert_eq!(out.reason, Reason::WithinTolerance);
    }

    // Outside tolerance: total waiting alternates 12 (ratio 1.5 at 2 replicas) and 4
    // every 15 s, for 5 minutes. One scale-up, then the 300 s scale-down window holds.
    let mut sim = Sim::new(spec(), 2);
    sim.spec.autoscaling.max_replicas = 10;
    let mut sizes = vec![sim.current];
    for i in 0..20 {
        let total = if i % 2 == 0 { 12.0 } else { 4.0 };
        let n = sim.current as usize;
        let out = sim.step(fleet(replicas(n, 0.2, total / n as f64)), s(15));
        assert_ne!(out.action, Action::ScaleDown, "period {i}: {}", out.message);
        sizes.push(sim.current);
    }
    let changes = sizes.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(changes, 1, "{sizes:?}");
    assert_eq!(sim.current, 3);

    // Load stays low for longer than the window: one scale-down, to the highest
    // recommendation left in the window.
    let mut downs = 0;
    for _ in 0..30 {
        let n = sim.current as usize;
        let out = sim.step(fleet(replicas(n, 0.2, 4.0 / n as f64)), s(15));
        if out.action == Action::ScaleDown {
            downs += 1;
            assert_eq!(out.reason, Reason::AllSignalsBelowTarget);
        }
    }
    assert_eq!((downs, sim.current), (1, 1));
}

#[test]
fn a_restarted_operator_waits_a_full_window_before_scaling_down() {
    let mut sim = Sim::new(spec(), 4);
    let idle = || fleet(replicas(4, 0.1, 0.0));
    let first = sim.step(idle(), s(15));
    assert_eq!(
        (first.action, first.reason),
        (Action::Hold, Reason::Stabilizing)
    );
    assert_eq!(first.history.recommendations[0].replicas, 4, "seeded");
    // 300 s after the seed it is out of the window.
    let mut t = 15;
    while sim.current == 4 {
        sim.step(idle(), s(15));
        t += 15;
        assert!(t <= 315, "still 4 after {t} s");
    }
    assert_eq!(t, 315);
    assert_eq!(sim.current, 1);
}

#[test]
fn bounds_and_disabled_autoscaling() {
    // Below minReplicas: scale up without looking at metrics.
    let mut sp = spec();
    sp.autoscaling.min_replicas = 2;
    let out = decide(&input(&sp, 0, fleet(vec![])), &History::default(), s(0));
    assert_eq!(
        (out.action, out.desired_replicas, out.reason),
        (Action::ScaleUp, 2, Reason::BelowMinReplicas)
    );
    // Above maxReplicas.
    let out = decide(
        &input(&sp, 9, fleet(replicas(9, 0.9, 9.0))),
        &History::default(),
        s(0),
    );
    assert_eq!(
        (out.action, out.desired_replicas, out.reason),
        (Action::ScaleDown, 4, Reason::AboveMaxReplicas)
    );

    // Disabled: follow spec.replicas whatever the load, and say so.
    sp.autoscaling.enabled = false;
    sp.replicas = Some(7);
    let out = decide(
        &input(&sp, 3, fleet(replicas(3, 0.1, 0.0))),
        &History::default(),
        s(0),
    );
    assert_eq!(
        (out.action, out.desired_replicas, out.reason),
        (Action::ScaleUp, 7, Reason::FollowingSpecReplicas)
    );
    assert!(out.history.scale_event.is_none());
    let c = out.condition(ConditionKind::ScalingActive).unwrap();
    assert_eq!((c.status, c.reason), (false, "AutoscalingDisabled"));
    sp.replicas = None;
    let out = decide(
        &input(&sp, 3, fleet(replicas(3, 0.9, 50.0))),
        &History::default(),
        s(0),
    );
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::AutoscalingDisabled)
    );
}

#[test]
fn an_idle_fleet_without_ttft_samples_may_scale_down_but_garbage_ttft_may_not() {
    let mut sp = spec();
    sp.autoscaling.targets.ttft_p99_seconds = Some(1.0);
    sp.autoscaling
        .behavior
        .scale_down
        .stabilization_window_seconds = Some(0);
    let mut reps = replicas(4, 0.0, 0.0);
    for r in &mut reps {
        r.running = 0.0;
    }
    // No request in the period, so no TTFT observation: nothing to wait for.
    let out = decide(
        &input(&sp, 4, fleet(reps.clone())),
        &History::default(),
        s(0),
    );
    assert_eq!(
        (out.action, out.desired_replicas),
        (Action::ScaleDown, 1),
        "{}",
        out.message
    );
    // A NaN p99 is garbage, not idleness.
    let mut f = fleet(reps.clone());
    f.ttft_p99_seconds = Some(f64::NAN);
    let out = decide(&input(&sp, 4, f), &History::default(), s(0));
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::SignalMissing)
    );
    // Requests running but no TTFT sample: missing too.
    reps[0].running = 3.0;
    let out = decide(&input(&sp, 4, fleet(reps)), &History::default(), s(0));
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::SignalMissing)
    );
}

/// A spec read from YAML with `behavior` as given, scaling on capacity waiting only.
fn spec_with_behavior(behavior: &str) -> ballast_crds::InferenceServiceSpec {
    let text = format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: m}}\n\
         spec:\n  model: {{source: synthetic:tiny}}\n  rebalancing: {{enabled: false}}\n  \
         autoscaling:\n    minReplicas: 1\n    maxReplicas: 20\n    \
         targets: {{capacityWaitingPerReplica: 4, kvCacheUsage: null, admissionRejectionsPerSecond: null}}\n    \
         behavior: {behavior}\n"
    );
    let docs = ballast_crds::parse_yaml(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    docs[0].spec.clone()
}

#[test]
fn scale_down_policies_alone_keep_the_300s_window() {
    let sp =
        spec_with_behavior("{scaleDown: {policies: [{type: Pods, value: 1, periodSeconds: 15}]}}");
    let mut sim = Sim::new(sp, 4);
    let start = sim.now;
    // Idle from the start: every period recommends 1.
    let first_down = loop {
        let at = sim.now;
        let out = sim.step(fleet(replicas(sim.current as usize, 0.1, 0.0)), s(15));
        if out.action == Action::ScaleDown {
            break (at - start, out.desired_replicas);
        }
        assert_eq!(out.reason, Reason::Stabilizing, "{}", out.message);
        assert!(at - start < s(400), "never scaled down");
    };
    // The seed recommendation (4) at the start leaves the window after 300 s; then the
    // user's policy removes one replica per 15 s.
    assert_eq!(first_down, (s(300), 3));
}

#[test]
fn a_scale_up_window_alone_keeps_the_rate_limits() {
    let sp = spec_with_behavior("{scaleUp: {stabilizationWindowSeconds: 0}}");
    // 100 waiting per replica over 2: ceil(25 × 2) = 50, capped at maxReplicas 20, but the
    // default policies allow the larger of +4 pods and +100 % per 15 s: 6.
    let out = decide(
        &input(&sp, 2, fleet(replicas(2, 0.1, 100.0))),
        &History::default(),
        s(0),
    );
    assert_eq!(
        (out.action, out.desired_replicas),
        (Action::ScaleUp, 6),
        "{}",
        out.message
    );
    let limited = out.condition(ConditionKind::ScalingLimited).unwrap();
    assert_eq!((limited.status, limited.reason), (true, "ScaleUpLimit"));
}

/// At zero replicas (minReplicas 0), requests the gateway holds scale the service up at
/// once, by what they need at `capacityWaitingPerReplica`, within maxReplicas; nothing
/// held, or no gateway, holds at zero.
#[test]
fn held_requests_bring_a_service_back_from_zero() {
    let sp = capacity_only(4.0, 0, 3);
    let at_zero = |held: Option<f64>| {
        let mut f = fleet(Vec::new());
        f.add_held(held.map(|requests| ballast_operator::signals::Held {
            requests,
            oldest_seconds: 1.0,
            pickers: 1,
            ..Default::default()
        }));
        decide(&input(&sp, 0, f), &History::default(), s(0))
    };
    let one = at_zero(Some(1.0));
    assert_eq!(
        (one.desired_replicas, one.reason),
        (1, Reason::HeldRequests)
    );
    assert_eq!(one.action, Action::ScaleUp);
    assert!(one.message.contains("holds 1 requests"), "{}", one.message);
    // 9 held at 4 per replica: 3.
    assert_eq!(at_zero(Some(9.0)).desired_replicas, 3);
    // 40 held: capped at maxReplicas 3.
    assert_eq!(at_zero(Some(40.0)).desired_replicas, 3);
    for quiet in [Some(0.0), None] {
        let o = at_zero(quiet);
        assert_eq!(
            (o.desired_replicas, o.reason),
            (0, Reason::NoReplicas),
            "{quiet:?}"
        );
    }
}

/// `minReplicas: 0`: an idle fleet goes to zero only after `scaleToZeroAfterSeconds`
/// without any request (reason ScaledToZero); before that it stays at one, and a request
/// in between starts the count again.
#[test]
fn an_idle_fleet_scales_to_zero_after_scale_to_zero_after_seconds() {
    let mut sp = capacity_only(4.0, 0, 3);
    sp.autoscaling.scale_to_zero_after_seconds = 60;
    sp.gateway.enabled = true;
    // A picker reports: nothing held.
    let reported = |mut f: ballast_operator::signals::FleetSignals| {
        f.held_requests = Some(0.0);
        f
    };
    let idle = || {
        reported(fleet(vec![ballast_operator::signals::ReplicaSignals {
            running: 0.0,
            ..replica("r0", 0.0, 0.0)
        }]))
    };
    let mut history = History::default();
    let at = |t: u64, f: ballast_operator::signals::FleetSignals, history: &mut History| {
        let o = decide(&input(&sp, 1, f), history, s(t));
        history.record(&o.history, o.desired_replicas != 1);
        o
    };
    let first = at(0, idle(), &mut history);
    assert_eq!(first.desired_replicas, 1, "{}", first.message);
    let early = at(30, idle(), &mut history);
    assert_eq!(early.desired_replicas, 1, "{}", early.message);
    // A request at 40 s: busy again.
    let busy = at(40, reported(fleet(replicas(1, 0.1, 1.0))), &mut history);
    assert_eq!(busy.desired_replicas, 1);
    let not_yet = at(90, idle(), &mut history);
    assert_eq!(
        not_yet.desired_replicas, 1,
        "only 50 s idle: {}",
        not_yet.message
    );
    let zero = at(101, idle(), &mut history);
    assert_eq!(
        (zero.desired_replicas, zero.reason, zero.action),
        (0, Reason::ScaledToZero, Action::ScaleDown),
        "{}",
        zero.message
    );
    assert!(
        zero.message.contains("no request for 61s"),
        "{}",
        zero.message
    );
    // Without a picker's report (no InferencePool CRD, no ready picker) nothing would
    // bring a replica back: the same idle fleet stays at one, saying why.
    let mut unseen = idle();
    unseen.held_requests = None;
    let o = decide(&input(&sp, 1, unseen), &history, s(101));
    assert_eq!(o.desired_replicas, 1, "{}", o.message);
    assert_ne!(o.reason, Reason::ScaledToZero, "{}", o.message);
    // With minReplicas 1 an idle fleet never goes to zero.
    let one = capacity_only(4.0, 1, 3);
    let o = decide(&input(&one, 1, idle()), &history, s(500));
    assert_eq!(o.desired_replicas, 1);
}
