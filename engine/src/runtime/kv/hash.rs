//! Content hashes of full KV blocks, chained so a block's hash names its whole prefix.

use std::hash::Hasher;

/// Identity of a full block's content and everything before it.
pub type BlockHash = u64;

/// Hash of a block holding `tokens` whose predecessor block hashed to `parent`.
///
/// Two blocks share a hash only if their tokens and all earlier tokens match, which is the
/// condition for their keys and values being equal. 64 bits make an accidental collision
/// about 2⁻⁶⁴ per pair. Hashes are only compared inside one process, so the standard
/// library's keyed-but-fixed `DefaultHasher::new()` (SipHash today) is sufficient.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write_u64(parent.unwrap_or(0x5eed));
    h.write_u8(parent.is_some() as u8);
    for &t in tokens {
        h.write_u32(t);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_prefix_and_content() {
        let a = hash_block(None, &[1, 2, 3, 4]);
        assert_eq!(a, hash_block(None, &[1, 2, 3, 4]));
        assert_ne!(a, hash_block(None, &[1, 2, 3, 5]));
        let b1 = hash_block(Some(a), &[5, 6, 7, 8]);
        let b2 = hash_block(Some(hash_block(None, &[9, 2, 3, 4])), &[5, 6, 7, 8]);
        assert_ne!(
            b1, b2,
            "same block content after a different prefix must differ"
        );
    }
}
