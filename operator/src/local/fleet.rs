//! Supervision of one service's replicas: start them, learn when they are ready, replace
//! the ones that die or stop answering, drain the ones a scale-down removes.
//!
//! The fleet knows nothing about metrics or decisions: the service's control loop tells it
//! how many replicas to run and which ones take traffic, and reads back counts, the
//! router's backends and the scrape targets. What happened is returned as
//! [`FleetEvent`]s, which the control loop logs and turns into conditions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use ballast_crds::InferenceService;

use super::replica::{HealthVerdict, Phase, Replica};
use super::router::Backend;
use crate::status::ReplicaCounts;

/// How long a failed replica may take to stop after SIGTERM before it is killed.
pub const FAILED_GRACE: Duration = Duration::from_secs(5);

/// Something the control loop should know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetEvent {
    /// A replica was started.
    Started { replica: String },
    /// A replica answers `/health` and is in rotation.
    Ready { replica: String },
    /// A replica could not be started at all (the binary is missing, no port).
    SpawnFailed { error: String },
    /// A replica died or failed before serving; it was replaced.
    FailedToStart {
        replica: String,
        error: String,
        log: PathBuf,
    },
    /// A serving replica stopped answering or said it will serve nothing; it is being
    /// stopped and replaced.
    Unhealthy { replica: String, why: String },
    /// A replica's process exited without being asked to; it was replaced.
    Exited {
        replica: String,
        status: String,
        log: PathBuf,
    },
    /// A failed replica did not stop within [`FAILED_GRACE`] and was killed.
    Killed { replica: String },
    /// A drained replica finished and exited.
    Drained { replica: String },
}

/// What [`drain_order`] needs to know about a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainCandidate {
    /// Serving.
    pub ready: bool,
    /// In rotation.
    pub accepting: bool,
    /// When it was started.
    pub started: Instant,
}

/// Which replicas a scale-down removes first: those serving least. Starting replicas,
/// then those out of rotation, then the newest. Returns indexes into `candidates`.
pub fn drain_order(candidates: &[DrainCandidate]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|&i| {
        let c = &candidates[i];
        (c.ready, c.accepting, std::cmp::Reverse(c.started))
    });
    order
}

/// One service's replicas.
pub struct Fleet {
    service: String,
    isvc: InferenceService,
    engine_bin: PathBuf,
    log_dir: PathBuf,
    health_client: reqwest::Client,
    control_token_file: PathBuf,
    replicas: Vec<Replica>,
    in_flight: BTreeMap<String, Arc<AtomicUsize>>,
    next_index: usize,
}

impl Fleet {
    /// An empty fleet of `isvc`'s replicas, started from `engine_bin`, logging to
    /// `log_dir`, their control API guarded by `control_token_file`; `health_client` polls
    /// their `/health`.
    pub fn new(
        isvc: InferenceService,
        engine_bin: PathBuf,
        log_dir: PathBuf,
        health_client: reqwest::Client,
        control_token_file: PathBuf,
    ) -> Self {
        Self {
            service: isvc.metadata.name.clone().unwrap_or_default(),
            isvc,
            engine_bin,
            log_dir,
            health_client,
            control_token_file,
            replicas: Vec::new(),
            in_flight: BTreeMap::new(),
            next_index: 0,
        }
    }

    /// The replicas, in start order.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// Advances every replica (announced, healthy, unhealthy, exited) and then starts or
    /// drains replicas until `desired` are running or on their way.
    pub fn supervise(&mut self, desired: i32) -> Vec<FleetEvent> {
        let mut events = Vec::new();
        let mut i = 0;
        while i < self.replicas.len() {
            let r = &mut self.replicas[i];
            if let Some(status) = r.exited() {
                let replica = r.name.clone();
                match r.phase {
                    Phase::Draining => events.push(FleetEvent::Drained { replica }),
                    // Already reported when it was found unhealthy.
                    Phase::Failed => {}
                    Phase::Starting | Phase::Ready => events.push(FleetEvent::Exited {
                        replica,
                        status: status.to_string(),
                        log: r.log.clone(),
                    }),
                }
                self.remove(i);
                continue;
            }
            if let Err(error) = r.poll_announced(&self.health_client) {
                events.push(FleetEvent::FailedToStart {
                    replica: r.name.clone(),
                    error,
                    log: r.log.clone(),
                });
                r.fail();
            }
            match (r.phase, r.health()) {
                (Phase::Starting, HealthVerdict::Healthy) => {
                    r.phase = Phase::Ready;
                    events.push(FleetEvent::Ready {
                        replica: r.name.clone(),
                    });
                }
                (Phase::Starting | Phase::Ready, HealthVerdict::Unhealthy(why)) => {
                    events.push(FleetEvent::Unhealthy {
                        replica: r.name.clone(),
                        why,
                    });
                    r.fail();
                }
                _ => {}
            }
            if r.phase == Phase::Failed
                && r.stopping_since.is_some_and(|t| t.elapsed() > FAILED_GRACE)
                && r.exited().is_none()
            {
                r.kill_now();
                // Killed once: the process is reaped at a later tick.
                r.stopping_since = None;
                events.push(FleetEvent::Killed {
                    replica: r.name.clone(),
                });
            }
            i += 1;
        }
        events.extend(self.reconcile_count(desired));
        events
    }

    fn remove(&mut self, i: usize) {
        let r = self.replicas.remove(i);
        self.in_flight.remove(&r.name);
    }

    /// Starts or drains replicas until the live (not leaving) count is `desired`.
    fn reconcile_count(&mut self, desired: i32) -> Vec<FleetEvent> {
        let mut events = Vec::new();
        let live: Vec<usize> = (0..self.replicas.len())
            .filter(|&i| matches!(self.replicas[i].phase, Phase::Starting | Phase::Ready))
            .collect();
        let have = live.len() as i32;
        for _ in have..desired {
            let name = format!("{}-{}", self.service, self.next_index);
            self.next_index += 1;
            match Replica::spawn(
                &self.engine_bin,
                &self.isvc,
                name.clone(),
                &self.log_dir,
                &self.control_token_file,
            ) {
                Ok(r) => {
                    self.replicas.push(r);
                    events.push(FleetEvent::Started { replica: name });
                }
                Err(e) => {
                    events.push(FleetEvent::SpawnFailed {
                        error: e.to_string(),
                    });
                    break;
                }
            }
        }
        if have > desired {
            let candidates: Vec<DrainCandidate> = live
                .iter()
                .map(|&i| {
                    let r = &self.replicas[i];
                    DrainCandidate {
                        ready: r.phase == Phase::Ready,
                        accepting: r.accepting,
                        started: r.started,
                    }
                })
                .collect();
            for k in drain_order(&candidates)
                .into_iter()
                .take((have - desired) as usize)
            {
                let r = &mut self.replicas[live[k]];
                tracing::info!(target: "ballast::local", service = %self.service, replica = %r.name, "draining replica");
                r.drain();
            }
        }
        events
    }

    /// Replicas by state: ready (serving, in rotation or not), starting (replacements
    /// included), draining (after a scale-down, or failed and stopping), accepting (ready
    /// and in rotation).
    pub fn counts(&self) -> ReplicaCounts {
        let mut c = ReplicaCounts::default();
        for r in &self.replicas {
            match r.phase {
                Phase::Ready => {
                    c.ready += 1;
                    c.accepting += r.accepting as i32;
                }
                Phase::Starting => c.starting += 1,
                Phase::Draining | Phase::Failed => c.draining += 1,
            }
        }
        c
    }

    /// The router's backends: ready replicas in rotation.
    pub fn backends(&mut self) -> Vec<Backend> {
        let mut backends = Vec::new();
        for r in &self.replicas {
            if r.phase == Phase::Ready
                && r.accepting
                && let Some(url) = r.base_url()
            {
                let in_flight = Arc::clone(self.in_flight.entry(r.name.clone()).or_default());
                backends.push(Backend {
                    name: r.name.clone(),
                    url,
                    in_flight,
                });
            }
        }
        backends
    }

    /// Takes replicas out of rotation or puts them back, by name.
    pub fn set_accepting(&mut self, take_out: &[String], restore: &[String]) {
        for r in &mut self.replicas {
            if take_out.contains(&r.name) {
                r.accepting = false;
            }
            if restore.contains(&r.name) && r.phase == Phase::Ready {
                r.accepting = true;
            }
        }
    }

    /// Drains every replica and waits for them, killing what does not stop in `grace`.
    pub async fn shutdown(&mut self, grace: Duration) {
        for r in &mut self.replicas {
            if matches!(r.phase, Phase::Starting | Phase::Ready) {
                r.drain();
            }
        }
        for r in &mut self.replicas {
            if tokio::time::timeout(grace, r.wait()).await.is_err() {
                r.kill().await;
            }
        }
        self.replicas.clear();
        self.in_flight.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_down_removes_what_serves_least_first() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let c = |ready, accepting, started| DrainCandidate {
            ready,
            accepting,
            started: at(started),
        };
        let candidates = [
            c(true, true, 0),   // oldest, serving
            c(true, true, 5),   // newer, serving
            c(false, true, 9),  // still starting
            c(true, false, 1),  // out of rotation
            c(false, true, 10), // the newest starting one
        ];
        assert_eq!(drain_order(&candidates), [4, 2, 3, 1, 0]);
        assert!(drain_order(&[]).is_empty());
    }
}
