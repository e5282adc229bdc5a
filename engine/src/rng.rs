//! A small deterministic random number generator.
//!
//! Synthetic weights and seeded sampling must give the same numbers on every machine and
//! every release, so the engine owns its generator instead of depending on a crate whose
//! stream may change between versions. SplitMix64 is tiny, fast and passes BigCrush, which is
//! plenty for weights and sampling.

/// SplitMix64: a 64-bit state advanced by a Weyl sequence and mixed by a finaliser.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose stream depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for a named sub-stream, so independent consumers (one weight matrix, one
    /// request) derive their own streams from one seed without overlapping.
    pub fn derive(seed: u64, stream: u64) -> Self {
        let mut base = Self::new(seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        base.next_u64();
        base
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 24 bits of precision (exactly representable as f32).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n). `n` must be non-zero.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        // Multiply-shift: unbiased enough for test workloads and weights (bias < n / 2^64).
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let a: Vec<u64> = (0..4).map(|_| SplitMix64::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut x = SplitMix64::derive(7, 1);
        let mut y = SplitMix64::derive(7, 2);
        assert_ne!(x.next_u64(), y.next_u64());
    }

    #[test]
    fn floats_in_unit_interval_with_plausible_mean() {
        let mut r = SplitMix64::new(1);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let v = r.next_f32();
            assert!((0.0..1.0).contains(&v));
            sum += v as f64;
        }
        let mean = sum / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = SplitMix64::new(3);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = r.below(5) as usize;
            seen[v] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }
}
