//! HPA's documented behaviour, reproduced: each test cites the example of the Kubernetes
//! page "Horizontal Pod Autoscaling"
//! (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/) it follows.
//!
//! HPA's "metric value" is played by capacity waiting per replica (the only target set),
//! in milli-units where the docs use them; new replicas report at once unless a test
//! says otherwise.

use crate::decide_support as support;

use ballast_crds::{Action, PolicyType, ScalingPolicy, SelectPolicy};
use ballast_operator::decide::{
    ConditionKind, History, Outcome, Reason, TimedRecommendation, decide,
};
use ballast_operator::signals::FleetSignals;
use support::*;

/// `n` ready replicas whose waiting adds up to `total`.
fn load(n: i32, total: f64) -> FleetSignals {
    fleet(replicas(n as usize, 0.5, total / f64::from(n)))
}

fn policy(type_: PolicyType, value: i32, period_seconds: i32) -> ScalingPolicy {
    ScalingPolicy {
        type_,
        value,
        period_seconds,
    }
}

#[test]
fn algorithm_details_200m_against_100m_doubles_and_50m_halves() {
    // "if the current metric value is 200m, and the desired value is 100m, the number of
    // replicas will be doubled ... If the current value is instead 50m, you'll halve".
    let mut sp = capacity_only(100.0, 1, 20);
    sp.autoscaling
        .behavior
        .scale_down
        .stabilization_window_seconds = Some(0);
    let out = decide(
        &input(&sp, 4, load(4, 4.0 * 200.0)),
        &History::default(),
        s(0),
    );
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleUp, 8));
    let out = decide(
        &input(&sp, 4, load(4, 4.0 * 50.0)),
        &History::default(),
        s(0),
    );
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleDown, 2));
    // "The control plane skips any scaling action if the ratio is sufficiently close to
    // 1.0 (within a globally-configurable tolerance, 0.1 by default)."
    for per_replica in [91.0, 100.0, 109.0] {
        let out = decide(
            &input(&sp, 4, load(4, 4.0 * per_replica)),
            &History::default(),
            s(0),
        );
        assert_eq!(
            (out.action, out.reason),
            (Action::Hold, Reason::WithinTolerance)
        );
    }
}

#[test]
fn algorithm_details_missing_metrics_assumed_at_target_down_and_zero_up() {
    // "If there were any missing metrics, the control plane recomputes the average more
    // conservatively, assuming those pods were consuming 100% of the desired value in
    // case of a scale down, and 0% in case of a scale up."
    // Ballast keeps this above minReportingFraction (below it, it holds).
    let mut sp = capacity_only(100.0, 1, 20);
    sp.autoscaling
        .behavior
        .scale_down
        .stabilization_window_seconds = Some(0);
    // 3 of 4 ready report 50m: (3 × 0.5 + 1) / 4 = 0.625 → ceil(2.5) = 3, not 2.
    let mut f = load(3, 3.0 * 50.0);
    f.ready = 4;
    let out = decide(&input(&sp, 4, f), &History::default(), s(0));
    assert_eq!(out.desired_replicas, 3, "{}", out.message);
    // 3 of 4 report 200m: 3 × 2 / 4 = 1.5 → ceil(6) = 6, not 8.
    let mut f = load(3, 3.0 * 200.0);
    f.ready = 4;
    let out = decide(&input(&sp, 4, f), &History::default(), s(0));
    assert_eq!(out.desired_replicas, 6, "{}", out.message);
}

#[test]
fn multiple_metrics_largest_wins_and_a_failed_metric_blocks_only_scale_down() {
    // "this calculation is done for each metric, and then the largest of the desired
    // replica counts is chosen. If any of these metrics cannot be converted into a desired
    // replica count ... and a scale down is suggested by the metrics which can be fetched,
    // scaling is skipped. This means that the HPA is still capable of scaling up".
    let mut sp = spec();
    sp.autoscaling.max_replicas = 20;
    sp.autoscaling
        .behavior
        .scale_down
        .stabilization_window_seconds = Some(0);
    // Capacity asks for ceil(24 / 4) = 6, KV 0.95 / 0.85 × 4 → 5: 6 wins.
    let out = decide(
        &input(&sp, 4, fleet(replicas(4, 0.95, 6.0))),
        &History::default(),
        s(0),
    );
    assert_eq!(
        (out.desired_replicas, out.reason),
        (6, Reason::CapacityWaiting)
    );
    // KV cannot be computed: scale-up on capacity proceeds, scale-down does not.
    let mut f = fleet(replicas(4, 0.5, 6.0));
    f.kv_usage = None;
    let out = decide(&input(&sp, 4, f), &History::default(), s(0));
    assert_eq!(out.desired_replicas, 6);
    let mut f = fleet(replicas(4, 0.1, 0.0));
    f.kv_usage = None;
    let out = decide(&input(&sp, 4, f), &History::default(), s(0));
    assert_eq!(
        (out.desired_replicas, out.reason),
        (4, Reason::SignalMissing)
    );
}

#[test]
fn stabilization_window_uses_the_highest_recommendation_of_the_last_300s() {
    // "When the metrics indicate that the target should be scaled down the algorithm looks
    // into previously computed desired states, and uses the highest value from the
    // specified interval." (scaleDown.stabilizationWindowSeconds: 300)
    let sp = capacity_only(100.0, 1, 20);
    let history = History {
        recommendations: vec![
            TimedRecommendation {
                at: s(1000),
                replicas: 6,
            },
            TimedRecommendation {
                at: s(1100),
                replicas: 5,
            },
        ],
        scale_events: vec![],
        busy_at: None,
    };
    // Now 6 replicas, metrics ask for 2 (ratio 1/3).
    let at = |t: u64| decide(&input(&sp, 6, load(6, 200.0)), &history, s(t));
    let out = at(1250);
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::Stabilizing)
    );
    // The 6 left the window at 1300 (strictly older than now − 300 s): the 5 remains.
    let out = at(1300);
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleDown, 5));
    let out = at(1400);
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleDown, 2));
}

#[test]
fn example_change_downscale_stabilization_window_to_60s() {
    // "To provide a custom downscale stabilization window of 1 minute":
    // scaleDown.stabilizationWindowSeconds: 60.
    let mut sp = capacity_only(100.0, 1, 20);
    sp.autoscaling
        .behavior
        .scale_down
        .stabilization_window_seconds = Some(60);
    let mut sim = Sim::new(sp, 6);
    let low = || load(6, 200.0);
    let mut t = 0;
    while sim.current == 6 {
        sim.step(low(), s(15));
        t += 15;
        assert!(t <= 75);
    }
    // The seed (6, at the first period) leaves the window 60 s later: the 5th period.
    assert_eq!((t, sim.current), (75, 2));
}

#[test]
fn default_behavior_4_pods_or_100_percent_every_15s() {
    // "There are 2 policies where 4 pods or a 100% of the currently running replicas will
    // be added every 15 seconds till the HPA reaches its steady state."
    let sp = capacity_only(100.0, 1, 40);
    let mut sim = Sim::new(sp, 1);
    let huge = |n: i32| load(n, 100_000.0);
    let mut sizes = vec![];
    for _ in 0..5 {
        let out = sim.step(huge(sim.current), s(15));
        sizes.push(out.desired_replicas);
    }
    // 1 + 4 (4 pods > 100 %), 5 × 2 = 10 (100 % > 4 pods), 20, 40, then at max.
    assert_eq!(sizes, [5, 10, 20, 40, 40]);

    // Two periods inside the same 15 s: the second may not add more.
    let sp = capacity_only(100.0, 1, 40);
    let mut sim = Sim::new(sp, 1);
    sim.step(huge(1), s(5));
    let out = sim.step(huge(5), s(5));
    assert_eq!(
        (out.action, out.desired_replicas, out.reason),
        (Action::Hold, 5, Reason::ScaleRateLimited)
    );
    let c = out.condition(ConditionKind::ScalingLimited).unwrap();
    assert_eq!((c.status, c.reason), (true, "ScaleUpLimit"));
}

/// Scales `from` towards `to` with 15 s periods until it stops moving; the sizes at each
/// change.
fn scale_down_path(sp: ballast_crds::InferenceServiceSpec, from: i32, to: f64) -> Vec<i32> {
    let mut sim = Sim::new(sp, from);
    let mut path = vec![from];
    for _ in 0..200 {
        // Total load that asks for `to` replicas whatever the size.
        let out: Outcome = sim.step(load(sim.current, to * 100.0), s(15));
        if out.desired_replicas != *path.last().unwrap() {
            path.push(out.desired_replicas);
        }
    }
    path
}

#[test]
fn scaling_policies_example_4_pods_or_10_percent_per_minute() {
    // "if there are 80 replicas and the target has to be scaled down to 10 replicas then
    // during the first step 8 replicas will be reduced. In the next iteration when the
    // number of replicas is 72, 10% of the pods is 7.2 but the number is rounded up to 8.
    // ... When the number of replicas falls below 40 the first policy (Pods) is applied
    // and 4 replicas will be reduced at a time."
    // (No stabilisation window here, to isolate the policies.)
    let mut sp = capacity_only(100.0, 1, 100);
    let down = &mut sp.autoscaling.behavior.scale_down;
    down.stabilization_window_seconds = Some(0);
    down.policies = vec![
        policy(PolicyType::Pods, 4, 60),
        policy(PolicyType::Percent, 10, 60),
    ];
    assert_eq!(
        scale_down_path(sp, 80, 10.0),
        [80, 72, 64, 57, 51, 45, 40, 36, 32, 28, 24, 20, 16, 12, 10]
    );
}

#[test]
fn example_limit_scale_down_rate_to_10_percent_per_minute() {
    // "To limit the rate at which pods are removed by the HPA to 10% per minute".
    let mut sp = capacity_only(100.0, 1, 100);
    let down = &mut sp.autoscaling.behavior.scale_down;
    down.stabilization_window_seconds = Some(0);
    down.policies = vec![policy(PolicyType::Percent, 10, 60)];
    let path = scale_down_path(sp, 100, 10.0);
    assert_eq!(path[..6], [100, 90, 81, 72, 64, 57]);
    assert!(path.windows(2).all(|w| w[0] - w[1] <= (w[0] + 9) / 10));
}

#[test]
fn example_no_more_than_5_pods_per_minute_with_select_policy_min() {
    // "To ensure that no more than 5 Pods are removed per minute, you can add a second
    // scale-down policy with a fixed size of 5, and set selectPolicy to minimum."
    let mut sp = capacity_only(100.0, 1, 100);
    let down = &mut sp.autoscaling.behavior.scale_down;
    down.stabilization_window_seconds = Some(0);
    down.select_policy = Some(SelectPolicy::Min);
    down.policies = vec![
        policy(PolicyType::Percent, 10, 60),
        policy(PolicyType::Pods, 5, 60),
    ];
    let path = scale_down_path(sp, 100, 10.0);
    // 5 at a time while 10 % is more than 5, then 10 % (rounded so fewer go).
    assert_eq!(path[..4], [100, 95, 90, 85]);
    assert!(path.windows(2).all(|w| w[0] - w[1] <= 5));
    assert_eq!(path.iter().copied().find(|&n| n < 50), Some(45));
    // At 11 replicas the load that asks for 10 is 10/11 = 0.91 of the target per
    // replica: within tolerance, so HPA stops there.
    assert_eq!(*path.last().unwrap(), 11, "{path:?}");
}

#[test]
fn example_disable_scale_down() {
    // "The selectPolicy value of Disabled turns off scaling the given direction."
    let mut sp = capacity_only(100.0, 1, 100);
    let down = &mut sp.autoscaling.behavior.scale_down;
    down.stabilization_window_seconds = Some(0);
    down.select_policy = Some(SelectPolicy::Disabled);
    assert_eq!(scale_down_path(sp.clone(), 20, 1.0), [20]);
    let out = decide(&input(&sp, 20, load(20, 100.0)), &History::default(), s(0));
    assert_eq!(
        (out.action, out.reason),
        (Action::Hold, Reason::ScaleRateLimited)
    );
    // Scale-up still works.
    let out = decide(&input(&sp, 20, load(20, 3000.0)), &History::default(), s(0));
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleUp, 30));
}
