//! The control board: the latest state of every rank, kept by a stat logger so the control
//! API can answer from it without reaching into the rank threads.

use std::sync::{Arc, Mutex};

use super::{StatLogger, StepStats};
use crate::events::SchedulerSnapshot;

/// One rank's latest state.
#[derive(Debug, Clone, Copy, Default)]
pub struct RankState {
    /// The rank's latest end-of-step snapshot.
    pub snapshot: SchedulerSnapshot,
    /// Tokens the rank computed over its lifetime.
    pub tokens_scheduled: u64,
}

/// The latest state of every rank.
#[derive(Debug)]
pub struct ControlBoard {
    ranks: Mutex<Vec<RankState>>,
}

impl ControlBoard {
    /// A board for `num_ranks` ranks.
    pub fn new(num_ranks: usize) -> Arc<Self> {
        Arc::new(Self {
            ranks: Mutex::new(vec![RankState::default(); num_ranks]),
        })
    }

    /// A copy of every rank's state, in rank order.
    pub fn ranks(&self) -> Vec<RankState> {
        self.ranks.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Feeds a [`ControlBoard`] from the stats feed.
pub struct BoardLogger(pub Arc<ControlBoard>);

impl StatLogger for BoardLogger {
    fn record(&mut self, s: &StepStats<'_>) {
        let mut ranks = self.0.ranks.lock().unwrap_or_else(|e| e.into_inner());
        let r = &mut ranks[s.rank];
        r.snapshot = *s.snapshot;
        r.tokens_scheduled += s.counters.scheduled_tokens as u64;
    }
}
