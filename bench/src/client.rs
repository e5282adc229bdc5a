//! Sending one request to an OpenAI-compatible server and timing it.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};

use crate::args::Config;
use crate::error::{BenchError, chain};
use crate::sse::SseParser;
use crate::workload::{Prompt, RequestSpec};

/// Longest error text kept per failure; server error pages can be huge.
const MAX_ERROR_CHARS: usize = 200;

/// How long the start-up `/v1/models` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How many times one request is sent again after the server closed (or reset) its
/// connection before any response arrived. Once is enough: the resend goes on a new
/// connection (never another pooled one, which the same server may be closing at that
/// moment: a drain closes all its idle connections at once), and a server that closes a
/// new connection without answering is broken, which resending cannot fix.
pub(crate) const MAX_RESENDS: u32 = 1;

/// hyper's message for a connection that closed before a whole response came (its
/// `IncompleteMessage`). hyper is not a direct dependency, so its error is recognised by
/// its text; `bench/tests/it/keep_alive.rs` breaks if hyper ever words it differently.
const CLOSED_BEFORE_RESPONSE: &str = "connection closed before message completed";

/// Whether a failed `send()` means the server closed or reset the connection before any
/// response came: the race in which an HTTP/1.1 server closes an idle kept-alive
/// connection (a drain, a keep-alive timeout) just as the client sends a request on it.
/// The server never answered, so the request is sent again instead of being counted as a
/// failure. Connect errors (nothing listens: a real failure), timeouts and anything after
/// the response head (a stream cut short) are not this.
pub(crate) fn closed_before_response(e: &reqwest::Error) -> bool {
    if e.is_timeout() || e.is_connect() || e.is_body() || e.is_decode() || e.is_status() {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        if s.to_string() == CLOSED_BEFORE_RESPONSE {
            return true;
        }
        source = s.source();
    }
    false
}

/// What happened to one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RequestRecord {
    pub start: Instant,
    /// When the last byte (or `[DONE]`) arrived, or when the request failed.
    pub end: Instant,
    pub outcome: Outcome,
    /// Times it was sent again because the server closed its connection before answering
    /// ([`closed_before_response`]).
    pub resends: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Ok(Completed),
    /// HTTP 429: the server shed load, which is a result, not a malfunction.
    Rejected,
    Failed(String),
}

/// Measurements of a successful request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Completed {
    pub e2e: f64,
    /// From `usage`, else the locally known prompt length.
    pub prompt_tokens: u64,
    /// From `usage`, else (streaming) the number of content chunks, else unknown.
    pub completion_tokens: Option<u64>,
    /// Whether the server reported `usage.completion_tokens`.
    pub usage_reported: bool,
    /// Set only for streamed responses that produced content.
    pub ttft: Option<f64>,
    /// Gaps between successive content-bearing chunks (streaming only).
    pub itl: Vec<f64>,
}

/// Token counts from an OpenAI `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// What one decoded stream chunk (or full response) contributes.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Chunk {
    /// Carries non-empty generated text, i.e. at least one token.
    pub content: bool,
    pub usage: Option<Usage>,
}

/// Why a request did not complete.
enum Failure {
    Rejected,
    Failed(String),
}

fn truncate(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_string(),
    }
}

/// The message of an OpenAI-style `{"error": {...}}` or vLLM-style
/// `{"object": "error", "message": ...}` body.
fn error_message(v: &Value) -> Option<String> {
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        let msg = match e {
            Value::String(s) => s.clone(),
            _ => e
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| e.to_string(), String::from),
        };
        return Some(truncate(&msg));
    }
    if v.get("object").and_then(Value::as_str) == Some("error") {
        let msg = v
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("unspecified error");
        return Some(truncate(msg));
    }
    None
}

fn usage(v: &Value) -> Option<Usage> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    Some(Usage {
        prompt_tokens: u.get("prompt_tokens").and_then(Value::as_u64),
        completion_tokens: u.get("completion_tokens").and_then(Value::as_u64),
    })
}

fn non_empty(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| !s.is_empty())
}

/// Decodes one JSON payload (an SSE `data:` or a whole response body).
///
/// Content is looked for in both API shapes (`text` for completions,
/// `delta.content` for chat) so a server answering in the other shape still
/// counts; reasoning deltas count too, since they are generated tokens.
pub(crate) fn parse_chunk(data: &str) -> Result<Chunk, String> {
    let v: Value = serde_json::from_str(data)
        .map_err(|e| format!("invalid JSON from server: {e}: {}", truncate(data)))?;
    if let Some(msg) = error_message(&v) {
        return Err(format!("server error: {msg}"));
    }
    let content = v
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|choices| {
            choices.iter().any(|c| {
                let delta = c.get("delta");
                non_empty(c.get("text"))
                    || ["content", "reasoning_content", "reasoning"]
                        .iter()
                        .any(|k| non_empty(delta.and_then(|d| d.get(k))))
            })
        });
    Ok(Chunk {
        content,
        usage: usage(&v),
    })
}

fn is_loopback(base_url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base_url) else {
        return false;
    };
    match url.host_str() {
        Some("localhost") => true,
        Some(h) => h
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

/// Builds the shared HTTP client (connection pool, default headers).
pub(crate) fn build_client(config: &Config) -> Result<reqwest::Client, BenchError> {
    client_builder(config)?
        .build()
        .map_err(|e| BenchError::Client(chain(&e)))
}

/// A client that keeps no idle connection, so each request opens a new one: for resends
/// ([`closed_before_response`]). Behind a Kubernetes Service a new connection is also
/// balanced anew, away from the pod that closed the old one.
pub(crate) fn build_fresh_client(config: &Config) -> Result<reqwest::Client, BenchError> {
    client_builder(config)?
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| BenchError::Client(chain(&e)))
}

fn client_builder(config: &Config) -> Result<reqwest::ClientBuilder, BenchError> {
    // reqwest is built without a bundled crypto provider: the program chooses one (the
    // `ballast` binary does in main). Without it reqwest would panic here.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        return Err(BenchError::Client(
            "no TLS crypto provider is installed; the program must install one first".into(),
        ));
    }
    let mut builder = reqwest::Client::builder().default_headers(config.headers.clone());
    if is_loopback(&config.base_url) {
        // A proxy in the environment would distort local latency numbers.
        builder = builder.no_proxy();
    }
    Ok(builder)
}

/// GET `/v1/models`. With `want_model`, returns the first listed id; without,
/// only checks that the server answers at all (any HTTP status will do,
/// because not every server implements the endpoint).
pub(crate) async fn probe(
    client: &reqwest::Client,
    base_url: &str,
    want_model: bool,
) -> Result<Option<String>, BenchError> {
    let url = format!("{base_url}/v1/models");
    let resp = tokio::time::timeout(PROBE_TIMEOUT, client.get(&url).send())
        .await
        .map_err(|_| BenchError::Unreachable {
            url: url.clone(),
            reason: format!("no response within {}s", PROBE_TIMEOUT.as_secs()),
        })?
        .map_err(|e| BenchError::Unreachable {
            url: url.clone(),
            reason: chain(&e),
        })?;
    if !want_model {
        return Ok(None);
    }
    let discovery = |reason: String| BenchError::ModelDiscovery {
        url: url.clone(),
        reason,
    };
    let status = resp.status();
    let body = tokio::time::timeout(PROBE_TIMEOUT, resp.text())
        .await
        .map_err(|_| discovery("response body timed out".into()))?
        .map_err(|e| discovery(chain(&e)))?;
    if !status.is_success() {
        return Err(discovery(format!("HTTP {status}: {}", truncate(&body))));
    }
    let v: Value =
        serde_json::from_str(&body).map_err(|e| discovery(format!("invalid JSON: {e}")))?;
    v.get("data")
        .and_then(Value::as_array)
        .and_then(|models| models.first())
        .and_then(|m| m.get("id"))
        .and_then(Value::as_str)
        .map(|id| Some(id.to_string()))
        .ok_or_else(|| discovery("the server lists no models".into()))
}

/// A server endpoint plus the per-run request settings.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    client: reqwest::Client,
    /// For resends: no pooled connections.
    fresh: reqwest::Client,
    url: String,
    model: String,
    temperature: f64,
    stream: bool,
    ignore_eos: bool,
    timeout: Duration,
}

impl Target {
    pub(crate) fn new(
        client: reqwest::Client,
        fresh: reqwest::Client,
        config: &Config,
        model: String,
    ) -> Self {
        Target {
            client,
            fresh,
            url: format!("{}{}", config.base_url, config.endpoint.path()),
            model,
            temperature: config.temperature,
            stream: config.stream,
            ignore_eos: config.ignore_eos,
            timeout: config.request_timeout,
        }
    }

    /// The JSON request body for `spec`.
    pub(crate) fn body(&self, spec: &RequestSpec) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": spec.max_tokens,
            "temperature": self.temperature,
            "stream": self.stream,
        });
        // Token prompts are only generated for completions, text only for chat.
        match &spec.prompt {
            Prompt::Tokens(ids) => body["prompt"] = json!(ids),
            Prompt::Text(text) => {
                body["messages"] = json!([{"role": "user", "content": text}]);
            }
        }
        if self.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if self.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if let Some(tenant) = &spec.tenant {
            body["user"] = json!(tenant);
        }
        body
    }

    /// Sends one request and records its outcome; never fails as a call.
    pub(crate) async fn send(&self, spec: &RequestSpec) -> RequestRecord {
        let start = Instant::now();
        let mut resends = 0;
        let result =
            tokio::time::timeout(self.timeout, self.exchange(spec, start, &mut resends)).await;
        let (end, outcome) = match result {
            Ok(Ok((end, completed))) => (end, Outcome::Ok(completed)),
            Ok(Err(Failure::Rejected)) => (Instant::now(), Outcome::Rejected),
            Ok(Err(Failure::Failed(msg))) => (Instant::now(), Outcome::Failed(msg)),
            Err(_) => (
                Instant::now(),
                Outcome::Failed(format!(
                    "timed out after {}s (--request-timeout)",
                    self.timeout.as_secs_f64()
                )),
            ),
        };
        RequestRecord {
            start,
            end,
            outcome,
            resends,
        }
    }

    /// Sends `spec` (again, on a new connection, up to [`MAX_RESENDS`] times, when the
    /// server closed the connection before answering; counted in `resends`) and reads the
    /// response. Times
    /// run from `start`, the first send.
    async fn exchange(
        &self,
        spec: &RequestSpec,
        start: Instant,
        resends: &mut u32,
    ) -> Result<(Instant, Completed), Failure> {
        let body = self.body(spec);
        let resp = loop {
            let client = if *resends == 0 {
                &self.client
            } else {
                &self.fresh
            };
            let mut request = client.post(&self.url).json(&body);
            if let Some(tenant) = &spec.tenant {
                request = request.header("x-tenant", tenant);
            }
            match request.send().await {
                Ok(resp) => break resp,
                Err(e) if *resends < MAX_RESENDS && closed_before_response(&e) => *resends += 1,
                Err(e) => return Err(Failure::Failed(chain(&e))),
            }
        };
        let status = resp.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            // Reading the body lets the connection go back to the pool.
            let _ = resp.bytes().await;
            return Err(Failure::Rejected);
        }
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            let detail = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| error_message(&v))
                .unwrap_or_else(|| truncate(&body));
            return Err(Failure::Failed(format!("HTTP {status}: {detail}")));
        }
        // Some servers ignore `stream: true` and answer with plain JSON.
        let is_sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        if self.stream && is_sse {
            self.read_stream(resp, spec, start).await
        } else {
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| Failure::Failed(format!("reading response: {}", chain(&e))))?;
            let end = Instant::now();
            let chunk = parse_chunk(&String::from_utf8_lossy(&bytes)).map_err(Failure::Failed)?;
            let usage = chunk.usage.unwrap_or_default();
            Ok((
                end,
                Completed {
                    e2e: (end - start).as_secs_f64(),
                    prompt_tokens: usage.prompt_tokens.unwrap_or(spec.input_len),
                    completion_tokens: usage.completion_tokens,
                    usage_reported: usage.completion_tokens.is_some(),
                    ttft: None,
                    itl: Vec::new(),
                },
            ))
        }
    }

    async fn read_stream(
        &self,
        resp: reqwest::Response,
        spec: &RequestSpec,
        start: Instant,
    ) -> Result<(Instant, Completed), Failure> {
        let mut parser = SseParser::new();
        let mut timing = StreamTiming::default();
        let mut body = resp.bytes_stream();
        let mut done_at = None;
        while let Some(bytes) = body.next().await {
            let bytes =
                bytes.map_err(|e| Failure::Failed(format!("stream interrupted: {}", chain(&e))))?;
            // Every event in one network read arrived at the same moment.
            let now = Instant::now();
            for data in parser.feed(&bytes) {
                // Keep reading after [DONE] so the connection can be reused,
                // but stop the clock there.
                if done_at.is_none() {
                    if data.trim() == "[DONE]" {
                        done_at = Some(now);
                    } else {
                        timing.event(&data, now).map_err(Failure::Failed)?;
                    }
                }
            }
        }
        let end = match done_at {
            Some(t) => t,
            None => {
                let now = Instant::now();
                if let Some(data) = parser.finish().filter(|d| d.trim() != "[DONE]") {
                    timing.event(&data, now).map_err(Failure::Failed)?;
                }
                now
            }
        };
        let usage = timing.usage.unwrap_or_default();
        Ok((
            end,
            Completed {
                e2e: (end - start).as_secs_f64(),
                prompt_tokens: usage.prompt_tokens.unwrap_or(spec.input_len),
                completion_tokens: Some(usage.completion_tokens.unwrap_or(timing.content_chunks)),
                usage_reported: usage.completion_tokens.is_some(),
                ttft: timing.first.map(|t| (t - start).as_secs_f64()),
                itl: timing.itl,
            },
        ))
    }
}

/// Token timing accumulated over one streamed response.
#[derive(Debug, Default)]
struct StreamTiming {
    first: Option<Instant>,
    last: Option<Instant>,
    itl: Vec<f64>,
    content_chunks: u64,
    usage: Option<Usage>,
}

impl StreamTiming {
    fn event(&mut self, data: &str, now: Instant) -> Result<(), String> {
        let chunk = parse_chunk(data).map_err(|e| format!("mid-stream: {e}"))?;
        if chunk.content {
            match self.last {
                Some(last) => self.itl.push((now - last).as_secs_f64()),
                None => self.first = Some(now),
            }
            self.last = Some(now);
            self.content_chunks += 1;
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_content_in_both_api_shapes() {
        let c = parse_chunk(r#"{"choices":[{"index":0,"text":"hi"}]}"#).unwrap();
        assert!(c.content);
        let c = parse_chunk(r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#).unwrap();
        assert!(c.content);
        // A role-only first delta and empty text are not tokens.
        let c = parse_chunk(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}"#,
        )
        .unwrap();
        assert_eq!(c, Chunk::default());
        let c = parse_chunk(r#"{"choices":[{"text":""}]}"#).unwrap();
        assert!(!c.content);
    }

    #[test]
    fn usage_chunk_is_read() {
        let c = parse_chunk(r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#).unwrap();
        assert!(!c.content);
        assert_eq!(
            c.usage,
            Some(Usage {
                prompt_tokens: Some(12),
                completion_tokens: Some(7)
            })
        );
    }

    #[test]
    fn error_objects_are_failures() {
        let e =
            parse_chunk(r#"{"error":{"message":"out of memory","type":"internal"}}"#).unwrap_err();
        assert!(e.contains("out of memory"), "{e}");
        let e = parse_chunk(r#"{"object":"error","message":"bad prompt","code":400}"#).unwrap_err();
        assert!(e.contains("bad prompt"), "{e}");
        let e = parse_chunk(r#"{"error":"plain"}"#).unwrap_err();
        assert!(e.contains("plain"), "{e}");
        assert!(parse_chunk("not json").is_err());
        // `"error": null` is not an error.
        assert!(
            parse_chunk(r#"{"error":null,"choices":[{"text":"x"}]}"#)
                .unwrap()
                .content
        );
    }

    #[test]
    fn stream_timing_counts_only_content_chunks() {
        let mut t = StreamTiming::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        t.event(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, at(5))
            .unwrap();
        t.event(r#"{"choices":[{"delta":{"content":"a"}}]}"#, at(10))
            .unwrap();
        t.event(r#"{"choices":[{"delta":{"content":"b"}}]}"#, at(30))
            .unwrap();
        t.event(r#"{"choices":[{"delta":{"content":"c"}}]}"#, at(60))
            .unwrap();
        assert_eq!(t.first, Some(at(10)));
        assert_eq!(t.content_chunks, 3);
        assert_eq!(t.itl.len(), 2);
        assert!((t.itl[0] - 0.020).abs() < 1e-9 && (t.itl[1] - 0.030).abs() < 1e-9);
        assert!(t.event(r#"{"error":{"message":"boom"}}"#, at(70)).is_err());
    }

    #[test]
    fn error_text_is_truncated_on_a_char_boundary() {
        let long = "é".repeat(500);
        let t = truncate(&long);
        assert_eq!(t.chars().count(), MAX_ERROR_CHARS + 1);
        assert!(t.ends_with('…'));
        assert_eq!(truncate(" short "), "short");
    }

    #[test]
    fn loopback_detection() {
        assert!(is_loopback("http://127.0.0.1:8000"));
        assert!(is_loopback("http://localhost:1"));
        assert!(is_loopback("http://[::1]:8000"));
        assert!(!is_loopback("https://api.openai.com"));
        assert!(!is_loopback("http://10.0.0.1"));
    }
}
