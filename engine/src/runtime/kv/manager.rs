//! Per-rank KV cache manager: which blocks each request holds, prefix-cache lookups, and
//! the take-and-reset prefix-cache counters the step snapshot carries.

use std::collections::HashMap;

use super::block_pool::{BlockId, BlockPool};
use super::hash::BlockHash;

use crate::step::events::RequestId;
use crate::step::kv::PrefixCacheStats;

/// The cached blocks covering a request's longest known prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// Blocks, first to last.
    pub blocks: Vec<BlockId>,
    /// Tokens they cover (`blocks.len() * block_size`).
    pub num_tokens: usize,
}

#[derive(Debug, Default)]
struct Held {
    blocks: Vec<BlockId>,
    /// Leading blocks already registered in the prefix cache.
    num_hashed: usize,
}

/// Hands KV blocks to the requests of one rank.
#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    held: HashMap<RequestId, Held>,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    /// A manager over a fresh pool.
    pub fn new(num_blocks: usize, block_size: usize, enable_caching: bool) -> Self {
        assert!(block_size > 0);
        Self {
            pool: BlockPool::new(num_blocks, enable_caching),
            block_size,
            held: HashMap::new(),
            stats: PrefixCacheStats::default(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The pool, for counts and usage.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Samples KV residency of a `rate` fraction of block allocations.
    pub fn track_residency(&mut self, rate: f64, seed: u64) {
        self.pool.track_residency(rate, seed);
    }

    /// Residency samples since the last call.
    pub fn take_residency(&mut self) -> Vec<super::ResidencySample> {
        self.pool.take_residency()
    }

    /// Blocks held by `req`, in token order.
    pub fn block_table(&self, req: RequestId) -> &[BlockId] {
        self.held.get(&req).map_or(&[], |h| &h.blocks)
    }

    /// Number of requests holding blocks.
    pub fn num_requests(&self) -> usize {
        self.held.len()
    }

    /// Longest cached prefix for a request with `num_tokens` known tokens whose full blocks
    /// hash to `block_hashes`. At least one token is always left to compute, because the
    /// step that computes it produces the logits the next token is sampled from.
    pub fn find_cached_prefix(
        &self,
        block_hashes: &[BlockHash],
        num_tokens: usize,
    ) -> CachedPrefix {
        let mut prefix = CachedPrefix::default();
        if !self.pool.caching_enabled() || num_tokens == 0 {
            return prefix;
        }
        let max_blocks = ((num_tokens - 1) / self.block_size).min(block_hashes.len());
        for &h in &block_hashes[..max_blocks] {
            match self.pool.lookup(h) {
                Some(id) => prefix.blocks.push(id),
                None => break,
            }
        }
        prefix.num_tokens = prefix.blocks.len() * self.block_size;
        prefix
    }

    /// Counts one lookup in the take-and-reset stats. Called once per lookup that led to a
    /// scheduled request, so a request that waits and retries is not counted twice.
    pub fn record_lookup(
        &mut self,
        resumed_after_preemption: bool,
        queried_tokens: usize,
        hit_tokens: usize,
    ) {
        let s = &mut self.stats;
        if resumed_after_preemption {
            s.preempted_requests += 1;
            s.preempted_queries += queried_tokens as u64;
            s.preempted_hits += hit_tokens as u64;
        } else {
            s.requests += 1;
            s.queries += queried_tokens as u64;
            s.hits += hit_tokens as u64;
        }
    }

    /// Gives `req` room for `num_new` more tokens on top of `num_computed` computed ones
    /// and, for a request starting now, the cached `prefix` (which then counts as computed).
    /// Registers every block that becomes full in the prefix cache. Returns false and
    /// changes nothing when the pool cannot supply the blocks.
    pub fn allocate_slots(
        &mut self,
        req: RequestId,
        num_computed: usize,
        prefix: &CachedPrefix,
        num_new: usize,
        block_hashes: &[BlockHash],
    ) -> bool {
        let held_now = self.held.get(&req).map_or(0, |h| h.blocks.len());
        let total_tokens = num_computed + prefix.num_tokens + num_new;
        let needed = total_tokens.div_ceil(self.block_size);
        let fresh = needed.saturating_sub(held_now + prefix.blocks.len());
        // Hitting an unreferenced cached block takes it out of the free queue too.
        let prefix_from_free = prefix
            .blocks
            .iter()
            .filter(|&&b| self.pool.is_free(b))
            .count();
        if fresh + prefix_from_free > self.pool.num_free() {
            return false;
        }
        self.pool.touch(&prefix.blocks);
        let new_blocks = self.pool.allocate(fresh).expect("checked free count");
        let held = self.held.entry(req).or_default();
        if !prefix.blocks.is_empty() {
            debug_assert!(
                held.blocks.is_empty(),
                "a cached prefix is only for a starting request"
            );
            // Hit blocks are cached already.
            held.blocks.extend_from_slice(&prefix.blocks);
            held.num_hashed = prefix.blocks.len();
        }
        held.blocks.extend(new_blocks);
        // Blocks whose every token is known (scheduled now or earlier) can be shared: in a
        // step, all K/V are written before attention reads them.
        let full = (total_tokens / self.block_size).min(block_hashes.len());
        for (&block, &hash) in held.blocks[held.num_hashed..full]
            .iter()
            .zip(&block_hashes[held.num_hashed..full])
        {
            self.pool.cache_block(block, hash);
        }
        held.num_hashed = held.num_hashed.max(full);
        true
    }

    /// Releases every block of `req` (finish, abort or preemption). Blocks are released tail
    /// first so the shared head of a prompt stays cached longest.
    pub fn free(&mut self, req: RequestId) {
        if let Some(held) = self.held.remove(&req) {
            self.pool.free(held.blocks.into_iter().rev());
        }
    }

    /// Forgets all cached prefixes; refused while any request holds blocks.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let done = self.pool.reset_prefix_cache();
        self.stats.resets += done as u64;
        done
    }

    /// Returns the prefix-cache counters accumulated since the last call, and zeroes them.
    pub fn take_stats(&mut self) -> PrefixCacheStats {
        std::mem::take(&mut self.stats)
    }

    /// Checks pool invariants and that reference counts equal the holders; for tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        self.pool.check_invariants();
        let mut refs: HashMap<BlockId, u32> = HashMap::new();
        for held in self.held.values() {
            let mut distinct = held.blocks.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(
                distinct.len(),
                held.blocks.len(),
                "a request holds a block twice"
            );
            for &b in &held.blocks {
                *refs.entry(b).or_default() += 1;
            }
        }
        for b in 0..self.pool.num_blocks() as BlockId {
            assert_eq!(
                self.pool.ref_cnt(b),
                refs.get(&b).copied().unwrap_or(0),
                "block {b} ref count"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::kv::hash::hash_block;
    use proptest::prelude::*;

    fn hashes(tokens: &[u32], bs: usize) -> Vec<BlockHash> {
        let mut out: Vec<BlockHash> = Vec::new();
        for chunk in tokens.chunks_exact(bs) {
            out.push(hash_block(out.last().copied(), chunk));
        }
        out
    }

    #[test]
    fn shared_prefix_reuses_blocks_and_leaves_one_token_to_compute() {
        let bs = 4;
        let mut m = KvCacheManager::new(16, bs, true);
        let a: Vec<u32> = (0..10).collect();
        let ha = hashes(&a, bs);
        assert!(m.allocate_slots(1, 0, &CachedPrefix::default(), a.len(), &ha));
        // Same first 8 tokens, different tail.
        let mut b = a[..8].to_vec();
        b.extend([99, 98, 97]);
        let hb = hashes(&b, bs);
        let p = m.find_cached_prefix(&hb, b.len());
        assert_eq!(p.num_tokens, 8);
        assert_eq!(p.blocks, m.block_table(1)[..2].to_vec());
        assert!(m.allocate_slots(2, 0, &p, b.len() - 8, &hb));
        assert_eq!(m.block_table(2)[..2], m.block_table(1)[..2]);
        assert_eq!(m.pool().ref_cnt(m.block_table(1)[0]), 2);
        // A prompt of exactly two full cached blocks still recomputes its last block.
        let p = m.find_cached_prefix(&ha[..2], 8);
        assert_eq!(p.num_tokens, 4);
        m.check_invariants();
    }

    #[test]
    fn failed_allocation_changes_nothing() {
        let mut m = KvCacheManager::new(2, 4, true);
        assert!(!m.allocate_slots(1, 0, &CachedPrefix::default(), 9, &[]));
        assert_eq!(m.num_requests(), 0);
        assert_eq!(m.pool().num_free(), 2);
        m.check_invariants();
    }

    #[test]
    fn freed_prefix_stays_cached_until_evicted() {
        let bs = 2;
        let mut m = KvCacheManager::new(4, bs, true);
        let t = [1, 2, 3, 4, 5];
        let h = hashes(&t, bs);
        assert!(m.allocate_slots(1, 0, &CachedPrefix::default(), 5, &h));
        m.free(1);
        assert_eq!(m.pool().counts().evictable, 2);
        assert_eq!(m.find_cached_prefix(&h, 5).num_tokens, 4);
        // A request that needs the whole pool evicts the cache.
        assert!(m.allocate_slots(2, 0, &CachedPrefix::default(), 8, &[]));
        assert_eq!(m.find_cached_prefix(&h, 5).num_tokens, 0);
        m.check_invariants();
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Start a request whose tokens come from a small alphabet (so prefixes repeat).
        Start(Vec<u32>),
        /// Decode one more token for the i-th live request.
        Grow(usize, u32),
        /// Finish, abort or preempt the i-th live request.
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            prop::collection::vec(0u32..3, 1..24).prop_map(Op::Start),
            (any::<usize>(), 0u32..3).prop_map(|(i, t)| Op::Grow(i, t)),
            any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// No leak, no double free, exact reference counts, hits reuse blocks, only
        /// unreferenced blocks are evicted, and freeing everything returns every block.
        #[test]
        fn block_accounting_holds_under_random_operations(ops in prop::collection::vec(op(), 1..60), caching in any::<bool>()) {
            let bs = 3;
            let mut m = KvCacheManager::new(12, bs, caching);
            // Live requests: id, tokens, blocks it expects to still be its own.
            let mut live: Vec<(RequestId, Vec<u32>)> = Vec::new();
            let mut next_id = 0;
            for op in ops {
                match op {
                    Op::Start(tokens) => {
                        let h = hashes(&tokens, bs);
                        let p = m.find_cached_prefix(&h, tokens.len());
                        prop_assert!(p.num_tokens < tokens.len());
                        // Every hit is a block a live or freed request filled with these tokens.
                        for (i, &b) in p.blocks.iter().enumerate() {
                            prop_assert_eq!(m.pool().lookup(h[i]), Some(b));
                        }
                        let free_before = m.pool().num_free();
                        if m.allocate_slots(next_id, 0, &p, tokens.len() - p.num_tokens, &h) {
                            prop_assert_eq!(m.block_table(next_id).len(), tokens.len().div_ceil(bs));
                            live.push((next_id, tokens));
                        } else {
                            prop_assert_eq!(m.pool().num_free(), free_before);
                        }
                        next_id += 1;
                    }
                    Op::Grow(i, t) if !live.is_empty() => {
                        let n = live.len();
                        let (id, tokens) = &mut live[i % n];
                        let before = m.block_table(*id).to_vec();
                        tokens.push(t);
                        let h = hashes(tokens, bs);
                        if m.allocate_slots(*id, tokens.len() - 1, &CachedPrefix::default(), 1, &h) {
                            // Growing never moves existing blocks.
                            prop_assert_eq!(&m.block_table(*id)[..before.len()], &before[..]);
                        } else {
                            tokens.pop();
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (id, _) = live.swap_remove(i % live.len());
                        m.free(id);
                    }
                    _ => {}
                }
                m.check_invariants();
                // Every live request's blocks are referenced, so none of them was evicted, and
                // each of its full blocks is findable in the cache (by it or an equal block).
                for (id, tokens) in &live {
                    for &b in m.block_table(*id) {
                        prop_assert!(m.pool().ref_cnt(b) > 0);
                    }
                    if caching {
                        for h in hashes(tokens, bs) {
                            prop_assert!(m.pool().lookup(h).is_some());
                        }
                    }
                }
            }
            for (id, _) in live.drain(..) {
                m.free(id);
            }
            m.check_invariants();
            prop_assert_eq!(m.pool().num_free(), 12);
            prop_assert_eq!(m.pool().counts().used, 0);
        }
    }
}
