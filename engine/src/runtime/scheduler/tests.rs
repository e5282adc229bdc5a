use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::compute::backend::cpu::CpuBackend;
use crate::compute::executor::{Executor, ModelExecutor, NoopExecutor};
use crate::compute::model::{LlamaModel, ModelSpec};
use crate::runtime::admission::AdmissionLimits;
use crate::step::events::RequestStepOutput;

fn cfg(
    max_num_seqs: usize,
    budget: usize,
    num_blocks: usize,
    block_size: usize,
) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: budget,
        max_model_len: 1024,
        block_size,
        num_blocks,
        enable_prefix_caching: true,
    }
}

use crate::runtime::test_support::{greedy_request as request, scheduler};

fn prompt(id: u64, len: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| ((i * 31 + id * 7) % 256) as u32)
        .collect()
}

/// One full step: plan, run, apply. Returns the plan and the step's outputs.
fn step(s: &mut Scheduler, exec: &mut dyn Executor) -> (SchedulerOutput, Vec<RequestStepOutput>) {
    let out = s.schedule(Instant::now());
    let mut meta = StepMetadata::default();
    let mut slots = Vec::new();
    s.fill_step(&out, &mut meta, &mut slots);
    let sampled = exec.execute(&meta, &mut slots);
    s.update(&out, &sampled, &slots);
    (out, s.take_outputs())
}

/// Runs until idle; returns every request's generated tokens and the preemption count.
fn run_all(s: &mut Scheduler, exec: &mut dyn Executor) -> (HashMap<RequestId, Vec<u32>>, u32) {
    let mut tokens: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut preemptions = 0;
    for _ in 0..100_000 {
        if !s.has_work() {
            return (tokens, preemptions);
        }
        let (_, outs) = step(s, exec);
        preemptions += s.take_counters().preemptions;
        for o in outs {
            if let Some(t) = o.new_token {
                tokens.entry(o.id).or_default().push(t);
            }
        }
    }
    panic!("scheduler did not drain");
}

#[test]
fn first_come_first_served() {
    let mut s = scheduler(cfg(2, 64, 64, 4), None);
    for id in 0..6 {
        s.add(request(id, prompt(id, 5), 3), Instant::now());
    }
    let mut order = Vec::new();
    let mut exec = NoopExecutor { token: 1 };
    while s.has_work() {
        let (_, outs) = step(&mut s, &mut exec);
        order.extend(
            outs.iter()
                .filter(|o| o.events.first(EventKind::Scheduled).is_some())
                .map(|o| o.id),
        );
    }
    assert_eq!(order, [0, 1, 2, 3, 4, 5]);
}

#[test]
fn chunked_prefill_spends_the_budget_and_samples_only_at_the_end() {
    let mut s = scheduler(cfg(4, 32, 64, 4), None);
    s.add(request(1, prompt(1, 100), 2), Instant::now());
    let mut exec = NoopExecutor { token: 1 };
    let plans: Vec<_> = (0..4).map(|_| step(&mut s, &mut exec).0.seqs[0]).collect();
    let chunks: Vec<_> = plans
        .iter()
        .map(|p| (p.context_len, p.num_new_tokens, p.samples))
        .collect();
    assert_eq!(
        chunks,
        [
            (0, 32, false),
            (32, 32, false),
            (64, 32, false),
            (96, 4, true)
        ]
    );
    let decode = step(&mut s, &mut exec).0.seqs[0];
    assert_eq!(
        (decode.context_len, decode.num_new_tokens, decode.samples),
        (100, 1, true)
    );
    assert!(!s.has_work(), "2 tokens generated: done");
}

#[test]
fn shared_prefix_is_served_from_the_cache() {
    let mut s = scheduler(cfg(4, 256, 64, 4), None);
    let mut exec = NoopExecutor { token: 1 };
    s.add(request(1, prompt(9, 30), 1), Instant::now());
    run_all(&mut s, &mut exec);
    s.take_counters();
    let mut p = prompt(9, 30);
    p.truncate(20);
    p.extend([1, 2, 3]);
    s.add(request(2, p, 1), Instant::now());
    let (plan, outs) = step(&mut s, &mut exec);
    assert_eq!(plan.seqs[0].context_len, 20, "five full blocks of four hit");
    assert_eq!(outs[0].num_cached_tokens, Some(20));
    let c = s.take_counters();
    assert_eq!((c.prefix_cache.queries, c.prefix_cache.hits), (23, 20));
    assert_eq!(
        c.prefill_tokens, 3,
        "only uncached prompt tokens are computed"
    );
    // Take-and-reset: the next step reports no lookups.
    assert_eq!(s.take_counters().prefix_cache, Default::default());
}

#[test]
fn abort_frees_blocks_at_once_and_releases_admission() {
    let admission = Arc::new(AdmissionLedger::new(AdmissionLimits::default()));
    let mut s = Scheduler::new(
        cfg(1, 64, 16, 4),
        Arc::new(TenantLedger::new(None)),
        Arc::clone(&admission),
    );
    let mut exec = NoopExecutor { token: 1 };
    for id in 0..2 {
        admission.try_admit(1, 10).unwrap();
        s.add(request(id, prompt(id, 10), 50), Instant::now());
    }
    step(&mut s, &mut exec);
    assert_eq!(
        admission.queued().requests,
        1,
        "the first was scheduled, the second waits"
    );
    assert!(s.kv().pool().counts().used > 0);
    assert!(s.abort(0));
    assert!(s.abort(1));
    assert_eq!(s.kv().pool().counts().used, 0);
    assert_eq!(admission.queued().requests, 0);
    let outs = s.take_outputs();
    assert!(outs.iter().all(|o| o.finish == Some(FinishReason::Abort)));
    assert!(!s.abort(0), "second abort of the same request is a no-op");
}

#[test]
fn deferred_requests_wait_for_their_tenant_and_are_not_capacity() {
    let mut s = scheduler(cfg(8, 256, 64, 4), Some(1));
    let mut exec = NoopExecutor { token: 1 };
    let with_tenant = |id, t: &str, max| EngineRequest {
        tenant: Some(t.into()),
        ..request(id, prompt(id, 4), max)
    };
    s.add(with_tenant(1, "a", 2), Instant::now());
    s.add(with_tenant(2, "a", 2), Instant::now());
    s.add(with_tenant(3, "a", 2), Instant::now());
    s.add(with_tenant(4, "b", 2), Instant::now());
    let (plan, _) = step(&mut s, &mut exec);
    let ids: Vec<_> = plan.seqs.iter().map(|q| q.id).collect();
    assert_eq!(
        ids,
        [1, 4],
        "one per tenant; b is not blocked behind a's deferred requests"
    );
    let snap = s.snapshot();
    assert_eq!(
        (snap.running, snap.waiting_capacity, snap.waiting_deferred),
        (2, 0, 2)
    );
    // Request 1 generates its second token and finishes; 2 starts in the next step.
    step(&mut s, &mut exec);
    let (plan, _) = step(&mut s, &mut exec);
    assert!(plan.seqs.iter().any(|q| q.id == 2));
    assert_eq!(s.snapshot().waiting_deferred, 1);
    run_all(&mut s, &mut exec);
    assert_eq!(s.snapshot().waiting(), 0);
}

#[test]
fn slot_pressure_is_capacity_waiting() {
    let mut s = scheduler(cfg(1, 256, 64, 4), Some(4));
    let mut exec = NoopExecutor { token: 1 };
    for id in 0..3 {
        s.add(
            EngineRequest {
                tenant: Some("a".into()),
                ..request(id, prompt(id, 4), 5)
            },
            Instant::now(),
        );
    }
    step(&mut s, &mut exec);
    let snap = s.snapshot();
    assert_eq!(
        (snap.running, snap.waiting_capacity, snap.waiting_deferred),
        (1, 2, 0)
    );
}

fn tiny_executor(num_blocks: usize, block_size: usize) -> ModelExecutor<CpuBackend> {
    let model = LlamaModel::synthetic(ModelSpec::synthetic("tiny").unwrap(), CpuBackend, 3);
    ModelExecutor::new(model, num_blocks, block_size)
}

/// Four requests whose outputs outgrow a 12-block pool: the scheduler must preempt, and
/// every request must still produce exactly the tokens of an unconstrained run.
#[test]
fn preempted_and_resumed_requests_produce_the_same_tokens() {
    for temperature in [0.0, 0.8] {
        let run = |num_blocks| {
            let mut s = scheduler(cfg(8, 64, num_blocks, 4), None);
            for id in 0..4 {
                let mut r = request(id, prompt(id, 6 + id as usize), 12);
                r.sampling.spec.temperature = temperature;
                s.add(r, Instant::now());
            }
            let mut exec = tiny_executor(num_blocks, 4);
            run_all(&mut s, &mut exec)
        };
        let (free_run, none) = run(256);
        let (tight_run, preemptions) = run(12);
        assert_eq!(none, 0);
        assert!(preemptions > 0, "the tight pool must force preemption");
        assert_eq!(free_run.len(), 4);
        assert!(free_run.values().all(|t| t.len() == 12));
        assert_eq!(free_run, tight_run, "temperature {temperature}");
    }
}

#[test]
fn preemption_victim_is_the_latest_scheduled() {
    // Two requests fill the pool; when the first needs a block, the second is preempted.
    let mut s = scheduler(cfg(8, 64, 4, 4), None);
    let mut exec = NoopExecutor { token: 1 };
    s.add(request(1, prompt(1, 8), 10), Instant::now());
    s.add(request(2, prompt(2, 8), 10), Instant::now());
    step(&mut s, &mut exec); // both prefilled: 2 blocks each, 9 tokens known each
    let (_, outs) = step(&mut s, &mut exec);
    let preempted: Vec<_> = outs
        .iter()
        .filter(|o| o.events.first(EventKind::Preempted).is_some())
        .map(|o| o.id)
        .collect();
    assert_eq!(preempted, [2]);
    let c = s.take_counters();
    assert_eq!(
        (
            c.preemptions,
            c.retracted_input_tokens,
            c.retracted_output_tokens
        ),
        (1, 8, 0)
    );
    assert_eq!(s.request(2).unwrap().status, Status::Waiting);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Under random arrivals: the token budget and max_num_seqs hold in every step, KV
    /// accounting stays exact, every request finishes with its max_tokens, and nothing leaks.
    #[test]
    fn limits_hold_and_everything_finishes(
        max_num_seqs in 1usize..6,
        budget in 1usize..48,
        num_blocks in 12usize..40,
        arrivals in prop::collection::vec((0usize..4, 1usize..30, 1u32..8), 1..24),
    ) {
        let block_size = 4;
        let mut c = cfg(max_num_seqs, budget, num_blocks, block_size);
        c.max_model_len = num_blocks * block_size;
        let mut s = scheduler(c, None);
        let mut exec = NoopExecutor { token: 1 };
        let mut pending = arrivals.clone();
        pending.reverse();
        let mut id = 0;
        let mut generated: HashMap<RequestId, u32> = HashMap::new();
        let mut expected: HashMap<RequestId, u32> = HashMap::new();
        for _ in 0..10_000 {
            // Each step, some arrivals (the first field is how many steps to wait).
            while let Some(&(delay, len, max)) = pending.last() {
                if delay > 0 {
                    pending.last_mut().unwrap().0 -= 1;
                    break;
                }
                pending.pop();
                let len = len.min(c.max_model_len - max as usize);
                s.add(request(id, prompt(id, len), max), Instant::now());
                expected.insert(id, max);
                id += 1;
            }
            if !s.has_work() && pending.is_empty() {
                break;
            }
            let (plan, outs) = step(&mut s, &mut exec);
            prop_assert!(plan.num_tokens <= budget);
            prop_assert_eq!(plan.num_tokens, plan.seqs.iter().map(|q| q.num_new_tokens).sum::<usize>());
            prop_assert!(plan.seqs.len() <= max_num_seqs);
            prop_assert!(s.num_running() <= max_num_seqs);
            s.kv().check_invariants();
            for o in outs {
                if o.new_token.is_some() {
                    *generated.entry(o.id).or_default() += 1;
                }
                if let Some(f) = o.finish {
                    prop_assert_eq!(f, FinishReason::Length);
                }
            }
        }
        prop_assert!(!s.has_work());
        prop_assert_eq!(generated, expected);
        prop_assert_eq!(s.kv().pool().counts().used, 0);
        prop_assert_eq!(s.kv().num_requests(), 0);
    }
}

/// The snapshot after a step in which a tenant's running request finished still calls the
/// tenant's other waiting requests deferred: they were held by the cap when the step was
/// planned, and capacity for them existed all along.
#[test]
fn a_finish_between_steps_does_not_turn_deferred_into_capacity() {
    let mut s = scheduler(cfg(32, 256, 64, 4), Some(1));
    let mut exec = NoopExecutor { token: 1 };
    for id in 1..=4 {
        let r = EngineRequest {
            tenant: Some("a".into()),
            ..request(id, prompt(id, 4), 1)
        };
        s.add(r, Instant::now());
    }
    for remaining in (0..3).rev() {
        let (plan, outs) = step(&mut s, &mut exec);
        assert_eq!(plan.seqs.len(), 1, "one request of the tenant at a time");
        assert!(
            outs.iter().any(|o| o.finish.is_some()),
            "the running request finished in this step and released its slot"
        );
        let snap = s.snapshot();
        assert_eq!(
            (snap.running, snap.waiting_capacity, snap.waiting_deferred),
            (0, 0, remaining + 1),
            "held by the tenant cap when planned, so deferred"
        );
    }
    step(&mut s, &mut exec);
    assert_eq!(s.snapshot().waiting(), 0);
}

/// Preempting a request whose prompt was partly served from the prefix cache retracts only
/// the tokens it computed itself.
#[test]
fn prefix_cache_hits_are_not_retracted() {
    let mut s = scheduler(cfg(8, 64, 5, 4), None);
    let mut exec = NoopExecutor { token: 1 };
    let shared = prompt(1, 8);
    s.add(request(1, shared.clone(), 20), Instant::now());
    step(&mut s, &mut exec);
    let mut longer = shared.clone();
    longer.extend(prompt(2, 4));
    s.add(request(2, longer, 20), Instant::now());
    step(&mut s, &mut exec);
    assert_eq!(s.request(2).unwrap().num_cached, 8, "two blocks hit");
    for _ in 0..20 {
        let computed_before = s.request(2).map_or(0, |r| r.num_computed);
        let (_, outs) = step(&mut s, &mut exec);
        if outs
            .iter()
            .any(|o| o.id == 2 && o.events.first(EventKind::Preempted).is_some())
        {
            let c = s.take_counters();
            assert_eq!(c.preemptions, 1);
            assert_eq!(
                c.retracted_input_tokens, 4,
                "12 prompt tokens, 8 of them cached"
            );
            assert_eq!(
                c.retracted_output_tokens as usize,
                computed_before - 12,
                "every computed output token is retracted"
            );
            return;
        }
        s.take_counters();
    }
    panic!("request 2 was never preempted");
}
