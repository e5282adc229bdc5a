//! Data parallelism inside one engine process: N ranks, each with its own scheduler and KV
//! pool, stepping in lockstep (a synchronised step, as DP attention does), and the balance
//! statistics every rank derives from the step's all-gather.

pub use crate::step::{DpBalance, RankLoad};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Statistics that cannot be right: reported, never turned into quiet zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DpStatsError {
    /// A rank computed tokens with no attention pairs: the pair count is broken.
    #[error("rank {rank} scheduled {tokens} tokens but reported zero attention pairs")]
    TokensWithoutPairs {
        /// The offending rank.
        rank: usize,
        /// Its tokens.
        tokens: u64,
    },
    /// The gather did not have one entry per rank.
    #[error("gathered {got} rank loads for a group of {want}")]
    WrongRankCount {
        /// Entries gathered.
        got: usize,
        /// Ranks in the group.
        want: usize,
    },
}

/// Balance of a step for `rank` from every rank's load. `Ok(None)` is an idle step (every
/// rank empty), which is not an imbalance sample.
pub fn dp_balance(
    rank: usize,
    num_ranks: usize,
    loads: &[RankLoad],
    sync_wait: Duration,
) -> Result<Option<DpBalance>, DpStatsError> {
    if loads.len() != num_ranks || rank >= num_ranks {
        return Err(DpStatsError::WrongRankCount {
            got: loads.len(),
            want: num_ranks,
        });
    }
    if let Some((r, l)) = loads
        .iter()
        .enumerate()
        .find(|(_, l)| l.tokens > 0 && l.attention_pairs == 0)
    {
        return Err(DpStatsError::TokensWithoutPairs {
            rank: r,
            tokens: l.tokens,
        });
    }
    let sum_tokens: u64 = loads.iter().map(|l| l.tokens).sum();
    if sum_tokens == 0 {
        return Ok(None);
    }
    Ok(Some(DpBalance {
        rank,
        num_ranks,
        local_tokens: loads[rank].tokens,
        max_tokens: loads.iter().map(|l| l.tokens).max().unwrap_or(0),
        sum_tokens,
        local_attention_pairs: loads[rank].attention_pairs,
        max_attention_pairs: loads.iter().map(|l| l.attention_pairs).max().unwrap_or(0),
        sync_wait,
    }))
}

/// The group was shut down while a rank waited at a barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("data-parallel group shut down")]
pub struct GroupClosed;

struct Gather<T> {
    generation: u64,
    arrived: usize,
    values: Vec<T>,
    result: Vec<T>,
}

/// Lockstep coordination of N rank threads: an all-gather barrier per step, and a wake-up
/// signal for ranks that sleep while the whole group is idle.
pub struct DpGroup<T> {
    num_ranks: usize,
    gather: Mutex<Gather<T>>,
    gathered: Condvar,
    wake_seq: Mutex<u64>,
    woken: Condvar,
    closed: AtomicBool,
}

impl<T: Copy + Default> DpGroup<T> {
    /// A group of `num_ranks` ranks.
    pub fn new(num_ranks: usize) -> Self {
        assert!(num_ranks > 0);
        Self {
            num_ranks,
            gather: Mutex::new(Gather {
                generation: 0,
                arrived: 0,
                values: vec![T::default(); num_ranks],
                result: Vec::new(),
            }),
            gathered: Condvar::new(),
            wake_seq: Mutex::new(0),
            woken: Condvar::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Ranks in the group.
    pub fn num_ranks(&self) -> usize {
        self.num_ranks
    }

    /// Blocks until every rank has contributed, then returns all contributions by rank.
    pub fn all_gather(&self, rank: usize, value: T) -> Result<Vec<T>, GroupClosed> {
        if self.num_ranks == 1 {
            return if self.is_closed() {
                Err(GroupClosed)
            } else {
                Ok(vec![value])
            };
        }
        let mut g = self.gather.lock().unwrap_or_else(|e| e.into_inner());
        g.values[rank] = value;
        g.arrived += 1;
        let generation = g.generation;
        if g.arrived == self.num_ranks {
            g.arrived = 0;
            g.generation += 1;
            g.result = g.values.clone();
            self.gathered.notify_all();
            return Ok(g.result.clone());
        }
        while g.generation == generation {
            if self.is_closed() {
                return Err(GroupClosed);
            }
            g = self
                .gathered
                .wait_timeout(g, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        // The next generation cannot complete before this rank arrives again, so `result`
        // still holds this generation's values.
        Ok(g.result.clone())
    }

    /// Current wake sequence; read it before looking for work.
    pub fn wake_seq(&self) -> u64 {
        *self.wake_seq.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Signals that work (or a command) arrived for some rank.
    pub fn wake(&self) {
        *self.wake_seq.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.woken.notify_all();
    }

    /// Sleeps until [`Self::wake`] is called after `seen` was read (or the group closes).
    pub fn wait_for_wake(&self, seen: u64) {
        let mut seq = self.wake_seq.lock().unwrap_or_else(|e| e.into_inner());
        while *seq == seen && !self.is_closed() {
            seq = self.woken.wait(seq).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Like [`Self::wait_for_wake`], but gives up after `timeout`.
    pub fn wait_for_wake_timeout(&self, seen: u64, timeout: Duration) {
        let seq = self.wake_seq.lock().unwrap_or_else(|e| e.into_inner());
        if *seq == seen && !self.is_closed() {
            let _ = self.woken.wait_timeout(seq, timeout);
        }
    }

    /// Stops the group: barriers return [`GroupClosed`], sleepers wake.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake();
        let _g = self.gather.lock().unwrap_or_else(|e| e.into_inner());
        self.gathered.notify_all();
    }

    /// Whether [`Self::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// Measures time spent blocked at barriers within a step.
#[derive(Debug, Default, Clone, Copy)]
pub struct SyncTimer {
    total: Duration,
}

impl SyncTimer {
    /// Runs `f` (a barrier) and adds its duration.
    pub fn time<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let t0 = Instant::now();
        let r = f();
        self.total += t0.elapsed();
        r
    }

    /// Total measured.
    pub fn total(&self) -> Duration {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::scheduler::attention_pairs;
    use std::sync::Arc;

    fn load(tokens: u64, attention_pairs: u64) -> RankLoad {
        RankLoad {
            tokens,
            attention_pairs,
        }
    }

    #[test]
    fn pairs_of_a_chunk_on_a_cached_prefix() {
        assert_eq!(attention_pairs(4, 10), 50); // 4·10 + 4·5/2
        assert_eq!(attention_pairs(1, 99), 100); // a decode token sees 99 + itself
        assert_eq!(attention_pairs(3, 0), 6);
    }

    #[test]
    fn balance_on_hand_computed_case() {
        let loads = [load(4, 50), load(1, 100), load(0, 0)];
        let b = dp_balance(1, 3, &loads, Duration::ZERO).unwrap().unwrap();
        assert_eq!((b.max_tokens, b.sum_tokens, b.token_imbalance()), (4, 5, 3));
        assert_eq!(b.attention_pair_imbalance(), 0);
        assert!((b.token_imbalance_ratio() - 4.0 * 3.0 / 5.0).abs() < 1e-12);
        let idle_rank = dp_balance(2, 3, &loads, Duration::ZERO).unwrap().unwrap();
        assert!(!idle_rank.is_active());
        assert_eq!(idle_rank.token_imbalance(), 4);
    }

    #[test]
    fn invalid_and_idle_steps() {
        let err = dp_balance(0, 2, &[load(3, 0), load(1, 1)], Duration::ZERO).unwrap_err();
        assert_eq!(err, DpStatsError::TokensWithoutPairs { rank: 0, tokens: 3 });
        assert_eq!(
            dp_balance(0, 2, &[load(0, 0), load(0, 0)], Duration::ZERO),
            Ok(None)
        );
        assert!(dp_balance(0, 3, &[load(1, 1)], Duration::ZERO).is_err());
    }

    #[test]
    fn all_gather_returns_every_rank_in_order_each_generation() {
        let g = Arc::new(DpGroup::<u64>::new(3));
        let handles: Vec<_> = (0..3)
            .map(|r| {
                let g = Arc::clone(&g);
                std::thread::spawn(move || {
                    (0..50)
                        .map(|step| g.all_gather(r, step * 10 + r as u64).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            let rounds = h.join().unwrap();
            for (step, got) in rounds.iter().enumerate() {
                let s = step as u64 * 10;
                assert_eq!(got, &vec![s, s + 1, s + 2]);
            }
        }
    }

    #[test]
    fn close_releases_waiters() {
        let g = Arc::new(DpGroup::<u64>::new(2));
        let g2 = Arc::clone(&g);
        let t = std::thread::spawn(move || g2.all_gather(0, 1));
        std::thread::sleep(Duration::from_millis(20));
        g.close();
        assert_eq!(t.join().unwrap(), Err(GroupClosed));
        let seen = g.wake_seq();
        g.wait_for_wake(seen); // returns at once: closed
    }
}
