//! Rebalancing: which replicas take new traffic, and DP weights inside a replica.
//!
//! - A replica is *hot* when its KV usage (max over ranks) is above `hotKvCacheUsage` or
//!   its capacity-waiting requests are above `hotCapacityWaiting`. Hot replicas are taken
//!   out of rotation only while the fleet as a whole has headroom (every signal at or
//!   under its target): when the whole fleet is hot, that is a scale-up, and taking
//!   replicas out would only shrink capacity. The hottest go first.
//! - A replica out of rotation returns only once it is *cool*: KV usage below
//!   `coolFraction × hotKvCacheUsage` **and** waiting below `coolFraction ×
//!   hotCapacityWaiting` (both known). Between cool and hot it stays where it is
//!   (hysteresis), and without a usable sample it stays where it is.
//! - At least `minAccepting` ready replicas always take traffic: taking out stops there,
//!   and if fewer accept (replicas died), replicas out of rotation return, coolest first,
//!   whatever the signals say.
//! - With unusable metrics nothing is taken out or restored on signals, and no DP weights
//!   are proposed; only the `minAccepting` guarantee acts.
//! - With rebalancing disabled, every replica still out returns.

use std::collections::BTreeMap;

use ballast_crds::RebalancingSpec;

use super::dp;
use super::explain::{list, num};
use super::input::DecideInput;
use super::outcome::{Reason, RebalancePlan};
use crate::signals::ReplicaSignals;

/// A rebalancing step with its explanation.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Rebalance {
    pub plan: RebalancePlan,
    /// Why, when the plan changes something.
    pub reason: Option<Reason>,
    /// One line; may be non-empty with an empty plan (a hot replica left in rotation).
    pub message: String,
}

/// The KV usage, when a real ratio.
fn kv(r: &ReplicaSignals) -> Option<f64> {
    Some(r.kv_usage).filter(|v| v.is_finite() && (0.0..=1.0).contains(v))
}

/// The capacity-waiting count, when a real count.
fn waiting(r: &ReplicaSignals) -> Option<f64> {
    Some(r.capacity_waiting).filter(|v| v.is_finite() && *v >= 0.0)
}

/// How hot a replica is: the largest of its values over their hot thresholds (> 1 is
/// hot). `None` when neither value is usable.
fn heat(r: &ReplicaSignals, s: &RebalancingSpec) -> Option<f64> {
    let k = kv(r).map(|v| v / s.hot_kv_cache_usage);
    let w = waiting(r).map(|v| v / s.hot_capacity_waiting);
    match (k, w) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
    .filter(|h| h.is_finite())
}

fn is_cool(r: &ReplicaSignals, s: &RebalancingSpec) -> bool {
    match (kv(r), waiting(r)) {
        (Some(k), Some(w)) => {
            k < s.cool_fraction * s.hot_kv_cache_usage
                && w < s.cool_fraction * s.hot_capacity_waiting
        }
        _ => false,
    }
}

/// Why a replica is hot, e.g. "KV 0.97 > 0.95".
fn hot_phrase(r: &ReplicaSignals, s: &RebalancingSpec) -> String {
    let mut parts = Vec::new();
    if let Some(k) = kv(r).filter(|k| *k > s.hot_kv_cache_usage) {
        parts.push(format!("KV {} > {}", num(k), num(s.hot_kv_cache_usage)));
    }
    if let Some(w) = waiting(r).filter(|w| *w > s.hot_capacity_waiting) {
        parts.push(format!(
            "{} waiting > {}",
            num(w),
            num(s.hot_capacity_waiting)
        ));
    }
    parts.join(", ")
}

/// Plans this period's routing changes. `metrics_ok`: enough replicas reported;
/// `headroom`: every fleet signal is at or under its target.
pub(crate) fn plan(input: &DecideInput, metrics_ok: bool, headroom: bool) -> Rebalance {
    let s = &input.rebalancing;
    let out = &input.out_of_rotation;
    if !s.enabled {
        if out.is_empty() {
            return Rebalance::default();
        }
        let restore: Vec<String> = out.iter().cloned().collect();
        return Rebalance {
            message: format!("rebalancing disabled: {} back in rotation", list(&restore)),
            plan: RebalancePlan {
                restore,
                ..RebalancePlan::default()
            },
            reason: Some(Reason::RebalancingDisabled),
        };
    }

    let reporting: BTreeMap<&str, &ReplicaSignals> = input
        .fleet
        .replicas
        .iter()
        .map(|r| (r.name.as_str(), r))
        .collect();
    let ready = input.fleet.ready.max(input.fleet.reporting());
    let min_accepting = usize::try_from(s.min_accepting.max(1)).unwrap_or(1);
    let mut messages = Vec::new();

    let mut restore: Vec<String> = Vec::new();
    if metrics_ok {
        for name in out {
            if reporting.get(name.as_str()).is_some_and(|r| is_cool(r, s)) {
                restore.push(name.clone());
            }
        }
        if !restore.is_empty() {
            messages.push(format!(
                "{} cooled below {} of the hot thresholds: back in rotation",
                list(&restore),
                num(s.cool_fraction)
            ));
        }
    }
    let mut accepting = ready.saturating_sub(out.len() - restore.len());

    let mut take_out: Vec<String> = Vec::new();
    if metrics_ok {
        let mut hot: Vec<(f64, &ReplicaSignals)> = reporting
            .values()
            .filter(|r| !out.contains(&r.name))
            .filter_map(|r| heat(r, s).filter(|h| *h > 1.0).map(|h| (h, *r)))
            .collect();
        hot.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
        if headroom && !hot.is_empty() {
            let allowed = accepting.saturating_sub(min_accepting);
            for (_, r) in hot.iter().take(allowed) {
                messages.push(format!("{} hot ({})", r.name, hot_phrase(r, s)));
                take_out.push(r.name.clone());
            }
            accepting -= take_out.len();
            if !take_out.is_empty() {
                messages.push(format!(
                    "out of rotation while the fleet has headroom, {accepting} of {ready} accepting"
                ));
            }
            if hot.len() > take_out.len() {
                let kept: Vec<&str> = hot[take_out.len()..]
                    .iter()
                    .map(|(_, r)| r.name.as_str())
                    .collect();
                messages.push(format!(
                    "{} hot but kept in rotation to keep {min_accepting} accepting",
                    list(&kept)
                ));
            }
        } else if !hot.is_empty() {
            let names: Vec<&str> = hot.iter().map(|(_, r)| r.name.as_str()).collect();
            messages.push(format!(
                "{} hot but the fleet has no headroom to move traffic to",
                list(&names)
            ));
        }
    }

    // The minAccepting guarantee acts whatever the signals say.
    let mut returned: Vec<String> = Vec::new();
    if accepting < min_accepting {
        let mut candidates: Vec<(f64, &String)> = out
            .iter()
            .filter(|n| !restore.contains(n))
            .map(|n| {
                let h = reporting
                    .get(n.as_str())
                    .and_then(|r| heat(r, s))
                    .unwrap_or(f64::INFINITY);
                (h, n)
            })
            .collect();
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        for (_, n) in candidates {
            if accepting >= min_accepting {
                break;
            }
            returned.push(n.clone());
            accepting += 1;
        }
        if !returned.is_empty() {
            messages.push(format!(
                "{} back in rotation to keep {min_accepting} accepting",
                list(&returned)
            ));
        }
    }

    let mut dp_weights = Vec::new();
    if metrics_ok {
        for r in reporting.values() {
            let current = input.dp_weights.get(&r.name).map(Vec::as_slice);
            if let Some(w) = dp::propose(r, current, s.dp_imbalance_ratio) {
                let shown: Vec<String> = w.weights.iter().map(|x| num(*x)).collect();
                messages.push(format!(
                    "{} DP imbalance {} > {}: rank weights {}",
                    w.replica,
                    num(w.imbalance_ratio),
                    num(s.dp_imbalance_ratio),
                    shown.join("/")
                ));
                dp_weights.push(w);
            }
        }
    }

    let reason = if !returned.is_empty() {
        Some(Reason::MinAccepting)
    } else if !take_out.is_empty() {
        Some(Reason::ReplicaHot)
    } else if !restore.is_empty() {
        Some(Reason::ReplicaCooled)
    } else if !dp_weights.is_empty() {
        Some(Reason::DpImbalance)
    } else {
        None
    };
    restore.extend(returned);
    Rebalance {
        plan: RebalancePlan {
            take_out,
            restore,
            dp_weights,
        },
        reason,
        message: messages.join("; "),
    }
}
