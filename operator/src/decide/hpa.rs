//! HPA's per-metric replica calculation, for one signal.
//!
//! Follows `calcPlainMetricReplicas` in Kubernetes'
//! `pkg/controller/podautoscaler/replica_calculator.go` and the "Algorithm details" of
//! the HPA documentation:
//!
//! - `ratio = observed / target`; within tolerance (`1 − tol ≤ ratio ≤ 1 + tol`) nothing
//!   changes; otherwise `ceil(ratio × reporting)`.
//! - Ready replicas that did not report (*missing*) are assumed at the target on a
//!   scale-down and at 0 on a scale-up; replicas still *starting* are assumed at 0 on a
//!   scale-up (and ignored on a scale-down). The ratio is then recomputed, and if it is
//!   within tolerance or points the other way, nothing changes.
//! - `reporting` is per signal the replicas the average was taken over, as HPA counts the
//!   pods that have the metric: for the admission-rejection rate, the replicas that have
//!   a rate this period (one that just joined has a single sample of its counter and
//!   counts as missing for that signal only).
//!
//! The starting rule is what keeps one load spike from triggering a second scale-up while
//! the first new replicas load the model: they count toward the size as if already
//! serving (with no load), so the same waiting requests spread over them no longer ask
//! for more. Ballast applies it to every signal, TTFT included: a latency target uses
//! the same ratio formula, on the assumption that latency above target falls in
//! proportion as replicas are added.

/// How the replicas the workload runs split this period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pods {
    /// Ready replicas that reported (the average is over these).
    pub reporting: u32,
    /// Ready replicas that did not report.
    pub missing: u32,
    /// Replicas created but not ready yet.
    pub starting: u32,
}

/// HPA's tolerance test.
pub(crate) fn within_tolerance(ratio: f64, tolerance: f64) -> bool {
    (1.0 - tolerance) <= ratio && ratio <= (1.0 + tolerance)
}

/// `ceil(x)` as a replica count. A hair of slack absorbs float error, so that a product
/// computed as 3.0000000000000004 asks for 3 replicas, not 4; saturates at `i32::MAX`.
pub(crate) fn ceil_replicas(x: f64) -> i32 {
    let c = (x - 1e-9).ceil();
    if c <= 0.0 {
        0
    } else if c >= i32::MAX as f64 {
        i32::MAX
    } else {
        c as i32
    }
}

/// The replicas one signal recommends, given its usage ratio over the reporting replicas.
pub(crate) fn propose(ratio: f64, current: i32, pods: Pods, tolerance: f64) -> i32 {
    let reporting = f64::from(pods.reporting);
    let plain = if within_tolerance(ratio, tolerance) {
        current
    } else {
        ceil_replicas(ratio * reporting)
    };
    let scale_up_with_starting = pods.starting > 0 && ratio > 1.0;
    if !scale_up_with_starting && pods.missing == 0 {
        return plain;
    }

    // Re-average with the conservative assumptions, in units of the target.
    let mut load = ratio * reporting;
    let mut count = reporting;
    if pods.missing > 0 {
        if ratio < 1.0 {
            load += f64::from(pods.missing);
            count += f64::from(pods.missing);
        } else if ratio > 1.0 {
            count += f64::from(pods.missing);
        }
    }
    if scale_up_with_starting {
        count += f64::from(pods.starting);
    }
    let new_ratio = load / count;
    if within_tolerance(new_ratio, tolerance)
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        current
    } else {
        let n = ceil_replicas(new_ratio * count);
        if (new_ratio < 1.0 && n > current) || (new_ratio > 1.0 && n < current) {
            current
        } else {
            n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(reporting: u32, missing: u32, starting: u32) -> Pods {
        Pods {
            reporting,
            missing,
            starting,
        }
    }

    #[test]
    fn plain_formula_and_tolerance() {
        // HPA docs: 200m against 100m doubles, 50m halves.
        assert_eq!(propose(2.0, 4, pods(4, 0, 0), 0.1), 8);
        assert_eq!(propose(0.5, 4, pods(4, 0, 0), 0.1), 2);
        // Within tolerance: current, even when current differs from the reporting count.
        assert_eq!(propose(1.1, 5, pods(4, 0, 0), 0.1), 5);
        assert_eq!(propose(0.9, 5, pods(4, 0, 0), 0.1), 5);
        assert_eq!(propose(1.75, 2, pods(2, 0, 0), 0.1), 4);
    }

    #[test]
    fn float_error_does_not_add_a_replica() {
        assert_eq!(ceil_replicas(3.0000000000000004), 3);
        assert_eq!(ceil_replicas(3.01), 4);
        assert_eq!(ceil_replicas(f64::MAX), i32::MAX);
        assert_eq!(ceil_replicas(-2.0), 0);
    }

    #[test]
    fn missing_pods_dampen_both_ways() {
        // Scale-down: 3 of 4 report at half the target; the missing one counts at the
        // target: (1.5 + 1) / 4 = 0.625 → ceil(2.5) = 3, not ceil(0.5 × 3) = 2.
        assert_eq!(propose(0.5, 4, pods(3, 1, 0), 0.1), 3);
        // Scale-up: the missing one counts at 0: 3 × 2 / 4 = 1.5 → ceil(6) = 6.
        assert_eq!(propose(2.0, 4, pods(3, 1, 0), 0.1), 6);
        // Missing pods pull a small scale-up back into tolerance: 3 × 1.2 / 4 = 0.9.
        assert_eq!(propose(1.2, 4, pods(3, 1, 0), 0.1), 4);
    }

    #[test]
    fn starting_replicas_hold_a_second_scale_up() {
        // 14 waiting over 2 ready, target 4, already scaled to 4: still 4.
        assert_eq!(propose(1.75, 4, pods(2, 0, 2), 0.1), 4);
        // The queue grew to 17 while 2 replicas load the model: alone, ceil(4.25) = 5;
        // with the starting ones at 0, 4.25 / 4 = 1.06 is within tolerance: hold at 4.
        assert_eq!(propose(17.0 / 8.0, 4, pods(2, 0, 0), 0.1), 5);
        assert_eq!(propose(17.0 / 8.0, 4, pods(2, 0, 2), 0.1), 4);
        // Load grew to 20 waiting: 5 / 4 = 1.25 → ceil(5) = 5.
        assert_eq!(propose(2.5, 4, pods(2, 0, 2), 0.1), 5);
        // Starting replicas are ignored on a scale-down.
        assert_eq!(propose(0.25, 4, pods(2, 0, 2), 0.1), 1);
    }
}
