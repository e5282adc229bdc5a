//! ballast-engine's integration tests, one binary: a module per subject, the engine on
//! loopback and its helpers in `common`.

mod admission;
mod common;
mod control;
mod cuda;
mod dp_lockstep;
mod http;
mod kv_memory;
mod llama_server_agreement;
mod metrics;
mod quant_reference;
mod real_model;
mod shutdown;
mod tracing;
