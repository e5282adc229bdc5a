//! Engine replicas as child processes on loopback.
//!
//! A replica is `ballast engine --port 0 --grpc-port P …` started from the same binary. It
//! announces its addresses on stdout ("… control API listening on …" then "… listening
//! on …"); reading those lines is how the runtime learns the engine is serving, so there
//! is no polling and no sleeping. Engine logs go to a file per replica.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use ballast_crds::InferenceService;

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Spawned, not serving yet (building the model).
    Starting,
    /// Serving.
    Ready,
    /// Removed from rotation and told to drain; exits when its requests are done.
    Draining,
}

/// One engine process.
pub struct Replica {
    /// `<service>-<n>`.
    pub name: String,
    /// Life phase.
    pub phase: Phase,
    /// Taking new traffic from the router (false: out of rotation, by rebalancing).
    pub accepting: bool,
    /// HTTP address once ready.
    pub http: Option<SocketAddr>,
    /// Control API address.
    pub grpc: Option<SocketAddr>,
    /// When it was spawned.
    pub started: Instant,
    /// Engine log file.
    pub log: PathBuf,
    child: Child,
    ready: Option<oneshot::Receiver<Result<Announced, String>>>,
}

/// Addresses a replica announced.
#[derive(Debug, Clone, Copy)]
struct Announced {
    http: SocketAddr,
    grpc: Option<SocketAddr>,
}

/// The `ballast engine` arguments an InferenceService implies.
pub fn engine_args(isvc: &InferenceService, grpc_port: u16) -> Vec<String> {
    let s = &isvc.spec;
    let e = &s.engine;
    let mut a: Vec<String> = vec![
        "engine".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "0".into(),
        "--grpc-port".into(),
        grpc_port.to_string(),
        "--model".into(),
        s.model.source.clone(),
        "--served-model-name".into(),
        isvc.served_name(),
        "--data-parallel-size".into(),
        e.data_parallel_size.to_string(),
        "--max-num-seqs".into(),
        e.max_num_seqs.to_string(),
        "--max-num-batched-tokens".into(),
        e.max_num_batched_tokens.to_string(),
        "--max-queued-requests".into(),
        e.max_queued_requests.to_string(),
        "--max-queued-tokens".into(),
        e.max_queued_tokens.to_string(),
        "--block-size".into(),
        e.kv_cache.block_size.to_string(),
    ];
    if let Some(n) = e.max_running_per_tenant {
        a.extend(["--max-running-per-tenant".into(), n.to_string()]);
    }
    if let Some(n) = e.kv_cache.num_blocks {
        a.extend(["--num-kv-blocks".into(), n.to_string()]);
    }
    if !e.enable_prefix_caching {
        a.push("--no-enable-prefix-caching".into());
    }
    a.extend(e.args.iter().cloned());
    a
}

/// A free loopback port for the control API. The engine binds it right away; if another
/// process wins the race the engine exits with a bind error and the runtime starts a new
/// replica.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Replica {
    /// Spawns a replica of `isvc` from the engine binary `bin`, logging to `log_dir`.
    pub fn spawn(
        bin: &Path,
        isvc: &InferenceService,
        name: String,
        log_dir: &Path,
    ) -> std::io::Result<Self> {
        let grpc_port = free_port()?;
        let log = log_dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log)?;
        let mut child = Command::new(bin)
            .args(engine_args(isvc, grpc_port))
            .env(
                "BALLAST_LOG",
                std::env::var("BALLAST_ENGINE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut grpc = None;
            let result = loop {
                match lines.next_line().await {
                    Ok(Some(line)) => {
                        if let Some(a) =
                            line.strip_prefix("ballast engine control API listening on http://")
                        {
                            grpc = a.parse().ok();
                        } else if let Some(a) =
                            line.strip_prefix("ballast engine listening on http://")
                        {
                            break a
                                .parse()
                                .map(|http| Announced { http, grpc })
                                .map_err(|e| format!("bad address {a:?}: {e}"));
                        }
                    }
                    Ok(None) => break Err("exited before serving".to_string()),
                    Err(e) => break Err(e.to_string()),
                }
            };
            let _ = tx.send(result);
            // Keep draining stdout so the engine never blocks on a full pipe.
            while let Ok(Some(_)) = lines.next_line().await {}
        });
        Ok(Self {
            name,
            phase: Phase::Starting,
            accepting: true,
            http: None,
            grpc: None,
            started: Instant::now(),
            log,
            child,
            ready: Some(rx),
        })
    }

    /// Advances a starting replica that announced its addresses. Returns an error when it
    /// died before serving.
    pub fn poll_ready(&mut self) -> Result<(), String> {
        let Some(rx) = &mut self.ready else {
            return Ok(());
        };
        match rx.try_recv() {
            Ok(Ok(a)) => {
                self.http = Some(a.http);
                self.grpc = a.grpc;
                self.phase = Phase::Ready;
                self.ready = None;
                Ok(())
            }
            Ok(Err(e)) => {
                self.ready = None;
                Err(e)
            }
            Err(oneshot::error::TryRecvError::Empty) => Ok(()),
            Err(oneshot::error::TryRecvError::Closed) => Err("stopped before serving".into()),
        }
    }

    /// Waits until the replica serves (or fails).
    pub async fn wait_ready(&mut self) -> Result<(), String> {
        if let Some(rx) = self.ready.take() {
            let a = rx
                .await
                .map_err(|_| "stopped before serving".to_string())??;
            self.http = Some(a.http);
            self.grpc = a.grpc;
            self.phase = Phase::Ready;
        }
        Ok(())
    }

    /// The exit status if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Starts draining: SIGTERM makes the engine refuse new requests, finish in-flight ones
    /// and exit 0. The router has already stopped sending it traffic.
    pub fn drain(&mut self) {
        self.phase = Phase::Draining;
        self.accepting = false;
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
    }

    /// Kills the process at once (shutdown after a drain timeout).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.wait().await.ok()
    }

    /// Base URL of the engine's HTTP API.
    pub fn base_url(&self) -> Option<String> {
        self.http.map(|a| format!("http://{a}"))
    }
}
