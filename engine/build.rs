//! Compiles the control API .proto with protox (pure Rust: no system `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/ballast/control/v1/control.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
