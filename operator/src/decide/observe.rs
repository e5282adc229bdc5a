//! Turning the scraper's fleet view into values the decision may act on.
//!
//! Anything not a finite, in-range number is *missing*, never zero: a NaN or a negative
//! count from a broken exposition must not look like an idle fleet (the KEDA default of
//! reading an empty query as 0 has scaled real fleets to their minimum).

use ballast_crds::Signals;

use super::input::{DecideInput, SignalName};
use crate::signals::{FleetSignals, ReplicaSignals};

/// A count or rate: finite and not negative.
pub(crate) fn count(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0)
}

/// A usage ratio: finite and within [0, 1].
pub(crate) fn ratio(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && (0.0..=1.0).contains(x))
}

/// The fleet signals as they will be shown in status, garbage replaced by null.
pub(crate) fn sanitized(fleet: &FleetSignals) -> Signals {
    Signals {
        capacity_waiting: count(fleet.capacity_waiting),
        deferred_waiting: count(fleet.deferred_waiting),
        kv_cache_usage: ratio(fleet.kv_usage),
        admission_rejections_per_second: count(fleet.rejections_per_second_per_replica),
        ttft_p99_seconds: count(fleet.ttft_p99_seconds),
        held_requests: count(fleet.held_requests),
        oldest_hold_seconds: count(fleet.oldest_hold_seconds),
    }
}

/// Whether enough replicas reported to act on (contract §3: too few → hold).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Health {
    /// Enough ready replicas reported.
    Ok,
    /// No replica exists, ready or starting.
    NoReplicas,
    /// Replicas exist but none is ready yet.
    Starting,
    /// Ready replicas exist but none reported.
    Unavailable,
    /// Fewer than `minReportingFraction` of the ready replicas reported.
    Stale { reporting: usize, ready: usize },
}

impl Health {
    /// Judges this period's reporting.
    pub(crate) fn of(input: &DecideInput) -> Health {
        let f = &input.fleet;
        let reporting = f.reporting();
        // A replica that reported was ready when scraped, whatever the count says.
        let ready = f.ready.max(reporting);
        let fraction = input.metrics.min_reporting_fraction;
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            1.0
        };
        if ready == 0 {
            if f.starting > 0 {
                Health::Starting
            } else {
                Health::NoReplicas
            }
        } else if reporting == 0 {
            Health::Unavailable
        } else if (reporting as f64) < fraction * ready as f64 - 1e-9 {
            Health::Stale { reporting, ready }
        } else {
            Health::Ok
        }
    }
}

/// What one configured signal shows this period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Observed {
    /// A usable value. `compared` is what the target is compared with (per replica for
    /// capacity waiting); `fleet` is the value as aggregated, for messages.
    Value { compared: f64, fleet: f64 },
    /// TTFT with no request in the period while every reporting replica is idle: there is
    /// no latency to speak of, so it counts as 0 s instead of blocking scale-down as a
    /// missing signal would.
    Idle,
    /// No usable value (not reported, NaN, out of range, or an unusable target), while
    /// the replicas do export it or what they export is not known: blocks scale-down.
    Missing,
    /// No replica's latest successful scrape carried the signal's family
    /// ([`FleetSignals::lacks`]): these replicas do not export it, and the target is
    /// ignored.
    NotExported,
}

/// One configured signal and what it shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Observation {
    pub signal: SignalName,
    pub target: f64,
    pub observed: Observed,
}

impl Observation {
    /// The value compared with the target, when there is one.
    pub(crate) fn compared(&self) -> Option<f64> {
        match self.observed {
            Observed::Value { compared, .. } => Some(compared),
            Observed::Idle => Some(0.0),
            Observed::Missing | Observed::NotExported => None,
        }
    }
}

/// Every signal with a target, in [`SignalName::ALL`] order.
pub(crate) fn observe(input: &DecideInput, signals: &Signals) -> Vec<Observation> {
    let reporting = input.fleet.reporting();
    SignalName::ALL
        .iter()
        .filter_map(|&signal| {
            let target = signal.target(&input.autoscaling)?;
            let observed = if input.fleet.lacks(signal.family()) {
                Observed::NotExported
            } else if !(target.is_finite() && target > 0.0) || reporting == 0 {
                Observed::Missing
            } else {
                observe_one(signal, signals, &input.fleet)
            };
            Some(Observation {
                signal,
                target,
                observed,
            })
        })
        .collect()
}

fn observe_one(signal: SignalName, s: &Signals, fleet: &FleetSignals) -> Observed {
    let reporting = fleet.reporting() as f64;
    let value = |fleet_value: Option<f64>, per_replica: bool| match fleet_value {
        Some(v) => Observed::Value {
            compared: if per_replica { v / reporting } else { v },
            fleet: v,
        },
        None => Observed::Missing,
    };
    match signal {
        SignalName::CapacityWaiting => value(s.capacity_waiting, true),
        SignalName::KvCacheUsage => value(s.kv_cache_usage, false),
        SignalName::AdmissionRejectionsPerSecond => value(s.admission_rejections_per_second, false),
        // Only a TTFT that is absent (no observation) can mean idle; a garbage one is
        // missing like any other garbage.
        SignalName::TtftP99Seconds
            if fleet.ttft_p99_seconds.is_none() && fleet.replicas.iter().all(is_idle) =>
        {
            Observed::Idle
        }
        SignalName::TtftP99Seconds => value(s.ttft_p99_seconds, false),
    }
}

/// No request running, waiting or deferred (and the numbers are real numbers).
pub(crate) fn is_idle(r: &ReplicaSignals) -> bool {
    r.running == 0.0 && r.capacity_waiting == 0.0 && r.deferred_waiting == 0.0
}

/// Waiting is mostly deferred: deferred requests at least as many as those waiting for
/// capacity, and some. Deferred requests wait on their tenant's cap, which more replicas
/// do not lift.
pub(crate) fn deferred_dominates(s: &Signals) -> bool {
    let deferred = s.deferred_waiting.unwrap_or(0.0);
    deferred > 0.0 && deferred >= s.capacity_waiting.unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_missing_not_zero() {
        assert_eq!(count(Some(f64::NAN)), None);
        assert_eq!(count(Some(f64::INFINITY)), None);
        assert_eq!(count(Some(-1.0)), None);
        assert_eq!(count(Some(0.0)), Some(0.0));
        assert_eq!(ratio(Some(1.5)), None);
        assert_eq!(ratio(Some(0.5)), Some(0.5));
    }

    #[test]
    fn deferred_threshold() {
        let s = |c: Option<f64>, d: Option<f64>| Signals {
            capacity_waiting: c,
            deferred_waiting: d,
            ..Signals::default()
        };
        assert!(deferred_dominates(&s(Some(3.0), Some(3.0))));
        assert!(deferred_dominates(&s(None, Some(1.0))));
        assert!(!deferred_dominates(&s(Some(4.0), Some(3.0))));
        assert!(!deferred_dominates(&s(Some(0.0), Some(0.0))));
        assert!(!deferred_dominates(&s(Some(0.0), None)));
    }
}
