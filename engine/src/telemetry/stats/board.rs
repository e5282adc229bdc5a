//! The control board: the latest state of every rank, kept by a stat logger so the control
//! API can answer from it without reaching into the rank threads.

use std::sync::{Arc, Mutex};

use super::{StatLogger, StepStats};
use crate::step::events::SchedulerSnapshot;

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
    /// A board for `num_ranks` idle ranks of `kv_blocks` blocks each: what an engine that
    /// has not finished a step yet truthfully is (the control API may be asked before then).
    pub fn new(num_ranks: usize, kv_blocks: usize) -> Arc<Self> {
        let mut idle = RankState::default();
        idle.snapshot.kv_blocks.total = kv_blocks;
        idle.snapshot.kv_blocks.available = kv_blocks;
        Arc::new(Self {
            ranks: Mutex::new(vec![idle; num_ranks]),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_board_shows_idle_ranks_with_their_whole_pool() {
        let board = ControlBoard::new(3, 40);
        let ranks = board.ranks();
        assert_eq!(ranks.len(), 3);
        for r in ranks {
            assert_eq!(r.snapshot.running, 0);
            assert_eq!(r.snapshot.kv_blocks.total, 40);
            assert_eq!(r.snapshot.kv_blocks.available, 40);
            assert_eq!(r.snapshot.kv_blocks.used, 0);
        }
    }
}
