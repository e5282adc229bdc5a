//! The Ballast inference engine.
//!
//! A request enters through the front door ([`api`]: the OpenAI-compatible HTTP API and the
//! gRPC control API), is admitted, given a data-parallel rank and scheduled over a paged KV
//! cache with prefix caching by the [`runtime`]. Each rank steps the model on a backend
//! ([`compute`]); what a step records is spoken in [`step`]'s vocabulary and turned into
//! `/metrics`, log lines and traces by [`telemetry`]. [`config`] is what the flags mean.
//!
//! The rooms depend in one direction only, checked by `cli/tests/it/architecture.rs`:
//! `api` → `runtime` → `telemetry` → `config` → `compute` → `step`.

pub mod api;
pub mod compute;
pub mod config;
pub mod runtime;
pub mod step;
pub mod telemetry;

pub use config::{EngineArgs, EngineConfig};
pub use runtime::engine::{Engine, RequestStream, Submission, SubmitError};

/// Why `ballast engine` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A flag has a value that cannot work (exit code 2).
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// Binding or serving failed (exit code 1).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl RunError {
    /// The process exit code for this error (cli.md: 2 bad arguments, 1 runtime failure).
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Config(_) => 2,
            RunError::Io(_) => 1,
        }
    }
}

/// Runs `ballast engine`: validates flags, binds the HTTP port, prints
/// `ballast engine listening on http://ADDR` on stdout (with the real port when `--port 0`),
/// serves until `shutdown` resolves (the binary passes SIGTERM/SIGINT) and drains.
pub async fn run(
    args: EngineArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let config = EngineConfig::from_args(&args)?;
    // Before anything opens files: the connection cap is sized from this limit.
    ballast_serve::raise_open_files_limit();
    let addr = std::net::SocketAddr::new(config.host, config.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr()?;
    tracing::info!(
        model = %config.model.name,
        served_model_name = %config.served_model_name,
        data_parallel_size = config.data_parallel_size,
        num_kv_blocks = config.scheduler.num_blocks,
        block_size = config.scheduler.block_size,
        max_model_len = config.max_model_len(),
        "starting engine"
    );
    let control = match config.grpc_port {
        0 => None,
        port => {
            let addr = std::net::SocketAddr::new(config.host, port);
            let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot listen on {addr} (--grpc-port): {e}"),
                )
            })?;
            Some(l)
        }
    };
    // The device is opened here, not while flags are read: a missing GPU is still a flag
    // error at start (exit 2), before the ports answer.
    let backend = compute::device::ComputeBackend::open(config.device, config.cuda_graphs)
        .map_err(|message| config::ConfigError {
            flag: "device",
            message,
        })?;
    let engine = Engine::start(config, backend);
    // Printed (not logged) so a parent process can read the ports it was given; the HTTP
    // line comes last and means "ready".
    let (stop_control, control_stopped) = tokio::sync::oneshot::channel::<()>();
    let control_task = match control {
        Some(l) => {
            let tls = match &engine.config().control_tls {
                Some(files) => Some(
                    api::control_tls::ControlTls::new(files.clone())
                        .map_err(|e| std::io::Error::other(format!("--control-tls-cert: {e}")))?,
                ),
                None => None,
            };
            println!(
                "ballast engine control API listening on {}://{}",
                if tls.is_some() { "https" } else { "http" },
                l.local_addr()?
            );
            let service = api::control::ControlService::server(engine.clone());
            let router = tonic::transport::Server::builder().add_service(service);
            let stopped = async {
                let _ = control_stopped.await;
            };
            Some(match tls {
                Some(tls) => tokio::spawn(async move {
                    let incoming = tls.incoming(l);
                    let served = router.serve_with_incoming_shutdown(incoming, stopped).await;
                    drop(tls);
                    served
                }),
                None => tokio::spawn(router.serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(l),
                    stopped,
                )),
            })
        }
        None => None,
    };
    println!("ballast engine listening on http://{local}");
    api::http::serve(engine, listener, shutdown).await?;
    let _ = stop_control.send(());
    if let Some(task) = control_task {
        let _ = task.await;
    }
    Ok(())
}
