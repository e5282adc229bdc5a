//! The front door: what clients and the operator talk to.
//!
//! - [`http`]: the OpenAI-compatible HTTP API (axum routes, request bodies, API keys, errors,
//!   `/metrics`), served on `ballast_serve`'s accept loop.
//! - [`control`]: the gRPC control API (tonic) the operator calls: stats, DP weights, drain.
//! - [`control_tls`]: that API's optional TLS, with certificate files re-read as they change.
//!
//! May use every other room: it turns requests into [`crate::runtime`] submissions and
//! renders [`crate::telemetry`]. Nothing below uses it.

pub mod control;
pub mod control_tls;
pub mod http;
