//! What the decision core remembers between periods: HPA's recommendation history (for
//! the stabilisation windows) and its scale events (for the rate policies).
//!
//! HPA keeps both in the controller's memory and starts empty after a restart; so does
//! Ballast. The runtime owns one [`History`] per resource and feeds each
//! [`Outcome`](super::Outcome)'s [`HistoryUpdate`] back with [`History::record`].

use std::time::Duration;

/// Replicas recommended (before stabilisation and limits) at some time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedRecommendation {
    /// When, as the `now` passed to [`decide`](super::decide).
    pub at: Duration,
    /// The recommendation: the largest of the signals' recommendations, unclamped.
    pub replicas: i32,
}

/// A change of the replica count the operator applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleEvent {
    /// When, as the `now` passed to [`decide`](super::decide).
    pub at: Duration,
    /// Replicas before.
    pub from: i32,
    /// Replicas after.
    pub to: i32,
}

impl ScaleEvent {
    /// Replicas added (0 for a scale-down).
    pub fn added(&self) -> i64 {
        (i64::from(self.to) - i64::from(self.from)).max(0)
    }

    /// Replicas removed (0 for a scale-up).
    pub fn removed(&self) -> i64 {
        (i64::from(self.from) - i64::from(self.to)).max(0)
    }
}

/// The memory of one resource's decisions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Past recommendations, oldest first.
    pub recommendations: Vec<TimedRecommendation>,
    /// Past scale events, oldest first.
    pub scale_events: Vec<ScaleEvent>,
    /// The last period the fleet was not known to be idle (a request running, waiting,
    /// deferred or held, or no usable report): how long it has been idle, for
    /// `scaleToZeroAfterSeconds`. `None` before the first period.
    pub busy_at: Option<Duration>,
}

/// What one decision adds to the [`History`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HistoryUpdate {
    /// The period's time.
    pub now: Duration,
    /// Recommendations to remember: on the first period, the current size (HPA's initial
    /// recommendation, so a restarted operator does not scale down before a full window
    /// has passed), then the period's recommendation when one was computed (none while
    /// metrics are unusable, as HPA records none when it cannot compute one).
    pub recommendations: Vec<TimedRecommendation>,
    /// The replica change to remember, if this decision changes the count.
    pub scale_event: Option<ScaleEvent>,
    /// Recommendations older than this are no longer looked at (the longer window).
    pub keep_recommendations: Duration,
    /// Scale events older than this are no longer looked at (the longest policy period).
    pub keep_scale_events: Duration,
    /// Whether the fleet was not known to be idle this period.
    pub busy: bool,
}

/// Entries kept at most per list, whatever the clock does; at one period a second this
/// covers the longest window HPA allows (3600 s) twice over.
const MAX_ENTRIES: usize = 8192;

impl History {
    /// Records one decision. Call once per period after acting on the outcome; `scaled`
    /// says whether its replica change was applied (a failed update records no event, as
    /// in HPA, where only a successful rescale is stored).
    pub fn record(&mut self, update: &HistoryUpdate, scaled: bool) {
        self.recommendations
            .extend(update.recommendations.iter().copied());
        if scaled && let Some(e) = update.scale_event {
            self.scale_events.push(e);
        }
        let now = update.now;
        if update.busy || self.busy_at.is_none() {
            self.busy_at = Some(now);
        }
        let fresh = |at: Duration, keep: Duration| now.saturating_sub(at) <= keep;
        self.recommendations
            .retain(|r| fresh(r.at, update.keep_recommendations));
        self.scale_events
            .retain(|e| fresh(e.at, update.keep_scale_events));
        trim_front(&mut self.recommendations);
        trim_front(&mut self.scale_events);
    }
}

fn trim_front<T>(v: &mut Vec<T>) {
    if v.len() > MAX_ENTRIES {
        v.drain(..v.len() - MAX_ENTRIES);
    }
}

/// Whether `at` lies inside the `window` ending at `now`: strictly after `now − window`,
/// as HPA's `timestamp.After(cutoff)`. A zero window holds nothing from before `now`.
pub(crate) fn in_window(at: Duration, window: Duration, now: Duration) -> bool {
    match now.checked_sub(window) {
        Some(cutoff) => at > cutoff,
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn window_is_strict_at_the_cutoff() {
        assert!(in_window(s(100), s(60), s(150)));
        assert!(!in_window(s(90), s(60), s(150)));
        assert!(!in_window(s(150), s(0), s(150)));
        assert!(in_window(s(0), s(300), s(10)));
    }

    #[test]
    fn record_appends_and_prunes() {
        let mut h = History::default();
        let upd = |now: u64, rec: i32, ev: Option<(i32, i32)>| HistoryUpdate {
            now: s(now),
            recommendations: vec![TimedRecommendation {
                at: s(now),
                replicas: rec,
            }],
            scale_event: ev.map(|(from, to)| ScaleEvent {
                at: s(now),
                from,
                to,
            }),
            keep_recommendations: s(300),
            keep_scale_events: s(15),
            busy: true,
        };
        h.record(&upd(0, 4, Some((2, 4))), true);
        h.record(&upd(10, 5, Some((4, 5))), false);
        assert_eq!(h.scale_events.len(), 1, "a failed scale is not remembered");
        h.record(&upd(20, 6, None), true);
        assert_eq!(h.scale_events.len(), 0, "older than the longest period");
        assert_eq!(h.recommendations.len(), 3);
        h.record(&upd(400, 2, None), true);
        assert_eq!(
            h.recommendations,
            vec![TimedRecommendation {
                at: s(400),
                replicas: 2
            }]
        );
    }
}
