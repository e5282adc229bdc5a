//! Builders shared by the `decide_*` tests (included with `#[path]`; as a test target of
//! its own it has no tests).

#![allow(dead_code)]

use std::time::Duration;

use ballast_crds::InferenceServiceSpec;
use ballast_operator::decide::{DecideInput, History, Outcome, decide};
use ballast_operator::signals::{FleetSignals, ReplicaSignals};

/// Seconds as the decision's clock.
pub fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// The spec with every default (targets: 4 waiting per replica, KV 0.85, 0.05 rejections/s).
pub fn spec() -> InferenceServiceSpec {
    serde_json::from_value(serde_json::json!({"model": {"source": "synthetic:tiny"}}))
        .expect("minimal spec")
}

/// A spec scaling on capacity waiting only (one metric, as in HPA's single-metric
/// examples), between `min` and `max`.
pub fn capacity_only(target: f64, min: i32, max: i32) -> InferenceServiceSpec {
    let mut sp = spec();
    let a = &mut sp.autoscaling;
    a.targets.capacity_waiting_per_replica = Some(target);
    a.targets.kv_cache_usage = None;
    a.targets.admission_rejections_per_second = None;
    a.targets.ttft_p99_seconds = None;
    a.min_replicas = min;
    a.max_replicas = max;
    // Replicas far above hotCapacityWaiting would otherwise be rebalanced.
    sp.rebalancing.enabled = false;
    sp
}

/// A replica reporting KV usage and capacity-waiting requests, nothing deferred, no 429s.
pub fn replica(name: &str, kv: f64, waiting: f64) -> ReplicaSignals {
    ReplicaSignals {
        name: name.to_string(),
        running: 1.0,
        capacity_waiting: waiting,
        deferred_waiting: 0.0,
        kv_usage: kv,
        rejections_per_second: Some(0.0),
        ..ReplicaSignals::default()
    }
}

/// `n` replicas named r0… with the same values.
pub fn replicas(n: usize, kv: f64, waiting: f64) -> Vec<ReplicaSignals> {
    (0..n)
        .map(|i| replica(&format!("r{i}"), kv, waiting))
        .collect()
}

/// The fleet view the scraper builds from these replicas (all ready, all reporting):
/// sums for waiting, means for KV and for rejection rates (over the replicas that have
/// one).
pub fn fleet(replicas: Vec<ReplicaSignals>) -> FleetSignals {
    let n = replicas.len();
    let mean = |f: &dyn Fn(&ReplicaSignals) -> f64| {
        (n > 0).then(|| replicas.iter().map(f).sum::<f64>() / n as f64)
    };
    let rates: Vec<f64> = replicas
        .iter()
        .filter_map(|r| r.rejections_per_second)
        .collect();
    FleetSignals {
        ready: n,
        starting: 0,
        capacity_waiting: (n > 0).then(|| replicas.iter().map(|r| r.capacity_waiting).sum()),
        deferred_waiting: (n > 0).then(|| replicas.iter().map(|r| r.deferred_waiting).sum()),
        kv_usage: mean(&|r| r.kv_usage),
        rejections_per_second_per_replica: (!rates.is_empty())
            .then(|| rates.iter().sum::<f64>() / rates.len() as f64),
        ttft_p99_seconds: None,
        // Not known: every signal counts as exported.
        exported: None,
        held_requests: None,
        oldest_hold_seconds: None,
        replicas,
    }
}

/// An input for `spec` at `current` replicas.
pub fn input(spec: &InferenceServiceSpec, current: i32, fleet: FleetSignals) -> DecideInput {
    DecideInput::new(spec, current, fleet)
}

/// Runs periods the way a runtime does: decide, apply (the new size is reached and, unless
/// `warmup` says otherwise, ready at once), record.
pub struct Sim {
    pub spec: InferenceServiceSpec,
    pub current: i32,
    pub history: History,
    pub now: Duration,
}

impl Sim {
    pub fn new(spec: InferenceServiceSpec, current: i32) -> Sim {
        Sim {
            spec,
            current,
            history: History::default(),
            now: s(1000),
        }
    }

    /// One period with this fleet view; advances the clock by `period` afterwards.
    pub fn step(&mut self, fleet: FleetSignals, period: Duration) -> Outcome {
        let out = decide(
            &input(&self.spec, self.current, fleet),
            &self.history,
            self.now,
        );
        self.history.record(&out.history, true);
        self.current = out.desired_replicas;
        self.now += period;
        out
    }
}
