//! Properties of `decide` over random specs, signals and histories: the size stays in
//! bounds, the action agrees with the size, garbage never scales, rebalancing keeps
//! `minAccepting`.

use crate::decide_support as support;

use std::time::Duration;

use ballast_crds::{Action, InferenceServiceSpec, PolicyType, ScalingPolicy, SelectPolicy};
use ballast_operator::decide::{
    DecideInput, History, Outcome, ScaleEvent, TimedRecommendation, decide,
};
use ballast_operator::signals::{FleetSignals, ReplicaSignals};
use proptest::prelude::*;
use support::*;

/// A number a replica might report, garbage included.
fn reading(max: f64) -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => 0.0..max,
        1 => Just(f64::NAN),
        1 => Just(-1.0),
        1 => Just(f64::INFINITY),
    ]
}

fn replica_strategy() -> impl Strategy<Value = (f64, f64, f64, Option<f64>, Vec<f64>)> {
    (
        reading(1.0),
        reading(30.0),
        reading(30.0),
        proptest::option::of(reading(1.0)),
        prop_oneof![Just(vec![]), proptest::collection::vec(0.0..1.0f64, 2..4),],
    )
}

/// Replicas (with names r0…) plus not-reporting ready ones and starting ones.
fn fleet_strategy() -> impl Strategy<Value = FleetSignals> {
    (
        proptest::collection::vec(replica_strategy(), 0..7),
        0usize..3,
        0usize..3,
        proptest::option::of(reading(5.0)),
    )
        .prop_map(|(reps, missing, starting, ttft)| {
            let reps: Vec<ReplicaSignals> = reps
                .into_iter()
                .enumerate()
                .map(|(i, (kv, waiting, deferred, rej, shares))| ReplicaSignals {
                    name: format!("r{i}"),
                    running: 1.0,
                    capacity_waiting: waiting,
                    deferred_waiting: deferred,
                    kv_usage: kv,
                    rejections_per_second: rej,
                    dp_token_share: shares,
                    ..ReplicaSignals::default()
                })
                .collect();
            let mut f = fleet(reps);
            f.ready += missing;
            f.starting = starting;
            f.ttft_p99_seconds = ttft;
            f
        })
}

fn rules_strategy(window_max: i32) -> impl Strategy<Value = ballast_crds::ScalingRules> {
    (
        0..=window_max,
        prop_oneof![
            Just(SelectPolicy::Max),
            Just(SelectPolicy::Min),
            Just(SelectPolicy::Disabled)
        ],
        proptest::collection::vec(
            (
                prop_oneof![Just(PolicyType::Pods), Just(PolicyType::Percent)],
                1..200i32,
                1..120i32,
            ),
            0..3,
        ),
    )
        .prop_map(|(w, select, ps)| ballast_crds::ScalingRules {
            stabilization_window_seconds: Some(w),
            select_policy: Some(select),
            policies: ps
                .into_iter()
                .map(|(type_, value, period_seconds)| ScalingPolicy {
                    type_,
                    value,
                    period_seconds,
                })
                .collect(),
        })
}

fn spec_strategy() -> impl Strategy<Value = InferenceServiceSpec> {
    (
        0..4i32,
        1..12i32,
        0.0..0.5f64,
        rules_strategy(120),
        rules_strategy(600),
        proptest::option::of(0.1..3.0f64),
        1..4i32,
    )
        .prop_map(|(min, span, tol, up, down, ttft, min_accepting)| {
            let mut sp = spec();
            let a = &mut sp.autoscaling;
            a.min_replicas = min;
            a.max_replicas = (min + span).max(1);
            a.tolerance = tol;
            a.behavior.scale_up = up;
            a.behavior.scale_down = down;
            a.targets.ttft_p99_seconds = ttft;
            sp.rebalancing.min_accepting = min_accepting;
            sp
        })
}

const NOW: u64 = 1000;

fn history_strategy() -> impl Strategy<Value = History> {
    (
        proptest::collection::vec((0..900u64, 0..20i32), 0..20),
        proptest::collection::vec((0..900u64, 0..20i32, 0..20i32), 0..6),
    )
        .prop_map(|(recs, events)| History {
            recommendations: recs
                .into_iter()
                .map(|(age, replicas)| TimedRecommendation {
                    at: Duration::from_secs(NOW - age),
                    replicas,
                })
                .collect(),
            scale_events: events
                .into_iter()
                .map(|(age, from, to)| ScaleEvent {
                    at: Duration::from_secs(NOW - age),
                    from,
                    to,
                })
                .collect(),
            busy_at: None,
        })
}

fn case() -> impl Strategy<Value = (DecideInput, History)> {
    (
        spec_strategy(),
        fleet_strategy(),
        0..15i32,
        history_strategy(),
        proptest::collection::vec(any::<bool>(), 7),
    )
        .prop_map(|(sp, fleet, current, history, out_mask)| {
            let mut i = input(&sp, current, fleet);
            i.out_of_rotation = i
                .fleet
                .replicas
                .iter()
                .zip(out_mask)
                .filter(|(_, out)| *out)
                .map(|(r, _)| r.name.clone())
                .collect();
            (i, history)
        })
}

fn run(i: &DecideInput, h: &History) -> Outcome {
    decide(i, h, Duration::from_secs(NOW))
}

/// Brings the current size into [min, max] (outside it the size is corrected whatever
/// the signals say, as in HPA).
fn into_range(i: &mut DecideInput) {
    let a = &i.autoscaling;
    i.current_replicas = i.current_replicas.clamp(a.min_replicas, a.max_replicas);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn size_in_bounds_and_action_agrees((i, h) in case()) {
        let out = run(&i, &h);
        let a = &i.autoscaling;
        prop_assert!(
            (a.min_replicas..=a.max_replicas).contains(&out.desired_replicas),
            "{} not in [{}, {}]: {}", out.desired_replicas, a.min_replicas, a.max_replicas, out.message
        );
        let current = i.current_replicas;
        match out.action {
            Action::ScaleUp => prop_assert!(out.desired_replicas > current),
            Action::ScaleDown => prop_assert!(out.desired_replicas < current),
            Action::Rebalance => {
                prop_assert_eq!(out.desired_replicas, current);
                prop_assert!(!out.rebalance.is_empty());
            }
            Action::Hold => {
                prop_assert_eq!(out.desired_replicas, current);
                prop_assert!(out.rebalance.is_empty());
            }
        }
        prop_assert!(!out.message.is_empty() && !out.message.contains('\n'));
        // Pure: the same arguments give the same outcome.
        prop_assert_eq!(&run(&i, &h), &out);
    }

    #[test]
    fn garbage_never_scales((mut i, h) in case()) {
        into_range(&mut i);
        let f = &mut i.fleet;
        f.capacity_waiting = Some(f64::NAN);
        f.deferred_waiting = Some(f64::NAN);
        f.kv_usage = Some(f64::INFINITY);
        f.rejections_per_second_per_replica = Some(-1.0);
        f.ttft_p99_seconds = Some(f64::NAN);
        let out = run(&i, &h);
        prop_assert!(
            !matches!(out.action, Action::ScaleUp | Action::ScaleDown),
            "{:?}: {}", out.action, out.message
        );
    }

    #[test]
    fn one_garbage_signal_never_scales_down((mut i, h) in case(), which in 0..3usize) {
        into_range(&mut i);
        let f = &mut i.fleet;
        match which {
            0 => f.capacity_waiting = Some(f64::NAN),
            1 => f.kv_usage = Some(f64::NAN),
            _ => f.rejections_per_second_per_replica = Some(f64::NAN),
        }
        let out = run(&i, &h);
        prop_assert!(out.action != Action::ScaleDown, "{}", out.message);
    }

    #[test]
    fn rebalancing_keeps_min_accepting_and_ignores_garbage((i, h) in case()) {
        let out = run(&i, &h);
        let plan = &out.rebalance;
        let ready = i.fleet.ready;
        let out_after = i.out_of_rotation.len() - plan.restore.len() + plan.take_out.len();
        if !plan.take_out.is_empty() {
            prop_assert!(
                ready - out_after >= i.rebalancing.min_accepting as usize,
                "{} ready, {} out after {:?}", ready, out_after, plan
            );
        }
        for name in &plan.take_out {
            prop_assert!(!i.out_of_rotation.contains(name));
            let r = i.fleet.replicas.iter().find(|r| &r.name == name).unwrap();
            let kv_hot = r.kv_usage.is_finite() && r.kv_usage <= 1.0
                && r.kv_usage > i.rebalancing.hot_kv_cache_usage;
            let waiting_hot = r.capacity_waiting.is_finite()
                && r.capacity_waiting > i.rebalancing.hot_capacity_waiting;
            prop_assert!(kv_hot || waiting_hot, "{:?}", r);
        }
        for name in &plan.restore {
            prop_assert!(i.out_of_rotation.contains(name));
        }
        for w in &plan.dp_weights {
            let sum: f64 = w.weights.iter().sum();
            prop_assert!((sum - 1.0).abs() < 1e-9 && w.weights.iter().all(|x| *x > 0.0));
        }
    }
}
