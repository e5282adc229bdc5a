//! What kube-proxy does for one Service, for tests: each request goes to one of the pods
//! the Service's selector matches whose `Ready` condition is True (so a pod whose
//! `ballast.dev/accepting` gate is False gets no new request), round robin. Nothing more: no
//! retry, no holding. EndpointSlices are not used because the API server refuses loopback
//! endpoint addresses; the ready pods are what an endpoint controller would list.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};

/// A running proxy.
pub struct ServiceProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The pods requests go to now, by IP.
    pub ready: Arc<RwLock<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[derive(Clone)]
struct ProxyState {
    ready: Arc<RwLock<Vec<String>>>,
    next: Arc<AtomicUsize>,
    port: i32,
    client: reqwest::Client,
}

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Proxies to the ready pods matching `selector` in `namespace` on `port`.
pub async fn start(
    client: Client,
    namespace: &str,
    selector: &str,
    port: i32,
) -> std::io::Result<ServiceProxy> {
    let ready: Arc<RwLock<Vec<String>>> = Arc::default();
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let list = ListParams::default().labels(selector);
    let watch_ready = Arc::clone(&ready);
    let refresh = tokio::spawn(async move {
        loop {
            if let Ok(l) = pods.list(&list).await {
                let ips: Vec<String> = l
                    .items
                    .iter()
                    .filter(|p| is_ready(p))
                    .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                    .collect();
                *watch_ready.write().unwrap_or_else(|e| e.into_inner()) = ips;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let state = ProxyState {
        ready: Arc::clone(&ready),
        next: Arc::default(),
        port,
        client: reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(std::io::Error::other)?,
    };
    let app = Router::new().fallback(forward).with_state(state);
    let serve = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(ServiceProxy {
        url,
        ready,
        tasks: vec![refresh, serve],
    })
}

async fn forward(State(s): State<ProxyState>, req: Request) -> Response {
    let ip = {
        let ready = s.ready.read().unwrap_or_else(|e| e.into_inner());
        if ready.is_empty() {
            return (StatusCode::SERVICE_UNAVAILABLE, "no ready endpoint").into_response();
        }
        ready[s.next.fetch_add(1, Ordering::Relaxed) % ready.len()].clone()
    };
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let Ok(bytes) = axum::body::to_bytes(body, 64 << 20).await else {
        return (StatusCode::BAD_REQUEST, "unreadable body").into_response();
    };
    let mut out = s
        .client
        .request(parts.method, format!("http://{ip}:{}{path}", s.port))
        .body(bytes);
    for (k, v) in parts.headers.iter() {
        if k != "host" && k != "content-length" {
            out = out.header(k, v);
        }
    }
    match out.send().await {
        Ok(r) => {
            let mut resp = Response::builder().status(r.status().as_u16());
            for (k, v) in r.headers() {
                if k != "content-length" && k != "transfer-encoding" {
                    resp = resp.header(k.as_str(), v.as_bytes());
                }
            }
            resp.body(Body::from_stream(
                r.bytes_stream().map(|c| c.map_err(std::io::Error::other)),
            ))
            .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
