//! The two load shapes: closed loop (`--concurrency`) and open loop (`--rate`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::{JoinError, JoinSet};

use crate::args::Load;
use crate::client::{Outcome, RequestRecord, Target};
use crate::workload::{Arrivals, Workload};

/// Live counters, read by the progress bar while requests run.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub ok: AtomicU64,
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
}

impl Tally {
    fn record(&self, r: &RequestRecord) {
        let counter = match r.outcome {
            Outcome::Ok(_) => &self.ok,
            Outcome::Rejected => &self.rejected,
            Outcome::Failed(_) => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// When to stop issuing requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stop {
    pub max_requests: Option<u64>,
    pub duration: Option<Duration>,
}

/// Everything the load loops share with their request tasks.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub target: Arc<Target>,
    pub workload: Arc<Workload>,
    pub tally: Arc<Tally>,
}

impl Shared {
    async fn send(&self, index: u64) -> RequestRecord {
        let record = self.target.send(&self.workload.request(index)).await;
        self.tally.record(&record);
        record
    }
}

fn unwrap_task<T>(result: Result<T, JoinError>) -> T {
    match result {
        Ok(v) => v,
        // A panic in a request task is a bug here; surface it unchanged.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("request task cancelled: {e}"),
    }
}

/// Runs the whole load and returns every finished request.
pub(crate) async fn drive(load: Load, stop: Stop, seed: u64, shared: Shared) -> Vec<RequestRecord> {
    let deadline = stop.duration.map(|d| Instant::now() + d);
    match load {
        Load::Concurrency(c) => closed_loop(c, stop.max_requests, deadline, shared).await,
        Load::Rate(r) => {
            open_loop(Arrivals::new(seed, r), stop.max_requests, deadline, shared).await
        }
    }
}

async fn closed_loop(
    workers: u64,
    max: Option<u64>,
    deadline: Option<Instant>,
    shared: Shared,
) -> Vec<RequestRecord> {
    let next = Arc::new(AtomicU64::new(0));
    let mut set = JoinSet::new();
    for _ in 0..max.map_or(workers, |m| workers.min(m)) {
        let (next, shared) = (next.clone(), shared.clone());
        set.spawn(async move {
            let mut records = Vec::new();
            while deadline.is_none_or(|d| Instant::now() < d) {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if max.is_some_and(|m| index >= m) {
                    break;
                }
                records.push(shared.send(index).await);
            }
            records
        });
    }
    let mut records = Vec::new();
    while let Some(done) = set.join_next().await {
        records.extend(unwrap_task(done));
    }
    records
}

async fn open_loop(
    mut arrivals: Arrivals,
    max: Option<u64>,
    deadline: Option<Instant>,
    shared: Shared,
) -> Vec<RequestRecord> {
    let mut set = JoinSet::new();
    let mut records = Vec::new();
    // Arrival times are fixed offsets from the start, so a late wake-up is
    // followed by a catch-up burst instead of shifting the whole schedule.
    let mut at = Instant::now();
    for index in 0.. {
        if max.is_some_and(|m| index >= m) {
            break;
        }
        if index > 0 {
            let gap = Duration::try_from_secs_f64(arrivals.next_gap()).ok();
            match gap.and_then(|g| at.checked_add(g)) {
                Some(next) => at = next,
                None => break,
            }
        }
        if deadline.is_some_and(|d| at >= d) {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let shared = shared.clone();
        set.spawn(async move { shared.send(index).await });
        // Reap finished tasks as we go so a long run does not hold them all.
        while let Some(done) = set.try_join_next() {
            records.push(unwrap_task(done));
        }
    }
    while let Some(done) = set.join_next().await {
        records.push(unwrap_task(done));
    }
    records
}
