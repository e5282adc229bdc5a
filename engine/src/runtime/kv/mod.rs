//! The paged KV cache's bookkeeping: a pool of fixed-size blocks with reference counts and
//! an LRU of free blocks, content hashes that let requests share full blocks (prefix
//! caching), and a per-rank manager that hands blocks to requests.
//!
//! Only ids and counts live here; the K/V values themselves live in the backend's cache.

pub mod block_pool;
pub mod hash;
pub mod manager;

pub use crate::step::kv::{PoolCounts, PrefixCacheStats, ResidencySample};
pub use block_pool::{BlockId, BlockPool};
pub use hash::{BlockHash, hash_block};
pub use manager::KvCacheManager;
