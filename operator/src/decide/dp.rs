//! DP dispatch weights for a replica whose data-parallel ranks get uneven work.
//!
//! Rule: when a replica's DP imbalance ratio (the engine's own, or else `max share × ranks`)
//! is above `rebalancing.dpImbalanceRatio`, each rank's new weight is its current weight
//! divided by its share of the tokens scheduled over the period, normalised to sum 1.
//! Dividing the *current* weight (not an even one) makes the rule converge instead of
//! undoing itself: once the shares even out under the new weights, the ratio falls under
//! the threshold and no new weights are proposed. Guards: a share below a tenth of an
//! even share counts as that tenth (an idle rank does not get all the traffic), and every
//! rank keeps at least a tenth of an even share of the weight — never zero.

use super::outcome::DpWeights;
use crate::signals::ReplicaSignals;

/// Floor of a rank's share (observed and proposed), as a fraction of an even share.
const MIN_FRACTION_OF_EVEN: f64 = 0.1;

/// New weights for `replica`, if its ranks are imbalanced beyond `threshold`.
pub(crate) fn propose(
    replica: &ReplicaSignals,
    current: Option<&[f64]>,
    threshold: f64,
) -> Option<DpWeights> {
    let shares = normalized(&replica.dp_token_share)?;
    let n = shares.len();
    if n < 2 {
        return None;
    }
    let even = 1.0 / n as f64;
    let max_share = shares.iter().copied().fold(0.0, f64::max);
    let ratio = replica
        .dp_imbalance_ratio
        .filter(|r| r.is_finite() && *r >= 1.0)
        .unwrap_or(max_share * n as f64);
    if !(threshold.is_finite() && ratio > threshold) {
        return None;
    }
    let current = current
        .filter(|w| w.len() == n)
        .and_then(normalized)
        .filter(|w| w.iter().all(|x| *x > 0.0))
        .unwrap_or_else(|| vec![even; n]);
    let floor = MIN_FRACTION_OF_EVEN * even;
    let raw: Vec<f64> = current
        .iter()
        .zip(&shares)
        .map(|(w, s)| w / s.max(floor))
        .collect();
    let weights = with_floor(normalized(&raw)?, floor);
    Some(DpWeights {
        replica: replica.name.clone(),
        weights,
        imbalance_ratio: ratio,
    })
}

/// `v` scaled to sum 1, if every entry is a finite non-negative number and the sum is
/// positive.
fn normalized(v: &[f64]) -> Option<Vec<f64>> {
    if v.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return None;
    }
    let sum: f64 = v.iter().sum();
    (sum > 0.0 && sum.is_finite()).then(|| v.iter().map(|x| x / sum).collect())
}

/// Raises entries below `floor` to it and takes the difference from the others in
/// proportion, keeping the sum at 1.
fn with_floor(mut w: Vec<f64>, floor: f64) -> Vec<f64> {
    // Each pass pins at least one more entry; n passes always settle.
    for _ in 0..w.len() {
        let pinned: f64 = w.iter().filter(|x| **x <= floor).count() as f64 * floor;
        let free: f64 = w.iter().filter(|x| **x > floor).sum();
        if free <= 0.0 || !w.iter().any(|x| *x < floor) {
            break;
        }
        let scale = (1.0 - pinned) / free;
        for x in &mut w {
            *x = if *x <= floor { floor } else { *x * scale };
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(shares: &[f64], ratio: Option<f64>) -> ReplicaSignals {
        ReplicaSignals {
            name: "r".into(),
            dp_token_share: shares.to_vec(),
            dp_imbalance_ratio: ratio,
            ..ReplicaSignals::default()
        }
    }

    #[test]
    fn inverse_of_share_from_even_weights() {
        // Rank 0 got 75 % of the tokens: weights ∝ 1/0.75 : 1/0.25 = 1 : 3.
        let w = propose(&replica(&[0.75, 0.25], None), None, 1.2).unwrap();
        assert!((w.weights[0] - 0.25).abs() < 1e-9);
        assert!((w.weights[1] - 0.75).abs() < 1e-9);
        assert!((w.imbalance_ratio - 1.5).abs() < 1e-9);
    }

    #[test]
    fn balanced_or_garbage_proposes_nothing() {
        assert!(propose(&replica(&[0.5, 0.5], None), None, 1.5).is_none());
        assert!(propose(&replica(&[0.6, 0.4], Some(1.2)), None, 1.5).is_none());
        assert!(propose(&replica(&[f64::NAN, 0.5], Some(3.0)), None, 1.5).is_none());
        assert!(propose(&replica(&[0.0, 0.0], Some(3.0)), None, 1.5).is_none());
        assert!(propose(&replica(&[1.0], Some(3.0)), None, 1.5).is_none());
    }

    #[test]
    fn builds_on_current_weights_and_never_zero() {
        // Already shifted to 0.25/0.75, rank 1 still short: shift further.
        let w = propose(&replica(&[0.7, 0.3], Some(1.6)), Some(&[0.25, 0.75]), 1.5).unwrap();
        assert!(w.weights[1] > 0.75);
        // An idle rank cannot take everything, and the busy one keeps a floor.
        let w = propose(&replica(&[0.0, 0.0, 1.0, 0.0], None), None, 1.5).unwrap();
        let sum: f64 = w.weights.iter().sum();
        assert!((sum - 1.0).abs() < 1e-9);
        assert!(
            w.weights.iter().all(|x| *x >= 0.025 - 1e-12),
            "{:?}",
            w.weights
        );
    }
}
