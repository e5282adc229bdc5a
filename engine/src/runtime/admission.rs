//! Front-door admission: requests beyond the queue limits are turned away with HTTP 429
//! before any scheduler sees them.
//!
//! "Queued" means admitted and not yet scheduled for the first time (waiting for capacity
//! or deferred). The frontend admits; the rank that first schedules a request (or aborts it
//! before that) releases it. One mutex guards both counters so a burst is counted exactly.

pub use crate::config::runtime::AdmissionLimits;

pub use crate::step::RejectReason;

use std::sync::Mutex;

/// Requests and prompt tokens admitted but not yet scheduled, across all ranks.
#[derive(Debug, Default)]
pub struct AdmissionLedger {
    limits: AdmissionLimits,
    queued: Mutex<Queued>,
}

/// Current queue totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// Requests.
    pub requests: usize,
    /// Their prompt tokens.
    pub tokens: usize,
}

impl AdmissionLedger {
    /// A ledger enforcing `limits`.
    pub fn new(limits: AdmissionLimits) -> Self {
        Self {
            limits,
            queued: Mutex::new(Queued::default()),
        }
    }

    /// The limits.
    pub fn limits(&self) -> AdmissionLimits {
        self.limits
    }

    /// Why `requests` requests carrying `tokens` prompt tokens could never be admitted, even
    /// into an empty queue (answered with 400, since retrying cannot help).
    pub fn never_admissible(&self, requests: usize, tokens: usize) -> Option<String> {
        if let Some(max) = self.limits.max_queued_requests
            && requests > max
        {
            return Some(format!(
                "the request fans out to {requests} sequences but --max-queued-requests is {max}"
            ));
        }
        if let Some(max) = self.limits.max_queued_tokens
            && tokens > max
        {
            return Some(format!(
                "the request has {tokens} prompt tokens but --max-queued-tokens is {max}"
            ));
        }
        None
    }

    /// Admits `requests` requests carrying `tokens` prompt tokens in total, all or none.
    pub fn try_admit(&self, requests: usize, tokens: usize) -> Result<(), RejectReason> {
        let mut q = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        if self
            .limits
            .max_queued_requests
            .is_some_and(|max| q.requests + requests > max)
        {
            return Err(RejectReason::MaxNumQueuedReqs);
        }
        if self
            .limits
            .max_queued_tokens
            .is_some_and(|max| q.tokens + tokens > max)
        {
            return Err(RejectReason::MaxNumQueuedTokens);
        }
        q.requests += requests;
        q.tokens += tokens;
        Ok(())
    }

    /// A request left the queue (first scheduled, or aborted before that).
    pub fn release(&self, tokens: usize) {
        let mut q = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        q.requests = q.requests.saturating_sub(1);
        q.tokens = q.tokens.saturating_sub(tokens);
    }

    /// Current totals.
    pub fn queued(&self) -> Queued {
        *self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_rejections_match_limits_exactly() {
        let l = AdmissionLedger::new(AdmissionLimits {
            max_queued_requests: Some(5),
            max_queued_tokens: Some(1000),
        });
        let results: Vec<_> = (0..8).map(|_| l.try_admit(1, 10)).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 5);
        assert!(
            results[5..]
                .iter()
                .all(|r| *r == Err(RejectReason::MaxNumQueuedReqs))
        );
        l.release(10);
        assert_eq!(l.try_admit(1, 995), Err(RejectReason::MaxNumQueuedTokens));
        assert_eq!(l.try_admit(1, 960), Ok(()));
        assert_eq!(
            l.queued(),
            Queued {
                requests: 5,
                tokens: 1000
            }
        );
    }

    #[test]
    fn requests_over_a_limit_on_their_own_are_never_admissible() {
        let l = AdmissionLedger::new(AdmissionLimits {
            max_queued_requests: Some(2),
            max_queued_tokens: Some(100),
        });
        assert!(
            l.never_admissible(3, 1)
                .unwrap()
                .contains("--max-queued-requests")
        );
        assert!(
            l.never_admissible(1, 101)
                .unwrap()
                .contains("--max-queued-tokens")
        );
        assert_eq!(l.never_admissible(2, 100), None);
    }

    #[test]
    fn fan_out_is_all_or_nothing() {
        let l = AdmissionLedger::new(AdmissionLimits {
            max_queued_requests: Some(3),
            max_queued_tokens: None,
        });
        assert!(l.try_admit(2, 1).is_ok());
        assert!(l.try_admit(2, 1).is_err());
        assert_eq!(l.queued().requests, 2);
    }
}
