//! What the decision's steps share: the input, the history and what was observed.

use std::time::Duration;

use ballast_crds::{ResolvedBehavior, Signals};

use super::history::{History, TimedRecommendation};
use super::input::DecideInput;
use super::observe::{Health, Observation};

/// Everything the steps share.
pub(super) struct Ctx<'a> {
    pub(super) input: &'a DecideInput,
    pub(super) history: &'a History,
    pub(super) now: Duration,
    pub(super) current: i32,
    pub(super) min: i32,
    pub(super) max: i32,
    /// History's recommendations plus the seed, if any.
    pub(super) past: &'a [TimedRecommendation],
    /// `spec.autoscaling.behavior` with HPA's defaults filled in.
    pub(super) behavior: &'a ResolvedBehavior,
    pub(super) health: Health,
    pub(super) observations: &'a [Observation],
    pub(super) signals: &'a Signals,
}
