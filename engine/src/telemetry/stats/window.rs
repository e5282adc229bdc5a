//! The prefix-cache hit rate of the log line: a sliding window over the most recent
//! requests (not time), amortised O(1).

use std::collections::VecDeque;

/// Hit rate over roughly the last `max_requests` requests that looked up the cache.
///
/// Each step's lookups enter as one entry. Guards: a cache reset clears the window; a step
/// with no lookups is not enqueued (it would only push real entries out); the newest entry
/// is never evicted, even when it alone exceeds the window.
#[derive(Debug, Clone)]
pub struct HitRateWindow {
    max_requests: u64,
    entries: VecDeque<(u64, u64, u64)>,
    requests: u64,
    queries: u64,
    hits: u64,
}

impl HitRateWindow {
    /// A window of `max_requests` requests (the log line uses 1000).
    pub fn new(max_requests: u64) -> Self {
        Self {
            max_requests,
            entries: VecDeque::new(),
            requests: 0,
            queries: 0,
            hits: 0,
        }
    }

    /// Adds a step's lookups: requests that looked up, tokens queried, tokens hit.
    pub fn observe(&mut self, requests: u64, queries: u64, hits: u64) {
        if requests == 0 && queries == 0 {
            return;
        }
        self.entries.push_back((requests, queries, hits));
        self.requests += requests;
        self.queries += queries;
        self.hits += hits;
        while self.requests > self.max_requests && self.entries.len() > 1 {
            let (r, q, h) = self.entries.pop_front().expect("len > 1");
            self.requests -= r;
            self.queries -= q;
            self.hits -= h;
        }
    }

    /// Forgets everything (the prefix cache was reset).
    pub fn reset(&mut self) {
        self.entries.clear();
        self.requests = 0;
        self.queries = 0;
        self.hits = 0;
    }

    /// hits / queries over the window; 0 when nothing was queried.
    pub fn hit_rate(&self) -> f64 {
        if self.queries == 0 {
            0.0
        } else {
            self.hits as f64 / self.queries as f64
        }
    }

    /// Requests in the window.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Tokens queried in the window.
    pub fn queries(&self) -> u64 {
        self.queries
    }

    /// Tokens hit in the window.
    pub fn hits(&self) -> u64 {
        self.hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_entries_leave_first() {
        let mut w = HitRateWindow::new(10);
        w.observe(5, 100, 100);
        w.observe(5, 100, 0);
        assert_eq!(w.hit_rate(), 0.5);
        w.observe(5, 100, 0); // 15 requests > 10: the all-hit entry leaves
        assert_eq!(w.requests(), 10);
        assert_eq!(w.hit_rate(), 0.0);
    }

    #[test]
    fn reset_clears() {
        let mut w = HitRateWindow::new(10);
        w.observe(1, 10, 5);
        w.reset();
        assert_eq!((w.requests(), w.hit_rate()), (0, 0.0));
    }

    #[test]
    fn empty_steps_are_not_enqueued() {
        let mut w = HitRateWindow::new(2);
        w.observe(2, 10, 10);
        for _ in 0..100 {
            w.observe(0, 0, 0);
        }
        assert_eq!(
            w.hit_rate(),
            1.0,
            "idle steps must not push real entries out"
        );
    }

    #[test]
    fn newest_entry_is_kept_even_when_too_big() {
        let mut w = HitRateWindow::new(10);
        w.observe(3, 30, 0);
        w.observe(50, 500, 250);
        assert_eq!(
            w.requests(),
            50,
            "the old entry left, the oversized newest stayed"
        );
        assert_eq!(w.hit_rate(), 0.5);
    }
}
