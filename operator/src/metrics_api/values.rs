//! What the metrics APIs serve: each InferenceService's values from its last control
//! period, kept by the reconciler ([`Board::publish`]) and read by the server. No request
//! scrapes anything.
//!
//! A value is *absent* — never 0 — when the fleet does not export the family behind it,
//! when no replica reported in the period (every scrape failed, or there are no pods),
//! or when the record is older than [`STALE_PERIODS`] control periods.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime};

use ballast_crds::Signals;

use crate::signals::{Family, FleetSignals};

/// A record older than this many control periods is not served.
pub const STALE_PERIODS: u32 = 3;

/// One metric of the metrics APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// Requests waiting for capacity, fleet total over the replicas that reported, divided
    /// by their number: the value the built-in autoscaler compares with
    /// `targets.capacityWaitingPerReplica`.
    CapacityWaitingPerReplica,
    /// KV cache usage in [0, 1]: per replica the max over its DP ranks; on the
    /// InferenceService the mean over replicas, as `status.lastDecision.signals`.
    KvCacheUsage,
    /// HTTP 429 admission rejections per second per replica over the last period.
    AdmissionRejectionsPerSecondPerReplica,
    /// Requests deferred by tenant caps, fleet total (more replicas do not help them).
    DeferredWaiting,
    /// The fleet's p99 time to first token over the last period, in seconds (0 when every
    /// replica was idle through it).
    TtftP99Seconds,
    /// The replicas the operator's whole decision asks for.
    RecommendedReplicas,
    /// One pod's requests waiting for capacity.
    CapacityWaiting,
    /// Requests the service's gateway holds (`spec.gateway`): demand with no replica
    /// behind it, also at zero replicas. Already counted in
    /// `capacity_waiting_per_replica`.
    HeldRequests,
}

impl Metric {
    /// The metrics of an InferenceService (custom Object metrics and external metrics).
    pub const SERVICE: [Metric; 7] = [
        Metric::CapacityWaitingPerReplica,
        Metric::KvCacheUsage,
        Metric::AdmissionRejectionsPerSecondPerReplica,
        Metric::DeferredWaiting,
        Metric::TtftP99Seconds,
        Metric::RecommendedReplicas,
        Metric::HeldRequests,
    ];

    /// The metrics of one engine pod (custom Pods metrics).
    pub const POD: [Metric; 2] = [Metric::KvCacheUsage, Metric::CapacityWaiting];

    /// The name in URLs and lists.
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::CapacityWaitingPerReplica => "capacity_waiting_per_replica",
            Metric::KvCacheUsage => "kv_cache_usage",
            Metric::AdmissionRejectionsPerSecondPerReplica => {
                "admission_rejections_per_second_per_replica"
            }
            Metric::DeferredWaiting => "deferred_waiting",
            Metric::TtftP99Seconds => "ttft_p99_seconds",
            Metric::RecommendedReplicas => "recommended_replicas",
            Metric::CapacityWaiting => "capacity_waiting",
            Metric::HeldRequests => "held_requests",
        }
    }

    /// The metric named `name`, if any.
    pub fn parse(name: &str) -> Option<Metric> {
        Metric::SERVICE
            .iter()
            .chain(&Metric::POD)
            .copied()
            .find(|m| m.as_str() == name)
    }
}

/// One engine pod's values in a period.
#[derive(Debug, Clone, PartialEq)]
pub struct PodValues {
    /// The pod's name.
    pub name: String,
    /// Its values (absent ones left out).
    pub values: BTreeMap<Metric, f64>,
}

/// One InferenceService's values from one control period.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// When the period's scrape began (the values' timestamp).
    pub scraped_at: SystemTime,
    /// When it was published (for staleness, on the monotonic clock).
    pub published: Instant,
    /// The control period (`metrics.scrapeIntervalSeconds`): rates are over it.
    pub interval: Duration,
    /// The service's values (absent ones left out).
    pub values: BTreeMap<Metric, f64>,
    /// Each pod that reported.
    pub pods: Vec<PodValues>,
    /// The labels of the service's engine pods, for `labelSelector`s of Pods metrics.
    pub pod_labels: BTreeMap<String, String>,
    /// Requests running or waiting (for capacity or behind a tenant cap) over the replicas
    /// that reported, plus those the gateway holds; `None` when neither reported. KEDA's
    /// `IsActive` reads it.
    pub in_flight: Option<f64>,
}

impl Record {
    /// The values of a decided period: `signals` as the decision sanitized them (what
    /// status shows), `fleet` for which families the replicas export and for each pod,
    /// `recommended` the replicas the decision asks for.
    pub fn of(
        fleet: &FleetSignals,
        signals: &Signals,
        recommended: Option<i32>,
        scraped_at: SystemTime,
        interval: Duration,
        pod_labels: BTreeMap<String, String>,
    ) -> Record {
        let reporting = fleet.reporting();
        let exported = |f: Family| reporting > 0 && !fleet.lacks(f);
        let count = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0);
        let ratio = |v: Option<f64>| v.filter(|x| x.is_finite() && (0.0..=1.0).contains(x));
        let idle = fleet
            .replicas
            .iter()
            .all(|r| r.running == 0.0 && r.capacity_waiting == 0.0 && r.deferred_waiting == 0.0);
        let mut values = BTreeMap::new();
        let mut put = |m: Metric, v: Option<f64>| {
            if let Some(v) = v {
                values.insert(m, v);
            }
        };
        if exported(Family::Waiting) {
            put(
                Metric::CapacityWaitingPerReplica,
                count(signals.capacity_waiting).map(|w| w / reporting as f64),
            );
            put(Metric::DeferredWaiting, count(signals.deferred_waiting));
        }
        if exported(Family::KvUsage) {
            put(Metric::KvCacheUsage, ratio(signals.kv_cache_usage));
        }
        if exported(Family::Rejections) {
            put(
                Metric::AdmissionRejectionsPerSecondPerReplica,
                count(signals.admission_rejections_per_second),
            );
        }
        if exported(Family::Ttft) {
            let ttft = count(signals.ttft_p99_seconds)
                .or((fleet.ttft_p99_seconds.is_none() && idle).then_some(0.0));
            put(Metric::TtftP99Seconds, ttft);
        }
        put(Metric::HeldRequests, count(fleet.held_requests));
        if reporting > 0 {
            put(
                Metric::RecommendedReplicas,
                recommended.map(|r| f64::from(r.max(0))),
            );
        }
        let pods = fleet
            .replicas
            .iter()
            .map(|r| {
                let mut values = BTreeMap::new();
                if exported(Family::KvUsage)
                    && let Some(v) = ratio(Some(r.kv_usage))
                {
                    values.insert(Metric::KvCacheUsage, v);
                }
                if exported(Family::Waiting)
                    && let Some(v) = count(Some(r.capacity_waiting))
                {
                    values.insert(Metric::CapacityWaiting, v);
                }
                PodValues {
                    name: r.name.clone(),
                    values,
                }
            })
            .collect();
        let held = count(fleet.held_requests);
        let in_flight = (reporting > 0 || held.is_some()).then(|| {
            let engines: f64 = fleet
                .replicas
                .iter()
                .map(|r| r.running + r.capacity_waiting + r.deferred_waiting)
                .filter(|x| x.is_finite() && *x >= 0.0)
                .sum();
            engines + held.unwrap_or(0.0)
        });
        Record {
            scraped_at,
            published: Instant::now(),
            interval,
            values,
            pods,
            pod_labels,
            in_flight,
        }
    }

    /// Whether the record is too old to serve at `now`.
    pub fn stale(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.published) > self.interval * STALE_PERIODS
    }
}

/// A resource by namespace and name.
type Key = (String, String);

/// Every InferenceService's last record, shared by the reconciler (writer) and the
/// metrics-API server (reader).
#[derive(Debug, Default)]
pub struct Board {
    records: RwLock<HashMap<Key, Record>>,
}

impl Board {
    /// Replaces `ns/name`'s record.
    pub fn publish(&self, ns: &str, name: &str, record: Record) {
        self.write()
            .insert((ns.to_string(), name.to_string()), record);
    }

    /// Forgets `ns/name` (deleted).
    pub fn forget(&self, ns: &str, name: &str) {
        self.write().remove(&(ns.to_string(), name.to_string()));
    }

    /// `ns/name`'s record, if it has one that is not stale at `now`.
    pub fn get(&self, ns: &str, name: &str, now: Instant) -> Option<Record> {
        self.read()
            .get(&(ns.to_string(), name.to_string()))
            .filter(|r| !r.stale(now))
            .cloned()
    }

    /// Every fresh record in `ns`, by service name.
    pub fn in_namespace(&self, ns: &str, now: Instant) -> BTreeMap<String, Record> {
        self.read()
            .iter()
            .filter(|((n, _), r)| n == ns && !r.stale(now))
            .map(|((_, name), r)| (name.clone(), r.clone()))
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Key, Record>> {
        self.records.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Key, Record>> {
        self.records.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::ReplicaSignals;
    use std::collections::BTreeSet;

    fn replica(name: &str, waiting: f64, kv: f64) -> ReplicaSignals {
        ReplicaSignals {
            name: name.into(),
            running: 1.0,
            capacity_waiting: waiting,
            kv_usage: kv,
            ..ReplicaSignals::default()
        }
    }

    fn fleet(exported: &[Family]) -> FleetSignals {
        FleetSignals {
            replicas: vec![replica("a", 3.0, 0.5), replica("b", 1.0, 0.9)],
            ready: 2,
            capacity_waiting: Some(4.0),
            deferred_waiting: Some(0.0),
            kv_usage: Some(0.7),
            exported: Some(exported.iter().copied().collect::<BTreeSet<_>>()),
            ..FleetSignals::default()
        }
    }

    fn signals() -> Signals {
        Signals {
            capacity_waiting: Some(4.0),
            deferred_waiting: Some(0.0),
            kv_cache_usage: Some(0.7),
            admission_rejections_per_second: Some(0.25),
            ttft_p99_seconds: Some(0.4),
            ..Signals::default()
        }
    }

    fn record(f: &FleetSignals, s: &Signals) -> Record {
        Record::of(
            f,
            s,
            Some(3),
            SystemTime::now(),
            Duration::from_secs(5),
            BTreeMap::new(),
        )
    }

    #[test]
    fn held_requests_are_served_also_at_zero_replicas() {
        let zero = FleetSignals {
            held_requests: Some(5.0),
            capacity_waiting: Some(5.0),
            ..FleetSignals::default()
        };
        let r = record(&zero, &Signals::default());
        assert_eq!(r.values.get(&Metric::HeldRequests), Some(&5.0));
        assert_eq!(
            r.in_flight,
            Some(5.0),
            "KEDA's IsActive sees the held requests"
        );
        assert!(!r.values.contains_key(&Metric::RecommendedReplicas));
        let none = record(&FleetSignals::default(), &Signals::default());
        assert!(!none.values.contains_key(&Metric::HeldRequests));
        assert_eq!(none.in_flight, None);
    }

    #[test]
    fn values_are_the_periods_per_replica_and_fleet_values() {
        let all = [
            Family::Waiting,
            Family::KvUsage,
            Family::Rejections,
            Family::Ttft,
        ];
        let r = record(&fleet(&all), &signals());
        let v = |m| r.values.get(&m).copied();
        assert_eq!(v(Metric::CapacityWaitingPerReplica), Some(2.0));
        assert_eq!(v(Metric::KvCacheUsage), Some(0.7));
        assert_eq!(
            v(Metric::AdmissionRejectionsPerSecondPerReplica),
            Some(0.25)
        );
        assert_eq!(v(Metric::DeferredWaiting), Some(0.0), "0 is a value");
        assert_eq!(v(Metric::TtftP99Seconds), Some(0.4));
        assert_eq!(v(Metric::RecommendedReplicas), Some(3.0));
        assert_eq!(r.pods[1].values[&Metric::KvCacheUsage], 0.9);
        assert_eq!(r.pods[0].values[&Metric::CapacityWaiting], 3.0);
        // Running (1 each) and waiting (3 and 1) over both replicas.
        assert_eq!(r.in_flight, Some(6.0));
    }

    #[test]
    fn not_exported_missing_and_unreported_are_absent() {
        // vLLM without the admission counter: absent, not 0.
        let f = fleet(&[Family::Waiting, Family::KvUsage, Family::Ttft]);
        let s = Signals {
            ttft_p99_seconds: None,
            deferred_waiting: None,
            ..signals()
        };
        let r = record(&f, &s);
        assert!(
            !r.values
                .contains_key(&Metric::AdmissionRejectionsPerSecondPerReplica)
        );
        assert!(!r.values.contains_key(&Metric::DeferredWaiting));
        assert!(
            !r.values.contains_key(&Metric::TtftP99Seconds),
            "busy replicas without a TTFT: missing"
        );
        // Garbage is absent too.
        let r = record(
            &f,
            &Signals {
                kv_cache_usage: Some(f64::NAN),
                ..signals()
            },
        );
        assert!(!r.values.contains_key(&Metric::KvCacheUsage));
        // No replica reported (every scrape failed): nothing at all.
        let none = FleetSignals {
            replicas: vec![],
            ..f
        };
        let r = record(&none, &signals());
        assert!(r.values.is_empty(), "{:?}", r.values);
        assert_eq!(r.in_flight, None, "no replica: unknown, not idle");
    }

    #[test]
    fn an_idle_fleet_has_a_zero_ttft() {
        let mut f = fleet(&[Family::Waiting, Family::Ttft]);
        for r in &mut f.replicas {
            r.running = 0.0;
            r.capacity_waiting = 0.0;
        }
        let s = Signals {
            ttft_p99_seconds: None,
            ..signals()
        };
        assert_eq!(record(&f, &s).values[&Metric::TtftP99Seconds], 0.0);
    }

    #[test]
    fn stale_records_are_not_served() {
        let board = Board::default();
        let r = record(&fleet(&[Family::Waiting]), &signals());
        let published = r.published;
        board.publish("ns", "chat", r);
        assert!(board.get("ns", "chat", published).is_some());
        assert!(
            board
                .get("ns", "chat", published + Duration::from_secs(16))
                .is_none(),
            "older than 3 periods of 5 s"
        );
        assert_eq!(board.in_namespace("ns", published).len(), 1);
        assert!(board.in_namespace("other", published).is_empty());
        board.forget("ns", "chat");
        assert!(board.get("ns", "chat", published).is_none());
    }

    #[test]
    fn metric_names_round_trip() {
        for m in Metric::SERVICE.iter().chain(&Metric::POD) {
            assert_eq!(Metric::parse(m.as_str()), Some(*m));
        }
        assert_eq!(Metric::parse("nope"), None);
    }
}
