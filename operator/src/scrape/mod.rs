//! Scraping replicas' `/metrics` and turning them into [`signals`](crate::signals).
//!
//! Once per control period a runtime calls [`Scraper::scrape`] with the ready replicas,
//! then feeds the outcomes to a long-lived [`Tracker`] ([`Tracker::observe_outcomes`]),
//! which returns the [`FleetSignals`] the decision core reads:
//!
//! ```no_run
//! # async fn period(scraper: &ballast_operator::scrape::Scraper,
//! #                 tracker: &mut ballast_operator::scrape::Tracker) {
//! use ballast_operator::scrape::Target;
//! use ballast_operator::signals::Dialect;
//! let targets = vec![Target::new("chat-0", "http://10.0.0.7:8000")];
//! let outcomes = scraper.scrape(Dialect::Ballast, &targets).await;
//! for o in &outcomes {
//!     if let Err(e) = &o.result {
//!         tracing::warn!(target = %o.target, reason = e.reason(), "scrape failed: {e}");
//!     }
//! }
//! let fleet = tracker.observe_outcomes(std::time::Instant::now(), &outcomes, 0);
//! # let _ = fleet;
//! # }
//! ```
//!
//! Pieces, one idea each: [`parser`] (text format → samples), [`dialect`] (samples →
//! [`ReplicaSample`] for ballast, vLLM or SGLang names), [`aggregate`] (samples over time →
//! rates and the fleet view), and here the concurrent HTTP side.

pub mod aggregate;
pub mod dialect;
mod error;
mod fetch;
pub mod held;
mod key;
pub mod parser;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use aggregate::{Tracker, histogram_quantile};
pub use error::ScrapeError;
pub use key::ScrapeKey;
pub use parser::Limits;

use crate::signals::{Dialect, FleetSignals, ReplicaSample};

/// One replica to scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Replica name (pod or local process name); the key across control periods.
    pub name: String,
    /// Scheme, host and port, e.g. `http://10.0.0.7:8000`; the metrics path is appended.
    pub base_url: String,
}

impl Target {
    /// A target named `name` at `base_url`.
    pub fn new(name: impl Into<String>, base_url: impl Into<String>) -> Self {
        Target {
            name: name.into(),
            base_url: base_url.into(),
        }
    }
}

/// How replicas are scraped.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeConfig {
    /// Path of the exposition, e.g. `/metrics`.
    pub path: String,
    /// Limit for one replica's whole request: connect, headers and body.
    pub timeout: Duration,
    /// Largest body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Most scrapes in flight at once.
    pub concurrency: usize,
    /// Parser limits.
    pub limits: Limits,
    /// A key sent as `Authorization: Bearer` (an engine's API key, for one run with
    /// `--metrics-require-key`); `None`: no header.
    pub key: Option<ScrapeKey>,
}

impl Default for ScrapeConfig {
    /// The contract's defaults: `/metrics`, 2 s, 4 MiB; 16 scrapes in flight.
    fn default() -> Self {
        ScrapeConfig {
            path: "/metrics".into(),
            timeout: Duration::from_secs(2),
            max_body_bytes: 4 * 1024 * 1024,
            concurrency: 16,
            limits: Limits::default(),
            key: None,
        }
    }
}

impl ScrapeConfig {
    /// From an InferenceService's `spec.metrics`; out-of-range numbers (which the CRD
    /// rejects anyway) are clamped to at least 1 s and 1 KiB.
    pub fn from_spec(spec: &ballast_crds::MetricsSpec) -> Self {
        ScrapeConfig {
            path: spec.path.clone(),
            timeout: Duration::from_secs(spec.scrape_timeout_seconds.max(1) as u64),
            max_body_bytes: usize::try_from(spec.max_body_bytes.max(1024)).unwrap_or(usize::MAX),
            ..ScrapeConfig::default()
        }
    }
}

/// The result of scraping one target.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeOutcome {
    /// [`Target::name`].
    pub target: String,
    /// The replica's sample, or why there is none.
    pub result: Result<ReplicaSample, ScrapeError>,
    /// Wall time of the scrape, parsing included.
    pub duration: Duration,
    /// Rejected lines and ambiguous series in a body that was parsed (0 otherwise): a
    /// usable sample may still come from a partly broken exposition.
    pub parse_errors: usize,
}

/// Scrapes replicas concurrently with a bound, a per-target timeout and a body limit.
/// Keeps one idle connection per replica between scrapes, and body buffers for the
/// scrapes in flight; clones share both.
#[derive(Debug, Clone)]
pub struct Scraper {
    config: ScrapeConfig,
    connections: Arc<fetch::Connections>,
    buffers: Arc<Buffers>,
}

/// Body buffers kept between scrapes, at most one per scrape in flight: a body is read into
/// memory that already has room for it, instead of a fresh allocation per scrape.
#[derive(Debug, Default)]
struct Buffers(Mutex<Vec<Vec<u8>>>);

impl Buffers {
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default()
    }

    fn give(&self, mut buf: Vec<u8>, keep: usize) {
        buf.clear();
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < keep {
            pool.push(buf);
        }
    }
}

impl Scraper {
    /// A scraper with its own connections. Replicas are scraped directly over plain
    /// HTTP/1.1 (`http://` targets; redirects are not followed, proxies are not used).
    pub fn new(config: ScrapeConfig) -> Self {
        Scraper {
            config,
            connections: Arc::default(),
            buffers: Arc::default(),
        }
    }

    /// Connections kept open between scrapes now, one at most per replica.
    pub fn idle_connections(&self) -> usize {
        self.connections.idle()
    }

    /// The configuration in use.
    pub fn config(&self) -> &ScrapeConfig {
        &self.config
    }

    /// Scrapes every target, at most `concurrency` at a time, and returns one outcome per
    /// target in the order given. Each scrape is a task of its own, so a multi-threaded
    /// runtime reads and parses on all its threads, and a slow target holds only its own
    /// slot: the next scrape starts as soon as any one finishes. Dropping the returned
    /// future cancels the scrapes in flight.
    pub async fn scrape(&self, dialect: Dialect, targets: &[Target]) -> Vec<ScrapeOutcome> {
        let mut outcomes: Vec<Option<ScrapeOutcome>> = vec![None; targets.len()];
        let mut running = tokio::task::JoinSet::new();
        let mut index_of = std::collections::HashMap::new();
        let mut next = 0;
        loop {
            while next < targets.len() && running.len() < self.config.concurrency.max(1) {
                let (scraper, target) = (self.clone(), targets[next].clone());
                let i = next;
                let task =
                    running.spawn(async move { (i, scraper.scrape_one(dialect, &target).await) });
                index_of.insert(task.id(), i);
                next += 1;
            }
            match running.join_next_with_id().await {
                Some(Ok((id, (i, outcome)))) => {
                    index_of.remove(&id);
                    outcomes[i] = Some(outcome);
                }
                // A scrape does not panic; should one be lost anyway, it is a failed one.
                Some(Err(e)) => {
                    if let Some(i) = index_of.remove(&e.id()) {
                        outcomes[i] = Some(ScrapeOutcome {
                            target: targets[i].name.clone(),
                            result: Err(ScrapeError::Body(format!("scrape task failed: {e}"))),
                            duration: Duration::ZERO,
                            parse_errors: 0,
                        });
                    }
                }
                None => break,
            }
        }
        outcomes.into_iter().flatten().collect()
    }

    /// Scrapes one target.
    pub async fn scrape_one(&self, dialect: Dialect, target: &Target) -> ScrapeOutcome {
        let start = Instant::now();
        let mut body = self.buffers.take();
        let fetched = self
            .fetch_body(target, self.config.key.as_ref(), &mut body)
            .await;
        let (result, parse_errors) = match fetched {
            Ok(()) => self.interpret(dialect, &mut body).await,
            Err(e) => (Err(e), 0),
        };
        self.buffers.give(body, self.config.concurrency.max(1));
        ScrapeOutcome {
            target: target.name.clone(),
            result,
            duration: start.elapsed(),
            parse_errors,
        }
    }

    /// GETs `target`'s exposition into `body` within the timeout and the body limit,
    /// with `key` as a bearer token when given.
    async fn fetch_body(
        &self,
        target: &Target,
        key: Option<&ScrapeKey>,
        body: &mut Vec<u8>,
    ) -> Result<(), ScrapeError> {
        let url = join_url(&target.base_url, &self.config.path);
        let endpoint = fetch::Endpoint::parse(&url, key)?;
        tokio::time::timeout(
            self.config.timeout,
            fetch::fetch(
                &self.connections,
                &endpoint,
                body,
                self.config.max_body_bytes,
            ),
        )
        .await
        .unwrap_or(Err(ScrapeError::Timeout(self.config.timeout)))
    }

    /// Parses and adapts a body. A usual exposition (a few hundred KB, a fraction of a
    /// millisecond to read selectively) is read right here; a larger one goes to a blocking
    /// thread, so no runtime thread stalls for milliseconds on a hostile body. The buffer
    /// travels there and back.
    async fn interpret(
        &self,
        dialect: Dialect,
        body: &mut Vec<u8>,
    ) -> (Result<ReplicaSample, ScrapeError>, usize) {
        let limits = self.config.limits;
        if body.len() <= INLINE_PARSE_BYTES {
            return read_body(dialect, body, &limits);
        }
        let buf = std::mem::take(body);
        let work = tokio::task::spawn_blocking(move || {
            let read = read_body(dialect, &buf, &limits);
            (read, buf)
        });
        match work.await {
            Ok((read, buf)) => {
                *body = buf;
                read
            }
            // The parser does not panic; should the task be lost anyway, it is no sample.
            Err(_) => (
                Err(ScrapeError::Parse {
                    samples: 0,
                    errors: 0,
                }),
                0,
            ),
        }
    }
}

/// Bodies up to this size are parsed on the runtime thread that read them.
const INLINE_PARSE_BYTES: usize = 1024 * 1024;

/// One body in `dialect`: only the families the dialect reads are parsed into samples
/// (borrowing from the body), then adapted. Also returns the parse errors.
fn read_body(
    dialect: Dialect,
    body: &[u8],
    limits: &Limits,
) -> (Result<ReplicaSample, ScrapeError>, usize) {
    let exposition = parser::parse_selected(body, limits, &|name| dialect::reads(dialect, name));
    let sample = dialect::adapt(dialect, &exposition);
    let errors = exposition.errors();
    if dialect::is_usable(&sample) {
        (Ok(sample), errors)
    } else {
        let samples = exposition.samples.len();
        (Err(ScrapeError::Parse { samples, errors }), errors)
    }
}

impl Tracker {
    /// [`Tracker::observe`] over a period's scrape outcomes: every outcome counts as a
    /// ready replica that was asked, the failed ones contribute no sample.
    pub fn observe_outcomes(
        &mut self,
        at: Instant,
        outcomes: &[ScrapeOutcome],
        starting: usize,
    ) -> FleetSignals {
        self.observe(
            at,
            outcomes
                .iter()
                .map(|o| (o.target.as_str(), o.result.as_ref().ok())),
            starting,
        )
    }
}

/// `base` + `path` with exactly one slash between them.
fn join_url(base: &str, path: &str) -> String {
    let base = base.trim_end_matches('/');
    let path = path.trim_start_matches('/');
    format!("{base}/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_with_one_slash() {
        assert_eq!(join_url("http://a:1", "/metrics"), "http://a:1/metrics");
        assert_eq!(join_url("http://a:1/", "/metrics"), "http://a:1/metrics");
        assert_eq!(join_url("http://a:1/", "metrics"), "http://a:1/metrics");
    }

    #[test]
    fn reasons_are_stable() {
        let all = [
            ScrapeError::Timeout(Duration::from_secs(1)),
            ScrapeError::Connect(String::new()),
            ScrapeError::HttpStatus(500),
            ScrapeError::TooLarge { limit: 1 },
            ScrapeError::Parse {
                samples: 0,
                errors: 0,
            },
            ScrapeError::Body(String::new()),
        ];
        let reasons: Vec<_> = all.iter().map(ScrapeError::reason).collect();
        assert_eq!(reasons, ScrapeError::REASONS);
    }

    #[test]
    fn config_from_spec() {
        let spec = ballast_crds::MetricsSpec {
            path: "/m".into(),
            scrape_interval_seconds: 5,
            scrape_timeout_seconds: 3,
            max_body_bytes: 2048,
            min_reporting_fraction: 0.5,
        };
        let c = ScrapeConfig::from_spec(&spec);
        assert_eq!(c.path, "/m");
        assert_eq!(c.timeout, Duration::from_secs(3));
        assert_eq!(c.max_body_bytes, 2048);
    }
}
