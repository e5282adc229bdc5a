//! What the loggers receive: one step's [`IterationStats`], the [`StepStats`] view every
//! [`StatLogger`] gets, and the trait itself.

use std::time::{Instant, SystemTime};

use super::timeline::{FinishedRequestStats, RequestTimeline, TokenSample};
use crate::runtime::kv::ResidencySample;
use crate::step::DpBalance;
use crate::step::events::{FinishReason, RequestStepOutput, SchedulerSnapshot, StepCounters};

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

impl IterationStats {
    /// Applies one request's output of the step to its timeline and adds what it
    /// contributes to the step: its events, and for a new token (NEW_TOKENS time
    /// `step_ts`, seen by the frontend at `wall_now`) a TTFT or ITL sample and the token
    /// counts. Finishes are recorded by [`Self::record_finish`], once the output side has
    /// decided the finish reason (a stop string can end a request the engine did not).
    pub fn record_output(
        &mut self,
        tl: &mut RequestTimeline,
        out: &RequestStepOutput,
        step_ts: Instant,
        wall_now: SystemTime,
    ) {
        tl.on_events(&out.events);
        if let Some(c) = out.num_cached_tokens {
            tl.num_cached_tokens = c;
        }
        if out.new_token.is_some() {
            self.generation_tokens += 1;
            match tl.on_token(step_ts, wall_now) {
                TokenSample::First { ttft } => {
                    self.ttft.push(ttft.as_secs_f64());
                    self.prompt_tokens += tl.prompt_len as u64;
                    self.prompt_cached_tokens += tl.num_cached_tokens as u64;
                }
                TokenSample::Next { itl } => self.itl.push(itl.as_secs_f64()),
            }
        }
    }

    /// Records that the request of `tl` finished for `reason` at frontend time `wall_now`,
    /// and returns its figures.
    pub fn record_finish(
        &mut self,
        tl: &RequestTimeline,
        reason: FinishReason,
        wall_now: SystemTime,
    ) -> &FinishedRequestStats {
        self.finished.push(tl.finish(reason, wall_now));
        self.finished.last().expect("just pushed")
    }
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
