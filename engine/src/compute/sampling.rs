//! Sampling: per-request parameters and the reference sampler every backend must match.

use ballast_rng::SplitMix64;

/// Temperatures at or below this are greedy (argmax), as in vLLM.
pub const GREEDY_EPSILON: f32 = 1e-5;

/// How to pick the next token from one row of logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleSpec {
    /// 0 (or below [`GREEDY_EPSILON`]) is greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: u32,
}

impl Default for SampleSpec {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
        }
    }
}

impl SampleSpec {
    /// True when the spec picks the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= GREEDY_EPSILON
    }
}

/// One sampling row of a step: the request's sampler and its own generator, copied out of
/// the request for the step and written back after, so a request's draws do not depend on
/// which other requests share its batch.
#[derive(Debug, Clone)]
pub struct SamplingSlot {
    /// The sampler.
    pub spec: SampleSpec,
    /// The request's generator.
    pub rng: SplitMix64,
    /// Tokens that must not be sampled this step (EOS and stop tokens before `min_tokens`).
    pub suppress: Option<std::sync::Arc<[u32]>>,
}

/// Everything a request says about generation: the sampler and when to stop.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// The sampler.
    pub spec: SampleSpec,
    /// Seed of the request's own generator; `None` derives one from the engine seed.
    pub seed: Option<u64>,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// EOS and stop tokens are ignored until this many tokens were generated.
    pub min_tokens: u32,
    /// Keep generating through EOS (benchmarks).
    pub ignore_eos: bool,
    /// Extra token ids that end generation.
    pub stop_token_ids: Vec<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            spec: SampleSpec::default(),
            seed: None,
            max_tokens: 16,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
        }
    }
}

/// Index of the largest value; the lowest index wins ties so greedy output is
/// reproducible.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Picks one token from `logits` with `spec`, never one of `suppress` (EOS and stop tokens
/// before `min_tokens`), drawing from `rng` only when not greedy.
///
/// Suppressed tokens are masked in place (their logits become −∞) before anything else, so
/// the cost of `suppress` is one write per listed token, not a search per vocabulary entry.
///
/// Order of filters follows vLLM: temperature, then top-k, then top-p over the top-k
/// survivors, then one categorical draw.
pub fn sample_row(
    logits: &mut [f32],
    spec: &SampleSpec,
    suppress: &[u32],
    rng: &mut SplitMix64,
) -> u32 {
    for &t in suppress {
        if let Some(v) = logits.get_mut(t as usize) {
            *v = f32::NEG_INFINITY;
        }
    }
    if spec.is_greedy() {
        return argmax(logits);
    }
    let inv_t = 1.0 / spec.temperature;
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, v * inv_t))
        .collect();
    if cand.is_empty() {
        return argmax(logits);
    }
    let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let k = spec.top_k as usize;
    if k > 0 && k < cand.len() {
        cand.select_nth_unstable_by(k - 1, by_logit_desc);
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_logit_desc);
    let max = cand[0].1;
    let mut total = 0.0f64;
    let mut probs: Vec<f64> = cand
        .iter()
        .map(|&(_, v)| {
            let p = ((v - max) as f64).exp();
            total += p;
            p
        })
        .collect();
    if spec.top_p < 1.0 {
        let threshold = spec.top_p as f64 * total;
        let mut cumulative = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            cumulative += p;
            if cumulative >= threshold {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        total = probs.iter().sum();
    }
    let mut u = rng.next_f64() * total;
    for (i, p) in probs.iter().enumerate() {
        if u < *p {
            return cand[i].0;
        }
        u -= p;
    }
    cand[probs.len() - 1].0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(temperature: f32, top_p: f32, top_k: u32) -> SampleSpec {
        SampleSpec {
            temperature,
            top_p,
            top_k,
        }
    }

    #[test]
    fn greedy_picks_first_maximum() {
        let mut r = SplitMix64::new(0);
        assert_eq!(
            sample_row(&mut [0.1, 3.0, 3.0, -1.0], &spec(0.0, 1.0, 0), &[], &mut r),
            1
        );
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut r = SplitMix64::new(9);
        for _ in 0..50 {
            assert_eq!(
                sample_row(&mut [0.0, 0.5, 0.4], &spec(1.0, 1.0, 1), &[], &mut r),
                1
            );
        }
    }

    #[test]
    fn top_p_excludes_the_tail() {
        // Probabilities ≈ [0.665, 0.245, 0.09]: top_p 0.7 keeps the first two only.
        let logits = [2.0, 1.0, 0.0];
        let mut r = SplitMix64::new(1);
        let mut seen = [0u32; 3];
        for _ in 0..2000 {
            seen[sample_row(&mut logits.clone(), &spec(1.0, 0.7, 0), &[], &mut r) as usize] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[1] > 400 && seen[0] > 1000, "{seen:?}");
    }

    #[test]
    fn frequencies_follow_softmax() {
        let logits = [0.0f32, (2.0f32).ln()]; // probabilities 1/3, 2/3
        let mut r = SplitMix64::new(5);
        let n = 30_000;
        let ones = (0..n)
            .filter(|_| sample_row(&mut logits.clone(), &spec(1.0, 1.0, 0), &[], &mut r) == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 2.0 / 3.0).abs() < 0.02, "{frac}");
    }

    #[test]
    fn suppressed_tokens_are_never_picked() {
        let mut r = SplitMix64::new(2);
        let logits = [5.0, 1.0, 0.5];
        assert_eq!(
            sample_row(&mut logits.clone(), &spec(0.0, 1.0, 0), &[0], &mut r),
            1
        );
        for _ in 0..200 {
            assert_ne!(
                sample_row(&mut logits.clone(), &spec(2.0, 1.0, 0), &[0], &mut r),
                0
            );
        }
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut r = SplitMix64::new(seed);
            (0..20)
                .map(|_| sample_row(&mut logits.clone(), &spec(0.8, 0.95, 20), &[], &mut r))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }
}
