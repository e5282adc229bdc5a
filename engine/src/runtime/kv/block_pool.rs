//! A fixed pool of KV blocks: reference counts, an LRU queue of free blocks, and the map
//! from content hash to cached block.
//!
//! A block is in exactly one of three states:
//! - **used**: referenced by at least one live request (`ref_cnt > 0`);
//! - **evictable**: unreferenced but still holding a cached prefix (in the free queue, hashed);
//! - **available**: unreferenced and empty (in the free queue, no hash).
//!
//! The free queue holds evictable and available blocks together, least recently freed first,
//! so allocation always reuses the block whose cached content is least likely to be wanted.
//! A prefix-cache hit on an evictable block takes it out of the queue in O(1).

use std::collections::HashMap;
use std::time::Instant;

use super::hash::BlockHash;
use crate::step::kv::{PoolCounts, ResidencySample};
use ballast_rng::SplitMix64;

/// Index of a block in the pool.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    in_free_queue: bool,
}

#[derive(Debug, Clone, Copy)]
struct BlockTimes {
    sampled: bool,
    born: Instant,
    last_use: Instant,
}

/// Residency tracking for a sampled fraction of blocks.
#[derive(Debug)]
struct Residency {
    rate: f64,
    rng: SplitMix64,
    times: Vec<BlockTimes>,
    samples: Vec<ResidencySample>,
}

/// The block pool of one rank.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    num_evictable: usize,
    cached: HashMap<BlockHash, BlockId>,
    /// Further blocks with the same content as the one in `cached` (two requests computed
    /// the same prefix before either was registered). They take over when it is evicted, so
    /// the content stays findable as long as any copy is in use.
    duplicates: HashMap<BlockHash, Vec<BlockId>>,
    enable_caching: bool,
    evictions: u64,
    residency: Option<Residency>,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks.
    pub fn new(num_blocks: usize, enable_caching: bool) -> Self {
        assert!(num_blocks < NIL as usize, "too many blocks");
        let mut pool = Self {
            blocks: vec![
                Block {
                    ref_cnt: 0,
                    hash: None,
                    prev: NIL,
                    next: NIL,
                    in_free_queue: false,
                };
                num_blocks
            ],
            head: NIL,
            tail: NIL,
            num_free: 0,
            num_evictable: 0,
            cached: HashMap::new(),
            duplicates: HashMap::new(),
            enable_caching,
            evictions: 0,
            residency: None,
        };
        for id in 0..num_blocks as u32 {
            pool.push_back(id);
        }
        pool
    }

    /// Samples KV residency of a `rate` fraction of allocations (0..=1), seeded by `seed`.
    pub fn track_residency(&mut self, rate: f64, seed: u64) {
        let now = Instant::now();
        self.residency = Some(Residency {
            rate: rate.clamp(0.0, 1.0),
            rng: SplitMix64::new(seed),
            times: vec![
                BlockTimes {
                    sampled: false,
                    born: now,
                    last_use: now,
                };
                self.blocks.len()
            ],
            samples: Vec::new(),
        });
    }

    /// Residency samples since the last call (take-and-reset).
    pub fn take_residency(&mut self) -> Vec<ResidencySample> {
        self.residency
            .as_mut()
            .map(|r| std::mem::take(&mut r.samples))
            .unwrap_or_default()
    }

    /// Size of the pool.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Unreferenced blocks (available or evictable): what an allocation can take.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Whether prefix caching is on.
    pub fn caching_enabled(&self) -> bool {
        self.enable_caching
    }

    /// Counts by state.
    pub fn counts(&self) -> PoolCounts {
        PoolCounts {
            used: self.blocks.len() - self.num_free,
            evictable: self.num_evictable,
            available: self.num_free - self.num_evictable,
            total: self.blocks.len(),
        }
    }

    /// Fraction of blocks referenced by live requests; evictable blocks count as free.
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        (self.blocks.len() - self.num_free) as f64 / self.blocks.len() as f64
    }

    /// Cached blocks evicted so far (lifetime count).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Reference count of a block.
    pub fn ref_cnt(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_cnt
    }

    /// The block holding the content `hash`, if cached.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        if !self.enable_caching {
            return None;
        }
        self.cached.get(&hash).copied()
    }

    /// Whether a block is unreferenced (so taking it reduces [`Self::num_free`]).
    pub fn is_free(&self, id: BlockId) -> bool {
        self.blocks[id as usize].ref_cnt == 0
    }

    /// Adds a reference to each of `ids` (prefix-cache hits), taking unreferenced ones out of
    /// the free queue.
    pub fn touch(&mut self, ids: &[BlockId]) {
        for &id in ids {
            if self.blocks[id as usize].ref_cnt == 0 {
                self.unlink(id);
            }
            self.blocks[id as usize].ref_cnt += 1;
        }
        if let Some(r) = &mut self.residency {
            let now = Instant::now();
            for &id in ids {
                let t = &mut r.times[id as usize];
                if t.sampled {
                    r.samples.push(ResidencySample::ReuseGap(
                        now.saturating_duration_since(t.last_use),
                    ));
                    t.last_use = now;
                }
            }
        }
    }

    /// Takes `n` blocks from the front of the free queue, evicting cached content, each with
    /// one reference. Returns `None` (and changes nothing) if fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.head;
            self.unlink(id);
            let evicted = self.blocks[id as usize].hash.take();
            if let Some(h) = evicted {
                self.forget(h, id);
                self.evictions += 1;
            }
            if let Some(r) = &mut self.residency {
                let now = Instant::now();
                let t = &mut r.times[id as usize];
                if t.sampled && evicted.is_some() {
                    r.samples.push(ResidencySample::Lifetime(
                        now.saturating_duration_since(t.born),
                    ));
                    r.samples.push(ResidencySample::IdleBeforeEvict(
                        now.saturating_duration_since(t.last_use),
                    ));
                }
                *t = BlockTimes {
                    sampled: r.rng.next_f64() < r.rate,
                    born: now,
                    last_use: now,
                };
            }
            self.blocks[id as usize].ref_cnt = 1;
            out.push(id);
        }
        Some(out)
    }

    /// Drops one reference from each of `ids`, in the order given; blocks that reach zero
    /// join the back of the free queue (callers pass a request's blocks tail first, so its
    /// last blocks are evicted before its shared head).
    pub fn free(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            let block = &mut self.blocks[id as usize];
            assert!(block.ref_cnt > 0, "double free of block {id}");
            block.ref_cnt -= 1;
            if block.ref_cnt == 0 {
                self.push_back(id);
                if let Some(r) = &mut self.residency
                    && r.times[id as usize].sampled
                {
                    r.times[id as usize].last_use = Instant::now();
                }
            }
        }
    }

    /// Records that block `id` (referenced, full) holds the content `hash`. If another block
    /// already caches that content, lookups keep returning that one and `id` becomes its
    /// stand-in for when it is evicted.
    pub fn cache_block(&mut self, id: BlockId, hash: BlockHash) {
        if !self.enable_caching || self.blocks[id as usize].hash.is_some() {
            return;
        }
        self.blocks[id as usize].hash = Some(hash);
        match self.cached.entry(hash) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(id);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.duplicates.entry(hash).or_default().push(id);
            }
        }
    }

    /// Removes block `id` as a holder of `hash`, promoting a duplicate if there is one.
    fn forget(&mut self, hash: BlockHash, id: BlockId) {
        if self.cached.get(&hash) == Some(&id) {
            match self.duplicates.get_mut(&hash).and_then(Vec::pop) {
                Some(next) => {
                    self.cached.insert(hash, next);
                }
                None => {
                    self.cached.remove(&hash);
                }
            }
        } else if let Some(d) = self.duplicates.get_mut(&hash) {
            d.retain(|&b| b != id);
        }
        if self.duplicates.get(&hash).is_some_and(Vec::is_empty) {
            self.duplicates.remove(&hash);
        }
    }

    /// Forgets every cached prefix. Refused (returns false) while any block is in use, since
    /// a used block's hash may be about to be shared.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free != self.blocks.len() {
            return false;
        }
        self.cached.clear();
        self.duplicates.clear();
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.num_evictable = 0;
        true
    }

    fn push_back(&mut self, id: BlockId) {
        let tail = self.tail;
        let block = &mut self.blocks[id as usize];
        debug_assert!(!block.in_free_queue);
        block.in_free_queue = true;
        block.prev = tail;
        block.next = NIL;
        let hashed = block.hash.is_some();
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
        if hashed {
            self.num_evictable += 1;
        }
    }

    fn unlink(&mut self, id: BlockId) {
        let Block {
            prev,
            next,
            in_free_queue,
            hash,
            ..
        } = self.blocks[id as usize];
        assert!(in_free_queue, "block {id} is not free");
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let block = &mut self.blocks[id as usize];
        block.in_free_queue = false;
        block.prev = NIL;
        block.next = NIL;
        self.num_free -= 1;
        if hash.is_some() {
            self.num_evictable -= 1;
        }
    }

    /// Checks every invariant; used by tests after each operation.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let mut seen = 0;
        let mut evictable = 0;
        let mut cur = self.head;
        let mut prev = NIL;
        while cur != NIL {
            let b = &self.blocks[cur as usize];
            assert!(
                b.in_free_queue && b.ref_cnt == 0,
                "block {cur} in queue with refs"
            );
            assert_eq!(b.prev, prev);
            evictable += b.hash.is_some() as usize;
            seen += 1;
            prev = cur;
            cur = b.next;
        }
        assert_eq!(prev, self.tail);
        assert_eq!(seen, self.num_free);
        assert_eq!(evictable, self.num_evictable);
        for (i, b) in self.blocks.iter().enumerate() {
            assert_eq!(b.in_free_queue, b.ref_cnt == 0, "block {i}");
            if let Some(h) = b.hash {
                let id = i as u32;
                let mapped = self.cached.get(&h) == Some(&id)
                    || self.duplicates.get(&h).is_some_and(|d| d.contains(&id));
                assert!(mapped, "block {i} hash not mapped");
            }
        }
        for (h, &id) in &self.cached {
            assert_eq!(self.blocks[id as usize].hash, Some(*h));
        }
        for (h, ids) in &self.duplicates {
            assert!(!ids.is_empty() && self.cached.contains_key(h));
            for &id in ids {
                assert_eq!(self.blocks[id as usize].hash, Some(*h));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn allocation_takes_least_recently_freed_first() {
        let mut p = BlockPool::new(4, true);
        let a = p.allocate(4).unwrap();
        assert_eq!(a, vec![0, 1, 2, 3]);
        assert!(p.allocate(1).is_none());
        p.free([2, 0]);
        assert_eq!(p.allocate(1).unwrap(), vec![2]);
        p.check_invariants();
    }

    #[test]
    fn cached_blocks_are_evictable_and_hits_remove_them_from_the_queue() {
        let mut p = BlockPool::new(3, true);
        let a = p.allocate(2).unwrap();
        p.cache_block(a[0], 11);
        p.free(a.iter().rev().copied());
        assert_eq!(
            p.counts(),
            PoolCounts {
                used: 0,
                evictable: 1,
                available: 2,
                total: 3
            }
        );
        assert_eq!(p.usage(), 0.0);
        let hit = p.lookup(11).unwrap();
        p.touch(&[hit]);
        assert_eq!(p.counts().used, 1);
        assert_eq!(p.num_free(), 2);
        p.check_invariants();
        // Allocating everything else never evicts the referenced cached block.
        p.allocate(2).unwrap();
        assert_eq!(p.lookup(11), Some(hit));
        p.check_invariants();
    }

    #[test]
    fn eviction_forgets_the_hash() {
        let mut p = BlockPool::new(1, true);
        let a = p.allocate(1).unwrap();
        p.cache_block(a[0], 5);
        p.free(a);
        assert!(p.lookup(5).is_some());
        p.allocate(1).unwrap();
        assert!(p.lookup(5).is_none());
        assert_eq!(p.evictions(), 1);
        p.check_invariants();
    }

    #[test]
    fn duplicate_content_stays_findable_after_the_first_copy_is_evicted() {
        let mut p = BlockPool::new(3, true);
        let a = p.allocate(2).unwrap();
        p.cache_block(a[0], 9);
        p.cache_block(a[1], 9);
        assert_eq!(p.lookup(9), Some(a[0]));
        p.free([a[0]]);
        // The free queue's head is block 2, then a[0]: allocating two evicts a[0].
        p.allocate(2).unwrap();
        assert_eq!(p.lookup(9), Some(a[1]));
        p.check_invariants();
    }

    #[test]
    fn residency_samples_lifetime_idle_and_reuse_of_sampled_blocks() {
        let mut p = BlockPool::new(1, true);
        p.track_residency(1.0, 0);
        let a = p.allocate(1).unwrap();
        p.cache_block(a[0], 3);
        p.free(a.clone());
        std::thread::sleep(Duration::from_millis(5));
        p.touch(&a); // prefix hit
        p.free(a);
        let s = p.take_residency();
        assert!(matches!(s[..], [ResidencySample::ReuseGap(g)] if g >= Duration::from_millis(5)));
        p.allocate(1).unwrap(); // evicts the cached content
        let s = p.take_residency();
        assert!(
            matches!(s[..], [ResidencySample::Lifetime(l), ResidencySample::IdleBeforeEvict(i)] if l >= Duration::from_millis(5) && i <= l)
        );
        assert!(p.take_residency().is_empty(), "take-and-reset");
        let mut none = BlockPool::new(4, true);
        none.track_residency(0.0, 0);
        let b = none.allocate(4).unwrap();
        none.free(b);
        none.allocate(4).unwrap();
        assert!(none.take_residency().is_empty(), "rate 0 samples nothing");
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut p = BlockPool::new(2, true);
        let a = p.allocate(1).unwrap();
        p.free(a.clone());
        p.free(a);
    }

    #[test]
    fn reset_refused_while_in_use() {
        let mut p = BlockPool::new(2, true);
        let a = p.allocate(1).unwrap();
        p.cache_block(a[0], 1);
        assert!(!p.reset_prefix_cache());
        p.free(a);
        assert!(p.reset_prefix_cache());
        assert!(p.lookup(1).is_none());
        p.check_invariants();
    }
}
