//! The boundary between scraping and deciding: what one replica reported (one scrape, in
//! a dialect-independent form), what it means over a control period, and the fleet view
//! the decision core reads.
//!
//! Aggregation rules of the control-plane contract §3 live in the scrape module that
//! produces these; the decision core only consumes them.

use std::collections::{BTreeMap, BTreeSet};

/// Which series names a replica's exposition uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// `ballast_*`.
    Ballast,
    /// `vllm:*`.
    Vllm,
    /// `sglang:*`.
    Sglang,
    /// `llamacpp:*` (llama.cpp's `llama-server --metrics`).
    Llamacpp,
}

impl From<ballast_crds::EngineKind> for Dialect {
    fn from(k: ballast_crds::EngineKind) -> Self {
        match k {
            ballast_crds::EngineKind::Ballast => Dialect::Ballast,
            ballast_crds::EngineKind::Vllm => Dialect::Vllm,
            ballast_crds::EngineKind::Sglang => Dialect::Sglang,
        }
    }
}

/// The family of series behind one scaling signal, whatever a dialect calls it.
///
/// Which families a fleet's replicas export decides what a missing value means: a family
/// no successful scrape carried is *not exported* by these replicas (an older vLLM without
/// `vllm:admission_rejections_total`, SGLang), and its target is ignored; a family that is
/// exported but has no usable value is *missing*, which blocks scale-down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Requests waiting (by reason, or all waiting).
    Waiting,
    /// KV cache usage.
    KvUsage,
    /// The admission-rejection (HTTP 429) counter.
    Rejections,
    /// The time-to-first-token histogram.
    Ttft,
}

/// Lifetime values of one counter family, one entry per series, keyed by the series'
/// labels (e.g. `engine="0",reason="max_num_queued_reqs"`). Kept per series so a reset is
/// judged per series: one reason restarting from zero while another grows is still a reset.
pub type CounterSeries = BTreeMap<String, f64>;

/// One scrape of one replica, after the dialect adapter. Gauges are already combined over
/// the replica's data-parallel ranks (waiting summed, KV usage max); counters are raw
/// lifetime values so rates can be taken between scrapes. `None` means the exposition did
/// not carry the series, or carried values that cannot be right (negative counts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaSample {
    /// Requests running, summed over ranks.
    pub running: Option<f64>,
    /// Requests waiting for capacity, summed over ranks. Dialects without a reason split
    /// report all waiting requests here.
    pub waiting_capacity: Option<f64>,
    /// Requests deferred (tenant caps), summed over ranks; `None` when the dialect cannot
    /// tell deferred from capacity.
    pub waiting_deferred: Option<f64>,
    /// KV cache usage in [0, 1]: the max over ranks, never the mean.
    pub kv_usage: Option<f64>,
    /// The same gauges for each data-parallel rank (index = rank), as the rank labels say
    /// (ballast and vLLM `engine`, SGLang `dp_rank`): what a picker that chooses the rank
    /// reads. Empty when the gauges carry no rank label, or their ranks are not exactly
    /// 0..N.
    pub ranks: Vec<RankLoad>,
    /// Lifetime admission rejections (HTTP 429), per series (reason and rank). Empty when
    /// the family is declared (`# TYPE`) but no rejection has happened yet.
    pub rejections_total: Option<CounterSeries>,
    /// TTFT histogram: cumulative counts per upper bound (`le`, +Inf last), summed over
    /// ranks by `le`. Empty when absent.
    pub ttft_buckets: Vec<(f64, f64)>,
    /// Lifetime tokens scheduled per DP rank (index = rank); empty when absent.
    pub dp_tokens: Vec<f64>,
    /// Lifetime sum and count of the DP token-imbalance-ratio histogram (rank 0's).
    pub dp_imbalance: Option<(f64, f64)>,
    /// The signal families the exposition carried (declared or with samples), whether or
    /// not their values were usable.
    pub families: BTreeSet<Family>,
}

/// One data-parallel rank's gauges in one scrape. A gauge the exposition does not carry
/// reads 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RankLoad {
    /// Requests running on the rank.
    pub running: f64,
    /// Requests waiting for the rank's capacity (all waiting, for dialects without a
    /// reason split).
    pub waiting_capacity: f64,
    /// Requests deferred by tenant caps on the rank.
    pub waiting_deferred: f64,
    /// The rank's KV cache usage in [0, 1].
    pub kv_usage: f64,
}

impl ReplicaSample {
    /// Lifetime admission rejections summed over series, for display.
    pub fn rejections_sum(&self) -> Option<f64> {
        self.rejections_total.as_ref().map(|s| s.values().sum())
    }
}

/// What one replica's samples mean over a control period.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaSignals {
    /// Replica name (pod or local process name).
    pub name: String,
    /// Latest running requests.
    pub running: f64,
    /// Latest capacity-waiting requests.
    pub capacity_waiting: f64,
    /// Latest deferred requests (0 when the dialect cannot tell).
    pub deferred_waiting: f64,
    /// Latest KV usage (max over ranks).
    pub kv_usage: f64,
    /// 429s per second over the period: the sum of each series' increase, a series that
    /// went down (reset) or is new counting from zero. `None` without two samples that
    /// both carry the counter.
    pub rejections_per_second: Option<f64>,
    /// TTFT bucket increases over the period, cumulative by `le` (+Inf last).
    pub ttft_bucket_increase: Vec<(f64, f64)>,
    /// Mean DP token-imbalance ratio over the period, when the replica has DP ranks.
    pub dp_imbalance_ratio: Option<f64>,
    /// Each rank's share of the tokens scheduled over the period (sums to 1).
    pub dp_token_share: Vec<f64>,
}

/// What a service's gateway pickers hold, over those that answered
/// ([`crate::scrape::held`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Held {
    /// Requests held, summed over the pickers.
    pub requests: f64,
    /// The longest hold among them, in seconds.
    pub oldest_seconds: f64,
    /// Pickers that answered with the gauges.
    pub pickers: usize,
    /// What each of them holds: `(pod name, requests)`, by name.
    pub by_picker: Vec<(String, f64)>,
}

/// The fleet as the decision core sees it in one control period.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetSignals {
    /// Per replica that reported a usable sample this period.
    pub replicas: Vec<ReplicaSignals>,
    /// Replicas that were ready and asked for metrics (reported or not).
    pub ready: usize,
    /// Replicas created but not ready yet (starting, loading the model).
    pub starting: usize,
    /// Σ capacity-waiting over reporting replicas, plus the requests the service's
    /// gateway holds ([`held_requests`](Self::held_requests)).
    pub capacity_waiting: Option<f64>,
    /// Σ deferred over reporting replicas.
    pub deferred_waiting: Option<f64>,
    /// Mean over reporting replicas of each replica's KV usage (itself a max over ranks).
    pub kv_usage: Option<f64>,
    /// Mean rejection rate over the reporting replicas that have a rate this period (two
    /// samples of the counter); `None` when none has. HPA multiplies a per-pod average by
    /// the pods it was taken over, so the decision core counts the same replicas: those
    /// whose [`ReplicaSignals::rejections_per_second`] is set.
    pub rejections_per_second_per_replica: Option<f64>,
    /// p99 of the TTFT buckets summed by `le` over replicas (never an average of
    /// per-replica quantiles). `None` without observations in the period.
    pub ttft_p99_seconds: Option<f64>,
    /// The families the replicas' successful scrapes carried (each listed replica's
    /// latest successful one); `None` when that is not known (no scrape succeeded this
    /// period, or a runtime that does not tell). A family absent from a known set is not
    /// exported by these replicas.
    pub exported: Option<BTreeSet<Family>>,
    /// Requests the service's gateway pickers hold (summed), waiting for capacity that no
    /// replica counts; `None` without a gateway, or when no picker answered.
    pub held_requests: Option<f64>,
    /// The longest a request the pickers hold has been held, in seconds.
    pub oldest_hold_seconds: Option<f64>,
}

impl FleetSignals {
    /// Adds what the gateway holds: its requests count as capacity-waiting (with no
    /// replica behind them, so even with none reporting).
    pub fn add_held(&mut self, held: Option<Held>) {
        let Some(h) = held else {
            return;
        };
        self.held_requests = Some(h.requests);
        self.oldest_hold_seconds = Some(h.oldest_seconds);
        if h.requests > 0.0 || self.capacity_waiting.is_some() {
            self.capacity_waiting = Some(self.capacity_waiting.unwrap_or(0.0) + h.requests);
        }
    }

    /// Replicas that reported.
    pub fn reporting(&self) -> usize {
        self.replicas.len()
    }

    /// Whether `family` is known not to be exported: a scrape succeeded this period and no
    /// replica's latest successful scrape carried it. Unknown is not "not exported".
    pub fn lacks(&self, family: Family) -> bool {
        self.exported.as_ref().is_some_and(|e| !e.contains(&family))
    }

    /// Reporting replicas that have a rejection rate this period: the ones
    /// `rejections_per_second_per_replica` averages over.
    pub fn with_rejection_rate(&self) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.rejections_per_second.is_some())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_requests_are_capacity_waiting_even_with_no_replica() {
        let held = |requests: f64| {
            Some(Held {
                requests,
                oldest_seconds: 2.5,
                pickers: 1,
                ..Held::default()
            })
        };
        // No replica at all: the held requests are the whole of capacity-waiting.
        let mut none = FleetSignals::default();
        none.add_held(held(3.0));
        assert_eq!(none.capacity_waiting, Some(3.0));
        assert_eq!(none.held_requests, Some(3.0));
        assert_eq!(none.oldest_hold_seconds, Some(2.5));
        // Replicas waiting too: added.
        let mut some = FleetSignals {
            capacity_waiting: Some(4.0),
            ..FleetSignals::default()
        };
        some.add_held(held(3.0));
        assert_eq!(some.capacity_waiting, Some(7.0));
        // Nothing held and nothing reported: still unknown, not 0.
        let mut idle = FleetSignals::default();
        idle.add_held(held(0.0));
        assert_eq!(idle.capacity_waiting, None);
        assert_eq!(idle.held_requests, Some(0.0));
        // No gateway: nothing changes.
        let mut plain = FleetSignals::default();
        plain.add_held(None);
        assert_eq!(plain, FleetSignals::default());
    }
}
