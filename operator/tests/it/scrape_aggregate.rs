//! Fleet aggregation across control periods: counter resets (per series), KV
//! max-then-mean, TTFT p99 from summed buckets, forgetting replicas, and which signal
//! families the period's successful scrapes carried.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ballast_operator::scrape::Tracker;
use ballast_operator::scrape::aggregate::histogram_quantile;
use ballast_operator::scrape::dialect::adapt;
use ballast_operator::scrape::parser::parse;
use ballast_operator::signals::{CounterSeries, Dialect, Family, ReplicaSample};

const INF: f64 = f64::INFINITY;

fn secs(t0: Instant, s: u64) -> Instant {
    t0 + Duration::from_secs(s)
}

fn with_rejections(total: f64) -> ReplicaSample {
    by_reason(&[("full", total)])
}

/// A replica whose 429 counter has one series per reason.
fn by_reason(series: &[(&str, f64)]) -> ReplicaSample {
    let series: CounterSeries = series
        .iter()
        .map(|(reason, v)| (format!("reason={reason:?}"), *v))
        .collect();
    ReplicaSample {
        rejections_total: Some(series),
        families: [Family::Rejections].into(),
        ..ReplicaSample::default()
    }
}

#[test]
fn counter_reset_gives_no_false_spike() {
    let t0 = Instant::now();
    let mut tracker = Tracker::new();
    let a = with_rejections(1000.0);
    let f = tracker.observe(t0, [("a", Some(&a))], 0);
    assert_eq!(
        f.rejections_per_second_per_replica, None,
        "one sample has no rate"
    );

    let a = with_rejections(1010.0);
    let f = tracker.observe(secs(t0, 10), [("a", Some(&a))], 0);
    assert_eq!(f.rejections_per_second_per_replica, Some(1.0));

    // The engine restarted: its counter starts again from zero and reads 3.
    let a = with_rejections(3.0);
    let f = tracker.observe(secs(t0, 20), [("a", Some(&a))], 0);
    assert_eq!(f.rejections_per_second_per_replica, Some(0.3));
    assert_eq!(f.replicas[0].rejections_per_second, Some(0.3));
}

#[test]
fn ttft_counter_reset_counts_from_zero() {
    let t0 = Instant::now();
    let mut tracker = Tracker::new();
    let hist = |fast: f64, all: f64| ReplicaSample {
        ttft_buckets: vec![(0.1, fast), (1.0, all), (INF, all)],
        ..ReplicaSample::default()
    };
    tracker.observe(t0, [("a", Some(&hist(900.0, 1000.0)))], 0);
    // Restarted: 2 observations since, both slow.
    let f = tracker.observe(secs(t0, 5), [("a", Some(&hist(0.0, 2.0)))], 0);
    assert_eq!(
        f.replicas[0].ttft_bucket_increase,
        vec![(0.1, 0.0), (1.0, 2.0), (INF, 2.0)]
    );
    assert_eq!(
        f.ttft_p99_seconds,
        histogram_quantile(0.99, &[(0.1, 0.0), (1.0, 2.0), (INF, 2.0)])
    );
    assert!(f.ttft_p99_seconds.unwrap() > 0.1);
}

fn replica(kv_by_rank: &[f64], waiting: f64) -> ReplicaSample {
    let mut text = String::new();
    for (rank, kv) in kv_by_rank.iter().enumerate() {
        text += &format!("ballast_kv_cache_usage_ratio{{engine=\"{rank}\"}} {kv}\n");
        text += &format!(
            "ballast_num_requests_waiting_by_reason{{engine=\"{rank}\",reason=\"capacity\"}} {waiting}\n"
        );
    }
    adapt(Dialect::Ballast, &parse(&text))
}

#[test]
fn kv_usage_is_max_over_ranks_then_mean_over_replicas() {
    let a = replica(&[0.2, 0.9], 1.0);
    let b = replica(&[0.5, 0.5], 2.0);
    assert_eq!(a.kv_usage, Some(0.9));
    let f = Tracker::new().observe(Instant::now(), [("a", Some(&a)), ("b", Some(&b))], 0);
    // (0.9 + 0.5) / 2; the mean over all ranks would be 0.525 and hide the full rank.
    assert_eq!(f.kv_usage, Some(0.7));
    assert_eq!(f.capacity_waiting, Some(6.0));
    assert_eq!(f.deferred_waiting, None);
    assert_eq!(f.reporting(), 2);
    assert_eq!(f.ready, 2);
}

#[test]
fn ttft_p99_comes_from_summed_buckets_not_averaged_quantiles() {
    let t0 = Instant::now();
    let bounds = [0.1, 1.0, 10.0, INF];
    let hist = |counts: [f64; 4]| ReplicaSample {
        ttft_buckets: bounds.iter().copied().zip(counts).collect(),
        ..ReplicaSample::default()
    };
    let zero = hist([0.0; 4]);
    let mut tracker = Tracker::new();
    tracker.observe(t0, [("fast", Some(&zero)), ("slow", Some(&zero))], 0);
    // Over the period: "fast" served 1000 requests under 0.1 s, "slow" 10 between 1 and 10 s.
    let fast = hist([1000.0, 1000.0, 1000.0, 1000.0]);
    let slow = hist([0.0, 0.0, 10.0, 10.0]);
    let f = tracker.observe(
        secs(t0, 5),
        [("fast", Some(&fast)), ("slow", Some(&slow))],
        1,
    );
    let p99 = f.ttft_p99_seconds.unwrap();

    let summed = [(0.1, 1000.0), (1.0, 1000.0), (10.0, 1010.0), (INF, 1010.0)];
    assert_eq!(Some(p99), histogram_quantile(0.99, &summed));
    // 99 % of all 1010 requests got their first token within 0.1 s…
    assert!((p99 - 0.1 * 999.9 / 1000.0).abs() < 1e-12, "{p99}");
    // …while averaging per-replica p99s (0.099 and 9.91) would claim about 5 s.
    let per_replica: Vec<f64> = f
        .replicas
        .iter()
        .map(|r| histogram_quantile(0.99, &r.ttft_bucket_increase).unwrap())
        .collect();
    let averaged = per_replica.iter().sum::<f64>() / 2.0;
    assert!((averaged - 5.0045).abs() < 1e-3, "{averaged}");
    assert!(averaged > 40.0 * p99);
    assert_eq!(f.starting, 1);
}

#[test]
fn disappearing_replicas_are_forgotten() {
    let t0 = Instant::now();
    let mut tracker = Tracker::new();
    let s = with_rejections(100.0);
    tracker.observe(t0, [("a", Some(&s)), ("b", Some(&s))], 0);
    assert_eq!(tracker.tracked(), 2);

    let f = tracker.observe(secs(t0, 5), [("a", Some(&s))], 0);
    assert_eq!(tracker.tracked(), 1);
    assert_eq!(f.ready, 1);

    // "b" comes back (a new pod with the same name): no window yet, so no rate, rather
    // than a rate over a stale sample.
    let b = with_rejections(500.0);
    let f = tracker.observe(secs(t0, 10), [("a", Some(&s)), ("b", Some(&b))], 0);
    let b_signals = f.replicas.iter().find(|r| r.name == "b").unwrap();
    assert_eq!(b_signals.rejections_per_second, None);
    assert_eq!(f.rejections_per_second_per_replica, Some(0.0));
}

#[test]
fn a_failed_scrape_contributes_nothing_but_keeps_the_window() {
    let t0 = Instant::now();
    let mut tracker = Tracker::new();
    tracker.observe(t0, [("a", Some(&with_rejections(10.0)))], 0);
    let f = tracker.observe(secs(t0, 5), [("a", None)], 0);
    assert_eq!(f.reporting(), 0);
    assert_eq!(f.ready, 1);
    assert_eq!(f.rejections_per_second_per_replica, None);
    assert_eq!(f.kv_usage, None);
    assert_eq!(tracker.tracked(), 1);
    // The next success measures over the whole 10 s since the last good sample.
    let f = tracker.observe(secs(t0, 10), [("a", Some(&with_rejections(30.0)))], 0);
    assert_eq!(f.rejections_per_second_per_replica, Some(2.0));
}

#[test]
fn dp_signals_over_the_period() {
    let t0 = Instant::now();
    let dp = |tokens: Vec<f64>, imb: (f64, f64)| ReplicaSample {
        dp_tokens: tokens,
        dp_imbalance: Some(imb),
        ..ReplicaSample::default()
    };
    let mut tracker = Tracker::new();
    tracker.observe(t0, [("a", Some(&dp(vec![100.0, 100.0], (10.0, 10.0))))], 0);
    let f = tracker.observe(
        secs(t0, 5),
        [("a", Some(&dp(vec![400.0, 200.0], (34.0, 26.0))))],
        0,
    );
    assert_eq!(f.replicas[0].dp_token_share, vec![0.75, 0.25]);
    assert_eq!(f.replicas[0].dp_imbalance_ratio, Some(1.5));
}

#[test]
fn a_replica_listed_twice_counts_once() {
    let a = replica(&[0.4], 3.0);
    let f = Tracker::new().observe(Instant::now(), [("a", Some(&a)), ("a", Some(&a))], 0);
    assert_eq!(f.reporting(), 1);
    assert_eq!(f.ready, 1);
    assert_eq!(f.capacity_waiting, Some(3.0));
}

#[test]
fn a_reset_is_judged_per_reason_series() {
    let t0 = Instant::now();
    let mut tracker = Tracker::new();
    let before = by_reason(&[
        ("max_num_queued_reqs", 100.0),
        ("max_num_queued_tokens", 50.0),
    ]);
    tracker.observe(t0, [("a", Some(&before))], 0);
    // Over 10 s the tokens series was reset and counted 5 since; the requests series
    // grew by 20. The sum went 150 → 125: summed first, that reads as a reset of the whole
    // counter and an increase of 125. Per series it is 20 + 5.
    let after = by_reason(&[
        ("max_num_queued_reqs", 120.0),
        ("max_num_queued_tokens", 5.0),
    ]);
    let f = tracker.observe(secs(t0, 10), [("a", Some(&after))], 0);
    assert_eq!(f.replicas[0].rejections_per_second, Some(2.5));
    assert_eq!(f.rejections_per_second_per_replica, Some(2.5));

    // One series resetting while the other grows hides the reset from the sum: 125 → 150
    // reads as +25, but the requests series alone grew by 30 (the tokens one restarted
    // and has counted nothing since).
    let later = by_reason(&[
        ("max_num_queued_reqs", 150.0),
        ("max_num_queued_tokens", 0.0),
    ]);
    let f = tracker.observe(secs(t0, 20), [("a", Some(&later))], 0);
    assert_eq!(f.replicas[0].rejections_per_second, Some(3.0));
}

#[test]
fn a_new_reason_series_counts_from_zero() {
    let t0 = Instant::now();
    let mut tracker = Tracker::new();
    // A labelled counter that has counted nothing yet is only declared: rate 0, not none.
    let declared = ReplicaSample {
        rejections_total: Some(CounterSeries::new()),
        families: [Family::Rejections].into(),
        ..ReplicaSample::default()
    };
    tracker.observe(t0, [("a", Some(&declared))], 0);
    let f = tracker.observe(secs(t0, 5), [("a", Some(&declared))], 0);
    assert_eq!(f.rejections_per_second_per_replica, Some(0.0));
    // The first rejection of a reason creates its series.
    let first = by_reason(&[("max_num_queued_reqs", 5.0)]);
    let f = tracker.observe(secs(t0, 10), [("a", Some(&first))], 0);
    assert_eq!(f.rejections_per_second_per_replica, Some(1.0));
}

#[test]
fn exported_families_come_from_successful_scrapes_only() {
    let t0 = Instant::now();
    let mut tracker = Tracker::new();
    let fixture = |file: &str| {
        let path = format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
        adapt(
            Dialect::Vllm,
            &parse(&std::fs::read_to_string(path).unwrap()),
        )
    };
    // An older vLLM without `vllm:admission_rejections_total`, and one that failed.
    let old = fixture("vllm_v0_single.prom");
    let f = tracker.observe(t0, [("a", Some(&old)), ("b", None)], 0);
    let expected: BTreeSet<Family> = [Family::Waiting, Family::KvUsage, Family::Ttft].into();
    assert_eq!(f.exported, Some(expected));
    assert!(f.lacks(Family::Rejections));
    assert!(!f.lacks(Family::Waiting));

    // No scrape succeeded: nothing is known, so nothing is "not exported".
    let f = tracker.observe(secs(t0, 5), [("a", None), ("b", None)], 0);
    assert_eq!(f.exported, None);
    assert!(!f.lacks(Family::Rejections));

    // A replica that has the counter makes the family exported for the fleet.
    let new = fixture("vllm_v1_dp2.prom");
    let f = tracker.observe(secs(t0, 10), [("a", Some(&old)), ("b", Some(&new))], 0);
    assert!(!f.lacks(Family::Rejections));
    assert_eq!(f.exported.as_ref().map(BTreeSet::len), Some(4));

    // Its scrape failing does not make the family "not exported": its last successful
    // scrape speaks for it, so the signal is missing (no scale-down), not ignored.
    let f = tracker.observe(secs(t0, 15), [("a", Some(&old)), ("b", None)], 0);
    assert!(!f.lacks(Family::Rejections));
    assert_eq!(f.rejections_per_second_per_replica, None);

    // Once it is gone, the remaining replicas do not export it.
    let f = tracker.observe(secs(t0, 20), [("a", Some(&old))], 0);
    assert!(f.lacks(Family::Rejections));
}
