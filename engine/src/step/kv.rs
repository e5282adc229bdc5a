//! The KV cache's numbers a step reports: block counts by state, prefix-cache activity
//! and block residency samples.

use std::time::Duration;

/// Prefix-cache activity since the last [`crate::runtime::kv::KvCacheManager::take_stats`] (take-and-reset: a
/// step's snapshot carries only what happened in that step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Requests that looked up the cache.
    pub requests: u64,
    /// Tokens looked up.
    pub queries: u64,
    /// Tokens found cached.
    pub hits: u64,
    /// Same three for requests resuming after a preemption, kept apart so recomputation does
    /// not inflate the hit rate.
    pub preempted_requests: u64,
    /// Tokens looked up by resuming requests.
    pub preempted_queries: u64,
    /// Tokens found cached by resuming requests.
    pub preempted_hits: u64,
    /// Successful resets of the prefix cache (consumers of hit-rate windows start over).
    pub resets: u64,
}

/// A KV residency observation of a sampled block (`--kv-cache-metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResidencySample {
    /// Allocation to eviction of cached content.
    Lifetime(Duration),
    /// Last use (release or prefix hit) to eviction.
    IdleBeforeEvict(Duration),
    /// Time between two uses: release or hit, then a prefix hit.
    ReuseGap(Duration),
}

/// Block counts by state; `used + evictable + available == total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Blocks referenced by live requests.
    pub used: usize,
    /// Unreferenced blocks that still hold a cached prefix.
    pub evictable: usize,
    /// Unreferenced empty blocks.
    pub available: usize,
    /// Size of the pool.
    pub total: usize,
}
