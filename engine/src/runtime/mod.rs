//! The runtime: from an admitted request to its last token.
//!
//! [`engine`] is the handle the front door holds. A submission passes [`admission`] (the
//! queue limits) and the [`tenants`] caps, is given a data-parallel rank by the
//! [`dispatcher`], and waits in that rank's [`scheduler`], which batches continuously over
//! the paged KV cache in [`kv`]. Each rank runs the step loop in [`core`], in lockstep with
//! the others through [`dp`], and calls the model through [`crate::compute::executor`]; [`output`] turns
//! step results into response updates and statistics, with [`text`] detokenizing.
//!
//! May use [`crate::config`], [`crate::telemetry`], [`crate::compute`] and [`crate::step`];
//! never [`crate::api`].

pub mod admission;
pub mod core;
pub mod dispatcher;
pub mod dp;
pub mod engine;
pub mod kv;
pub mod output;
pub mod scheduler;
pub mod tenants;
#[doc(hidden)]
pub mod test_support;
pub mod text;
