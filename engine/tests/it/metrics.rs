//! The metrics contract against a real engine: every value read from `/metrics` and
//! compared with what the test itself observed over HTTP.

use crate::common;

use std::time::Duration;

use common::{TestServer, metric_value, start};
use futures::StreamExt;
use serde_json::{Value, json};

fn s(name: &str, extra: &str) -> String {
    format!("ballast_{name}{{engine=\"0\"{extra},model_name=\"synthetic:tiny\"")
}

fn plain(name: &str) -> String {
    format!("ballast_{name}{{engine=\"0\",model_name=\"synthetic:tiny\"}}")
}

async fn complete(srv: &TestServer, prompt: &str, max_tokens: u32) -> Value {
    let (status, v) = srv
        .post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

/// Waits until the output router has published everything (the last finish).
async fn settle(srv: &TestServer) {
    srv.wait_metric(
        &plain("num_requests_running"),
        Duration::from_secs(10),
        |v| v == 0.0,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_equal_the_sum_of_what_clients_saw() {
    let srv = start(&[]).await;
    let shared = "a system prompt shared by every request, long enough for several blocks";
    let mut completion = 0;
    let mut prompt = 0;
    let mut cached = 0;
    for i in 0..6 {
        let v = complete(&srv, &format!("{shared} #{i}"), 5 + i).await;
        completion += v["usage"]["completion_tokens"].as_u64().unwrap();
        prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
    }
    settle(&srv).await;
    let text = srv.metrics().await;
    let m = |series: &str| metric_value(&text, series);
    assert_eq!(m(&plain("generation_tokens_total")), completion as f64);
    assert_eq!(m(&plain("prompt_tokens_total")), prompt as f64);
    // Sources sum exactly to prompt tokens, and the shared prefix was served from cache.
    let by = |src: &str| {
        m(&format!(
            "ballast_prompt_tokens_by_source_total{{engine=\"0\",model_name=\"synthetic:tiny\",source=\"{src}\"}}"
        ))
    };
    assert_eq!(
        by("local_compute") + by("local_cache_hit") + by("external_kv_transfer"),
        prompt as f64
    );
    assert_eq!(by("local_cache_hit"), cached as f64);
    assert!(cached > 0);
    // Prefix-cache counters are take-and-reset per step: summed once, never twice.
    assert_eq!(m(&plain("prefix_cache_queries_total")), prompt as f64);
    assert_eq!(m(&plain("prefix_cache_hits_total")), cached as f64);
    assert_eq!(
        m(&s("request_success_total", ",finished_reason=\"length\"")),
        6.0
    );
    // Histogram counts: one TTFT and one e2e per request, one ITL per later token, one
    // TPOT per request with at least two tokens.
    assert_eq!(
        m("ballast_time_to_first_token_seconds_count{engine=\"0\""),
        6.0
    );
    assert_eq!(
        m("ballast_e2e_request_latency_seconds_count{engine=\"0\""),
        6.0
    );
    assert_eq!(
        m("ballast_inter_token_latency_seconds_count{engine=\"0\""),
        (completion - 6) as f64
    );
    assert_eq!(
        m("ballast_request_time_per_output_token_seconds_count{engine=\"0\""),
        6.0
    );
    assert_eq!(
        m("ballast_request_generation_tokens_sum{engine=\"0\""),
        completion as f64
    );
    // inference = prefill + decode per request, so their sums agree.
    let sum = |h: &str| {
        m(&format!(
            "ballast_request_{h}_time_seconds_sum{{engine=\"0\""
        ))
    };
    assert!((sum("inference") - sum("prefill") - sum("decode")).abs() < 1e-9);
    // Snapshot gauges reflect the last step, not a sum over steps.
    assert_eq!(m(&plain("num_requests_running")), 0.0);
    assert_eq!(m(&plain("kv_cache_usage_ratio")), 0.0);
    let kv = |state: &str| {
        m(&format!(
            "ballast_kv_cache_tokens{{engine=\"0\",model_name=\"synthetic:tiny\",state=\"{state}\"}}"
        ))
    };
    let capacity =
        srv.engine.config().scheduler.num_blocks * srv.engine.config().scheduler.block_size;
    assert_eq!(
        kv("available") + kv("evictable") + kv("used"),
        capacity as f64
    );
    assert!(
        kv("evictable") > 0.0,
        "finished requests leave cached blocks"
    );
    // Iterations count as vLLM counts them: whole prompts whose prefill completed (cache
    // hits included) plus generated tokens, so the sums agree with the counters.
    assert_eq!(
        m("ballast_iteration_tokens_sum{engine=\"0\""),
        (prompt + completion) as f64
    );
    assert_eq!(
        m("ballast_request_prompt_tokens_sum{engine=\"0\""),
        m(&plain("prompt_tokens_total"))
    );
    assert!(m(&plain("estimated_flops_per_gpu_total")) > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_requests_count_as_abort_and_record_no_ttft() {
    let srv = start(&[
        "--model",
        "synthetic:small",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "1",
    ])
    .await;
    // One long request holds the only slot; a second one waits and is abandoned.
    let body = json!({"prompt": "hold", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut holder = Box::pin(srv.stream("/v1/completions", &body).await.bytes_stream());
    holder.next().await.unwrap().unwrap();
    let waiting = srv
        .client
        .post(format!("{}/v1/completions", srv.base))
        .json(&json!({"prompt": "never", "max_tokens": 3}))
        .send();
    let waiter = tokio::spawn(waiting);
    let waiting_series =
        "ballast_num_requests_waiting{engine=\"0\",model_name=\"synthetic:small\"}";
    srv.wait_metric(waiting_series, Duration::from_secs(20), |v| v == 1.0)
        .await;
    waiter.abort(); // the client goes away while queued
    drop(holder); // and the running one mid-stream
    let abort = "ballast_request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"synthetic:small\"}";
    srv.wait_metric(abort, Duration::from_secs(20), |v| v == 2.0)
        .await;
    let text = srv.metrics().await;
    let m = |name: &str| metric_value(&text, &format!("{name}{{engine=\"0\""));
    assert_eq!(
        m("ballast_time_to_first_token_seconds_count"),
        1.0,
        "only the request that produced a token"
    );
    // Every finished request, aborts included, is observed once in e2e and the token
    // histograms, so their counts equal request_success_total and their sums the counters.
    for h in [
        "ballast_e2e_request_latency_seconds_count",
        "ballast_request_prompt_tokens_count",
        "ballast_request_generation_tokens_count",
    ] {
        assert_eq!(m(h), 2.0, "{h}");
    }
    assert_eq!(
        m("ballast_request_prompt_tokens_sum"),
        m("ballast_prompt_tokens_total"),
        "the queued request processed no prompt; the holder's counted once"
    );
    assert!(m("ballast_prompt_tokens_total") > 0.0);
    assert_eq!(
        m("ballast_request_generation_tokens_sum"),
        m("ballast_generation_tokens_total")
    );
    assert!(m("ballast_e2e_request_latency_seconds_sum") > 0.0);
    // Engine stages only for the stages a request reached: the holder was scheduled and
    // prefilled, the abandoned one never left the queue.
    assert_eq!(m("ballast_request_queue_time_seconds_count"), 1.0);
    assert_eq!(m("ballast_request_prefill_time_seconds_count"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_is_the_sum_of_its_reasons() {
    let srv = start(&[
        "--model",
        "synthetic:small",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "1",
        "--max-running-per-tenant",
        "1",
    ])
    .await;
    let body = json!({"prompt": "hold", "max_tokens": 2000, "ignore_eos": true, "stream": true, "user": "a"});
    let mut holder = Box::pin(srv.stream("/v1/completions", &body).await.bytes_stream());
    holder.next().await.unwrap().unwrap();
    let mut waiters = Vec::new();
    for user in ["a", "a", "b"] {
        let req = srv
            .client
            .post(format!("{}/v1/completions", srv.base))
            .json(&json!({"prompt": "x", "max_tokens": 1, "user": user}));
        waiters.push(tokio::spawn(req.send()));
    }
    let w = |r: &str| {
        format!(
            "ballast_num_requests_waiting_by_reason{{engine=\"0\",model_name=\"synthetic:small\",reason=\"{r}\"}}"
        )
    };
    srv.wait_metric(&w("deferred"), Duration::from_secs(20), |v| v == 2.0)
        .await;
    let text = srv.metrics().await;
    assert_eq!(
        metric_value(&text, &w("capacity")),
        1.0,
        "tenant b waits for the only slot: capacity"
    );
    assert_eq!(
        metric_value(
            &text,
            "ballast_num_requests_waiting{engine=\"0\",model_name=\"synthetic:small\"}"
        ),
        3.0
    );
    drop(holder);
    for w in waiters {
        assert_eq!(w.await.unwrap().unwrap().status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dp_ratio_is_observed_once_per_step_by_rank_zero() {
    let srv = start(&[
        "--data-parallel-size",
        "2",
        "--dispatch-policy",
        "round-robin",
    ])
    .await;
    // Weights 1:0 send everything to rank 0: a skewed workload.
    srv.engine.dispatcher().set_weights(&[1.0, 0.0]).unwrap();
    for i in 0..3 {
        complete(&srv, &format!("skewed {i}"), 6).await;
    }
    settle(&srv).await;
    let text = srv.metrics().await;
    let m = |series: &str| metric_value(&text, series);
    let tiny = "model_name=\"synthetic:tiny\"";
    let steps = |rank: &str, state: &str| {
        m(&format!(
            "ballast_dp_steps_total{{engine=\"{rank}\",{tiny},rank_state=\"{state}\"}}"
        ))
    };
    let total0 = steps("0", "active") + steps("0", "idle");
    assert!(total0 > 0.0);
    assert_eq!(
        total0,
        steps("1", "active") + steps("1", "idle"),
        "lockstep: same number of steps"
    );
    assert_eq!(steps("1", "active"), 0.0, "rank 1 got no work");
    assert_eq!(
        m("ballast_dp_token_imbalance_ratio_count{engine=\"0\""),
        total0,
        "once per step, by rank 0"
    );
    assert!(
        !text.contains("ballast_dp_token_imbalance_ratio_count{engine=\"1\""),
        "rank 1 never observes the ratio"
    );
    // Every step had all tokens on rank 0 of 2: ratio exactly 2.
    assert_eq!(
        m("ballast_dp_token_imbalance_ratio_sum{engine=\"0\""),
        2.0 * total0
    );
    let tok = |rank: &str, kind: &str| {
        m(&format!(
            "ballast_dp_tokens_total{{engine=\"{rank}\",kind=\"{kind}\",{tiny}}}"
        ))
    };
    assert_eq!(
        tok("1", "imbalance"),
        tok("0", "scheduled"),
        "rank 1 was short of everything rank 0 did"
    );
    assert_eq!(tok("0", "imbalance"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_metrics_use_route_templates_and_skip_probes() {
    let srv = start(&[]).await;
    let req = |endpoint: &str, method: &str, status: u16| {
        format!(
            "ballast_http_requests_total{{endpoint=\"{endpoint}\",method=\"{method}\",model_name=\"synthetic:tiny\",status=\"{status}\"}}"
        )
    };
    // Before any request: the API routes' series exist at zero.
    let fresh = srv.metrics().await;
    for (endpoint, method) in [
        ("/v1/completions", "POST"),
        ("/v1/chat/completions", "POST"),
    ] {
        for status in [200, 400, 429, 503] {
            assert_eq!(metric_value(&fresh, &req(endpoint, method, status)), 0.0);
        }
        assert_eq!(
            metric_value(
                &fresh,
                &format!(
                    "ballast_http_request_duration_seconds_count{{endpoint=\"{endpoint}\",method=\"{method}\""
                )
            ),
            0.0
        );
    }
    complete(&srv, "hi", 2).await;
    let (status, _) = srv
        .post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 0}))
        .await;
    assert_eq!(status, 400);
    srv.get("/health").await;
    srv.get("/v1/models").await;
    let text = srv.metrics().await;
    assert_eq!(
        metric_value(&text, &req("/v1/completions", "POST", 200)),
        1.0
    );
    assert_eq!(
        metric_value(&text, &req("/v1/completions", "POST", 400)),
        1.0
    );
    assert_eq!(metric_value(&text, &req("/v1/models", "GET", 200)), 1.0);
    assert!(!text.contains("endpoint=\"/health\""));
    assert!(!text.contains("endpoint=\"/metrics\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_residency_histograms_fill_when_enabled() {
    let srv = start(&[
        "--kv-cache-metrics",
        "--kv-cache-metrics-sample",
        "1",
        "--num-kv-blocks",
        "70",
        "--max-model-len",
        "1024",
    ])
    .await;
    // Reuse a prefix (reuse gap), then push it out of a small pool (lifetime, idle).
    let prefix = "x".repeat(200);
    complete(&srv, &format!("{prefix}a"), 2).await;
    complete(&srv, &format!("{prefix}b"), 2).await;
    for i in 0..3 {
        complete(&srv, &format!("{i}{}", "y".repeat(900)), 2).await;
    }
    settle(&srv).await;
    let text = srv.metrics().await;
    for h in [
        "kv_block_reuse_gap_seconds",
        "kv_block_lifetime_seconds",
        "kv_block_idle_before_evict_seconds",
    ] {
        assert!(
            metric_value(&text, &format!("ballast_{h}_count{{engine=\"0\"")) > 0.0,
            "{h}"
        );
    }
}

/// Runs `promtool check metrics` on an exposition. `promtool` comes from Debian's
/// `prometheus` package, which `.ci/run` installs; CI sets BALLAST_REQUIRE_PROMTOOL so the
/// check can never be skipped there.
fn promtool_check(exposition: &str) -> Option<String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var_os("BALLAST_REQUIRE_PROMTOOL").is_none(),
                "promtool is required here but cannot run: {e}"
            );
            eprintln!("skipping: promtool not installed (apt-get install prometheus)");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool failed:\n{report}");
    Some(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_finds_nothing_to_report_on_a_live_engine() {
    let srv = start(&[
        "--data-parallel-size",
        "2",
        "--kv-cache-metrics",
        "--kv-cache-metrics-sample",
        "1",
    ])
    .await;
    for i in 0..4 {
        complete(&srv, &format!("promtool workload {i}"), 4).await;
    }
    settle(&srv).await;
    let text = srv.metrics().await;
    if let Some(report) = promtool_check(&text) {
        assert_eq!(report.trim(), "", "promtool reported problems:\n{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exported_family_is_documented() {
    let srv = start(&[]).await;
    let text = srv.metrics().await;
    let docs =
        std::fs::read_to_string(format!("{}/../docs/metrics.md", env!("CARGO_MANIFEST_DIR")))
            .unwrap();
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert!(families.len() > 40, "{families:?}");
    let missing: Vec<_> = families
        .iter()
        .filter(|f| !docs.contains(&format!("`{f}`")))
        .collect();
    assert!(missing.is_empty(), "docs/metrics.md lacks {missing:?}");
}

/// The exposition is the table the registry is built from: every family of
/// `ballast_engine::telemetry::metrics::FAMILIES` with its `# TYPE`, its `# HELP` and its
/// labels, and no family the table lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_is_the_family_table() {
    use ballast_engine::telemetry::metrics::{FAMILIES, Kind};
    use std::collections::BTreeMap;

    let srv = start(&[]).await;
    // A request and a rejection-free round trip so request-scoped series have samples.
    complete(&srv, "hello", 4).await;
    settle(&srv).await;
    let text = srv.metrics().await;
    let mut types = BTreeMap::new();
    let mut helps = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_string(), kind.to_string());
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            helps.insert(name.to_string(), help.to_string());
        }
    }
    let mut problems = Vec::new();
    for def in FAMILIES {
        let name = def.full_name();
        match types.remove(&name) {
            Some(t) if t == def.kind.exposition_type() => {}
            other => problems.push(format!("{name}: TYPE {other:?}, table says {:?}", def.kind)),
        }
        if helps.get(&name).map(String::as_str) != Some(def.help) {
            problems.push(format!("{name}: HELP {:?}", helps.get(&name)));
        }
        // The first sample's label names, in the exposition's order.
        let sample = match def.kind {
            Kind::Histogram(_) => format!("{name}_count{{"),
            _ => format!("{name}{{"),
        };
        let Some(line) = text.lines().find(|l| l.starts_with(&sample)) else {
            problems.push(format!("{name}: no sample"));
            continue;
        };
        let inside = &line[sample.len()..line.find('}').unwrap()];
        let mut seen: Vec<&str> = inside
            .split("\",")
            .map(|kv| kv.split('=').next().unwrap().trim_start_matches(','))
            .collect();
        seen.sort_unstable();
        let mut want = def.labels.to_vec();
        want.sort_unstable();
        if seen != want {
            problems.push(format!("{name}: labels {seen:?}, table says {want:?}"));
        }
    }
    assert!(FAMILIES.len() > 40, "{}", FAMILIES.len());
    assert!(
        types.is_empty(),
        "families exported but not in the table: {:?}",
        types.keys()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A stop string ends the request as `stop` in the metrics, exactly as the client saw it:
/// no abort, one e2e sample, and the generated tokens counted are the ones delivered, up
/// to the token that completed the match, never what the engine produced after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_finish_is_recorded_as_stop() {
    let srv = start(&[]).await;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "ignore_eos": true});
    let (_, full) = srv.post("/v1/completions", &body).await;
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[10..12].iter().collect();
    settle(&srv).await;
    let before = srv.metrics().await;
    let mut b = body.clone();
    b["stop"] = json!([stop]);
    let (status, v) = srv.post("/v1/completions", &b).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let delivered = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        delivered < 200,
        "the stop string ended it early: {delivered}"
    );
    settle(&srv).await;
    let after = srv.metrics().await;
    let delta = |series: &str| metric_value(&after, series) - metric_value(&before, series);
    assert_eq!(
        delta(&s("request_success_total", ",finished_reason=\"stop\"")),
        1.0
    );
    assert_eq!(
        delta(&s("request_success_total", ",finished_reason=\"abort\"")),
        0.0
    );
    assert_eq!(
        delta(&plain("generation_tokens_total")),
        delivered as f64,
        "tokens after the match are not counted"
    );
    assert_eq!(
        delta("ballast_request_generation_tokens_sum{engine=\"0\""),
        delivered as f64
    );
    assert_eq!(
        delta("ballast_e2e_request_latency_seconds_count{engine=\"0\""),
        1.0
    );
    assert_eq!(
        delta("ballast_request_time_per_output_token_seconds_count{engine=\"0\""),
        1.0,
        "a stop finish keeps its decode figures"
    );
    assert_eq!(srv.engine.routed_requests(), 0);
    srv.wait_metric(
        &plain("kv_cache_usage_ratio"),
        Duration::from_secs(5),
        |v| v == 0.0,
    )
    .await;
}

/// `--disable-log-stats` turns off the log line and the per-request histograms; gauges
/// and counters stay, as the docs say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_log_stats_keeps_counters_and_gauges() {
    let srv = start(&["--disable-log-stats"]).await;
    let v = complete(&srv, "counted all the same", 7).await;
    settle(&srv).await;
    let text = srv.metrics().await;
    let m = |series: &str| metric_value(&text, series);
    assert_eq!(
        m(&plain("prompt_tokens_total")),
        v["usage"]["prompt_tokens"].as_u64().unwrap() as f64
    );
    assert_eq!(m(&plain("generation_tokens_total")), 7.0);
    let by = |src: &str| {
        m(&format!(
            "ballast_prompt_tokens_by_source_total{{engine=\"0\",model_name=\"synthetic:tiny\",source=\"{src}\"}}"
        ))
    };
    assert_eq!(
        by("local_compute") + by("local_cache_hit"),
        m(&plain("prompt_tokens_total"))
    );
    assert_eq!(
        m(&s("request_success_total", ",finished_reason=\"length\"")),
        1.0
    );
    assert_eq!(
        m("ballast_e2e_request_latency_seconds_count{engine=\"0\""),
        0.0,
        "per-request histograms are off"
    );
    assert_eq!(
        m("ballast_time_to_first_token_seconds_count{engine=\"0\""),
        0.0
    );
}
