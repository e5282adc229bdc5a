//! Rebalancing decisions: hot replicas out of rotation while the fleet has headroom,
//! hysteresis on the way back, `minAccepting`, DP weights.

use crate::decide_support as support;

use ballast_crds::Action;
use ballast_operator::decide::{ConditionKind, DecideInput, History, Outcome, Reason, decide};
use ballast_operator::signals::{FleetSignals, ReplicaSignals};
use support::*;

/// Decides with these replicas out of rotation.
fn decide_with_out(fleet: FleetSignals, current: i32, out: &[&str]) -> Outcome {
    let mut i: DecideInput = input(&spec(), current, fleet);
    i.out_of_rotation = out.iter().map(|s| s.to_string()).collect();
    decide(&i, &History::default(), s(0))
}

fn three(r0: ReplicaSignals) -> FleetSignals {
    fleet(vec![r0, replica("r1", 0.3, 0.0), replica("r2", 0.3, 0.0)])
}

#[test]
fn one_hot_replica_in_a_cool_fleet_is_taken_out_and_restored_only_when_cool() {
    // r0's KV is at 0.97 (> hotKvCacheUsage 0.95); the fleet averages 0.52 (< 0.85).
    let out = decide_with_out(three(replica("r0", 0.97, 2.0)), 3, &[]);
    assert_eq!(out.action, Action::Rebalance, "{}", out.message);
    assert_eq!(out.reason, Reason::ReplicaHot);
    assert_eq!(out.desired_replicas, 3, "no scale change");
    assert_eq!(out.rebalance.take_out, ["r0"]);
    assert!(
        out.message.starts_with("r0 hot (KV 0.97 > 0.95)"),
        "{}",
        out.message
    );
    assert!(out.history.scale_event.is_none());

    // Between cool (0.8 × 0.95 = 0.76) and hot it stays out: hysteresis.
    for (kv, waiting) in [(0.9, 0.0), (0.77, 0.0), (0.5, 7.0)] {
        let out = decide_with_out(three(replica("r0", kv, waiting)), 3, &["r0"]);
        assert!(out.rebalance.is_empty(), "kv {kv}: {:?}", out.rebalance);
        assert_eq!(out.action, Action::Hold);
    }
    // Without a sample it stays out too.
    let out = decide_with_out(
        fleet(vec![replica("r1", 0.3, 0.0), replica("r2", 0.3, 0.0)]),
        3,
        &["r0"],
    );
    assert!(out.rebalance.restore.is_empty());

    // Below both cool thresholds it returns.
    let out = decide_with_out(three(replica("r0", 0.7, 1.0)), 3, &["r0"]);
    assert_eq!(
        (out.action, out.reason),
        (Action::Rebalance, Reason::ReplicaCooled)
    );
    assert_eq!(out.rebalance.restore, ["r0"]);
    assert!(out.rebalance.take_out.is_empty());
}

#[test]
fn min_accepting_is_respected_when_all_are_hot() {
    // Every replica has more than hotCapacityWaiting (8) waiting, yet the fleet is under
    // its (raised) target of 20 per replica: take out the hottest, keep one accepting.
    let mut sp = spec();
    sp.autoscaling.targets.capacity_waiting_per_replica = Some(20.0);
    let reps = vec![
        replica("r0", 0.5, 9.0),
        replica("r1", 0.5, 11.0),
        replica("r2", 0.5, 10.0),
    ];
    let out = decide(
        &input(&sp, 3, fleet(reps.clone())),
        &History::default(),
        s(0),
    );
    assert_eq!(
        (out.action, out.reason),
        (Action::Rebalance, Reason::ReplicaHot)
    );
    assert_eq!(out.rebalance.take_out, ["r1", "r2"], "hottest first");
    assert!(
        out.message
            .contains("r0 hot but kept in rotation to keep 1 accepting"),
        "{}",
        out.message
    );

    // With one already out, only one more may go.
    let mut i = input(&sp, 3, fleet(reps.clone()));
    i.out_of_rotation.insert("r1".into());
    let out = decide(&i, &History::default(), s(0));
    assert_eq!(out.rebalance.take_out, ["r2"]);

    // minAccepting 3: nobody goes.
    sp.rebalancing.min_accepting = 3;
    let out = decide(&input(&sp, 3, fleet(reps)), &History::default(), s(0));
    assert!(out.rebalance.take_out.is_empty());
    assert_eq!(out.action, Action::Hold);
}

#[test]
fn hot_replicas_stay_in_rotation_when_the_fleet_has_no_headroom() {
    // Fleet KV 0.93 is above the 0.85 target (within tolerance, so no scale-up either):
    // moving traffic off r0 would only overload the others.
    let reps = vec![
        replica("r0", 0.99, 0.0),
        replica("r1", 0.9, 0.0),
        replica("r2", 0.9, 0.0),
    ];
    let out = decide_with_out(fleet(reps), 3, &[]);
    assert!(out.rebalance.take_out.is_empty());
    assert_eq!(out.action, Action::Hold);
    assert!(out.message.contains("no headroom"), "{}", out.message);
}

#[test]
fn fewer_than_min_accepting_returns_replicas_even_without_metrics() {
    // Both ready replicas are out (one was removed from the fleet since), and nobody
    // reported: metrics are unusable, but the fleet must take traffic.
    let mut f = fleet(vec![]);
    f.ready = 2;
    let out = decide_with_out(f, 2, &["r1", "r0"]);
    assert_eq!(
        (out.action, out.reason),
        (Action::Rebalance, Reason::MinAccepting)
    );
    assert_eq!(out.rebalance.restore, ["r0"]);
    let c = out.condition(ConditionKind::MetricsAvailable).unwrap();
    assert!(!c.status);
}

#[test]
fn garbage_replica_values_never_take_a_replica_out() {
    let mut f = three(replica("r0", f64::NAN, f64::NAN));
    // The scraper's fleet view is fine (say it excluded the broken values).
    f.kv_usage = Some(0.3);
    f.capacity_waiting = Some(0.0);
    let out = decide_with_out(f.clone(), 3, &[]);
    assert!(out.rebalance.take_out.is_empty(), "{:?}", out.rebalance);
    // And a replica out of rotation with garbage values is not restored on them.
    let out = decide_with_out(f, 3, &["r0"]);
    assert!(out.rebalance.restore.is_empty());
}

#[test]
fn disabled_rebalancing_returns_everyone() {
    let mut i = input(&spec(), 3, three(replica("r0", 0.3, 0.0)));
    i.rebalancing.enabled = false;
    i.out_of_rotation.insert("r1".into());
    let out = decide(&i, &History::default(), s(0));
    assert_eq!(out.rebalance.restore, ["r1"]);
    assert!(out.rebalance.take_out.is_empty());
    assert_eq!(out.reason, Reason::RebalancingDisabled);
}

#[test]
fn dp_weights_for_an_imbalanced_replica() {
    // r0's rank 0 got 80 % of the tokens: imbalance 0.8 × 2 = 1.6 > dpImbalanceRatio 1.5.
    // New weights ∝ 1/0.8 : 1/0.2, i.e. 0.2 / 0.8.
    let mut r0 = replica("r0", 0.4, 0.0);
    r0.dp_token_share = vec![0.8, 0.2];
    let out = decide_with_out(three(r0.clone()), 3, &[]);
    assert_eq!(
        (out.action, out.reason),
        (Action::Rebalance, Reason::DpImbalance)
    );
    let w = &out.rebalance.dp_weights;
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].replica, "r0");
    assert!((w[0].weights[0] - 0.2).abs() < 1e-9, "{:?}", w[0].weights);
    assert!((w[0].weights[1] - 0.8).abs() < 1e-9);
    assert!(
        out.message
            .contains("r0 DP imbalance 1.6 > 1.5: rank weights 0.2/0.8")
    );

    // Once the shares even out under those weights, nothing more is proposed.
    r0.dp_token_share = vec![0.52, 0.48];
    let mut i = input(&spec(), 3, three(r0));
    i.dp_weights.insert("r0".into(), vec![0.2, 0.8]);
    let out = decide(&i, &History::default(), s(0));
    assert!(out.rebalance.dp_weights.is_empty());
    assert_eq!(out.action, Action::Hold);
}
