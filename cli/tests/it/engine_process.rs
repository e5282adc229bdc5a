//! `ballast engine` and `ballast bench` as real processes: exit codes, SIGTERM drain, and a
//! bench run against a live engine.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::engine::{Log, client, fresh_client, spawn_engine as spawn, wait_exit};
use futures::StreamExt;
use serde_json::{Value, json};

fn ballast() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ballast"))
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    let _group = crate::common::group(module_path!());
    for (args, needle) in [
        (&["--num-kv-blocks", "1"][..], "--num-kv-blocks"),
        (&["--model", "synthetic:nope"][..], "--model"),
        (&["--max-num-seqs", "0"][..], "--max-num-seqs"),
        (&["--no-such-flag"][..], "--no-such-flag"),
        (&["--block-size", "abc"][..], "--block-size"),
        (
            &["--custom-histogram-buckets", r#"{"ttft": [1]}"#][..],
            "\"ttft\"",
        ),
        (
            &[
                "--custom-histogram-buckets",
                r#"{"iteration_tokens": [4, 2]}"#,
            ][..],
            "iteration_tokens",
        ),
    ] {
        let out = ballast().arg("engine").args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn port_in_use_is_a_runtime_failure() {
    let _group = crate::common::group(module_path!());
    let first = spawn(&[], Log::Inherit);
    let port = first.base.rsplit(':').next().unwrap();
    let out = ballast().args(["engine", "--port", port]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_then_exits_zero() {
    let _group = crate::common::group(module_path!());
    let mut engine = spawn(
        &["--model", "synthetic:small", "--max-model-len", "1024"],
        Log::Inherit,
    );
    let c = client();
    let body = json!({
        "prompt": "finish me", "max_tokens": 300, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true},
    });
    let resp = c
        .post(format!("{}/v1/completions", engine.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut body_text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();
    let pid = engine.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Draining: new requests are refused with 503 while the first one finishes. Each on a
    // connection of its own (no shutdown delay here: see `fresh_client`).
    let late = fresh_client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = late
            .post(format!("{}/v1/completions", engine.base))
            .json(&json!({"prompt": "late", "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            assert_eq!(
                r.json::<Value>().await.unwrap()["error"]["code"],
                "draining"
            );
            break;
        }
        assert!(Instant::now() < deadline, "never started draining");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(chunk) = stream.next().await {
        body_text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(
        body_text.trim_end().ends_with("data: [DONE]"),
        "stream cut short: {body_text}"
    );
    let usage_line = body_text
        .lines()
        .rev()
        .find(|l| l.contains("\"usage\":{"))
        .expect("usage chunk");
    let usage: Value = serde_json::from_str(usage_line.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(
        usage["usage"]["completion_tokens"], 300,
        "the accepted request ran to its end"
    );
    let status = wait_exit(&mut engine.child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
}

#[test]
fn bench_against_a_live_engine_reports_every_request() {
    let _group = crate::common::group(module_path!());
    let engine = spawn(&[], Log::Inherit);
    let dir = std::env::temp_dir().join(format!("ballast-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join("report.json");
    let out = ballast()
        .args([
            "bench",
            "--url",
            &engine.base,
            "--num-requests",
            "24",
            "--concurrency",
            "4",
        ])
        .args([
            "--input-len",
            "32",
            "--output-len",
            "16",
            "--shared-prefix-len",
            "16",
            "--tenants",
            "3",
        ])
        .args(["--stream", "--ignore-eos", "--no-progress", "--json"])
        .arg(&json_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(report["requests"]["ok"], 24, "{report}");
    assert_eq!(report["requests"]["failed"], 0);
    assert_eq!(report["mean_completion_tokens"], 16.0);
    assert_eq!(
        report["mean_prompt_tokens"], 32.0,
        "token-id prompts have exact lengths"
    );
    assert!(report["ttft_s"]["p50"].as_f64().unwrap() > 0.0);
    assert!(stdout.contains("TTFT"), "{stdout}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_control_port_is_announced_and_serves() {
    let _group = crate::common::group(module_path!());
    use ballast_engine::api::control::proto::GetStatsRequest;
    use ballast_engine::api::control::proto::engine_control_client::EngineControlClient;
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = ballast()
        .args(["engine", "--port", "0", "--grpc-port", &free.to_string()])
        .env("BALLAST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let control = lines.next().unwrap().unwrap();
    let http = lines.next().unwrap().unwrap();
    assert_eq!(
        control,
        format!("ballast engine control API listening on http://127.0.0.1:{free}")
    );
    assert!(
        http.starts_with("ballast engine listening on http://127.0.0.1:"),
        "{http}"
    );
    let mut c = EngineControlClient::connect(format!("http://127.0.0.1:{free}"))
        .await
        .unwrap();
    let stats = c.get_stats(GetStatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.ranks.len(), 1);
    let _ = child.kill();
    let _ = child.wait();
}

/// One tenant capped at one running request, twelve of its clients in a loop, and a
/// scraper reading `/metrics` every 10 ms: no published snapshot may show a request
/// waiting for capacity while the batch has free slots and free KV. Every waiting request
/// is deferred, whatever moment the scrape falls on (in particular between one request
/// finishing and the next starting).
#[test]
fn deferred_waiting_is_never_reported_as_capacity() {
    let _group = crate::common::group(module_path!());
    let engine = spawn(
        &[
            "--max-running-per-tenant",
            "1",
            "--max-num-seqs",
            "32",
            "--max-model-len",
            "256",
        ],
        Log::Inherit,
    );
    let load = ballast()
        .args(["bench", "--url", &engine.base, "--concurrency", "12"])
        .args(["--duration", "6", "--tenants", "1"])
        .args(["--input-len", "8", "--output-len", "4", "--ignore-eos"])
        .arg("--no-progress")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (scrapes, busy) = runtime.block_on(async {
        let c = client();
        let gauge = |text: &str, series: &str| {
            text.lines()
                .find(|l| l.starts_with(series))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {series}"))
        };
        let series = |name: &str, extra: &str| {
            format!("ballast_{name}{{engine=\"0\",model_name=\"synthetic:tiny\"{extra}}}")
        };
        let (mut scrapes, mut busy) = (0, 0);
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while start.elapsed() < Duration::from_secs(5) {
            tick.tick().await;
            let text = c
                .get(format!("{}/metrics", engine.base))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            scrapes += 1;
            let capacity = gauge(&text, &series("num_requests_waiting_by_reason", ",reason=\"capacity\""));
            let deferred = gauge(&text, &series("num_requests_waiting_by_reason", ",reason=\"deferred\""));
            let running = gauge(&text, &series("num_requests_running", ""));
            let kv = gauge(&text, &series("kv_cache_usage_ratio", ""));
            assert!(running <= 1.0, "the tenant cap holds: {running} running");
            if running < 32.0 && kv < 1.0 {
                assert_eq!(
                    capacity, 0.0,
                    "scrape {scrapes}: {capacity} waiting for capacity with free slots and KV ({deferred} deferred, {running} running)"
                );
            }
            busy += (deferred > 0.0) as u32;
        }
        (scrapes, busy)
    });
    let status = wait_exit(&mut { load }, Duration::from_secs(30));
    assert!(status.success());
    assert!(scrapes > 100, "{scrapes} scrapes");
    assert!(
        busy > scrapes / 2,
        "the load kept the tenant's requests deferred: {busy} of {scrapes} scrapes"
    );
}
