//! The Ballast inference engine.
//!
//! A request enters through the OpenAI-compatible HTTP frontend ([`server`]), passes the
//! front-door [`admission`] check, is assigned a data-parallel rank by the [`dispatcher`], and
//! is scheduled by that rank's [`scheduler`] over a paged KV cache with prefix caching
//! ([`kv`]). Each rank steps the [`model`] on a [`backend`]; the step loop records events and
//! snapshots that the output side turns into responses and statistics.

pub mod admission;
pub mod backend;
pub mod events;
pub mod executor;
pub mod kv;
pub mod model;
pub mod rng;
pub mod sampling;
pub mod scheduler;
pub mod tenants;
pub mod tokenizer;
