//! How an endpoint is scored and when it counts as saturated: pure functions of what the
//! gateway last read from it, what the gateway itself has sent there, and the flags.
//!
//! Lower is better. For an endpoint with fresh data (a scrape newer than
//! `stale_after`):
//!
//! ```text
//! score = w_waiting · capacity-waiting + w_running · running
//!       + w_in_flight · picks since that scrape + w_kv · KV usage + w_rejections · 429/s
//!       − w_prefix · prefix match
//! ```
//!
//! The prefix match (0..1) is the fraction of the request's prompt blocks, from the first,
//! that the gateway sent to the endpoint before ([`crate::prefix`]): with the default
//! weights a whole match is worth six requests running, so requests that share a prefix
//! stay where it is cached until that endpoint is busier than the others by about that
//! much (an engine batches a few more requests at little cost; recomputing a long prompt
//! costs a whole prefill). A prefix popular enough to keep its endpoint that busy spills
//! over, and then has two endpoints to choose between.
//!
//! Deferred-waiting requests (held back by a per-tenant cap while the engine has room) are
//! **not** load: they say nothing about how soon a new request from another tenant runs.
//! The picks since the scrape are the requests the gateway sent that the engine's numbers
//! cannot show yet, so a burst between two scrapes spreads instead of piling onto the
//! endpoint that looked best at the last one.
//!
//! An endpoint with several data-parallel ranks is scored by its best rank, each rank by
//! the same formula over its own gauges and the picks the gateway sent it since the scrape
//! (the 429 term stays the endpoint's): a pod whose rank 0 is full but whose rank 1 is
//! idle can take a request now, and the request goes to rank 1. It is saturated only when
//! every rank is.
//!
//! An endpoint whose data is stale (or that was never read) is scored on the gateway's own
//! in-flight count and the prefix match, `w_in_flight · in flight − w_prefix · prefix
//! match`: it is neither saturated nor dropped,
//! because a slow `/metrics` is not a slow engine.

use std::time::Duration;

/// What one scrape of an endpoint said, combined over its DP ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Load {
    /// Requests waiting for capacity.
    pub capacity_waiting: f64,
    /// Requests deferred by tenant caps (reported, never scored).
    pub deferred_waiting: f64,
    /// Requests running.
    pub running: f64,
    /// KV cache usage in [0, 1] (max over ranks).
    pub kv_usage: f64,
}

/// The weights of the score; every flag has the default given here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// Per request waiting for capacity (`--weight-waiting`, 2).
    pub waiting: f64,
    /// Per request running (`--weight-running`, 1).
    pub running: f64,
    /// Per request the gateway sent that the last scrape cannot show, or, for a stale
    /// endpoint, per request in flight (`--weight-in-flight`, 1).
    pub in_flight: f64,
    /// Times KV usage, 0..1 (`--weight-kv`, 4: a full cache weighs as four running).
    pub kv: f64,
    /// Per 429 per second (`--weight-rejections`, 10).
    pub rejections: f64,
    /// Times the prefix match, 0..1, subtracted (`--weight-prefix`, 6: a request whose
    /// whole prompt was sent to an endpoint goes there over one with up to six fewer
    /// requests running).
    pub prefix: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            waiting: 2.0,
            running: 1.0,
            in_flight: 1.0,
            kv: 4.0,
            rejections: 10.0,
            prefix: 6.0,
        }
    }
}

/// When an endpoint is saturated: over either threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Capacity-waiting requests at or over which it is saturated (`--queue-threshold`, 5).
    pub queue: f64,
    /// KV usage at or over which it is saturated (`--kv-threshold`, 0.8).
    pub kv: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            queue: 5.0,
            kv: 0.8,
        }
    }
}

/// Everything the score depends on besides the endpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    /// The weights.
    pub weights: Weights,
    /// The saturation thresholds.
    pub thresholds: Thresholds,
    /// Data older than this is stale.
    pub stale_after: Duration,
    /// Whether ranks are scored and picked (`--pick-dp-rank`); when not, an endpoint is
    /// scored on its sums over ranks and the engine places the request itself.
    pub pick_ranks: bool,
}

impl Default for Scoring {
    fn default() -> Self {
        Scoring {
            weights: Weights::default(),
            thresholds: Thresholds::default(),
            stale_after: Duration::from_millis(300),
            pick_ranks: true,
        }
    }
}

/// One data-parallel rank as a pick sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankSnapshot {
    /// The rank's gauges at the last scrape.
    pub load: Load,
    /// Requests the gateway sent to this rank since the last scrape began, less those of
    /// its requests there that finished since (never below 0).
    pub since_scrape: i64,
    /// The request's prefix match on this rank, 0..1.
    pub prefix: f64,
}

/// What the gateway knows of one endpoint at the moment of a pick.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The last scrape's load and its age; `None` when never read.
    pub load: Option<(Load, Duration)>,
    /// Each rank's load at that scrape, when the engine labels its gauges by rank; empty
    /// otherwise.
    pub ranks: Vec<RankSnapshot>,
    /// Requests the gateway has in flight there.
    pub in_flight: u64,
    /// Requests the gateway sent there since the last scrape began, less those of its
    /// requests there that finished since (never below 0): what the scrape's numbers
    /// cannot show yet.
    pub since_scrape: i64,
    /// Recent 429s per second: from the engine's counter, or seen by the gateway in
    /// responses, whichever is higher.
    pub rejections_per_second: f64,
    /// The request's prefix match on the endpoint as a whole (when its ranks are not
    /// scored), 0..1.
    pub prefix: f64,
}

impl Scoring {
    /// The load of `s` if it is fresh.
    pub fn fresh(&self, s: &Snapshot) -> Option<Load> {
        s.load
            .filter(|(_, age)| *age <= self.stale_after)
            .map(|(l, _)| l)
    }

    /// Whether the ranks of `s` are scored and picked: fresh data, at least two ranks,
    /// ranks picked. Its prefix match is then per rank ([`RankSnapshot::prefix`]).
    pub fn ranked(&self, s: &Snapshot) -> bool {
        self.ranks(s).is_some()
    }

    /// The ranks of `s` that are scored: fresh data, at least two ranks, ranks picked.
    fn ranks<'s>(&self, s: &'s Snapshot) -> Option<&'s [RankSnapshot]> {
        (self.pick_ranks && s.ranks.len() >= 2 && self.fresh(s).is_some())
            .then_some(s.ranks.as_slice())
    }

    /// The score of one load with `since_scrape` requests sent that it cannot show and a
    /// prefix match of `prefix`.
    fn load_score(&self, l: &Load, since_scrape: i64, prefix: f64) -> f64 {
        let w = &self.weights;
        w.waiting * l.capacity_waiting
            + w.running * l.running
            + w.in_flight * since_scrape as f64
            + w.kv * l.kv_usage
            - w.prefix * prefix
    }

    fn load_saturated(&self, l: &Load) -> bool {
        l.capacity_waiting >= self.thresholds.queue || l.kv_usage >= self.thresholds.kv
    }

    /// The rank of `s` a request should go to, and its score: the lowest, ties to the
    /// lower rank. `None` when ranks are not scored for `s` (see [`RankSnapshot`]).
    pub fn rank(&self, s: &Snapshot) -> Option<(usize, f64)> {
        self.ranks(s)?
            .iter()
            .map(|r| self.load_score(&r.load, r.since_scrape, r.prefix))
            .enumerate()
            .fold(None, |best, (i, score)| match best {
                Some((_, b)) if b <= score => best,
                _ => Some((i, score)),
            })
    }

    /// The score of `s`; lower is better.
    pub fn score(&self, s: &Snapshot) -> f64 {
        let w = &self.weights;
        let rejections = w.rejections * s.rejections_per_second;
        if let Some((_, best)) = self.rank(s) {
            return best + rejections;
        }
        match self.fresh(s) {
            Some(l) => self.load_score(&l, s.since_scrape, s.prefix) + rejections,
            None => w.in_flight * s.in_flight as f64 - w.prefix * s.prefix,
        }
    }

    /// Whether `s` is saturated: fresh, and at or over the queue or the KV threshold
    /// (every rank, where ranks are scored). A stale endpoint never is.
    pub fn saturated(&self, s: &Snapshot) -> bool {
        if let Some(ranks) = self.ranks(s) {
            return ranks.iter().all(|r| self.load_saturated(&r.load));
        }
        self.fresh(s).is_some_and(|l| self.load_saturated(&l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(load: Load) -> Snapshot {
        Snapshot {
            load: Some((load, Duration::from_millis(20))),
            ranks: Vec::new(),
            in_flight: 0,
            since_scrape: 0,
            rejections_per_second: 0.0,
            prefix: 0.0,
        }
    }

    #[test]
    fn deferred_waiting_is_not_load() {
        let s = Scoring::default();
        let deferred = fresh(Load {
            running: 1.0,
            deferred_waiting: 20.0,
            ..Load::default()
        });
        let busy = fresh(Load {
            running: 2.0,
            ..Load::default()
        });
        assert!(s.score(&deferred) < s.score(&busy));
        assert!(!s.saturated(&deferred));
    }

    #[test]
    fn waiting_weighs_more_than_running() {
        let s = Scoring::default();
        let queued = fresh(Load {
            running: 4.0,
            capacity_waiting: 2.0,
            ..Load::default()
        });
        let running = fresh(Load {
            running: 7.0,
            ..Load::default()
        });
        assert!(s.score(&queued) > s.score(&running));
    }

    #[test]
    fn picks_since_the_scrape_and_429s_count() {
        let s = Scoring::default();
        let base = fresh(Load::default());
        let sent = Snapshot {
            since_scrape: 3,
            ..base.clone()
        };
        let refusing = Snapshot {
            rejections_per_second: 0.5,
            ..base.clone()
        };
        assert_eq!(s.score(&base), 0.0);
        assert_eq!(s.score(&sent), 3.0);
        assert_eq!(s.score(&refusing), 5.0);
        let full = fresh(Load {
            kv_usage: 0.5,
            ..Load::default()
        });
        assert_eq!(s.score(&full), 2.0);
    }

    #[test]
    fn stale_data_is_scored_on_in_flight_alone_and_never_saturated() {
        let s = Scoring::default();
        let hot = Load {
            capacity_waiting: 50.0,
            kv_usage: 1.0,
            ..Load::default()
        };
        let old = Snapshot {
            load: Some((hot, Duration::from_secs(2))),
            ranks: Vec::new(),
            in_flight: 2,
            since_scrape: 9,
            rejections_per_second: 3.0,
            prefix: 0.0,
        };
        assert_eq!(s.score(&old), 2.0);
        assert!(!s.saturated(&old));
        let never = Snapshot {
            load: None,
            ..old.clone()
        };
        assert_eq!(s.score(&never), 2.0);
        assert!(s.saturated(&fresh(hot)));
    }

    #[test]
    fn either_threshold_saturates() {
        let s = Scoring::default();
        let queue = fresh(Load {
            capacity_waiting: 5.0,
            ..Load::default()
        });
        let kv = fresh(Load {
            kv_usage: 0.85,
            ..Load::default()
        });
        let fine = fresh(Load {
            capacity_waiting: 4.0,
            kv_usage: 0.79,
            ..Load::default()
        });
        assert!(s.saturated(&queue) && s.saturated(&kv) && !s.saturated(&fine));
    }

    fn ranked(ranks: &[(f64, f64, i64)]) -> Snapshot {
        let rank = |&(running, waiting, since_scrape): &(f64, f64, i64)| RankSnapshot {
            load: Load {
                running,
                capacity_waiting: waiting,
                ..Load::default()
            },
            since_scrape,
            prefix: 0.0,
        };
        let total = Load {
            running: ranks.iter().map(|r| r.0).sum(),
            capacity_waiting: ranks.iter().map(|r| r.1).sum(),
            ..Load::default()
        };
        Snapshot {
            ranks: ranks.iter().map(rank).collect(),
            ..fresh(total)
        }
    }

    #[test]
    fn an_endpoint_with_ranks_is_scored_by_its_best_rank() {
        let s = Scoring::default();
        // Rank 0 full, rank 1 idle but for one request just sent.
        let pod = ranked(&[(8.0, 6.0, 0), (0.0, 0.0, 1)]);
        assert_eq!(s.rank(&pod), Some((1, 1.0)));
        assert_eq!(s.score(&pod), 1.0);
        assert!(!s.saturated(&pod), "rank 1 has room");
        let single = fresh(Load {
            running: 2.0,
            ..Load::default()
        });
        assert!(s.score(&pod) < s.score(&single));
        assert_eq!(s.rank(&single), None, "one rank: nothing to pick");
        // Every rank over the queue threshold: saturated.
        assert!(s.saturated(&ranked(&[(8.0, 6.0, 0), (8.0, 5.0, 0)])));
        // Ties go to the lower rank.
        assert_eq!(
            s.rank(&ranked(&[(1.0, 0.0, 0), (1.0, 0.0, 0)])),
            Some((0, 1.0))
        );
    }

    #[test]
    fn a_prefix_match_outweighs_a_little_load_not_a_lot() {
        let s = Scoring::default();
        let load = |running: f64, prefix: f64| Snapshot {
            prefix,
            ..fresh(Load {
                running,
                ..Load::default()
            })
        };
        assert!(s.score(&load(5.0, 0.9)) < s.score(&load(1.0, 0.0)));
        assert!(s.score(&load(8.0, 0.9)) > s.score(&load(1.0, 0.0)));
        // Stale: on in-flight and the match.
        let stale = Snapshot {
            load: None,
            in_flight: 2,
            ..load(0.0, 0.5)
        };
        assert_eq!(s.score(&stale), 2.0 - 3.0);
        // Per rank, the rank's own match.
        let mut pod = ranked(&[(2.0, 0.0, 0), (1.0, 0.0, 0)]);
        pod.ranks[0].prefix = 1.0;
        assert_eq!(s.rank(&pod), Some((0, -4.0)));
        assert!(s.ranked(&pod));
    }

    #[test]
    fn ranks_are_not_scored_when_stale_or_turned_off() {
        let pod = ranked(&[(8.0, 6.0, 0), (0.0, 0.0, 0)]);
        let off = Scoring {
            pick_ranks: false,
            ..Scoring::default()
        };
        assert_eq!(off.rank(&pod), None);
        assert_eq!(off.score(&pod), 8.0 + 2.0 * 6.0, "the sums");
        assert!(off.saturated(&pod), "6 waiting in all");
        let stale = Snapshot {
            load: pod.load.map(|(l, _)| (l, Duration::from_secs(5))),
            in_flight: 3,
            ..pod.clone()
        };
        assert_eq!(Scoring::default().rank(&stale), None);
        assert_eq!(Scoring::default().score(&stale), 3.0);
    }
}
