//! The gateway's own reading of its endpoints: every `--scrape-interval-ms`, each endpoint's
//! `/metrics`, over one kept-alive connection per endpoint, read as the operator reads it
//! (its parser and dialect adapters: ballast, vLLM, SGLang), parsing only the families the
//! dialect reads.
//!
//! One task per endpoint, started and stopped as the pool's endpoint set changes. A scrape
//! that fails leaves the last load in place; its age makes it stale after a few intervals
//! ([`Scoring::stale_after`](crate::score::Scoring)), and the endpoint is then scored on
//! the gateway's in-flight count alone. Scrapes that cannot reach the endpoint at all
//! (refused, or dropped before a response) [`UNREACHABLE_AFTER`](crate::pool::UNREACHABLE_AFTER)
//! times in a row make it unreachable: no requests while another endpoint is reachable.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_operator::scrape::{ScrapeConfig, ScrapeError, ScrapeKey, Scraper, Target};
use ballast_operator::signals::Dialect;

use crate::metrics::GatewayMetrics;
use crate::pool::{EndpointState, Pool};

/// How endpoints are read.
#[derive(Debug, Clone)]
pub struct ScrapeSettings {
    /// Which series names the engines export.
    pub dialect: Dialect,
    /// Time between the starts of two scrapes of one endpoint.
    pub interval: Duration,
    /// The exposition's path (and query).
    pub path: String,
    /// Longest one scrape may take.
    pub timeout: Duration,
    /// `--scrape-key-file`: the first key in it goes on every scrape.
    pub key_file: Option<std::path::PathBuf>,
}

/// How often `--scrape-key-file` is read again (a Secret the kubelet refreshed).
const KEY_REREAD: Duration = Duration::from_secs(10);

/// The first key of the key file at `path`, or why there is none.
pub fn read_key(path: &std::path::Path) -> Result<ScrapeKey, String> {
    let text =
        std::fs::read(path).map_err(|e| format!("--scrape-key-file {}: {e}", path.display()))?;
    ScrapeKey::first_of(&text).ok_or_else(|| {
        format!(
            "--scrape-key-file {}: no key in it (one a line, visible ASCII, at most 4096 bytes)",
            path.display()
        )
    })
}

/// Scrapes every endpoint of `pool` until dropped, following the endpoint set.
pub async fn run(pool: Arc<Pool>, settings: ScrapeSettings, metrics: Arc<GatewayMetrics>) {
    let key = |previous: Option<ScrapeKey>| match &settings.key_file {
        None => None,
        // A file that cannot be read now (a Secret being replaced) keeps the last key.
        Some(path) => read_key(path)
            .inspect_err(|e| tracing::warn!(error = %e, "keeping the last scrape key"))
            .ok()
            .or(previous),
    };
    let scraper_with = |key: Option<ScrapeKey>| {
        Scraper::new(ScrapeConfig {
            path: settings.path.clone(),
            timeout: settings.timeout,
            // Body buffers are kept for this many scrapes in flight at once.
            concurrency: 64,
            key,
            ..ScrapeConfig::default()
        })
    };
    let mut current_key = key(None);
    let mut scraper = scraper_with(current_key.clone());
    let mut reread = tokio::time::interval(KEY_REREAD);
    reread.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    reread.tick().await;
    let mut members = pool.members();
    let mut tasks: HashMap<SocketAddr, (Arc<EndpointState>, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    loop {
        let current = pool.endpoints();
        tasks.retain(|addr, (state, task)| {
            let keep = current
                .iter()
                .any(|s| s.endpoint.addr == *addr && Arc::ptr_eq(s, state));
            if !keep {
                task.abort();
            }
            keep
        });
        for state in current {
            let addr = state.endpoint.addr;
            if tasks.contains_key(&addr) {
                continue;
            }
            let task = tokio::spawn(follow(
                Arc::clone(&state),
                scraper.clone(),
                settings.clone(),
                Arc::clone(&pool),
                Arc::clone(&metrics),
            ));
            tasks.insert(addr, (state, task));
        }
        tokio::select! {
            changed = members.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            _ = reread.tick(), if settings.key_file.is_some() => {
                let next = key(current_key.clone());
                if next != current_key {
                    // A new key: every endpoint's task starts again with it.
                    tracing::info!("the scrape key file changed: scraping with its first key");
                    current_key = next;
                    scraper = scraper_with(current_key.clone());
                    for (_, (_, task)) in tasks.drain() {
                        task.abort();
                    }
                }
            }
        }
    }
    for (_, (_, task)) in tasks {
        task.abort();
    }
}

/// Scrapes one endpoint every interval, forever.
async fn follow(
    state: Arc<EndpointState>,
    scraper: Scraper,
    settings: ScrapeSettings,
    pool: Arc<Pool>,
    metrics: Arc<GatewayMetrics>,
) {
    let target = Target::new(
        state.endpoint.name.clone(),
        format!("http://{}", state.endpoint.addr),
    );
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        state.scrape_began();
        let outcome = scraper.scrape_one(settings.dialect, &target).await;
        match &outcome.result {
            Ok(sample) => {
                state.observe(Instant::now(), sample);
                metrics.scrapes.with_label_values(&["ok"]).inc();
                pool.loads_changed();
            }
            Err(e) => {
                if matches!(e, ScrapeError::Connect(_)) {
                    state.unreached();
                }
                metrics.scrapes.with_label_values(&[e.reason()]).inc();
                tracing::debug!(endpoint = %state.endpoint.name, error = %e, "scrape failed");
            }
        }
    }
}
