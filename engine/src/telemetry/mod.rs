//! What the engine tells about itself.
//!
//! - [`metrics`]: the Prometheus families of `/metrics` (engine-metrics.md).
//! - [`stats`]: per-step statistics and their loggers (the log line, the Prometheus
//!   recorder, the control board the gRPC API reads), request timelines and FLOPs.
//! - [`spans`]: OTLP traces, one root span per request.
//!
//! May use [`crate::config`], [`crate::compute`] (the model's shape) and [`crate::step`]
//! (what a step records). The runtime feeds it; it never calls the runtime.

pub mod metrics;
pub mod spans;
pub mod stats;
