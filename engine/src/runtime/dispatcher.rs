//! Assigns each request to a data-parallel rank.
//!
//! - `round_robin`: smooth weighted round robin (each rank gains its weight per pick, the
//!   richest is chosen and pays the total), so weights 2:1 give A A B, not A A … B B.
//! - `least_tokens`: the rank with the fewest outstanding tokens (prompt plus requested
//!   output of its unfinished requests) per unit of weight.
//!
//! Weights can change at run time (the operator shifts them over the control API when a
//! rank runs hot); a weight of 0 takes a rank out of rotation.

pub use crate::config::runtime::DispatchPolicy;

use std::sync::Mutex;

/// Rejected weight vectors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightsError {
    /// Not one weight per rank.
    #[error("expected {want} weights (one per rank), got {got}")]
    WrongLength {
        /// Ranks.
        want: usize,
        /// Weights given.
        got: usize,
    },
    /// Negative, NaN or infinite.
    #[error("weight {0} is not a finite non-negative number")]
    Invalid(f64),
    /// Every rank at 0.
    #[error("at least one weight must be positive")]
    AllZero,
}

#[derive(Debug)]
struct State {
    weights: Vec<f64>,
    current: Vec<f64>,
    outstanding: Vec<u64>,
    rotate: usize,
}

/// The dispatcher of one engine.
#[derive(Debug)]
pub struct Dispatcher {
    policy: DispatchPolicy,
    state: Mutex<State>,
}

impl Dispatcher {
    /// Equal weights over `num_ranks` ranks.
    pub fn new(policy: DispatchPolicy, num_ranks: usize) -> Self {
        assert!(num_ranks > 0);
        Self {
            policy,
            state: Mutex::new(State {
                weights: vec![1.0; num_ranks],
                current: vec![0.0; num_ranks],
                outstanding: vec![0; num_ranks],
                rotate: 0,
            }),
        }
    }

    /// The policy.
    pub fn policy(&self) -> DispatchPolicy {
        self.policy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the weights.
    pub fn set_weights(&self, weights: &[f64]) -> Result<(), WeightsError> {
        let mut s = self.lock();
        if weights.len() != s.weights.len() {
            return Err(WeightsError::WrongLength {
                want: s.weights.len(),
                got: weights.len(),
            });
        }
        if let Some(&w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
            return Err(WeightsError::Invalid(w));
        }
        if weights.iter().all(|&w| w == 0.0) {
            return Err(WeightsError::AllZero);
        }
        s.weights.copy_from_slice(weights);
        s.current.iter_mut().for_each(|c| *c = 0.0);
        Ok(())
    }

    /// Current weights.
    pub fn weights(&self) -> Vec<f64> {
        self.lock().weights.clone()
    }

    /// Outstanding tokens per rank.
    pub fn outstanding(&self) -> Vec<u64> {
        self.lock().outstanding.clone()
    }

    /// Picks a rank for a request worth `tokens` and charges them to it.
    pub fn assign(&self, tokens: u64) -> usize {
        let mut s = self.lock();
        let n = s.weights.len();
        let rank = match self.policy {
            DispatchPolicy::RoundRobin => {
                let total: f64 = s.weights.iter().sum();
                let mut best = 0;
                for r in 0..n {
                    s.current[r] += s.weights[r];
                    if s.weights[r] > 0.0
                        && (s.weights[best] == 0.0 || s.current[r] > s.current[best])
                    {
                        best = r;
                    }
                }
                s.current[best] -= total;
                best
            }
            DispatchPolicy::LeastTokens => {
                // Start the scan at a rotating rank so ties (an idle engine) spread out.
                let start = s.rotate;
                s.rotate = (s.rotate + 1) % n;
                let score = |r: usize| s.outstanding[r] as f64 / s.weights[r];
                (0..n)
                    .map(|i| (start + i) % n)
                    .filter(|&r| s.weights[r] > 0.0)
                    .min_by(|&a, &b| score(a).total_cmp(&score(b)))
                    .expect("at least one positive weight")
            }
        };
        s.outstanding[rank] += tokens;
        rank
    }

    /// Charges a request worth `tokens` to `rank`, chosen by the client (a gateway that
    /// picks ranks): the weights are not consulted, the outstanding count still follows.
    pub fn charge(&self, rank: usize, tokens: u64) {
        let mut s = self.lock();
        if let Some(o) = s.outstanding.get_mut(rank) {
            *o += tokens;
        }
    }

    /// A request charged to `rank` finished.
    pub fn release(&self, rank: usize, tokens: u64) {
        let mut s = self.lock();
        s.outstanding[rank] = s.outstanding[rank].saturating_sub(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_round_robin_is_smooth_and_proportional() {
        let d = Dispatcher::new(DispatchPolicy::RoundRobin, 2);
        d.set_weights(&[2.0, 1.0]).unwrap();
        let picks: Vec<_> = (0..6).map(|_| d.assign(1)).collect();
        assert_eq!(picks, [0, 1, 0, 0, 1, 0]);
        d.set_weights(&[0.0, 1.0]).unwrap();
        assert!((0..5).all(|_| d.assign(1) == 1));
    }

    #[test]
    fn least_tokens_balances_and_respects_weights() {
        let d = Dispatcher::new(DispatchPolicy::LeastTokens, 3);
        assert_eq!(d.assign(100), 0);
        assert_eq!(d.assign(10), 1);
        assert_eq!(d.assign(10), 2);
        assert_eq!(
            d.assign(10),
            1,
            "rank 1 ties rank 2 at 10; the scan started at 1"
        );
        d.release(0, 100);
        assert_eq!(d.assign(5), 0);
        d.set_weights(&[1.0, 0.0, 1.0]).unwrap();
        assert!((0..10).all(|_| d.assign(1) != 1));
    }

    #[test]
    fn bad_weights_are_refused() {
        let d = Dispatcher::new(DispatchPolicy::RoundRobin, 2);
        assert!(matches!(
            d.set_weights(&[1.0]),
            Err(WeightsError::WrongLength { .. })
        ));
        assert!(matches!(
            d.set_weights(&[1.0, f64::NAN]),
            Err(WeightsError::Invalid(_))
        ));
        assert_eq!(d.set_weights(&[0.0, 0.0]), Err(WeightsError::AllZero));
        assert_eq!(d.weights(), vec![1.0, 1.0]);
    }
}
