//! Summary statistics over latency samples.

use serde::{Deserialize, Serialize};

/// Mean and percentiles of a set of samples, in the unit of the samples
/// (seconds in a [`crate::Report`]).
///
/// Percentiles use linear interpolation between closest ranks (the default
/// of NumPy and of vLLM's benchmark scripts): for `n` sorted samples the
/// p-th percentile sits at fractional index `p/100 · (n − 1)`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Summary {
    /// `None` when there are no samples, so reports show `null` rather than a
    /// misleading zero.
    pub(crate) fn of(mut samples: Vec<f64>) -> Option<Summary> {
        samples.retain(|x| x.is_finite());
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        Some(Summary {
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
            p50: percentile(&samples, 50.0),
            p90: percentile(&samples, 90.0),
            p99: percentile(&samples, 99.0),
        })
    }
}

/// The `p`-th percentile (0..=100) of ascending, non-empty `sorted`, by
/// linear interpolation.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = (p / 100.0).clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_on_hand_computed_cases() {
        // 1..=10: index = p/100 * 9.
        let xs: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!(close(percentile(&xs, 0.0), 1.0));
        assert!(close(percentile(&xs, 50.0), 5.5)); // index 4.5
        assert!(close(percentile(&xs, 90.0), 9.1)); // index 8.1
        assert!(close(percentile(&xs, 99.0), 9.91)); // index 8.91
        assert!(close(percentile(&xs, 100.0), 10.0));

        // Uneven gaps: [0, 10, 100], p90 at index 1.8 → 10 + 0.8·90.
        let ys = [0.0, 10.0, 100.0];
        assert!(close(percentile(&ys, 50.0), 10.0));
        assert!(close(percentile(&ys, 90.0), 82.0));

        assert!(close(percentile(&[4.2], 99.0), 4.2));
    }

    #[test]
    fn summary_sorts_and_averages() {
        let s = Summary::of(vec![3.0, 1.0, 2.0, 4.0]).unwrap();
        assert!(close(s.mean, 2.5));
        assert!(close(s.p50, 2.5)); // index 1.5
        assert!(close(s.p90, 3.7)); // index 2.7
        assert!(close(s.p99, 3.97)); // index 2.97
    }

    #[test]
    fn no_samples_means_no_summary() {
        assert_eq!(Summary::of(Vec::new()), None);
        assert_eq!(Summary::of(vec![f64::NAN]), None);
    }
}
