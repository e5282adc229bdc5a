//! The compute and publish layers of the metrics pipeline.
//!
//! The step loop records ([`crate::events`]); the output router computes, per step, an
//! [`IterationStats`] (TTFT and ITL samples, finished requests, token counts) from each
//! request's [`timeline::RequestTimeline`]; then every [`StatLogger`] gets the same
//! [`StepStats`] view: one feed, many loggers. Three loggers exist: the Prometheus registry
//! ([`PrometheusLogger`]), the periodic human log line ([`LogLineLogger`]) and the control
//! API's [`board::ControlBoard`].

pub mod board;
pub mod flops;
mod log_line;
mod prometheus;
pub mod timeline;
pub mod window;

pub use log_line::LogLineLogger;
pub use prometheus::PrometheusLogger;

use std::time::Instant;

use crate::dp::DpBalance;
use crate::events::{SchedulerSnapshot, StepCounters};
use crate::kv::ResidencySample;
use timeline::FinishedRequestStats;

/// What one step of one rank produced, computed from its outputs by the output router.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IterationStats {
    /// Time to first token of requests whose first token came in this step (seconds).
    pub ttft: Vec<f64>,
    /// Inter-token latencies of this step's later tokens (seconds).
    pub itl: Vec<f64>,
    /// Requests that finished in this step.
    pub finished: Vec<FinishedRequestStats>,
    /// Tokens generated in this step.
    pub generation_tokens: u64,
    /// Prompt tokens of requests whose prefill completed in this step.
    pub prompt_tokens: u64,
    /// Of those, tokens served from the prefix cache.
    pub prompt_cached_tokens: u64,
}

/// The view every logger receives for one step (or idle report) of one rank.
#[derive(Debug, Clone, Copy)]
pub struct StepStats<'a> {
    /// The rank.
    pub rank: usize,
    /// The step's NEW_TOKENS time.
    pub ts: Instant,
    /// End-of-step state (gauges).
    pub snapshot: &'a SchedulerSnapshot,
    /// Step increments (counters).
    pub counters: &'a StepCounters,
    /// Computed per-request samples.
    pub iteration: &'a IterationStats,
    /// Data-parallel balance when a lockstep step ran; `None` for an idle report.
    pub dp: Option<&'a DpBalance>,
    /// Sampled KV residency events (with `--kv-cache-metrics`).
    pub residency: &'a [ResidencySample],
}

/// A consumer of the stats feed.
pub trait StatLogger: Send {
    /// One step (or idle report) of one rank.
    fn record(&mut self, s: &StepStats<'_>);
    /// Called every `--log-stats-interval`.
    fn tick(&mut self, _now: Instant) {}
}
