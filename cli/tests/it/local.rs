//! `ballast local` end to end: real engine processes on loopback, the real router, load
//! from `ballast bench`, decisions read back from `/status`.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::get;
use common::local::Local;
use serde_json::Value;

/// These tests measure the control loop's timing; running them one at a time keeps a
/// 2-core machine from starving one of them.
static SERIAL: Mutex<()> = Mutex::new(());

fn ballast() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ballast"))
}

fn start(yaml: &str) -> Local {
    Local::start("local-test", yaml)
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

impl Local {
    /// One service's replicas from `/replicas`.
    fn replicas(&self, name: &str) -> Vec<Value> {
        let text = get(&format!("{}/replicas", self.admin)).unwrap_or_default();
        serde_json::from_str::<Value>(&text).unwrap_or(Value::Null)[name]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// One replica from `/replicas`, waiting until it announced its addresses.
    fn replica(&self, replica: &str) -> Value {
        let service = replica.rsplit_once('-').unwrap().0;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(r) = self
                .replicas(service)
                .into_iter()
                .find(|r| r["name"] == replica && r["url"].is_string())
            {
                return r;
            }
            assert!(Instant::now() < deadline, "no replica {replica}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn status(&self, name: &str) -> Value {
        let text = get(&format!("{}/status", self.admin)).unwrap_or_default();
        serde_json::from_str::<Value>(&text).unwrap_or(Value::Null)[name].clone()
    }

    /// Polls the service's status until `pred` holds; panics with the last status and the
    /// operator's log after `timeout`.
    fn wait_status(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status(name);
            if pred(&s) {
                return s;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("local.log")).unwrap_or_default();
                panic!("timed out waiting for {what}; status {s:#}\nlog:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `ballast bench` against the router in the background.
    fn bench(&self, args: &[&str]) -> (Child, std::path::PathBuf) {
        let json = self.dir.join(format!("bench-{}.json", rand_suffix()));
        let child = ballast()
            .args([
                "bench",
                "--url",
                &self.router,
                "--no-progress",
                "--ignore-eos",
                "--json",
            ])
            .arg(&json)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        (child, json)
    }
}

/// Whether the status has a `Degraded` condition with this status and reason.
fn has_condition(s: &Value, status: &str, reason: &str) -> bool {
    s["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Degraded" && c["status"] == status && c["reason"] == reason)
    })
}

fn report(mut child: Child, json: &std::path::Path) -> Value {
    assert!(child.wait().unwrap().success(), "bench failed");
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

const FLEET: &str = r#"
apiVersion: ballast.dev/v1alpha1
kind: InferenceService
metadata: {name: chat}
spec:
  model: {source: "synthetic:tiny"}
  engine: {maxNumSeqs: 2}
  autoscaling:
    minReplicas: 1
    maxReplicas: 3
    behavior:
      scaleDown: {stabilizationWindowSeconds: 6}
  metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}
"#;

#[test]
fn load_scales_up_within_two_periods_and_back_down_with_no_failed_request() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(FLEET);
    local.wait_status("chat", Duration::from_secs(30), "one ready replica", |s| {
        s["readyReplicas"] == 1
    });
    let load_start = Instant::now();
    let (bench, json) = local.bench(&[
        "--concurrency",
        "24",
        "--duration",
        "14",
        "--input-len",
        "32",
        "--output-len",
        "300",
    ]);
    let s = local.wait_status("chat", Duration::from_secs(20), "a scale-up", |s| {
        s["desiredReplicas"].as_i64() > Some(1)
    });
    let took = load_start.elapsed();
    assert_eq!(s["lastDecision"]["action"], "ScaleUp", "{s:#}");
    assert_eq!(s["lastDecision"]["reason"], "CapacityWaiting", "{s:#}");
    // Two control periods of 2 s, plus the first period's phase and scheduling slack.
    assert!(took <= Duration::from_secs(6), "scale-up took {took:?}");
    local.wait_status(
        "chat",
        Duration::from_secs(30),
        "the new replicas ready",
        |s| s["readyReplicas"].as_i64() > Some(1),
    );
    let r = report(bench, &json);
    assert_eq!(r["requests"]["failed"], 0, "{r:#}");
    assert_eq!(r["requests"]["rejected"], 0, "{r:#}");
    assert!(r["requests"]["ok"].as_u64().unwrap() > 24);
    // Without load, every signal is below target for the whole 6 s window: back to 1,
    // draining the extra replicas.
    let s = local.wait_status("chat", Duration::from_secs(40), "a scale-down", |s| {
        s["desiredReplicas"] == 1 && s["replicas"] == 1
    });
    assert_eq!(s["readyReplicas"], 1, "{s:#}");
    let metrics = get(&format!("{}/metrics", local.admin)).unwrap();
    assert!(metrics.contains("ballast_operator_decisions_total{action=\"ScaleUp\",name=\"chat\",namespace=\"local\",reason=\"CapacityWaiting\"}"), "{metrics}");
    assert!(
        metrics.contains("ballast_operator_decisions_total{action=\"ScaleDown\",name=\"chat\",namespace=\"local\""),
        "{metrics}"
    );
    // What dashboards and alerts read: each signal against its target, the bounds, the
    // conditions as 0/1 series, and leadership (one process always leads).
    for line in [
        "ballast_operator_signal_target{name=\"chat\",namespace=\"local\",signal=\"capacityWaiting\"} ",
        "ballast_operator_signal_observed{name=\"chat\",namespace=\"local\",signal=\"capacityWaiting\"} 0",
        "ballast_operator_min_replicas{name=\"chat\",namespace=\"local\"} 1",
        "ballast_operator_max_replicas{name=\"chat\",namespace=\"local\"} 3",
        "ballast_operator_condition{name=\"chat\",namespace=\"local\",status=\"True\",type=\"Ready\"} 1",
        "ballast_operator_condition{name=\"chat\",namespace=\"local\",status=\"False\",type=\"Ready\"} 0",
        "ballast_operator_condition{name=\"chat\",namespace=\"local\",status=\"True\",type=\"MetricsAvailable\"} 1",
        "ballast_operator_leader 1",
    ] {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
}

#[test]
fn a_tenant_capped_workload_holds_with_a_deferred_reason() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(&FLEET.replace(
        "engine: {maxNumSeqs: 2}",
        "engine: {maxNumSeqs: 8, maxRunningPerTenant: 1}",
    ));
    local.wait_status("chat", Duration::from_secs(30), "one ready replica", |s| {
        s["readyReplicas"] == 1
    });
    let (bench, json) = local.bench(&[
        "--concurrency",
        "12",
        "--duration",
        "8",
        "--tenants",
        "1",
        "--input-len",
        "16",
        "--output-len",
        "300",
    ]);
    let s = local.wait_status("chat", Duration::from_secs(20), "a deferred hold", |s| {
        s["lastDecision"]["reason"] == "DeferredWaiting"
    });
    assert_eq!(s["lastDecision"]["action"], "Hold", "{s:#}");
    assert!(
        s["lastDecision"]["signals"]["deferredWaiting"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{s:#}"
    );
    let r = report(bench, &json);
    assert_eq!(r["requests"]["failed"], 0, "{r:#}");
    assert_eq!(
        local.status("chat")["desiredReplicas"],
        1,
        "adding replicas would not help deferred requests"
    );
}

/// The pid of a replica: the child process of `ballast local` whose command line has the
/// control port `/replicas` lists for it.
fn replica_pid(local: &Local, replica: &str) -> String {
    let children = Command::new("pgrep")
        .args(["-P", &local.child.id().to_string()])
        .output()
        .unwrap();
    let grpc = local.replica(replica)["grpc"]
        .as_str()
        .expect("replica announced its control API")
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    String::from_utf8_lossy(&children.stdout)
        .lines()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .is_ok_and(|cmd| cmd.contains(&format!("--grpc-port {grpc} ")))
        })
        .unwrap_or_else(|| panic!("no process for {replica}"))
        .to_string()
}

fn signal(pid: &str, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, pid])
            .status()
            .unwrap()
            .success()
    );
}

/// kill -9 of a replica under load: the requests it held fail before any byte reached
/// their clients, so the router retries them on the other replica; no client sees an
/// error, and the dead replica is replaced.
#[test]
fn a_replica_killed_under_load_fails_no_request_and_is_replaced() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(&FLEET.replace("minReplicas: 1", "minReplicas: 2"));
    local.wait_status("chat", Duration::from_secs(30), "two ready replicas", |s| {
        s["readyReplicas"] == 2
    });
    let (bench, json) = local.bench(&[
        "--concurrency",
        "6",
        "--duration",
        "8",
        "--input-len",
        "16",
        "--output-len",
        "200",
    ]);
    std::thread::sleep(Duration::from_secs(3));
    signal(&replica_pid(&local, "chat-0"), "-9");
    let mut seen = false;
    let s = local.wait_status("chat", Duration::from_secs(30), "a replacement", |s| {
        seen |= has_condition(s, "True", "ReplicaExited");
        seen && s["readyReplicas"] == 2 && has_condition(s, "False", "ReplicasRecovered")
    });
    assert_eq!(s["desiredReplicas"], 2);
    let r = report(bench, &json);
    assert_eq!(r["requests"]["failed"], 0, "retried, not failed: {r:#}");
    assert!(r["requests"]["ok"].as_u64().unwrap() > 6, "{r:#}");
    let names: Vec<String> = local
        .replicas("chat")
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!names.contains(&"chat-0".to_string()), "{names:?}");
}

/// A replica that stops answering (SIGSTOP: alive, silent) is found by its `/health`
/// polls, taken out, killed and replaced; meanwhile the control loop keeps deciding on
/// schedule: its scrape and control calls to the hung replica are bounded by timeouts.
#[test]
fn a_hung_replica_is_replaced_and_the_control_loop_goes_on() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(&FLEET.replace("minReplicas: 1", "minReplicas: 2"));
    local.wait_status("chat", Duration::from_secs(30), "two ready replicas", |s| {
        s["readyReplicas"] == 2 && s["lastDecision"]["time"].is_string()
    });
    let pid = replica_pid(&local, "chat-1");
    signal(&pid, "-STOP");
    let hung_at = Instant::now();
    let mut decisions = std::collections::BTreeSet::new();
    let mut seen = false;
    let s = local.wait_status(
        "chat",
        Duration::from_secs(30),
        "the hung replica replaced",
        |s| {
            if let Some(t) = s["lastDecision"]["time"].as_str() {
                decisions.insert(t.to_string());
            }
            seen |= has_condition(s, "True", "ReplicaUnhealthy");
            seen && s["readyReplicas"] == 2 && has_condition(s, "False", "ReplicasRecovered")
        },
    );
    let took = hung_at.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "replacement took {took:?}: {s:#}"
    );
    assert!(
        decisions.len() >= 2,
        "decisions went on while a replica hung: {decisions:?}"
    );
    // The hung process is killed after its grace period, not left behind.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::path::Path::new(&format!("/proc/{pid}/stat")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| !st.contains(") Z "))
    {
        assert!(
            Instant::now() < deadline,
            "hung replica {pid} still running"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (bench, json) = local.bench(&[
        "--num-requests",
        "8",
        "--concurrency",
        "4",
        "--output-len",
        "8",
    ]);
    assert_eq!(report(bench, &json)["requests"]["failed"], 0);
}

/// A replica whose `/health` answers 503 (its core stopped, or something drained it behind
/// the operator's back, as here through its control API) is taken out and replaced.
#[test]
fn a_replica_answering_503_is_replaced() {
    let _group = crate::common::group(module_path!());
    use ballast_engine::api::control::proto::DrainRequest;
    use ballast_engine::api::control::proto::engine_control_client::EngineControlClient;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(&FLEET.replace("minReplicas: 1", "minReplicas: 2"));
    local.wait_status("chat", Duration::from_secs(30), "two ready replicas", |s| {
        s["readyReplicas"] == 2
    });
    let grpc = local.replica("chat-0")["grpc"]
        .as_str()
        .unwrap()
        .to_string();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut c = EngineControlClient::connect(grpc).await.unwrap();
            // The run's control token guards every replica: without it nothing drains.
            let refused = c.drain(DrainRequest {}).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
            let file = local.dir.join("logs").join("control-token");
            let mode = std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(&file).unwrap().permissions(),
            );
            assert_eq!(
                mode & 0o077,
                0,
                "the token file is this user's only: {mode:o}"
            );
            let token = std::fs::read_to_string(&file).unwrap();
            let mut req = tonic::Request::new(DrainRequest {});
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {}", token.trim()).parse().unwrap(),
            );
            c.drain(req).await.unwrap();
        });
    let mut seen = false;
    let s = local.wait_status("chat", Duration::from_secs(20), "a replacement", |s| {
        seen |= s["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["type"] == "Degraded"
                    && c["reason"] == "ReplicaUnhealthy"
                    && c["message"].as_str().is_some_and(|m| m.contains("503"))
            })
        });
        seen && s["readyReplicas"] == 2 && has_condition(s, "False", "ReplicasRecovered")
    });
    assert_eq!(s["desiredReplicas"], 2, "{s:#}");
    let names: Vec<Value> = local
        .replicas("chat")
        .iter()
        .map(|r| r["name"].clone())
        .collect();
    assert!(!names.contains(&Value::from("chat-0")), "{names:?}");
}

/// Requests sent the moment `ballast local` announces its router wait for the first
/// replica instead of failing, and `/status` lists the service from that moment on.
#[test]
fn requests_at_start_up_wait_for_the_first_replica() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(FLEET);
    let s = local.status("chat");
    assert_eq!(
        s["desiredReplicas"], 1,
        "listed before any replica is ready: {s:#}"
    );
    assert_eq!(s["readyReplicas"], 0, "{s:#}");
    let (bench, json) = local.bench(&[
        "--num-requests",
        "8",
        "--concurrency",
        "8",
        "--output-len",
        "8",
    ]);
    let r = report(bench, &json);
    assert_eq!(r["requests"]["ok"], 8, "{r:#}");
    assert_eq!(r["requests"]["failed"], 0, "{r:#}");
}

/// The router takes what an engine takes, no more, no less: a body just under the
/// engine's limit reaches the replica (which answers for itself), one over it gets the
/// router's 413 with a JSON body.
#[test]
fn the_router_body_limit_is_the_engines() {
    let _group = crate::common::group(module_path!());
    assert_eq!(
        ballast_operator::local::router::MAX_BODY_BYTES,
        ballast_engine::api::http::MAX_BODY_BYTES
    );
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(FLEET);
    local.wait_status("chat", Duration::from_secs(30), "one ready replica", |s| {
        s["readyReplicas"] == 1
    });
    let limit = ballast_engine::api::http::MAX_BODY_BYTES;
    let body = |len: usize| {
        let prompt = "x".repeat(len - 40);
        format!(r#"{{"prompt":"{prompt}","max_tokens":1}}"#)
    };
    let post = |payload: String| {
        let file = local.dir.join("body.json");
        std::fs::write(&file, payload).unwrap();
        let out = Command::new("curl")
            .args([
                "-s",
                "-m",
                "60",
                "-D",
                "-",
                "-H",
                "content-type: application/json",
                "-H",
                "Expect:",
            ])
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .arg(format!("{}/v1/completions", local.router))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let under = post(body(limit - 1024));
    assert!(
        under.contains("x-ballast-replica: chat-0"),
        "reached the replica: {under}"
    );
    assert!(under.contains("context_length_exceeded"), "{under}");
    let over = post(body(limit + 1024));
    assert!(over.starts_with("HTTP/1.1 413"), "{over}");
    assert!(over.contains("\"body_too_large\""), "{over}");
}

/// `ballast local`'s servers run the engine's accept loop: a request head over the limit
/// gets 431 from the router, and on the admin port a flood of slow-loris connections (each
/// sends half a request head, then nothing) is cut to the cap at once, locks out no
/// normal client, and what is left of it is closed by the header timeout.
#[test]
fn the_admin_port_and_the_router_have_the_engines_connection_limits() {
    let _group = crate::common::group(module_path!());
    // The test holds hundreds of sockets; raise its own soft limit as the servers do.
    ballast_serve::raise_open_files_limit();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(FLEET);
    let raw = |base: &str, head: &str| -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(base.strip_prefix("http://").unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    let big = "x".repeat(64 << 10);
    let answer = raw(
        &local.router,
        &format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\nConnection: close\r\n\r\n"),
    );
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let cap = ballast_operator::ADMIN_HTTP_LIMITS.max_connections;
    let flood = cap + 300;
    let addr = local.admin.strip_prefix("http://").unwrap().to_string();
    let started = Instant::now();
    let mut loris = common::Held::new(
        (0..flood)
            .map(|_| {
                use std::io::Write;
                let mut s = std::net::TcpStream::connect(&addr).unwrap();
                let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ");
                s
            })
            .collect(),
    );
    // The header timeout runs from each accept, which a loaded machine may make seconds
    // after `started`; the bound below runs from the last connect.
    let connected = Instant::now();
    for _ in 0..5 {
        let t = Instant::now();
        let answer = raw(
            &local.admin,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "served in {:?} behind {flood} slow clients",
            t.elapsed()
        );
    }
    let at_once = loris.closed();
    assert!(
        at_once >= flood - cap,
        "{at_once} of {flood} slow connections closed; the cap is {cap}"
    );
    // The rest wait at most the header timeout (and the timer's rounding).
    let header = ballast_operator::ADMIN_HTTP_LIMITS.header_timeout;
    let deadline = connected + header + Duration::from_secs(6);
    let mut all = at_once;
    while all < flood && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        all = loris.closed();
    }
    assert_eq!(
        all,
        flood,
        "slow connections still open {:?} after the last connect ({:?} after the first), header timeout {header:?}",
        connected.elapsed(),
        started.elapsed()
    );
}

/// A replica made hot by long-context load sent to it directly leaves the router's
/// rotation while the fleet has headroom, never below minAccepting, and returns once it
/// cools; each step is a decision that says so.
#[test]
fn a_hot_replica_leaves_rotation_and_returns_when_cool() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(
        r#"
apiVersion: ballast.dev/v1alpha1
kind: InferenceService
metadata: {name: chat}
spec:
  model: {source: "synthetic:tiny"}
  engine: {maxNumSeqs: 8, kvCache: {numBlocks: 64}}
  autoscaling:
    minReplicas: 2
    maxReplicas: 2
    targets: {capacityWaitingPerReplica: 8, kvCacheUsage: 0.99}
  rebalancing: {hotKvCacheUsage: 0.5, coolFraction: 0.8, minAccepting: 1}
  metrics: {scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}
"#,
    );
    local.wait_status("chat", Duration::from_secs(30), "two ready replicas", |s| {
        s["readyReplicas"] == 2 && s["acceptingReplicas"] == 2
    });
    let pin = |replica: &str, seconds: &str| {
        let url = local.replica(replica)["url"].as_str().unwrap().to_string();
        ballast()
            .args([
                "bench",
                "--url",
                &url,
                // Four requests of ~30 blocks each on 64 blocks: two run and two wait. The
                // two running started together and end together; the two waiting take
                // their blocks in the same step, so the replica's KV stays near full
                // instead of dipping each time a pair ends. With one waiting (three
                // requests) it dipped to 24 of 64 blocks, under the cool threshold, until
                // the client sent its next request, and a scrape that landed there let
                // the hot replica back in (CI, 2026-12-06).
                "--concurrency",
                "4",
                "--duration",
                seconds,
            ])
            .args([
                "--input-len",
                "380",
                "--output-len",
                "100",
                "--ignore-eos",
                "--no-progress",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut hot0 = pin("chat-0", "25");
    let s = local.wait_status(
        "chat",
        Duration::from_secs(20),
        "chat-0 out of rotation",
        |s| s["acceptingReplicas"] == 1 && s["lastDecision"]["reason"] == "ReplicaHot",
    );
    assert_eq!(s["lastDecision"]["action"], "Rebalance", "{s:#}");
    let message = s["lastDecision"]["message"].as_str().unwrap();
    assert!(message.contains("chat-0 hot (KV"), "{message}");
    let out: Vec<Value> = local.replicas("chat");
    assert!(
        out.iter()
            .any(|r| r["name"] == "chat-0" && r["accepting"] == false),
        "{out:?}"
    );
    // The router sends new traffic to the other replica only.
    for _ in 0..3 {
        let head = Command::new("curl")
            .args(["-s", "-m", "20", "-D", "-", "-o", "/dev/null"])
            .args(["-d", r#"{"prompt":"hi","max_tokens":2}"#])
            .arg(format!("{}/v1/completions", local.router))
            .output()
            .unwrap();
        let head = String::from_utf8_lossy(&head.stdout);
        assert!(head.contains("x-ballast-replica: chat-1"), "{head}");
    }
    // Both hot: the second stays in rotation so that one replica always accepts.
    let mut hot1 = pin("chat-1", "12");
    local.wait_status(
        "chat",
        Duration::from_secs(20),
        "a hot replica kept in rotation",
        |s| {
            s["lastDecision"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("hot but kept in rotation to keep 1 accepting"))
        },
    );
    for _ in 0..10 {
        let accepting = local.status("chat")["acceptingReplicas"].as_i64().unwrap();
        assert!(accepting >= 1, "never below minAccepting");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Load gone: chat-0 cools and returns.
    let _ = hot0.kill();
    let _ = hot0.wait();
    let _ = hot1.kill();
    let _ = hot1.wait();
    let s = local.wait_status(
        "chat",
        Duration::from_secs(20),
        "chat-0 back in rotation",
        |s| s["acceptingReplicas"] == 2,
    );
    let decisions = get(&format!("{}/metrics", local.admin)).unwrap();
    assert!(
        decisions.contains("ballast_operator_decisions_total{action=\"Rebalance\",name=\"chat\",namespace=\"local\",reason=\"ReplicaCooled\"}"),
        "{decisions}\n{s:#}"
    );
}

#[test]
fn invalid_specs_exit_2_with_the_rule() {
    let _group = crate::common::group(module_path!());
    let dir = std::env::temp_dir().join(format!("ballast-local-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (yaml, needle) in [
        (
            FLEET.replace("minReplicas: 1", "minReplicas: 5"),
            "minReplicas must not exceed maxReplicas",
        ),
        ("not: [yaml".to_string(), "invalid YAML"),
        (
            FLEET.replace(
                "engine: {maxNumSeqs: 2}",
                "engine: {maxNumSeqs: 2, kind: vllm}",
            ),
            "ballast engines only",
        ),
    ] {
        let file = dir.join("bad.yaml");
        std::fs::write(&file, yaml).unwrap();
        let out = ballast()
            .args(["local", "--port", "0", "--admin-port", "0"])
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Debian's Chromium, if installed. With `BALLAST_REQUIRE_CHROMIUM` set (CI installs it),
/// its absence fails the test instead of skipping the browser half.
fn chromium() -> Option<std::path::PathBuf> {
    let path = std::path::PathBuf::from("/usr/bin/chromium");
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("BALLAST_REQUIRE_CHROMIUM").is_none(),
        "BALLAST_REQUIRE_CHROMIUM is set but /usr/bin/chromium is missing"
    );
    eprintln!("skipping the browser half: no /usr/bin/chromium (apt-get install chromium)");
    None
}

/// Loads `url` in headless Chromium, lets its script run for a few seconds of virtual
/// time, and returns what Chromium printed (`--dump-dom`) or wrote (`--screenshot`).
fn headless(chrome: &std::path::Path, dir: &std::path::Path, mode: &str, url: &str) -> Vec<u8> {
    let profile = dir.join(format!("chromium-{}", rand_suffix()));
    let shot = dir.join("page.png");
    let mut cmd = Command::new(chrome);
    // No background networking: this machine's closed network refuses it.
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        "--virtual-time-budget=4000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    match mode {
        "dom" => cmd.arg("--dump-dom"),
        _ => cmd.arg(format!("--screenshot={}", shot.display())),
    };
    let out = cmd.arg(url).stderr(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "chromium failed: {:?}", out.status);
    match mode {
        "dom" => out.stdout,
        _ => std::fs::read(&shot).unwrap(),
    }
}

/// Pixels of a screenshot within a small distance of `rgb`.
fn pixels_near(png_bytes: &[u8], rgb: (u8, u8, u8)) -> usize {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(
        channels >= 3,
        "unexpected PNG colour type {:?}",
        info.color_type
    );
    buf[..info.buffer_size()]
        .chunks(channels)
        .filter(|p| {
            let d = |a: u8, b: u8| (i32::from(a) - i32::from(b)).abs();
            d(p[0], rgb.0) + d(p[1], rgb.1) + d(p[2], rgb.2) < 40
        })
        .count()
}

/// The number after `key="` in the first occurrence of `after` (a DOM attribute).
fn attr_after(dom: &str, after: &str, key: &str) -> Option<u64> {
    let rest = &dom[dom.find(after)? + after.len()..];
    let rest = &rest[rest.find(&format!("{key}=\""))? + key.len() + 2..];
    rest[..rest.find('"')?].parse().ok()
}

#[test]
fn the_live_page_plots_replicas_signals_and_decisions() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(FLEET);
    local.wait_status("chat", Duration::from_secs(30), "one ready replica", |s| {
        s["readyReplicas"] == 1
    });
    let (bench, json) = local.bench(&[
        "--concurrency",
        "24",
        "--duration",
        "10",
        "--input-len",
        "32",
        "--output-len",
        "300",
    ]);
    local.wait_status("chat", Duration::from_secs(30), "a scale-up", |s| {
        s["readyReplicas"].as_i64() > Some(1)
    });
    report(bench, &json);

    // The data endpoint: one sample per control period, each configured signal against
    // its target, and the scale-up on the decision timeline.
    let timeline = |since: f64| -> Value {
        let text = get(&format!("{}/api/timeline?since={since}", local.admin)).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let all = timeline(0.0);
    let chat = &all["services"]["chat"];
    let samples = chat["samples"].as_array().unwrap();
    assert!(samples.len() >= 4, "{chat:#}");
    let times: Vec<f64> = samples.iter().map(|s| s["t"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    for s in samples {
        let cw = &s["signals"]["capacityWaiting"];
        assert_eq!(cw["target"], 4.0, "{s:#}");
        assert!(
            ["above", "within", "below", "missing"].contains(&cw["state"].as_str().unwrap()),
            "{s:#}"
        );
        assert!(s["signals"]["kvCacheUsage"]["target"].is_number(), "{s:#}");
    }
    assert!(
        samples
            .iter()
            .any(|s| s["replicas"]["desired"].as_i64() > Some(1)),
        "{chat:#}"
    );
    let decisions = chat["decisions"].as_array().unwrap();
    let up = decisions
        .iter()
        .find(|d| d["action"] == "ScaleUp")
        .unwrap_or_else(|| panic!("no ScaleUp in {decisions:#?}"));
    assert_eq!(up["reason"], "CapacityWaiting");
    assert!(up["to"].as_i64() > up["from"].as_i64(), "{up:#}");
    assert!(!up["message"].as_str().unwrap().is_empty());
    // `since` returns only what is newer.
    let last = *times.last().unwrap();
    let newer = timeline(last);
    for s in newer["services"]["chat"]["samples"].as_array().unwrap() {
        assert!(s["t"].as_f64().unwrap() > last);
    }
    assert!(newer["now"].as_f64().unwrap() >= last);

    // The page: one self-contained document, nothing fetched from elsewhere.
    let html = get(&format!("{}/", local.admin)).unwrap();
    assert!(html.contains("<script>") && html.contains("api/timeline"));
    for external in ["src=\"http", "href=\"http", "@import", "<link"] {
        assert!(!html.contains(external), "the page loads {external}");
    }

    let Some(chrome) = chromium() else { return };
    let url = format!("{}/", local.admin);
    let dom = String::from_utf8(headless(&chrome, &local.dir, "dom", &url)).unwrap();
    assert!(dom.contains("data-service=\"chat\""), "{dom}");
    let points = attr_after(&dom, "data-series=\"accepting\"", "data-points");
    assert!(
        points >= Some(4),
        "accepting plotted with {points:?} points"
    );
    let points = attr_after(&dom, "data-signal=\"capacityWaiting\"", "data-points");
    assert!(
        points >= Some(4),
        "capacityWaiting plotted with {points:?} points"
    );
    assert!(dom.contains("data-action=\"ScaleUp\""), "{dom}");
    assert!(dom.contains("CapacityWaiting"));

    // The screenshot shows the lines: the accepting replicas' blue and the observed
    // signals' violet, each over many pixels.
    let shot = headless(&chrome, &local.dir, "png", &url);
    let blue = pixels_near(&shot, (0x25, 0x63, 0xeb));
    let violet = pixels_near(&shot, (0x7c, 0x3a, 0xed));
    assert!(blue > 150, "{blue} accepting-blue pixels");
    assert!(violet > 150, "{violet} observed-violet pixels");
}

/// `mode: Advise` in a local fleet: the load that scales the fleet above up is advised
/// (the Advising condition names the size), and the fleet keeps its one replica.
#[test]
fn an_advised_local_fleet_says_what_it_would_do_and_keeps_its_size() {
    let _group = crate::common::group(module_path!());
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(&FLEET.replace("  autoscaling:\n", "  autoscaling:\n    mode: Advise\n"));
    local.wait_status("chat", Duration::from_secs(30), "one ready replica", |s| {
        s["readyReplicas"] == 1
    });
    let (bench, json) = local.bench(&[
        "--concurrency",
        "24",
        "--duration",
        "8",
        "--input-len",
        "32",
        "--output-len",
        "300",
    ]);
    let s = local.wait_status("chat", Duration::from_secs(20), "advice to scale up", |s| {
        s["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "Advising"
                    && c["status"] == "True"
                    && !c["message"]
                        .as_str()
                        .unwrap_or_default()
                        .contains(" 1 replicas advised")
            })
        })
    });
    assert_eq!(s["lastDecision"]["action"], "ScaleUp", "{s:#}");
    let r = report(bench, &json);
    assert_eq!(r["requests"]["failed"], 0, "{r:#}");
    let s = local.wait_status("chat", Duration::from_secs(5), "the status", |_| true);
    assert_eq!(
        (s["replicas"].as_i64(), s["readyReplicas"].as_i64()),
        (Some(1), Some(1)),
        "{s:#}"
    );
}
