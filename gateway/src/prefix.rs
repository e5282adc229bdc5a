//! Prefix affinity without a tokenizer: which endpoint (or DP rank) most likely holds a
//! request's prompt prefix in its KV cache.
//!
//! A prompt is cut into blocks of `--prefix-block-bytes` bytes of what the engine will
//! tokenize (the prompt text, each chat message's role and text, or a token-id prompt's
//! ids as 4 bytes each, which is then exact). Each block's hash chains the one before it,
//! seeded by the model's name, so a block's hash stands for the whole prompt up to its
//! end, as an engine's block hashes do. Only whole blocks count: an engine caches whole
//! blocks only.
//!
//! Each endpoint keeps the hashes of the blocks the gateway sent there, approximately the
//! most recent `--prefix-cache-blocks` of them ([`SentBlocks`]). A request's match on an
//! endpoint is the fraction of its blocks, from the first, found there; the gateway
//! cannot see what the engine evicted, so a match is a likelihood, weighed against load
//! by `--weight-prefix`.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// How prompts are cut into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocking {
    /// Bytes per block (`--prefix-block-bytes`, 64: about 16 tokens of English text, or
    /// 16 token ids).
    pub block_bytes: usize,
    /// Blocks hashed at most, from the start (`--prefix-max-blocks`, 256): what a prefix
    /// longer than that shares is already decided by its first blocks.
    pub max_blocks: usize,
}

impl Default for Blocking {
    fn default() -> Self {
        Blocking {
            block_bytes: 64,
            max_blocks: 256,
        }
    }
}

/// The chained hashes of the whole blocks of `prompt`, for `model`.
pub fn block_hashes(model: Option<&str>, prompt: &[u8], blocking: Blocking) -> Vec<u64> {
    if blocking.block_bytes == 0 {
        return Vec::new();
    }
    let mut seed = DefaultHasher::new();
    model.unwrap_or("").hash(&mut seed);
    let mut prev = seed.finish();
    prompt
        .chunks_exact(blocking.block_bytes)
        .take(blocking.max_blocks)
        .map(|block| {
            let mut h = DefaultHasher::new();
            prev.hash(&mut h);
            h.write(block);
            prev = h.finish();
            prev
        })
        .collect()
}

/// The key of a block in an endpoint's [`SentBlocks`]: the block's hash, told apart by
/// the DP rank it went to (each rank has its own KV cache). `None`: the endpoint placed
/// the request itself.
fn key(hash: u64, rank: Option<usize>) -> u64 {
    match rank {
        None => hash,
        // An odd multiplier spreads the ranks over the whole key space.
        Some(r) => hash ^ (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    }
}

/// The block hashes sent to one endpoint, the most recent `capacity` of them kept,
/// approximately: a ring of the order they were sent in and a map from each hash to its
/// place. Sending a block already among the newer half of the ring changes nothing; one
/// in the older half moves to the front. So a prefix sent again and again stays, a block
/// not sent for `capacity` sends goes, and memory stays bounded at about 24 bytes a block.
#[derive(Debug, Default)]
pub struct SentBlocks {
    capacity: usize,
    /// `ring[seq % capacity]` is the key sent as number `seq`, if it is still there.
    ring: Vec<u64>,
    /// Each key kept, and the number it was (last) sent as.
    at: HashMap<u64, u64>,
    /// The number of the next send.
    next: u64,
}

impl SentBlocks {
    /// An empty set keeping about `capacity` blocks (0: none, affinity off).
    pub fn new(capacity: usize) -> SentBlocks {
        SentBlocks {
            capacity,
            ..SentBlocks::default()
        }
    }

    /// Blocks kept now.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether no block is kept.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// The fraction of `hashes`, from the first, sent here (to `rank`): 0 when the first
    /// is not, 1 when all are.
    pub fn matched(&self, hashes: &[u64], rank: Option<usize>) -> f64 {
        if hashes.is_empty() {
            return 0.0;
        }
        let n = hashes
            .iter()
            .take_while(|&&h| self.at.contains_key(&key(h, rank)))
            .count();
        n as f64 / hashes.len() as f64
    }

    /// `hashes` were sent here (to `rank`).
    pub fn sent(&mut self, hashes: &[u64], rank: Option<usize>) {
        if self.capacity == 0 {
            return;
        }
        for &h in hashes {
            let k = key(h, rank);
            if let Some(&seq) = self.at.get(&k)
                && self.next - seq < (self.capacity as u64).div_ceil(2)
            {
                continue;
            }
            let slot = (self.next % self.capacity as u64) as usize;
            if slot < self.ring.len() {
                let old = self.ring[slot];
                let old_seq = self.next - self.capacity as u64;
                // The slot's key goes unless it was sent again since (a newer place).
                if self.at.get(&old) == Some(&old_seq) {
                    self.at.remove(&old);
                }
                self.ring[slot] = k;
            } else {
                self.ring.push(k);
            }
            self.at.insert(k, self.next);
            self.next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Blocking = Blocking {
        block_bytes: 4,
        max_blocks: 8,
    };

    #[test]
    fn blocks_chain_so_a_block_stands_for_everything_before_it() {
        let a = block_hashes(Some("m"), b"aaaabbbbccccdd", B);
        assert_eq!(a.len(), 3, "whole blocks only");
        let b = block_hashes(Some("m"), b"aaaabbbbXXXX", B);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // The same block after a different one hashes differently.
        let c = block_hashes(Some("m"), b"zzzzbbbb", B);
        assert_ne!(a[1], c[1]);
        // Another model shares nothing.
        assert_ne!(block_hashes(Some("n"), b"aaaa", B)[0], a[0]);
        assert_eq!(block_hashes(Some("m"), &[b'x'; 100], B).len(), 8, "capped");
        assert!(block_hashes(Some("m"), b"abc", B).is_empty());
    }

    #[test]
    fn the_match_is_the_leading_fraction_sent() {
        let mut s = SentBlocks::new(100);
        let system = block_hashes(None, b"You are a helpful bot. ", B);
        let one = block_hashes(None, b"You are a helpful bot. Hello there", B);
        s.sent(&system, None);
        assert_eq!(system.len(), 5);
        assert_eq!(one.len(), 8);
        assert_eq!(s.matched(&one, None), 5.0 / 8.0);
        assert_eq!(s.matched(&system, None), 1.0);
        assert_eq!(s.matched(&[], None), 0.0);
        // Per rank: rank 1 has not seen it, and what the endpoint placed is not a rank's.
        assert_eq!(s.matched(&system, Some(1)), 0.0);
        s.sent(&system, Some(1));
        assert_eq!(s.matched(&system, Some(1)), 1.0);
        assert_eq!(s.matched(&system, Some(0)), 0.0);
        // Blocks after a miss do not count.
        let other = block_hashes(None, b"Xou are a helpful bot. ", B);
        assert_eq!(s.matched(&other, None), 0.0);
    }

    #[test]
    fn old_blocks_go_and_blocks_sent_again_stay() {
        let mut s = SentBlocks::new(8);
        let keep = [1u64];
        s.sent(&keep, None);
        for i in 0..100u64 {
            s.sent(&[1000 + i], None);
            // Sent again as often as a popular system prompt is.
            if i % 3 == 0 {
                s.sent(&keep, None);
            }
            assert!(s.len() <= 8, "{} kept", s.len());
        }
        assert_eq!(s.matched(&keep, None), 1.0);
        assert_eq!(s.matched(&[1000], None), 0.0, "evicted");
        assert_eq!(s.matched(&[1099], None), 1.0, "the newest stays");
        let mut off = SentBlocks::new(0);
        off.sent(&keep, None);
        assert!(off.is_empty());
    }
}
