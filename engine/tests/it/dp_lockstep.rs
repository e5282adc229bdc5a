//! The rank step loop itself: N rank threads in lockstep, with a no-op executor, and the
//! data-parallel balance statistics each step reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_engine::compute::executor::NoopExecutor;
use ballast_engine::runtime::admission::{AdmissionLedger, AdmissionLimits};
use ballast_engine::runtime::core::{RankCommand, RankWorker, StepOutput};
use ballast_engine::runtime::dp::DpGroup;
use ballast_engine::runtime::scheduler::{EngineRequest, Scheduler, SchedulerConfig};
use ballast_engine::runtime::tenants::TenantLedger;
use ballast_engine::runtime::test_support::greedy_request;
use tokio::sync::mpsc::UnboundedReceiver;

fn request(id: u64, prompt_len: usize, max_tokens: u32) -> EngineRequest {
    greedy_request(id, (0..prompt_len as u32).collect(), max_tokens)
}

struct Group {
    inboxes: Vec<std::sync::mpsc::Sender<RankCommand>>,
    group: Arc<DpGroup<ballast_engine::runtime::core::GatherMsg>>,
    outputs: UnboundedReceiver<StepOutput>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn start(num_ranks: usize) -> Group {
    let cfg = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 256,
        block_size: 4,
        num_blocks: 128,
        enable_prefix_caching: true,
    };
    let tenants = Arc::new(TenantLedger::new(None));
    let admission = Arc::new(AdmissionLedger::new(AdmissionLimits::default()));
    let group = Arc::new(DpGroup::new(num_ranks));
    let (tx, outputs) = tokio::sync::mpsc::unbounded_channel();
    let mut inboxes = Vec::new();
    let mut threads = Vec::new();
    for rank in 0..num_ranks {
        let (itx, irx) = std::sync::mpsc::channel();
        inboxes.push(itx);
        let worker = RankWorker {
            rank,
            scheduler: Scheduler::new(cfg, Arc::clone(&tenants), Arc::clone(&admission)),
            executor: Box::new(NoopExecutor { token: 65 }),
            inbox: irx,
            group: Arc::clone(&group),
            outputs: tx.clone(),
        };
        threads.push(std::thread::spawn(move || worker.run()));
    }
    Group {
        inboxes,
        group,
        outputs,
        threads,
    }
}

impl Group {
    /// Waits until every rank has reported going idle (its first flush), so all of them are
    /// asleep or about to sleep on the current wake sequence.
    fn wait_all_idle(&mut self) {
        let mut idle = vec![false; self.inboxes.len()];
        while !idle.iter().all(|i| *i) {
            let s = self.outputs.blocking_recv().unwrap();
            if matches!(s.dp, Ok(None)) {
                idle[s.rank] = true;
            }
        }
    }

    /// Queues a request without waking the group.
    fn push(&self, rank: usize, id: u64, prompt_len: usize, max_tokens: u32) {
        self.inboxes[rank]
            .send(RankCommand::Add(request(id, prompt_len, max_tokens)))
            .unwrap();
    }

    fn submit(&self, rank: usize, id: u64, prompt_len: usize, max_tokens: u32) {
        self.push(rank, id, prompt_len, max_tokens);
        self.group.wake();
    }

    /// Collects step outputs until `n` requests finished and every rank has reported the
    /// step in which the last one finished (ranks send their outputs independently).
    fn collect_until_finished(&mut self, n: usize) -> Vec<StepOutput> {
        let mut steps: Vec<StepOutput> = Vec::new();
        let mut finished = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        let ranks = self.inboxes.len();
        let stepped = |steps: &[StepOutput], rank| {
            steps
                .iter()
                .filter(|s| s.rank == rank && s.dp.as_ref().is_ok_and(|d| d.is_some()))
                .count()
        };
        while finished < n || (1..ranks).any(|r| stepped(&steps, r) < stepped(&steps, 0)) {
            match self.outputs.try_recv() {
                Ok(s) => {
                    finished += s.outputs.iter().filter(|o| o.finish.is_some()).count();
                    steps.push(s);
                }
                Err(_) => {
                    assert!(
                        Instant::now() < deadline,
                        "requests did not finish: {steps:#?}"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        steps
    }

    fn stop(self) {
        self.group.close();
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn ranks_step_together_and_report_balance() {
    let mut g = start(2);
    // Rank 0 gets a 10-token prompt; rank 1 gets nothing.
    g.submit(0, 1, 10, 3);
    let steps = g.collect_until_finished(1);
    let of = |rank| {
        steps
            .iter()
            .filter(|s| s.rank == rank && s.dp.as_ref().unwrap().is_some())
            .collect::<Vec<_>>()
    };
    let (r0, r1) = (of(0), of(1));
    assert_eq!(
        r0.len(),
        r1.len(),
        "lockstep: both ranks take part in every step"
    );
    assert_eq!(
        r0.len(),
        3,
        "prefill (samples the first token) + 2 decode steps"
    );
    let b0 = r0[0].dp.unwrap().unwrap();
    let b1 = r1[0].dp.unwrap().unwrap();
    assert_eq!(
        (b0.local_tokens, b0.max_tokens, b0.sum_tokens),
        (10, 10, 10)
    );
    assert_eq!(
        b0.local_attention_pairs, 55,
        "10 new tokens on 0 cached: 10·11/2"
    );
    assert_eq!(b0.token_imbalance(), 0);
    assert!((b0.token_imbalance_ratio() - 2.0).abs() < 1e-12);
    assert!(!b1.is_active());
    assert_eq!(
        (b1.token_imbalance(), b1.attention_pair_imbalance()),
        (10, 55)
    );
    // First decode step: 1 token on 10 cached → 11 pairs.
    assert_eq!(r0[1].dp.unwrap().unwrap().local_attention_pairs, 11);
    g.stop();
}

#[test]
fn balanced_load_has_ratio_one_and_idle_group_sleeps() {
    let mut g = start(2);
    // Both requests are queued while every rank sleeps, then one wake-up: they start in the
    // same step, so every step is perfectly balanced.
    g.wait_all_idle();
    g.push(0, 1, 6, 2);
    g.push(1, 2, 6, 2);
    g.group.wake();
    let steps = g.collect_until_finished(2);
    let ratios: Vec<f64> = steps
        .iter()
        .filter_map(|s| s.dp.as_ref().unwrap().map(|b| b.token_imbalance_ratio()))
        .collect();
    assert_eq!(
        ratios.len(),
        4,
        "two steps (prefill, decode) seen by two ranks"
    );
    assert!(
        ratios.iter().all(|&r| (r - 1.0).abs() < 1e-12),
        "{ratios:?}"
    );
    // With no work left the ranks sleep: no further steps with balance samples.
    std::thread::sleep(Duration::from_millis(50));
    let mut later = 0;
    while let Ok(s) = g.outputs.try_recv() {
        later += s.dp.as_ref().unwrap().is_some() as usize;
    }
    assert_eq!(later, 0, "an idle group must not step");
    g.stop();
}

#[test]
fn abort_that_empties_the_rank_is_reported_before_it_sleeps() {
    let mut g = start(1);
    // A request that can never finish quickly, then an abort.
    g.submit(0, 7, 4, 200);
    g.inboxes[0].send(RankCommand::Abort(7)).unwrap();
    g.group.wake();
    let steps = g.collect_until_finished(1);
    let last = steps.last().unwrap();
    assert_eq!(last.snapshot.running, 0);
    assert_eq!(last.snapshot.kv_blocks.used, 0);
    g.stop();
}
