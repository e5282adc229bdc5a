//! `ballast local FILE.yaml`: the whole control loop on one machine, with no cluster.
//!
//! Each InferenceService becomes a set of `ballast engine` child processes on loopback;
//! a small OpenAI-compatible router fronts them on `--port`; every scrape interval the
//! replicas are scraped, the shared decision core decides, and the runtime acts: start
//! processes to scale up, drain then stop them to scale down, take hot replicas out of the
//! router's rotation and shift DP weights over the control API to rebalance.
//! `--admin-port` serves the live fleet page at `/`, the operator's own `/metrics`,
//! `GET /status` (each service's status as the CRD holds it) and `GET /replicas` (each
//! replica's phase and addresses).

pub mod admin;
mod demo;
pub mod fleet;
mod publish;
pub mod replica;
pub mod router;
mod supervisor;
pub mod timeline;
mod view;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ballast_crds::{EngineKind, InferenceService};
use clap::Args;

use publish::Outputs;
use supervisor::{Launch, Supervisor};

/// Flags of `ballast local`.
#[derive(Debug, Clone, Args)]
pub struct LocalArgs {
    /// InferenceService YAML: one or more `---`-separated documents, the same a cluster takes.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Port of the OpenAI-compatible router in front of the replicas in rotation (the
    /// `model` field picks the service).
    #[arg(
        long,
        env = "BALLAST_LOCAL_PORT",
        value_name = "PORT",
        default_value_t = 8080
    )]
    pub port: u16,

    /// Port of the operator's own `/metrics` and `GET /status`.
    #[arg(
        long,
        env = "BALLAST_ADMIN_PORT",
        value_name = "PORT",
        default_value_t = 9090
    )]
    pub admin_port: u16,

    /// Also drive a built-in load ramp (rise, hold, fall) through the router.
    #[arg(long)]
    pub demo: bool,

    /// Stop (draining everything) after this many seconds [default: run until Ctrl-C].
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,

    /// Print decisions as plain blocks instead of redrawing the live view, or nothing with
    /// `--view none`.
    #[arg(long, value_enum, default_value = "auto")]
    pub view: ViewMode,

    /// Engine binary for the replicas [default: this binary].
    #[arg(long, env = "BALLAST_ENGINE_BIN", value_name = "PATH")]
    pub engine_bin: Option<PathBuf>,

    /// Directory for the replicas' logs [default: a new directory under the temp dir].
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
}

/// How decisions are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ViewMode {
    /// Redraw on a terminal, plain blocks otherwise.
    Auto,
    /// Nothing (decisions still go to the structured log on stderr).
    None,
}

/// Why `ballast local` could not run.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not InferenceService YAML.
    #[error("{}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        source: Box<ballast_crds::ParseError>,
    },
    /// The file holds no resource.
    #[error("{}: no InferenceService in the file", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A resource has no `metadata.name`.
    #[error("an InferenceService has no metadata.name")]
    Unnamed,
    /// Two resources share a name.
    #[error("two InferenceServices are named {0}")]
    DuplicateName(String),
    /// A resource breaks a rule of the CRD (the messages the API server would give).
    #[error("{name}: {}", errors.join("; "))]
    Invalid {
        /// The resource.
        name: String,
        /// Each broken rule.
        errors: Vec<String>,
    },
    /// The resource asks for an engine the local runtime cannot start.
    #[error(
        "{name}: the local runtime starts ballast engines only (engine.kind {kind}); vLLM and SGLang fleets run on Kubernetes"
    )]
    UnsupportedEngine {
        /// The resource.
        name: String,
        /// `vllm` or `sglang`.
        kind: String,
    },
    /// A port cannot be bound.
    #[error("cannot listen on {addr} ({flag}): {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The flag that chose it.
        flag: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// No TLS crypto provider is installed (the `ballast` binary installs one in `main`).
    #[error(
        "no TLS crypto provider is installed; the program must install one before running ballast local"
    )]
    NoCryptoProvider,
    /// The router cannot start.
    #[error(transparent)]
    Router(#[from] router::RouterError),
    /// An HTTP client cannot be built.
    #[error("cannot build an HTTP client: {0}")]
    Client(reqwest::Error),
    /// Another I/O failure (the log directory, the binary's path).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl LocalError {
    /// Process exit code: 2 for a file or resource that is not usable, 1 for a runtime
    /// failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            LocalError::Read { .. }
            | LocalError::Parse { .. }
            | LocalError::Empty { .. }
            | LocalError::Unnamed
            | LocalError::DuplicateName(_)
            | LocalError::Invalid { .. }
            | LocalError::UnsupportedEngine { .. } => 2,
            LocalError::Listen { .. }
            | LocalError::NoCryptoProvider
            | LocalError::Router(_)
            | LocalError::Client(_)
            | LocalError::Io(_) => 1,
        }
    }
}

/// Reads and validates the resources of `file`.
pub fn load(file: &std::path::Path) -> Result<Vec<InferenceService>, LocalError> {
    let text = std::fs::read_to_string(file).map_err(|source| LocalError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let services = ballast_crds::parse_yaml(&text).map_err(|source| LocalError::Parse {
        path: file.to_path_buf(),
        source: Box::new(source),
    })?;
    if services.is_empty() {
        return Err(LocalError::Empty {
            path: file.to_path_buf(),
        });
    }
    let mut names = std::collections::BTreeSet::new();
    for s in &services {
        let name = s.metadata.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(LocalError::Unnamed);
        }
        if !names.insert(name.clone()) {
            return Err(LocalError::DuplicateName(name));
        }
        s.spec.validate().map_err(|errors| LocalError::Invalid {
            name: name.clone(),
            errors,
        })?;
        if s.spec.engine.kind != EngineKind::Ballast {
            return Err(LocalError::UnsupportedEngine {
                name,
                kind: format!("{:?}", s.spec.engine.kind).to_lowercase(),
            });
        }
    }
    Ok(services)
}

/// Runs `ballast local` until `shutdown` resolves (the binary passes SIGTERM/SIGINT),
/// `--duration` passes, or the `--demo` ends with the fleet back at its minimum.
pub async fn run(
    args: LocalArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), LocalError> {
    let services = load(&args.file)?;
    // As an engine does: the router's clients and the replicas' connections need
    // descriptors.
    ballast_serve::raise_open_files_limit();
    let engine_bin = match &args.engine_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let log_dir = match &args.log_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("ballast-local-{}", std::process::id())),
    };
    std::fs::create_dir_all(&log_dir)?;
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        return Err(LocalError::NoCryptoProvider);
    }
    let bind = |port: u16, flag: &'static str| async move {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| LocalError::Listen { addr, flag, source })
    };
    let router_listener = bind(args.port, "--port").await?;
    let admin_listener = bind(args.admin_port, "--admin-port").await?;
    let router_addr = router_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;

    let routes = Arc::new(router::RouteTable::default());
    let metrics = Arc::new(admin::OperatorMetrics::new());
    // One process, no election: it always leads.
    metrics.leader.set(1);
    let status: admin::StatusMap = Arc::default();
    let replicas: admin::ReplicaMap = Arc::default();
    let timeline: admin::TimelineHandle = Arc::default();
    let header = format!(
        "ballast local: router http://{router_addr}  admin http://{admin_addr}/status  logs {}",
        log_dir.display()
    );
    let view = Arc::new(Mutex::new(view::View::new(
        args.view == ViewMode::Auto,
        header,
    )));
    let health_client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(LocalError::Client)?;
    // A control token for this run, readable by this user only: the replicas' control
    // APIs answer the supervisor and nobody else on the machine.
    let token = crate::control::fresh_token();
    let control_token_file = log_dir.join("control-token");
    write_private(&control_token_file, format!("{token}\n").as_bytes())?;
    let launch = Launch {
        engine_bin,
        log_dir,
        health_client,
        control_token_file,
        control_tokens: crate::control::ControlTokens::new(vec![token]),
    };
    let outputs = Outputs {
        routes: Arc::clone(&routes),
        metrics: Arc::clone(&metrics),
        status: Arc::clone(&status),
        replicas: Arc::clone(&replicas),
        timeline: Arc::clone(&timeline),
        view,
    };
    let demo_model = services[0].served_name();
    let min_replicas: std::collections::BTreeMap<String, i32> = services
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                s.spec.autoscaling.min_replicas,
            )
        })
        .collect();
    // Every service is published (routes, status) before the first request can be served:
    // connections that arrive meanwhile wait in the listen backlog.
    let created: Vec<Supervisor> = services
        .into_iter()
        .map(|isvc| Supervisor::new(isvc, &launch, outputs.clone()))
        .collect();
    let app = router::router(routes, router::HOLD_LIMIT)?;
    // Both with the engine's accept loop: a connection cap, header and idle timeouts. Held
    // until the run ends (dropping one closes its port).
    let _router = ballast_serve::Connections::start(router_listener, app, &router::LIMITS);
    let _admin = ballast_serve::Connections::start(
        admin_listener,
        admin::router(admin::AdminState {
            metrics,
            status,
            replicas,
            timeline,
        }),
        &crate::ADMIN_HTTP_LIMITS,
    );
    // Printed (not logged) so scripts and tests can read the ports; from here on both
    // answer.
    println!("ballast local router listening on http://{router_addr}");
    println!("ballast local admin listening on http://{admin_addr}");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tasks: Vec<_> = created
        .into_iter()
        .map(|svc| tokio::spawn(svc.run(stop_rx.clone())))
        .collect();
    let demo_done = async {
        if !args.demo {
            return std::future::pending().await;
        }
        let serving = Arc::clone(&outputs.routes);
        demo::drive(
            format!("http://{router_addr}"),
            demo_model,
            &demo::RAMP,
            move || serving.all_serving(),
        )
        .await;
        // Let the fleet settle back to its minimum before ending the demo.
        let settle = tokio::time::Instant::now() + std::time::Duration::from_secs(600);
        while !settled(&outputs.status, &min_replicas) && tokio::time::Instant::now() < settle {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    };
    let deadline = async {
        match args.duration {
            Some(s) => tokio::time::sleep(std::time::Duration::from_secs_f64(s.max(0.0))).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = shutdown => tracing::info!(target: "ballast::local", "stopping: draining every replica"),
        _ = deadline => tracing::info!(target: "ballast::local", "--duration reached: draining every replica"),
        _ = demo_done => tracing::info!(target: "ballast::local", "demo finished and the fleet is back at its minimum: stopping"),
    }
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

/// Every service runs exactly its minimum replica count.
fn settled(status: &admin::StatusMap, min: &std::collections::BTreeMap<String, i32>) -> bool {
    let status = status.read().unwrap_or_else(|e| e.into_inner());
    min.iter().all(|(name, &m)| {
        status
            .get(name)
            .is_some_and(|s| s.desired_replicas == m && s.replicas == m && s.ready_replicas == m)
    })
}

/// Writes `bytes` to a new file at `path` that only this user can read (a file left from
/// an earlier run is replaced).
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}
