//! A program that forgot to choose a TLS crypto provider gets an error, not a panic. This
//! file is its own test binary so that no other test installs the provider first.

use ballast_bench::{BenchArgs, BenchError};
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

#[tokio::test]
async fn without_a_tls_provider_run_is_an_error() {
    assert!(rustls::crypto::CryptoProvider::get_default().is_none());
    let args = Cli::try_parse_from([
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--num-requests",
        "1",
    ])
    .unwrap()
    .args;
    let err = ballast_bench::run(args).await.unwrap_err();
    assert!(matches!(err, BenchError::Client(_)), "{err}");
    assert!(err.to_string().contains("TLS crypto provider"), "{err}");
}
