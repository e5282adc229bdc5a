//! From scrapes to signals: each replica's previous sample is kept so counters and
//! histograms become rates and increases over the control period, and the reporting
//! replicas are combined into the fleet view (contract §3).
//!
//! Counter rule, for every counter-like value (429s, TTFT buckets, DP tokens, the DP
//! imbalance histogram): the increase is `current − previous`, except that a decrease
//! means the counter was reset (the engine restarted) and the increase counts from zero,
//! i.e. it is `current`. A restart therefore never shows up as a negative rate or as a
//! spike of the whole lifetime count. The 429 counter is judged per series (reason and
//! rank): summed first, one series resetting while another grows would hide the reset or
//! subtract the lost count from the other's increase; a series that is new counts from
//! zero. Histograms and per-rank vectors are judged as a whole (any bucket or rank going
//! down, or a changed layout, is a reset) so the result stays cumulative and consistent.
//!
//! The fleet view also says which signal families the replicas' successful scrapes
//! carried ([`FleetSignals::exported`]): a failed scrape says nothing about what a replica
//! exports, so its last successful one speaks for it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use crate::signals::{CounterSeries, FleetSignals, ReplicaSample, ReplicaSignals};

/// The quantile of TTFT the fleet view reports.
pub const TTFT_QUANTILE: f64 = 0.99;

/// Remembers each replica's previous sample between control periods.
#[derive(Debug, Default)]
pub struct Tracker {
    previous: HashMap<String, (ReplicaSample, Instant)>,
}

impl Tracker {
    /// An empty tracker: the first period after it has no rates yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one control period into the fleet view.
    ///
    /// `reports` lists every replica that was ready and asked for metrics this period,
    /// with its sample, or `None` when its scrape failed (it then contributes nothing, but
    /// its previous sample is kept so the next success has a window). Replicas that are
    /// not listed any more are forgotten; a name listed twice counts once. `starting` is
    /// the number of replicas created but not ready yet; `at` is when the scrapes were
    /// taken.
    ///
    /// Each fleet value is taken over the reporting replicas that carry that signal (Σ
    /// waiting, mean of per-replica KV maxima, mean of 429 rates over replicas that have a
    /// rate yet, p99 of TTFT bucket increases summed by `le`), and is `None` when none
    /// does, so a signal a dialect lacks is "unknown", never 0.
    ///
    /// `exported` is the union of the families carried by the latest successful sample of
    /// every replica listed now: a replica whose scrape failed this period still counts
    /// with what it exported before, so a failed scrape of the only replicas that have a
    /// family leaves that signal *missing* (no scale-down), never *not exported*. It is
    /// `None` when no scrape succeeded this period.
    pub fn observe<'a>(
        &mut self,
        at: Instant,
        reports: impl IntoIterator<Item = (&'a str, Option<&'a ReplicaSample>)>,
        starting: usize,
    ) -> FleetSignals {
        let mut listed = HashSet::new();
        let mut reporting: Vec<(&ReplicaSample, ReplicaSignals)> = Vec::new();
        for (name, sample) in reports {
            if !listed.insert(name.to_owned()) {
                // Counting one replica twice would skew every sum and mean.
                tracing::warn!(
                    replica = name,
                    "replica listed twice; later entries ignored"
                );
                continue;
            }
            let Some(sample) = sample else { continue };
            let prev = self.previous.get(name).map(|(s, t)| (s, *t));
            reporting.push((sample, replica_signals(name, prev, sample, at)));
            self.previous.insert(name.to_owned(), (sample.clone(), at));
        }
        self.previous.retain(|name, _| listed.contains(name));
        let exported = (!reporting.is_empty()).then(|| {
            self.previous
                .values()
                .flat_map(|(s, _)| s.families.iter().copied())
                .collect::<BTreeSet<_>>()
        });
        FleetSignals {
            exported,
            ..fleet(listed.len(), starting, reporting)
        }
    }

    /// Replicas with a remembered sample.
    pub fn tracked(&self) -> usize {
        self.previous.len()
    }
}

/// What one replica's sample means, given its previous one (`None` on the first scrape,
/// or after it was forgotten): latest gauges, and rates/increases over the period.
pub fn replica_signals(
    name: &str,
    prev: Option<(&ReplicaSample, Instant)>,
    cur: &ReplicaSample,
    at: Instant,
) -> ReplicaSignals {
    let seconds = prev
        .and_then(|(_, t)| at.checked_duration_since(t))
        .map(|d| d.as_secs_f64())
        .filter(|s| *s > 0.0);
    let p = prev.map(|(s, _)| s);
    let rejections_per_second = match (
        p.and_then(|p| p.rejections_total.as_ref()),
        cur.rejections_total.as_ref(),
    ) {
        (Some(a), Some(b)) => seconds.map(|s| series_increase(a, b) / s),
        _ => None,
    };
    ReplicaSignals {
        name: name.to_owned(),
        running: cur.running.unwrap_or(0.0),
        capacity_waiting: cur.waiting_capacity.unwrap_or(0.0),
        deferred_waiting: cur.waiting_deferred.unwrap_or(0.0),
        kv_usage: cur.kv_usage.unwrap_or(0.0),
        rejections_per_second,
        ttft_bucket_increase: p
            .map(|p| bucket_increase(&p.ttft_buckets, &cur.ttft_buckets))
            .unwrap_or_default(),
        dp_imbalance_ratio: match (p.and_then(|p| p.dp_imbalance), cur.dp_imbalance) {
            (Some(a), Some(b)) => imbalance_mean(a, b),
            _ => None,
        },
        dp_token_share: p
            .map(|p| token_share(&p.dp_tokens, &cur.dp_tokens))
            .unwrap_or_default(),
    }
}

/// Increase of one counter between two readings; a decrease is a reset.
pub fn increase(prev: f64, cur: f64) -> f64 {
    if cur >= prev { cur - prev } else { cur }
}

/// Increase of a counter family kept per series: the sum of each series' [`increase`],
/// a series absent before counting from zero (it was created since: a first rejection of
/// that reason, or a restart). A series that disappeared adds nothing.
pub fn series_increase(prev: &CounterSeries, cur: &CounterSeries) -> f64 {
    cur.iter()
        .map(|(key, c)| prev.get(key).map_or(*c, |p| increase(*p, *c)))
        .sum()
}

/// Per-`le` increase of a cumulative histogram. A changed layout or any bucket going down
/// is a reset: the increase is then the current histogram. Empty when either side is.
fn bucket_increase(prev: &[(f64, f64)], cur: &[(f64, f64)]) -> Vec<(f64, f64)> {
    if prev.is_empty() || cur.is_empty() {
        return Vec::new();
    }
    let same_layout = prev.len() == cur.len() && prev.iter().zip(cur).all(|(p, c)| p.0 == c.0);
    if !same_layout || prev.iter().zip(cur).any(|(p, c)| c.1 < p.1) {
        return cur.to_vec();
    }
    prev.iter()
        .zip(cur)
        .map(|(p, c)| (c.0, c.1 - p.1))
        .collect()
}

/// Mean imbalance ratio over the period from the histogram's (sum, count) readings.
fn imbalance_mean(prev: (f64, f64), cur: (f64, f64)) -> Option<f64> {
    let (sum, count) = if cur.0 < prev.0 || cur.1 < prev.1 {
        cur
    } else {
        (cur.0 - prev.0, cur.1 - prev.1)
    };
    (count > 0.0).then(|| sum / count)
}

/// Each rank's share of the tokens scheduled over the period; empty without tokens.
fn token_share(prev: &[f64], cur: &[f64]) -> Vec<f64> {
    if prev.is_empty() || cur.is_empty() {
        return Vec::new();
    }
    let reset = prev.len() != cur.len() || prev.iter().zip(cur).any(|(p, c)| c < p);
    let delta: Vec<f64> = if reset {
        cur.to_vec()
    } else {
        prev.iter().zip(cur).map(|(p, c)| c - p).collect()
    };
    let total: f64 = delta.iter().sum();
    if total > 0.0 {
        delta.into_iter().map(|d| d / total).collect()
    } else {
        Vec::new()
    }
}

/// Combines the reporting replicas. A fleet value is taken over the replicas that report
/// that signal, and is `None` when none does.
fn fleet(
    ready: usize,
    starting: usize,
    reporting: Vec<(&ReplicaSample, ReplicaSignals)>,
) -> FleetSignals {
    let sum = |f: fn(&ReplicaSample) -> Option<f64>| {
        reporting
            .iter()
            .filter_map(|(s, _)| f(s))
            .reduce(|a, b| a + b)
    };
    let mean = |values: Vec<f64>| {
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let kv_usage = mean(reporting.iter().filter_map(|(s, _)| s.kv_usage).collect());
    let rejections = mean(
        reporting
            .iter()
            .filter_map(|(_, r)| r.rejections_per_second)
            .collect(),
    );
    let ttft = summed_buckets(
        reporting
            .iter()
            .map(|(_, r)| r.ttft_bucket_increase.as_slice()),
    );
    FleetSignals {
        ready,
        starting,
        capacity_waiting: sum(|s| s.waiting_capacity),
        deferred_waiting: sum(|s| s.waiting_deferred),
        kv_usage,
        rejections_per_second_per_replica: rejections,
        ttft_p99_seconds: ttft.and_then(|b| histogram_quantile(TTFT_QUANTILE, &b)),
        exported: None,
        held_requests: None,
        oldest_hold_seconds: None,
        replicas: reporting.into_iter().map(|(_, r)| r).collect(),
    }
}

/// Bucket increases summed by `le` across replicas (those with none are skipped).
/// `None` when nobody has buckets, or when replicas disagree on the bounds: summing
/// mismatched layouts would put observations in the wrong buckets.
fn summed_buckets<'a>(all: impl Iterator<Item = &'a [(f64, f64)]>) -> Option<Vec<(f64, f64)>> {
    let mut total: Option<Vec<(f64, f64)>> = None;
    for b in all.filter(|b| !b.is_empty()) {
        match &mut total {
            None => total = Some(b.to_vec()),
            Some(t) => {
                if t.len() != b.len() || t.iter().zip(b).any(|(x, y)| x.0 != y.0) {
                    tracing::warn!("TTFT histograms of replicas have different buckets");
                    return None;
                }
                for (x, y) in t.iter_mut().zip(b) {
                    x.1 += y.1;
                }
            }
        }
    }
    total
}

/// Prometheus' `histogram_quantile` over cumulative `(le, count)` buckets.
///
/// Same semantics: buckets are sorted by bound and must end with `+Inf`; counts are made
/// monotonic; the rank `q × total` is located in the first bucket whose count reaches it
/// and interpolated linearly inside it, the first bucket starting at 0 (or returning its
/// bound when that is ≤ 0); a rank in the `+Inf` bucket returns the highest finite bound.
/// `None` where Prometheus returns NaN: no observations, no `+Inf` bucket, fewer than two
/// buckets, or `q` outside [0, 1] (Prometheus gives ±Inf there, which no caller wants).
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    if !(0.0..=1.0).contains(&q) || buckets.len() < 2 {
        return None;
    }
    let mut b = buckets.to_vec();
    if b.iter().any(|(le, c)| le.is_nan() || !c.is_finite()) {
        return None;
    }
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    if b.last()?.0 != f64::INFINITY {
        return None;
    }
    // Like Prometheus, tolerate small non-monotonic glitches by carrying the max forward.
    let mut max = f64::NEG_INFINITY;
    for x in &mut b {
        max = max.max(x.1);
        x.1 = max;
    }
    let total = b.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let last = b.len() - 1;
    let i = b[..last].iter().position(|x| x.1 >= rank).unwrap_or(last);
    if i == last {
        return Some(b[last - 1].0);
    }
    if i == 0 && b[0].0 <= 0.0 {
        return Some(b[0].0);
    }
    let (start, below) = if i == 0 {
        (0.0, 0.0)
    } else {
        (b[i - 1].0, b[i - 1].1)
    };
    let end = b[i].0;
    let in_bucket = b[i].1 - below;
    if in_bucket <= 0.0 {
        return Some(start); // only with q = 0 over an empty first bucket; avoids 0/0
    }
    Some(start + (end - start) * ((rank - below) / in_bucket))
}

#[cfg(test)]
#[path = "aggregate_tests.rs"]
mod tests;
