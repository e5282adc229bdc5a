//! `ballast operator` end to end on a real Kubernetes control plane (kube-apiserver,
//! kube-controller-manager, kube-scheduler and etcd on loopback; see `e2e/`), with the
//! process kubelet running engine pods as local processes and a kube-proxy stand-in sending
//! load to the ready pods. The operator is installed from the rendered Helm chart
//! (`charts/ballast`): its CRD, RBAC and a two-replica Deployment with leader election,
//! each pod a process with its ServiceAccount's credentials.
//!
//! Skips (saying why) when the control-plane binaries are not installed; set
//! `BALLAST_REQUIRE_E2E=1` to make that a failure. docs/e2e.md says how to build them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ballast_e2e::cluster::{ControlPlane, binaries};
use ballast_e2e::kubelet::{self, KubeletConfig};
use ballast_e2e::proxy;
use common::get;
use serde_json::Value;

fn ballast() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ballast"))
}

/// One operator pod of the chart's Deployment, run by the process kubelet.
struct OperatorPod {
    name: String,
    metrics: String,
    log: PathBuf,
}

impl OperatorPod {
    fn get(&self, path: &str) -> String {
        get(&format!("{}{path}", self.metrics)).unwrap_or_default()
    }

    /// Writes this operator made to the API server for `service` so far.
    fn writes(&self, service: &str) -> f64 {
        self.get("/metrics")
            .lines()
            .filter(|l| {
                l.starts_with("ballast_operator_api_writes_total{")
                    && l.contains(&format!("name=\"{service}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// The namespace the chart is installed in.
const OPERATOR_NS: &str = "ballast-system";

/// Values of the chart for this cluster: the process kubelet maps the image's `ballast`
/// command to the binary under test and gives every pod its own loopback IP, so the
/// metrics port binds the pod IP; a short Lease makes failover quick.
const CHART_VALUES: &str = r#"
image: {repository: ballast, tag: e2e}
operator:
  metrics: {host: "$(POD_IP)"}
  leaderElection: {leaseSeconds: 6}
  logLevel: info
"#;

/// The operator pods that run with an IP and are not being deleted.
fn operator_pods(cp: &ControlPlane, dir: &Path) -> Vec<OperatorPod> {
    let pods = json(
        cp,
        &[
            "get",
            "pods",
            "-n",
            OPERATOR_NS,
            "-l",
            "app.kubernetes.io/component=operator",
        ],
    );
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| {
            let name = p["metadata"]["name"].as_str()?.to_string();
            let ip = p["status"]["podIP"].as_str()?;
            Some(OperatorPod {
                metrics: format!("http://{ip}:8080"),
                log: dir.join("pods").join(format!("{OPERATOR_NS}_{name}.log")),
                name,
            })
        })
        .collect()
}

/// Polls `f` until it returns `Some`, or panics with `what` and the operator's log.
fn wait_for<T>(what: &str, timeout: Duration, log: &Path, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "timed out waiting for {what}; operator log (newest first):\n{}",
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn json(cp: &ControlPlane, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    cp.kubectl(&a)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}

fn status(cp: &ControlPlane, ns: &str, name: &str) -> Value {
    json(cp, &["get", "inferenceservice", name, "-n", ns])["status"].clone()
}

/// The pid of the engine process serving on `ip` (the pod's loopback address).
fn engine_pid(ip: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains(" engine ") && cmd.contains(&format!("--host {ip} "))).then_some(pid)
    })
}

fn isvc(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
    )
}

/// The part of the Prometheus Operator's ServiceMonitor CRD the operator needs: the
/// resource served (the real schema is long and checks nothing the test relies on).
const SERVICE_MONITOR_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

const FLEET: &str = "{model: {source: 'synthetic:tiny'}, engine: {maxNumSeqs: 2}, autoscaling: {minReplicas: 1, maxReplicas: 3, behavior: {scaleDown: {stabilizationWindowSeconds: 6}}}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}";

#[test]
fn the_operator_on_a_real_control_plane() {
    let bin = match binaries() {
        Ok(b) => b,
        Err(why) => {
            assert!(
                std::env::var_os("BALLAST_REQUIRE_E2E").is_none(),
                "BALLAST_REQUIRE_E2E is set but the cluster e2e cannot run: {why}"
            );
            eprintln!("skipping the cluster e2e: {why}");
            return;
        }
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = std::env::temp_dir().join(format!("ballast-cluster-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("pods")).unwrap();
    let cp = ControlPlane::start(&bin, &dir).unwrap_or_else(|e| panic!("control plane: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(cp.client()).unwrap();
    let _kubelet = runtime
        .block_on(kubelet::start(
            client.clone(),
            KubeletConfig {
                node: "e2e-node".into(),
                commands: [("ballast".to_string(), ballast())].into(),
                log_dir: dir.join("pods"),
                credentials: Some(cp.credentials()),
            },
        ))
        .unwrap();

    // The chart, rendered as `helm install ballast charts/ballast -n ballast-system` would
    // render it: its CRD first, then every template. The API server validates each
    // object; the Deployment's two operator pods elect a leader.
    let chart =
        ballast_chart::Chart::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/ballast"))
            .unwrap();
    let rendered = chart
        .render(
            &ballast_chart::RenderOptions::new("ballast", OPERATOR_NS)
                .values_yaml(CHART_VALUES)
                .unwrap(),
        )
        .unwrap_or_else(|e| panic!("the chart does not render: {e}"));
    for crd in &rendered.crds {
        cp.apply(&crd.content).unwrap();
    }
    // The CRD serves a moment after it is created.
    wait_for(
        "the CRD to serve",
        Duration::from_secs(30),
        &dir.join("none"),
        || cp.kubectl(&["get", "inferenceservices", "-A"]).ok(),
    );
    cp.kubectl(&["create", "namespace", OPERATOR_NS]).unwrap();
    let manifests: Vec<&str> = rendered
        .documents
        .iter()
        .map(|d| d.content.as_str())
        .collect();
    cp.apply(&manifests.join("\n---\n"))
        .unwrap_or_else(|e| panic!("the API server refused the chart: {e}"));
    let (op1, op2) = wait_for(
        "one operator pod to lead and the other to stand by",
        Duration::from_secs(60),
        &dir.join("none"),
        || {
            let mut pods = operator_pods(&cp, &dir);
            if pods.len() != 2 {
                return None;
            }
            let second = pods.pop()?;
            let first = pods.pop()?;
            match (
                first.get("/readyz").as_str(),
                second.get("/readyz").as_str(),
            ) {
                ("leader", "standby") => Some((first, second)),
                ("standby", "leader") => Some((second, first)),
                _ => None,
            }
        },
    );
    let (log1, log2) = (op1.log.clone(), op2.log.clone());
    // The Deployment counts both pods ready: /readyz passes on the standby too.
    wait_for(
        "the operator Deployment ready",
        Duration::from_secs(30),
        &log1,
        || {
            let d = json(&cp, &["get", "deployment", "ballast", "-n", OPERATOR_NS]);
            (d["status"]["readyReplicas"] == 2).then_some(())
        },
    );

    // 1. apply → Deployment, Service, PDB with owner references; the pod runs; Ready.
    cp.kubectl(&["create", "namespace", "e2e"]).unwrap();
    cp.apply(&isvc("e2e", "chat", FLEET)).unwrap();
    let s = wait_for("chat ready", Duration::from_secs(60), &log1, || {
        let s = status(&cp, "e2e", "chat");
        (s["readyReplicas"] == 1 && s["acceptingReplicas"] == 1).then_some(s)
    });
    assert_eq!(
        s["selector"],
        "app.kubernetes.io/instance=chat,app.kubernetes.io/name=ballast-engine"
    );
    let uid =
        json(&cp, &["get", "inferenceservice", "chat", "-n", "e2e"])["metadata"]["uid"].clone();
    for kind in ["deployment", "service", "poddisruptionbudget"] {
        let o = json(&cp, &["get", kind, "chat", "-n", "e2e"]);
        assert_eq!(
            o["metadata"]["ownerReferences"][0]["uid"], uid,
            "{kind} owned"
        );
        assert_eq!(o["metadata"]["ownerReferences"][0]["controller"], true);
    }
    // Every printer column filled (ACTION once the first decision is made).
    wait_for(
        "the printer columns",
        Duration::from_secs(30),
        &log1,
        || {
            let table = cp
                .kubectl(&["get", "inferenceservices", "-n", "e2e"])
                .ok()?;
            let row: Vec<String> = table
                .lines()
                .nth(1)?
                .split_whitespace()
                .map(str::to_string)
                .collect();
            (row.len() == 6
                && row[..4] == ["chat", "synthetic:tiny", "1", "1"]
                && ["Hold", "ScaleUp", "ScaleDown", "Rebalance"].contains(&row[4].as_str()))
            .then_some(())
        },
    );
    assert_eq!(op2.writes("chat"), 0.0, "the standby never writes");
    assert!(
        op1.get("/metrics")
            .contains("\nballast_operator_leader 1\n")
    );
    assert!(
        op2.get("/metrics")
            .contains("\nballast_operator_leader 0\n")
    );

    // 1b. Once the Prometheus Operator's ServiceMonitor CRD exists, each service gets a
    // ServiceMonitor it owns.
    cp.apply(SERVICE_MONITOR_CRD).unwrap();
    let sm = wait_for("a ServiceMonitor", Duration::from_secs(30), &log1, || {
        let sm = json(
            &cp,
            &[
                "get",
                "servicemonitors.monitoring.coreos.com",
                "chat",
                "-n",
                "e2e",
            ],
        );
        (!sm.is_null()).then_some(sm)
    });
    assert_eq!(sm["metadata"]["ownerReferences"][0]["uid"], uid);
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "2s");

    // 2. Load through the Service's ready pods → scale up within two periods of the
    // deployment seeing it; load gone → back to one after the 6 s window; no request
    // failed.
    let selector = "app.kubernetes.io/instance=chat,app.kubernetes.io/name=ballast-engine";
    let px = runtime
        .block_on(proxy::start(client.clone(), "e2e", selector, 8000))
        .unwrap();
    let report = dir.join("bench.json");
    let mut bench = Command::new(ballast())
        .args([
            "bench",
            "--url",
            &px.url,
            "--concurrency",
            "16",
            "--duration",
            "14",
        ])
        .args([
            "--input-len",
            "32",
            "--output-len",
            "300",
            "--ignore-eos",
            "--no-progress",
            "--json",
        ])
        .arg(&report)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let load_start = Instant::now();
    wait_for("a scale-up", Duration::from_secs(30), &log1, || {
        let d = json(&cp, &["get", "deployment", "chat", "-n", "e2e"]);
        (d["spec"]["replicas"].as_i64() > Some(1)).then_some(())
    });
    let to_scale = load_start.elapsed();
    eprintln!("load step to Deployment replicas changed: {to_scale:?} (periods of 2 s)");
    assert!(
        to_scale <= Duration::from_secs(7),
        "scale-up took {to_scale:?}"
    );
    wait_for("the new pods ready", Duration::from_secs(60), &log1, || {
        (status(&cp, "e2e", "chat")["readyReplicas"].as_i64() > Some(1)).then_some(())
    });
    assert!(bench.wait().unwrap().success());
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["requests"]["failed"], 0, "{r:#}");
    assert!(r["requests"]["ok"].as_u64().unwrap() > 16, "{r:#}");
    wait_for("the scale-down", Duration::from_secs(60), &log1, || {
        let s = status(&cp, "e2e", "chat");
        (s["desiredReplicas"] == 1 && s["replicas"] == 1).then_some(())
    });
    drop(px);

    // 2b. Rebalancing: long-context load sent straight to one pod heats its KV cache; the
    // operator sets its `ballast.dev/accepting` gate False, so the pod leaves the
    // Service's ready set (never below minAccepting), and sets it True once it cools.
    cp.apply(&isvc(
        "e2e",
        "hot",
        "{model: {source: 'synthetic:tiny'}, engine: {maxNumSeqs: 8, kvCache: {numBlocks: 64}}, autoscaling: {minReplicas: 2, maxReplicas: 2, targets: {capacityWaitingPerReplica: 8, kvCacheUsage: 0.99}}, rebalancing: {hotKvCacheUsage: 0.5, minAccepting: 1}, metrics: {scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}}",
    ))
    .unwrap();
    let hot_selector = "app.kubernetes.io/instance=hot,app.kubernetes.io/name=ballast-engine";
    wait_for("hot ready", Duration::from_secs(60), &log1, || {
        let s = status(&cp, "e2e", "hot");
        (s["readyReplicas"] == 2 && s["acceptingReplicas"] == 2).then_some(())
    });
    let pods = json(&cp, &["get", "pods", "-n", "e2e", "-l", hot_selector]);
    let target = pods["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let ip = pods["items"][0]["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    let mut pinned = Command::new(ballast())
        .args([
            "bench",
            "--url",
            &format!("http://{ip}:8000"),
            "--concurrency",
            "2",
        ])
        .args([
            "--duration",
            "20",
            "--input-len",
            "380",
            "--output-len",
            "100",
        ])
        .args(["--ignore-eos", "--no-progress"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let gate = |cp: &ControlPlane, pod: &str| {
        json(cp, &["get", "pod", pod, "-n", "e2e"])["status"]["conditions"]
            .as_array()
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c["type"] == "ballast.dev/accepting")
                    .map(|c| (c["status"].as_str() == Some("True"), c.clone()))
            })
    };
    wait_for(
        "the hot pod out of rotation",
        Duration::from_secs(30),
        &log1,
        || {
            let s = status(&cp, "e2e", "hot");
            let out = gate(&cp, &target).is_some_and(|(accepting, _)| !accepting);
            (out && s["acceptingReplicas"] == 1).then_some(())
        },
    );
    let ready = json(&cp, &["get", "pod", &target, "-n", "e2e"])["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(
        ready["status"], "False",
        "the gate makes the pod unready: {ready}"
    );
    let _ = pinned.kill();
    let _ = pinned.wait();
    wait_for(
        "the cooled pod back",
        Duration::from_secs(30),
        &log1,
        || {
            let back = gate(&cp, &target).is_some_and(|(accepting, _)| accepting);
            (back && status(&cp, "e2e", "hot")["acceptingReplicas"] == 2).then_some(())
        },
    );
    cp.kubectl(&["delete", "inferenceservice", "hot", "-n", "e2e"])
        .unwrap();

    // 3. A replica's process killed: the kubelet restarts it and the fleet recovers.
    let pods = json(&cp, &["get", "pods", "-n", "e2e", "-l", selector]);
    let ip = pods["items"][0]["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    let pid = engine_pid(&ip).expect("the engine process of the pod");
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    wait_for(
        "the engine restarted and ready",
        Duration::from_secs(60),
        &log1,
        || {
            let pods = json(&cp, &["get", "pods", "-n", "e2e", "-l", selector]);
            let p = &pods["items"][0];
            let restarted = p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1);
            (restarted && status(&cp, "e2e", "chat")["readyReplicas"] == 1).then_some(())
        },
    );

    // 4. Autoscaling off: `kubectl scale` drives the replicas through the scale subresource.
    cp.apply(&isvc(
        "e2e",
        "fixed",
        "{model: {source: 'synthetic:tiny'}, replicas: 1, autoscaling: {enabled: false}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}",
    ))
    .unwrap();
    wait_for("fixed ready", Duration::from_secs(60), &log1, || {
        (status(&cp, "e2e", "fixed")["readyReplicas"] == 1).then_some(())
    });
    cp.kubectl(&[
        "scale",
        "inferenceservice",
        "fixed",
        "-n",
        "e2e",
        "--replicas",
        "2",
    ])
    .unwrap();
    wait_for("fixed at two", Duration::from_secs(60), &log1, || {
        let s = status(&cp, "e2e", "fixed");
        (s["readyReplicas"] == 2 && s["desiredReplicas"] == 2).then_some(())
    });
    let fixed = json(&cp, &["get", "inferenceservice", "fixed", "-n", "e2e"]);
    assert_eq!(fixed["spec"]["replicas"], 2, "the spec is the user's");

    // 5. Invalid specs: CEL refuses at apply; one the CRD cannot judge gets a condition.
    let refused = cp
        .apply(&isvc(
            "e2e",
            "bad",
            "{model: {source: x}, autoscaling: {minReplicas: 5, maxReplicas: 2}}",
        ))
        .unwrap_err();
    assert!(
        refused.contains("minReplicas must not exceed maxReplicas"),
        "{refused}"
    );
    cp.apply(&isvc(
        "e2e",
        "noimage",
        "{model: {source: m}, engine: {kind: vllm}}",
    ))
    .unwrap();
    let s = wait_for(
        "the InvalidSpec condition",
        Duration::from_secs(30),
        &log1,
        || {
            let s = status(&cp, "e2e", "noimage");
            s["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Degraded" && c["reason"] == "InvalidSpec")
                .then_some(s)
        },
    );
    assert!(s.to_string().contains("spec.engine.image"), "{s}");
    assert!(
        json(&cp, &["get", "deployment", "noimage", "-n", "e2e"]).is_null(),
        "nothing built from an invalid spec"
    );

    // 6. The leader killed: another replica takes over within the lease, and does not write
    // what is already right. "Settled" means the old leader stopped writing too: no write
    // to the service for three periods.
    wait_for("fixed settled", Duration::from_secs(60), &log1, || {
        let before = op1.writes("fixed");
        std::thread::sleep(Duration::from_secs(6));
        (op1.writes("fixed") == before).then_some(())
    });
    // The leader's pod deleted: the kubelet stops it (SIGTERM), and another pod takes the
    // Lease: the standby, or the replacement the Deployment starts, whichever asks first.
    cp.kubectl(&[
        "delete",
        "pod",
        &op1.name,
        "-n",
        OPERATOR_NS,
        "--wait=false",
    ])
    .unwrap();
    let op2 = wait_for("a new leader", Duration::from_secs(30), &log2, || {
        operator_pods(&cp, &dir)
            .into_iter()
            .find(|p| p.name != op1.name && p.get("/readyz") == "leader")
    });
    let log2 = op2.log.clone();
    // Never two leaders: the old one stopped.
    assert!(
        operator_pods(&cp, &dir)
            .iter()
            .all(|p| p.name == op2.name || p.get("/readyz") != "leader")
    );
    std::thread::sleep(Duration::from_secs(6)); // three periods
    assert_eq!(
        op2.writes("fixed"),
        0.0,
        "a new leader makes no write to an unchanged, settled service: {}\n{:#}",
        op2.get("/metrics")
            .lines()
            .filter(|l| l.contains("api_writes") || l.contains("decisions_total"))
            .collect::<Vec<_>>()
            .join("\n"),
        status(&cp, "e2e", "fixed")
    );
    cp.kubectl(&[
        "scale",
        "inferenceservice",
        "fixed",
        "-n",
        "e2e",
        "--replicas",
        "1",
    ])
    .unwrap();
    wait_for(
        "the new leader acting",
        Duration::from_secs(60),
        &log2,
        || (status(&cp, "e2e", "fixed")["replicas"] == 1).then_some(()),
    );

    // 7. Deleting the InferenceService garbage-collects what it owned.
    cp.kubectl(&["delete", "inferenceservice", "fixed", "-n", "e2e"])
        .unwrap();
    wait_for(
        "fixed's objects collected",
        Duration::from_secs(60),
        &log2,
        || {
            let gone = ["deployment", "service", "poddisruptionbudget"]
                .iter()
                .all(|k| json(&cp, &["get", k, "fixed", "-n", "e2e"]).is_null());
            gone.then_some(())
        },
    );
    let events = cp.kubectl(&["get", "events", "-n", "e2e"]).unwrap();
    assert!(events.contains("FollowingSpecReplicas"), "{events}");
    assert!(events.contains("InvalidSpec"), "{events}");
    let lease = json(
        &cp,
        &["get", "lease", "ballast-operator", "-n", OPERATOR_NS],
    );
    assert_eq!(lease["spec"]["holderIdentity"], op2.name.as_str());
    drop(_kubelet);
    drop(runtime);
    drop(cp);
    let _ = std::fs::remove_dir_all(&dir);
}
