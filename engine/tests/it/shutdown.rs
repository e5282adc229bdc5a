//! The shutdown of the HTTP server (`server::serve`) on a loopback port, observed byte by
//! byte over raw TCP: what the responses say during `--shutdown-delay`, that hyper really
//! closes a connection after a `Connection: close` response (streams included), that idle
//! keep-alive connections are closed when the drain starts, and that in-flight streams
//! finish. `cli/tests/it/engine_shutdown.rs` does the same through SIGTERM to the binary.

use crate::common;

use ballast_engine::compute::device::ComputeBackend;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ballast_engine::Engine;
use ballast_engine::runtime::engine::ShutdownPhase;
use common::config;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any single read may wait before the test fails.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// One HTTP/1.1 response.
#[derive(Debug)]
struct Resp {
    status: u16,
    /// Header names lowercased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A raw HTTP/1.1 client connection: exactly one TCP connection, so what happens to it is
/// what happens to a pooled connection in a real client.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        Conn {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, method: &str, path: &str, body: Option<&Value>) {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: engine\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream.write_all(req.as_bytes()).await.unwrap();
    }

    /// Reads more bytes into the buffer; false at end of stream.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 << 10];
        let n = tokio::time::timeout(READ_TIMEOUT, self.stream.read(&mut chunk))
            .await
            .expect("the server went silent")
            .expect("read");
        self.buf.extend_from_slice(&chunk[..n]);
        n > 0
    }

    /// Reads until `needle` is buffered and returns the bytes before it (consuming both).
    async fn until(&mut self, needle: &[u8]) -> Vec<u8> {
        loop {
            if let Some(at) = self.buf.windows(needle.len()).position(|w| w == needle) {
                let out = self.buf[..at].to_vec();
                self.buf.drain(..at + needle.len());
                return out;
            }
            assert!(
                self.fill().await,
                "connection closed mid-response after {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        }
    }

    async fn exact(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.fill().await, "connection closed mid-body");
        }
        self.buf.drain(..n).collect()
    }

    /// The status line and headers of the next response.
    async fn head(&mut self) -> Resp {
        let head = String::from_utf8(self.until(b"\r\n\r\n").await).unwrap();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap();
        Resp {
            status: status.parse().unwrap(),
            headers: lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect(),
            body: Vec::new(),
        }
    }

    /// The next chunk of a chunked body; `None` after the last one.
    async fn chunk(&mut self) -> Option<Vec<u8>> {
        let size = String::from_utf8(self.until(b"\r\n").await).unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            self.until(b"\r\n").await;
            return None;
        }
        let data = self.exact(size).await;
        assert_eq!(self.exact(2).await, b"\r\n");
        Some(data)
    }

    /// The body of a response whose head was read.
    async fn body(&mut self, resp: &mut Resp) {
        if let Some(len) = resp.header("content-length") {
            resp.body = self.exact(len.parse().unwrap()).await;
        } else {
            assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
            while let Some(c) = self.chunk().await {
                resp.body.extend(c);
            }
        }
    }

    async fn request(&mut self, method: &str, path: &str, body: Option<&Value>) -> Resp {
        self.send(method, path, body).await;
        let mut resp = self.head().await;
        self.body(&mut resp).await;
        resp
    }

    /// Whether the server closes this connection within `within` (nothing else may
    /// arrive on it).
    async fn closed_within(&mut self, within: Duration) -> bool {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(within, self.stream.read(&mut byte)).await {
            Err(_) => false,
            Ok(Ok(0)) => true,
            // A reset is a close too (the kernel answers data sent to a closed socket so).
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
            Ok(other) => panic!("unexpected bytes on an idle connection: {other:?}"),
        }
    }
}

/// One request on a connection of its own; the response must close it.
async fn once(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> Resp {
    let mut c = Conn::open(addr).await;
    let resp = c.request(method, path, body).await;
    assert!(resp.closes(), "{path}: {:?}", resp.headers);
    assert!(
        c.closed_within(Duration::from_secs(5)).await,
        "{path}: hyper kept the connection open after Connection: close"
    );
    resp
}

fn short() -> Value {
    json!({"prompt": "short", "max_tokens": 2})
}

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_delay_serves_with_connection_close_then_the_drain_finishes_streams() {
    let delay = Duration::from_millis(2500);
    let engine = Engine::start(
        config(&[
            "--model",
            "synthetic:small",
            "--max-model-len",
            "4096",
            "--shutdown-delay",
            "2.5",
        ]),
        ComputeBackend::Cpu,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(ballast_engine::api::http::serve(
        engine.clone(),
        listener,
        async move {
            let _ = signalled.await;
        },
    ));

    // Before the signal connections are kept alive.
    let mut idle = Conn::open(addr).await;
    let r = idle.request("GET", "/health", None).await;
    assert_eq!((r.status, r.closes()), (200, false), "{r:?}");
    let mut pooled = Conn::open(addr).await;
    let r = pooled
        .request("POST", "/v1/completions", Some(&short()))
        .await;
    assert_eq!((r.status, r.closes()), (200, false), "{r:?}");
    // A long stream, running across the whole delay and into the drain: long enough at this
    // machine's decode speed (measured here, on the same connection) to outlast the delay
    // by several seconds, so a fast machine cannot finish it before the drain begins.
    let probe = 64;
    let t0 = Instant::now();
    let r = pooled
        .request(
            "POST",
            "/v1/completions",
            Some(&json!({"prompt": "probe", "max_tokens": probe, "ignore_eos": true})),
        )
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let per_second = probe as f64 / t0.elapsed().as_secs_f64();
    let tokens = ((per_second * (delay.as_secs_f64() + 8.0)) as usize).clamp(500, 4000);
    let mut stream = Conn::open(addr).await;
    let long = json!({"prompt": "keep going", "max_tokens": tokens, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    stream.send("POST", "/v1/completions", Some(&long)).await;
    let head = stream.head().await;
    assert_eq!((head.status, head.closes()), (200, false), "{head:?}");
    let mut streamed = stream.chunk().await.expect("a first event");

    // A client that sent half a request head and went quiet.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: engine\r\n")
        .await
        .unwrap();

    signal.send(()).unwrap();
    let signalled_at = Instant::now();
    while engine.shutdown_phase() == ShutdownPhase::Running {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(engine.shutdown_phase(), ShutdownPhase::Delaying);

    // During the delay: /health says terminating, new requests are served, and every
    // response closes its connection: fresh ones, pooled ones, streams.
    let h = once(addr, "GET", "/health", None).await;
    assert_eq!(h.status, 503);
    assert_eq!(h.json()["error"]["code"], "terminating", "{}", h.text());
    let c = once(addr, "POST", "/v1/completions", Some(&short())).await;
    assert_eq!(c.status, 200, "{}", c.text());
    assert_eq!(c.json()["usage"]["completion_tokens"], 2);
    let r = pooled
        .request("POST", "/v1/completions", Some(&short()))
        .await;
    assert_eq!((r.status, r.closes()), (200, true), "{r:?}");
    assert!(pooled.closed_within(Duration::from_secs(5)).await);
    let s = once(
        addr,
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": "s", "max_tokens": 3, "stream": true})),
    )
    .await;
    assert_eq!(s.status, 200);
    assert_eq!(events(&s.text()).last(), Some(&"[DONE]"), "{}", s.text());
    // HTTP/2 (no Connection header there) is served as well.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
        .post(format!("http://{addr}/v1/completions"))
        .json(&short())
        .send()
        .await
        .unwrap();
    assert_eq!(h2.version(), reqwest::Version::HTTP_2);
    assert_eq!(h2.status(), 200);
    assert!(h2.headers().get("connection").is_none());
    // An idle keep-alive connection that sends nothing is left alone meanwhile.
    assert!(!idle.closed_within(Duration::from_millis(100)).await);
    assert!(
        signalled_at.elapsed() < delay,
        "the checks above took longer than the delay ({:?}); they prove nothing",
        signalled_at.elapsed()
    );

    // The drain: the idle connection is closed by the server as it starts...
    assert!(
        idle.closed_within(delay + Duration::from_secs(5)).await,
        "idle keep-alive connections are closed when the drain starts"
    );
    assert!(signalled_at.elapsed() >= delay - Duration::from_millis(50));
    assert_eq!(engine.shutdown_phase(), ShutdownPhase::Draining);
    assert!(
        engine.in_flight() >= 1,
        "the {tokens}-token stream ended before the drain began ({per_second:.0} tokens/s \
         measured before the signal): too short for this machine"
    );
    // ...new requests are answered 503 (not refused), and not kept alive...
    let d = once(addr, "POST", "/v1/completions", Some(&short())).await;
    assert_eq!(d.status, 503);
    assert_eq!(d.json()["error"]["code"], "draining", "{}", d.text());
    let h = once(addr, "GET", "/health", None).await;
    assert_eq!(
        (h.status, h.json()["error"]["code"].as_str()),
        (503, Some("draining"))
    );
    // ...and the stream accepted before the signal is still in flight and runs to its end,
    // after which its connection is closed too.
    while let Some(c) = stream.chunk().await {
        streamed.extend(c);
    }
    let text = String::from_utf8(streamed).unwrap();
    let ev = events(&text);
    assert_eq!(ev.last(), Some(&"[DONE]"), "{text}");
    let usage: Value = serde_json::from_str(ev[ev.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], tokens, "{text}");
    assert!(stream.closed_within(Duration::from_secs(5)).await);

    // Then the server returns, the half-sent request holding it up for at most a few
    // seconds, and the port is closed.
    let drained_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("serve returns after the drain")
        .unwrap()
        .unwrap();
    assert!(
        drained_at.elapsed() < Duration::from_secs(8),
        "a half-sent request held the shutdown for {:?}",
        drained_at.elapsed()
    );
    drop(half);
    assert!(TcpStream::connect(addr).await.is_err(), "still listening");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_only_moves_forward_and_resume_cannot_undo_its_drain() {
    let engine = Engine::start(config(&[]), ComputeBackend::Cpu);
    assert_eq!(engine.shutdown_phase(), ShutdownPhase::Running);
    engine.advance_shutdown(ShutdownPhase::Delaying);
    assert_eq!(engine.shutdown_phase(), ShutdownPhase::Delaying);
    assert!(!engine.is_draining(), "the delay still admits");
    // The control API's drain and resume still work during the delay...
    engine.begin_drain();
    engine.resume();
    assert!(!engine.is_draining());
    // ...but not once the shutdown drains.
    engine.advance_shutdown(ShutdownPhase::Draining);
    assert!(engine.is_draining());
    engine.resume();
    assert!(engine.is_draining(), "resume ignored while shutting down");
    engine.advance_shutdown(ShutdownPhase::Delaying);
    assert_eq!(
        engine.shutdown_phase(),
        ShutdownPhase::Draining,
        "never back"
    );
    engine.shutdown();
}
