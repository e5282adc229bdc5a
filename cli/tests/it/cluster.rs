//! Ballast as users run it, end to end on a real Kubernetes cluster on this machine (see
//! `e2e/`): the control plane (etcd, kube-apiserver with PodSecurity admission,
//! kube-controller-manager, kube-scheduler) and a real node (containerd with runc, a CNI
//! bridge, the kubelet, kube-proxy).
//!
//! The `ballast` binary under test goes into an image built from the project's
//! Dockerfile with buildah, on a runtime base assembled from Debian packages, loaded into
//! the node's containerd. The chart is installed by real Helm (its Go SDK, through
//! `ballast-helm`) into a namespace that PodSecurity holds to `restricted`; the operator
//! runs in-cluster from the image with its ServiceAccount's projected token, and makes
//! engine pods from the same image in another `restricted` namespace. Load goes through
//! each Service's cluster IP, routed by kube-proxy to the pods of its EndpointSlices.
//!
//! Skips (saying why) when the cluster's programs are not installed or this is not root;
//! set `BALLAST_REQUIRE_E2E=1` to make that a failure. docs/e2e.md says how to install them.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ballast_e2e::Cluster;
use ballast_e2e::cluster::{ControlPlane, binaries};
use common::get;
use serde_json::Value;

fn ballast() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ballast"))
}

/// The namespace the chart is installed in.
const OPERATOR_NS: &str = "ballast-system";
/// The namespace of the InferenceServices.
const NS: &str = "e2e";
/// The image built from the Dockerfile and loaded into the node.
const IMAGE: &str = "localhost/ballast:e2e";
/// Step 14: the second release's namespace, the one it watches, and one it must ignore.
const TEAM_OPS: &str = "team-ops";
const TEAM_A: &str = "team-a";
const TEAM_B: &str = "team-b";
/// Step 14's release: one operator confined to `team-a`.
const TEAM_VALUES: &str = r#"
image: {repository: localhost/ballast, tag: e2e, pullPolicy: Never}
operator:
  replicas: 1
  watchNamespace: team-a
  leaderElection: {leaseSeconds: 6}
"#;

/// Values of the chart for this cluster: the image loaded into the node (never pulled: no
/// registry is reachable), and a short Lease so failover is quick. The NetworkPolicies go
/// through the real API server's validation; the node's bridge enforces none of them.
const CHART_VALUES: &str = r#"
image: {repository: localhost/ballast, tag: e2e, pullPolicy: Never}
metricsApi: {enabled: true}
networkPolicy: {enabled: true, monitoringNamespace: monitoring, engineNamespaces: [e2e]}
operator:
  leaderElection: {leaseSeconds: 6}
  logLevel: info
"#;

/// Seconds since a load began, `recommended_replicas` then, and `spec.replicas` then.
type Sample = (f64, Option<f64>, Option<i64>);

/// A quantity as the metrics APIs write it (`2`, `500m`, `400u`, `333n`).
fn quantity(q: &str) -> f64 {
    let (digits, scale) = match q.as_bytes().last() {
        Some(b'm') => (&q[..q.len() - 1], 1e-3),
        Some(b'u') => (&q[..q.len() - 1], 1e-6),
        Some(b'n') => (&q[..q.len() - 1], 1e-9),
        _ => (q, 1.0),
    };
    digits.parse::<f64>().unwrap_or(f64::NAN) * scale
}

/// The PodSecurity labels of a namespace whose pods must meet the `restricted` profile.
const RESTRICTED: [&str; 2] = [
    "pod-security.kubernetes.io/enforce=restricted",
    "pod-security.kubernetes.io/enforce-version=v1.28",
];

/// One operator pod of the chart's Deployment.
struct OperatorPod {
    name: String,
    metrics: String,
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

/// The test's view of the cluster, for its helpers and failure messages.
struct World {
    cluster: Cluster,
    dir: PathBuf,
}

impl World {
    fn cp(&self) -> &ControlPlane {
        &self.cluster.cp
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        self.cp()
            .kubectl(&a)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null)
    }

    fn status(&self, name: &str) -> Value {
        self.json(&["get", "inferenceservice", name, "-n", NS])["status"].clone()
    }

    fn pods(&self, selector: &str) -> Vec<Value> {
        self.json(&["get", "pods", "-n", NS, "-l", selector])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The operator pods that run with an IP and are not being deleted.
    fn operator_pods(&self) -> Vec<OperatorPod> {
        let pods = self.json(&[
            "get",
            "pods",
            "-n",
            OPERATOR_NS,
            "-l",
            "app.kubernetes.io/component=operator",
        ]);
        pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| {
                Some(OperatorPod {
                    name: p["metadata"]["name"].as_str()?.to_string(),
                    metrics: format!("http://{}:8080", p["status"]["podIP"].as_str()?),
                })
            })
            .collect()
    }

    /// What a failure message needs: the pods, the recent events, and the operator's log
    /// lines as `kubectl logs` gives them.
    fn diagnostics(&self) -> String {
        let cp = self.cp();
        let pods = cp
            .kubectl(&["get", "pods", "-A", "-o", "wide"])
            .unwrap_or_else(|e| e);
        let events = cp
            .kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"])
            .unwrap_or_else(|e| e);
        let events: Vec<&str> = events.lines().rev().take(25).collect();
        let logs = cp
            .kubectl(&[
                "logs",
                "-n",
                OPERATOR_NS,
                "-l",
                "app.kubernetes.io/component=operator",
                "--prefix",
                "--tail",
                "30",
            ])
            .unwrap_or_else(|e| e);
        format!(
            "pods:\n{pods}\nevents (newest first):\n{}\noperator logs:\n{logs}\nkubelet:\n{}",
            events.join("\n"),
            cp.log_tail("kubelet", 15)
        )
    }

    /// Polls `f` until it returns `Some`, or panics with `what` and the diagnostics.
    fn wait_for<T>(&self, what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f() {
                return v;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}\n{}", self.diagnostics());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// An InferenceService's Object metric through the aggregation layer (`None`: absent
    /// or unreadable).
    fn object_metric(&self, service: &str, metric: &str) -> Option<f64> {
        let raw = self
            .cp()
            .kubectl(&[
                "get",
                "--raw",
                &format!("/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/inferenceservices.ballast.dev/{service}/{metric}"),
            ])
            .ok()?;
        let v: Value = serde_json::from_str(&raw).ok()?;
        Some(quantity(v["items"][0]["value"].as_str()?))
    }

    /// An InferenceService's `spec.replicas` (what an HPA writes).
    fn spec_replicas(&self, service: &str) -> Option<i64> {
        self.json(&["get", "inferenceservice", service, "-n", NS])["spec"]["replicas"].as_i64()
    }

    /// The pods behind the metrics-API Service (its Endpoints' target names).
    fn metrics_api_pods(&self) -> Vec<String> {
        let ep = self.json(&["get", "endpoints", "ballast-metrics-api", "-n", OPERATOR_NS]);
        ep["subsets"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["addresses"].as_array().into_iter().flatten())
            .filter_map(|a| Some(a["targetRef"]["name"].as_str()?.to_string()))
            .collect()
    }

    /// `http://CLUSTER-IP:PORT` of the Service `name` (its `http` port).
    fn service_url(&self, name: &str) -> String {
        let svc = self.json(&["get", "service", name, "-n", NS]);
        let ip = svc["spec"]["clusterIP"].as_str().expect("a cluster IP");
        let port = svc["spec"]["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == "http"))
            .and_then(|p| p["port"].as_i64())
            .expect("an http port");
        format!("http://{ip}:{port}")
    }

    /// The addresses of the Service's EndpointSlices whose endpoints are ready.
    fn ready_endpoints(&self, service: &str) -> Vec<String> {
        let slices = self.json(&[
            "get",
            "endpointslices",
            "-n",
            NS,
            "-l",
            &format!("kubernetes.io/service-name={service}"),
        ]);
        let mut ips: Vec<String> = slices["items"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter(|e| e["conditions"]["ready"] == true)
            .filter_map(|e| Some(e["addresses"][0].as_str()?.to_string()))
            .collect();
        ips.sort();
        ips
    }

    /// `kubectl get events` of the objects named `name` in the services' namespace.
    fn events_of(&self, name: &str) -> String {
        let field = format!("involvedObject.name={name}");
        self.cp()
            .kubectl(&["get", "events", "-n", NS, "--field-selector", &field])
            .unwrap()
    }

    /// The host pid of the first container of pod `ns/name`.
    fn container_pid(&self, ns: &str, name: &str) -> Option<u32> {
        let pod = self.json(&["get", "pod", name, "-n", ns]);
        let id = pod["status"]["containerStatuses"][0]["containerID"].as_str()?;
        self.cluster.node.container_pid(id)
    }
}

fn isvc(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: {name}, namespace: {NS}}}\nspec: {spec}\n"
    )
}

/// An `autoscaling/v2` HPA named `name` on InferenceService `service`, 1 to 3 replicas,
/// with one Object metric of the service: `metric` against `target` (a flow mapping), and
/// `behavior` (its YAML lines, indented four spaces).
fn object_hpa(name: &str, service: &str, metric: &str, target: &str, behavior: &str) -> String {
    format!(
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  scaleTargetRef: {{apiVersion: ballast.dev/v1alpha1, kind: InferenceService, name: {service}}}\n  minReplicas: 1\n  maxReplicas: 3\n  metrics:\n  - type: Object\n    object:\n      describedObject: {{apiVersion: ballast.dev/v1alpha1, kind: InferenceService, name: {service}}}\n      metric: {{name: {metric}}}\n      target: {target}\n  behavior:\n{behavior}\n"
    )
}

fn selector(name: &str) -> String {
    format!("app.kubernetes.io/instance={name},app.kubernetes.io/name=ballast-engine")
}

/// `ballast bench` against `url` in the background, writing its JSON report to `report`.
fn bench(url: &str, report: &Path, args: &[&str]) -> Child {
    Command::new(ballast())
        .args(["bench", "--url", url, "--no-progress", "--json"])
        .arg(report)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `ballast bench` against `url` in the background with `args` and `--ignore-eos`, its
/// output discarded: load that heats a pod, whose outcome the test does not judge.
fn quiet_bench(url: &str, args: &[&str]) -> Child {
    Command::new(ballast())
        .args(["bench", "--url", url, "--ignore-eos", "--no-progress"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The load step that scales a fleet of `maxNumSeqs: 2` engines up: 16 clients for 14 s.
const SCALE_UP_LOAD: &[&str] = &[
    "--concurrency",
    "16",
    "--duration",
    "14",
    "--input-len",
    "32",
    "--output-len",
    "300",
    "--ignore-eos",
];

/// Waits for a bench started by [`bench`] and returns its report; panics if any request
/// failed or fewer than `min_ok` succeeded.
fn bench_report(mut child: Child, report: &Path, min_ok: u64, what: &str) -> Value {
    assert!(child.wait().unwrap().success(), "{what}: bench failed");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    assert_eq!(r["requests"]["failed"], 0, "{what}: {r:#}");
    assert!(
        r["requests"]["ok"].as_u64().unwrap_or(0) >= min_ok,
        "{what}: {r:#}"
    );
    r
}

/// A process's uid, effective capabilities and whether its root filesystem is read-only,
/// from `/proc`.
fn process_facts(pid: u32) -> (String, String, bool) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root_ro = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.len() > 5 && f[4] == "/" && f[5].split(',').any(|o| o == "ro")
    });
    (field("Uid:"), field("CapEff:"), root_ro)
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
fn ballast_on_a_real_cluster() {
    let _group = crate::common::group(module_path!());
    let bin = match binaries().and_then(|b| ballast_e2e::image::tools().map(|()| b)) {
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
    let t0 = Instant::now();
    let dir = std::env::temp_dir().join(format!("ballast-cluster-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = Cluster::start(&bin, &dir).unwrap_or_else(|e| panic!("the cluster: {e}"));
    let started = t0.elapsed();
    let w = World {
        cluster,
        dir: dir.clone(),
    };
    let cp = w.cp();

    // The image: the binary under test, built into the project's Dockerfile's
    // `prebuilt` stage and loaded into the node.
    let image = ballast_e2e::image::build_prebuilt(&ballast(), IMAGE)
        .unwrap_or_else(|e| panic!("the image: {e}"));
    w.cluster.node.load_image(IMAGE).unwrap();
    eprintln!(
        "cluster up in {started:?}; image {IMAGE}: {:.1} MB, built in {:.1} s",
        image.size_bytes as f64 / 1e6,
        image.build_seconds
    );

    // The chart, installed by Helm into a namespace held to PodSecurity `restricted`:
    // the API server judges the operator's pods, and Helm installs the CRD from crds/.
    cp.kubectl(&["create", "namespace", OPERATOR_NS]).unwrap();
    let mut label = vec!["label", "namespace", OPERATOR_NS];
    label.extend(RESTRICTED);
    cp.kubectl(&label).unwrap();
    // The InferenceServices' namespace, held to `restricted` too; made first, since the
    // chart puts the engines' NetworkPolicy there.
    cp.kubectl(&["create", "namespace", NS]).unwrap();
    let mut label = vec!["label", "namespace", NS];
    label.extend(RESTRICTED);
    cp.kubectl(&label).unwrap();
    let helm = ballast_helm::Helm::new().unwrap_or_else(|e| panic!("helm: {e}"));
    let chart_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ballast");
    let install_start = Instant::now();
    helm.install(
        &cp.admin_kubeconfig,
        &chart_dir,
        "ballast",
        OPERATOR_NS,
        CHART_VALUES,
        &ballast_helm::InstallOptions::default(),
    )
    .unwrap_or_else(|e| panic!("helm install: {e}\n{}", w.diagnostics()));
    let (op1, op2) = w.wait_for(
        "one operator pod to lead and the other to stand by",
        Duration::from_secs(120),
        || {
            let mut pods = w.operator_pods();
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
    // The Deployment counts both pods ready: /readyz passes on the standby too.
    w.wait_for(
        "the operator Deployment ready",
        Duration::from_secs(60),
        || {
            let d = w.json(&["get", "deployment", "ballast", "-n", OPERATOR_NS]);
            (d["status"]["readyReplicas"] == 2).then_some(())
        },
    );
    eprintln!(
        "helm install → operator ready: {:?}",
        install_start.elapsed()
    );
    // The API server took the NetworkPolicies as rendered.
    for (ns, name) in [(OPERATOR_NS, "ballast-operator"), (NS, "ballast-engines")] {
        let p = w.json(&["get", "networkpolicy", name, "-n", ns]);
        assert_eq!(p["spec"]["policyTypes"][0], "Ingress", "{ns}/{name}: {p}");
    }

    // The metrics APIs as the chart installs them: the leader labels its pod, the
    // Service selects it alone, the operator keeps its certificate in a Secret and sets
    // the APIServices' caBundle, and the aggregator verifies it and finds both available.
    w.wait_for(
        "the metrics-API Service on the leader alone",
        Duration::from_secs(30),
        || (w.metrics_api_pods() == [op1.name.as_str()]).then_some(()),
    );
    for name in [
        "v1beta2.custom.metrics.k8s.io",
        "v1beta1.external.metrics.k8s.io",
    ] {
        w.wait_for(
            &format!("APIService {name} Available"),
            Duration::from_secs(60),
            || {
                w.json(&["get", "apiservice", name])["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Available" && c["status"] == "True")
                    .then_some(())
            },
        );
        let secret = w.json(&[
            "get",
            "secret",
            "ballast-metrics-api-tls",
            "-n",
            OPERATOR_NS,
        ]);
        let apiservice = w.json(&["get", "apiservice", name]);
        assert_eq!(
            apiservice["spec"]["caBundle"], secret["data"]["ca.crt"],
            "{name} trusts the CA the operator keeps"
        );
        assert!(apiservice["spec"]["insecureSkipTLSVerify"].is_null());
    }
    // The operator really runs as the chart says: uid 65532, no capabilities, a
    // read-only root filesystem.
    let pid = w.container_pid(OPERATOR_NS, &op1.name).expect("its pid");
    assert_eq!(
        process_facts(pid),
        ("65532".to_string(), "0000000000000000".to_string(), true),
        "the operator's process"
    );

    // 1. apply → Deployment, Service, PDB with owner references; the pod runs; Ready.
    let apply_start = Instant::now();
    cp.apply(&isvc("chat", FLEET)).unwrap();
    let s = w.wait_for("chat ready", Duration::from_secs(90), || {
        let s = w.status("chat");
        (s["readyReplicas"] == 1 && s["acceptingReplicas"] == 1).then_some(s)
    });
    let to_ready = apply_start.elapsed();
    eprintln!("kubectl apply → first Ready engine pod: {to_ready:?} (image present)");
    assert_eq!(s["selector"], selector("chat"));
    let uid = w.json(&["get", "inferenceservice", "chat", "-n", NS])["metadata"]["uid"].clone();
    for kind in ["deployment", "service", "poddisruptionbudget"] {
        let o = w.json(&["get", kind, "chat", "-n", NS]);
        assert_eq!(
            o["metadata"]["ownerReferences"][0]["uid"], uid,
            "{kind} owned"
        );
        assert_eq!(o["metadata"]["ownerReferences"][0]["controller"], true);
    }
    // The engine pod really runs locked down, as PodSecurity `restricted` demands.
    let pod = w.pods(&selector("chat"))[0].clone();
    let pod_name = pod["metadata"]["name"].as_str().unwrap().to_string();

    // 1a. The control API answers the operator's token only (issue 34): the Secret is
    // owned and mounted, the Service publishes no grpc port, and a caller on the pod
    // network without the token cannot drain the engine, with it (as the operator) can.
    let secret = w.json(&["get", "secret", "chat-control-token", "-n", NS]);
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["uid"], uid,
        "the token Secret is owned"
    );
    let token = cp
        .kubectl(&[
            "get",
            "secret",
            "chat-control-token",
            "-n",
            NS,
            "-o",
            "go-template={{index .data \"token\" | base64decode}}",
        ])
        .unwrap();
    let token = token.lines().next().unwrap().trim().to_string();
    assert_eq!(token.len(), 64, "256 bits as hex");
    let ports = w.json(&["get", "service", "chat", "-n", NS])["spec"]["ports"].clone();
    assert_eq!(ports.as_array().map(Vec::len), Some(1), "{ports}");
    assert_eq!(ports[0]["name"], "http", "{ports}");
    let pod_ip = pod["status"]["podIP"].as_str().unwrap().to_string();
    // The control API serves TLS with the Secret's pair (issue 34 step 2): the pod mounts
    // the token and the serving pair, never the CA key; a plain client gets nowhere, one
    // that trusts the Secret's CA and checks the service's name gets in, with the token.
    let items = &pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "control-token")
        .unwrap()["secret"]["items"];
    let mounted: Vec<&str> = items
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["key"].as_str())
        .collect();
    assert_eq!(mounted, ["token", "tls.crt", "tls.key"], "{items}");
    let ca = cp
        .kubectl(&[
            "get",
            "secret",
            "chat-control-token",
            "-n",
            NS,
            "-o",
            "go-template={{index .data \"ca.crt\" | base64decode}}",
        ])
        .unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            use ballast_engine::api::control::proto::engine_control_client::EngineControlClient;
            use ballast_engine::api::control::proto::{DrainRequest, GetStatsRequest};
            use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
            let plain = async {
                let mut c = EngineControlClient::connect(format!("http://{pod_ip}:9000")).await?;
                c.drain(DrainRequest {})
                    .await
                    .map_err(Box::<dyn std::error::Error>::from)
            };
            let plain = tokio::time::timeout(Duration::from_secs(10), plain).await;
            assert!(!matches!(plain, Ok(Ok(_))), "a plain-text drain was served");
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca))
                .domain_name(format!("chat.{NS}.control.ballast.internal"));
            let channel = Endpoint::from_shared(format!("https://{pod_ip}:9000"))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .expect("TLS with the Secret's CA and the service's name");
            let mut c = EngineControlClient::new(channel);
            let s = c.drain(DrainRequest {}).await.unwrap_err();
            assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
            let mut wrong = tonic::Request::new(DrainRequest {});
            wrong
                .metadata_mut()
                .insert("authorization", "Bearer not-the-token".parse().unwrap());
            let s = c.drain(wrong).await.unwrap_err();
            assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
            let mut right = tonic::Request::new(GetStatsRequest {});
            right
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            let stats = c
                .get_stats(right)
                .await
                .expect("the operator's token works");
            assert!(
                !stats.into_inner().draining,
                "the refused drains drained nothing"
            );
        });
    let pid = w.container_pid(NS, &pod_name).expect("the engine's pid");
    assert_eq!(
        process_facts(pid),
        ("65532".to_string(), "0000000000000000".to_string(), true),
        "the engine's process"
    );
    // Every printer column filled (ACTION once the first decision is made).
    w.wait_for("the printer columns", Duration::from_secs(30), || {
        let table = cp.kubectl(&["get", "inferenceservices", "-n", NS]).ok()?;
        let row: Vec<String> = table
            .lines()
            .nth(1)?
            .split_whitespace()
            .map(str::to_string)
            .collect();
        (row.len() == 7
            && row[..5] == ["chat", "synthetic:tiny", "Act", "1", "1"]
            && ["Hold", "ScaleUp", "ScaleDown", "Rebalance"].contains(&row[5].as_str()))
        .then_some(())
    });
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
    let sm = w.wait_for("a ServiceMonitor", Duration::from_secs(30), || {
        let sm = w.json(&[
            "get",
            "servicemonitors.monitoring.coreos.com",
            "chat",
            "-n",
            NS,
        ]);
        (!sm.is_null()).then_some(sm)
    });
    assert_eq!(sm["metadata"]["ownerReferences"][0]["uid"], uid);
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "2s");

    // 2. Load through the Service's cluster IP (kube-proxy picks a ready endpoint) →
    // scale-up within two periods of the load; load gone → back to one after the 6 s
    // window; no request failed.
    let chat_url = w.service_url("chat");
    let report = dir.join("bench.json");
    let load = bench(&chat_url, &report, SCALE_UP_LOAD);
    let load_start = Instant::now();
    w.wait_for("a scale-up", Duration::from_secs(30), || {
        let d = w.json(&["get", "deployment", "chat", "-n", NS]);
        (d["spec"]["replicas"].as_i64() > Some(1)).then_some(())
    });
    let to_scale = load_start.elapsed();
    eprintln!("load step to Deployment replicas changed: {to_scale:?} (periods of 2 s)");
    assert!(
        to_scale <= Duration::from_secs(7),
        "scale-up took {to_scale:?}"
    );
    // Under load, an Object metric through the aggregation layer is what the operator's
    // status shows for the same period: read status, metrics, status; when both status
    // reads name the same decision the metrics must be that decision's (or the next one's,
    // published a moment before its status is written: then a later read matches).
    let metric = |m: &str| w.object_metric("chat", m);
    let mut seen = Vec::new();
    let (kv, recommended) = w.wait_for(
        "kv_cache_usage and recommended_replicas equal to status for one decision",
        Duration::from_secs(20),
        || {
            let before = w.status("chat");
            let kv = metric("kv_cache_usage")?;
            let recommended = metric("recommended_replicas")?;
            let after = w.status("chat");
            let d = &after["lastDecision"];
            let status_kv = d["signals"]["kvCacheUsage"].as_f64()?;
            let desired = after["desiredReplicas"].as_f64()?;
            seen.push(format!("{kv} vs {status_kv}, {recommended} vs {desired}"));
            (before["lastDecision"]["time"] == d["time"]
                && status_kv > 0.0
                && (kv - status_kv).abs() < 1e-8
                && recommended == desired)
                .then_some((kv, recommended))
        },
    );
    eprintln!(
        "through the aggregator under load: kv_cache_usage {kv}, recommended_replicas {recommended}, equal to status (reads: {})",
        seen.join("; ")
    );
    w.wait_for("the new pods ready", Duration::from_secs(60), || {
        (w.status("chat")["readyReplicas"].as_i64() > Some(1)).then_some(())
    });
    // The new pods are in the Service's EndpointSlices: kube-proxy routes to them.
    w.wait_for("the new pods' endpoints", Duration::from_secs(30), || {
        (w.ready_endpoints("chat").len() > 1).then_some(())
    });
    bench_report(load, &report, 17, "load through the cluster IP");
    w.wait_for("the scale-down", Duration::from_secs(60), || {
        let s = w.status("chat");
        (s["desiredReplicas"] == 1 && s["replicas"] == 1).then_some(())
    });

    // 2b. A real HorizontalPodAutoscaler on Ballast's signals: the built-in autoscaler off,
    // an autoscaling/v2 HPA whose Object metric is capacity_waiting_per_replica on the
    // InferenceService (target 2 per replica). The HPA controller calls through the
    // aggregation layer as its own ServiceAccount and scales through the scale
    // subresource; a load step scales it up within three sync periods (5 s here), with no
    // failed request, and it comes back after its 10 s scale-down window.
    cp.apply(&isvc(
        "hpa",
        "{model: {source: 'synthetic:tiny'}, replicas: 1, engine: {maxNumSeqs: 8, maxRunningPerTenant: 1}, autoscaling: {enabled: false, minReplicas: 1, maxReplicas: 3, targets: {capacityWaitingPerReplica: 2}, behavior: {scaleDown: {stabilizationWindowSeconds: 6}}}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}",
    ))
    .unwrap();
    cp.apply(&object_hpa(
        "hpa",
        "hpa",
        "capacity_waiting_per_replica",
        "{type: Value, value: \"2\"}",
        "    scaleUp: {stabilizationWindowSeconds: 0}\n    scaleDown: {stabilizationWindowSeconds: 10, policies: [{type: Percent, value: 100, periodSeconds: 5}]}",
    ))
    .unwrap();
    w.wait_for("hpa ready", Duration::from_secs(90), || {
        (w.status("hpa")["readyReplicas"] == 1).then_some(())
    });
    // Idle, the HPA reads the metric (0 waiting) and shows it.
    let hpa = w.wait_for(
        "the HPA reading the metric",
        Duration::from_secs(60),
        || {
            let h = w.json(&["get", "hpa", "hpa", "-n", NS]);
            let current =
                h["status"]["currentMetrics"][0]["object"]["current"]["value"].as_str()?;
            (quantity(current) == 0.0).then_some(h)
        },
    );
    assert_eq!(hpa["status"]["currentReplicas"], 1, "{hpa:#}");
    let table = cp.kubectl(&["get", "hpa", "hpa", "-n", NS]).unwrap();
    assert!(
        table.contains("0/2"),
        "kubectl get hpa shows the value and its target:\n{table}"
    );
    w.wait_for("hpa's endpoints", Duration::from_secs(30), || {
        (w.ready_endpoints("hpa").len() == 1).then_some(())
    });
    let hpa_url = w.service_url("hpa");
    // Tenant-deferred load alone (one tenant, capped at one running request) never scales
    // it up: those requests wait on their tenant's cap, which more replicas do not lift,
    // and capacity_waiting_per_replica leaves them out.
    let report = dir.join("hpa-deferred.json");
    let load = bench(
        &hpa_url,
        &report,
        &[
            "--concurrency",
            "12",
            "--duration",
            "10",
            "--tenants",
            "1",
            "--input-len",
            "16",
            "--output-len",
            "300",
            "--ignore-eos",
        ],
    );
    let until = Instant::now() + Duration::from_secs(16); // the load and one sync period
    let mut deferred_peak = 0.0f64;
    while Instant::now() < until {
        let replicas = w.spec_replicas("hpa");
        assert_eq!(
            replicas,
            Some(1),
            "tenant-deferred load scaled the HPA:\n{}",
            cp.kubectl(&["describe", "hpa", "hpa", "-n", NS])
                .unwrap_or_default()
        );
        deferred_peak =
            deferred_peak.max(w.object_metric("hpa", "deferred_waiting").unwrap_or(0.0));
        std::thread::sleep(Duration::from_millis(500));
    }
    bench_report(load, &report, 1, "tenant-deferred load");
    eprintln!("tenant-deferred load: deferred_waiting up to {deferred_peak}, the HPA held at 1");
    assert!(deferred_peak > 0.0, "the load was deferred");
    let report = dir.join("hpa-bench.json");
    let load = bench(
        &hpa_url,
        &report,
        &[
            "--concurrency",
            "16",
            "--duration",
            "20",
            "--input-len",
            "32",
            "--output-len",
            "300",
            "--ignore-eos",
        ],
    );
    let load_start = Instant::now();
    let up = w.wait_for("the HPA scaling hpa up", Duration::from_secs(40), || {
        let spec =
            w.json(&["get", "inferenceservice", "hpa", "-n", NS])["spec"]["replicas"].as_i64()?;
        (spec > 1).then_some(spec)
    });
    let to_scale = load_start.elapsed();
    let described = cp
        .kubectl(&["describe", "hpa", "hpa", "-n", NS])
        .unwrap_or_default();
    eprintln!(
        "HPA on capacity_waiting_per_replica: load step → spec.replicas {up} in {to_scale:?} (sync every 5 s)\n{described}"
    );
    assert!(
        to_scale <= Duration::from_secs(20),
        "the HPA took {to_scale:?}, more than three 5 s sync periods and a control period:\n{described}"
    );
    w.wait_for("hpa's new pods ready", Duration::from_secs(60), || {
        (w.status("hpa")["readyReplicas"].as_i64() > Some(1)).then_some(())
    });
    bench_report(load, &report, 17, "load while the HPA scales");
    let down_start = Instant::now();
    w.wait_for(
        "the HPA scaling hpa back down",
        Duration::from_secs(90),
        || {
            let spec = w.json(&["get", "inferenceservice", "hpa", "-n", NS])["spec"]["replicas"]
                .as_i64()?;
            (spec == 1).then_some(())
        },
    );
    eprintln!(
        "HPA scale-down after the load: {:?} (window 10 s)",
        down_start.elapsed()
    );
    let events = cp
        .kubectl(&[
            "get",
            "events",
            "-n",
            NS,
            "--field-selector",
            "involvedObject.kind=HorizontalPodAutoscaler",
        ])
        .unwrap_or_default();
    assert!(events.contains("SuccessfulRescale"), "{events}");
    // Before the operator's first decision on a new service the metric is absent, and
    // the HPA says why instead of reading a 0.
    for line in events
        .lines()
        .filter(|l| l.contains("FailedGetObjectMetric"))
    {
        assert!(line.contains("is absent"), "{line}");
    }
    // One autoscaler at a time: the built-in one turned on under the HPA, the operator
    // does not fight it but says so, naming it, and keeps spec.replicas (the HPA's).
    cp.kubectl(&[
        "patch",
        "inferenceservice",
        "hpa",
        "-n",
        NS,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"autoscaling":{"enabled":true,"minReplicas":2,"maxReplicas":3}}}"#,
    ])
    .unwrap();
    let conflict = w.wait_for("AutoscalerConflict", Duration::from_secs(30), || {
        let s = w.status("hpa");
        let c = s["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "AutoscalerConflict" && c["status"] == "True")?
            .clone();
        Some((c, s))
    });
    assert!(
        conflict.0["message"]
            .as_str()
            .unwrap_or_default()
            .contains("HorizontalPodAutoscaler hpa"),
        "{:#}",
        conflict.0
    );
    assert_eq!(
        conflict.1["desiredReplicas"], 1,
        "the HPA's size (spec.replicas), not the built-in minReplicas: {:#}",
        conflict.1
    );
    let events = cp
        .kubectl(&[
            "get",
            "events",
            "-n",
            NS,
            "--field-selector",
            "reason=AutoscalerConflict",
        ])
        .unwrap();
    assert!(events.contains("Warning"), "{events}");
    cp.kubectl(&["delete", "hpa", "hpa", "-n", NS]).unwrap();
    w.wait_for("the conflict cleared", Duration::from_secs(30), || {
        let s = w.status("hpa");
        s["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "AutoscalerConflict" && c["status"] == "False")
            .then_some(())
    });

    // An HPA that follows the operator's whole decision: recommended_replicas with
    // AverageValue 1, the built-in autoscaler off again (the HPA the only writer). On the
    // same load step it reaches the count the operator recommends within one sync period,
    // and follows it back down.
    cp.kubectl(&[
        "patch",
        "inferenceservice",
        "hpa",
        "-n",
        NS,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"autoscaling":{"enabled":false,"minReplicas":1,"maxReplicas":3}}}"#,
    ])
    .unwrap();
    cp.apply(&object_hpa(
        "follow",
        "hpa",
        "recommended_replicas",
        "{type: AverageValue, averageValue: \"1\"}",
        "    scaleUp: {stabilizationWindowSeconds: 0}\n    scaleDown: {stabilizationWindowSeconds: 0, policies: [{type: Percent, value: 100, periodSeconds: 5}]}",
    ))
    .unwrap();
    w.wait_for(
        "the follower at the recommended 1",
        Duration::from_secs(60),
        || {
            (w.object_metric("hpa", "recommended_replicas") == Some(1.0)
                && w.spec_replicas("hpa") == Some(1)
                && w.status("hpa")["readyReplicas"] == 1)
                .then_some(())
        },
    );
    w.wait_for("hpa's endpoint", Duration::from_secs(30), || {
        (w.ready_endpoints("hpa").len() == 1).then_some(())
    });
    let report = dir.join("hpa-follow.json");
    let load = bench(
        &hpa_url,
        &report,
        &[
            "--concurrency",
            "16",
            "--duration",
            "20",
            "--input-len",
            "32",
            "--output-len",
            "300",
            "--ignore-eos",
        ],
    );
    // (seconds since the load began, recommended_replicas, spec.replicas)
    let t0 = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    while t0.elapsed() < Duration::from_secs(50) {
        samples.push((
            t0.elapsed().as_secs_f64(),
            w.object_metric("hpa", "recommended_replicas"),
            w.spec_replicas("hpa"),
        ));
        if t0.elapsed() > Duration::from_secs(25) && samples.last().is_some_and(|s| s.2 == Some(1))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bench_report(
        load,
        &report,
        17,
        "load while the HPA follows recommended_replicas",
    );
    let shown: Vec<String> = samples
        .iter()
        .map(|(t, r, n)| format!("{t:.1}s {r:?}/{n:?}"))
        .collect();
    let peak_recommended = samples.iter().filter_map(|s| s.1).fold(0.0, f64::max);
    let first = |f: &dyn Fn(&Sample) -> bool| samples.iter().find(|s| f(s)).map(|s| s.0);
    let recommended_at = first(&|s| s.1 == Some(peak_recommended));
    let followed_at = first(&|s| s.2 == Some(peak_recommended as i64));
    eprintln!(
        "HPA on recommended_replicas: peak {peak_recommended} recommended at {recommended_at:?} s, spec.replicas there at {followed_at:?} s (sync 5 s); samples: {}",
        shown.join(", ")
    );
    assert_eq!(
        peak_recommended, 3.0,
        "the operator recommends the built-in maximum under this load: {shown:?}"
    );
    let (Some(r), Some(f)) = (recommended_at, followed_at) else {
        panic!("the HPA never reached the recommended {peak_recommended}: {shown:?}");
    };
    assert!(
        f - r <= 7.0,
        "the HPA followed after {:.1} s, more than one 5 s sync period and a control period: {shown:?}",
        f - r
    );
    assert_eq!(
        samples.last().and_then(|s| s.2),
        Some(1),
        "back down with the recommendation: {shown:?}"
    );
    cp.kubectl(&["delete", "hpa", "follow", "-n", NS]).unwrap();
    cp.kubectl(&["delete", "inferenceservice", "hpa", "-n", NS])
        .unwrap();

    // 2d. Advisory mode (issue 51): an `Advise` service under the same load step decides
    // to scale up (status, the Advising condition, an Advise Event) while its Deployment
    // stays at one; switched to `Act` under the load, the standing decision is applied
    // within a control period (2 s here).
    cp.apply(&isvc(
        "advice",
        &FLEET.replace("autoscaling: {", "autoscaling: {mode: Advise, "),
    ))
    .unwrap();
    w.wait_for("advice ready", Duration::from_secs(90), || {
        (w.status("advice")["readyReplicas"] == 1).then_some(())
    });
    let columns = cp.kubectl(&["get", "bisvc", "advice", "-n", NS]).unwrap();
    assert!(
        columns.contains("MODE") && columns.contains("Advise"),
        "{columns}"
    );
    // kube-proxy routes the new Service's cluster IP once its endpoint is ready.
    let advice_url = w.service_url("advice");
    w.wait_for(
        "advice through its cluster IP",
        Duration::from_secs(30),
        || get(&format!("{advice_url}/v1/models")).map(|_| ()),
    );
    let report = dir.join("advice.json");
    let load = bench(&advice_url, &report, SCALE_UP_LOAD);
    let advised = w.wait_for("the advice to scale up", Duration::from_secs(30), || {
        let s = w.status("advice");
        (s["desiredReplicas"].as_i64() > Some(1)).then_some(s)
    });
    let advising = advised["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Advising").cloned())
        .unwrap_or(Value::Null);
    assert_eq!(advising["status"], "True", "{advised}");
    // A few more periods of load: the Deployment stays where it was.
    std::thread::sleep(Duration::from_secs(4));
    let d = w.json(&["get", "deployment", "advice", "-n", NS]);
    assert_eq!(d["spec"]["replicas"], 1, "advice applied: {d}");
    let events = w.events_of("advice");
    assert!(events.contains("Advise"), "{events}");
    cp.apply(&isvc("advice", FLEET)).unwrap();
    let acted = Instant::now();
    w.wait_for(
        "the standing decision applied",
        Duration::from_secs(10),
        || {
            let d = w.json(&["get", "deployment", "advice", "-n", NS]);
            (d["spec"]["replicas"].as_i64() > Some(1)).then_some(())
        },
    );
    eprintln!(
        "advisory mode: desiredReplicas {} advised with the Deployment at 1; mode Act → Deployment resized in {:?}",
        advised["desiredReplicas"],
        acted.elapsed()
    );
    assert!(
        w.status("advice")["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| c["type"] != "Advising")),
        "the Advising condition goes with Act"
    );
    bench_report(load, &report, 17, "load on an advised service");
    cp.kubectl(&["delete", "inferenceservice", "advice", "-n", NS])
        .unwrap();

    // 3. A rolling update under load: changing the engine's arguments rolls the pods
    // (a surge pod first, the old one drained on SIGTERM), and no request fails.
    let before: Vec<String> = w
        .pods(&selector("chat"))
        .iter()
        .filter_map(|p| Some(p["metadata"]["name"].as_str()?.to_string()))
        .collect();
    let report = dir.join("rollout.json");
    let load = bench(
        &chat_url,
        &report,
        &[
            "--concurrency",
            "2",
            "--duration",
            "20",
            "--input-len",
            "16",
            "--output-len",
            "40",
            "--ignore-eos",
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    cp.apply(&isvc(
        "chat",
        &FLEET.replace("maxNumSeqs: 2", "maxNumSeqs: 3"),
    ))
    .unwrap();
    w.wait_for("the rollout", Duration::from_secs(90), || {
        let d = w.json(&["get", "deployment", "chat", "-n", NS]);
        let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        let st = &d["status"];
        let done = args.contains(r#""--max-num-seqs","3""#);
        let settled = st["observedGeneration"] == d["metadata"]["generation"]
            && st["updatedReplicas"] == st["replicas"]
            && st["readyReplicas"] == st["replicas"];
        let pods = w.pods(&selector("chat"));
        let fresh = !pods.is_empty()
            && pods.iter().all(|p| {
                !before.contains(
                    &p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            });
        (done && settled && fresh).then_some(())
    });
    bench_report(load, &report, 10, "load through a rolling update");

    // 4. Rebalancing: long-context load sent straight to one pod heats its KV cache; the
    // operator sets its `ballast.dev/accepting` gate False, so the pod leaves the
    // Service's ready endpoints (never below minAccepting), and sets it True once it cools.
    cp.apply(&isvc(
        "hot",
        "{model: {source: 'synthetic:tiny'}, engine: {maxNumSeqs: 8, kvCache: {numBlocks: 64}}, autoscaling: {minReplicas: 2, maxReplicas: 2, targets: {capacityWaitingPerReplica: 8, kvCacheUsage: 0.99}}, rebalancing: {hotKvCacheUsage: 0.5, minAccepting: 1}, metrics: {scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}}",
    ))
    .unwrap();
    w.wait_for("hot ready", Duration::from_secs(90), || {
        let s = w.status("hot");
        (s["readyReplicas"] == 2 && s["acceptingReplicas"] == 2).then_some(())
    });
    let pods = w.pods(&selector("hot"));
    let target = pods[0]["metadata"]["name"].as_str().unwrap().to_string();
    let target_ip = pods[0]["status"]["podIP"].as_str().unwrap().to_string();
    w.wait_for("both hot endpoints ready", Duration::from_secs(30), || {
        (w.ready_endpoints("hot").len() == 2).then_some(())
    });
    let mut pinned = quiet_bench(
        &format!("http://{target_ip}:8000"),
        &[
            "--concurrency",
            "2",
            "--duration",
            "20",
            "--input-len",
            "380",
            "--output-len",
            "100",
        ],
    );
    let gate = |pod: &str| {
        w.json(&["get", "pod", pod, "-n", NS])["status"]["conditions"]
            .as_array()
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c["type"] == "ballast.dev/accepting")
                    .map(|c| c["status"].as_str() == Some("True"))
            })
    };
    w.wait_for(
        "the hot pod out of rotation",
        Duration::from_secs(30),
        || {
            let out = gate(&target) == Some(false);
            let endpoints = w.ready_endpoints("hot");
            (out && w.status("hot")["acceptingReplicas"] == 1 && !endpoints.contains(&target_ip))
                .then_some(())
        },
    );
    let ready = w.json(&["get", "pod", &target, "-n", NS])["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap();
    assert_eq!(
        ready["status"], "False",
        "the kubelet makes the gated pod unready: {ready}"
    );
    let _ = pinned.kill();
    let _ = pinned.wait();
    w.wait_for("the cooled pod back", Duration::from_secs(30), || {
        let back = gate(&target) == Some(true);
        (back && w.status("hot")["acceptingReplicas"] == 2 && w.ready_endpoints("hot").len() == 2)
            .then_some(())
    });
    cp.kubectl(&["delete", "inferenceservice", "hot", "-n", NS])
        .unwrap();

    // 5. An engine container killed: the kubelet restarts it and the fleet recovers.
    let pod = w.pods(&selector("chat"))[0].clone();
    let pod_name = pod["metadata"]["name"].as_str().unwrap().to_string();
    let pid = w.container_pid(NS, &pod_name).expect("the engine's pid");
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    w.wait_for(
        "the engine container restarted and ready",
        Duration::from_secs(90),
        || {
            let p = w.json(&["get", "pod", &pod_name, "-n", NS]);
            let restarted = p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1);
            (restarted && w.status("chat")["readyReplicas"] == 1).then_some(())
        },
    );

    // 6. Autoscaling off: `kubectl scale` drives the replicas through the scale
    // subresource.
    cp.apply(&isvc(
        "fixed",
        "{model: {source: 'synthetic:tiny'}, replicas: 1, autoscaling: {enabled: false}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}",
    ))
    .unwrap();
    w.wait_for("fixed ready", Duration::from_secs(90), || {
        (w.status("fixed")["readyReplicas"] == 1).then_some(())
    });
    cp.kubectl(&[
        "scale",
        "inferenceservice",
        "fixed",
        "-n",
        NS,
        "--replicas",
        "2",
    ])
    .unwrap();
    w.wait_for("fixed at two", Duration::from_secs(90), || {
        let s = w.status("fixed");
        (s["readyReplicas"] == 2 && s["desiredReplicas"] == 2).then_some(())
    });
    let fixed = w.json(&["get", "inferenceservice", "fixed", "-n", NS]);
    assert_eq!(fixed["spec"]["replicas"], 2, "the spec is the user's");

    // 7. A pod deleted under load is drained within its grace period: the engine finishes
    // what it holds and exits by itself, and no request through the Service fails.
    w.wait_for(
        "both fixed endpoints ready",
        Duration::from_secs(30),
        || (w.ready_endpoints("fixed").len() == 2).then_some(()),
    );
    let report = dir.join("delete.json");
    let load = bench(
        &w.service_url("fixed"),
        &report,
        &[
            "--concurrency",
            "4",
            "--duration",
            "12",
            "--input-len",
            "16",
            "--output-len",
            "60",
            "--ignore-eos",
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    let victim = w.pods(&selector("fixed"))[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let grace = w.json(&["get", "pod", &victim, "-n", NS])["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let delete_start = Instant::now();
    cp.kubectl(&["delete", "pod", &victim, "-n", NS, "--wait=false"])
        .unwrap();
    // The container's exit, as the kubelet recorded it, while the pod object is still there.
    let exited = w.wait_for(
        "the deleted pod's engine to exit",
        Duration::from_secs(60),
        || {
            let p = w.json(&["get", "pod", &victim, "-n", NS]);
            if p.is_null() {
                return Some(None);
            }
            let t = &p["status"]["containerStatuses"][0]["state"]["terminated"];
            (!t.is_null()).then(|| Some(t.clone()))
        },
    );
    let drained_in = delete_start.elapsed();
    w.wait_for("the deleted pod gone", Duration::from_secs(60), || {
        w.json(&["get", "pod", &victim, "-n", NS])
            .is_null()
            .then_some(())
    });
    assert!(
        drained_in < Duration::from_secs(grace),
        "drained in {drained_in:?}, grace {grace} s"
    );
    if let Some(t) = exited {
        assert_eq!(t["exitCode"], 0, "the engine exits by itself: {t}");
    }
    eprintln!("pod deleted under load → engine exited: {drained_in:?} (grace {grace} s)");
    bench_report(load, &report, 4, "load through a pod deletion");

    // 8. `kubectl logs`, as docs/runbooks.md has an operator read them: the leader's
    // decisions (the Lease names the leader's pod), and the engine's periodic line.
    let leader =
        w.json(&["get", "lease", "ballast-operator", "-n", OPERATOR_NS])["spec"]["holderIdentity"]
            .as_str()
            .unwrap()
            .to_string();
    assert_eq!(leader, op1.name);
    let logs = cp.kubectl(&["logs", "-n", OPERATOR_NS, &leader]).unwrap();
    // `grep 'ballast::decision' | grep 'service=chat'`, as the runbook has it.
    assert!(
        logs.lines()
            .any(|l| l.contains("ballast::decision") && l.contains("service=chat")),
        "the leader's decisions in kubectl logs:\n{}",
        logs.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
    let engine_pod = w.pods(&selector("fixed"))[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let logs = cp.kubectl(&["logs", "-n", NS, &engine_pod]).unwrap();
    assert!(
        logs.contains("Engine 000: Avg prompt throughput"),
        "the engine's log line in kubectl logs:\n{logs}"
    );

    // 9. Invalid specs: CEL refuses at apply; one the CRD cannot judge gets a condition; an
    // image the node does not have is a condition, not a silent hold.
    let refused = cp
        .apply(&isvc(
            "bad",
            "{model: {source: x}, autoscaling: {minReplicas: 5, maxReplicas: 2}}",
        ))
        .unwrap_err();
    assert!(
        refused.contains("minReplicas must not exceed maxReplicas"),
        "{refused}"
    );
    cp.apply(&isvc(
        "noimage",
        "{model: {source: m}, engine: {kind: vllm}}",
    ))
    .unwrap();
    let s = w.wait_for("the InvalidSpec condition", Duration::from_secs(30), || {
        let s = w.status("noimage");
        s["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Degraded" && c["reason"] == "InvalidSpec")
            .then_some(s)
    });
    assert!(s.to_string().contains("spec.engine.image"), "{s}");
    assert!(
        w.json(&["get", "deployment", "noimage", "-n", NS])
            .is_null(),
        "nothing built from an invalid spec"
    );
    // A control period of a minute: the condition must come from the pod's own change
    // (the kubelet's ErrImagePull), within seconds, not from the next period.
    cp.apply(&isvc(
        "missing",
        "{model: {source: 'synthetic:tiny'}, engine: {image: 'localhost/ballast:not-loaded'}, metrics: {scrapeIntervalSeconds: 60, scrapeTimeoutSeconds: 2}}",
    ))
    .unwrap();
    let applied = Instant::now();
    let degraded = w.wait_for("the image-pull condition", Duration::from_secs(40), || {
        w.status("missing")["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Degraded" && c["status"] == "True")
            .cloned()
    });
    assert_eq!(degraded["reason"], "ImagePullFailed", "{degraded}");
    let message = degraded["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains("localhost/ballast:not-loaded") && message.contains("container engine"),
        "the condition names the image and the container: {degraded}"
    );
    eprintln!(
        "missing image: Degraded {:?} after the apply (control period 60 s): {message}",
        applied.elapsed()
    );
    cp.kubectl(&["delete", "inferenceservice", "missing", "noimage", "-n", NS])
        .unwrap();

    // 9a. An HPA whose metric is absent holds the replica count and says why (issue 33):
    // engines whose /metrics wants a key the operator was not given (BALLAST_API_KEY set
    // by hand, no spec.auth) fail every scrape, so the metric is absent, never 0. With a 0
    // the HPA would scale 2 → 1 within a sync period; absent, it must hold at 2.
    cp.apply(&isvc(
        "blind",
        "{model: {source: 'synthetic:tiny'}, replicas: 2, engine: {args: [--metrics-require-key], env: [{name: BALLAST_API_KEY, value: sk-not-the-operators}]}, autoscaling: {enabled: false, minReplicas: 1, maxReplicas: 3}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}",
    ))
    .unwrap();
    cp.apply(&object_hpa(
        "blind",
        "blind",
        "capacity_waiting_per_replica",
        "{type: Value, value: \"2\"}",
        "    scaleDown: {stabilizationWindowSeconds: 0, policies: [{type: Percent, value: 100, periodSeconds: 5}]}",
    ))
    .unwrap();
    w.wait_for("blind ready", Duration::from_secs(90), || {
        (w.status("blind")["readyReplicas"] == 2).then_some(())
    });
    let failed = w.wait_for(
        "the HPA saying the metric is absent",
        Duration::from_secs(40),
        || {
            let h = w.json(&["get", "hpa", "blind", "-n", NS]);
            h["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "ScalingActive" && c["status"] == "False")
                .cloned()
        },
    );
    assert_eq!(failed["reason"], "FailedGetObjectMetric", "{failed:#}");
    // Four sync periods more: still 2.
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        assert_eq!(
            w.spec_replicas("blind"),
            Some(2),
            "the HPA moved on an absent metric:\n{}",
            cp.kubectl(&["describe", "hpa", "blind", "-n", NS])
                .unwrap_or_default()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let described = cp
        .kubectl(&["describe", "hpa", "blind", "-n", NS])
        .unwrap_or_default();
    eprintln!("HPA on an absent metric held at 2:\n{described}");
    assert!(
        described.contains("FailedGetObjectMetric") && described.contains("is absent"),
        "kubectl describe hpa says why:\n{described}"
    );
    cp.kubectl(&["delete", "hpa", "blind", "-n", NS]).unwrap();
    cp.kubectl(&["delete", "inferenceservice", "blind", "-n", NS])
        .unwrap();

    // 9b. API keys from a Secret (issue 34): without the Secret the service is held with a
    // condition naming it and nothing is built; once it exists (the operator is not told,
    // it looks again) the engine runs with the key, the Service answers 401 without it and
    // 200 with it, and the operator's scrapes, which send it, still read an engine whose
    // /metrics requires it.
    const KEY: &str = "sk-e2e-2b7f4c91d03a";
    cp.apply(&isvc(
        "keyed",
        "{model: {source: 'synthetic:tiny'}, engine: {args: [--metrics-require-key]}, autoscaling: {minReplicas: 1, maxReplicas: 1}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}, auth: {apiKeySecretRef: {name: keyed-keys, key: api-keys}}}",
    ))
    .unwrap();
    let held = w.wait_for(
        "the ApiKeySecretMissing condition",
        Duration::from_secs(30),
        || {
            w.status("keyed")["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Degraded" && c["reason"] == "ApiKeySecretMissing")
                .cloned()
        },
    );
    assert!(
        held["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("Secret {NS}/keyed-keys not found")),
        "{held}"
    );
    assert!(
        w.json(&["get", "deployment", "keyed", "-n", NS]).is_null(),
        "nothing built without the Secret"
    );
    let fixed_at = Instant::now();
    cp.kubectl(&[
        "create",
        "secret",
        "generic",
        "keyed-keys",
        "-n",
        NS,
        &format!("--from-literal=api-keys={KEY}"),
    ])
    .unwrap();
    w.wait_for("keyed ready", Duration::from_secs(90), || {
        (w.status("keyed")["readyReplicas"] == 1).then_some(())
    });
    eprintln!(
        "Secret created to a ready keyed replica: {:?}",
        fixed_at.elapsed()
    );
    w.wait_for("keyed's endpoint", Duration::from_secs(30), || {
        (w.ready_endpoints("keyed").len() == 1).then_some(())
    });
    let keyed_url = w.service_url("keyed");
    let code = |key: Option<&str>| {
        let mut c = Command::new("curl");
        c.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "10"]);
        if let Some(k) = key {
            c.args(["-H", &format!("authorization: Bearer {k}")]);
        }
        let out = c.arg(format!("{keyed_url}/v1/models")).output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(code(None), "401", "no key through the Service");
    assert_eq!(code(Some("sk-wrong")), "401", "a wrong key");
    assert_eq!(code(Some(KEY)), "200", "the Secret's key");
    // The operator reads the keyed /metrics: its signals are reported, not missing.
    w.wait_for("keyed's metrics reported", Duration::from_secs(30), || {
        w.status("keyed")["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "MetricsAvailable" && c["status"] == "True")
            .then_some(())
    });
    let status = w.status("keyed").to_string();
    assert!(!status.contains(KEY), "no key in the status: {status}");
    cp.kubectl(&["delete", "inferenceservice", "keyed", "-n", NS])
        .unwrap();
    cp.kubectl(&["delete", "secret", "keyed-keys", "-n", NS])
        .unwrap();

    // 10. The real model in the cluster: SmolLM2 from a PersistentVolume on the node's
    // disk (PodSecurity `restricted` forbids hostPath volumes in pods; a claim is allowed),
    // answering a chat through the Service.
    real_model(&w);

    // 11. The leader killed: another replica takes over within the lease, and does not
    // write what is already right. "Settled" means the old leader stopped writing too: no
    // write to the service for three periods.
    w.wait_for("fixed settled", Duration::from_secs(60), || {
        let before = op1.writes("fixed");
        std::thread::sleep(Duration::from_secs(6));
        (op1.writes("fixed") == before).then_some(())
    });
    cp.kubectl(&[
        "delete",
        "pod",
        &op1.name,
        "-n",
        OPERATOR_NS,
        "--wait=false",
    ])
    .unwrap();
    let op2 = w.wait_for("a new leader", Duration::from_secs(60), || {
        w.operator_pods()
            .into_iter()
            .find(|p| p.name != op1.name && p.get("/readyz") == "leader")
    });
    // Never two leaders: the old one stopped.
    assert!(
        w.operator_pods()
            .iter()
            .all(|p| p.name == op2.name || p.get("/readyz") != "leader")
    );
    // The metrics APIs follow the Lease: the Service selects the new leader's pod alone,
    // and a value is served through the aggregator again.
    w.wait_for(
        "the metrics-API Service on the new leader",
        Duration::from_secs(60),
        || (w.metrics_api_pods() == [op2.name.as_str()]).then_some(()),
    );
    w.wait_for("a value from the new leader", Duration::from_secs(30), || {
        cp.kubectl(&[
            "get",
            "--raw",
            &format!("/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/inferenceservices.ballast.dev/chat/recommended_replicas"),
        ])
        .ok()
    });
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
        w.status("fixed")
    );
    cp.kubectl(&[
        "scale",
        "inferenceservice",
        "fixed",
        "-n",
        NS,
        "--replicas",
        "1",
    ])
    .unwrap();
    w.wait_for("the new leader acting", Duration::from_secs(60), || {
        (w.status("fixed")["replicas"] == 1).then_some(())
    });

    // 12. Deleting an InferenceService garbage-collects what it owned.
    cp.kubectl(&["delete", "inferenceservice", "fixed", "-n", NS])
        .unwrap();
    w.wait_for("fixed's objects collected", Duration::from_secs(60), || {
        let gone = ["deployment", "service", "poddisruptionbudget"]
            .iter()
            .all(|k| w.json(&["get", k, "fixed", "-n", NS]).is_null());
        gone.then_some(())
    });
    let events = cp.kubectl(&["get", "events", "-n", NS]).unwrap();
    assert!(events.contains("FollowingSpecReplicas"), "{events}");
    assert!(events.contains("InvalidSpec"), "{events}");
    // PodSecurity `restricted` refused none of the pods the chart and the operator made.
    for ns in [NS, OPERATOR_NS] {
        let events = cp.kubectl(&["get", "events", "-n", ns]).unwrap();
        assert!(
            !events.contains("violates PodSecurity"),
            "PodSecurity refused a pod in {ns}:\n{events}"
        );
    }
    let lease = w.json(&["get", "lease", "ballast-operator", "-n", OPERATOR_NS]);
    assert_eq!(lease["spec"]["holderIdentity"], op2.name.as_str());

    // ---- 13. API requests per control period (issue 23) --------------------------------
    // What a settled InferenceService costs the API server each period: a window of ten
    // periods in which `chat` is the only InferenceService, settled, and nothing else
    // changes (no load, no kubectl but the two snapshots). The API server's own
    // `apiserver_request_total` gives every request in the window by verb and resource
    // (printed); it has no user label, and the API server's own loops (the `kubernetes`
    // Service's endpoints, the Service IP repair) LIST and GET in any cluster, so what the
    // operator made is told apart by the API server's audit log, whose entries name the
    // user. The operator's Lease renewals are its leader election, not a reconcile's, and
    // are left out; watches are counted apart (a watch is opened once, not per period).
    w.wait_for("fixed's pods gone", Duration::from_secs(120), || {
        w.pods(&selector("fixed")).is_empty().then_some(())
    });
    w.wait_for("chat settled", Duration::from_secs(60), || {
        let before = op2.writes("chat");
        std::thread::sleep(Duration::from_secs(6));
        (op2.writes("chat") == before).then_some(())
    });
    const PERIODS: u32 = 10;
    let operator_user = format!("system:serviceaccount:{OPERATOR_NS}:ballast");
    let first = api_requests(cp);
    let audited_before = cp.audited_requests().len();
    let writes_before = op2.writes("chat");
    std::thread::sleep(Duration::from_secs(2) * PERIODS);
    let audited: Vec<_> = cp.audited_requests().split_off(audited_before);
    let second = api_requests(cp);
    let moved: Vec<String> = second
        .iter()
        .filter_map(|(k, v)| {
            let d = v - first.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| {
                format!(
                    "  {d:>4} {} {}/{}{}",
                    k.verb,
                    k.group,
                    k.resource,
                    match k.subresource.as_str() {
                        "" => String::new(),
                        s => format!("/{s}"),
                    }
                )
            })
        })
        .collect();
    // Discovery (`/apis/monitoring.coreos.com/v1`, whether the ServiceMonitor CRD is
    // installed) is asked once per refresh for the whole operator, not per service:
    // counted apart, and bounded by the refresh.
    let discovery = audited
        .iter()
        .filter(|r| r.user == operator_user && r.resource.is_empty())
        .count();
    let by_operator: Vec<_> = audited
        .iter()
        .filter(|r| r.user == operator_user && r.resource != "leases" && !r.resource.is_empty())
        // The metrics APIs' reviews answer the aggregator's requests, not a reconcile.
        .filter(|r| r.resource != "tokenreviews" && r.resource != "subjectaccessreviews")
        .collect();
    let count = |verbs: &[&str]| {
        by_operator
            .iter()
            .filter(|r| verbs.contains(&r.verb.as_str()))
            .count()
    };
    let reads = count(&["get", "list"]) as f64 / f64::from(PERIODS);
    let writes = count(&["create", "update", "patch", "delete", "deletecollection"]) as f64
        / f64::from(PERIODS);
    let watches = count(&["watch"]) as f64 / f64::from(PERIODS);
    let operator_requests: Vec<String> = by_operator
        .iter()
        .map(|r| format!("  {} {}", r.verb, r.uri))
        .collect();
    eprintln!(
        "API requests per period for a settled InferenceService ({PERIODS} periods of 2 s), made by the operator: {reads} reads, {writes} writes, {watches} watches opened; discovery reads for the whole operator in the window: {discovery}\n\
         every request in the window by apiserver_request_total (all components):\n{}\n\
         the operator's, from the audit log ({} in all, Lease renewals aside):\n{}",
        moved.join("\n"),
        by_operator.len(),
        operator_requests.join("\n")
    );
    assert!(
        audited
            .iter()
            .any(|r| r.user == operator_user && r.resource == "leases"),
        "the audit log shows no Lease renewal by {operator_user}: the attribution is broken"
    );
    assert_eq!(
        op2.writes("chat"),
        writes_before,
        "the operator wrote to chat in the window"
    );
    // DISCOVERY_REFRESH is 10 s, for each of the two optional CRDs (ServiceMonitor,
    // InferencePool).
    let refreshes = ((2 * PERIODS) as usize / 10 + 1) * 2;
    assert!(
        discovery <= refreshes,
        "{discovery} discovery reads in {} s: more than one per refresh and optional CRD",
        2 * PERIODS
    );
    assert_eq!(
        (reads, writes),
        (0.0, 0.0),
        "reads and writes per settled period by the operator:\n{}",
        operator_requests.join("\n")
    );
    // ---- end of 13 ----------------------------------------------------------------------

    // 15 (before 14, which stops this release's operator): the gateway in the request
    // path, Envoy in front of an InferencePool, scale to zero and back.
    the_gateway_in_the_request_path(&w);

    // 14. A second release of the same name, confined to one namespace (issue 36): Helm
    // installs it beside the first (no cluster-scoped name in common), it gets a Role in
    // its namespace and no cluster-wide right, reconciles there and ignores the rest. The
    // first release's operator is scaled to nothing first, so that only the confined one acts.
    cp.kubectl(&[
        "scale",
        "deployment",
        "ballast",
        "-n",
        OPERATOR_NS,
        "--replicas=0",
    ])
    .unwrap();
    w.wait_for(
        "the first release's operator pods gone",
        Duration::from_secs(60),
        || w.operator_pods().is_empty().then_some(()),
    );
    for ns in [TEAM_OPS, TEAM_A, TEAM_B] {
        cp.kubectl(&["create", "namespace", ns]).unwrap();
    }
    helm.install(
        &cp.admin_kubeconfig,
        &chart_dir,
        "ballast",
        TEAM_OPS,
        TEAM_VALUES,
        &ballast_helm::InstallOptions::default(),
    )
    .unwrap_or_else(|e| panic!("helm install of a second release: {e}\n{}", w.diagnostics()));
    let role = w.json(&["get", "role", &format!("ballast-{TEAM_OPS}"), "-n", TEAM_A]);
    assert!(!role.is_null(), "the Role in {TEAM_A}");
    assert!(
        w.json(&["get", "clusterrole", &format!("ballast-{TEAM_OPS}")])
            .is_null(),
        "a ClusterRole for the confined release"
    );
    let confined_start = Instant::now();
    let solo = "{model: {source: 'synthetic:tiny'}, replicas: 1, autoscaling: {enabled: false}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}";
    for ns in [TEAM_A, TEAM_B] {
        cp.apply(
            &isvc("solo", solo).replace(&format!("namespace: {NS}"), &format!("namespace: {ns}")),
        )
        .unwrap();
    }
    let ready_in = |ns: &str| {
        w.json(&["get", "inferenceservice", "solo", "-n", ns])["status"]["readyReplicas"].clone()
    };
    w.wait_for(
        &format!("solo ready in {TEAM_A} under the confined operator"),
        Duration::from_secs(120),
        || (ready_in(TEAM_A) == 1).then_some(()),
    );
    let confined_ready = confined_start.elapsed();
    // Three periods more: the other namespace still has nothing.
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        w.json(&["get", "inferenceservice", "solo", "-n", TEAM_B])["status"].is_null()
            && w.json(&["get", "deployment", "solo", "-n", TEAM_B])
                .is_null(),
        "the confined operator acted in {TEAM_B}"
    );
    // What its ServiceAccount may do, asked with its own token.
    let sa = cp.service_account_kubeconfig(TEAM_OPS, "ballast").unwrap();
    let can_i = |args: &[&str]| -> bool {
        let mut a = vec!["auth", "can-i"];
        a.extend(args);
        match cp.kubectl_as(&sa, &a) {
            Ok(out) => out.trim() == "yes",
            Err(e) if e.trim().is_empty() => false,
            Err(e) => panic!("kubectl auth can-i {args:?}: {e}"),
        }
    };
    let asked: [(&[&str], bool); 9] = [
        (&["create", "deployments", "-n", TEAM_A], true),
        (&["list", "secrets", "-n", TEAM_A], true),
        (
            &[
                "patch",
                "inferenceservices.ballast.dev",
                "--subresource=status",
                "-n",
                TEAM_A,
            ],
            true,
        ),
        (&["create", "deployments", "-n", TEAM_B], false),
        (&["list", "secrets", "-n", TEAM_B], false),
        (
            &["list", "inferenceservices.ballast.dev", "--all-namespaces"],
            false,
        ),
        (&["watch", "pods", "--all-namespaces"], false),
        (&["list", "secrets", "--all-namespaces"], false),
        (&["get", "leases.coordination.k8s.io", "-n", TEAM_OPS], true),
    ];
    for (args, want) in &asked {
        assert_eq!(
            can_i(args),
            *want,
            "kubectl auth can-i {args:?} as {TEAM_OPS}/ballast"
        );
    }
    // Every right it holds outside its namespaces: only what every authenticated user
    // has (discovery, self reviews), none on a resource of ours.
    let listed = cp
        .kubectl_as(&sa, &["auth", "can-i", "--list", "-n", TEAM_B])
        .unwrap();
    for resource in [
        "inferenceservices",
        "deployments",
        "secrets",
        "pods",
        "services",
    ] {
        assert!(
            !listed.lines().any(|l| l.starts_with(resource)),
            "{TEAM_OPS}/ballast may touch {resource} in {TEAM_B}:\n{listed}"
        );
    }
    eprintln!(
        "watchNamespace={TEAM_A}: a second release named ballast in {TEAM_OPS} installed beside the first; solo ready in {confined_ready:?}, nothing in {TEAM_B}; auth can-i as its ServiceAccount: {} answers as expected; outside its namespaces:\n{listed}",
        asked.len()
    );
    eprintln!("cluster e2e wall time: {:?}", t0.elapsed());
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Helpers of 13 (API requests per control period) ----------------------------------

/// One series of `apiserver_request_total`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RequestKey {
    verb: String,
    group: String,
    resource: String,
    subresource: String,
}

/// `apiserver_request_total` by verb, group, resource and subresource (summed over codes
/// and scopes), from the API server's `/metrics` read as the admin.
fn api_requests(cp: &ControlPlane) -> std::collections::BTreeMap<RequestKey, f64> {
    let text = cp.kubectl(&["get", "--raw", "/metrics"]).unwrap();
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or_default()
                .to_string()
        };
        let key = RequestKey {
            verb: label("verb"),
            group: label("group"),
            resource: label("resource"),
            subresource: label("subresource"),
        };
        *out.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    out
}

// ---- end of the helpers of 13 -----------------------------------------------------------

/// SmolLM2-135M-Instruct, cached by `scripts/fetch-model.sh`, served in the cluster from
/// a PersistentVolume of the node's disk bound to a claim, through the Service. Skipped
/// (saying so) when the model is not cached, unless `BALLAST_REQUIRE_MODEL` is set.
fn real_model(w: &World) {
    let cache = std::env::var_os("BALLAST_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/ballast/models")
        });
    let file = cache.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !file.is_file() {
        assert!(
            std::env::var_os("BALLAST_REQUIRE_MODEL").is_none(),
            "BALLAST_REQUIRE_MODEL is set but {} is missing (scripts/fetch-model.sh)",
            file.display()
        );
        eprintln!(
            "skipping the real model in the cluster: no {}",
            file.display()
        );
        return;
    }
    // The volume's folder, readable by the engine's uid: a copy under the test's state
    // (the cache may sit in a home folder other users cannot enter).
    let models = w.dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::copy(&file, models.join(file.file_name().unwrap())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&models, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cp = w.cp();
    cp.apply(&format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: e2e-models}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadOnlyMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ''
  hostPath: {{path: {}, type: Directory}}
  claimRef: {{namespace: {NS}, name: models}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: models, namespace: {NS}}}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ''
  volumeName: e2e-models
  resources: {{requests: {{storage: 1Gi}}}}
",
        models.display()
    ))
    .unwrap();
    cp.apply(&isvc(
        "smol",
        "{model: {source: smollm2-135m, volume: {persistentVolumeClaim: models}}, replicas: 1, autoscaling: {enabled: false}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}",
    ))
    .unwrap();
    let start = Instant::now();
    w.wait_for("smol ready", Duration::from_secs(180), || {
        (w.status("smol")["readyReplicas"] == 1).then_some(())
    });
    w.wait_for("smol's endpoint", Duration::from_secs(30), || {
        (w.ready_endpoints("smol").len() == 1).then_some(())
    });
    eprintln!("SmolLM2 in the cluster: Ready in {:?}", start.elapsed());
    // A plain system turn: with its template's default one this small model rambles.
    let out = Command::new("curl")
        .args(["-s", "-m", "120", "-H", "content-type: application/json", "-d"])
        .arg(r#"{"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}],"temperature":0,"max_tokens":48}"#)
        .arg(format!("{}/v1/chat/completions", w.service_url("smol")))
        .output()
        .unwrap();
    let body: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let answer = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        answer.contains("Paris"),
        "the chat through the Service: {body}"
    );
    cp.kubectl(&["delete", "inferenceservice", "smol", "-n", NS])
        .unwrap();
}

// ---- 15. The gateway in the request path (issue 48) ------------------------------------

/// The gateway phase's InferenceService: a picker in front of it (one, so its metrics are
/// the pool's), 0 to 3 replicas starting at one, zero after 6 idle seconds.
const EDGE: &str = "{replicas: 1, model: {source: 'synthetic:tiny'}, engine: {maxNumSeqs: 2}, gateway: {enabled: true, replicas: 1}, autoscaling: {minReplicas: 0, maxReplicas: 3, scaleToZeroAfterSeconds: 6, behavior: {scaleDown: {stabilizationWindowSeconds: 6}}}, metrics: {scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}";

/// The selector of `edge`'s picker pods.
const PICKER_PODS: &str = "app.kubernetes.io/instance=edge,app.kubernetes.io/name=ballast-gateway";

/// `edge`'s picker pods: `(name, http://IP:9090/metrics)` of those running with an IP.
fn pickers(w: &World) -> Vec<(String, String)> {
    w.pods(PICKER_PODS)
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                format!("http://{}:9090/metrics", p["status"]["podIP"].as_str()?),
            ))
        })
        .collect()
}

/// The sum of a picker's series `name` over the samples whose labels contain `with`.
fn picker_sum(metrics: &str, name: &str, with: &str) -> f64 {
    get(metrics)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A condition of InferenceService `name` by type.
fn condition(w: &World, name: &str, type_: &str) -> Value {
    w.status(name)["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

/// Step 15: Envoy (the PyPI build, on the host) in front of `edge`'s InferencePool, whose
/// picker the operator runs on the node. Without the GIE CRD the service says why and is
/// served as before; with it, load through Envoy sees no failure while the fleet scales
/// up, is rolled and loses a pod; requests go around a pod made hot; idle, the fleet goes
/// to zero; and twenty requests sent at zero are held by the picker, bring a replica back
/// and are all answered.
fn the_gateway_in_the_request_path(w: &World) {
    let Some(envoy) = crate::gateway::envoy() else {
        eprintln!("SKIPPED: the gateway phase: no Envoy");
        return;
    };
    let cp = w.cp();
    let dir = &w.dir;

    // Before the CRD: a condition naming it; the engines are served as without a gateway.
    cp.apply(&isvc("edge", EDGE)).unwrap();
    let c = w.wait_for("GatewayUnavailable", Duration::from_secs(60), || {
        let c = condition(w, "edge", "GatewayReady");
        (c["reason"] == "GatewayUnavailable").then_some(c)
    });
    assert_eq!(c["status"], "False", "{c}");
    assert!(
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("inferencepools.inference.networking.k8s.io"),
        "{c}"
    );
    w.wait_for(
        "edge served without a gateway",
        Duration::from_secs(90),
        || (w.status("edge")["readyReplicas"] == 1).then_some(()),
    );

    // The CRD installed: the operator finds it (discovery every 10 s) and makes the pool
    // and its picker, owned by the InferenceService.
    let gie = Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/gie/inferencepools.yaml");
    cp.kubectl(&["apply", "-f", gie.to_str().unwrap()]).unwrap();
    let installed = Instant::now();
    let c = w.wait_for("GatewayReady True", Duration::from_secs(90), || {
        let c = condition(w, "edge", "GatewayReady");
        (c["status"] == "True").then_some(c)
    });
    eprintln!(
        "GIE CRD applied → GatewayReady {:?}: {}",
        installed.elapsed(),
        c["message"]
    );
    let uid = w.json(&["get", "inferenceservice", "edge", "-n", NS])["metadata"]["uid"].clone();
    let pool = w.json(&[
        "get",
        "inferencepools.inference.networking.k8s.io",
        "edge",
        "-n",
        NS,
    ]);
    assert_eq!(pool["metadata"]["ownerReferences"][0]["uid"], uid, "{pool}");
    assert_eq!(pool["spec"]["targetPorts"][0]["number"], 8000, "{pool}");
    assert_eq!(
        pool["spec"]["endpointPickerRef"]["name"], "edge-epp",
        "{pool}"
    );
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"], "edge",
        "{pool}"
    );
    for kind in [
        "deployment",
        "service",
        "poddisruptionbudget",
        "serviceaccount",
        "role",
        "rolebinding",
    ] {
        let o = w.json(&["get", kind, "edge-epp", "-n", NS]);
        assert_eq!(
            o["metadata"]["ownerReferences"][0]["uid"], uid,
            "{kind} edge-epp owned"
        );
    }
    let picker = w.json(&["get", "service", "edge-epp", "-n", NS]);
    let picker_ip = picker["spec"]["clusterIP"].as_str().expect("a cluster IP");
    let gateway: std::net::SocketAddr = format!("{picker_ip}:9002").parse().unwrap();

    // Envoy on the host, its ext_proc cluster the picker's Service (through kube-proxy),
    // its pool an ORIGINAL_DST cluster: no list of pods, each request where the picker says.
    let proxy = crate::gateway::spawn_envoy_from(
        ballast_gateway::envoy::INFERENCE_POOL,
        &envoy,
        dir,
        gateway,
        false,
        &[],
    );
    let [(picker_pod, metrics)] = <[_; 1]>::try_from(pickers(w)).expect("one picker pod");
    w.wait_for("a request through Envoy", Duration::from_secs(30), || {
        let r = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-d"])
            .arg(r#"{"model":"edge","prompt":"hi","max_tokens":2}"#)
            .args(["-H", "content-type: application/json"])
            .arg(format!("{}/v1/completions", proxy.url))
            .output()
            .ok()?;
        (String::from_utf8_lossy(&r.stdout) == "200").then_some(())
    });

    // Load through Envoy while the fleet scales up: no request fails, and the picker
    // sends to the new pods as soon as they are ready.
    let report = dir.join("gateway-scale-up.json");
    let load = bench(&proxy.url, &report, SCALE_UP_LOAD);
    let load_start = Instant::now();
    w.wait_for(
        "edge scaled up under load through Envoy",
        Duration::from_secs(30),
        || (w.status("edge")["readyReplicas"].as_i64() > Some(1)).then_some(()),
    );
    eprintln!(
        "gateway: load through Envoy → a second ready pod in {:?}",
        load_start.elapsed()
    );
    w.wait_for(
        "the picker sending to two pods",
        Duration::from_secs(20),
        || {
            let endpoints = get(&metrics)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("ballast_gateway_picks_total{"))
                .filter_map(|l| {
                    l.split("endpoint=\"")
                        .nth(1)?
                        .split('"')
                        .next()
                        .map(str::to_string)
                })
                .collect::<std::collections::BTreeSet<_>>();
            (endpoints.len() > 1).then_some(())
        },
    );
    let r = bench_report(load, &report, 17, "load through Envoy while edge scaled up");
    eprintln!(
        "gateway: scale-up under load: {} ok, 0 failed",
        r["requests"]["ok"]
    );

    // Rolled, then a pod lost, under load: still none fails (the picker drops a pod the
    // moment it is unready or being deleted; the engine drains what it holds).
    let report = dir.join("gateway-roll.json");
    let steady = [
        "--concurrency",
        "2",
        "--input-len",
        "16",
        "--output-len",
        "40",
        "--ignore-eos",
    ];
    let load = bench(
        &proxy.url,
        &report,
        &[&steady[..], &["--duration", "25"]].concat(),
    );
    std::thread::sleep(Duration::from_secs(2));
    cp.apply(&isvc(
        "edge",
        &EDGE.replace("maxNumSeqs: 2", "maxNumSeqs: 3"),
    ))
    .unwrap();
    w.wait_for(
        "edge rolled under load through Envoy",
        Duration::from_secs(90),
        || {
            let d = w.json(&["get", "deployment", "edge", "-n", NS]);
            let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
            let st = &d["status"];
            (args.contains(r#""--max-num-seqs","3""#)
                && st["observedGeneration"] == d["metadata"]["generation"]
                && st["updatedReplicas"] == st["replicas"]
                && st["readyReplicas"] == st["replicas"])
                .then_some(())
        },
    );
    let r = bench_report(load, &report, 10, "load through Envoy while edge rolled");
    eprintln!(
        "gateway: a roll under load: {} ok, 0 failed",
        r["requests"]["ok"]
    );
    let report = dir.join("gateway-pod-lost.json");
    let load = bench(
        &proxy.url,
        &report,
        &[&steady[..], &["--duration", "12"]].concat(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let victim = w.pods(&selector("edge"))[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    cp.kubectl(&["delete", "pod", &victim, "-n", NS, "--wait=false"])
        .unwrap();
    let r = bench_report(load, &report, 5, "load through Envoy while edge lost a pod");
    eprintln!(
        "gateway: a pod deleted ({victim}) under load: {} ok, 0 failed",
        r["requests"]["ok"]
    );

    // Routing away from a hot pod: two replicas held, one loaded straight at its IP
    // (past Envoy); requests through Envoy go to the other.
    cp.apply(&isvc(
        "edge",
        &EDGE
            .replace("maxNumSeqs: 2", "maxNumSeqs: 3")
            .replace("minReplicas: 0", "minReplicas: 2"),
    ))
    .unwrap();
    // The pool's endpoints by pod name (the picker's metrics label them so): `(name, ip)`.
    let two = w.wait_for("two edge pods in the pool", Duration::from_secs(90), || {
        let ips = w.ready_endpoints("edge");
        let pods: Vec<(String, String)> = w
            .pods(&selector("edge"))
            .iter()
            .filter_map(|p| {
                let ip = p["status"]["podIP"].as_str()?;
                ips.iter()
                    .any(|i| i == ip)
                    .then(|| Some((p["metadata"]["name"].as_str()?.to_string(), ip.to_string())))?
            })
            .collect();
        (ips.len() == 2 && pods.len() == 2 && w.status("edge")["readyReplicas"] == 2)
            .then_some(pods)
    });
    let (hot_pod, cool_pod) = (two[0].0.clone(), two[1].0.clone());
    let (hot, cool) = (format!("{}:8000", two[0].1), format!("{}:8000", two[1].1));
    let mut pinned = quiet_bench(
        &format!("http://{hot}"),
        &[
            "--concurrency",
            "8",
            "--duration",
            "30",
            "--input-len",
            "16",
            "--output-len",
            "400",
        ],
    );
    let engine_waiting = |ip: &str| {
        get(&format!("http://{ip}/metrics"))
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.starts_with("ballast_num_requests_waiting_by_reason{")
                    && l.contains("reason=\"capacity\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    w.wait_for("a queue on the hot pod", Duration::from_secs(20), || {
        (engine_waiting(&hot) >= 3.0).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    let picked = |endpoint: &str| {
        picker_sum(
            &metrics,
            "ballast_gateway_picks_total",
            &format!("endpoint=\"{endpoint}\""),
        )
    };
    let (hot0, cool0) = (picked(&hot_pod), picked(&cool_pod));
    let short = dir.join("gateway-hot.json");
    let r = bench_report(
        bench(
            &proxy.url,
            &short,
            &[
                "--model",
                "edge",
                "--num-requests",
                "10",
                "--input-len",
                "8",
                "--output-len",
                "2",
            ],
        ),
        &short,
        10,
        "requests through Envoy beside a hot pod",
    );
    let (to_hot, to_cool) = (picked(&hot_pod) - hot0, picked(&cool_pod) - cool0);
    let _ = pinned.kill();
    let _ = pinned.wait();
    let idle_from = Instant::now();
    eprintln!(
        "gateway: beside a hot pod ({hot_pod} at {hot}, queue ≥ 3): {to_cool} of 10 to the cool one ({cool_pod} at {cool}), {to_hot} to the hot one ({} ok)",
        r["requests"]["ok"]
    );
    // Ten requests, and bench's start-up probe of /v1/models: all to the cool pod.
    assert!(
        to_hot == 0.0 && to_cool >= 10.0,
        "requests went to the hot pod ({to_hot}) or elsewhere ({to_cool} of 10 to the cool one); pickers now {:?}, {metrics}:\n{}",
        pickers(w),
        get(&metrics).unwrap_or_default()
    );

    // Idle: after scaleToZeroAfterSeconds (6) without a request the operator scales to 0.
    cp.apply(&isvc(
        "edge",
        &EDGE.replace("maxNumSeqs: 2", "maxNumSeqs: 3"),
    ))
    .unwrap();
    let s = w.wait_for("edge scaled to zero", Duration::from_secs(90), || {
        let s = w.status("edge");
        (s["lastDecision"]["reason"] == "ScaledToZero" || s["desiredReplicas"] == 0).then_some(s)
    });
    eprintln!(
        "gateway: last request → desiredReplicas 0 in {:?}: {}",
        idle_from.elapsed(),
        s["lastDecision"]["message"]
    );
    w.wait_for("edge's pods gone", Duration::from_secs(90), || {
        (w.pods(&selector("edge")).is_empty() && w.status("edge")["replicas"] == 0).then_some(())
    });
    let events = w.events_of("edge");
    assert!(events.contains("ScaledToZero"), "{events}");
    let held = picker_sum(&metrics, "ballast_gateway_held_requests", "pool=\"edge\"");
    assert_eq!(held, 0.0, "nothing held before the requests come");

    // A picker that crashes while holding requests loses those and only those: the
    // autoscaler off at 0 replicas (so nothing is sent on), three requests held and seen
    // by the operator, then the picker's process killed. Envoy answers their clients with
    // an error, the operator logs the count, and the kubelet restarts the picker.
    let at_zero = EDGE
        .replace("maxNumSeqs: 2", "maxNumSeqs: 3")
        .replace("replicas: 1,", "replicas: 0,");
    cp.apply(&isvc(
        "edge",
        &at_zero.replace("autoscaling: {", "autoscaling: {enabled: false, "),
    ))
    .unwrap();
    let curl = |body: &str| {
        Command::new("curl")
            .args(["-sN", "-o", "/dev/null", "--max-time", "120"])
            .args(["-w", "%{http_code} %{time_starttransfer}"])
            .args(["-H", "content-type: application/json", "-d", body])
            .arg(format!("{}/v1/completions", proxy.url))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let body = r#"{"model":"edge","prompt":"Once upon a time","max_tokens":8,"ignore_eos":true,"stream":true}"#;
    let doomed: Vec<Child> = (0..3).map(|_| curl(body)).collect();
    w.wait_for(
        "the operator seeing three held",
        Duration::from_secs(20),
        || {
            (w.status("edge")["lastDecision"]["signals"]["heldRequests"].as_f64() == Some(3.0))
                .then_some(())
        },
    );
    let pid = w.container_pid(NS, &picker_pod).expect("the picker's pid");
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let answers: Vec<String> = doomed
        .into_iter()
        .map(|c| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).to_string())
        .collect();
    assert!(
        answers.iter().all(|a| !a.starts_with("200")),
        "a request held by the killed picker was answered: {answers:?}"
    );
    let restarted = w.wait_for(
        "the operator logging the lost requests",
        Duration::from_secs(30),
        || {
            let logs = cp
                .kubectl(&[
                    "logs",
                    "-n",
                    OPERATOR_NS,
                    "-l",
                    "app.kubernetes.io/component=operator",
                    "--tail",
                    "200",
                ])
                .ok()?;
            logs.lines()
                .find(|l| l.contains("while holding 3 requests") && l.contains(picker_pod.as_str()))
                .map(str::to_string)
        },
    );
    eprintln!(
        "gateway: picker killed holding 3 requests; their clients got (code, first byte) {answers:?}; the operator: {restarted}"
    );
    w.wait_for(
        "the picker restarted and ready",
        Duration::from_secs(60),
        || {
            let p = w.json(&["get", "pod", &picker_pod, "-n", NS]);
            let st = &p["status"]["containerStatuses"][0];
            (st["restartCount"] == 1 && st["ready"] == true).then_some(())
        },
    );
    cp.apply(&isvc("edge", &at_zero)).unwrap();
    w.wait_for(
        "Envoy's health check finding the picker",
        Duration::from_secs(30),
        || {
            let text = get(&format!("{}/clusters", proxy.admin)).unwrap_or_default();
            text.lines()
                .any(|l| l.starts_with("gateway::") && l.contains("health_flags::healthy"))
                .then_some(())
        },
    );

    // At zero: twenty streamed requests at once. The picker holds them, the operator sees
    // them held and scales to one within a period, and the picker sends them on when the
    // pod is ready: every one answered; the time to its first byte is the cold start.
    // Twenty curl clients at once (curl, not bench: bench probes /v1/models first, and
    // that probe would be the one held), each streaming; curl times its first byte.
    let sent = Instant::now();
    let clients: Vec<Child> = (0..20).map(|_| curl(body)).collect();
    let seen = w.wait_for(
        "the picker holding all twenty requests",
        Duration::from_secs(20),
        || {
            let n = picker_sum(&metrics, "ballast_gateway_held_requests", "pool=\"edge\"");
            (n >= 20.0).then_some(n)
        },
    );
    let mut first_bytes: Vec<f64> = clients
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let out = String::from_utf8_lossy(&out.stdout).to_string();
            let (code, ttfb) = out.split_once(' ').unwrap_or((&out, ""));
            assert_eq!(code, "200", "a request sent at zero replicas: {out}");
            ttfb.parse::<f64>().unwrap()
        })
        .collect();
    first_bytes.sort_by(f64::total_cmp);
    eprintln!(
        "gateway: cold start from zero: 20 streamed requests through Envoy ({seen} held at once), 20 answered 200, 0 failed, all done in {:?}; first request → first byte: first {:.2} s, median {:.2} s, last {:.2} s",
        sent.elapsed(),
        first_bytes[0],
        first_bytes[10],
        first_bytes[19]
    );
    let events = w.events_of("edge");
    assert!(events.contains("HeldRequests"), "{events}");
    assert_eq!(
        picker_sum(&metrics, "ballast_gateway_held_requests", "pool=\"edge\""),
        0.0
    );
    assert!(
        w.pods(PICKER_PODS)
            .iter()
            .any(|p| p["metadata"]["name"] == picker_pod.as_str()),
        "the picker pod is the one restarted once"
    );
    drop(proxy);

    // Deleting the service collects the pool and the picker with it.
    cp.kubectl(&["delete", "inferenceservice", "edge", "-n", NS])
        .unwrap();
    w.wait_for(
        "edge's gateway objects collected",
        Duration::from_secs(60),
        || {
            let gone = w
                .json(&[
                    "get",
                    "inferencepools.inference.networking.k8s.io",
                    "edge",
                    "-n",
                    NS,
                ])
                .is_null()
                && w.json(&["get", "deployment", "edge-epp", "-n", NS])
                    .is_null();
            gone.then_some(())
        },
    );
}
