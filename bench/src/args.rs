//! Command-line flags and their validation into a [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::lengths::LengthSpec;

/// Which OpenAI API the requests use.
#[derive(clap::ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `POST /v1/completions` with the prompt as token ids (exact lengths).
    Completions,
    /// `POST /v1/chat/completions` with a text prompt (approximate lengths).
    Chat,
}

impl Endpoint {
    /// The request path, relative to the base URL.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
        }
    }
}

/// `ballast bench` flags. Every flag also reads an env var `BALLAST_BENCH_<NAME>`
/// (switches accept `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`).
///
/// Length SPECs (`--input-len`, `--output-len`) are `N` (fixed),
/// `uniform:LO:HI` (inclusive), `normal:MEAN:STD` or `exp:MEAN` (both rounded
/// and clamped to at least 1).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Base URL of the OpenAI-compatible server (a trailing `/v1` is ignored).
    #[arg(
        long,
        env = "BALLAST_BENCH_URL",
        value_name = "URL",
        default_value = "http://127.0.0.1:8000"
    )]
    pub url: String,

    /// Model name to send; if omitted, the first id from GET {url}/v1/models.
    #[arg(long, env = "BALLAST_BENCH_MODEL", value_name = "NAME")]
    pub model: Option<String>,

    /// API to exercise.
    #[arg(long, env = "BALLAST_BENCH_ENDPOINT", value_enum, default_value_t = Endpoint::Completions)]
    pub endpoint: Endpoint,

    /// Open loop: Poisson arrivals at this many requests per second, however
    /// many are already in flight.
    #[arg(
        long,
        allow_negative_numbers = true,
        env = "BALLAST_BENCH_RATE",
        value_name = "R",
        conflicts_with = "concurrency"
    )]
    pub rate: Option<f64>,

    /// Closed loop: this many workers, each sending its next request when the
    /// previous one ends [default: 1].
    #[arg(long, env = "BALLAST_BENCH_CONCURRENCY", value_name = "C")]
    pub concurrency: Option<u64>,

    /// Stop after this many requests [default: 100 unless --duration is given].
    #[arg(long, env = "BALLAST_BENCH_NUM_REQUESTS", value_name = "N")]
    pub num_requests: Option<u64>,

    /// Stop issuing requests after this many seconds, then wait for in-flight ones.
    #[arg(
        long,
        allow_negative_numbers = true,
        env = "BALLAST_BENCH_DURATION",
        value_name = "SECS"
    )]
    pub duration: Option<f64>,

    /// A request still unfinished after this many seconds counts as failed.
    #[arg(
        long,
        allow_negative_numbers = true,
        env = "BALLAST_BENCH_REQUEST_TIMEOUT",
        value_name = "SECS",
        default_value_t = 600.0
    )]
    pub request_timeout: f64,

    /// Prompt length SPEC in tokens (approximate words for --endpoint chat).
    #[arg(
        long,
        env = "BALLAST_BENCH_INPUT_LEN",
        value_name = "SPEC",
        default_value = "128"
    )]
    pub input_len: String,

    /// Output length SPEC, sent as max_tokens.
    #[arg(
        long,
        env = "BALLAST_BENCH_OUTPUT_LEN",
        value_name = "SPEC",
        default_value = "128"
    )]
    pub output_len: String,

    /// Leading prompt tokens shared by requests that carry the shared prefix
    /// (counted within --input-len).
    #[arg(
        long,
        env = "BALLAST_BENCH_SHARED_PREFIX_LEN",
        value_name = "N",
        default_value_t = 0
    )]
    pub shared_prefix_len: u64,

    /// Fraction of requests (0..=1) that carry the shared prefix.
    #[arg(
        long,
        allow_negative_numbers = true,
        env = "BALLAST_BENCH_SHARED_PREFIX_RATIO",
        value_name = "F",
        default_value_t = 1.0
    )]
    pub shared_prefix_ratio: f64,

    /// Distinct shared prefixes (system prompts), each --shared-prefix-len long; a
    /// request that carries one carries one of them, drawn uniformly.
    #[arg(
        long,
        env = "BALLAST_BENCH_SHARED_PREFIXES",
        value_name = "K",
        default_value_t = 1
    )]
    pub shared_prefixes: u64,

    /// Spread requests over this many tenants (`user` field and `x-tenant`
    /// header `tenant-<i>`); 0 sends no tenant.
    #[arg(
        long,
        env = "BALLAST_BENCH_TENANTS",
        value_name = "K",
        default_value_t = 0
    )]
    pub tenants: u64,

    /// Stream responses (SSE); needed for TTFT, ITL and TPOT.
    #[arg(long, env = "BALLAST_BENCH_STREAM", value_parser = BoolishValueParser::new())]
    pub stream: bool,

    /// Send `ignore_eos: true` (vLLM/SGLang/Ballast) so outputs hit max_tokens exactly.
    #[arg(long, env = "BALLAST_BENCH_IGNORE_EOS", value_parser = BoolishValueParser::new())]
    pub ignore_eos: bool,

    /// Sampling temperature sent with every request.
    #[arg(
        long,
        allow_negative_numbers = true,
        env = "BALLAST_BENCH_TEMPERATURE",
        value_name = "F",
        default_value_t = 0.0
    )]
    pub temperature: f64,

    /// Seed for the workload (lengths, prompts, arrivals, tenants).
    #[arg(
        long,
        env = "BALLAST_BENCH_SEED",
        value_name = "N",
        default_value_t = 0
    )]
    pub seed: u64,

    /// Half-open range LO:HI of prompt token ids for --endpoint completions.
    #[arg(
        long,
        env = "BALLAST_BENCH_TOKEN_RANGE",
        value_name = "LO:HI",
        default_value = "32:127"
    )]
    pub token_range: String,

    /// Also write the report as pretty JSON to this file.
    #[arg(long, env = "BALLAST_BENCH_JSON", value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Do not draw the progress bar on stderr.
    #[arg(long, env = "BALLAST_BENCH_NO_PROGRESS", value_parser = BoolishValueParser::new())]
    pub no_progress: bool,

    /// Extra HTTP header `NAME:VALUE`; repeatable.
    #[arg(long = "header", env = "BALLAST_BENCH_HEADER", value_name = "K:V")]
    pub headers: Vec<String>,

    /// Sends `Authorization: Bearer KEY`; falls back to $OPENAI_API_KEY.
    #[arg(
        long,
        env = "BALLAST_BENCH_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

/// Open or closed loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Load {
    Rate(f64),
    Concurrency(u64),
}

/// Validated settings for one run.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Without a trailing slash or `/v1`.
    pub base_url: String,
    pub model: Option<String>,
    pub endpoint: Endpoint,
    pub load: Load,
    pub max_requests: Option<u64>,
    pub duration: Option<Duration>,
    pub request_timeout: Duration,
    pub input: LengthSpec,
    pub output: LengthSpec,
    pub shared_prefix_len: u64,
    pub shared_prefix_ratio: f64,
    pub shared_prefixes: u64,
    pub tenants: u64,
    pub stream: bool,
    pub ignore_eos: bool,
    pub temperature: f64,
    pub seed: u64,
    /// Half-open.
    pub token_range: (u32, u32),
    pub progress: bool,
    pub headers: HeaderMap,
}

fn seconds(flag: &'static str, secs: f64) -> Result<Duration, BenchError> {
    if !secs.is_finite() || secs <= 0.0 {
        return Err(BenchError::invalid(
            flag,
            secs,
            "must be a positive number of seconds",
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| BenchError::invalid(flag, secs, e))
}

fn length(flag: &'static str, spec: &str) -> Result<LengthSpec, BenchError> {
    spec.parse()
        .map_err(|reason| BenchError::invalid(flag, spec, reason))
}

/// Accepts `http(s)://host[:port][/prefix]`, dropping a trailing `/` and
/// `/v1` so that both `http://h:8000` and `https://api.openai.com/v1` work.
fn base_url(url: &str) -> Result<String, BenchError> {
    let parsed = reqwest::Url::parse(url.trim()).map_err(|e| {
        BenchError::invalid(
            "--url",
            url,
            format!("{e} (expected e.g. http://127.0.0.1:8000)"),
        )
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(BenchError::invalid(
            "--url",
            url,
            "scheme must be http or https",
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(BenchError::invalid(
            "--url",
            url,
            "must not contain ?query or #fragment",
        ));
    }
    let mut base = parsed.as_str().trim_end_matches('/').to_string();
    if let Some(stripped) = base.strip_suffix("/v1") {
        base = stripped.to_string();
    }
    Ok(base)
}

fn token_range(spec: &str) -> Result<(u32, u32), BenchError> {
    let bad = |reason: &str| BenchError::invalid("--token-range", spec, reason);
    let (lo, hi) = spec
        .split_once(':')
        .ok_or_else(|| bad("expected LO:HI (half-open), e.g. 32:127"))?;
    let lo: u32 = lo.trim().parse().map_err(|_| bad("LO is not a token id"))?;
    let hi: u32 = hi.trim().parse().map_err(|_| bad("HI is not a token id"))?;
    if lo >= hi {
        return Err(bad("LO must be below HI (the range is half-open)"));
    }
    Ok((lo, hi))
}

fn headers(raw: &[String], api_key: Option<&str>) -> Result<HeaderMap, BenchError> {
    let mut map = HeaderMap::new();
    if let Some(key) = api_key {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
            // Never echo the key itself back in an error message.
            .map_err(|_| {
                BenchError::invalid(
                    "--api-key",
                    "<hidden>",
                    "contains characters not allowed in an HTTP header",
                )
            })?;
        value.set_sensitive(true);
        map.insert(AUTHORIZATION, value);
    }
    // Explicit --header values come last so they can override the API key.
    for h in raw {
        let bad = |reason: &str| BenchError::invalid("--header", h, reason);
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| bad("expected NAME:VALUE"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| bad("invalid header name"))?;
        let value = HeaderValue::from_str(value.trim()).map_err(|_| bad("invalid header value"))?;
        map.insert(name, value);
    }
    Ok(map)
}

impl Config {
    /// Checks every flag, so that mistakes surface before any request is sent.
    pub(crate) fn from_args(args: BenchArgs) -> Result<Self, BenchError> {
        let load = match (args.rate, args.concurrency) {
            (Some(_), Some(_)) => {
                return Err(BenchError::invalid(
                    "--rate",
                    "",
                    "cannot be combined with --concurrency",
                ));
            }
            (Some(r), None) if !r.is_finite() || r <= 0.0 => {
                return Err(BenchError::invalid(
                    "--rate",
                    r,
                    "must be a positive number of requests per second",
                ));
            }
            (Some(r), None) => Load::Rate(r),
            (None, Some(0)) => {
                return Err(BenchError::invalid(
                    "--concurrency",
                    0,
                    "must be at least 1",
                ));
            }
            (None, Some(c)) => Load::Concurrency(c),
            (None, None) => Load::Concurrency(1),
        };
        let duration = args
            .duration
            .map(|d| seconds("--duration", d))
            .transpose()?;
        let max_requests = match (args.num_requests, duration) {
            (Some(0), _) => {
                return Err(BenchError::invalid(
                    "--num-requests",
                    0,
                    "must be at least 1",
                ));
            }
            (None, None) => Some(100),
            (n, _) => n,
        };
        if !(0.0..=1.0).contains(&args.shared_prefix_ratio) {
            return Err(BenchError::invalid(
                "--shared-prefix-ratio",
                args.shared_prefix_ratio,
                "must be between 0 and 1",
            ));
        }
        if args.shared_prefixes == 0 {
            return Err(BenchError::invalid(
                "--shared-prefixes",
                0,
                "must be at least 1",
            ));
        }
        if !args.temperature.is_finite() || args.temperature < 0.0 {
            return Err(BenchError::invalid(
                "--temperature",
                args.temperature,
                "must be a number >= 0",
            ));
        }
        if let Some(path) = &args.json {
            // Fail now rather than after a long run whose results would be lost.
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            if parent.is_some_and(|p| !p.is_dir()) {
                return Err(BenchError::invalid(
                    "--json",
                    path.display(),
                    "parent directory does not exist",
                ));
            }
        }
        let api_key = args
            .api_key
            .clone()
            .or_else(|| std::env::var("OPENAI_API_KEY").ok())
            .filter(|k| !k.trim().is_empty());
        Ok(Config {
            base_url: base_url(&args.url)?,
            model: args.model.filter(|m| !m.trim().is_empty()),
            endpoint: args.endpoint,
            load,
            max_requests,
            duration,
            request_timeout: seconds("--request-timeout", args.request_timeout)?,
            input: length("--input-len", &args.input_len)?,
            output: length("--output-len", &args.output_len)?,
            shared_prefix_len: args.shared_prefix_len,
            shared_prefix_ratio: args.shared_prefix_ratio,
            shared_prefixes: args.shared_prefixes,
            tenants: args.tenants,
            stream: args.stream,
            ignore_eos: args.ignore_eos,
            temperature: args.temperature,
            seed: args.seed,
            token_range: token_range(&args.token_range)?,
            progress: !args.no_progress,
            headers: headers(&args.headers, api_key.as_deref())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(extra: &[&str]) -> Result<Config, BenchError> {
        let argv = std::iter::once("bench").chain(extra.iter().copied());
        Config::from_args(Cli::try_parse_from(argv).expect("clap accepts").args)
    }

    fn flag_of(err: BenchError) -> &'static str {
        match err {
            BenchError::InvalidArg { flag, .. } => flag,
            other => panic!("expected InvalidArg, got {other}"),
        }
    }

    #[test]
    fn defaults_match_the_documentation() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.base_url, "http://127.0.0.1:8000");
        assert_eq!(c.endpoint, Endpoint::Completions);
        assert_eq!(c.load, Load::Concurrency(1));
        assert_eq!(c.max_requests, Some(100));
        assert_eq!(c.duration, None);
        assert_eq!(c.request_timeout, Duration::from_secs(600));
        assert_eq!(c.input, LengthSpec::Fixed(128));
        assert_eq!(c.output, LengthSpec::Fixed(128));
        assert_eq!(c.token_range, (32, 127));
        assert_eq!(c.shared_prefix_ratio, 1.0);
        assert!(!c.stream && !c.ignore_eos && c.progress);
    }

    #[test]
    fn duration_alone_removes_the_request_limit() {
        let c = parse(&["--duration", "5"]).unwrap();
        assert_eq!(c.max_requests, None);
        assert_eq!(c.duration, Some(Duration::from_secs(5)));
        let c = parse(&["--duration", "5", "--num-requests", "7"]).unwrap();
        assert_eq!(c.max_requests, Some(7));
    }

    #[test]
    fn rate_and_concurrency_are_mutually_exclusive() {
        assert!(Cli::try_parse_from(["bench", "--rate", "2", "--concurrency", "3"]).is_err());
        assert_eq!(parse(&["--rate", "2.5"]).unwrap().load, Load::Rate(2.5));
        assert_eq!(
            parse(&["--concurrency", "8"]).unwrap().load,
            Load::Concurrency(8)
        );
    }

    #[test]
    fn bad_values_name_their_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--input-len", "uniform:9:1"], "--input-len"),
            (&["--output-len", "lots"], "--output-len"),
            (&["--rate", "0"], "--rate"),
            (&["--concurrency", "0"], "--concurrency"),
            (&["--num-requests", "0"], "--num-requests"),
            (&["--duration", "-1"], "--duration"),
            (&["--request-timeout", "0"], "--request-timeout"),
            (&["--shared-prefix-ratio", "1.5"], "--shared-prefix-ratio"),
            (&["--token-range", "100:50"], "--token-range"),
            (&["--token-range", "abc"], "--token-range"),
            (&["--header", "no-colon"], "--header"),
            (&["--url", "ftp://x"], "--url"),
            (&["--url", "not a url"], "--url"),
            (&["--json", "/definitely/not/a/dir/out.json"], "--json"),
        ];
        for (argv, flag) in cases {
            let err = parse(argv).expect_err(&format!("{argv:?} accepted"));
            let msg = err.to_string();
            assert!(msg.contains(flag), "{msg:?} does not name {flag}");
            assert_eq!(flag_of(err), *flag);
        }
    }

    #[test]
    fn url_is_normalised() {
        for (given, want) in [
            ("http://h:8000/", "http://h:8000"),
            ("https://api.openai.com/v1", "https://api.openai.com"),
            ("https://api.openai.com/v1/", "https://api.openai.com"),
            ("http://h/proxy", "http://h/proxy"),
        ] {
            assert_eq!(parse(&["--url", given]).unwrap().base_url, want);
        }
    }

    #[test]
    fn headers_and_api_key() {
        let c = parse(&[
            "--api-key",
            "sk-1",
            "--header",
            "X-A: b:c",
            "--header",
            "x-b:d",
        ])
        .unwrap();
        assert_eq!(c.headers["authorization"], "Bearer sk-1");
        assert_eq!(c.headers["x-a"], "b:c");
        assert_eq!(c.headers["x-b"], "d");
        // An explicit header overrides the key.
        let c = parse(&["--api-key", "sk-1", "--header", "Authorization:Basic z"]).unwrap();
        assert_eq!(c.headers["authorization"], "Basic z");
    }
}
