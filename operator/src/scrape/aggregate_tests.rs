//! `histogram_quantile` against Prometheus' semantics, and the counter-reset rule on each
//! kind of counter; fleet scenarios are in `operator/tests/it/scrape_aggregate.rs`.

use super::*;

const INF: f64 = f64::INFINITY;

#[test]
fn quantile_interpolates_inside_the_bucket() {
    let b = [(0.1, 10.0), (0.5, 60.0), (1.0, 100.0), (INF, 100.0)];
    // rank 50 lies in (0.1, 0.5], 40 of its 50 observations in: 0.1 + 0.4 × 0.8.
    let q = histogram_quantile(0.5, &b).unwrap();
    assert!((q - 0.42).abs() < 1e-12, "{q}");
    assert_eq!(histogram_quantile(1.0, &b), Some(1.0));
}

#[test]
fn quantile_first_bucket_starts_at_zero() {
    assert_eq!(
        histogram_quantile(0.5, &[(2.0, 10.0), (INF, 10.0)]),
        Some(1.0)
    );
    // …unless its bound is not above zero, which is then returned as is.
    assert_eq!(
        histogram_quantile(0.1, &[(-1.0, 5.0), (INF, 10.0)]),
        Some(-1.0)
    );
    assert_eq!(
        histogram_quantile(0.0, &[(2.0, 0.0), (INF, 10.0)]),
        Some(0.0)
    );
}

#[test]
fn quantile_in_the_inf_bucket_is_the_highest_finite_bound() {
    assert_eq!(
        histogram_quantile(0.99, &[(0.5, 10.0), (1.0, 50.0), (INF, 100.0)]),
        Some(1.0)
    );
}

#[test]
fn quantile_sorts_and_fixes_monotonicity() {
    let b = [(INF, 10.0), (2.0, 4.0), (1.0, 5.0)];
    // counts become 5, 5, 10: rank 5 is reached in the first bucket.
    assert_eq!(histogram_quantile(0.5, &b), Some(1.0));
}

#[test]
fn quantile_undefined_cases_are_none() {
    assert_eq!(histogram_quantile(0.99, &[(1.0, 0.0), (INF, 0.0)]), None);
    assert_eq!(histogram_quantile(0.99, &[(1.0, 3.0), (2.0, 4.0)]), None);
    assert_eq!(histogram_quantile(0.99, &[(INF, 4.0)]), None);
    assert_eq!(histogram_quantile(0.99, &[]), None);
    assert_eq!(histogram_quantile(1.5, &[(1.0, 3.0), (INF, 4.0)]), None);
    assert_eq!(
        histogram_quantile(f64::NAN, &[(1.0, 3.0), (INF, 4.0)]),
        None
    );
    assert_eq!(
        histogram_quantile(0.5, &[(f64::NAN, 3.0), (INF, 4.0)]),
        None
    );
}

#[test]
fn counter_decrease_counts_from_zero() {
    assert_eq!(increase(10.0, 15.0), 5.0);
    assert_eq!(increase(1000.0, 3.0), 3.0);
    assert_eq!(increase(7.0, 7.0), 0.0);
}

#[test]
fn bucket_increase_resets_as_a_whole() {
    let prev = [(1.0, 5.0), (INF, 10.0)];
    assert_eq!(
        bucket_increase(&prev, &[(1.0, 6.0), (INF, 14.0)]),
        vec![(1.0, 1.0), (INF, 4.0)]
    );
    // One bucket went down: the engine restarted, the whole current histogram is new.
    assert_eq!(
        bucket_increase(&prev, &[(1.0, 2.0), (INF, 12.0)]),
        vec![(1.0, 2.0), (INF, 12.0)]
    );
    // A different layout is a restart with another configuration.
    assert_eq!(
        bucket_increase(&prev, &[(2.0, 1.0), (INF, 1.0)]),
        vec![(2.0, 1.0), (INF, 1.0)]
    );
    assert!(bucket_increase(&[], &prev).is_empty());
    assert!(bucket_increase(&prev, &[]).is_empty());
}

#[test]
fn imbalance_mean_over_the_period() {
    assert_eq!(imbalance_mean((10.0, 8.0), (25.0, 18.0)), Some(1.5));
    assert_eq!(imbalance_mean((10.0, 8.0), (4.0, 2.0)), Some(2.0));
    assert_eq!(imbalance_mean((10.0, 8.0), (10.0, 8.0)), None);
}

#[test]
fn token_share_from_increases() {
    assert_eq!(token_share(&[10.0, 10.0], &[40.0, 20.0]), vec![0.75, 0.25]);
    assert_eq!(token_share(&[10.0, 10.0], &[1.0, 3.0]), vec![0.25, 0.75]);
    assert_eq!(token_share(&[10.0], &[10.0, 30.0]), vec![0.25, 0.75]);
    assert!(token_share(&[10.0, 10.0], &[10.0, 10.0]).is_empty());
    assert!(token_share(&[], &[1.0]).is_empty());
}
