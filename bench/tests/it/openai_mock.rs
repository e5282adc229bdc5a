//! End-to-end tests: `run()` against a small in-process server that mimics
//! the OpenAI completions and chat APIs, with knobs for the behaviours a
//! benchmark has to measure (429s, slow tokens, errors, hangs).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use ballast_bench::{BenchArgs, BenchError, Report, RequestCounts};
use clap::Parser;
use futures::channel::mpsc;
use serde_json::{Value, json};

/// Extra prompt tokens the mock pretends a chat template adds, so tests can
/// tell `usage.prompt_tokens` apart from the locally generated length.
const CHAT_TEMPLATE_TOKENS: u64 = 7;

#[derive(Clone, Default)]
struct Behaviour {
    /// Every k-th request (counting from 1, in arrival order) gets HTTP 429.
    reject_every: Option<u64>,
    /// Answer every request with this HTTP status and an error body.
    fail_status: Option<StatusCode>,
    /// Before the first token (or before the whole non-streamed response).
    first_token_delay: Duration,
    /// Between streamed tokens.
    token_delay: Duration,
    /// Include `usage` (in the body, or as a final stream chunk).
    usage: bool,
    /// Send one token and then an error object mid-stream.
    mid_stream_error: bool,
    /// Never answer.
    hang: bool,
    /// Ids listed by GET /v1/models.
    models: Vec<&'static str>,
}

/// A request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    body: Value,
    tenant_header: Option<String>,
    authorization: Option<String>,
    custom_header: Option<String>,
}

#[derive(Default)]
struct Mock {
    behaviour: Behaviour,
    count: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    seen: Mutex<Vec<Seen>>,
}

impl Mock {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Decrements the in-flight gauge when a non-streamed handler returns.
struct InFlight<'a>(&'a Mock);

impl<'a> InFlight<'a> {
    fn enter(mock: &'a Mock) -> Self {
        let now = mock.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        mock.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(mock)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn models(State(mock): State<Arc<Mock>>) -> Json<Value> {
    let data: Vec<Value> = mock
        .behaviour
        .models
        .iter()
        .map(|id| json!({"id": id, "object": "model"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn completions(state: State<Arc<Mock>>, headers: HeaderMap, body: Json<Value>) -> Response {
    generate(state, headers, body, false).await
}

async fn chat(state: State<Arc<Mock>>, headers: HeaderMap, body: Json<Value>) -> Response {
    generate(state, headers, body, true).await
}

fn token_chunk(chat: bool) -> Value {
    if chat {
        json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": null}]})
    } else {
        json!({"object": "text_completion", "choices": [{"index": 0, "text": " tok", "finish_reason": null}]})
    }
}

async fn generate(
    State(mock): State<Arc<Mock>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
    chat: bool,
) -> Response {
    let n = mock.count.fetch_add(1, Ordering::SeqCst) + 1;
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
    mock.seen.lock().unwrap().push(Seen {
        body: body.clone(),
        tenant_header: header("x-tenant"),
        authorization: header("authorization"),
        custom_header: header("x-custom"),
    });
    let b = mock.behaviour.clone();
    if b.reject_every.is_some_and(|k| n % k == 0) {
        let err = json!({"error": {"message": "too many requests", "type": "rate_limit"}});
        return (StatusCode::TOO_MANY_REQUESTS, Json(err)).into_response();
    }
    if let Some(status) = b.fail_status {
        let err = json!({"error": {"message": "the engine is on fire", "type": "internal"}});
        return (status, Json(err)).into_response();
    }
    if b.hang {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }

    let max_tokens = body["max_tokens"].as_u64().unwrap();
    let prompt_tokens = if chat {
        let text = body["messages"][0]["content"].as_str().unwrap();
        text.split(' ').count() as u64 + CHAT_TEMPLATE_TOKENS
    } else {
        body["prompt"].as_array().unwrap().len() as u64
    };
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens + max_tokens});

    if body["stream"] != json!(true) {
        let _gauge = InFlight::enter(&mock);
        tokio::time::sleep(b.first_token_delay).await;
        let text = " tok".repeat(max_tokens as usize);
        let mut resp = if chat {
            json!({"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}]})
        } else {
            json!({"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": "length"}]})
        };
        if b.usage {
            resp["usage"] = usage;
        }
        return Json(resp).into_response();
    }

    let (tx, rx) = mpsc::unbounded::<Result<String, Infallible>>();
    tokio::spawn(async move {
        // Each event goes out in two writes, cut mid-JSON, so the client has
        // to reassemble lines across network reads.
        let send = |event: String| {
            let cut = event.len() / 2;
            let _ = tx.unbounded_send(Ok(event[..cut].to_string()));
            let _ = tx.unbounded_send(Ok(event[cut..].to_string()));
        };
        let data = |v: &Value| format!("data: {v}\n\n");
        send(": keep-alive comment\n\n".to_string());
        if chat {
            // OpenAI starts with a role-only delta; it is not a token.
            send(data(
                &json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            ));
        }
        tokio::time::sleep(b.first_token_delay).await;
        for i in 0..max_tokens {
            if i > 0 {
                tokio::time::sleep(b.token_delay).await;
            }
            send(data(&token_chunk(chat)));
            if b.mid_stream_error {
                send(data(
                    &json!({"error": {"message": "boom: engine crashed", "type": "internal_error"}}),
                ));
                break;
            }
        }
        if b.usage {
            send(data(&json!({"choices": [], "usage": usage})));
        }
        send("data: [DONE]\n\n".to_string());
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(rx))
        .unwrap()
}

/// Starts the mock on an ephemeral port; returns its base URL.
async fn serve(behaviour: Behaviour) -> (String, Arc<Mock>) {
    let mock = Arc::new(Mock {
        behaviour,
        ..Mock::default()
    });
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Like real inference servers: without TCP_NODELAY the second half of a
    // split event would wait ~40 ms for a delayed ACK.
    let listener = listener.tap_io(|tcp| tcp.set_nodelay(true).unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), mock)
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

/// Flags for `url`; `flags` is split at whitespace.
fn args(url: &str, flags: &str) -> BenchArgs {
    // The program chooses the TLS provider (the `ballast` binary does in main).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let argv = ["bench", "--url", url, "--no-progress"]
        .into_iter()
        .chain(flags.split_whitespace());
    Cli::try_parse_from(argv).expect("valid flags").args
}

async fn bench(url: &str, flags: &str) -> Report {
    ballast_bench::run(args(url, flags))
        .await
        .expect("benchmark runs")
}

fn counts(ok: u64, rejected: u64, failed: u64) -> RequestCounts {
    RequestCounts {
        total: ok + rejected + failed,
        ok,
        rejected,
        failed,
        retried: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_without_streaming_send_exact_prompts_and_read_usage() {
    let (url, mock) = serve(Behaviour {
        usage: true,
        ..Behaviour::default()
    })
    .await;
    let flags = "--model m --concurrency 4 --num-requests 20 --input-len 16 --output-len 8 --ignore-eos --temperature 0.5";
    let report = bench(&url, flags).await;

    assert_eq!(report.requests, counts(20, 0, 0));
    assert_eq!(report.mean_prompt_tokens, Some(16.0));
    assert_eq!(report.mean_completion_tokens, Some(8.0));
    assert_eq!(report.requests_without_usage, 0);
    assert!(report.ttft_s.is_none() && report.itl_s.is_none() && report.tpot_s.is_none());
    assert!(report.e2e_s.is_some());
    assert!(report.output_tokens_per_s > 0.0);
    assert_eq!(
        (report.mode.as_str(), report.mode_value),
        ("concurrency", 4.0)
    );

    let seen = mock.seen();
    assert_eq!(seen.len(), 20);
    for s in &seen {
        let b = &s.body;
        let prompt = b["prompt"].as_array().expect("prompt is token ids");
        assert_eq!(prompt.len(), 16);
        assert!(
            prompt
                .iter()
                .all(|t| (32..127).contains(&t.as_u64().unwrap()))
        );
        assert_eq!(b["max_tokens"], 8);
        assert_eq!(b["model"], "m");
        assert_eq!(b["temperature"], 0.5);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["stream"], false);
        assert!(b.get("user").is_none() && s.tenant_header.is_none());
    }
    assert!(mock.max_in_flight.load(Ordering::SeqCst) <= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streaming_reads_the_usage_chunk() {
    let (url, mock) = serve(Behaviour {
        usage: true,
        ..Behaviour::default()
    })
    .await;
    let flags = "--model m --endpoint chat --stream --concurrency 2 --num-requests 10 --input-len 12 --output-len 5";
    let report = bench(&url, flags).await;

    assert_eq!(report.requests, counts(10, 0, 0));
    // Prompt tokens come from the server's usage, not the local word count.
    assert_eq!(
        report.mean_prompt_tokens,
        Some((12 + CHAT_TEMPLATE_TOKENS) as f64)
    );
    assert_eq!(report.mean_completion_tokens, Some(5.0));
    assert_eq!(report.requests_without_usage, 0);
    assert!(report.ttft_s.is_some() && report.itl_s.is_some() && report.tpot_s.is_some());

    for s in mock.seen() {
        let b = &s.body;
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["messages"][0]["role"], "user");
        let words = b["messages"][0]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count();
        assert_eq!(words, 12);
        assert_eq!(b["max_tokens"], 5);
        assert!(b.get("ignore_eos").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_without_usage_counts_content_chunks() {
    let (url, _mock) = serve(Behaviour::default()).await;
    let flags = "--model m --stream --num-requests 6 --input-len 9 --output-len uniform:3:7";
    let report = bench(&url, flags).await;

    assert_eq!(report.requests, counts(6, 0, 0));
    assert_eq!(report.requests_without_usage, 6);
    assert_eq!(report.mean_prompt_tokens, Some(9.0));
    let mean = report.mean_completion_tokens.unwrap();
    assert!((3.0..=7.0).contains(&mean), "mean completion tokens {mean}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kth_request_rejected_with_429_is_counted_as_rejected() {
    let (url, mock) = serve(Behaviour {
        reject_every: Some(3),
        usage: true,
        ..Behaviour::default()
    })
    .await;
    let flags = "--model m --concurrency 4 --num-requests 30 --input-len 4 --output-len 2";
    let report = bench(&url, flags).await;

    assert_eq!(mock.count.load(Ordering::SeqCst), 30);
    assert_eq!(report.requests, counts(20, 10, 0));
    assert!(
        report.errors.is_empty(),
        "429s are not errors: {:?}",
        report.errors
    );
    assert!((report.req_per_s * report.duration_s - 20.0).abs() < 1e-6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_tokens_give_measurable_ttft_itl_and_tpot() {
    let first = Duration::from_millis(150);
    let gap = Duration::from_millis(40);
    let (url, _mock) = serve(Behaviour {
        first_token_delay: first,
        token_delay: gap,
        usage: true,
        ..Behaviour::default()
    })
    .await;
    let flags =
        "--model m --endpoint chat --stream --concurrency 3 --num-requests 3 --output-len 4";
    let report = bench(&url, flags).await;

    assert_eq!(report.requests, counts(3, 0, 0));
    let ttft = report.ttft_s.unwrap();
    // Every sample is at least the delay, so every statistic is too.
    assert!(
        ttft.p50 >= first.as_secs_f64() && ttft.mean >= first.as_secs_f64(),
        "{ttft:?}"
    );
    assert!(ttft.p99 < 5.0);
    let e2e = report.e2e_s.unwrap();
    assert!(e2e.p50 >= (first + 3 * gap).as_secs_f64(), "{e2e:?}");
    // Allow a little receive-side jitter below the server's send gap.
    let itl = report.itl_s.unwrap();
    assert!(itl.mean >= 0.035 && itl.mean < 1.0, "{itl:?}");
    let tpot = report.tpot_s.unwrap();
    assert!(tpot.mean >= 0.035 && tpot.mean < 1.0, "{tpot:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_api_key_and_extra_headers_reach_the_server() {
    let (url, mock) = serve(Behaviour::default()).await;
    let flags = "--api-key sk-test --header X-Custom:hi --model m --tenants 3 --num-requests 30 --concurrency 3 --input-len 4 --output-len 1";
    let report = bench(&url, flags).await;

    assert_eq!(report.requests.ok, 30);
    let seen = mock.seen();
    assert_eq!(seen.len(), 30);
    let mut tenants = std::collections::BTreeSet::new();
    for s in &seen {
        let user = s.body["user"].as_str().expect("user field").to_string();
        assert_eq!(s.tenant_header.as_deref(), Some(user.as_str()));
        assert_eq!(s.authorization.as_deref(), Some("Bearer sk-test"));
        assert_eq!(s.custom_header.as_deref(), Some("hi"));
        assert!(
            ["tenant-0", "tenant-1", "tenant-2"].contains(&user.as_str()),
            "{user}"
        );
        tenants.insert(user);
    }
    assert!(
        tenants.len() >= 2,
        "30 requests over 3 tenants used only {tenants:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_report_is_written_and_parses_back() {
    let (url, _mock) = serve(Behaviour {
        usage: true,
        ..Behaviour::default()
    })
    .await;
    let path = std::env::temp_dir().join(format!("ballast-bench-test-{}.json", std::process::id()));
    let mut flags = args(&url, "--model m --num-requests 5 --stream");
    // Set directly rather than through the flag string: the path may contain spaces.
    flags.json = Some(path.clone());
    let report = ballast_bench::run(flags).await.expect("benchmark runs");

    let text = std::fs::read_to_string(&path).expect("--json file written");
    std::fs::remove_file(&path).unwrap();
    let value: Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(value["requests"]["ok"], 5);
    assert_eq!(value["model"], "m");
    assert_eq!(value["endpoint"], "completions");
    assert!(value["ttft_s"]["p99"].is_number());
    // serde_json's fast float parser may differ in the last bit, so compare
    // the exact fields exactly and the floats approximately.
    let parsed: Report = serde_json::from_value(value).unwrap();
    assert_eq!(parsed.requests, report.requests);
    assert_eq!(
        (parsed.url, parsed.stream, parsed.input_len),
        (report.url, report.stream, report.input_len)
    );
    let (a, b) = (parsed.e2e_s.unwrap(), report.e2e_s.unwrap());
    assert!(
        (a.p90 - b.p90).abs() <= 1e-12 * b.p90
            && (parsed.duration_s - report.duration_s).abs() < 1e-12
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_is_discovered_from_v1_models_when_omitted() {
    let (url, mock) = serve(Behaviour {
        models: vec!["first-model", "second-model"],
        ..Behaviour::default()
    })
    .await;
    let report = bench(&url, "--num-requests 2 --input-len 3 --output-len 1").await;
    assert_eq!(report.model, "first-model");
    assert!(mock.seen().iter().all(|s| s.body["model"] == "first-model"));

    let (empty_url, _mock) = serve(Behaviour::default()).await;
    let err = ballast_bench::run(args(&empty_url, "--num-requests 1"))
        .await
        .unwrap_err();
    assert!(matches!(err, BenchError::ModelDiscovery { .. }), "{err}");
    assert!(err.to_string().contains("--model"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_an_error_not_a_report() {
    // Bind and release a port so nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    for extra in ["--model m", ""] {
        let err = ballast_bench::run(args(&url, extra)).await.unwrap_err();
        assert!(matches!(err, BenchError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains(&url), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_length_spec_is_an_error_naming_the_flag() {
    let err = ballast_bench::run(args("http://127.0.0.1:9", "--output-len normal:x:1"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            BenchError::InvalidArg {
                flag: "--output-len",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_object_mid_stream_counts_as_failed() {
    let (url, _mock) = serve(Behaviour {
        mid_stream_error: true,
        ..Behaviour::default()
    })
    .await;
    let report = bench(&url, "--model m --stream --num-requests 4 --output-len 5").await;
    assert_eq!(report.requests, counts(0, 0, 4));
    assert_eq!(report.errors.len(), 1);
    assert_eq!(report.errors[0].count, 4);
    assert!(
        report.errors[0].message.contains("boom: engine crashed"),
        "{:?}",
        report.errors
    );
    assert!(report.e2e_s.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_errors_are_failures_with_a_sample_message() {
    let (url, _mock) = serve(Behaviour {
        fail_status: Some(StatusCode::INTERNAL_SERVER_ERROR),
        ..Behaviour::default()
    })
    .await;
    let report = bench(&url, "--model m --num-requests 3").await;
    assert_eq!(report.requests, counts(0, 0, 3));
    let msg = &report.errors[0].message;
    assert!(
        msg.contains("500") && msg.contains("the engine is on fire"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_requests_fail_after_the_request_timeout() {
    let (url, _mock) = serve(Behaviour {
        hang: true,
        ..Behaviour::default()
    })
    .await;
    let started = Instant::now();
    let report = bench(
        &url,
        "--model m --num-requests 2 --concurrency 2 --request-timeout 0.3",
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(report.requests, counts(0, 0, 2));
    assert!(
        report.errors[0].message.contains("timed out"),
        "{:?}",
        report.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_keeps_sending_while_requests_are_in_flight() {
    // Each response takes 400 ms; a closed loop of 1 would manage ~3 in the
    // second, an open loop at 20 req/s sends ~20 and then waits for them.
    let (url, mock) = serve(Behaviour {
        first_token_delay: Duration::from_millis(400),
        usage: true,
        ..Behaviour::default()
    })
    .await;
    let report = bench(
        &url,
        "--model m --rate 20 --duration 1 --input-len 4 --output-len 2",
    )
    .await;

    let total = report.requests.total;
    assert_eq!(total, mock.count.load(Ordering::SeqCst));
    assert_eq!(
        report.requests,
        counts(total, 0, 0),
        "in-flight requests were awaited"
    );
    assert!(
        (8..=45).contains(&total),
        "{total} requests at 20 req/s for 1 s"
    );
    assert!(mock.max_in_flight.load(Ordering::SeqCst) >= 3);
    assert_eq!((report.mode.as_str(), report.mode_value), ("rate", 20.0));
    // The last request started before the 1 s deadline and took 0.4 s.
    assert!(
        report.duration_s >= 0.4 && report.duration_s < 1.6,
        "{}",
        report.duration_s
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_with_duration_caps_in_flight_at_concurrency() {
    let (url, mock) = serve(Behaviour {
        first_token_delay: Duration::from_millis(100),
        ..Behaviour::default()
    })
    .await;
    let report = bench(
        &url,
        "--model m --concurrency 2 --duration 0.5 --input-len 4 --output-len 1",
    )
    .await;

    let total = report.requests.total;
    assert_eq!(total, mock.count.load(Ordering::SeqCst));
    assert_eq!(report.requests.ok, total);
    // 2 workers × 0.5 s / 0.1 s per request ≈ 10 (a little less under load).
    assert!((4..=12).contains(&total), "{total}");
    assert_eq!(mock.max_in_flight.load(Ordering::SeqCst), 2);
}
