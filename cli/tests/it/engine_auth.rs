//! API keys and the HTTP server's limits on the real `ballast engine` process, over plain
//! TCP on loopback: who gets 401 and with what body, rotation through the key file, the
//! refusal to start without keys, a huge header, and a slow-loris flood that must not lock
//! a normal client out.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::engine::{Log, spawn_engine, wait_exit};
use serde_json::Value;

/// One HTTP/1.1 request on a new connection: (status, headers, body).
fn request(base: &str, head: &str) -> (u16, String, String) {
    let addr = base.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = headers
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, headers.to_string(), body.to_string())
}

/// `GET path` with `auth` as the Authorization header, if any.
fn get(base: &str, path: &str, auth: Option<&str>) -> (u16, String, String) {
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    request(
        base,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"),
    )
}

/// The JSON of a body, chunked or not (the engine sends a length for these).
fn json(body: &str) -> Value {
    serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

const OLD: &str = "sk-old-4f1c9e0a7b";
const NEW: &str = "sk-new-93d2a6c1e8";
const NEXT: &str = "sk-next-5e7b0c2d91";

#[test]
fn api_keys_guard_v1_and_rotate_through_the_key_file() {
    let _group = crate::common::group(module_path!());
    let dir = std::env::temp_dir().join(format!("ballast-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("{OLD}\n{NEW}\n")).unwrap();
    let e = spawn_engine(&["--api-key-file", keys.to_str().unwrap()], Log::Capture);
    let b = e.base.as_str();

    let (code, headers, body) = get(b, "/v1/models", None);
    assert_eq!(code, 401, "{headers}");
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{headers}"
    );
    let err = json(&body);
    assert_eq!(err["error"]["code"], "invalid_api_key", "{body}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing")
    );
    for bad in [
        "Bearer sk-wrong",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "bearer sk-old-4f1c9e0a7",
    ] {
        let (code, _, body) = get(b, "/v1/models", Some(bad));
        assert_eq!(code, 401, "{bad}: {body}");
        assert_eq!(json(&body)["error"]["code"], "invalid_api_key");
    }
    // An unknown /v1 route needs the key too; with one it is a 404.
    assert_eq!(get(b, "/v1/nope", None).0, 401);
    assert_eq!(get(b, "/v1/nope", Some(&format!("Bearer {OLD}"))).0, 404);
    for key in [OLD, NEW] {
        let (code, _, body) = get(b, "/v1/models", Some(&format!("Bearer {key}")));
        assert_eq!(code, 200, "{body}");
        assert!(json(&body)["data"].is_array());
    }
    // Health and metrics stay open; the refusals are counted with their status.
    assert_eq!(get(b, "/health", None).0, 200);
    let (code, _, metrics) = get(b, "/metrics", None);
    assert_eq!(code, 200);
    let refused: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("ballast_http_requests_total{endpoint=\"/v1/models\"")
                && l.contains("status=\"401\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(refused, 5.0, "401s of /v1/models counted\n{metrics}");

    // Rotation: the file now holds NEW and NEXT; OLD stops working within a few polls.
    std::fs::write(&keys, format!("{NEW}\n{NEXT}\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(b, "/v1/models", Some(&format!("Bearer {OLD}"))).0 != 401 {
        assert!(Instant::now() < deadline, "the old key still works");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(get(b, "/v1/models", Some(&format!("Bearer {NEXT}"))).0, 200);
    assert_eq!(get(b, "/v1/models", Some(&format!("Bearer {NEW}"))).0, 200);
    // A file emptied by mistake keeps the keys loaded before: it never opens the API.
    std::fs::write(&keys, "").unwrap();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(get(b, "/v1/models", None).0, 401);
    assert_eq!(get(b, "/v1/models", Some(&format!("Bearer {NEXT}"))).0, 200);

    // No key appears in the metrics or the log.
    let (_, _, metrics) = get(b, "/metrics", None);
    let log = e.log.lock().unwrap().clone();
    for key in [OLD, NEW, NEXT] {
        assert!(!metrics.contains(key), "{key} in /metrics");
        assert!(!log.contains(key), "{key} in the log:\n{log}");
    }
    assert!(log.contains("API key file changed"), "{log}");
    drop(e);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What `spec.auth` gives the operator: the first key of the Secret's text, sent on every
/// scrape, so an engine with `--metrics-require-key` still tells the autoscaler its state.
#[test]
fn the_operators_scraper_reads_a_keyed_metrics_endpoint_with_the_first_key() {
    let _group = crate::common::group(module_path!());
    use ballast_operator::scrape::{ScrapeConfig, ScrapeError, ScrapeKey, Scraper, Target};
    use ballast_operator::signals::Dialect;

    let dir = std::env::temp_dir().join(format!("ballast-scrape-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    let text = format!("\n  {NEW}\n{OLD}\n");
    std::fs::write(&keys, &text).unwrap();
    let e = spawn_engine(
        &[
            "--api-key-file",
            keys.to_str().unwrap(),
            "--metrics-require-key",
        ],
        Log::Inherit,
    );
    assert_eq!(get(&e.base, "/metrics", None).0, 401);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let scrape = |key: Option<ScrapeKey>| {
        let scraper = Scraper::new(ScrapeConfig {
            key,
            ..ScrapeConfig::default()
        });
        let target = Target::new("r0", e.base.clone());
        rt.block_on(scraper.scrape_one(Dialect::Ballast, &target))
            .result
    };
    assert_eq!(scrape(None).unwrap_err(), ScrapeError::HttpStatus(401));
    let wrong = ScrapeKey::new("sk-wrong");
    assert_eq!(scrape(wrong).unwrap_err(), ScrapeError::HttpStatus(401));
    let sample = scrape(ScrapeKey::first_of(text.as_bytes())).expect("scraped with the key");
    assert_eq!(sample.running, Some(0.0), "{sample:?}");
    drop(e);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_engine_refuses_to_start_without_usable_keys() {
    let _group = crate::common::group(module_path!());
    let dir = std::env::temp_dir().join(format!("ballast-nokeys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n  \n").unwrap();
    let missing = dir.join("missing");
    for (file, says) in [(&empty, "holds no key"), (&missing, "cannot be read")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
            .args(["engine", "--port", "0", "--api-key-file"])
            .arg(file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started with {}", file.display());
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(file.to_str().unwrap()) && err.to_lowercase().contains(says),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_huge_header_gets_431_and_a_slow_loris_flood_does_not_lock_out_a_client() {
    let _group = crate::common::group(module_path!());
    // The test holds a thousand sockets; raise its own soft limit as the engine does.
    ballast_serve::raise_open_files_limit();
    let e = spawn_engine(
        &["--max-connections", "200", "--http-header-timeout", "30"],
        Log::Inherit,
    );
    let b = e.base.as_str();
    let big = "x".repeat(64 << 10);
    let (code, headers, _) = request(
        b,
        &format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(code, 431, "{headers}");

    // A thousand connections, each sending half a request head and then nothing.
    let addr = b.strip_prefix("http://").unwrap();
    let mut loris = common::Held::new(
        (0..1000)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ");
                s
            })
            .collect(),
    );
    // A normal client, each request whole, is served at once, several times over.
    for _ in 0..5 {
        let t = Instant::now();
        let (code, _, body) = get(b, "/v1/models", None);
        assert_eq!(code, 200, "{body}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "served in {:?} behind 1,000 slow clients",
            t.elapsed()
        );
    }
    // The flood was cut to the cap: most slow connections have been closed.
    let closed = loris.closed();
    assert!(closed >= 700, "{closed} of 1,000 slow connections closed");
    drop(loris);
    let mut e = e;
    let _ = e.child.kill();
    let _ = wait_exit(&mut e.child, Duration::from_secs(10));
}
