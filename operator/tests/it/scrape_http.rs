//! The scraper against small HTTP servers on loopback: each failure has its reason, the
//! body limit holds while streaming, and the concurrency bound is respected.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::routing::get;
use axum::serve::ListenerExt;
use ballast_operator::scrape::{ScrapeConfig, ScrapeError, Scraper, Target, Tracker};
use ballast_operator::signals::Dialect;

const BODY: &str = include_str!("../fixtures/ballast_dp2_loaded.prom");

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn scraper(timeout_ms: u64, max_body_bytes: usize, concurrency: usize) -> Scraper {
    // The program chooses the TLS provider (the `ballast` binary does in main).
    let _ = rustls::crypto::ring::default_provider().install_default();
    Scraper::new(ScrapeConfig {
        timeout: Duration::from_millis(timeout_ms),
        max_body_bytes,
        concurrency,
        ..ScrapeConfig::default()
    })
}

async fn one(
    scraper: &Scraper,
    base: &str,
) -> Result<ballast_operator::signals::ReplicaSample, ScrapeError> {
    scraper
        .scrape_one(Dialect::Ballast, &Target::new("r", base))
        .await
        .result
}

#[tokio::test]
async fn a_good_replica_gives_its_sample() {
    let base = serve(Router::new().route("/metrics", get(|| async { BODY }))).await;
    let s = one(&scraper(2000, BODY.len(), 4), &base).await.unwrap();
    assert_eq!(s.running, Some(2.0));
    assert_eq!(s.rejections_sum(), Some(6.0));
    // One byte less than the body is too large, refused from Content-Length.
    let e = one(&scraper(2000, BODY.len() - 1, 4), &base)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "too_large");
}

#[tokio::test]
async fn a_slow_replica_times_out() {
    let base = serve(
        Router::new()
            .route(
                "/metrics",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    BODY
                }),
            )
            .route(
                "/trickle",
                get(|| async {
                    // Headers at once, then one line every 200 ms.
                    let lines = futures::stream::unfold(0u64, |i| async move {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        let line = format!("ballast_num_requests_running{{engine=\"{i}\"}} 1\n");
                        Some((Ok::<_, Infallible>(Bytes::from(line)), i + 1))
                    });
                    Body::from_stream(lines)
                }),
            ),
    )
    .await;
    // Slow headers.
    let start = Instant::now();
    let e = one(&scraper(300, 1 << 20, 4), &base).await.unwrap_err();
    assert_eq!(e, ScrapeError::Timeout(Duration::from_millis(300)));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // A body that keeps coming slowly: the limit is on the whole scrape, not per read.
    let trickle = Scraper::new(ScrapeConfig {
        path: "/trickle".into(),
        timeout: Duration::from_millis(700),
        ..ScrapeConfig::default()
    });
    let start = Instant::now();
    let e = one(&trickle, &base).await.unwrap_err();
    assert_eq!(e, ScrapeError::Timeout(Duration::from_millis(700)));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn an_endless_body_is_cut_at_the_limit() {
    const CHUNK: usize = 64 * 1024;
    const LIMIT: usize = 256 * 1024;
    let produced = Arc::new(AtomicUsize::new(0));
    let counter = produced.clone();
    let base = serve(Router::new().route(
        "/metrics",
        get(move || {
            let counter = counter.clone();
            async move {
                // Up to 1 GiB of comment lines, without Content-Length, made on demand.
                let chunks = futures::stream::unfold(0usize, move |n| {
                    let counter = counter.clone();
                    async move {
                        if n * CHUNK >= 1 << 30 {
                            return None;
                        }
                        counter.fetch_add(CHUNK, Ordering::SeqCst);
                        let mut chunk = vec![b'#'; CHUNK];
                        chunk[CHUNK - 1] = b'\n';
                        Some((Ok::<_, Infallible>(Bytes::from(chunk)), n + 1))
                    }
                });
                Body::from_stream(chunks)
            }
        }),
    ))
    .await;
    let e = one(&scraper(5000, LIMIT, 4), &base).await.unwrap_err();
    assert_eq!(e, ScrapeError::TooLarge { limit: LIMIT });
    // Give the server a moment to notice the closed connection, then check it stopped
    // far short of the gigabyte: only socket buffers' worth was ever sent.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = produced.load(Ordering::SeqCst);
    assert!(sent < 64 << 20, "server produced {sent} bytes");
}

#[tokio::test]
async fn an_error_status_is_http_status() {
    let base = serve(Router::new().route(
        "/metrics",
        get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, BODY) }),
    ))
    .await;
    let e = one(&scraper(2000, 1 << 20, 4), &base).await.unwrap_err();
    assert_eq!(e, ScrapeError::HttpStatus(500));
    assert_eq!(e.reason(), "http_status");
    // Redirects are not followed: a replica's metrics are where it is.
    let base = serve(Router::new().route(
        "/metrics",
        get(|| async {
            (
                StatusCode::FOUND,
                [("location", "http://example.invalid/")],
                "",
            )
        }),
    ))
    .await;
    let e = one(&scraper(2000, 1 << 20, 4), &base).await.unwrap_err();
    assert_eq!(e, ScrapeError::HttpStatus(302));
}

#[tokio::test]
async fn garbage_is_a_parse_error() {
    let base = serve(
        Router::new()
            .route(
                "/metrics",
                get(|| async { "<html>hello</html>\nNaN NaN\n" }),
            )
            .route(
                "/other",
                get(|| async { "vllm:num_requests_running{engine=\"0\"} 3\n" }),
            ),
    )
    .await;
    let s = scraper(2000, 1 << 20, 4);
    let e = one(&s, &base).await.unwrap_err();
    // `<html>…` has no metric name: rejected. `NaN NaN` names a series `NaN`, a family
    // no decision reads: skipped unparsed, so not counted.
    assert_eq!(
        e,
        ScrapeError::Parse {
            samples: 0,
            errors: 1
        }
    );
    assert_eq!(e.reason(), "parse");
    // Valid text in another engine's dialect has no usable sample either: none of its
    // families is read, so nothing is parsed.
    let e = Scraper::new(ScrapeConfig {
        path: "/other".into(),
        ..ScrapeConfig::default()
    })
    .scrape_one(Dialect::Ballast, &Target::new("r", base))
    .await
    .result
    .unwrap_err();
    assert_eq!(
        e,
        ScrapeError::Parse {
            samples: 0,
            errors: 0
        }
    );
}

#[tokio::test]
async fn a_closed_port_is_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = one(&scraper(2000, 1 << 20, 4), &format!("http://{addr}"))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "connect", "{e}");
}

#[tokio::test]
async fn concurrency_bound_is_respected() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (f, p) = (in_flight.clone(), peak.clone());
    let base = serve(Router::new().route(
        "/metrics",
        get(move || {
            let (f, p) = (f.clone(), p.clone());
            async move {
                let now = f.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                f.fetch_sub(1, Ordering::SeqCst);
                BODY
            }
        }),
    ))
    .await;
    let targets: Vec<Target> = (0..12)
        .map(|i| Target::new(format!("r{i}"), base.clone()))
        .collect();
    let start = Instant::now();
    let outcomes = scraper(5000, 1 << 20, 3)
        .scrape(Dialect::Ballast, &targets)
        .await;
    let elapsed = start.elapsed();
    assert_eq!(peak.load(Ordering::SeqCst), 3);
    // 12 scrapes of 100 ms, at most 3 at a time, take at least 400 ms (not 100 ms); the
    // peak of 3 shows they did overlap (not 1.2 s one by one).
    assert!(elapsed >= Duration::from_millis(390), "{elapsed:?}");
    // Outcomes come back in target order, and feed the tracker.
    let names: Vec<_> = outcomes.iter().map(|o| o.target.clone()).collect();
    let expected: Vec<_> = targets.iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, expected);
    let fleet = Tracker::new().observe_outcomes(Instant::now(), &outcomes, 0);
    assert_eq!(fleet.reporting(), 12);
    assert_eq!(fleet.capacity_waiting, Some(12.0));
}

#[tokio::test]
async fn a_slow_replica_holds_only_its_own_slot() {
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = served.clone();
    let base = serve(
        Router::new()
            .route(
                "/slow/metrics",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    BODY
                }),
            )
            .route(
                "/metrics",
                get(move || {
                    let log = log.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        log.lock().unwrap().push(Instant::now());
                        BODY
                    }
                }),
            ),
    )
    .await;
    // The slow one first, 2 slots: the 20 others go through the free slot one after the
    // other (about 1 s). Were outcomes collected in order, the finished ones would keep
    // their slot until the slow one is done, and most would be served after 1.5 s.
    let mut targets = vec![Target::new("slow", format!("{base}/slow"))];
    targets.extend((0..20).map(|i| Target::new(format!("r{i}"), base.clone())));
    let start = Instant::now();
    let outcomes = scraper(5000, 1 << 20, 2)
        .scrape(Dialect::Ballast, &targets)
        .await;
    assert!(outcomes.iter().all(|o| o.result.is_ok()));
    assert_eq!(outcomes[0].target, "slow");
    assert!(outcomes[0].duration >= Duration::from_millis(1500));
    let served = served.lock().unwrap();
    assert_eq!(served.len(), 20);
    let last = served.iter().max().unwrap().duration_since(start);
    assert!(
        last < Duration::from_millis(1400),
        "last fast one served at {last:?}"
    );
}

#[tokio::test]
async fn scrapes_reuse_their_connections() {
    let accepted = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new().route("/metrics", get(|| async { BODY }));
    let counter = accepted.clone();
    let listener = listener.tap_io(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let scraper = scraper(2000, 1 << 20, 1);
    let targets = [Target::new("r", base)];
    for _ in 0..5 {
        let outcomes = scraper.scrape(Dialect::Ballast, &targets).await;
        assert!(outcomes[0].result.is_ok());
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one keep-alive connection"
    );
}

/// A raw server: answers the n-th request on a connection with `respond(n)`, or closes
/// the connection without an answer on `None`; closes it after each answer when
/// `close_after` says so.
async fn raw_server(
    respond: impl Fn(usize) -> Option<Vec<u8>> + Send + Sync + 'static,
    close_after: bool,
) -> (String, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let (count, respond) = (accepted.clone(), Arc::new(respond));
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            let respond = respond.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut have = 0;
                let mut n = 0;
                loop {
                    match stream.read(&mut buf[have..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => have += k,
                    }
                    if buf[..have].windows(4).any(|w| w == b"\r\n\r\n") {
                        have = 0;
                        let Some(answer) = respond(n) else {
                            return;
                        };
                        n += 1;
                        let _ = stream.write_all(&answer).await;
                        if close_after {
                            return;
                        }
                    }
                }
            });
        }
    });
    (base, accepted)
}

fn response(head: &str, body: &str) -> Vec<u8> {
    format!("{head}\r\n\r\n{body}").into_bytes()
}

#[tokio::test]
async fn a_connection_the_replica_closed_while_idle_is_replaced() {
    // Keep-alive announced, but the server closes each connection after one response,
    // as one with a short idle timeout does between scrapes.
    let ok = || {
        response(
            &format!("HTTP/1.1 200 OK\r\nContent-Length: {}", BODY.len()),
            BODY,
        )
    };
    let (base, accepted) = raw_server(move |_| Some(ok()), true).await;
    let s = scraper(2000, 1 << 20, 1);
    for _ in 0..3 {
        assert_eq!(one(&s, &base).await.unwrap().running, Some(2.0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    // The race: the connection looks alive, then the server drops the next request
    // unanswered. The request goes once more, on a new connection.
    let (base, accepted) = raw_server(move |n| (n == 0).then(ok), false).await;
    for _ in 0..3 {
        assert_eq!(one(&s, &base).await.unwrap().running, Some(2.0));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    assert_eq!(s.idle_connections(), 2, "one per replica");
}

#[tokio::test]
async fn bodies_framed_every_way_are_read_and_broken_ones_are_body_errors() {
    let len = BODY.len();
    let chunked: String = BODY
        .as_bytes()
        .chunks(1000)
        .map(|c| format!("{:x}\r\n{}\r\n", c.len(), std::str::from_utf8(c).unwrap()))
        .chain(["0\r\n\r\n".to_owned()])
        .collect();
    let cases: Vec<(Vec<u8>, Result<(), &str>)> = vec![
        // HTTP/1.0, delimited by the connection closing.
        (response("HTTP/1.0 200 OK", BODY), Ok(())),
        (
            response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", &chunked),
            Ok(()),
        ),
        (
            response("HTTP/1.1 200 OK\r\nConnection: close", BODY),
            Ok(()),
        ),
        // Cut short: fewer bytes than announced, then the connection closes.
        (
            response(
                &format!("HTTP/1.1 200 OK\r\nContent-Length: {}", len + 10),
                BODY,
            ),
            Err("body"),
        ),
        (
            response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", "5\r\nab"),
            Err("body"),
        ),
        (
            response("HTTP/1.1 200 OK\r\nContent-Encoding: gzip", BODY),
            Err("body"),
        ),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n".to_vec(), Err("body")),
        (Vec::new(), Err("connect")),
    ];
    for (raw, want) in cases {
        let (base, _) = raw_server(move |_| Some(raw.clone()), true).await;
        let got = one(&scraper(2000, 1 << 20, 1), &base).await;
        match want {
            Ok(()) => assert_eq!(got.unwrap().running, Some(2.0)),
            Err(reason) => assert_eq!(got.unwrap_err().reason(), reason),
        }
    }
}

#[tokio::test]
async fn only_http_targets_are_scraped() {
    let e = one(&scraper(2000, 1 << 20, 1), "https://127.0.0.1:1")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "connect");
    assert!(e.to_string().contains("only http://"), "{e}");
}

/// The held requests of a service's pickers: summed over those that answer, the longest
/// hold kept; a picker that is down or not a gateway adds nothing, and with none
/// answering the demand is unknown (`None`), never 0.
#[tokio::test]
async fn held_requests_are_summed_over_the_pickers_that_answer() {
    let picker = |held: u32, oldest: f64| {
        Router::new().route(
            "/metrics",
            get(move || async move {
                format!(
                    "# TYPE ballast_gateway_held_requests gauge\nballast_gateway_held_requests{{pool=\"chat\"}} {held}\n# TYPE ballast_gateway_oldest_hold_seconds gauge\nballast_gateway_oldest_hold_seconds{{pool=\"chat\"}} {oldest}\n"
                )
            }),
        )
    };
    let a = serve(picker(3, 1.5)).await;
    let b = serve(picker(2, 4.0)).await;
    let engine = serve(Router::new().route("/metrics", get(|| async { BODY }))).await;
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let s = scraper(500, 1 << 20, 4);
    let targets = |bases: &[&str]| -> Vec<Target> {
        bases
            .iter()
            .enumerate()
            .map(|(i, b)| Target::new(format!("p{i}"), *b))
            .collect()
    };
    let held = s.held(&targets(&[&a, &b, &down, &engine])).await.unwrap();
    assert_eq!(held.requests, 5.0);
    assert_eq!(held.oldest_seconds, 4.0);
    assert_eq!(held.pickers, 2);
    assert_eq!(s.held(&targets(&[&down, &engine])).await, None);
    assert_eq!(s.held(&[]).await, None);
}
