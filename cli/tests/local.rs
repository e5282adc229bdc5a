//! `ballast local` end to end: real engine processes on loopback, the real router, load
//! from `ballast bench`, decisions read back from `/status`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// These tests measure the control loop's timing; running them one at a time keeps a
/// 2-core machine from starving one of them.
static SERIAL: Mutex<()> = Mutex::new(());

struct Local {
    child: Child,
    router: String,
    admin: String,
    dir: std::path::PathBuf,
}

impl Drop for Local {
    fn drop(&mut self) {
        // SIGTERM drains and stops the replicas; kill only if that takes too long.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ballast() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ballast"))
}

fn start(yaml: &str) -> Local {
    let dir = std::env::temp_dir().join(format!(
        "ballast-local-test-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleet.yaml");
    std::fs::write(&file, yaml).unwrap();
    let mut child = ballast()
        .args([
            "local",
            "--port",
            "0",
            "--admin-port",
            "0",
            "--view",
            "none",
            "--log-dir",
        ])
        .arg(dir.join("logs"))
        .arg(&file)
        .env("BALLAST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("local.log")).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let router = lines.next().unwrap().unwrap();
    let admin = lines.next().unwrap().unwrap();
    std::thread::spawn(move || for _ in lines {});
    Local {
        child,
        router: router
            .strip_prefix("ballast local router listening on ")
            .unwrap()
            .to_string(),
        admin: admin
            .strip_prefix("ballast local admin listening on ")
            .unwrap()
            .to_string(),
        dir,
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn get(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "-m", "5", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Local {
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
        pred: impl Fn(&Value) -> bool,
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
    assert!(metrics.contains("ballast_operator_decisions_total{action=\"ScaleUp\",name=\"chat\",reason=\"CapacityWaiting\"}"), "{metrics}");
    assert!(
        metrics.contains("ballast_operator_decisions_total{action=\"ScaleDown\",name=\"chat\""),
        "{metrics}"
    );
}

#[test]
fn a_tenant_capped_workload_holds_with_a_deferred_reason() {
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

#[test]
fn a_replica_killed_with_sigkill_is_replaced() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let local = start(&FLEET.replace("minReplicas: 1", "minReplicas: 2"));
    local.wait_status("chat", Duration::from_secs(30), "two ready replicas", |s| {
        s["readyReplicas"] == 2
    });
    let children = Command::new("pgrep")
        .args(["-P", &local.child.id().to_string()])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&children.stdout)
        .lines()
        .next()
        .expect("a replica process")
        .to_string();
    assert!(
        Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap()
            .success()
    );
    let s = local.wait_status("chat", Duration::from_secs(30), "a replacement", |s| {
        s["readyReplicas"] == 2
            && s["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Degraded" && c["reason"] == "ReplicaExited")
            })
    });
    assert_eq!(s["desiredReplicas"], 2);
}

#[test]
fn invalid_specs_exit_2_with_the_rule() {
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
