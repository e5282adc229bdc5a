//! Engine replicas as child processes on loopback.
//!
//! A replica is `ballast engine --port 0 --grpc-port P …` started from the same binary. It
//! announces its addresses on stdout ("… control API listening on …" then "… listening
//! on …"); reading those lines is how the runtime learns where the engine serves. From
//! then on a small task polls its `/health` every [`HEALTH_INTERVAL`]: a replica is ready
//! once it answers 200, and unhealthy when it answers 503 (its core stopped, or something
//! else drained it) or stops answering ([`HealthReport::verdict`]). Engine logs go to a
//! file per replica.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

use ballast_crds::InferenceService;

/// How often a replica's `/health` is polled.
pub const HEALTH_INTERVAL: Duration = Duration::from_millis(250);
/// How long one `/health` call may take.
pub const HEALTH_TIMEOUT: Duration = Duration::from_millis(1000);
/// Consecutive unanswered polls after which a replica is unhealthy.
pub const MISSED_POLLS: u32 = 4;

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Spawned, not serving yet (building the model, or not answering `/health` yet).
    Starting,
    /// Serving: `/health` answers 200.
    Ready,
    /// Removed from rotation and told to drain; exits when its requests are done.
    Draining,
    /// Found unhealthy: out of rotation, told to stop, killed if it does not; a
    /// replacement is started meanwhile.
    Failed,
}

/// The latest `/health` polls of one replica.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthReport {
    /// Polls answered so far (any status).
    pub answered: u64,
    /// Status of the latest answer.
    pub last_status: Option<u16>,
    /// Polls in a row without an answer (refused, timed out), and the latest error.
    pub missed: u32,
    /// The latest error, when the latest poll got no answer.
    pub last_error: Option<String>,
}

/// What the polls say about a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthVerdict {
    /// No answer yet, but not long enough to judge.
    Unknown,
    /// `/health` answers 200.
    Healthy,
    /// It answers 503 (core stopped or drained) or stopped answering; why.
    Unhealthy(String),
}

impl HealthReport {
    /// Judges the polls: a 503 is unhealthy at once (the engine says it will serve
    /// nothing); silence is unhealthy after [`MISSED_POLLS`] polls in a row, so one slow
    /// answer under load does not replace a replica.
    pub fn verdict(&self) -> HealthVerdict {
        if self.missed >= MISSED_POLLS {
            let why = self.last_error.as_deref().unwrap_or("no answer");
            return HealthVerdict::Unhealthy(format!(
                "no answer to /health in {} polls ({why})",
                self.missed
            ));
        }
        match self.last_status {
            _ if self.missed > 0 && self.answered == 0 => HealthVerdict::Unknown,
            Some(200) => HealthVerdict::Healthy,
            Some(503) => HealthVerdict::Unhealthy(
                "/health answers 503: its engine core stopped or it is draining".into(),
            ),
            Some(other) => HealthVerdict::Unhealthy(format!("/health answers {other}")),
            None => HealthVerdict::Unknown,
        }
    }

    fn record(&mut self, result: Result<u16, String>) {
        match result {
            Ok(status) => {
                self.answered += 1;
                self.last_status = Some(status);
                self.missed = 0;
                self.last_error = None;
            }
            Err(e) => {
                self.missed += 1;
                self.last_error = Some(e);
            }
        }
    }
}

/// Polls `GET {url}/health` until every receiver is gone.
async fn poll_health(client: reqwest::Client, url: String, tx: watch::Sender<HealthReport>) {
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let result = match client.get(&url).timeout(HEALTH_TIMEOUT).send().await {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) if e.is_timeout() => Err("timed out".to_string()),
            Err(e) if e.is_connect() => Err("connection refused".to_string()),
            Err(e) => Err(e.to_string()),
        };
        tx.send_modify(|r| r.record(result));
        if tx.is_closed() {
            return;
        }
    }
}

/// One engine process.
pub struct Replica {
    /// `<service>-<n>`.
    pub name: String,
    /// Life phase.
    pub phase: Phase,
    /// Taking new traffic from the router (false: out of rotation, by rebalancing).
    pub accepting: bool,
    /// HTTP address once ready.
    pub http: Option<SocketAddr>,
    /// Control API address.
    pub grpc: Option<SocketAddr>,
    /// When it was spawned.
    pub started: Instant,
    /// Engine log file.
    pub log: PathBuf,
    /// When it was found unhealthy or told to drain.
    pub stopping_since: Option<Instant>,
    child: Child,
    ready: Option<oneshot::Receiver<Result<Announced, String>>>,
    health: Option<watch::Receiver<HealthReport>>,
}

/// Addresses a replica announced.
#[derive(Debug, Clone, Copy)]
struct Announced {
    http: SocketAddr,
    grpc: Option<SocketAddr>,
}

/// A free loopback port for the control API. The engine binds it right away; if another
/// process wins the race the engine exits with a bind error and the runtime starts a new
/// replica.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Replica {
    /// Spawns a replica of `isvc` from the engine binary `bin`, logging to `log_dir`, its
    /// control API requiring the token in `control_token_file`.
    pub fn spawn(
        bin: &Path,
        isvc: &InferenceService,
        name: String,
        log_dir: &Path,
        control_token_file: &Path,
    ) -> std::io::Result<Self> {
        let grpc_port = free_port()?;
        let log = log_dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log)?;
        let mut child = Command::new(bin)
            .args(crate::engine_args::ballast(
                isvc,
                crate::engine_args::Listen {
                    host: "127.0.0.1",
                    port: 0,
                    grpc_port: i32::from(grpc_port),
                },
            ))
            .env("BALLAST_CONTROL_TOKEN_FILE", control_token_file)
            .env(
                "BALLAST_LOG",
                std::env::var("BALLAST_ENGINE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut grpc = None;
            let result = loop {
                match lines.next_line().await {
                    Ok(Some(line)) => {
                        if let Some(a) =
                            line.strip_prefix("ballast engine control API listening on http://")
                        {
                            grpc = a.parse().ok();
                        } else if let Some(a) =
                            line.strip_prefix("ballast engine listening on http://")
                        {
                            break a
                                .parse()
                                .map(|http| Announced { http, grpc })
                                .map_err(|e| format!("bad address {a:?}: {e}"));
                        }
                    }
                    Ok(None) => break Err("exited before serving".to_string()),
                    Err(e) => break Err(e.to_string()),
                }
            };
            let _ = tx.send(result);
            // Keep draining stdout so the engine never blocks on a full pipe.
            while let Ok(Some(_)) = lines.next_line().await {}
        });
        Ok(Self {
            name,
            phase: Phase::Starting,
            accepting: true,
            http: None,
            grpc: None,
            started: Instant::now(),
            log,
            stopping_since: None,
            child,
            ready: Some(rx),
            health: None,
        })
    }

    /// Takes in the announced addresses once they came (then starts polling `/health` with
    /// `client`). An error when it died before announcing.
    pub fn poll_announced(&mut self, client: &reqwest::Client) -> Result<(), String> {
        let Some(rx) = &mut self.ready else {
            return Ok(());
        };
        match rx.try_recv() {
            Ok(Ok(a)) => {
                self.ready = None;
                self.http = Some(a.http);
                self.grpc = a.grpc;
                let (tx, rx) = watch::channel(HealthReport::default());
                tokio::spawn(poll_health(
                    client.clone(),
                    format!("http://{}/health", a.http),
                    tx,
                ));
                self.health = Some(rx);
                Ok(())
            }
            Ok(Err(e)) => {
                self.ready = None;
                Err(e)
            }
            Err(oneshot::error::TryRecvError::Empty) => Ok(()),
            Err(oneshot::error::TryRecvError::Closed) => {
                self.ready = None;
                Err("stopped before serving".into())
            }
        }
    }

    /// What the `/health` polls say (Unknown before the replica announced itself).
    pub fn health(&self) -> HealthVerdict {
        self.health
            .as_ref()
            .map_or(HealthVerdict::Unknown, |rx| rx.borrow().verdict())
    }

    /// The exit status if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Starts draining: SIGTERM makes the engine refuse new requests, finish in-flight ones
    /// and exit 0. The router has already stopped sending it traffic.
    pub fn drain(&mut self) {
        self.phase = Phase::Draining;
        self.stop();
    }

    /// Marks it failed and asks it to stop (SIGTERM); the runtime kills it if it does not
    /// exit within its grace period.
    pub fn fail(&mut self) {
        self.phase = Phase::Failed;
        self.stop();
    }

    fn stop(&mut self) {
        self.accepting = false;
        self.health = None;
        self.stopping_since.get_or_insert_with(Instant::now);
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
    }

    /// Sends SIGKILL without waiting (a failed replica past its grace period).
    pub fn kill_now(&mut self) {
        let _ = self.child.start_kill();
    }

    /// Kills the process at once (shutdown after a drain timeout).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.wait().await.ok()
    }

    /// Base URL of the engine's HTTP API.
    pub fn base_url(&self) -> Option<String> {
        self.http.map(|a| format!("http://{a}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(polls: &[Result<u16, &str>]) -> HealthReport {
        let mut r = HealthReport::default();
        for p in polls {
            r.record(p.map_err(str::to_string));
        }
        r
    }

    #[test]
    fn health_verdicts() {
        assert_eq!(report(&[]).verdict(), HealthVerdict::Unknown);
        assert_eq!(report(&[Err("refused")]).verdict(), HealthVerdict::Unknown);
        assert_eq!(report(&[Ok(200)]).verdict(), HealthVerdict::Healthy);
        assert!(matches!(
            report(&[Ok(200), Ok(503)]).verdict(),
            HealthVerdict::Unhealthy(why) if why.contains("503")
        ));
        // One or a few missed polls under load do not condemn a replica...
        let slow = [
            Ok(200),
            Err("timed out"),
            Err("timed out"),
            Err("timed out"),
        ];
        assert_eq!(report(&slow).verdict(), HealthVerdict::Healthy);
        // ...and an answer resets the count.
        let mut again = slow.to_vec();
        again.extend([Ok(200), Err("timed out")]);
        assert_eq!(report(&again).verdict(), HealthVerdict::Healthy);
        // Four in a row do.
        let mut silent = slow.to_vec();
        silent.push(Err("timed out"));
        assert!(matches!(
            report(&silent).verdict(),
            HealthVerdict::Unhealthy(why) if why.contains("4 polls") && why.contains("timed out")
        ));
        // A replica that never answered is judged the same way.
        let never = [Err("refused"); 4];
        assert!(matches!(
            report(&never).verdict(),
            HealthVerdict::Unhealthy(_)
        ));
    }
}
