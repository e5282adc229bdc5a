//! What the live fleet page plots: per service, one sample per control period (replicas by
//! state, each configured signal against its target) and the decision timeline, kept for
//! a bounded window and served by `GET /api/timeline`.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::decide::{Outcome, SignalState};
use ballast_crds::Action;

/// Samples kept per service: 30 minutes at the default 2 s period.
pub const MAX_SAMPLES: usize = 900;
/// Decisions kept per service.
pub const MAX_DECISIONS: usize = 200;

/// Replica counts at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Replicas {
    /// Ready replicas (in rotation or not).
    pub ready: i32,
    /// Replicas starting.
    pub starting: i32,
    /// Replicas draining.
    pub draining: i32,
    /// Ready replicas in the router's rotation.
    pub accepting: i32,
    /// Replicas the operator wants.
    pub desired: i32,
}

/// One configured signal at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalPoint {
    /// The value compared with the target (per replica for capacity waiting); `None` when
    /// missing.
    pub observed: Option<f64>,
    /// The target.
    pub target: f64,
    /// `above`, `within`, `below`, `missing` or `unsupported`.
    pub state: &'static str,
}

/// One control period of one service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Unix time, seconds.
    pub t: f64,
    /// Replica counts after the decision was acted on.
    pub replicas: Replicas,
    /// Each configured signal, by its status name (`capacityWaiting`, ...).
    pub signals: BTreeMap<&'static str, SignalPoint>,
}

/// A decision worth a line on the timeline: every one that changed something, and a hold
/// whose reason differs from the previous line's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionPoint {
    /// Unix time, seconds.
    pub t: f64,
    /// `ScaleUp`, `ScaleDown`, `Rebalance` or `Hold`.
    pub action: &'static str,
    /// The stable reason word.
    pub reason: &'static str,
    /// One line for people.
    pub message: String,
    /// Replicas before.
    pub from: i32,
    /// Replicas after.
    pub to: i32,
}

/// One service's history.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServiceTimeline {
    /// Oldest first.
    pub samples: VecDeque<Sample>,
    /// Oldest first.
    pub decisions: VecDeque<DecisionPoint>,
}

/// Every service's history.
#[derive(Debug, Default)]
pub struct Timeline {
    services: BTreeMap<String, ServiceTimeline>,
}

/// Unix time now, in seconds, to the millisecond.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, seconds_to_the_millisecond)
}

/// `since` compares times that went out as JSON and came back in a query, so each must
/// survive the trip exactly through any client's parser. A time as precise as the clock
/// takes 17 significant digits, which parsers without exact float reading (serde_json's
/// default among them) may read one unit in the last place off, so a client asking for what
/// is newer than the last time it saw gets that sample again. Milliseconds keep 13 digits,
/// which every parser reads exactly.
fn seconds_to_the_millisecond(d: Duration) -> f64 {
    // Exact: the milliseconds since 1970 fit in 2^53, and the quotient is correctly rounded.
    d.as_millis() as f64 / 1000.0
}

fn state_word(s: SignalState) -> &'static str {
    match s {
        SignalState::Above => "above",
        SignalState::Within => "within",
        SignalState::Below => "below",
        SignalState::Missing => "missing",
        SignalState::Unsupported => "unsupported",
    }
}

impl Timeline {
    /// Records one control period of `service` at `t`: its replicas after acting and the
    /// decision.
    pub fn record(&mut self, service: &str, t: f64, replicas: Replicas, outcome: &Outcome) {
        let entry = self.services.entry(service.to_string()).or_default();
        let signals = outcome
            .reports
            .iter()
            .map(|r| {
                (
                    r.signal.as_str(),
                    SignalPoint {
                        observed: r.observed.filter(|v| v.is_finite()),
                        target: r.target,
                        state: state_word(r.state),
                    },
                )
            })
            .collect();
        push_bounded(
            &mut entry.samples,
            Sample {
                t,
                replicas,
                signals,
            },
            MAX_SAMPLES,
        );
        let reason = outcome.reason.as_str();
        let worth_a_line = outcome.action != Action::Hold
            || entry.decisions.back().is_none_or(|d| d.reason != reason);
        if worth_a_line {
            push_bounded(
                &mut entry.decisions,
                DecisionPoint {
                    t,
                    action: outcome.action.as_str(),
                    reason,
                    message: outcome.message.clone(),
                    from: outcome.current_replicas,
                    to: outcome.desired_replicas,
                },
                MAX_DECISIONS,
            );
        }
    }

    /// Every service's samples and decisions newer than `since` (Unix seconds; 0 for
    /// everything kept). Services without anything new are still listed, empty, so the
    /// page knows every service from the first answer.
    pub fn since(&self, since: f64) -> BTreeMap<String, ServiceTimeline> {
        self.services
            .iter()
            .map(|(name, s)| {
                (
                    name.clone(),
                    ServiceTimeline {
                        samples: s.samples.iter().filter(|x| x.t > since).cloned().collect(),
                        decisions: s
                            .decisions
                            .iter()
                            .filter(|x| x.t > since)
                            .cloned()
                            .collect(),
                    },
                )
            })
            .collect()
    }

    /// Makes `service` known before its first control period.
    pub fn add_service(&mut self, service: &str) {
        self.services.entry(service.to_string()).or_default();
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, item: T, cap: usize) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(item);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{DecideInput, History, decide};
    use crate::signals::FleetSignals;

    fn outcome(current: i32) -> Outcome {
        let spec: ballast_crds::InferenceServiceSpec = serde_json::from_value(serde_json::json!({
            "model": {"source": "synthetic:tiny"},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 4}
        }))
        .unwrap();
        let input = DecideInput::new(&spec, current, FleetSignals::default());
        decide(
            &input,
            &History::default(),
            std::time::Duration::from_secs(100),
        )
    }

    #[test]
    fn holds_with_the_same_reason_make_one_line_and_samples_are_bounded() {
        let mut tl = Timeline::default();
        let o = outcome(1);
        for i in 0..(MAX_SAMPLES + 10) {
            tl.record("chat", (i + 1) as f64, Replicas::default(), &o);
        }
        let all = tl.since(0.0);
        assert_eq!(all["chat"].samples.len(), MAX_SAMPLES);
        assert_eq!(all["chat"].samples[0].t, 11.0);
        assert_eq!(
            all["chat"].decisions.len(),
            1,
            "{:?}",
            all["chat"].decisions
        );
        assert_eq!(all["chat"].decisions[0].t, 1.0);
        // Only what is newer than `since`.
        let recent = tl.since(MAX_SAMPLES as f64 + 8.0);
        assert_eq!(recent["chat"].samples.len(), 2);
        assert!(recent["chat"].decisions.is_empty());
    }

    #[test]
    fn a_scale_decision_always_makes_a_line() {
        let mut tl = Timeline::default();
        // Below minReplicas: ScaleUp each time.
        let up = outcome(0);
        assert_eq!(up.action, Action::ScaleUp);
        tl.record("chat", 1.0, Replicas::default(), &up);
        tl.record("chat", 2.0, Replicas::default(), &up);
        let d = &tl.since(0.0)["chat"].decisions;
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].from, d[0].to), (0, 1));
        assert_eq!(d[0].action, "ScaleUp");
    }

    #[test]
    fn times_come_back_exactly_through_a_plain_json_parser() {
        // Over a day of instants from late 2026, as precise as the system clock's, each
        // time read back by serde_json's default (not exact) float reader equals the one
        // sent.
        let start = Duration::from_secs(1_796_000_000);
        for i in 0..100_000u64 {
            let d = start + Duration::from_nanos(i * 863_977_123);
            let t = seconds_to_the_millisecond(d);
            let back: f64 = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
            assert_eq!(back.to_bits(), t.to_bits(), "{d:?} went out as {t}");
            assert!(
                (t - d.as_secs_f64()).abs() <= 1.001e-3,
                "{d:?} went out as {t}"
            );
        }
    }

    #[test]
    fn known_services_are_listed_before_any_sample() {
        let mut tl = Timeline::default();
        tl.add_service("chat");
        let all = tl.since(0.0);
        assert!(all["chat"].samples.is_empty());
    }
}
