//! The HTTPS server: flags, the accept loop (a connection cap, a handshake timeout, HTTP/1
//! and HTTP/2 with a header timeout), and each request through authentication,
//! authorization and the API ([`super::api`]).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use ballast_serve::{Accept, BoxFuture, Connections, HttpLimits};
use clap::Args;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::net::{TcpListener, TcpStream};

use super::api::{self, ApiRequest, Failure};
use super::auth::{AUTH_CONFIGMAP, AuthConfig, Guard, Refusal};
use super::tls::{CertError, PeerCert, ServingCert, Tls, self_signed};
use super::values::Board;

/// Flags of the metrics APIs (`ballast operator`).
#[derive(Debug, Clone, Args)]
pub struct MetricsApiArgs {
    /// Serve custom.metrics.k8s.io and external.metrics.k8s.io over HTTPS on this port
    /// [default: off].
    #[arg(long, env = "BALLAST_METRICS_API_PORT", value_name = "PORT")]
    pub metrics_api_port: Option<u16>,

    /// Address the metrics APIs bind to.
    #[arg(
        long,
        env = "BALLAST_METRICS_API_HOST",
        value_name = "HOST",
        default_value = "0.0.0.0"
    )]
    pub metrics_api_host: IpAddr,

    /// PEM certificate chain the metrics APIs serve (re-read when it changes) [default:
    /// a self-signed certificate made at start].
    #[arg(
        long,
        env = "BALLAST_METRICS_API_CERT_FILE",
        value_name = "FILE",
        requires = "metrics_api_key_file"
    )]
    pub metrics_api_cert_file: Option<PathBuf>,

    /// PEM private key of `--metrics-api-cert-file`.
    #[arg(
        long,
        env = "BALLAST_METRICS_API_KEY_FILE",
        value_name = "FILE",
        requires = "metrics_api_cert_file"
    )]
    pub metrics_api_key_file: Option<PathBuf>,

    /// Keep a CA and serving certificate in this Secret of the operator's namespace
    /// (made if missing, renewed before expiry) and put the CA into the APIServices'
    /// caBundle, instead of certificate files.
    #[arg(
        long,
        env = "BALLAST_METRICS_API_CERT_SECRET",
        value_name = "NAME",
        conflicts_with = "metrics_api_cert_file"
    )]
    pub metrics_api_cert_secret: Option<String>,

    /// The Service in front of the metrics APIs: the kept certificate is for
    /// NAME.NAMESPACE.svc and NAME.NAMESPACE.svc.cluster.local.
    #[arg(
        long,
        env = "BALLAST_METRICS_API_SERVICE",
        value_name = "NAME",
        default_value = "ballast-metrics-api"
    )]
    pub metrics_api_service: String,

    /// The APIServices whose caBundle the kept certificate's CA goes into.
    #[arg(
        long,
        env = "BALLAST_METRICS_API_APISERVICES",
        value_name = "NAME,…",
        value_delimiter = ',',
        default_value = DEFAULT_APISERVICES
    )]
    pub metrics_api_apiservices: Vec<String>,
}

/// The APIServices `--metrics-api-apiservices` names by default.
const DEFAULT_APISERVICES: &str = "v1beta2.custom.metrics.k8s.io,v1beta1.external.metrics.k8s.io";

impl MetricsApiArgs {
    /// The APIServices `--metrics-api-apiservices` names by default (the chart renders
    /// exactly these).
    pub fn default_apiservices() -> Vec<String> {
        DEFAULT_APISERVICES.split(',').map(str::to_string).collect()
    }

    /// Where the operator keeps its own certificate, when `--metrics-api-cert-secret`
    /// asks it to, in `namespace` (the operator's).
    pub fn cert_settings(&self, namespace: &str) -> Option<super::certs::Settings> {
        let secret = self.metrics_api_cert_secret.clone()?;
        let svc = &self.metrics_api_service;
        Some(super::certs::Settings {
            namespace: namespace.to_string(),
            secret,
            dns_names: vec![
                format!("{svc}.{namespace}.svc"),
                format!("{svc}.{namespace}.svc.cluster.local"),
            ],
            apiservices: self.metrics_api_apiservices.clone(),
        })
    }
}

/// Why the metrics APIs cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The serving certificate.
    #[error("--metrics-api-cert-file/--metrics-api-key-file: {0}")]
    Cert(#[from] CertError),
    /// The port.
    #[error("cannot listen on {addr} (--metrics-api-port): {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The server's limits, on the accept loop every Ballast server runs: the TLS handshake
/// and the first request head within the header timeout; the aggregator keeps a few
/// connections open and sends no bodies.
pub const LIMITS: HttpLimits = HttpLimits {
    max_connections: 512,
    header_timeout: Duration::from_secs(10),
    body_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(120),
};
/// How often the certificate files are checked for a change.
const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// What every request shares.
struct Shared {
    board: Arc<Board>,
    leading: Arc<AtomicBool>,
    guard: Guard,
    config: RwLock<Arc<AuthConfig>>,
    tls: RwLock<Arc<Tls>>,
    cert: Arc<ServingCert>,
}

impl Shared {
    fn config(&self) -> Arc<AuthConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn tls(&self) -> Arc<Tls> {
        Arc::clone(&self.tls.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes new authentication settings; the TLS configuration follows their CAs.
    fn set_config(&self, config: AuthConfig) {
        if *self.config() == config {
            return;
        }
        let tls = Tls::new(Arc::clone(&self.cert), &config.cas);
        *self.tls.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tls);
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }
}

/// The serving certificate `args` name, read now (a missing or bad file is an error
/// naming it) and re-read when the files change; or a self-signed pair, logged as such.
/// Called before anything else starts, so that a bad file fails fast.
pub fn serving_cert(args: &MetricsApiArgs) -> Result<Arc<ServingCert>, StartError> {
    Ok(
        match (&args.metrics_api_cert_file, &args.metrics_api_key_file) {
            (Some(c), Some(k)) => {
                let cert = ServingCert::from_files(c, k)?;
                tracing::info!(target: "ballast::metrics_api", cert = %c.display(), key = %k.display(), "serving the certificate in these files; re-read when they change");
                Arc::clone(&cert).watch(RELOAD_EVERY);
                cert
            }
            _ => {
                let names = default_names(args.metrics_api_host);
                let (pair, _) = self_signed(&names)?;
                tracing::warn!(target: "ballast::metrics_api", names = ?names, "no --metrics-api-cert-file: serving a self-signed certificate made at start; an APIService must then skip TLS verification (insecureSkipTLSVerify)");
                ServingCert::fixed(pair)
            }
        },
    )
}

/// Starts the metrics APIs on `args`' address with `cert` ([`serving_cert`]), answering
/// from `board` while `leading`, and returns the bound address and the server (dropping
/// it closes the port). Reviews go to the API
/// server through `client`, which also watches `kube-system/extension-apiserver-authentication`.
pub async fn start(
    args: &MetricsApiArgs,
    port: u16,
    cert: Arc<ServingCert>,
    board: Arc<Board>,
    leading: Arc<AtomicBool>,
    client: Client,
) -> Result<(SocketAddr, Connections), StartError> {
    let addr = SocketAddr::new(args.metrics_api_host, port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?;
    let config = AuthConfig::default();
    let shared = Arc::new(Shared {
        board,
        leading,
        guard: Guard::new(client.clone()),
        tls: RwLock::new(Arc::new(Tls::new(Arc::clone(&cert), &config.cas))),
        config: RwLock::new(Arc::new(config)),
        cert,
    });
    tokio::spawn(watch_auth_config(client, Arc::clone(&shared)));
    let connections = Connections::start_with(listener, TlsAccept(shared), &LIMITS);
    println!("ballast operator metrics APIs listening on https://{bound}");
    Ok((bound, connections))
}

/// The names a self-signed certificate carries.
fn default_names(host: IpAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if !host.is_unspecified() && !host.is_loopback() {
        names.push(host.to_string());
    }
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() {
            names.push(h.to_string());
        }
    }
    names
}

/// Follows the API server's authentication ConfigMap; until it is read, only bearer
/// tokens authenticate.
async fn watch_auth_config(client: Client, shared: Arc<Shared>) {
    let (ns, name) = AUTH_CONFIGMAP;
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher::watcher(api, config));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                match AuthConfig::from_data(&cm.data.unwrap_or_default()) {
                    Ok(c) => {
                        tracing::info!(target: "ballast::metrics_api", front_proxy_ca = !c.cas.requestheader.is_empty(), client_ca = !c.cas.client.is_empty(), allowed_names = ?c.allowed_names, "read {ns}/{name}");
                        shared.set_config(c);
                    }
                    Err(e) => {
                        tracing::warn!(target: "ballast::metrics_api", error = %e, "keeping the last {ns}/{name}")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(target: "ballast::metrics_api", error = %e, "cannot watch {ns}/{name}")
            }
        }
    }
}

/// Each connection's TLS handshake, and the router that answers it as the peer its
/// certificate (if any) makes it.
struct TlsAccept(Arc<Shared>);

impl Accept for TlsAccept {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;

    fn accept(&self, tcp: TcpStream) -> BoxFuture<std::io::Result<(Self::Io, Router)>> {
        let shared = Arc::clone(&self.0);
        Box::pin(async move {
            let tls = shared.tls();
            let stream = tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.server))
                .accept(tcp)
                .await?;
            let cert = Arc::new(tls.classify(stream.get_ref().1.peer_certificates()));
            let app = Router::new().fallback(move |req: axum::extract::Request| {
                let (shared, cert) = (Arc::clone(&shared), Arc::clone(&cert));
                async move { handle(&shared, &cert, req).await }
            });
            Ok((stream, app))
        })
    }
}

fn json_response(code: StatusCode, body: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("a valid response")
}

fn failure(f: &Failure) -> Response<Body> {
    json_response(f.code, &f.body())
}

/// One request: parse, authenticate, authorize, answer. Never panics on input.
async fn handle<B>(shared: &Shared, cert: &PeerCert, req: Request<B>) -> Response<Body> {
    let accept = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let path = req.uri().path().to_string();
    let parsed = match api::parse(req.method(), &path, req.uri().query(), accept) {
        Ok(p) => p,
        Err(f) => return failure(&f),
    };
    if parsed == ApiRequest::Health {
        return Response::new(Body::from("ok"));
    }
    let config = shared.config();
    let refused = |r: Refusal| {
        tracing::debug!(target: "ballast::metrics_api", %path, refusal = ?r, "refused");
        let (code, reason, message) = match r {
            Refusal::Unauthenticated(m) => (StatusCode::UNAUTHORIZED, "Unauthorized", m),
            Refusal::Forbidden(m) => (StatusCode::FORBIDDEN, "Forbidden", m),
            Refusal::ReviewFailed(m) => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError", m),
        };
        failure(&Failure::new(code, reason, message))
    };
    let caller = match shared
        .guard
        .authenticate(&config, cert, req.headers())
        .await
    {
        Ok(c) => c,
        Err(r) => return refused(r),
    };
    if let Some(attributes) = parsed.attributes(&path)
        && let Err(r) = shared.guard.authorize(&caller, &attributes).await
    {
        return refused(r);
    }
    let needs_values = matches!(
        parsed,
        ApiRequest::Object { .. } | ApiRequest::Pods { .. } | ApiRequest::External { .. }
    );
    if needs_values && !shared.leading.load(Ordering::SeqCst) {
        return failure(&Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "this operator replica is on standby; only the leader has values (its Service selects the leader's pod)",
        ));
    }
    match api::respond(&parsed, &shared.board, Instant::now()) {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(f) => failure(&f),
    }
}
