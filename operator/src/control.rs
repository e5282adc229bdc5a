//! Client of the engine control API (compiled from the engine's .proto by build.rs).

/// Generated protobuf types and the gRPC client.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("ballast.control.v1");
}

pub use proto::engine_control_client::EngineControlClient;
