//! Every flag can also come from `BALLAST_BENCH_<NAME>`.
//!
//! This lives in its own test binary with a single test because it mutates
//! the process environment, which would race with tests running in parallel.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use ballast_bench::{BenchArgs, Endpoint};
use clap::Parser;
use serde_json::{Value, json};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

#[tokio::test(flavor = "current_thread")]
async fn flags_fall_back_to_ballast_bench_env_vars() {
    let vars = [
        ("BALLAST_BENCH_URL", "http://10.1.2.3:9000"),
        ("BALLAST_BENCH_MODEL", "env-model"),
        ("BALLAST_BENCH_ENDPOINT", "chat"),
        ("BALLAST_BENCH_RATE", "2.5"),
        ("BALLAST_BENCH_DURATION", "30"),
        ("BALLAST_BENCH_INPUT_LEN", "uniform:1:4"),
        ("BALLAST_BENCH_SHARED_PREFIX_LEN", "3"),
        ("BALLAST_BENCH_TENANTS", "5"),
        ("BALLAST_BENCH_STREAM", "true"),
        ("BALLAST_BENCH_NO_PROGRESS", "1"),
        ("BALLAST_BENCH_API_KEY", "sk-env"),
    ];
    for (k, v) in vars {
        // SAFETY: this test binary runs this single test, so no other thread
        // reads the environment concurrently.
        unsafe { std::env::set_var(k, v) };
    }
    let args = Cli::try_parse_from(["bench"]).unwrap().args;
    assert_eq!(args.url, "http://10.1.2.3:9000");
    assert_eq!(args.model.as_deref(), Some("env-model"));
    assert_eq!(args.endpoint, Endpoint::Chat);
    assert_eq!(args.rate, Some(2.5));
    assert_eq!(args.duration, Some(30.0));
    assert_eq!(args.input_len, "uniform:1:4");
    assert_eq!(args.shared_prefix_len, 3);
    assert_eq!(args.tenants, 5);
    assert!(args.stream && args.no_progress);
    assert!(!args.ignore_eos);
    assert_eq!(args.api_key.as_deref(), Some("sk-env"));

    // Command-line flags win over the environment.
    let args = Cli::try_parse_from(["bench", "--model", "cli-model", "--tenants", "0"])
        .unwrap()
        .args;
    assert_eq!(args.model.as_deref(), Some("cli-model"));
    assert_eq!(args.tenants, 0);

    // Without --api-key / BALLAST_BENCH_API_KEY, $OPENAI_API_KEY is used.
    for (k, _) in vars {
        // SAFETY: as above.
        unsafe { std::env::remove_var(k) };
    }
    // SAFETY: as above.
    unsafe { std::env::set_var("OPENAI_API_KEY", "sk-openai") };
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let app = Router::new()
        .route("/v1/completions", post(record_auth))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let argv = [
        "bench",
        "--url",
        &url,
        "--model",
        "m",
        "--num-requests",
        "2",
    ];
    let _ = rustls::crypto::ring::default_provider().install_default();
    let report = ballast_bench::run(Cli::try_parse_from(argv).unwrap().args)
        .await
        .unwrap();
    assert_eq!(report.requests.ok, 2);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![Some("Bearer sk-openai".to_string()); 2]);
}

async fn record_auth(
    State(seen): State<Arc<Mutex<Vec<Option<String>>>>>,
    headers: HeaderMap,
) -> Json<Value> {
    let auth = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_string());
    seen.lock().unwrap().push(auth);
    Json(json!({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}))
}
