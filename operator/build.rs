//! Compiles the engine control API's client from the engine's .proto (the operator talks to
//! engines over the network only, so it shares the wire contract, not the engine crate) and
//! its server trait, which the reconcile tests implement to stand in for an engine,
//! and KEDA's external-scaler service (`proto/keda/`, vendored), whose server the operator
//! runs with `--keda-port` and whose client its tests call it with.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../engine/proto/ballast/control/v1/control.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["../engine/proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;

    let keda = "proto/keda/externalscaler.proto";
    println!("cargo:rerun-if-changed={keda}");
    let fds = protox::compile([keda], ["proto/keda"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
