//! Turning a validated request into engine submissions, and engine updates into OpenAI
//! responses: a whole JSON body, or a stream of server-sent events.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::sse::Event;
use futures::stream::{self, BoxStream, SelectAll, StreamExt};
use serde_json::{Value, json};

use super::error::ApiError;
use super::protocol::GenParams;
use crate::compute::sampling::{SampleSpec, SamplingParams};
use crate::runtime::engine::{Engine, RequestStream, Submission};
use crate::runtime::tenants::Tenant;
use crate::step::events::FinishReason;
use crate::telemetry::spans::TraceContext;

/// Which API shape to answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// A request ready to run: tokenized prompts and resolved parameters.
pub struct Job {
    /// API shape.
    pub endpoint: Endpoint,
    /// Echoed `model`.
    pub model: String,
    /// Response id.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// One token list per prompt.
    pub prompts: Vec<Vec<u32>>,
    /// Resolved output limit per prompt.
    pub max_tokens: Vec<u32>,
    /// Everything else.
    pub params: GenParams,
    /// Tenant, from `x-tenant` or `user`.
    pub tenant: Option<Tenant>,
    /// When the HTTP request arrived: wall clock and monotonic.
    pub arrival: (std::time::SystemTime, std::time::Instant),
    /// Trace of the request (choice 0 uses it; other choices get sibling root spans).
    pub trace: Option<TraceContext>,
    /// The data-parallel rank from `X-Data-Parallel-Rank`, for every choice.
    pub rank: Option<usize>,
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Job {
    /// Choice `i` of prompt `p` has index `p * n + i`.
    fn submissions(&self) -> Vec<Submission> {
        let p = &self.params;
        let mut subs = Vec::with_capacity(self.prompts.len() * p.n);
        for (prompt, &max_tokens) in self.prompts.iter().zip(&self.max_tokens) {
            for i in 0..p.n {
                subs.push(Submission {
                    prompt: prompt.clone(),
                    sampling: SamplingParams {
                        spec: SampleSpec {
                            temperature: p.temperature,
                            top_p: p.top_p,
                            top_k: p.top_k,
                        },
                        // Choices of one seeded request differ from each other but repeat.
                        seed: p.seed.map(|s| s.wrapping_add(i as u64)),
                        max_tokens,
                        min_tokens: p.min_tokens,
                        ignore_eos: p.ignore_eos,
                        stop_token_ids: p.stop_token_ids.clone(),
                    },
                    stop: p.stop.clone(),
                    tenant: self.tenant.clone(),
                    arrival: self.arrival.0,
                    arrival_instant: self.arrival.1,
                    trace: self
                        .trace
                        .map(|t| if subs.is_empty() { t } else { t.sibling() }),
                    rank: self.rank,
                });
            }
        }
        subs
    }
}

/// Text and finish of one choice as it is produced. Text, stop strings and the finish
/// reason come from the engine's output side; the handler only shapes responses.
struct Choice {
    index: usize,
    stream: Option<RequestStream>,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
}

/// One step of a choice: new text, and the finish reason on its last step.
struct Delta {
    index: usize,
    text: String,
    finish: Option<&'static str>,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
}

impl Choice {
    /// Waits for the next piece of text or the finish; `None` once finished.
    async fn next(&mut self) -> Option<Delta> {
        loop {
            let stream = self.stream.as_mut()?;
            let Some(update) = stream.recv().await else {
                // The engine went away without finishing the request.
                self.stream = None;
                return Some(self.delta(String::new(), Some(FinishReason::Abort.as_str())));
            };
            if let Some(c) = update.num_cached_tokens {
                self.cached_tokens = c as usize;
            }
            self.completion_tokens += update.new_tokens as usize;
            if let Some(reason) = update.finish {
                self.stream = None;
                return Some(self.delta(update.text, Some(reason.as_str())));
            }
            if !update.text.is_empty() {
                return Some(self.delta(update.text, None));
            }
        }
    }

    fn delta(&self, text: String, finish: Option<&'static str>) -> Delta {
        Delta {
            index: self.index,
            text,
            finish,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            cached_tokens: self.cached_tokens,
        }
    }
}

fn start(engine: &Engine, job: &Job) -> Result<Vec<Choice>, ApiError> {
    let subs = job.submissions();
    let prompt_lens: Vec<usize> = subs.iter().map(|s| s.prompt.len()).collect();
    let streams = engine.submit(subs)?;
    Ok(streams
        .into_iter()
        .zip(prompt_lens)
        .enumerate()
        .map(|(index, (stream, prompt_tokens))| Choice {
            index,
            stream: Some(stream),
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: 0,
        })
        .collect())
}

#[derive(Default)]
struct Usage {
    prompt: usize,
    completion: usize,
    cached: usize,
}

impl Usage {
    /// Prompt tokens count once per prompt, not once per choice (OpenAI's rule for `n`).
    fn add_final(&mut self, d: &Delta, n: usize) {
        if d.index.is_multiple_of(n) {
            self.prompt += d.prompt_tokens;
            self.cached += d.cached_tokens;
        }
        self.completion += d.completion_tokens;
    }

    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

/// Runs a job to completion and returns the whole response body.
pub async fn complete(engine: &Engine, job: Job) -> Result<Value, ApiError> {
    let choices = start(engine, &job)?;
    let finished = futures::future::join_all(choices.into_iter().map(|mut c| async move {
        let mut text = String::new();
        // A choice always ends with a delta that carries its finish reason.
        let mut last = c.delta(String::new(), Some(FinishReason::Abort.as_str()));
        while let Some(d) = c.next().await {
            text.push_str(&d.text);
            last = d;
        }
        (text, last)
    }))
    .await;
    let mut usage = Usage::default();
    let choices: Vec<Value> = finished
        .iter()
        .map(|(text, d)| {
            usage.add_final(d, job.params.n);
            match job.endpoint {
                Endpoint::Completions => json!({
                    "index": d.index, "text": text, "logprobs": null, "finish_reason": d.finish,
                }),
                Endpoint::Chat => json!({
                    "index": d.index,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": null,
                    "finish_reason": d.finish,
                }),
            }
        })
        .collect();
    let object = match job.endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::Chat => "chat.completion",
    };
    Ok(json!({
        "id": job.id, "object": object, "created": job.created, "model": job.model,
        "choices": choices, "usage": usage.json(),
    }))
}

/// Starts a job and returns its server-sent events: one chunk per piece of text, a final
/// chunk per choice with its finish reason, a usage chunk when asked, then `[DONE]`.
pub fn stream_events(
    engine: &Engine,
    job: Job,
) -> Result<BoxStream<'static, Result<Event, Infallible>>, ApiError> {
    let choices = start(engine, &job)?;
    let mut all: SelectAll<BoxStream<'static, Delta>> = SelectAll::new();
    let n_choices = choices.len();
    for c in choices {
        all.push(stream::unfold(c, |mut c| async move { c.next().await.map(|d| (d, c)) }).boxed());
    }
    let object = match job.endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::Chat => "chat.completion.chunk",
    };
    let chunk = move |job: &Job, choices: Value, usage: Option<Value>| {
        let mut v = json!({
            "id": job.id, "object": object, "created": job.created, "model": job.model, "choices": choices,
        });
        if job.params.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        Event::default().data(v.to_string())
    };
    // Chat streams open with the assistant role, as OpenAI's do.
    let opening: Vec<Event> = match job.endpoint {
        Endpoint::Chat => (0..n_choices)
            .map(|i| {
                chunk(
                    &job,
                    json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                    None,
                )
            })
            .collect(),
        Endpoint::Completions => Vec::new(),
    };
    let endpoint = job.endpoint;
    let body = stream::unfold(
        (all, Usage::default(), Some(job)),
        move |(mut all, mut usage, job)| async move {
            let job = job?;
            match all.next().await {
                Some(d) => {
                    if d.finish.is_some() {
                        usage.add_final(&d, job.params.n);
                    }
                    let choice = match endpoint {
                        Endpoint::Completions => {
                            json!([{"index": d.index, "text": d.text, "logprobs": null, "finish_reason": d.finish}])
                        }
                        Endpoint::Chat => {
                            let delta = if d.text.is_empty() { json!({}) } else { json!({"content": d.text}) };
                            json!([{"index": d.index, "delta": delta, "logprobs": null, "finish_reason": d.finish}])
                        }
                    };
                    let ev = chunk(&job, choice, None);
                    Some((vec![ev], (all, usage, Some(job))))
                }
                None => {
                    let mut tail = Vec::new();
                    if job.params.include_usage {
                        tail.push(chunk(&job, json!([]), Some(usage.json())));
                    }
                    tail.push(Event::default().data("[DONE]"));
                    Some((tail, (all, usage, None)))
                }
            }
        },
    )
    .flat_map(stream::iter);
    Ok(stream::iter(opening).chain(body).map(Ok).boxed())
}
