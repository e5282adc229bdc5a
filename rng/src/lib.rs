//! The one deterministic random number generator of Ballast.
//!
//! Synthetic weights, seeded sampling and the load generator's workloads must give the same
//! numbers on every machine and every release, so Ballast owns its generator instead of
//! depending on a crate whose stream may change between versions. SplitMix64 is tiny, fast
//! and passes BigCrush, which is plenty for weights, sampling and load shapes.
//!
//! Independent consumers never share a generator: each derives its own stream from the
//! seed and a *path* of stream numbers ([`SplitMix64::derive_path`]), so what one consumer
//! draws never depends on what another drew or on which thread ran first. The engine
//! (weights per matrix and chunk, one stream per request) and the load generator (arrivals,
//! one stream per request) derive streams the same way.
//!
//! ```
//! use ballast_rng::SplitMix64;
//!
//! let mut a = SplitMix64::derive_path(7, &[1, 0]);
//! let mut b = SplitMix64::derive_path(7, &[1, 0]);
//! assert_eq!(a.next_u64(), b.next_u64());
//! assert_ne!(
//!     SplitMix64::derive_path(7, &[1, 0]).next_u64(),
//!     SplitMix64::derive_path(7, &[1, 1]).next_u64()
//! );
//! ```

#![warn(missing_docs)]

/// Weyl-sequence increment of SplitMix64 (odd, about 2^64 / φ).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser: a strong 64-bit bit mixer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64: a 64-bit state advanced by a Weyl sequence and mixed by a finaliser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose stream depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The generator of sub-stream `stream` of `seed`: `derive_path(seed, &[stream])`.
    pub fn derive(seed: u64, stream: u64) -> Self {
        Self::derive_path(seed, &[stream])
    }

    /// The generator at `path` below `seed`: each step mixes the state so far with the next
    /// stream number, so `[a, b]` and `[b, a]`, or `[a]` and `[a, 0]`, are unrelated streams.
    pub fn derive_path(seed: u64, path: &[u64]) -> Self {
        // The seed and each stream number are mixed under different constants (digits of
        // π), so no (seed, path) is trivially another: a plain `mix(s ^ x)` would make
        // seed 1 with path [0] the same stream as seed 0 with path [0, 0].
        let state = path
            .iter()
            .fold(mix(seed ^ 0x243F_6A88_85A3_08D3), |s, &x| {
                mix(s.rotate_left(17) ^ mix(x ^ 0x1319_8A2E_0370_7344))
            });
        Self::new(state)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// Uniform in [0, 1) with 24 bits of precision (exactly representable as f32).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n`; `n` must be non-zero. Multiply-high: the bias is below
    /// n / 2^64, irrelevant for weights, sampling and load shapes.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// A standard normal sample (Box–Muller).
    pub fn standard_normal(&mut self) -> f64 {
        // 1 − u lies in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// An exponential sample with the given mean (inverse CDF).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_different_seeds_differ() {
        let draw = |seed| {
            let mut r = SplitMix64::new(seed);
            (0..8).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn paths_are_distinct_streams() {
        let first = |path: &[u64]| SplitMix64::derive_path(0, path).next_u64();
        let all = [
            first(&[]),
            first(&[0]),
            first(&[1]),
            first(&[0, 0]),
            first(&[0, 1]),
            first(&[1, 0]),
            SplitMix64::derive_path(1, &[0]).next_u64(),
            SplitMix64::derive_path(1, &[]).next_u64(),
            SplitMix64::new(0).next_u64(),
        ];
        for i in 0..all.len() {
            for j in i + 1..all.len() {
                assert_ne!(all[i], all[j], "streams {i} and {j} collide");
            }
        }
        assert_eq!(
            SplitMix64::derive(5, 3),
            SplitMix64::derive_path(5, &[3]),
            "derive is a path of one"
        );
    }

    #[test]
    fn uniform_helpers_stay_in_range_and_cover_it() {
        let mut r = SplitMix64::new(1);
        let mut seen = [false; 5];
        let mut sum = 0.0;
        let n = 20_000;
        for _ in 0..n {
            let f = r.next_f32();
            assert!((0.0..1.0).contains(&f));
            sum += f as f64;
            assert!((0.0..1.0).contains(&r.next_f64()));
            let v = r.inclusive(3, 7);
            assert!((3..=7).contains(&v));
            seen[(v - 3) as usize] = true;
            assert!(r.below(5) < 5);
        }
        assert!(
            seen.iter().all(|&s| s),
            "every value of 3..=7 drawn: {seen:?}"
        );
        let mean = sum / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        // The full range does not overflow the span computation.
        let _ = r.inclusive(0, u64::MAX);
    }

    #[test]
    fn normal_and_exponential_have_their_moments() {
        let mut r = SplitMix64::new(3);
        let n = 50_000;
        let xs: Vec<f64> = (0..n).map(|_| r.standard_normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
        let e = (0..n).map(|_| r.exponential(2.0)).sum::<f64>() / n as f64;
        assert!((e - 2.0).abs() < 0.05, "exponential mean {e}");
    }
}
