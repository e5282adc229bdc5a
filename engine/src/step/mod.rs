//! The vocabulary of one engine step, shared by every room below the front door.
//!
//! - [`batch`]: what the scheduler hands a backend ([`StepMetadata`], [`SeqSlice`]).
//! - [`events`]: what a step records about each request and the scheduler (events with
//!   their `Instant`, finish and reject reasons, snapshots, counters).
//! - [`kv`]: the KV cache's numbers (block counts, prefix-cache activity, residency).
//! - [`balance`]: a data-parallel step's gather and the balance derived from it.
//!
//! Uses nothing else in the crate, so the scheduler, the backends and the telemetry can all
//! speak it without depending on each other.

pub mod balance;
pub mod batch;
pub mod events;
pub mod kv;

pub use balance::{DpBalance, RankLoad};
pub use batch::{SeqSlice, StepMetadata};
pub use events::{FinishReason, RejectReason, RequestId};
pub use kv::{PoolCounts, PrefixCacheStats, ResidencySample};
