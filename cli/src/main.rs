//! `ballast`: one binary for the engine, the load generator, the operator and its tools.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Ballast: run a fleet of LLM inference replicas.
#[derive(Debug, Parser)]
#[command(name = "ballast", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one engine replica: OpenAI-compatible HTTP API, /health and /metrics.
    Engine(ballast_engine::EngineArgs),
    /// Load-test any OpenAI-compatible server.
    Bench(ballast_bench::BenchArgs),
    /// Run InferenceServices on this machine: engine processes on loopback, a router,
    /// and the control loop that scales and rebalances them.
    Local(ballast_operator::local::LocalArgs),
    /// Run the Kubernetes controller: reconcile InferenceServices in the cluster (in-cluster
    /// config or KUBECONFIG), with leader election, /metrics, /healthz and /readyz.
    Operator(ballast_operator::reconcile::OperatorArgs),
    /// Run the endpoint picker Envoy calls over ext_proc (the Gateway API Inference
    /// Extension protocol): each request's engine, picked on the engines' own signals.
    Gateway(ballast_gateway::GatewayArgs),
    /// Print the InferenceService CRD (YAML) generated from the Rust types.
    Crd,
    /// Print what the operator reads from one engine (ours, vLLM or SGLang): a metrics URL
    /// or a saved exposition, as the signals a control period decides on.
    Signals(ballast_operator::inspect::SignalsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The one place the process-wide TLS crypto provider is chosen: every HTTP client of
    // the libraries (load generator, scraper, router) takes it from here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Command::Crd = cli.command {
        print!("{}", ballast_crds::crd_yaml());
        return ExitCode::SUCCESS;
    }
    // The live view of `ballast local` redraws the terminal; info logs would scroll it
    // away, so there the default level is warn (BALLAST_LOG overrides).
    let live_view = matches!(cli.command, Command::Local(_)) && std::io::stdout().is_terminal();
    let default_level = if live_view { "warn" } else { "info" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BALLAST_LOG")
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Engine(args) => match ballast_engine::run(args, shutdown_signal()).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    e.exit_code()
                }
            },
            Command::Crd => unreachable!("handled before the runtime starts"),
            Command::Local(args) => {
                match ballast_operator::local::run(args, shutdown_signal()).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("error: {e}");
                        e.exit_code()
                    }
                }
            }
            Command::Operator(args) => {
                match ballast_operator::reconcile::run(args, shutdown_signal()).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("error: {e}");
                        e.exit_code()
                    }
                }
            }
            Command::Gateway(args) => match ballast_gateway::run(args, shutdown_signal()).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    e.exit_code()
                }
            },
            Command::Signals(args) => match ballast_operator::inspect::run(args).await {
                Ok(_) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    e.exit_code()
                }
            },
            Command::Bench(args) => match ballast_bench::run(args).await {
                Ok(_) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    if matches!(e, ballast_bench::BenchError::InvalidArg { .. }) {
                        2
                    } else {
                        1
                    }
                }
            },
        }
    });
    ExitCode::from(code as u8)
}

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C): the engine then drains, `ballast
/// local` drains every replica. If the handlers cannot be installed it never resolves, and
/// says so.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; SIGTERM will not drain");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
