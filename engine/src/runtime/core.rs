//! The engine core: one thread per data-parallel rank, stepping in lockstep.
//!
//! Each step a rank drains its inbox (new requests, aborts), plans a step, joins the
//! group's all-gather of step loads (the DP barrier), runs the plan on its executor, applies
//! the result, and sends one [`StepOutput`] to the output side. When no rank has work, all
//! ranks sleep until a request or command arrives for any of them.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::compute::executor::Executor;
use crate::runtime::dp::{DpBalance, DpGroup, DpStatsError, RankLoad, SyncTimer, dp_balance};
use crate::runtime::kv::ResidencySample;
use crate::runtime::scheduler::{EngineRequest, Scheduler};
use crate::step::StepMetadata;
use crate::step::events::{RequestId, RequestStepOutput, SchedulerSnapshot, StepCounters};

/// A message to one rank.
#[derive(Debug)]
pub enum RankCommand {
    /// Queue a request.
    Add(EngineRequest),
    /// End a request now (client gone, stop string, drain timeout).
    Abort(RequestId),
    /// Forget cached prefixes; replies whether it was done (refused while blocks are in use).
    ResetPrefixCache(std::sync::mpsc::Sender<bool>),
}

/// The frontend's way into the ranks: their inboxes, and the group's wake-up so a sleeping
/// group notices a command.
#[derive(Clone)]
pub struct RankHandles {
    inboxes: Vec<Sender<RankCommand>>,
    group: Arc<DpGroup<GatherMsg>>,
}

impl RankHandles {
    /// Handles over one inbox per rank of `group`.
    pub fn new(inboxes: Vec<Sender<RankCommand>>, group: Arc<DpGroup<GatherMsg>>) -> Self {
        Self { inboxes, group }
    }

    /// Queues `cmd` for `rank` without waking the group (batch several, then
    /// [`Self::wake`]); false when the rank is gone.
    pub fn send(&self, rank: usize, cmd: RankCommand) -> bool {
        self.inboxes[rank].send(cmd).is_ok()
    }

    /// Wakes every rank so queued commands are seen.
    pub fn wake(&self) {
        self.group.wake();
    }

    /// Ends `ids` on `rank` now (their outputs are no longer wanted).
    pub fn abort_all(&self, rank: usize, ids: &[RequestId]) {
        for &id in ids {
            let _ = self.inboxes[rank].send(RankCommand::Abort(id));
        }
        self.wake();
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.inboxes.len()
    }

    /// Whether there is no rank (never, for a started engine).
    pub fn is_empty(&self) -> bool {
        self.inboxes.is_empty()
    }

    /// The lockstep group.
    pub fn group(&self) -> &Arc<DpGroup<GatherMsg>> {
        &self.group
    }
}

/// What a rank reports after each step it takes part in.
#[derive(Debug)]
pub struct StepOutput {
    /// The rank.
    pub rank: usize,
    /// The rank's step counter.
    pub step: u64,
    /// When the step's tokens became available: the NEW_TOKENS time of every token in it.
    pub new_tokens_ts: Instant,
    /// Per-request tokens, finishes and events.
    pub outputs: Vec<RequestStepOutput>,
    /// State at the end of the step.
    pub snapshot: SchedulerSnapshot,
    /// Increments of the step.
    pub counters: StepCounters,
    /// Sampled KV residency events of the step (empty unless `--kv-cache-metrics`).
    pub residency: Vec<ResidencySample>,
    /// Data-parallel balance; `Ok(None)` when no step ran (the whole group is idle and this
    /// output only reports aborts and the current snapshot).
    pub dp: Result<Option<DpBalance>, DpStatsError>,
}

/// What each rank contributes to the step's all-gather.
#[derive(Debug, Clone, Copy, Default)]
pub struct GatherMsg {
    /// The rank has waiting or running requests.
    pub has_work: bool,
    /// The rank is shutting down.
    pub stop: bool,
    /// The rank's planned load.
    pub load: RankLoad,
    /// The wake sequence the rank read before draining its inbox.
    pub seen: u64,
}

/// One rank's step loop and everything it owns.
pub struct RankWorker {
    /// Rank index.
    pub rank: usize,
    /// The rank's scheduler.
    pub scheduler: Scheduler,
    /// The rank's executor (model and KV cache).
    pub executor: Box<dyn Executor>,
    /// Commands from the frontend.
    pub inbox: Receiver<RankCommand>,
    /// The lockstep group.
    pub group: Arc<DpGroup<GatherMsg>>,
    /// Where step outputs go.
    pub outputs: UnboundedSender<StepOutput>,
}

impl RankWorker {
    /// Runs until the group closes or the frontend goes away. A panic inside a step (a bug,
    /// a device error) closes the whole group instead of leaving the other ranks waiting at
    /// the barrier: the engine then reports itself unhealthy and its requests end.
    pub fn run(self) {
        let rank = self.rank;
        let group = Arc::clone(&self.group);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step_loop()));
        if result.is_err() {
            tracing::error!(rank, "rank thread panicked; stopping the engine core");
        }
        group.close();
    }

    fn step_loop(mut self) {
        let mut meta = StepMetadata::default();
        let mut slots = Vec::new();
        let mut step = 0u64;
        let mut last_sent = SchedulerSnapshot::default();
        loop {
            let seen = self.group.wake_seq();
            let inbox_open = self.drain_inbox();
            let now = Instant::now();
            let plan = if self.scheduler.has_work() {
                self.scheduler.schedule(now)
            } else {
                Default::default()
            };
            let msg = GatherMsg {
                has_work: self.scheduler.has_work(),
                stop: !inbox_open,
                load: RankLoad {
                    tokens: plan.num_tokens as u64,
                    attention_pairs: plan.attention_pairs(),
                },
                seen,
            };
            let mut timer = SyncTimer::default();
            let Ok(all) = timer.time(|| self.group.all_gather(self.rank, msg)) else {
                return;
            };
            if all.iter().any(|m| m.stop) {
                self.group.close();
                return;
            }
            // Ranks read the wake sequence at slightly different times. Sleeping until it
            // moves past the *oldest* reading is what makes the decision safe: a request
            // pushed before that reading was drained by its rank (so someone has work), and
            // one pushed after it has already moved the sequence (so nobody sleeps).
            let oldest_seen = all.iter().map(|m| m.seen).min().unwrap_or(seen);
            if !all.iter().any(|m| m.has_work) {
                if !self.flush_idle(&mut step, &mut last_sent) {
                    self.group.close();
                    return;
                }
                self.group.wait_for_wake(oldest_seen);
                continue;
            }
            let loads: Vec<RankLoad> = all.iter().map(|m| m.load).collect();
            let dp = dp_balance(self.rank, all.len(), &loads, timer.total());
            self.scheduler.fill_step(&plan, &mut meta, &mut slots);
            let sampled = self.executor.execute(&meta, &mut slots);
            self.scheduler.update(&plan, &sampled, &slots);
            let out = StepOutput {
                rank: self.rank,
                step,
                new_tokens_ts: Instant::now(),
                outputs: self.scheduler.take_outputs(),
                snapshot: self.scheduler.snapshot(),
                counters: self.scheduler.take_counters(),
                residency: self.scheduler.take_residency(),
                dp,
            };
            step += 1;
            last_sent = out.snapshot;
            if self.outputs.send(out).is_err() {
                self.group.close();
                return;
            }
            if loads.iter().all(|l| l.tokens == 0) {
                // Work exists but nothing could run (e.g. every waiting request is deferred
                // behind a slot that is about to be released): do not spin.
                self.group
                    .wait_for_wake_timeout(seen, Duration::from_millis(5));
            }
        }
    }

    /// Before sleeping: reports what changed without a step (aborts processed from the
    /// inbox) so finishes reach their handlers and gauges do not stay stale while idle.
    /// False when the output side is gone.
    fn flush_idle(&mut self, step: &mut u64, last_sent: &mut SchedulerSnapshot) -> bool {
        let outputs = self.scheduler.take_outputs();
        let snapshot = self.scheduler.snapshot();
        let counters = self.scheduler.take_counters();
        if outputs.is_empty() && snapshot == *last_sent && counters == StepCounters::default() {
            return true;
        }
        *last_sent = snapshot;
        let out = StepOutput {
            rank: self.rank,
            step: *step,
            new_tokens_ts: Instant::now(),
            outputs,
            snapshot,
            counters,
            residency: self.scheduler.take_residency(),
            dp: Ok(None),
        };
        *step += 1;
        self.outputs.send(out).is_ok()
    }

    /// Applies every pending command; false when the frontend dropped the inbox.
    fn drain_inbox(&mut self) -> bool {
        loop {
            match self.inbox.try_recv() {
                Ok(RankCommand::Add(r)) => self.scheduler.add(r, Instant::now()),
                Ok(RankCommand::Abort(id)) => {
                    self.scheduler.abort(id);
                }
                Ok(RankCommand::ResetPrefixCache(reply)) => {
                    let _ = reply.send(self.scheduler.reset_prefix_cache());
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }
}
