//! Scheduler cost per step against the model step it plans.
//!
//! 256 requests decode together. The same loop (schedule → fill step inputs → execute →
//! apply) runs once with a no-op executor, which isolates the scheduler, KV bookkeeping and
//! prefix hashing, and once with `synthetic:small` on the CPU backend. Both are measured in
//! the same run so the ratio is meaningful on a noisy machine.
//!
//! `cargo bench -p ballast-engine --bench scheduler_step` (add `-- --quick` for a short run).

use std::time::{Duration, Instant};

use ballast_engine::compute::backend::cpu::CpuBackend;
use ballast_engine::compute::executor::{Executor, ModelExecutor, NoopExecutor};
use ballast_engine::compute::model::{LlamaModel, ModelSpec};
use ballast_engine::runtime::scheduler::{Scheduler, SchedulerConfig};
use ballast_engine::runtime::test_support::{self, greedy_request};
use ballast_engine::step::StepMetadata;

const RUNNING: usize = 256;
const PROMPT: usize = 32;

fn scheduler(num_blocks: usize) -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_seqs: RUNNING,
        max_num_batched_tokens: 8192,
        max_model_len: 4096,
        block_size: 16,
        num_blocks,
        enable_prefix_caching: true,
    };
    let mut s = test_support::scheduler(cfg, None);
    for id in 0..RUNNING as u64 {
        let prompt = (0..PROMPT as u64)
            .map(|i| ((id * 131 + i * 7) % 256) as u32)
            .collect();
        s.add(greedy_request(id, prompt, 4000), Instant::now());
    }
    s
}

/// Runs `steps` full steps and returns the mean time of the whole step and of the part
/// outside `execute` (the scheduler's share).
fn run(s: &mut Scheduler, exec: &mut dyn Executor, steps: usize) -> (Duration, Duration) {
    let mut meta = StepMetadata::default();
    let mut slots = Vec::new();
    let (mut total, mut sched) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..steps {
        let t0 = Instant::now();
        let plan = s.schedule(Instant::now());
        s.fill_step(&plan, &mut meta, &mut slots);
        let t1 = Instant::now();
        let sampled = exec.execute(&meta, &mut slots);
        let t2 = Instant::now();
        s.update(&plan, &sampled, &slots);
        drop(s.take_outputs());
        let _ = (s.snapshot(), s.take_counters());
        let t3 = Instant::now();
        total += t3 - t0;
        sched += (t1 - t0) + (t3 - t2);
    }
    (total / steps as u32, sched / steps as u32)
}

fn warm_to_decode(s: &mut Scheduler, exec: &mut dyn Executor) {
    // Prefill everything, so the measured steps are pure decode at 256 running.
    while s.num_waiting() > 0 || run_plan_is_prefill(s) {
        run(s, exec, 1);
    }
}

fn run_plan_is_prefill(s: &Scheduler) -> bool {
    (0..RUNNING as u64).any(|id| s.request(id).is_some_and(|r| r.num_tokens() <= PROMPT))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (noop_steps, model_steps) = if quick { (200, 3) } else { (2000, 10) };

    let mut noop = NoopExecutor { token: 65 };
    let mut s = scheduler(RUNNING * 4096 / 16);
    warm_to_decode(&mut s, &mut noop);
    assert_eq!(s.num_running(), RUNNING);
    let (noop_total, noop_sched) = run(&mut s, &mut noop, noop_steps);

    let model = LlamaModel::synthetic(ModelSpec::synthetic("small").unwrap(), CpuBackend, 0);
    let blocks = RUNNING * (PROMPT + model_steps + 64).div_ceil(16);
    let mut exec = ModelExecutor::new(model, blocks, 16);
    let mut s = scheduler(blocks);
    warm_to_decode(&mut s, &mut exec);
    let (model_total, model_sched) = run(&mut s, &mut exec, model_steps);

    println!(
        "scheduler step at {RUNNING} running requests (decode), {} rayon threads",
        rayon::current_num_threads()
    );
    println!(
        "  no-op executor:   {:>10.1} µs/step ({noop_steps} steps)",
        noop_total.as_secs_f64() * 1e6
    );
    println!(
        "  synthetic:small:  {:>10.1} µs/step ({model_steps} steps), of which scheduler {:.1} µs",
        model_total.as_secs_f64() * 1e6,
        model_sched.as_secs_f64() * 1e6
    );
    println!(
        "  scheduler share:  {:.3} % of a synthetic:small decode step (target < 5 %)",
        100.0 * noop_sched.as_secs_f64() / model_total.as_secs_f64()
    );
}
