//! `ballast gateway --selector` against a real kube-apiserver: the e2e control plane
//! (`ballast_e2e`, no node), in its own test group so the API server's start does not
//! share the machine with the timing-sensitive Envoy tests of `gateway`.

use crate::common;
use crate::gateway::{MODEL, addr_of, sample, spawn_gateway_with, wait_for};

use std::time::Duration;

use common::engine::{Log, spawn_engine};

/// `--selector` against a real kube-apiserver (the e2e control plane, no node: the pods'
/// status is written as a kubelet would): the pool is the selected pods that are Ready,
/// have an IP and pass the `ballast.dev/accepting` gate, and follows them as they change.
/// One pod's IP has a real engine behind `--target-port`, so its scrapes succeed; another's
/// has none, so it turns unreachable: the addresses are the pods' own.
#[test]
fn the_pool_follows_the_ready_pods_of_a_selector_on_a_real_api_server() {
    use ballast_e2e::cluster::{ControlPlane, binaries};
    use ballast_e2e::node::PodNetwork;
    let _group = crate::common::group(module_path!());
    let bin = match binaries() {
        Ok(b) => b,
        Err(why) => {
            assert!(
                std::env::var_os("BALLAST_REQUIRE_E2E").is_none(),
                "BALLAST_REQUIRE_E2E is set but the pod-watch test cannot run: {why}"
            );
            eprintln!("SKIPPED: the gateway's pod watch on a real API server: {why}");
            return;
        }
    };
    let dir = common::local::temp_dir("gateway-pods");
    let network = PodNetwork::create().unwrap_or_else(|e| panic!("the pod network: {e}"));
    let cp = ControlPlane::start(&bin, &dir, network.gateway)
        .unwrap_or_else(|e| panic!("the control plane: {e}"));
    let ns = "pool";
    cp.kubectl(&["create", "namespace", ns]).unwrap();
    // Pods are admitted once the controller-manager has made the namespace's account.
    wait_for("the namespace's default service account", || {
        cp.kubectl(&["get", "serviceaccount", "default", "-n", ns])
            .is_ok()
    });
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
