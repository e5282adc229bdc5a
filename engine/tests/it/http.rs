//! The HTTP API end to end: a real engine on a loopback port, real HTTP.

use crate::common;

use std::time::Duration;

use common::{config, metric_value, serve, sse_events, start};
use futures::StreamExt;
use serde_json::{Value, json};

const RUNNING: &str = "ballast_num_requests_running{engine=\"0\"";
const KV_USAGE: &str = "ballast_kv_cache_usage_ratio{engine=\"0\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_is_deterministic_and_counts_usage() {
    let s = start(&[]).await;
    let body =
        json!({"prompt": "Hello there", "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let (status, a) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{a}");
    let (_, b) = s.post("/v1/completions", &body).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_eq!(a["object"], "text_completion");
    assert_eq!(a["choices"][0]["finish_reason"], "length");
    assert_eq!(a["usage"]["prompt_tokens"], 12, "11 bytes plus BOS");
    assert_eq!(a["usage"]["completion_tokens"], 12);
    assert_eq!(a["usage"]["total_tokens"], 24);
    // The prompt is shorter than one 16-token block, so nothing can be cached.
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_hits_show_in_usage() {
    let s = start(&[]).await;
    let prompt =
        "a shared system prompt that is long enough to fill several KV blocks of sixteen bytes";
    let body = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0});
    let (_, first) = s.post("/v1/completions", &body).await;
    let (_, second) = s.post("/v1/completions", &body).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = second["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached,
        (prompt_tokens - 1) / 16 * 16,
        "every full block but the last token's"
    );
    assert_eq!(
        first["choices"][0]["text"], second["choices"][0]["text"],
        "cached KV gives the same tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_matches_non_streaming_and_ends_with_usage_and_done() {
    let s = start(&[]).await;
    for (path, text_of) in [
        (
            "/v1/completions",
            (|c: &Value| c["text"].as_str().map(str::to_string)) as fn(&Value) -> Option<String>,
        ),
        ("/v1/chat/completions", |c: &Value| {
            c["delta"]["content"].as_str().map(str::to_string)
        }),
    ] {
        let mut body = json!({"max_tokens": 20, "temperature": 0, "ignore_eos": true});
        if path.contains("chat") {
            body["messages"] = json!([{"role": "user", "content": "hi"}]);
        } else {
            body["prompt"] = json!("Stream me");
        }
        let (_, whole) = s.post(path, &body).await;
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let events = sse_events(s.stream(path, &body).await).await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{path}");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0).and_then(text_of))
            .collect();
        let whole_text = whole["choices"][0]["text"]
            .as_str()
            .or(whole["choices"][0]["message"]["content"].as_str())
            .unwrap();
        assert_eq!(text, whole_text, "{path}");
        let finishes: Vec<_> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0)?["finish_reason"].as_str())
            .collect();
        assert_eq!(finishes, ["length"], "{path}");
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(chunks.last().unwrap()["choices"], json!([]));
        assert_eq!(usage["completion_tokens"], 20, "{path}");
        for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(usage[k], whole["usage"][k], "{path} {k}");
        }
        // The streamed run reuses the prompt the first run left in the prefix cache.
        assert!(
            usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
                > 0
                || whole["usage"]["prompt_tokens"].as_u64().unwrap() <= 16
        );
        if path.contains("chat") {
            assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
            assert_eq!(chunks[0]["object"], "chat.completion.chunk");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_path_has_its_status_and_a_json_body() {
    let s = start(&["--max-model-len", "64"]).await;
    let long = "x".repeat(80);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/completions", "{not json".into(), 400, "invalid_json"),
        ("/v1/completions", "[1,2]".into(), 400, "invalid_json"),
        (
            "/v1/completions",
            r#"{"prompt":"a","temperature":"hot"}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","max_tokens":0}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","max_tokens":"5"}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","top_p":0}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "/v1/completions",
            r#"{"prompt":[1,2,999]}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "/v1/completions",
            r#"{"max_tokens":3}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "/v1/completions",
            format!(r#"{{"prompt":"{long}"}}"#),
            400,
            "context_length_exceeded",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","max_tokens":100}"#.into(),
            400,
            "context_length_exceeded",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","frequency_penalty":1}"#.into(),
            400,
            "unsupported_parameter",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","model":"gpt-9"}"#.into(),
            404,
            "model_not_found",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":"hi"}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"n":0}"#.into(),
            400,
            "invalid_value",
        ),
        ("/v1/nothing", "{}".into(), 404, "not_found"),
    ];
    for (path, body, status, code) in cases {
        let (got, text) = s.post_raw(path, body.clone()).await;
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON for {body}: {text}"));
        assert_eq!(got, status, "{body} → {text}");
        assert_eq!(v["error"]["code"], code, "{body} → {text}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert!(v["error"]["type"].is_string());
    }
    // Wrong method on a known route.
    let r = s.get("/v1/completions").await;
    assert_eq!(r.status(), 405);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "method_not_allowed"
    );
    // Body over the limit, announced by its length: the server answers 413 without reading
    // it and may close before a client has written it all (a broken pipe for reqwest), so
    // this client sends only the head and a little of the body, then reads the answer.
    let (got, text) = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = s.base.strip_prefix("http://").unwrap();
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            9 << 20
        );
        c.write_all(head.as_bytes()).await.unwrap();
        let _ = c.write_all(&[b' '; 4096]).await;
        let mut raw = Vec::new();
        let _ = c.read_to_end(&mut raw).await;
        let raw = String::from_utf8_lossy(&raw).to_string();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let code: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, body.to_string())
    };
    assert_eq!(got, 413, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["error"]["code"],
        "body_too_large"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_stream_frees_kv_blocks() {
    let s = start(&[]).await;
    let body =
        json!({"prompt": "Keep going", "max_tokens": 1000, "ignore_eos": true, "stream": true});
    let resp = s.stream("/v1/completions", &body).await;
    let mut chunks = resp.bytes_stream();
    for _ in 0..3 {
        chunks.next().await.unwrap().unwrap();
    }
    assert_eq!(s.metric(RUNNING).await, 1.0);
    assert!(s.metric(KV_USAGE).await > 0.0);
    drop(chunks);
    s.wait_metric(RUNNING, Duration::from_secs(10), |v| v == 0.0)
        .await;
    s.wait_metric(KV_USAGE, Duration::from_secs(10), |v| v == 0.0)
        .await;
    assert_eq!(s.engine.routed_requests(), 0);
    assert_eq!(s.engine.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_the_output_before_the_match() {
    let s = start(&[]).await;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let (_, full) = s.post("/v1/completions", &body).await;
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[10..13].iter().collect();
    let expected = &text[..text.find(&stop).unwrap()];
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!([stop]);
        b["stream"] = json!(stream);
        let got = if stream {
            let events = sse_events(s.stream("/v1/completions", &b).await).await;
            let chunks: Vec<Value> = events
                .iter()
                .filter(|e| *e != "[DONE]")
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            assert_eq!(
                chunks.last().unwrap()["choices"][0]["finish_reason"],
                "stop"
            );
            chunks
                .iter()
                .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
                .collect::<String>()
        } else {
            let (_, v) = s.post("/v1/completions", &b).await;
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            v["choices"][0]["text"].as_str().unwrap().to_string()
        };
        assert_eq!(got, expected, "stream={stream} stop={stop:?}");
    }
    s.wait_metric(RUNNING, Duration::from_secs(5), |v| v == 0.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_reproduce_and_fan_out_is_indexed() {
    let s = start(&[]).await;
    let body = |seed| json!({"prompt": "Roll", "max_tokens": 16, "temperature": 1.0, "seed": seed, "n": 3, "ignore_eos": true});
    let (_, a) = s.post("/v1/completions", &body(42)).await;
    let (_, b) = s.post("/v1/completions", &body(42)).await;
    let (_, c) = s.post("/v1/completions", &body(43)).await;
    let texts = |v: &Value| {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&a), texts(&b));
    assert_ne!(texts(&a), texts(&c));
    let idx: Vec<_> = a["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [0, 1, 2]);
    assert_ne!(texts(&a)[0], texts(&a)[1], "choices of one request differ");
    assert_eq!(
        a["usage"]["prompt_tokens"], 5,
        "prompt counted once for n choices"
    );
    assert_eq!(a["usage"]["completion_tokens"], 48);
    // Several prompts: one choice each, prompts counted separately.
    let (_, m) = s
        .post(
            "/v1/completions",
            &json!({"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 2}),
        )
        .await;
    assert_eq!(m["choices"].as_array().unwrap().len(), 2);
    assert_eq!(m["usage"]["prompt_tokens"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_health() {
    let s = start(&["--served-model-name", "chat"]).await;
    let v: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "chat");
    assert_eq!(v["data"][0]["max_model_len"], 1024);
    let r = s.get("/health").await;
    assert_eq!(r.status(), 200);
    let (status, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "model": "chat", "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200);
    s.engine.begin_drain();
    let r = s.get("/health").await;
    assert_eq!(r.status(), 503);
    let (status, v) = s.post("/v1/completions", &json!({"prompt": "a"})).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("draining"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exposition_has_per_rank_series() {
    let s = start(&["--data-parallel-size", "2"]).await;
    let text = s.metrics().await;
    for rank in ["0", "1"] {
        for reason in ["capacity", "deferred"] {
            let series = format!(
                "ballast_num_requests_waiting_by_reason{{engine=\"{rank}\",model_name=\"synthetic:tiny\",reason=\"{reason}\"}}"
            );
            assert_eq!(metric_value(&text, &series), 0.0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_rank_ends_requests_and_turns_health_red() {
    use ballast_engine::compute::executor::{Executor, NoopExecutor};
    use ballast_engine::compute::sampling::SamplingSlot;
    use ballast_engine::step::StepMetadata;

    /// Works for a few steps, then fails like a device error would.
    struct FailsAt(usize);
    impl Executor for FailsAt {
        fn execute(&mut self, meta: &StepMetadata, slots: &mut [SamplingSlot]) -> Vec<u32> {
            self.0 -= 1;
            assert!(self.0 > 0, "simulated device failure");
            NoopExecutor { token: 65 }.execute(meta, slots)
        }
    }
    let cfg = config(&[
        "--data-parallel-size",
        "2",
        "--dispatch-policy",
        "round-robin",
    ]);
    let executors: Vec<Box<dyn Executor>> =
        vec![Box::new(FailsAt(5)), Box::new(NoopExecutor { token: 66 })];
    let engine = ballast_engine::Engine::start_with(
        cfg,
        executors,
        std::sync::Arc::new(ballast_engine::compute::tokenizer::ByteTokenizer),
    );
    let s = serve(engine).await;
    // One request per rank; both must end although only rank 0 failed.
    let body = json!({"prompt": "x", "max_tokens": 500, "ignore_eos": true});
    let (a, b) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(
            s.post("/v1/completions", &body),
            s.post("/v1/completions", &body)
        )
    })
    .await
    .expect("requests must not hang when a rank fails");
    for (status, v) in [a, b] {
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "abort");
    }
    let r = s.get("/health").await;
    assert_eq!(r.status(), 503);
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("engine_stopped"))
    );
    assert_eq!(s.engine.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_tokens_are_not_emitted_and_min_tokens_masks_them() {
    let s = start(&[]).await;
    let body =
        json!({"prompt": "Stop tokens", "max_tokens": 30, "temperature": 0, "ignore_eos": true});
    let (_, full) = s.post("/v1/completions", &body).await;
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let stop_byte = text.as_bytes()[4];
    let first = text.bytes().position(|b| b == stop_byte).unwrap();
    let mut b = body.clone();
    b["stop_token_ids"] = json!([stop_byte]);
    let (_, v) = s.post("/v1/completions", &b).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["choices"][0]["text"].as_str().unwrap().as_bytes(),
        &text.as_bytes()[..first],
        "the stop token's text is not returned"
    );
    assert_eq!(
        v["usage"]["completion_tokens"],
        first as u64 + 1,
        "but it is counted"
    );
    // With min_tokens past that point, the stop token cannot be sampled before it.
    b["min_tokens"] = json!(first + 3);
    let (_, v) = s.post("/v1/completions", &b).await;
    let out = v["choices"][0]["text"]
        .as_str()
        .unwrap()
        .as_bytes()
        .to_vec();
    assert!(out.len() >= first + 2, "{v}");
    assert!(
        !out[..first + 2].contains(&stop_byte),
        "masked until min_tokens: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_that_can_never_be_met_are_400_not_429() {
    let s = start(&["--max-queued-tokens", "10", "--max-queued-requests", "2"]).await;
    let (status, v) = s
        .post("/v1/completions", &json!({"prompt": vec![1; 20]}))
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("exceeds_queue_limit")),
        "{v}"
    );
    let (status, v) = s
        .post("/v1/completions", &json!({"prompt": [1], "n": 3}))
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("exceeds_queue_limit")),
        "{v}"
    );
    let (status, v) = s
        .post("/v1/completions", &json!({"prompt": "a", "min_tokens": 20}))
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("min_tokens")),
        "default max_tokens is 16: {v}"
    );
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 5000}),
        )
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("prompt")),
        "{v}"
    );
}

/// One request cannot make the engine allocate without bound: total sequences (prompts × n),
/// stop token ids and stop string lengths are limited, each accepted at its bound and
/// refused one past it with a 400 that names the field and the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_at_each_bound_pass_and_over_it_get_400() {
    let s = start(&["--max-num-seqs", "256"]).await;
    let ids = |n: usize| (0..n).map(|i| (i % 200) as u32).collect::<Vec<_>>();
    let stop = |bytes: usize| "x".repeat(bytes);
    let cases = [
        // (body, accepted, field, limit named in the message)
        (
            json!({"prompt": ["a", "b"], "n": 64, "max_tokens": 1}),
            true,
            "n",
            "128",
        ),
        (
            json!({"prompt": ["a", "b"], "n": 65, "max_tokens": 1}),
            false,
            "n",
            "128",
        ),
        (
            json!({"prompt": [[1], [2], [3]], "n": 43, "max_tokens": 1}),
            false,
            "n",
            "128",
        ),
        (
            json!({"prompt": "a", "max_tokens": 1, "stop_token_ids": ids(128)}),
            true,
            "stop_token_ids",
            "128",
        ),
        (
            json!({"prompt": "a", "max_tokens": 1, "stop_token_ids": ids(129)}),
            false,
            "stop_token_ids",
            "128",
        ),
        (
            json!({"prompt": "a", "max_tokens": 1, "stop_token_ids": [258]}),
            false,
            "stop_token_ids",
            "258",
        ),
        (
            json!({"prompt": "a", "max_tokens": 1, "stop": [stop(256)]}),
            true,
            "stop",
            "256",
        ),
        (
            json!({"prompt": "a", "max_tokens": 1, "stop": [stop(257)]}),
            false,
            "stop",
            "256",
        ),
    ];
    for (body, accepted, field, limit) in cases {
        let (status, v) = s.post("/v1/completions", &body).await;
        if accepted {
            assert_eq!(status, 200, "at the bound: {v}");
            continue;
        }
        assert_eq!(status, 400, "over the bound: {v}");
        assert_eq!(v["error"]["param"], field, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(limit),
            "names the limit {limit}: {message}"
        );
    }
    // A long min_tokens mask over many stop ids still samples around it.
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 8, "min_tokens": 8, "temperature": 0,
                    "stop_token_ids": ids(128)}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 8);
}

/// `X-Data-Parallel-Rank` (what vLLM and SGLang take from a gateway that picks ranks) puts
/// a request on that rank; a rank this engine does not have is a 400 naming the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_parallel_rank_header_picks_the_rank() {
    let s = start(&["--data-parallel-size", "2"]).await;
    let body = json!({"prompt": "rank", "max_tokens": 2, "ignore_eos": true});
    for _ in 0..4 {
        let r = s
            .client
            .post(format!("{}/v1/completions", s.base))
            .header("X-Data-Parallel-Rank", "1")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let text = s.metrics().await;
    let finished = |rank: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("ballast_request_success_total{")
                    && l.contains(&format!("engine=\"{rank}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!((finished("0"), finished("1")), (0.0, 4.0), "{text}");
    for bad in ["2", "-1", "one", ""] {
        let r = s
            .client
            .post(format!("{}/v1/completions", s.base))
            .header("X-Data-Parallel-Rank", bad)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], "X-Data-Parallel-Rank", "{bad:?}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("0 to 1"),
            "{v}"
        );
    }
}
