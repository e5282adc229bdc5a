//! An engine served on a loopback port inside the test process, and small HTTP helpers.
#![allow(dead_code)]

use ballast_engine::compute::device::ComputeBackend;
use std::time::{Duration, Instant};

use ballast_engine::{Engine, EngineArgs, EngineConfig};
use clap::Parser;
use serde_json::Value;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: EngineArgs,
}

pub struct TestServer {
    pub base: String,
    pub engine: Engine,
    pub client: reqwest::Client,
}

/// Parses `ballast engine` flags into a configuration.
pub fn config(flags: &[&str]) -> EngineConfig {
    let args = Cli::try_parse_from(std::iter::once("engine").chain(flags.iter().copied()))
        .expect("valid flags")
        .args;
    EngineConfig::from_args(&args).expect("valid config")
}

/// Starts an engine with `ballast engine` flags on 127.0.0.1:0.
pub async fn start(flags: &[&str]) -> TestServer {
    serve(Engine::start(config(flags), ComputeBackend::Cpu)).await
}

/// Serves an already started engine on 127.0.0.1:0.
pub async fn serve(engine: Engine) -> TestServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = ballast_engine::api::http::router(engine.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    TestServer {
        base,
        engine,
        client: reqwest::Client::new(),
    }
}

impl TestServer {
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// Sends a streaming request and returns the response (headers received).
    pub async fn stream(&self, path: &str, body: &Value) -> reqwest::Response {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r
    }

    /// Starts a long streaming request (2000 tokens, ignoring EOS) for `tenant` and returns
    /// once its first token arrived, so it is running and no longer queued. Dropping the
    /// returned stream aborts it.
    pub async fn hold(&self, tenant: Option<&str>) -> impl futures::Stream + Send + use<> {
        use futures::StreamExt;
        let mut body = serde_json::json!({"prompt": "hold the slot", "max_tokens": 2000, "ignore_eos": true, "stream": true});
        if let Some(t) = tenant {
            body["user"] = serde_json::json!(t);
        }
        let mut chunks = Box::pin(self.stream("/v1/completions", &body).await.bytes_stream());
        chunks.next().await.unwrap().unwrap();
        chunks
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Value of the sample whose name and labels start with `series` (e.g.
    /// `ballast_num_requests_running{engine="0"`).
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series)
    }

    /// Polls `/metrics` until `series` satisfies `pred`, or panics after `timeout`.
    pub async fn wait_metric(
        &self,
        series: &str,
        timeout: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> f64 {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.metric(series).await;
            if pred(v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{series} stuck at {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Finds a sample in a text exposition. Label order in the exposition is alphabetical, so
/// callers pass labels in that order.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

/// Reads a whole SSE body into its `data:` payloads.
pub async fn sse_events(resp: reqwest::Response) -> Vec<String> {
    let body = resp.text().await.unwrap();
    body.split("\n\n")
        .filter_map(|ev| {
            ev.lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(str::to_string)
        })
        .collect()
}

/// Index of the largest value.
pub fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as u32
}

/// Teacher-forced logits: `prompt` and all but the last token of `continuation` fed through
/// `model` in one step; row `p` of the result (`vocab_size` wide) predicts `continuation[p]`.
pub fn teacher_forced(
    model: &ballast_engine::compute::model::LlamaModel<
        ballast_engine::compute::backend::cpu::CpuBackend,
    >,
    prompt: &[u32],
    continuation: &[u32],
) -> Vec<f32> {
    let tokens: Vec<u32> = prompt
        .iter()
        .chain(&continuation[..continuation.len() - 1])
        .copied()
        .collect();
    let rows: Vec<u32> = (prompt.len() as u32 - 1..tokens.len() as u32).collect();
    ballast_engine::compute::model::Sequence::new(model, 128, 16)
        .feed_rows(model, &tokens, rows)
        .data
}
