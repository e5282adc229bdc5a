//! `ballast signals`: what the operator reads from one engine — ours, vLLM's or SGLang's —
//! without a cluster. One scrape of a URL (two with `--interval`, for rates) or a saved
//! exposition, parsed by the operator's own parser and dialect adapters, printed as the
//! signals a control period decides on, with each absent one and why.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::scrape::aggregate::{TTFT_QUANTILE, replica_signals};
use crate::scrape::dialect::{adapt, is_usable};
use crate::scrape::histogram_quantile;
use crate::scrape::parser::{Exposition, parse};
use crate::signals::{Dialect, Family, ReplicaSample};

/// Flags of `ballast signals`.
#[derive(Debug, Clone, clap::Args)]
pub struct SignalsArgs {
    /// An engine's metrics (`http://HOST:PORT`, its `/metrics` path implied) or a saved
    /// exposition file (`-`: standard input).
    #[arg(value_name = "URL|FILE")]
    pub source: String,

    /// The exposition's dialect [default: detected from its series names].
    #[arg(long, value_enum, value_name = "DIALECT")]
    pub dialect: Option<DialectArg>,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Scrape twice, this many seconds apart, for what needs two scrapes: admission
    /// rejections per second, TTFT p99, the DP token shares (a URL only).
    #[arg(long, value_name = "SECS")]
    pub interval: Option<f64>,

    /// Bearer key for an engine whose `/metrics` requires one.
    #[arg(
        long,
        env = "BALLAST_SIGNALS_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub key: Option<String>,
}

/// A dialect on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DialectArg {
    /// `ballast_*` series.
    Ballast,
    /// `vllm:*` series.
    Vllm,
    /// `sglang:*` series.
    Sglang,
    /// `llamacpp:*` series (llama.cpp's `llama-server --metrics`).
    Llamacpp,
}

impl From<DialectArg> for Dialect {
    fn from(d: DialectArg) -> Dialect {
        match d {
            DialectArg::Ballast => Dialect::Ballast,
            DialectArg::Vllm => Dialect::Vllm,
            DialectArg::Sglang => Dialect::Sglang,
            DialectArg::Llamacpp => Dialect::Llamacpp,
        }
    }
}

/// Why `ballast signals` printed nothing (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum SignalsError {
    /// The URL did not answer, or not with 200.
    #[error("cannot scrape {url}: {why}")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// Why.
        why: String,
    },
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The text carries no series of any dialect, or none of the one asked for.
    #[error("{0}")]
    NotAnExposition(String),
    /// A flag that cannot work.
    #[error("{0}")]
    Flag(String),
}

impl SignalsError {
    /// Process exit code: 2, every one of them is bad input.
    pub fn exit_code(&self) -> i32 {
        2
    }
}

/// One signal that has no value, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Absent {
    /// The signal, as the report names it.
    pub signal: &'static str,
    /// Why it is absent.
    pub why: String,
}

/// What the operator reads from one exposition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Where it came from.
    pub source: String,
    /// The dialect it was read in.
    pub dialect: &'static str,
    /// Whether the dialect was detected (not given).
    pub detected: bool,
    /// Lines the parser rejected and series it dropped as ambiguous.
    pub unreadable: usize,
    /// Requests running, over the ranks.
    pub running: Option<f64>,
    /// Requests waiting for capacity, over the ranks: more replicas help them.
    pub capacity_waiting: Option<f64>,
    /// Requests deferred by tenant caps: more replicas do not help them.
    pub deferred_waiting: Option<f64>,
    /// KV cache usage, the fullest rank's (the value decisions use).
    pub kv_cache_usage_max: Option<f64>,
    /// KV cache usage per DP rank (`""`: a series without a rank label).
    pub kv_cache_usage_by_rank: BTreeMap<String, f64>,
    /// Lifetime admission rejections (HTTP 429), over every series.
    pub admission_rejections_total: Option<f64>,
    /// Lifetime admission rejections per series (its labels).
    pub admission_rejections_by_series: BTreeMap<String, f64>,
    /// Seconds between the two scrapes, with `--interval`.
    pub interval_seconds: Option<f64>,
    /// Admission rejections per second between the two scrapes.
    pub admission_rejections_per_second: Option<f64>,
    /// p99 time to first token of the requests whose first token came between the scrapes.
    pub ttft_p99_seconds: Option<f64>,
    /// Each DP rank's share of the tokens scheduled between the scrapes.
    pub dp_token_share: Vec<f64>,
    /// Requests a gateway holds (`ballast gateway`'s own exposition): capacity-waiting
    /// that no replica counts yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_requests: Option<f64>,
    /// The longest of those holds, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_hold_seconds: Option<f64>,
    /// Every signal without a value, and why.
    pub absent: Vec<Absent>,
}

/// Runs `ballast signals`: prints the report on stdout.
pub async fn run(args: SignalsArgs) -> Result<Report, SignalsError> {
    let report = inspect(&args).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serializes")
        );
    } else {
        print!("{}", render(&report));
    }
    Ok(report)
}

/// The report for `args`, printed by nobody.
pub async fn inspect(args: &SignalsArgs) -> Result<Report, SignalsError> {
    let url = args.source.starts_with("http://") || args.source.starts_with("https://");
    let interval = match args.interval {
        None => None,
        Some(_) if !url => {
            return Err(SignalsError::Flag(
                "--interval needs a URL: a saved exposition is one scrape".into(),
            ));
        }
        Some(s) if !(s.is_finite() && s > 0.0 && s <= 3600.0) => {
            return Err(SignalsError::Flag(format!(
                "--interval must be between 0 and 3600 seconds, not {s}"
            )));
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
    };
    if !url {
        let text = read_file(&args.source)?;
        return report(&args.source, args.dialect, &text, None);
    }
    let target = metrics_url(&args.source);
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| SignalsError::Unreachable {
            url: target.clone(),
            why: e.to_string(),
        })?;
    let first = fetch(&client, &target, args.key.as_deref()).await?;
    let Some(wait) = interval else {
        return report(&target, args.dialect, &first, None);
    };
    let first_at = Instant::now();
    tokio::time::sleep(wait).await;
    let second = fetch(&client, &target, args.key.as_deref()).await?;
    report(&target, args.dialect, &second, Some((&first, first_at)))
}

/// `URL`, with `/metrics` when it names no path.
fn metrics_url(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    if rest.contains('/') && !rest.ends_with('/') {
        url.to_string()
    } else {
        format!("{}/metrics", url.trim_end_matches('/'))
    }
}

fn read_file(path: &str) -> Result<String, SignalsError> {
    let bytes = if path == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).map(|_| buf)
    } else {
        std::fs::read(path)
    }
    .map_err(|source| SignalsError::Read {
        path: path.to_string(),
        source,
    })?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

async fn fetch(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
) -> Result<String, SignalsError> {
    let fail = |why: String| SignalsError::Unreachable {
        url: url.to_string(),
        why,
    };
    let mut req = client.get(url);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.map_err(|e| fail(e.to_string()))?;
    let status = resp.status();
    let body = resp.text().await.map_err(|e| fail(e.to_string()))?;
    if !status.is_success() {
        let first = body.lines().next().unwrap_or_default();
        return Err(fail(format!("HTTP {status}: {first}")));
    }
    Ok(body)
}

/// The dialect whose prefix most series carry, if any does.
fn detect(exp: &Exposition<'_>) -> Option<Dialect> {
    let count = |prefix: &str| {
        exp.samples
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .count()
            + exp.types.keys().filter(|n| n.starts_with(prefix)).count()
    };
    [
        (Dialect::Ballast, count("ballast_")),
        (Dialect::Vllm, count("vllm:")),
        (Dialect::Sglang, count("sglang:")),
        (Dialect::Llamacpp, count("llamacpp:")),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .max_by_key(|(_, n)| *n)
    .map(|(d, _)| d)
}

fn name(d: Dialect) -> &'static str {
    match d {
        Dialect::Ballast => "ballast",
        Dialect::Vllm => "vllm",
        Dialect::Sglang => "sglang",
        Dialect::Llamacpp => "llamacpp",
    }
}

/// KV usage per rank: the dialect's family and rank label, the max per rank.
fn kv_by_rank(d: Dialect, exp: &Exposition<'_>) -> BTreeMap<String, f64> {
    let (families, label): (&[&str], &str) = match d {
        Dialect::Ballast => (&["ballast_kv_cache_usage_ratio"], "engine"),
        // The newer name first, as the adapter reads it.
        Dialect::Vllm => (
            &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            "engine",
        ),
        Dialect::Sglang => (&["sglang:token_usage"], "dp_rank"),
        // No ranks: one slot pool per server.
        Dialect::Llamacpp => (&["llamacpp:kv_cache_usage_ratio"], "engine"),
    };
    let Some(family) = families.iter().find(|f| exp.has(f)) else {
        return BTreeMap::new();
    };
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for s in exp.named(family) {
        let rank = s.label(label).unwrap_or_default().to_string();
        out.entry(rank)
            .and_modify(|v| *v = v.max(s.value))
            .or_insert(s.value);
    }
    out
}

/// The report of one exposition `text` (the second of two, with `previous`).
fn report(
    source: &str,
    asked: Option<DialectArg>,
    text: &str,
    previous: Option<(&str, Instant)>,
) -> Result<Report, SignalsError> {
    let exp = parse(text);
    if asked.is_none()
        && let Some((held, oldest)) = crate::scrape::held::read(text.as_bytes())
    {
        return Ok(gateway_report(source, exp.errors(), held, oldest));
    }
    let dialect = match asked {
        Some(d) => Dialect::from(d),
        None => detect(&exp).ok_or_else(|| {
            SignalsError::NotAnExposition(format!(
                "{source} is not an exposition of a known engine: no ballast_, vllm: or sglang: series in {} samples ({} lines unreadable)",
                exp.samples.len(),
                exp.errors()
            ))
        })?,
    };
    let sample = adapt(dialect, &exp);
    if !is_usable(&sample) && sample.families.is_empty() {
        return Err(SignalsError::NotAnExposition(format!(
            "{source} carries none of the series the operator reads in the {} dialect{}",
            name(dialect),
            match detect(&exp) {
                Some(other) if other != dialect => format!(" (it looks like {})", name(other)),
                _ => String::new(),
            }
        )));
    }
    let rates = previous.map(|(prev_text, at)| {
        let prev_exp = parse(prev_text);
        let prev = adapt(dialect, &prev_exp);
        let now = Instant::now();
        (
            replica_signals("engine", Some((&prev, at)), &sample, now),
            now.duration_since(at).as_secs_f64(),
        )
    });
    let ttft_p99 = rates
        .as_ref()
        .and_then(|(r, _)| histogram_quantile(TTFT_QUANTILE, &r.ttft_bucket_increase));
    let mut report = Report {
        source: source.to_string(),
        dialect: name(dialect),
        detected: asked.is_none(),
        unreadable: exp.errors(),
        running: sample.running,
        capacity_waiting: sample.waiting_capacity,
        deferred_waiting: sample.waiting_deferred,
        kv_cache_usage_max: sample.kv_usage,
        kv_cache_usage_by_rank: kv_by_rank(dialect, &exp),
        admission_rejections_total: sample.rejections_sum(),
        admission_rejections_by_series: sample.rejections_total.clone().unwrap_or_default(),
        interval_seconds: rates.as_ref().map(|(_, s)| *s),
        admission_rejections_per_second: rates.as_ref().and_then(|(r, _)| r.rejections_per_second),
        ttft_p99_seconds: ttft_p99,
        dp_token_share: rates
            .as_ref()
            .map(|(r, _)| r.dp_token_share.clone())
            .unwrap_or_default(),
        held_requests: None,
        oldest_hold_seconds: None,
        absent: Vec::new(),
    };
    report.absent = absences(dialect, &sample, &report);
    Ok(report)
}

/// The report of a gateway picker's exposition: what it holds, the demand the operator
/// adds to capacity-waiting.
fn gateway_report(source: &str, unreadable: usize, held: f64, oldest: f64) -> Report {
    Report {
        source: source.to_string(),
        dialect: "gateway",
        detected: true,
        unreadable,
        running: None,
        capacity_waiting: None,
        deferred_waiting: None,
        kv_cache_usage_max: None,
        kv_cache_usage_by_rank: BTreeMap::new(),
        admission_rejections_total: None,
        admission_rejections_by_series: BTreeMap::new(),
        interval_seconds: None,
        admission_rejections_per_second: None,
        ttft_p99_seconds: None,
        dp_token_share: Vec::new(),
        held_requests: Some(held),
        oldest_hold_seconds: Some(oldest),
        absent: Vec::new(),
    }
}

/// Every signal of `report` without a value, and why.
fn absences(d: Dialect, s: &ReplicaSample, r: &Report) -> Vec<Absent> {
    let mut out = Vec::new();
    let exported = |f: Family| s.families.contains(&f);
    let mut why = |signal: &'static str, why: String| out.push(Absent { signal, why });
    let unusable = "exported, but no usable value (a negative count or a ratio outside [0, 1])";
    let not_exported = |what: &str| format!("not exported: the exposition has no {what} series");
    if r.running.is_none() {
        why("running", not_exported("running-requests"));
    }
    match (exported(Family::Waiting), r.capacity_waiting) {
        (false, _) => why("capacity_waiting", not_exported("waiting-requests")),
        (true, None) => why("capacity_waiting", unusable.into()),
        _ => {}
    }
    if r.deferred_waiting.is_none() {
        why(
            "deferred_waiting",
            match d {
                Dialect::Ballast if exported(Family::Waiting) => unusable.into(),
                Dialect::Ballast => not_exported("waiting-by-reason"),
                Dialect::Vllm => "this vLLM exports no vllm:num_requests_waiting_by_reason: every waiting request counts as waiting for capacity".into(),
                Dialect::Sglang => "SGLang does not tell requests deferred by tenant caps from those waiting for capacity: every waiting request counts as waiting for capacity".into(),
                Dialect::Llamacpp => "llama-server has no tenant caps: its deferred requests wait for a free slot, which is waiting for capacity".into(),
            },
        );
    }
    match (exported(Family::KvUsage), r.kv_cache_usage_max) {
        (false, _) => why("kv_cache_usage", not_exported("KV-cache usage")),
        (true, None) => why("kv_cache_usage", unusable.into()),
        _ => {}
    }
    match (exported(Family::Rejections), r.admission_rejections_total) {
        (false, _) => why(
            "admission_rejections",
            not_exported("admission-rejection (HTTP 429) counter"),
        ),
        (true, None) => why("admission_rejections", unusable.into()),
        _ => {}
    }
    let no_interval = "needs two scrapes: --interval SECS, with a URL";
    if r.admission_rejections_per_second.is_none() && exported(Family::Rejections) {
        why(
            "admission_rejections_per_second",
            if r.interval_seconds.is_none() {
                no_interval.into()
            } else {
                "the counter was not in both scrapes".into()
            },
        );
    }
    if r.ttft_p99_seconds.is_none() {
        why(
            "ttft_p99_seconds",
            if !exported(Family::Ttft) {
                not_exported("time-to-first-token histogram")
            } else if r.interval_seconds.is_none() {
                no_interval.into()
            } else {
                "no request got its first token between the scrapes".into()
            },
        );
    }
    out
}

fn num(v: Option<f64>) -> String {
    match v {
        None => "absent".into(),
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
        Some(x) => format!("{x:.4}"),
    }
}

/// The report as a table.
pub fn render(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let detected = if r.detected { ", detected" } else { "" };
    let _ = writeln!(out, "{} ({} dialect{detected})", r.source, r.dialect);
    if r.unreadable > 0 {
        let _ = writeln!(
            out,
            "  {} lines or series could not be read; the rest is shown",
            r.unreadable
        );
    }
    let mut row = |k: &str, v: String| {
        let _ = writeln!(out, "  {k:<34} {v}");
    };
    if let Some(held) = r.held_requests {
        row("held by the gateway", num(Some(held)));
        row("oldest hold (s)", num(r.oldest_hold_seconds));
        let _ = writeln!(
            out,
            "  (the operator counts held requests as waiting for capacity)"
        );
        return out;
    }
    row("running", num(r.running));
    row("waiting for capacity", num(r.capacity_waiting));
    row("deferred by tenant caps", num(r.deferred_waiting));
    let ranks = if r.kv_cache_usage_by_rank.len() > 1 {
        let each: Vec<String> = r
            .kv_cache_usage_by_rank
            .iter()
            .map(|(k, v)| format!("{k}: {v:.4}"))
            .collect();
        format!("  (by rank {})", each.join(", "))
    } else {
        String::new()
    };
    row(
        "KV cache usage (fullest rank)",
        format!("{}{ranks}", num(r.kv_cache_usage_max)),
    );
    row(
        "admission rejections (lifetime)",
        num(r.admission_rejections_total),
    );
    for (series, v) in &r.admission_rejections_by_series {
        row(&format!("  {{{series}}}"), num(Some(*v)));
    }
    if let Some(s) = r.interval_seconds {
        row("interval (s)", format!("{s:.1}"));
        row(
            "admission rejections per second",
            num(r.admission_rejections_per_second),
        );
        row("TTFT p99 (s)", num(r.ttft_p99_seconds));
        if !r.dp_token_share.is_empty() {
            let each: Vec<String> = r.dp_token_share.iter().map(|s| format!("{s:.3}")).collect();
            row("DP token share by rank", each.join(", "));
        }
    }
    if !r.absent.is_empty() {
        let _ = writeln!(out, "absent:");
        for a in &r.absent {
            let _ = writeln!(out, "  {}: {}", a.signal, a.why);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateways_exposition_reads_as_its_held_requests() {
        let text = "ballast_gateway_endpoints 0\nballast_gateway_held_requests{pool=\"chat\"} 4\nballast_gateway_oldest_hold_seconds{pool=\"chat\"} 2.25\n";
        let r = report("picker", None, text, None).unwrap();
        assert_eq!(r.dialect, "gateway");
        assert_eq!(
            (r.held_requests, r.oldest_hold_seconds),
            (Some(4.0), Some(2.25))
        );
        let table = render(&r);
        assert!(table.contains("held by the gateway"), "{table}");
        assert!(table.contains("2.2500"), "{table}");
    }

    #[test]
    fn a_url_without_a_path_means_its_metrics() {
        assert_eq!(metrics_url("http://h:8000"), "http://h:8000/metrics");
        assert_eq!(metrics_url("http://h:8000/"), "http://h:8000/metrics");
        assert_eq!(metrics_url("http://h:8000/stats"), "http://h:8000/stats");
    }
}
