//! The Prometheus registry served at `GET /metrics`.
//!
//! This is the first slice of the metrics contract: per-rank running and waiting requests
//! (with the capacity/deferred split) and KV usage, set from each step's snapshot, plus the
//! front door's rejections. The full contract is built on the same feed.

use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::admission::RejectReason;
use crate::events::SchedulerSnapshot;

/// Gauges and counters of one engine process.
#[derive(Clone)]
pub struct EngineMetrics {
    registry: Registry,
    model_name: String,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    waiting_by_reason: IntGaugeVec,
    kv_usage: GaugeVec,
    rejections: IntCounterVec,
}

impl EngineMetrics {
    /// Registers every family, with series for each of `num_ranks` ranks present from start.
    pub fn new(model_name: &str, num_ranks: usize) -> Self {
        let registry = Registry::new();
        let labels = ["model_name", "engine"];
        let gauge = |name: &str, help: &str, extra: &[&str]| {
            let all: Vec<&str> = labels.iter().chain(extra).copied().collect();
            let g = IntGaugeVec::new(Opts::new(name, help), &all).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let running = gauge(
            "ballast_num_requests_running",
            "Requests in the running batch.",
            &[],
        );
        let waiting = gauge(
            "ballast_num_requests_waiting",
            "Requests waiting to run (capacity + deferred).",
            &[],
        );
        let waiting_by_reason = gauge(
            "ballast_num_requests_waiting_by_reason",
            "Waiting requests by reason: capacity (batch slots or KV blocks) or deferred (tenant at its running cap).",
            &["reason"],
        );
        let kv_usage = GaugeVec::new(
            Opts::new(
                "ballast_kv_cache_usage_ratio",
                "Fraction of KV blocks referenced by live requests (evictable cached blocks count as free).",
            ),
            &labels,
        )
        .expect("valid metric");
        registry
            .register(Box::new(kv_usage.clone()))
            .expect("unique metric");
        let rejections = IntCounterVec::new(
            Opts::new(
                "ballast_admission_rejections_total",
                "Requests turned away at the front door with HTTP 429, by reason.",
            ),
            &["model_name", "engine", "reason"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(rejections.clone()))
            .expect("unique metric");
        let m = Self {
            registry,
            model_name: model_name.to_string(),
            running,
            waiting,
            waiting_by_reason,
            kv_usage,
            rejections,
        };
        for rank in 0..num_ranks {
            m.observe_snapshot(rank, &SchedulerSnapshot::default());
        }
        for reason in RejectReason::ALL {
            m.rejections
                .with_label_values(&[model_name, "0", reason.label()]);
        }
        m
    }

    /// Sets the gauges of `rank` from its end-of-step snapshot (set, never add).
    pub fn observe_snapshot(&self, rank: usize, s: &SchedulerSnapshot) {
        let engine = rank.to_string();
        let l = [self.model_name.as_str(), engine.as_str()];
        self.running.with_label_values(&l).set(s.running as i64);
        self.waiting.with_label_values(&l).set(s.waiting() as i64);
        let by = |reason| [l[0], l[1], reason];
        self.waiting_by_reason
            .with_label_values(&by("capacity"))
            .set(s.waiting_capacity as i64);
        self.waiting_by_reason
            .with_label_values(&by("deferred"))
            .set(s.waiting_deferred as i64);
        self.kv_usage.with_label_values(&l).set(s.kv_usage);
    }

    /// Counts one request turned away. Rejections happen before a rank is chosen, so they
    /// are attributed to engine "0" (one series per pod, summed by readers as counters are).
    pub fn observe_rejection(&self, reason: RejectReason) {
        self.rejections
            .with_label_values(&[self.model_name.as_str(), "0", reason.label()])
            .inc();
    }

    /// The text exposition of every family.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("exposition is UTF-8")
    }
}
