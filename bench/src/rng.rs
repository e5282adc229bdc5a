//! A tiny deterministic random number generator (SplitMix64).
//!
//! The benchmark only needs reproducible, well-spread numbers, not
//! cryptographic ones, so a 64-bit SplitMix generator is plenty and saves a
//! dependency. Every random decision is derived from `--seed`, which makes two
//! runs with the same flags send byte-identical workloads.

/// Weyl-sequence increment from the SplitMix64 reference (odd, ≈ 2^64/φ).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a strong 64-bit bit mixer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded SplitMix64 generator.
#[derive(Debug, Clone)]
pub(crate) struct Rng {
    state: u64,
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent generator for item `index` of `stream`.
    ///
    /// Deriving per-request generators (instead of sharing one) makes request
    /// `i` a pure function of `(seed, i)`, so the workload does not depend on
    /// which worker happens to pick the request up first.
    pub(crate) fn derive(seed: u64, stream: u64, index: u64) -> Self {
        Self::new(mix(mix(mix(seed) ^ stream.wrapping_mul(GAMMA)) ^ index))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`). Uses the multiply-high trick; its bias is
    /// below 2^-32 for the small ranges used here, which is irrelevant for load
    /// generation.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// Standard normal sample (Box–Muller).
    pub(crate) fn standard_normal(&mut self) -> f64 {
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Exponential sample with the given mean (inverse-CDF method).
    pub(crate) fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_same_sequence_and_different_seeds_differ() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(8);
            (0..8).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn derived_streams_are_distinct() {
        let x = Rng::derive(0, 1, 0).next_u64();
        let y = Rng::derive(0, 1, 1).next_u64();
        let z = Rng::derive(0, 2, 0).next_u64();
        assert_ne!(x, y);
        assert_ne!(x, z);
        assert_eq!(x, Rng::derive(0, 1, 0).next_u64());
    }

    #[test]
    fn uniform_helpers_stay_in_range_and_cover_it() {
        let mut r = Rng::new(1);
        let mut seen = [false; 5];
        for _ in 0..10_000 {
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
            let v = r.inclusive(3, 7);
            assert!((3..=7).contains(&v));
            seen[(v - 3) as usize] = true;
        }
        assert!(
            seen.iter().all(|&s| s),
            "every value of 3..=7 drawn: {seen:?}"
        );
    }

    #[test]
    fn normal_has_roughly_zero_mean_and_unit_variance() {
        let mut r = Rng::new(3);
        let n = 50_000;
        let xs: Vec<f64> = (0..n).map(|_| r.standard_normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
    }
}
