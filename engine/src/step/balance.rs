//! What one rank puts into a data-parallel step's gather, and the balance it derives
//! from it (metrics contract §6).

use std::time::Duration;

/// What one rank puts into a step's gather.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankLoad {
    /// Tokens the rank computes this step.
    pub tokens: u64,
    /// Causal (query, key) attention pairs of those tokens.
    pub attention_pairs: u64,
}

/// Balance of one step as seen from one rank (metrics contract §6).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpBalance {
    /// This rank's index.
    pub rank: usize,
    /// Ranks in the group.
    pub num_ranks: usize,
    /// Tokens of this rank.
    pub local_tokens: u64,
    /// Most tokens of any rank.
    pub max_tokens: u64,
    /// Tokens of all ranks.
    pub sum_tokens: u64,
    /// Attention pairs of this rank.
    pub local_attention_pairs: u64,
    /// Most attention pairs of any rank.
    pub max_attention_pairs: u64,
    /// Wall time this rank spent waiting at the step's barriers.
    pub sync_wait: Duration,
}

impl DpBalance {
    /// Tokens this rank was short of the busiest one (0 for the busiest).
    pub fn token_imbalance(&self) -> u64 {
        self.max_tokens - self.local_tokens
    }

    /// Attention pairs this rank was short of the busiest one.
    pub fn attention_pair_imbalance(&self) -> u64 {
        self.max_attention_pairs - self.local_attention_pairs
    }

    /// max · N / sum: 1.0 is perfect balance, N is one rank doing everything.
    pub fn token_imbalance_ratio(&self) -> f64 {
        self.max_tokens as f64 * self.num_ranks as f64 / self.sum_tokens as f64
    }

    /// Whether this rank computed anything this step.
    pub fn is_active(&self) -> bool {
        self.local_tokens > 0
    }
}
