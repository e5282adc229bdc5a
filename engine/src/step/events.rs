//! What the step loop records: per-request events with monotonic timestamps, the tokens and
//! finishes of the step, an end-of-step snapshot, and the step's increments.
//!
//! This is the *record* layer of the metrics contract: plain data, no arithmetic on
//! intervals, no formatting, no locks on exporter objects. The output side turns it into
//! responses, intervals and metric updates.

use std::time::Instant;

use super::kv::{PoolCounts, PrefixCacheStats};

/// Engine-wide request id.
pub type RequestId = u64;

/// Things that happen to a request inside the engine core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Entered a rank's waiting queue.
    Queued,
    /// Picked into a batch (again, after a preemption: consumers keep only the first).
    Scheduled,
    /// Lost its KV blocks and went back to waiting; it will be recomputed.
    Preempted,
}

/// An event and when it happened (engine monotonic clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineEvent {
    /// What happened.
    pub kind: EventKind,
    /// When.
    pub ts: Instant,
}

/// A request's events within one step, stored inline: at most QUEUED + SCHEDULED, or
/// PREEMPTED, happen to a request in one step, so no step allocates per request for events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventList {
    items: [Option<EngineEvent>; 3],
}

impl EventList {
    /// Appends an event (an impossible fourth event in one step replaces the last).
    pub fn push(&mut self, kind: EventKind, ts: Instant) {
        let slot = self
            .items
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.items.len() - 1);
        self.items[slot] = Some(EngineEvent { kind, ts });
    }

    /// The events in the order they happened.
    pub fn iter(&self) -> impl Iterator<Item = EngineEvent> + '_ {
        self.items.iter().map_while(|e| *e)
    }

    /// The timestamp of the first event of `kind`, if any.
    pub fn first(&self, kind: EventKind) -> Option<Instant> {
        self.iter().find(|e| e.kind == kind).map(|e| e.ts)
    }
}

/// Why a request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length reached.
    Length,
    /// Client went away, the server drained, or the frontend ended it.
    Abort,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string (and metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What one request did in one step. Only requests with an event, a token or a finish
/// appear in a step's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestStepOutput {
    /// The request.
    pub id: RequestId,
    /// Token generated in this step (one per step: no speculative decoding yet).
    pub new_token: Option<u32>,
    /// Set on the request's last output.
    pub finish: Option<FinishReason>,
    /// Events of this step.
    pub events: EventList,
    /// Prompt tokens served from the prefix cache when the request was first scheduled;
    /// set in the step of its first SCHEDULED event.
    pub num_cached_tokens: Option<u32>,
}

impl RequestStepOutput {
    /// An empty output for `id`.
    pub fn new(id: RequestId) -> Self {
        Self {
            id,
            new_token: None,
            finish: None,
            events: EventList::default(),
            num_cached_tokens: None,
        }
    }
}

/// State of a rank at the end of a step: exported as gauges (set, never summed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SchedulerSnapshot {
    /// Requests in the running batch.
    pub running: u32,
    /// Waiting for batch slots or KV blocks.
    pub waiting_capacity: u32,
    /// Waiting although capacity may exist: their tenant is at its running cap.
    pub waiting_deferred: u32,
    /// Block counts by state.
    pub kv_blocks: PoolCounts,
    /// Tokens per block.
    pub block_size: u32,
    /// Used blocks / total blocks (evictable cached blocks count as free).
    pub kv_usage: f64,
}

impl SchedulerSnapshot {
    /// capacity + deferred.
    pub fn waiting(&self) -> u32 {
        self.waiting_capacity + self.waiting_deferred
    }
}

/// What happened during one step: exported as counter increments and histogram samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounters {
    /// Tokens computed in the step (prefill chunks plus decode tokens).
    pub scheduled_tokens: u32,
    /// Of which prompt tokens computed (not served from the cache).
    pub prefill_tokens: u32,
    /// Requests preempted in this step.
    pub preemptions: u32,
    /// Computed prompt tokens thrown away by those preemptions.
    pub retracted_input_tokens: u32,
    /// Computed output tokens thrown away by those preemptions.
    pub retracted_output_tokens: u32,
    /// Prefix-cache lookups of the step (take-and-reset from the KV manager).
    pub prefix_cache: PrefixCacheStats,
    /// Rows sampled (sequences that produced a token).
    pub sampled: u32,
    /// Causal (query, key) attention pairs computed.
    pub attention_pairs: u64,
    /// Tokens of K/V context the step's sequences attend over (Σ context + new tokens).
    pub context_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_list_keeps_order_and_first() {
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_millis(1);
        let mut e = EventList::default();
        e.push(EventKind::Queued, t0);
        e.push(EventKind::Scheduled, t1);
        let kinds: Vec<_> = e.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::Queued, EventKind::Scheduled]);
        assert_eq!(e.first(EventKind::Scheduled), Some(t1));
        assert_eq!(e.first(EventKind::Preempted), None);
    }
}

/// Why a request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RejectReason {
    /// Too many requests already queued.
    #[error("too many queued requests")]
    MaxNumQueuedReqs,
    /// Too many prompt tokens already queued.
    #[error("too many queued prompt tokens")]
    MaxNumQueuedTokens,
}

impl RejectReason {
    /// Every reason, for pre-registering metric label values.
    pub const ALL: [RejectReason; 2] = [
        RejectReason::MaxNumQueuedReqs,
        RejectReason::MaxNumQueuedTokens,
    ];

    /// Stable label used in metrics and JSON error codes.
    pub fn label(self) -> &'static str {
        match self {
            RejectReason::MaxNumQueuedReqs => "max_num_queued_reqs",
            RejectReason::MaxNumQueuedTokens => "max_num_queued_tokens",
        }
    }
}
