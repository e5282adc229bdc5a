//! The compute layer's view of one request: timestamps from the engine's events and the
//! frontend's clock, turned into intervals exactly as the metrics contract defines them.
//!
//! Two clock domains, never mixed: the frontend wall clock (`SystemTime`) for arrival,
//! TTFT and end-to-end latency; the engine monotonic clock (`Instant`) for queue, prefill,
//! decode, inference, inter-token latency and TPOT.

use std::time::{Duration, Instant, SystemTime};

use crate::step::events::{EventKind, EventList, FinishReason};

/// Everything known about a request while it runs.
#[derive(Debug, Clone)]
pub struct RequestTimeline {
    /// Frontend wall clock when the HTTP request was received (before tokenization).
    pub arrival: SystemTime,
    /// Monotonic reading taken together with `arrival`: converts engine timestamps to wall
    /// clock for trace spans.
    pub arrival_instant: Instant,
    /// Prompt tokens.
    pub prompt_len: u32,
    /// `max_tokens` of the request.
    pub max_tokens: u32,
    /// First QUEUED.
    pub queued_ts: Option<Instant>,
    /// First SCHEDULED only; later ones (after preemption) are ignored.
    pub scheduled_ts: Option<Instant>,
    /// NEW_TOKENS time of the step that produced the first token.
    pub first_token_ts: Option<Instant>,
    /// NEW_TOKENS time of the latest token.
    pub last_token_ts: Option<Instant>,
    /// Set while waiting (after QUEUED or PREEMPTED), cleared by SCHEDULED.
    waiting_since: Option<Instant>,
    /// Time spent waiting over every (re-)queue.
    pub total_queue: Duration,
    /// PREEMPTED events seen.
    pub num_preemptions: u32,
    /// Tokens generated so far.
    pub num_generated: u32,
    /// Prompt tokens served from the prefix cache at first scheduling.
    pub num_cached_tokens: u32,
    /// Frontend wall-clock time of the first token.
    pub first_token_wall: Option<SystemTime>,
}

/// What a new token contributes to the step's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSample {
    /// The first token: time to first token (frontend clock). No ITL sample in this step.
    First {
        /// Arrival to first token.
        ttft: Duration,
    },
    /// A later token: inter-token latency (engine clock).
    Next {
        /// This token's step time minus the previous token's.
        itl: Duration,
    },
}

/// Per-request figures recorded once, when the request finishes.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRequestStats {
    /// Why it finished.
    pub finish_reason: FinishReason,
    /// Arrival to finish (frontend clock).
    pub e2e: Duration,
    /// First QUEUED to first SCHEDULED (vLLM semantics).
    pub queue: Duration,
    /// Total time waiting across every re-queue (SGLang's queue_duration).
    pub total_queue: Duration,
    /// First SCHEDULED to first token.
    pub prefill: Duration,
    /// First token to last token.
    pub decode: Duration,
    /// First SCHEDULED to last token; equal to prefill + decode by construction.
    pub inference: Duration,
    /// decode / (generated − 1); `None` with one token or fewer.
    pub tpot: Option<Duration>,
    /// Prompt tokens processed: the whole prompt (cache hits included) once its prefill
    /// completed, 0 for a request that ended before, exactly what `prompt_tokens_total`
    /// counted for it.
    pub prompt_tokens: u32,
    /// Generated tokens delivered (what `generation_tokens_total` counted for it).
    pub generation_tokens: u32,
    /// It was scheduled at least once (its queue time is real).
    pub scheduled: bool,
    /// Its prefill completed: it produced a first token.
    pub prefilled: bool,
    /// Prompt tokens from the prefix cache.
    pub cached_tokens: u32,
    /// Times preempted.
    pub num_preemptions: u32,
}

/// `b − a`, or zero when `a` is later or missing: a stage that did not happen adds 0.
fn span(a: Option<Instant>, b: Option<Instant>) -> Duration {
    match (a, b) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => Duration::ZERO,
    }
}

impl RequestTimeline {
    /// A request received at `arrival` (wall) / `arrival_instant` (monotonic).
    pub fn new(
        arrival: SystemTime,
        arrival_instant: Instant,
        prompt_len: u32,
        max_tokens: u32,
    ) -> Self {
        Self {
            arrival,
            arrival_instant,
            prompt_len,
            max_tokens,
            queued_ts: None,
            scheduled_ts: None,
            first_token_ts: None,
            last_token_ts: None,
            waiting_since: None,
            total_queue: Duration::ZERO,
            num_preemptions: 0,
            num_generated: 0,
            num_cached_tokens: 0,
            first_token_wall: None,
        }
    }

    /// Applies a step's engine events.
    pub fn on_events(&mut self, events: &EventList) {
        for e in events.iter() {
            match e.kind {
                EventKind::Queued => {
                    self.queued_ts.get_or_insert(e.ts);
                    self.waiting_since = Some(e.ts);
                }
                EventKind::Scheduled => {
                    self.scheduled_ts.get_or_insert(e.ts);
                    if let Some(since) = self.waiting_since.take() {
                        self.total_queue += e.ts.saturating_duration_since(since);
                    }
                }
                EventKind::Preempted => {
                    self.num_preemptions += 1;
                    self.waiting_since = Some(e.ts);
                }
            }
        }
    }

    /// A token produced by the step whose NEW_TOKENS time is `step_ts`, seen by the
    /// frontend at `wall_now`.
    pub fn on_token(&mut self, step_ts: Instant, wall_now: SystemTime) -> TokenSample {
        self.num_generated += 1;
        let sample = match self.last_token_ts {
            None => {
                self.first_token_ts = Some(step_ts);
                self.first_token_wall = Some(wall_now);
                TokenSample::First {
                    ttft: wall_now
                        .duration_since(self.arrival)
                        .unwrap_or(Duration::ZERO),
                }
            }
            Some(prev) => TokenSample::Next {
                itl: step_ts.saturating_duration_since(prev),
            },
        };
        self.last_token_ts = Some(step_ts);
        sample
    }

    /// The finished-request figures at frontend time `wall_now`.
    pub fn finish(
        &self,
        finish_reason: FinishReason,
        wall_now: SystemTime,
    ) -> FinishedRequestStats {
        let prefill = span(self.scheduled_ts, self.first_token_ts);
        let decode = span(self.first_token_ts, self.last_token_ts);
        let tpot = (self.num_generated > 1).then(|| decode / (self.num_generated - 1));
        FinishedRequestStats {
            finish_reason,
            e2e: wall_now
                .duration_since(self.arrival)
                .unwrap_or(Duration::ZERO),
            queue: span(self.queued_ts, self.scheduled_ts),
            total_queue: self.total_queue,
            prefill,
            decode,
            inference: prefill + decode,
            tpot,
            prompt_tokens: if self.first_token_ts.is_some() {
                self.prompt_len
            } else {
                0
            },
            generation_tokens: self.num_generated,
            scheduled: self.scheduled_ts.is_some(),
            prefilled: self.first_token_ts.is_some(),
            cached_tokens: self.num_cached_tokens,
            num_preemptions: self.num_preemptions,
        }
    }

    /// Converts an engine timestamp to wall clock with the offset calibrated at arrival.
    pub fn wall(&self, ts: Instant) -> SystemTime {
        match ts.checked_duration_since(self.arrival_instant) {
            Some(d) => self.arrival + d,
            None => self.arrival - self.arrival_instant.duration_since(ts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn events(list: &[(EventKind, Instant)]) -> EventList {
        let mut e = EventList::default();
        for &(k, t) in list {
            e.push(k, t);
        }
        e
    }

    struct Clock {
        t0: Instant,
        w0: SystemTime,
    }

    impl Clock {
        fn new() -> Self {
            Self {
                t0: Instant::now(),
                w0: SystemTime::now(),
            }
        }
        fn at(&self, n: u64) -> Instant {
            self.t0 + ms(n)
        }
        fn wall(&self, n: u64) -> SystemTime {
            self.w0 + ms(n)
        }
        fn timeline(&self) -> RequestTimeline {
            RequestTimeline::new(self.w0, self.t0, 10, 100)
        }
    }

    #[test]
    fn plain_request_intervals() {
        let c = Clock::new();
        let mut t = c.timeline();
        t.on_events(&events(&[
            (EventKind::Queued, c.at(1)),
            (EventKind::Scheduled, c.at(4)),
        ]));
        assert_eq!(
            t.on_token(c.at(10), c.wall(12)),
            TokenSample::First { ttft: ms(12) }
        );
        assert_eq!(
            t.on_token(c.at(15), c.wall(16)),
            TokenSample::Next { itl: ms(5) }
        );
        assert_eq!(
            t.on_token(c.at(25), c.wall(26)),
            TokenSample::Next { itl: ms(10) }
        );
        let f = t.finish(FinishReason::Length, c.wall(30));
        assert_eq!(
            (f.queue, f.total_queue, f.prefill, f.decode),
            (ms(3), ms(3), ms(6), ms(15))
        );
        assert_eq!(f.inference, f.prefill + f.decode);
        assert_eq!(f.inference, ms(21));
        assert_eq!(f.tpot, Some(ms(15) / 2));
        assert_eq!(f.e2e, ms(30));
    }

    #[test]
    fn preemption_in_prefill_lengthens_ttft_and_prefill_not_itl() {
        let c = Clock::new();
        let mut t = c.timeline();
        t.on_events(&events(&[
            (EventKind::Queued, c.at(0)),
            (EventKind::Scheduled, c.at(2)),
        ]));
        t.on_events(&events(&[(EventKind::Preempted, c.at(5))]));
        // A later SCHEDULED is ignored for scheduled_ts but ends the second wait.
        t.on_events(&events(&[(EventKind::Scheduled, c.at(50))]));
        assert_eq!(
            t.on_token(c.at(60), c.wall(61)),
            TokenSample::First { ttft: ms(61) }
        );
        assert_eq!(
            t.on_token(c.at(65), c.wall(66)),
            TokenSample::Next { itl: ms(5) }
        );
        let f = t.finish(FinishReason::Stop, c.wall(70));
        assert_eq!(f.queue, ms(2), "first queue to first schedule only");
        assert_eq!(f.total_queue, ms(2 + 45), "both waits");
        assert_eq!(f.prefill, ms(58), "the pause lands in prefill");
        assert_eq!(f.decode, ms(5));
        assert_eq!(f.num_preemptions, 1);
    }

    #[test]
    fn preemption_in_decode_lengthens_itl_and_decode_not_ttft() {
        let c = Clock::new();
        let mut t = c.timeline();
        t.on_events(&events(&[
            (EventKind::Queued, c.at(0)),
            (EventKind::Scheduled, c.at(1)),
        ]));
        assert_eq!(
            t.on_token(c.at(5), c.wall(6)),
            TokenSample::First { ttft: ms(6) }
        );
        t.on_events(&events(&[(EventKind::Preempted, c.at(7))]));
        t.on_events(&events(&[(EventKind::Scheduled, c.at(40))]));
        assert_eq!(
            t.on_token(c.at(45), c.wall(46)),
            TokenSample::Next { itl: ms(40) }
        );
        let f = t.finish(FinishReason::Length, c.wall(50));
        assert_eq!((f.prefill, f.decode, f.inference), (ms(4), ms(40), ms(44)));
        assert_eq!(f.tpot, Some(ms(40)));
    }

    #[test]
    fn no_tpot_for_one_token_and_missing_stages_are_zero() {
        let c = Clock::new();
        let mut t = c.timeline();
        t.on_events(&events(&[
            (EventKind::Queued, c.at(0)),
            (EventKind::Scheduled, c.at(1)),
        ]));
        t.on_token(c.at(3), c.wall(3));
        assert_eq!(t.finish(FinishReason::Length, c.wall(4)).tpot, None);
        // Aborted while queued: every engine stage is zero, never negative.
        let mut q = c.timeline();
        q.on_events(&events(&[(EventKind::Queued, c.at(0))]));
        let f = q.finish(FinishReason::Abort, c.wall(9));
        assert_eq!(
            (f.queue, f.prefill, f.decode, f.inference, f.tpot),
            (
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
                None
            )
        );
        assert_eq!(q.first_token_wall, None, "no token, so no TTFT");
    }

    #[test]
    fn wall_conversion_uses_the_arrival_offset() {
        let c = Clock::new();
        let t = c.timeline();
        assert_eq!(t.wall(c.at(7)), c.wall(7));
    }
}
