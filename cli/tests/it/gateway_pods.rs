//! `ballast gateway --selector` against a real kube-apiserver: the e2e control plane
//! (`ballast_e2e`, no node), in its own test group so the API server's start does not
//! share the machine with the timing-sensitive Envoy tests of `gateway`.

use crate::common;
use crate::gateway::{MODEL, addr_of, sample, spawn_gateway_with, wait_for};

use std::sync::Mutex;
use std::time::Duration;

use common::engine::{Log, spawn_engine};

/// One control plane at a time: each makes the same pod-network bridge.
static CONTROL_PLANE: Mutex<()> = Mutex::new(());

/// A control plane of its own (no node) with namespace `ns` ready for pods, or `None`
/// (said on stderr) when the cluster's programs are missing and `BALLAST_REQUIRE_E2E` is
/// unset. Fields drop in order: the control plane, then its network, then the lock.
struct Cluster {
    cp: ballast_e2e::cluster::ControlPlane,
    _network: ballast_e2e::node::PodNetwork,
    dir: std::path::PathBuf,
    _one: std::sync::MutexGuard<'static, ()>,
}

fn cluster(what: &str, dir: &str, ns: &str) -> Option<Cluster> {
    use ballast_e2e::cluster::{ControlPlane, binaries};
    use ballast_e2e::node::PodNetwork;
    let one = CONTROL_PLANE.lock().unwrap_or_else(|e| e.into_inner());
    let bin = match binaries() {
        Ok(b) => b,
        Err(why) => {
            assert!(
                std::env::var_os("BALLAST_REQUIRE_E2E").is_none(),
                "BALLAST_REQUIRE_E2E is set but {what} cannot run: {why}"
            );
            eprintln!("SKIPPED: {what} on a real API server: {why}");
            return None;
        }
    };
    let dir = common::local::temp_dir(dir);
    let network = PodNetwork::create().unwrap_or_else(|e| panic!("the pod network: {e}"));
    let cp = ControlPlane::start(&bin, &dir, network.gateway)
        .unwrap_or_else(|e| panic!("the control plane: {e}"));
    cp.kubectl(&["create", "namespace", ns]).unwrap();
    // Pods are admitted once the controller-manager has made the namespace's account.
    wait_for("the namespace's default service account", || {
        cp.kubectl(&["get", "serviceaccount", "default", "-n", ns])
            .is_ok()
    });
    Some(Cluster {
        cp,
        _network: network,
        dir,
        _one: one,
    })
}

/// `--selector` against a real kube-apiserver (the e2e control plane, no node: the pods'
/// status is written as a kubelet would): the pool is the selected pods that are Ready,
/// have an IP and pass the `ballast.dev/accepting` gate, and follows them as they change.
/// One pod's IP has a real engine behind `--target-port`, so its scrapes succeed; another's
/// has none, so it turns unreachable: the addresses are the pods' own.
#[test]
fn the_pool_follows_the_ready_pods_of_a_selector_on_a_real_api_server() {
    let _group = crate::common::group(module_path!());
    let ns = "pool";
    let Some(c) = cluster("the gateway's pod watch", "gateway-pods", ns) else {
        return;
    };
    let cp = &c.cp;
    let engine = spawn_engine(&["--model", MODEL], Log::Inherit);
    let port = addr_of(&engine).port();
    let pod = |name: &str, app: &str, gated: bool| {
        let gates = if gated {
            "\n  readinessGates: [{conditionType: ballast.dev/accepting}]"
        } else {
            ""
        };
        cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: {app}}}}}\nspec:\n  containers: [{{name: engine, image: localhost/ballast:none}}]{gates}\n"
        ))
        .unwrap();
    };
    let status = |name: &str, ip: &str, conditions: &str| {
        cp.kubectl(&[
            "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge", "-p",
            &format!(
                r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"conditions":[{conditions}]}}}}"#
            ),
        ])
        .unwrap_or_else(|e| panic!("status of {name}: {e}"));
    };
    let ready = r#"{"type":"Ready","status":"True"}"#;
    let unready = r#"{"type":"Ready","status":"False"}"#;
    pod("served", "engine", false);
    pod("empty", "engine", false);
    pod("other", "something-else", false);
    status("served", "127.0.0.1", ready);
    status("empty", "127.0.0.3", ready);
    status("other", "127.0.0.1", ready);

    let target_port = port.to_string();
    let (_gateway, _, metrics) = spawn_gateway_with(
        &[
            "--selector",
            "app=engine",
            "--namespace",
            ns,
            "--target-port",
            &target_port,
        ],
        &[("KUBECONFIG", cp.admin_kubeconfig.as_path())],
    );
    let gauge = |name: &str| sample(&metrics, name, "");
    let scraped_ok = || sample(&metrics, "ballast_gateway_scrapes_total", "outcome=\"ok\"");
    wait_for("the two ready pods of the selector", || {
        gauge("ballast_gateway_endpoints") == 2.0
            && gauge("ballast_gateway_endpoints_unreachable") == 1.0
            && scraped_ok() > 0.0
    });

    // Not Ready: out.
    status("empty", "127.0.0.3", unready);
    wait_for("the unready pod to leave", || {
        gauge("ballast_gateway_endpoints") == 1.0
            && gauge("ballast_gateway_endpoints_unreachable") == 0.0
    });
    // Deleted: out.
    cp.kubectl(&["delete", "pod", "served", "-n", ns, "--wait=false"])
        .unwrap();
    wait_for("the deleted pod to leave", || {
        gauge("ballast_gateway_endpoints") == 0.0
    });
    // Ready but gated (at the engine's address): in only once the operator's gate says it
    // accepts.
    pod("gated", "engine", true);
    status("gated", "127.0.0.1", ready);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        gauge("ballast_gateway_endpoints"),
        0.0,
        "a gated pod got in"
    );
    status(
        "gated",
        "127.0.0.1",
        &format!(r#"{ready},{{"type":"ballast.dev/accepting","status":"True"}}"#),
    );
    wait_for("the gated pod to join", || {
        gauge("ballast_gateway_endpoints") == 1.0
    });
    let before = scraped_ok();
    wait_for("the gated pod's engine to be scraped", || {
        scraped_ok() > before
    });
}

/// `spec.gateway` against a real kube-apiserver (no node: pod status is written as a
/// kubelet would). Without the InferencePool CRD the service says so in `GatewayReady`
/// and runs as before; once the vendored GIE CRD is installed the operator owns an
/// InferencePool and the picker's Deployment, Service, PDB, ServiceAccount, Role and
/// RoleBinding; a hand edit of the pool is put back with a Warning Event; `ballast gateway
/// --pool`, authenticated as the picker's own ServiceAccount, finds the pool's ready pod
/// with its least-privilege Role; turning the gateway off deletes all of it.
#[test]
fn the_operator_keeps_an_inference_pool_that_its_picker_reads() {
    use ballast_e2e::process::{free_port, spawn_logged, stop_child};
    use std::path::Path;
    use std::process::Command;
    let _group = crate::common::group(module_path!());
    let ns = "pool";
    let Some(c) = cluster("the operator's InferencePool", "gateway-pool", ns) else {
        return;
    };
    let (cp, dir) = (&c.cp, &c.dir);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let crd = repo.join("charts/ballast/crds/inferenceservices.ballast.dev.yaml");
    cp.kubectl(&["apply", "-f", crd.to_str().unwrap()]).unwrap();
    let logs = dir.join("logs");
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            stop_child(&mut self.0, Duration::from_secs(5));
        }
    }
    let _operator = Child(
        spawn_logged(
            &logs,
            "operator",
            Command::new(env!("CARGO_BIN_EXE_ballast"))
                .args([
                    "operator",
                    "--no-leader-election",
                    "--metrics-host",
                    "127.0.0.1",
                ])
                .args(["--metrics-port", &free_port().to_string()])
                .args(["--engine-image", "localhost/ballast:none"])
                .env("KUBECONFIG", &cp.admin_kubeconfig)
                .env("BALLAST_LOG", "info"),
        )
        .unwrap(),
    );
    let op_log = || ballast_e2e::cluster::log_tail(&logs.join("operator.log"), 30);
    let get = |args: &[&str]| {
        let mut all = vec!["get", "-n", ns];
        all.extend(args);
        cp.kubectl(&all).unwrap_or_default()
    };
    let condition = |field: &str| {
        get(&[
            "inferenceservice",
            "chat",
            "-o",
            &format!(r#"jsonpath={{.status.conditions[?(@.type=="GatewayReady")].{field}}}"#),
        ])
    };
    let wait = |what: &str, mut cond: Box<dyn FnMut() -> bool + '_>| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; the operator's log ends:\n{}",
                op_log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };

    // minReplicas 0 without the gateway: refused by the CRD's CEL rule, with the reason.
    let refused = cp
        .apply(&format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: zero, namespace: {ns}}}\nspec:\n  model: {{source: '{MODEL}'}}\n  autoscaling: {{minReplicas: 0}}\n"
        ))
        .unwrap_err();
    assert!(
        refused.contains("minReplicas: 0 needs gateway.enabled"),
        "{refused}"
    );

    // A real engine whose port the pool targets.
    let engine = spawn_engine(&["--model", MODEL], Log::Inherit);
    let port = addr_of(&engine).port();
    cp.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat, namespace: {ns}}}\nspec:\n  model: {{source: '{MODEL}'}}\n  engine: {{port: {port}}}\n  metrics: {{scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}}\n  gateway: {{enabled: true, failureMode: FailOpen}}\n"
    ))
    .unwrap();
    wait(
        "GatewayUnavailable without the InferencePool CRD",
        Box::new(|| condition("reason") == "GatewayUnavailable"),
    );
    let message = condition("message");
    assert!(
        message.contains("inferencepools.inference.networking.k8s.io"),
        "the condition names the missing CRD: {message}"
    );
    assert_eq!(condition("status"), "False");
    // Served as before: the engines' Deployment is there, the picker's is not.
    assert!(!get(&["deployment", "chat", "-o", "name"]).is_empty());
    assert!(get(&["deployment", "chat-epp", "-o", "name", "--ignore-not-found"]).is_empty());

    let gie = repo.join("e2e/gie/inferencepools.yaml");
    cp.kubectl(&["apply", "-f", gie.to_str().unwrap()]).unwrap();
    wait(
        "the InferencePool and the picker",
        Box::new(|| {
            !get(&["inferencepool", "chat", "-o", "name", "--ignore-not-found"]).is_empty()
                && [
                    "deployment",
                    "service",
                    "pdb",
                    "serviceaccount",
                    "role",
                    "rolebinding",
                ]
                .iter()
                .all(|k| !get(&[k, "chat-epp", "-o", "name", "--ignore-not-found"]).is_empty())
        }),
    );
    let pool: serde_json::Value =
        serde_json::from_str(&get(&["inferencepool", "chat", "-o", "json"])).unwrap();
    assert_eq!(pool["spec"]["targetPorts"][0]["number"], port);
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "ballast-engine"
    );
    assert_eq!(pool["spec"]["endpointPickerRef"]["name"], "chat-epp");
    assert_eq!(pool["spec"]["endpointPickerRef"]["failureMode"], "FailOpen");
    wait(
        "PickerNotReady (no node runs the picker)",
        Box::new(|| condition("reason") == "PickerNotReady"),
    );

    // An edit by hand is put back, and said.
    cp.kubectl(&[
        "patch",
        "inferencepool",
        "chat",
        "-n",
        ns,
        "--type=merge",
        "-p",
        r#"{"spec":{"targetPorts":[{"number":9999}]}}"#,
    ])
    .unwrap();
    wait(
        "the edited pool to be put back",
        Box::new(|| {
            get(&[
                "inferencepool",
                "chat",
                "-o",
                "jsonpath={.spec.targetPorts[0].number}",
            ]) == port.to_string()
        }),
    );
    wait(
        "an InferencePoolReverted Event",
        Box::new(|| {
            get(&[
                "events",
                "--field-selector",
                "reason=InferencePoolReverted",
                "-o",
                "name",
            ])
            .lines()
            .count()
                > 0
        }),
    );

    // The picker as it runs in the pod: its own ServiceAccount, its own Role.
    let picker_kubeconfig = cp.service_account_kubeconfig(ns, "chat-epp").unwrap();
    let (_picker, _, metrics) = spawn_gateway_with(
        &["--pool", "chat", "--namespace", ns],
        &[("KUBECONFIG", picker_kubeconfig.as_path())],
    );
    let gauge = |name: &str| sample(&metrics, name, "");
    // An engine pod of the pool (the Deployment's pods have no node here): Ready at the
    // engine's address.
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: served, namespace: {ns}, labels: {{app.kubernetes.io/name: ballast-engine, app.kubernetes.io/instance: chat}}}}\nspec:\n  containers: [{{name: engine, image: localhost/ballast:none}}]\n"
    ))
    .unwrap();
    cp.kubectl(&[
        "patch", "pod", "served", "-n", ns, "--subresource=status", "--type=merge", "-p",
        r#"{"status":{"phase":"Running","podIP":"127.0.0.1","podIPs":[{"ip":"127.0.0.1"}],"conditions":[{"type":"Ready","status":"True"}]}}"#,
    ])
    .unwrap();
    wait_for("the pool's ready pod, scraped", || {
        gauge("ballast_gateway_endpoints") == 1.0
            && sample(&metrics, "ballast_gateway_scrapes_total", "outcome=\"ok\"") > 0.0
    });

    // Off: the pool and the picker go, and so does the condition.
    cp.kubectl(&[
        "patch",
        "inferenceservice",
        "chat",
        "-n",
        ns,
        "--type=merge",
        "-p",
        r#"{"spec":{"gateway":{"enabled":false}}}"#,
    ])
    .unwrap();
    wait(
        "the gateway's objects to be deleted",
        Box::new(|| {
            get(&["inferencepool", "chat", "-o", "name", "--ignore-not-found"]).is_empty()
                && [
                    "deployment",
                    "service",
                    "pdb",
                    "serviceaccount",
                    "role",
                    "rolebinding",
                ]
                .iter()
                .all(|k| get(&[k, "chat-epp", "-o", "name", "--ignore-not-found"]).is_empty())
                && condition("reason").is_empty()
        }),
    );
    // With its pool gone, the picker has no endpoints (its watch says so).
    wait_for("the picker to drop the deleted pool's pods", || {
        gauge("ballast_gateway_endpoints") == 0.0
    });
}
