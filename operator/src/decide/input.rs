//! What the decision core reads each control period: the spec parts it obeys, the replica
//! counts the runtime knows, and the fleet signals the scraper produced.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ballast_crds::{AutoscalingSpec, InferenceServiceSpec, MetricsSpec, RebalancingSpec};

use crate::signals::{Family, FleetSignals};

/// The four scaling signals, named in status as the fields of `ballast_crds::Signals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SignalName {
    /// Requests waiting for capacity: fleet total divided by the reporting replicas,
    /// against `targets.capacityWaitingPerReplica`.
    CapacityWaiting,
    /// Mean over replicas of each replica's KV usage (max over its ranks), against
    /// `targets.kvCacheUsage`.
    KvCacheUsage,
    /// HTTP 429 rate per replica, against `targets.admissionRejectionsPerSecond`.
    AdmissionRejectionsPerSecond,
    /// Fleet p99 time to first token, against `targets.ttftP99Seconds`.
    TtftP99Seconds,
}

impl SignalName {
    /// Every signal, in the order ties between equal recommendations are broken (the first
    /// wins, as HPA keeps the first metric with the largest proposal).
    pub const ALL: [SignalName; 4] = [
        SignalName::CapacityWaiting,
        SignalName::KvCacheUsage,
        SignalName::AdmissionRejectionsPerSecond,
        SignalName::TtftP99Seconds,
    ];

    /// The camelCase name used in `status.lastDecision.signals` and `recommendations`.
    pub fn as_str(self) -> &'static str {
        match self {
            SignalName::CapacityWaiting => "capacityWaiting",
            SignalName::KvCacheUsage => "kvCacheUsage",
            SignalName::AdmissionRejectionsPerSecond => "admissionRejectionsPerSecond",
            SignalName::TtftP99Seconds => "ttftP99Seconds",
        }
    }

    /// The family of series the signal is computed from.
    pub fn family(self) -> Family {
        match self {
            SignalName::CapacityWaiting => Family::Waiting,
            SignalName::KvCacheUsage => Family::KvUsage,
            SignalName::AdmissionRejectionsPerSecond => Family::Rejections,
            SignalName::TtftP99Seconds => Family::Ttft,
        }
    }

    /// The target configured for this signal, if any.
    pub fn target(self, autoscaling: &AutoscalingSpec) -> Option<f64> {
        let t = &autoscaling.targets;
        match self {
            SignalName::CapacityWaiting => t.capacity_waiting_per_replica,
            SignalName::KvCacheUsage => t.kv_cache_usage,
            SignalName::AdmissionRejectionsPerSecond => t.admission_rejections_per_second,
            SignalName::TtftP99Seconds => t.ttft_p99_seconds,
        }
    }
}

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything [`decide`](super::decide) needs besides the history and the time.
///
/// Replica counts: `current_replicas` is the size the workload is asked to run (HPA's
/// `currentReplicas`, the scale's spec); `fleet.ready` and `fleet.starting` say how many
/// of those are ready or still starting, and `fleet.replicas` holds the ones that reported.
///
/// A signal whose family no replica's latest successful scrape carried
/// ([`FleetSignals::lacks`]) is not exported by these replicas: its target is ignored
/// (status shows it as unsupported) rather than treated as missing, which would block
/// every scale-down forever. What replicas export is read from them, not assumed from
/// the engine kind: a newer vLLM with the rejection counter gets that signal.
#[derive(Debug, Clone, PartialEq)]
pub struct DecideInput {
    /// `spec.autoscaling`.
    pub autoscaling: AutoscalingSpec,
    /// `spec.rebalancing`.
    pub rebalancing: RebalancingSpec,
    /// `spec.metrics` (only `minReportingFraction` is read here).
    pub metrics: MetricsSpec,
    /// `spec.replicas`, followed when autoscaling is disabled.
    pub spec_replicas: Option<i32>,
    /// Replicas the workload currently runs or is starting: the count last applied
    /// (`status.desiredReplicas` / the workload's replica count).
    pub current_replicas: i32,
    /// Names of *ready* replicas currently out of rotation (taken out by an earlier
    /// decision and not restored yet). The runtime reports what it actually applied, so a
    /// restarted operator picks up where the cluster is (level-triggered, not remembered).
    pub out_of_rotation: BTreeSet<String>,
    /// DP dispatch weights currently applied per replica (one per rank). A replica absent
    /// here is taken to dispatch evenly.
    pub dp_weights: BTreeMap<String, Vec<f64>>,
    /// This period's aggregated signals.
    pub fleet: FleetSignals,
}

impl DecideInput {
    /// An input from a resource's spec, with nothing out of rotation and even DP weights.
    pub fn new(spec: &InferenceServiceSpec, current_replicas: i32, fleet: FleetSignals) -> Self {
        DecideInput {
            autoscaling: spec.autoscaling.clone(),
            rebalancing: spec.rebalancing.clone(),
            metrics: spec.metrics.clone(),
            spec_replicas: spec.replicas,
            current_replicas,
            out_of_rotation: BTreeSet::new(),
            dp_weights: BTreeMap::new(),
            fleet,
        }
    }
}
