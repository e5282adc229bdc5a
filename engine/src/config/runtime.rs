//! The runtime's settings, plain data the flags fill: one rank's scheduler limits, the
//! front door's queue limits and how requests are spread over ranks.

/// Limits of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most requests in the running batch.
    pub max_num_seqs: usize,
    /// Most tokens computed per step.
    pub max_num_batched_tokens: usize,
    /// Longest sequence; a request reaching it finishes with `length`.
    pub max_model_len: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks of this rank.
    pub num_blocks: usize,
    /// Share full blocks between requests with equal prefixes.
    pub enable_prefix_caching: bool,
}

/// Limits of the front door; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// `--max-queued-requests`.
    pub max_queued_requests: Option<usize>,
    /// `--max-queued-tokens` (prompt tokens of queued requests).
    pub max_queued_tokens: Option<usize>,
}

/// How requests are spread over ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DispatchPolicy {
    /// Weighted round robin.
    RoundRobin,
    /// Fewest outstanding tokens per unit of weight.
    LeastTokens,
}
