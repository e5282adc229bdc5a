//! A server that closes kept-alive connections: `ballast bench` sends a request again when
//! the server closed (or reset) its connection before answering — the request never got an
//! answer, as when an HTTP/1.1 server closes an idle connection just as a request is sent
//! on it (a drain, a keep-alive timeout) — and counts it in `requests.retried`; anything
//! else stays a failure, and the resends are bounded.
//!
//! The server is raw TCP, so each connection's fate is exact: it answers the first `serve`
//! requests of a connection and then closes it when the next one arrives, without reading
//! it, or reading it (the client cannot tell the two apart), with a FIN or a reset.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ballast_bench::{BenchArgs, Report};
use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a connection ends once it served its requests.
#[derive(Clone, Copy, Debug)]
enum Close {
    /// FIN, the request left unread (the kernel may answer its bytes with a reset).
    Fin,
    /// A reset (SO_LINGER 0), the request left unread.
    Reset,
    /// The request is read whole, then FIN without a byte of response.
    AfterReading,
}

#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    answered: AtomicU64,
    dropped: AtomicU64,
}

/// Reads one request (head and `content-length` body); false if the client closed.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                buf.drain(..end + 4 + len);
                return true;
            }
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn connection(mut s: TcpStream, serve: usize, close: Close, counts: Arc<Counts>) {
    let body = r#"{"choices":[{"index":0,"text":"hi"}],"usage":{"prompt_tokens":4,"completion_tokens":2}}"#;
    let mut buf = Vec::new();
    for _ in 0..serve {
        if !read_request(&mut s, &mut buf).await {
            return;
        }
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        counts.answered.fetch_add(1, Ordering::SeqCst);
    }
    // The next request: wait until its first bytes are here, so the client has sent it
    // on this (by now pooled) connection, then close without answering.
    let mut byte = [0u8; 1];
    match s.peek(&mut byte).await {
        Ok(1..) => {}
        _ => return,
    }
    counts.dropped.fetch_add(1, Ordering::SeqCst);
    match close {
        Close::Fin => drop(s),
        Close::Reset => {
            s.set_zero_linger().unwrap();
            drop(s);
        }
        Close::AfterReading => {
            read_request(&mut s, &mut buf).await;
            drop(s);
        }
    }
}

/// Serves on a loopback port: each connection answers `serve` requests (the first one
/// `serve_first`: it takes the benchmark's start-up probe), then closes.
async fn server(serve_first: usize, serve: usize, close: Close) -> (String, Arc<Counts>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let n = if c.connections.fetch_add(1, Ordering::SeqCst) == 0 {
                serve_first
            } else {
                serve
            };
            tokio::spawn(connection(s, n, close, c.clone()));
        }
    });
    (url, counts)
}

/// `counter` once the server's tasks have counted what the client already saw: they count
/// an answer after writing it, so the client can finish first. Waits up to 2 s for `want`.
async fn settled(counter: &AtomicU64, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while counter.load(Ordering::SeqCst) != want && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    counter.load(Ordering::SeqCst)
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

async fn bench(url: &str, flags: &str) -> Report {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let argv = ["bench", "--url", url, "--no-progress", "--model", "m"]
        .into_iter()
        .chain(flags.split_whitespace());
    ballast_bench::measure(Cli::try_parse_from(argv).unwrap().args)
        .await
        .expect("the benchmark runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_closed_before_the_answer_is_resent_not_failed() {
    for close in [Close::Fin, Close::Reset, Close::AfterReading] {
        // One request per connection: every reuse of a pooled connection meets a close.
        let (url, counts) = server(1, 1, close).await;
        let r = bench(&url, "--concurrency 1 --num-requests 12").await;
        assert_eq!(
            (r.requests.ok, r.requests.failed),
            (12, 0),
            "{close:?}: {:?}",
            r.errors
        );
        // Every second request meets a pooled connection on its second use (the probe
        // took the first one), is dropped and resent on a new connection of its own;
        // the next request then opens a new pooled connection.
        assert_eq!(r.requests.retried, 6, "{close:?}: {:?}", r.requests);
        assert_eq!(counts.dropped.load(Ordering::SeqCst), 6, "{close:?}");
        assert_eq!(settled(&counts.answered, 13).await, 13, "{close:?}");
        assert!(
            r.render_table().contains("6 resent"),
            "{}",
            r.render_table()
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["requests"]["retried"], 6);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_closing_connections_all_complete() {
    // Two requests per connection, eight workers: closes hit requests at random points.
    let (url, counts) = server(2, 2, Close::Reset).await;
    let r = bench(&url, "--concurrency 8 --num-requests 64").await;
    assert_eq!(
        (r.requests.ok, r.requests.failed),
        (64, 0),
        "{:?}",
        r.errors
    );
    assert_eq!(r.requests.retried, counts.dropped.load(Ordering::SeqCst));
    assert!(r.requests.retried > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_failed_after_bounded_resends() {
    // Not even the first request of a connection is answered: resending cannot help,
    // and the request is counted failed after one resend (on a new connection), with the
    // error.
    let (url, counts) = server(1, 0, Close::Fin).await;
    let r = bench(&url, "--concurrency 2 --num-requests 6").await;
    assert_eq!((r.requests.ok, r.requests.failed), (0, 6));
    assert_eq!(r.requests.retried, 6, "one resend each");
    assert_eq!(settled(&counts.answered, 1).await, 1, "the probe only");
    assert!(
        r.errors.iter().any(|e| e
            .message
            .contains("connection closed before message completed")
            || e.message.contains("reset")),
        "{:?}",
        r.errors
    );
}
