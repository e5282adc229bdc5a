//! The benchmark result: aggregation of request records, table and JSON.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

/// `--shared-prefixes` in a record written before the flag existed.
fn one() -> u64 {
    1
}

use crate::args::{Config, Endpoint, Load};
use crate::client::{Outcome, RequestRecord};
use crate::stats::Summary;

/// At most this many distinct error messages are kept.
const MAX_ERROR_SAMPLES: usize = 5;

/// How many requests ended each way.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestCounts {
    /// All finished requests.
    pub total: u64,
    /// Answered successfully.
    pub ok: u64,
    /// Answered with HTTP 429 (the server shed load).
    pub rejected: u64,
    /// Any other outcome: HTTP error, connection error, error in the stream, timeout.
    pub failed: u64,
    /// Resends: how many times a request was sent again because the server closed or
    /// reset a kept-alive connection before answering (the request never reached it). Not
    /// requests: one request may be resent more than once.
    #[serde(default)]
    pub retried: u64,
}

/// One distinct failure message and how often it occurred.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorSample {
    /// The message (truncated to a couple of hundred characters).
    pub message: String,
    /// Number of failed requests with exactly this message.
    pub count: u64,
}

/// The result of one benchmark run; `--json` writes it with serde.
///
/// Latencies are in seconds; a summary is `null` when there were no samples
/// (e.g. TTFT without `--stream`). Token counts come from the server's
/// `usage` when present; otherwise the prompt length is the locally generated
/// one (exact for completions, a word count for chat) and, when streaming, the
/// completion length is the number of content chunks.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Report {
    /// Base URL of the server.
    pub url: String,
    /// Model name sent with every request.
    pub model: String,
    /// API used.
    pub endpoint: Endpoint,
    /// Whether responses were streamed.
    pub stream: bool,
    /// `"rate"` (open loop) or `"concurrency"` (closed loop).
    pub mode: String,
    /// Requests per second for `rate`, number of workers for `concurrency`.
    pub mode_value: f64,
    /// `--input-len` SPEC.
    pub input_len: String,
    /// `--output-len` SPEC.
    pub output_len: String,
    /// `--shared-prefix-len`.
    pub shared_prefix_len: u64,
    /// `--shared-prefix-ratio`.
    pub shared_prefix_ratio: f64,
    /// `--shared-prefixes`.
    #[serde(default = "one")]
    pub shared_prefixes: u64,
    /// `--tenants`.
    pub tenants: u64,
    /// `--seed`.
    pub seed: u64,
    /// From the first request sent to the last one finished.
    pub duration_s: f64,
    /// Outcome counts.
    pub requests: RequestCounts,
    /// The most frequent distinct failure messages (at most 5).
    pub errors: Vec<ErrorSample>,
    /// Successful requests per second.
    pub req_per_s: f64,
    /// Prompt tokens of successful requests per second.
    pub input_tokens_per_s: f64,
    /// Completion tokens of successful requests per second.
    pub output_tokens_per_s: f64,
    /// Mean prompt tokens per successful request.
    pub mean_prompt_tokens: Option<f64>,
    /// Mean completion tokens per successful request whose count is known.
    pub mean_completion_tokens: Option<f64>,
    /// Successful requests whose response carried no `usage.completion_tokens`.
    pub requests_without_usage: u64,
    /// Time to first token (streaming only).
    pub ttft_s: Option<Summary>,
    /// Time per output token after the first, `(e2e − ttft) / (tokens − 1)`,
    /// for streamed requests with at least 2 tokens.
    pub tpot_s: Option<Summary>,
    /// Gaps between successive content chunks, pooled over requests (streaming only).
    pub itl_s: Option<Summary>,
    /// End-to-end request latency of successful requests.
    pub e2e_s: Option<Summary>,
}

fn per_second(count: f64, secs: f64) -> f64 {
    if secs > 0.0 { count / secs } else { 0.0 }
}

fn mean(xs: &[u64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<u64>() as f64 / xs.len() as f64)
}

impl Report {
    /// Aggregates finished requests into a report.
    pub(crate) fn build(config: &Config, model: &str, records: &[RequestRecord]) -> Report {
        let mut counts = RequestCounts::default();
        let mut errors: Vec<ErrorSample> = Vec::new();
        let (mut prompt, mut completion) = (Vec::new(), Vec::new());
        let (mut ttft, mut tpot, mut itl, mut e2e) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut without_usage = 0;

        for r in records {
            counts.total += 1;
            counts.retried += u64::from(r.resends);
            match &r.outcome {
                Outcome::Rejected => counts.rejected += 1,
                Outcome::Failed(msg) => {
                    counts.failed += 1;
                    match errors.iter_mut().find(|e| &e.message == msg) {
                        Some(e) => e.count += 1,
                        None => errors.push(ErrorSample {
                            message: msg.clone(),
                            count: 1,
                        }),
                    }
                }
                Outcome::Ok(c) => {
                    counts.ok += 1;
                    prompt.push(c.prompt_tokens);
                    completion.extend(c.completion_tokens);
                    without_usage += u64::from(!c.usage_reported);
                    e2e.push(c.e2e);
                    itl.extend_from_slice(&c.itl);
                    if let Some(t) = c.ttft {
                        ttft.push(t);
                        if let Some(n @ 2..) = c.completion_tokens {
                            tpot.push((c.e2e - t) / (n - 1) as f64);
                        }
                    }
                }
            }
        }
        // Stable sort: equally frequent messages keep first-seen order.
        errors.sort_by_key(|e| std::cmp::Reverse(e.count));
        errors.truncate(MAX_ERROR_SAMPLES);

        let first = records.iter().map(|r| r.start).min();
        let last = records.iter().map(|r| r.end).max();
        let duration_s = match (first, last) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let (mode, mode_value) = match config.load {
            Load::Rate(r) => ("rate", r),
            Load::Concurrency(c) => ("concurrency", c as f64),
        };
        Report {
            url: config.base_url.clone(),
            model: model.to_string(),
            endpoint: config.endpoint,
            stream: config.stream,
            mode: mode.to_string(),
            mode_value,
            input_len: config.input.to_string(),
            output_len: config.output.to_string(),
            shared_prefix_len: config.shared_prefix_len,
            shared_prefix_ratio: config.shared_prefix_ratio,
            shared_prefixes: config.shared_prefixes,
            tenants: config.tenants,
            seed: config.seed,
            duration_s,
            requests: counts,
            errors,
            req_per_s: per_second(counts.ok as f64, duration_s),
            input_tokens_per_s: per_second(prompt.iter().sum::<u64>() as f64, duration_s),
            output_tokens_per_s: per_second(completion.iter().sum::<u64>() as f64, duration_s),
            mean_prompt_tokens: mean(&prompt),
            mean_completion_tokens: mean(&completion),
            requests_without_usage: without_usage,
            ttft_s: Summary::of(ttft),
            tpot_s: Summary::of(tpot),
            itl_s: Summary::of(itl),
            e2e_s: Summary::of(e2e),
        }
    }

    /// A human-readable, aligned text table (latencies in milliseconds).
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let mut row = |label: &str, value: String| {
            let _ = writeln!(out, "{label:<16}{value}");
        };
        let opt = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        let load = match self.mode.as_str() {
            "rate" => format!("rate {} req/s (Poisson, open loop)", self.mode_value),
            _ => format!("concurrency {} (closed loop)", self.mode_value),
        };

        row("Server", self.url.clone());
        row("Model", self.model.clone());
        row(
            "Endpoint",
            format!(
                "{}{}",
                self.endpoint.name(),
                if self.stream { " (streaming)" } else { "" }
            ),
        );
        row("Load", load);
        row(
            "Workload",
            format!(
                "input {}, output {}, shared prefix {} ×{} (ratio {}), tenants {}, seed {}",
                self.input_len,
                self.output_len,
                self.shared_prefix_len,
                self.shared_prefixes,
                self.shared_prefix_ratio,
                self.tenants,
                self.seed
            ),
        );
        row("Duration", format!("{:.2} s", self.duration_s));
        let c = self.requests;
        let mut requests = format!(
            "{} ok, {} rejected (429), {} failed, {} total",
            c.ok, c.rejected, c.failed, c.total
        );
        if c.retried > 0 {
            let _ = write!(
                requests,
                " ({} resent: the server closed a kept-alive connection before answering)",
                c.retried
            );
        }
        row("Requests", requests);
        row(
            "Throughput",
            format!(
                "{:.2} req/s, {:.1} input tok/s, {:.1} output tok/s",
                self.req_per_s, self.input_tokens_per_s, self.output_tokens_per_s
            ),
        );
        let mut tokens = format!(
            "prompt {}, completion {}",
            opt(self.mean_prompt_tokens),
            opt(self.mean_completion_tokens)
        );
        if self.requests_without_usage > 0 {
            let _ = write!(
                tokens,
                " ({} responses without usage)",
                self.requests_without_usage
            );
        }
        row("Mean tokens", tokens);

        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<16}{:>10}{:>10}{:>10}{:>10}",
            "Latency (ms)", "mean", "p50", "p90", "p99"
        );
        for (name, summary) in [
            ("TTFT", self.ttft_s),
            ("TPOT", self.tpot_s),
            ("ITL", self.itl_s),
            ("E2E", self.e2e_s),
        ] {
            let _ = match summary {
                Some(s) => writeln!(
                    out,
                    "{name:<16}{:>10.2}{:>10.2}{:>10.2}{:>10.2}",
                    s.mean * 1e3,
                    s.p50 * 1e3,
                    s.p90 * 1e3,
                    s.p99 * 1e3
                ),
                None => writeln!(
                    out,
                    "{name:<16}{:>10}{:>10}{:>10}{:>10}",
                    "-", "-", "-", "-"
                ),
            };
        }
        if !self.errors.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "Errors");
            for e in &self.errors {
                let _ = writeln!(out, "  {:>6}x  {}", e.count, e.message);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::BenchArgs;
    use crate::client::Completed;
    use clap::Parser;
    use std::time::{Duration, Instant};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn config() -> Config {
        let args = Cli::try_parse_from(["bench", "--stream", "--concurrency", "2"])
            .unwrap()
            .args;
        Config::from_args(args).unwrap()
    }

    fn ok(
        t0: Instant,
        start_ms: u64,
        e2e_ms: u64,
        ttft_ms: Option<u64>,
        tokens: Option<u64>,
    ) -> RequestRecord {
        let start = t0 + Duration::from_millis(start_ms);
        RequestRecord {
            start,
            end: start + Duration::from_millis(e2e_ms),
            outcome: Outcome::Ok(Completed {
                e2e: e2e_ms as f64 / 1e3,
                prompt_tokens: 10,
                completion_tokens: tokens,
                usage_reported: tokens.is_some(),
                ttft: ttft_ms.map(|t| t as f64 / 1e3),
                itl: vec![0.01, 0.03],
            }),
            resends: 0,
        }
    }

    fn failed(t0: Instant, msg: &str) -> RequestRecord {
        RequestRecord {
            start: t0,
            end: t0 + Duration::from_millis(1),
            outcome: Outcome::Failed(msg.to_string()),
            resends: 0,
        }
    }

    #[test]
    fn aggregates_counts_throughput_and_tpot() {
        let t0 = Instant::now();
        let records = vec![
            ok(t0, 0, 1000, Some(100), Some(10)),  // tpot 0.9 / 9 = 0.1
            ok(t0, 500, 1500, Some(300), Some(5)), // ends at 2.0 s; tpot 1.2 / 4 = 0.3
            ok(t0, 100, 200, Some(50), Some(1)),   // one token: no tpot
            RequestRecord {
                start: t0,
                end: t0,
                outcome: Outcome::Rejected,
                resends: 0,
            },
            // Resent twice, then shed.
            RequestRecord {
                start: t0,
                end: t0,
                outcome: Outcome::Rejected,
                resends: 2,
            },
            failed(t0, "HTTP 500"),
        ];
        let r = Report::build(&config(), "m", &records);
        assert_eq!(
            r.requests,
            RequestCounts {
                total: 6,
                ok: 3,
                rejected: 2,
                failed: 1,
                retried: 2,
            }
        );
        assert!((r.duration_s - 2.0).abs() < 1e-9);
        assert!((r.req_per_s - 1.5).abs() < 1e-9);
        assert!((r.input_tokens_per_s - 15.0).abs() < 1e-9);
        assert!((r.output_tokens_per_s - 8.0).abs() < 1e-9);
        assert_eq!(r.mean_prompt_tokens, Some(10.0));
        assert_eq!(r.mean_completion_tokens, Some(16.0 / 3.0));
        let tpot = r.tpot_s.unwrap();
        assert!((tpot.mean - 0.2).abs() < 1e-9, "{tpot:?}");
        assert_eq!(r.ttft_s.unwrap().p50, 0.1);
        assert!((r.itl_s.unwrap().p50 - 0.02).abs() < 1e-12);
        assert_eq!(r.mode, "concurrency");
        assert_eq!(r.mode_value, 2.0);
        assert_eq!(
            r.errors,
            vec![ErrorSample {
                message: "HTTP 500".into(),
                count: 1
            }]
        );
    }

    #[test]
    fn keeps_the_five_most_frequent_distinct_errors() {
        let t0 = Instant::now();
        let mut records = Vec::new();
        for (i, msg) in ["a", "b", "c", "d", "e", "f", "g"].iter().enumerate() {
            for _ in 0..=i {
                records.push(failed(t0, msg));
            }
        }
        let r = Report::build(&config(), "m", &records);
        let kept: Vec<(&str, u64)> = r
            .errors
            .iter()
            .map(|e| (e.message.as_str(), e.count))
            .collect();
        assert_eq!(kept, vec![("g", 7), ("f", 6), ("e", 5), ("d", 4), ("c", 3)]);
        assert_eq!(r.requests.failed, 28);
    }

    #[test]
    fn empty_run_has_null_summaries_and_zero_rates() {
        let r = Report::build(&config(), "m", &[]);
        assert_eq!(r.duration_s, 0.0);
        assert_eq!(r.req_per_s, 0.0);
        assert_eq!(r.mean_prompt_tokens, None);
        let json = serde_json::to_value(&r).unwrap();
        assert!(json["ttft_s"].is_null() && json["e2e_s"].is_null());
        assert_eq!(json["endpoint"], "completions");
        assert!(
            r.render_table()
                .contains(&format!("{:<16}{:>10}", "TTFT", "-"))
        );
    }

    #[test]
    fn table_is_aligned_and_mentions_key_numbers() {
        let t0 = Instant::now();
        let r = Report::build(
            &config(),
            "my-model",
            &[ok(t0, 0, 1000, Some(100), Some(10)), failed(t0, "boom")],
        );
        let table = r.render_table();
        assert!(table.contains("my-model"));
        assert!(table.contains("1 ok, 0 rejected (429), 1 failed, 2 total\n"));
        let resent = Report::build(
            &config(),
            "m",
            &[RequestRecord {
                resends: 1,
                ..ok(t0, 0, 1000, Some(100), Some(10))
            }],
        );
        assert!(
            resent
                .render_table()
                .contains("1 ok, 0 rejected (429), 0 failed, 1 total (1 resent: the server closed a kept-alive connection before answering)"),
            "{}",
            resent.render_table()
        );
        assert!(table.contains("completions (streaming)"));
        assert!(table.contains("      1x  boom"));
        let latency: Vec<&str> = table
            .lines()
            .filter(|l| {
                ["Latency", "TTFT", "TPOT", "ITL", "E2E"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .collect();
        assert_eq!(latency.len(), 5);
        assert!(
            latency.iter().all(|l| l.len() == latency[0].len()),
            "{latency:#?}"
        );
        let ttft = format!("{:<16}{:>10}{:>10}", "TTFT", "100.00", "100.00");
        assert!(table.contains(&ttft), "{table}");
    }
}
