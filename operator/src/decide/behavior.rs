//! HPA's `behavior`: stabilisation windows, then rate policies and the min/max clamp.
//!
//! Follows `stabilizeRecommendationWithBehaviors`, `convertDesiredReplicasWithBehaviorRate`
//! and `calculateScale{Up,Down}Limit…` in Kubernetes'
//! `pkg/controller/podautoscaler/horizontal.go` (v2 behaviour, current form), on rules
//! whose unset fields were filled from HPA's per-direction defaults
//! ([`BehaviorSpec::resolved`](ballast_crds::BehaviorSpec::resolved), as Kubernetes'
//! `GenerateHPAScale{Up,Down}Rules`):
//!
//! - Stabilisation: `up` = the lowest recommendation within the scale-up window, `down` =
//!   the highest within the scale-down window, both including this period's; the result is
//!   the current size brought into `[up, down]`. So a scale-down happens only to the
//!   highest recommendation of the whole down window, a scale-up only to the lowest of the
//!   up window.
//! - Rate: for each policy, the replicas at the start of its period are
//!   `current − added + removed` over the scale events strictly newer than
//!   `now − periodSeconds`; `Pods` adds/removes `value`, `Percent` allows
//!   `ceil(start × (1 + value/100))` up and `floor(start × (1 − value/100))` down.
//!   `selectPolicy: Max` takes the policy allowing the largest change, `Min` the smallest,
//!   `Disabled` allows none. A limit never goes past the current size (no change rather
//!   than a reversal) and is then combined with `maxReplicas`/`minReplicas`.
//!
//! Ballast differences, both deliberate: percentages are computed in integers
//! (`10 × 110 %` is 11, where HPA's float64 arithmetic yields 11.000000000000002 and
//! allows 12), and an empty policy list takes the direction's default policies like an
//! unset one (HPA's API refuses an empty list).

use std::time::Duration;

use ballast_crds::{PolicyType, ResolvedBehavior, ResolvedRules, SelectPolicy};

use super::history::{ScaleEvent, TimedRecommendation, in_window};

/// Brings `current` into the window bounds (see the module docs).
pub(crate) fn stabilize(
    current: i32,
    recommended: i32,
    past: &[TimedRecommendation],
    behavior: &ResolvedBehavior,
    now: Duration,
) -> i32 {
    let up_window = window(&behavior.scale_up);
    let down_window = window(&behavior.scale_down);
    let mut up = recommended;
    let mut down = recommended;
    for r in past {
        if in_window(r.at, up_window, now) {
            up = up.min(r.replicas);
        }
        if in_window(r.at, down_window, now) {
            down = down.max(r.replicas);
        }
    }
    current.max(up).min(down)
}

/// A rules' stabilisation window.
pub(crate) fn window(rules: &ResolvedRules) -> Duration {
    Duration::from_secs(u64::try_from(rules.stabilization_window_seconds).unwrap_or(0))
}

/// The longest policy period of either direction (scale events older than this are unused:
/// both directions' events enter both limits).
pub(crate) fn longest_period(behavior: &ResolvedBehavior) -> Duration {
    let secs = [&behavior.scale_up, &behavior.scale_down]
        .iter()
        .flat_map(|r| r.policies.iter())
        .map(|p| p.period_seconds)
        .max()
        .unwrap_or(0);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// Why the rate step changed the stabilised recommendation (HPA's `ScalingLimited` reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cap {
    /// Capped at `maxReplicas`.
    TooManyReplicas,
    /// Capped by a scale-up policy (or `selectPolicy: Disabled`).
    ScaleUpLimit,
    /// Floored at `minReplicas`.
    TooFewReplicas,
    /// Floored by a scale-down policy (or `selectPolicy: Disabled`).
    ScaleDownLimit,
}

impl Cap {
    /// The condition reason word.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Cap::TooManyReplicas => "TooManyReplicas",
            Cap::ScaleUpLimit => "ScaleUpLimit",
            Cap::TooFewReplicas => "TooFewReplicas",
            Cap::ScaleDownLimit => "ScaleDownLimit",
        }
    }

    /// HPA's condition message.
    pub(crate) fn message(self) -> &'static str {
        match self {
            Cap::TooManyReplicas => {
                "the desired replica count is more than the maximum replica count"
            }
            Cap::ScaleUpLimit => {
                "the desired replica count is increasing faster than the maximum scale rate"
            }
            Cap::TooFewReplicas => {
                "the desired replica count is less than the minimum replica count"
            }
            Cap::ScaleDownLimit => {
                "the desired replica count is decreasing faster than the maximum scale rate"
            }
        }
    }
}

/// Bounds for one step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub current: i32,
    pub min: i32,
    pub max: i32,
}

/// Applies the rate policies and the min/max clamp to a stabilised recommendation.
pub(crate) fn limit(
    desired: i32,
    b: Bounds,
    behavior: &ResolvedBehavior,
    events: &[ScaleEvent],
    now: Duration,
) -> (i32, Option<Cap>) {
    let current = i64::from(b.current);
    if desired > b.current {
        let rate = scale_up_limit(current, events, &behavior.scale_up, now).max(current);
        let (cap, why) = if i64::from(b.max) > rate {
            (rate, Cap::ScaleUpLimit)
        } else {
            (i64::from(b.max), Cap::TooManyReplicas)
        };
        if i64::from(desired) > cap {
            return (to_i32(cap), Some(why));
        }
    } else if desired < b.current {
        let rate = scale_down_limit(current, events, &behavior.scale_down, now).min(current);
        let (floor, why) = if i64::from(b.min) < rate {
            (rate, Cap::ScaleDownLimit)
        } else {
            (i64::from(b.min), Cap::TooFewReplicas)
        };
        if i64::from(desired) < floor {
            return (to_i32(floor), Some(why));
        }
    }
    (desired, None)
}

fn to_i32(v: i64) -> i32 {
    v.clamp(0, i64::from(i32::MAX)) as i32
}

/// Replicas added and removed by events inside the period ending at `now`.
fn changes(events: &[ScaleEvent], period_seconds: i32, now: Duration) -> (i64, i64) {
    let period = Duration::from_secs(u64::try_from(period_seconds).unwrap_or(0));
    events
        .iter()
        .filter(|e| in_window(e.at, period, now))
        .fold((0, 0), |(a, r), e| (a + e.added(), r + e.removed()))
}

/// The replicas each valid policy allows, with the period-start count for each.
fn proposals<'a>(
    current: i64,
    events: &'a [ScaleEvent],
    rules: &'a ResolvedRules,
    now: Duration,
    up: bool,
) -> impl Iterator<Item = i64> + 'a {
    rules
        .policies
        .iter()
        .filter(|p| p.value > 0 && p.period_seconds > 0)
        .map(move |p| {
            let (added, removed) = changes(events, p.period_seconds, now);
            let start = (current - added + removed).max(0);
            let v = i64::from(p.value);
            match (p.type_, up) {
                (PolicyType::Pods, true) => start + v,
                (PolicyType::Pods, false) => start - v,
                // ceil(start × (100 + v) / 100)
                (PolicyType::Percent, true) => (start * (100 + v) + 99).div_euclid(100),
                // floor(start × (100 − v) / 100)
                (PolicyType::Percent, false) => (start * (100 - v)).div_euclid(100),
            }
        })
}

/// The most replicas the scale-up rules allow now.
fn scale_up_limit(
    current: i64,
    events: &[ScaleEvent],
    rules: &ResolvedRules,
    now: Duration,
) -> i64 {
    if rules.select_policy == SelectPolicy::Disabled {
        return current;
    }
    let mut p = proposals(current, events, rules, now, true).peekable();
    // Only policies the CRD refuses (a value or period not above 0) leave none.
    if p.peek().is_none() {
        return i64::MAX;
    }
    match rules.select_policy {
        SelectPolicy::Disabled => current,
        SelectPolicy::Max => p.max().unwrap_or(current),
        SelectPolicy::Min => p.min().unwrap_or(current),
    }
}

/// The fewest replicas the scale-down rules allow now.
fn scale_down_limit(
    current: i64,
    events: &[ScaleEvent],
    rules: &ResolvedRules,
    now: Duration,
) -> i64 {
    if rules.select_policy == SelectPolicy::Disabled {
        return current;
    }
    let mut p = proposals(current, events, rules, now, false).peekable();
    // Only policies the CRD refuses (a value or period not above 0) leave none.
    if p.peek().is_none() {
        return i64::MIN;
    }
    match rules.select_policy {
        SelectPolicy::Disabled => current,
        // The largest change down is the smallest count.
        SelectPolicy::Max => p.min().unwrap_or(current),
        SelectPolicy::Min => p.max().unwrap_or(current),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_crds::ScalingPolicy;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn rules(select: SelectPolicy, policies: &[(PolicyType, i32, i32)]) -> ResolvedRules {
        ResolvedRules {
            stabilization_window_seconds: 0,
            select_policy: select,
            policies: policies
                .iter()
                .map(|&(type_, value, period_seconds)| ScalingPolicy {
                    type_,
                    value,
                    period_seconds,
                })
                .collect(),
        }
    }

    #[test]
    fn hpa_default_scale_up_is_max_of_4_pods_and_100_percent() {
        let up = ResolvedRules::scale_up_defaults();
        assert_eq!(scale_up_limit(1, &[], &up, s(100)), 5);
        assert_eq!(scale_up_limit(10, &[], &up, s(100)), 20);
        // 1 → 5 ten seconds ago: the period started at 1, so 5 is all that is allowed.
        let ev = [ScaleEvent {
            at: s(90),
            from: 1,
            to: 5,
        }];
        assert_eq!(scale_up_limit(5, &ev, &up, s(100)), 5);
        // Fifteen seconds later the event is out of the period.
        assert_eq!(scale_up_limit(5, &ev, &up, s(105)), 10);
    }

    #[test]
    fn percent_rounding() {
        let up = rules(SelectPolicy::Max, &[(PolicyType::Percent, 10, 60)]);
        assert_eq!(scale_up_limit(10, &[], &up, s(0)), 11);
        assert_eq!(scale_up_limit(11, &[], &up, s(0)), 13);
        let down = rules(SelectPolicy::Max, &[(PolicyType::Percent, 10, 60)]);
        // HPA docs: 72 replicas, 10 % is 7.2, "rounded up to 8" removed.
        assert_eq!(scale_down_limit(72, &[], &down, s(0)), 64);
        assert_eq!(scale_down_limit(80, &[], &down, s(0)), 72);
    }

    #[test]
    fn select_policy_min_and_disabled() {
        let down = rules(
            SelectPolicy::Min,
            &[(PolicyType::Percent, 10, 60), (PolicyType::Pods, 5, 60)],
        );
        assert_eq!(scale_down_limit(100, &[], &down, s(0)), 95);
        assert_eq!(scale_down_limit(30, &[], &down, s(0)), 27);
        let off = rules(SelectPolicy::Disabled, &[(PolicyType::Pods, 5, 60)]);
        assert_eq!(scale_down_limit(30, &[], &off, s(0)), 30);
        assert_eq!(scale_up_limit(30, &[], &off, s(0)), 30);
        let invalid = rules(SelectPolicy::Max, &[(PolicyType::Pods, 0, 15)]);
        assert_eq!(scale_up_limit(3, &[], &invalid, s(0)), i64::MAX);
        let off_empty = rules(SelectPolicy::Disabled, &[]);
        assert_eq!(scale_up_limit(3, &[], &off_empty, s(0)), 3);
    }

    #[test]
    fn period_start_counts_both_directions() {
        // Up 4 → 6 then down 6 → 5 inside the period: start = 5 − 2 + 1 = 4.
        let ev = [
            ScaleEvent {
                at: s(50),
                from: 4,
                to: 6,
            },
            ScaleEvent {
                at: s(55),
                from: 6,
                to: 5,
            },
        ];
        let up = rules(SelectPolicy::Max, &[(PolicyType::Pods, 2, 60)]);
        assert_eq!(scale_up_limit(5, &ev, &up, s(60)), 6);
    }

    #[test]
    fn limit_never_reverses_and_clamps() {
        let b = ballast_crds::BehaviorSpec::default().resolved();
        let bounds = Bounds {
            current: 3,
            min: 1,
            max: 4,
        };
        assert_eq!(
            limit(10, bounds, &b, &[], s(0)),
            (4, Some(Cap::TooManyReplicas))
        );
        assert_eq!(
            limit(0, bounds, &b, &[], s(0)),
            (1, Some(Cap::TooFewReplicas))
        );
        assert_eq!(limit(2, bounds, &b, &[], s(0)), (2, None));
        let bounds = Bounds {
            current: 2,
            min: 1,
            max: 100,
        };
        assert_eq!(
            limit(50, bounds, &b, &[], s(0)),
            (6, Some(Cap::ScaleUpLimit))
        );
    }

    #[test]
    fn stabilize_takes_extremes_of_the_windows() {
        let b = ballast_crds::BehaviorSpec::default().resolved(); // up 0 s, down 300 s
        let past = [
            TimedRecommendation {
                at: s(100),
                replicas: 6,
            },
            TimedRecommendation {
                at: s(200),
                replicas: 5,
            },
        ];
        assert_eq!(stabilize(6, 3, &past, &b, s(300)), 6);
        assert_eq!(stabilize(6, 3, &past, &b, s(401)), 5);
        assert_eq!(stabilize(6, 3, &past, &b, s(501)), 3);
        // No up window: a scale-up goes straight to the recommendation.
        assert_eq!(stabilize(2, 8, &past, &b, s(300)), 8);
    }
}
