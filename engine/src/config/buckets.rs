//! Histogram bucket families: the contract's defaults, and `--custom-histogram-buckets`
//! which replaces only the families it names.

use std::collections::BTreeMap;

/// A group of histograms that share bucket boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Whole-request and per-phase latencies (e2e, queue, prefill, decode, inference).
    RequestLatency,
    /// Time to first token.
    TimeToFirstToken,
    /// Inter-token latency and time per output token.
    InterTokenLatency,
    /// Tokens scheduled per step.
    IterationTokens,
    /// Prompt and generation tokens per request.
    RequestTokens,
    /// KV block lifetime, idle time before eviction, reuse gap.
    KvCacheResidency,
    /// Time a data-parallel rank waits at the step barrier.
    DpSyncWait,
    /// max · N / sum tokens across data-parallel ranks.
    DpImbalanceRatio,
    /// HTTP request durations of the frontend.
    HttpRequestDuration,
}

impl Family {
    /// Every family, in the order docs list them.
    pub const ALL: [Family; 9] = [
        Family::RequestLatency,
        Family::TimeToFirstToken,
        Family::InterTokenLatency,
        Family::IterationTokens,
        Family::RequestTokens,
        Family::KvCacheResidency,
        Family::DpSyncWait,
        Family::DpImbalanceRatio,
        Family::HttpRequestDuration,
    ];

    /// The name `--custom-histogram-buckets` uses.
    pub fn name(self) -> &'static str {
        match self {
            Family::RequestLatency => "request_latency",
            Family::TimeToFirstToken => "time_to_first_token",
            Family::InterTokenLatency => "inter_token_latency",
            Family::IterationTokens => "iteration_tokens",
            Family::RequestTokens => "request_tokens",
            Family::KvCacheResidency => "kv_cache_residency",
            Family::DpSyncWait => "dp_sync_wait",
            Family::DpImbalanceRatio => "dp_imbalance_ratio",
            Family::HttpRequestDuration => "http_request_duration",
        }
    }

    fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Default upper bounds. `max_model_len` scales the request-token family.
    pub fn default_buckets(self, max_model_len: usize) -> Vec<f64> {
        match self {
            Family::RequestLatency => vec![
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
            ],
            // Densest below 100 ms, where interactive TTFT targets live.
            Family::TimeToFirstToken => vec![
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
            ],
            Family::InterTokenLatency => vec![
                0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0,
            ],
            Family::IterationTokens => (0..=14).map(|p| (1u64 << p) as f64).collect(),
            Family::RequestTokens => one_two_five(max_model_len as f64),
            Family::KvCacheResidency => vec![
                0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0,
                30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
            ],
            Family::DpSyncWait => vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0,
            ],
            // SGLang's ladder for dp_attention_token_imbalance_ratio, whole: dense near 1
            // (balanced) and reaching 64 ranks with one busy rank.
            Family::DpImbalanceRatio => vec![
                1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0,
                64.0,
            ],
            Family::HttpRequestDuration => vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0, 600.0,
            ],
        }
    }
}

/// 1, 2, 5, 10, 20, 50, … up to and including the first value ≥ `max`.
fn one_two_five(max: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1.0;
    loop {
        for m in [1.0, 2.0, 5.0] {
            let v = m * scale;
            out.push(v);
            if v >= max {
                return out;
            }
        }
        scale *= 10.0;
    }
}

/// Bucket boundaries for every family.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    by_family: BTreeMap<Family, Vec<f64>>,
}

/// A `--custom-histogram-buckets` value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketsError {
    /// Not a JSON object of number arrays.
    #[error("expected a JSON object mapping family names to arrays of numbers: {0}")]
    Json(String),
    /// A name that is not a family.
    #[error("unknown histogram family {0:?}; families are: {families}", families = Family::ALL.map(Family::name).join(", "))]
    UnknownFamily(String),
    /// Empty, non-finite, or not strictly increasing.
    #[error("buckets of {0} must be a non-empty list of finite, strictly increasing numbers")]
    NotIncreasing(&'static str),
}

impl Buckets {
    /// The defaults.
    pub fn defaults(max_model_len: usize) -> Self {
        Self {
            by_family: Family::ALL
                .into_iter()
                .map(|f| (f, f.default_buckets(max_model_len)))
                .collect(),
        }
    }

    /// The defaults with the families named in `json` replaced.
    pub fn with_custom(max_model_len: usize, json: &str) -> Result<Self, BucketsError> {
        let mut b = Self::defaults(max_model_len);
        let parsed: BTreeMap<String, Vec<f64>> =
            serde_json::from_str(json).map_err(|e| BucketsError::Json(e.to_string()))?;
        for (name, values) in parsed {
            let family = Family::from_name(&name).ok_or(BucketsError::UnknownFamily(name))?;
            let increasing = values.windows(2).all(|w| w[0] < w[1]);
            if values.is_empty() || !increasing || values.iter().any(|v| !v.is_finite()) {
                return Err(BucketsError::NotIncreasing(family.name()));
            }
            b.by_family.insert(family, values);
        }
        Ok(b)
    }

    /// Boundaries of `family`.
    pub fn get(&self, family: Family) -> Vec<f64> {
        self.by_family[&family].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_increasing_and_match_the_contract_ranges() {
        let b = Buckets::defaults(4096);
        for f in Family::ALL {
            let v = b.get(f);
            assert!(v.windows(2).all(|w| w[0] < w[1]), "{f:?}");
        }
        assert_eq!(b.get(Family::RequestLatency).first(), Some(&0.3));
        assert_eq!(b.get(Family::RequestLatency).last(), Some(&7680.0));
        assert_eq!(b.get(Family::TimeToFirstToken).first(), Some(&0.001));
        assert_eq!(b.get(Family::TimeToFirstToken).last(), Some(&2560.0));
        assert_eq!(b.get(Family::InterTokenLatency).first(), Some(&0.01));
        assert_eq!(b.get(Family::IterationTokens).last(), Some(&16384.0));
        assert_eq!(b.get(Family::RequestTokens).last(), Some(&5000.0));
        assert_eq!(b.get(Family::KvCacheResidency).last(), Some(&1800.0));
        assert_eq!(
            b.get(Family::DpSyncWait),
            vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0
            ]
        );
        assert_eq!(
            b.get(Family::DpImbalanceRatio),
            vec![
                1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0,
                64.0
            ],
            "SGLang's ladder, whole"
        );
        let ttft = b.get(Family::TimeToFirstToken);
        assert!(
            ttft.iter().filter(|&&v| v <= 0.1).count() > ttft.len() / 3,
            "densest below 0.1 s"
        );
    }

    #[test]
    fn custom_replaces_only_named_families() {
        let b = Buckets::with_custom(1024, r#"{"time_to_first_token": [0.5, 1, 2]}"#).unwrap();
        assert_eq!(b.get(Family::TimeToFirstToken), vec![0.5, 1.0, 2.0]);
        assert_eq!(
            b.get(Family::InterTokenLatency),
            Family::InterTokenLatency.default_buckets(1024)
        );
    }

    #[test]
    fn bad_custom_values_name_the_family() {
        let e = Buckets::with_custom(1024, r#"{"ttft": [1]}"#).unwrap_err();
        assert!(e.to_string().contains("\"ttft\""), "{e}");
        let e = Buckets::with_custom(1024, r#"{"iteration_tokens": [4, 2]}"#).unwrap_err();
        assert!(e.to_string().contains("iteration_tokens"), "{e}");
        assert!(Buckets::with_custom(1024, r#"{"request_latency": []}"#).is_err());
        assert!(matches!(
            Buckets::with_custom(1024, "[1]"),
            Err(BucketsError::Json(_))
        ));
    }
}
