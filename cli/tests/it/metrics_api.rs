//! The operator's metrics APIs through the real API server's aggregation layer.
//!
//! A real control plane (e2e's, with the front-proxy CA, the `X-Remote-*` headers and
//! aggregator routing that kubeadm sets) and `ballast operator` as a process on the host,
//! serving `custom.metrics.k8s.io` and `external.metrics.k8s.io` on the pod network's
//! gateway 10.244.0.1 (the API server refuses loopback endpoints). Two `APIService`s point
//! at a selector-less Service whose Endpoints are that address; everything is then read
//! as users read it: `kubectl get --raw` and a kube-rs client through the API server, and
//! `curl` straight at the operator for what the aggregator must never let through.
//!
//! No node is started: engine pods stay Pending, so values are absent here (the real-node
//! e2e, `cluster.rs`, has engines under load). Skips like `cluster.rs` without the cluster's
//! programs or root; `BALLAST_REQUIRE_E2E=1` makes that a failure.

use crate::common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ballast_e2e::cluster::{ControlPlane, binaries, issue};
use ballast_e2e::node::PodNetwork;
use ballast_e2e::process::{free_port, run, spawn_logged, stop_child};
use serde_json::Value;

const OPERATOR_NS: &str = "ballast-system";
const NS: &str = "e2e";
const CUSTOM: &str = "/apis/custom.metrics.k8s.io/v1beta2";
const EXTERNAL: &str = "/apis/external.metrics.k8s.io/v1beta1";

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        stop_child(&mut self.0, Duration::from_secs(5));
    }
}

fn wait_for<T>(
    what: &str,
    timeout: Duration,
    diag: impl Fn() -> String,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            diag()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `curl` straight at the operator: the HTTP status and body (status 0 and curl's words
/// when it got no answer).
fn curl(url: &str, extra: &[&str]) -> (u16, String) {
    let out = match run(Command::new("curl")
        .args(["-sk", "-o", "-", "-w", "\n%{http_code}", "--max-time", "10"])
        .args(extra)
        .arg(url))
    {
        Ok(out) => out,
        Err(e) => return (0, e),
    };
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn base64(path: &Path) -> String {
    run(Command::new("base64").args(["-w0"]).arg(path))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn the_metrics_apis_through_the_aggregation_layer() {
    let _group = crate::common::group(module_path!());
    let bin = match binaries() {
        Ok(b) => b,
        Err(why) => {
            assert!(
                std::env::var_os("BALLAST_REQUIRE_E2E").is_none(),
                "BALLAST_REQUIRE_E2E is set but the aggregation-layer test cannot run: {why}"
            );
            eprintln!("skipping the aggregation-layer test: {why}");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("ballast-metrics-api-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let network = PodNetwork::create().unwrap_or_else(|e| panic!("the pod network: {e}"));
    let cp = ControlPlane::start(&bin, &dir, network.gateway)
        .unwrap_or_else(|e| panic!("the control plane: {e}"));
    let host = network.gateway.to_string();

    // The serving certificate, from a CA of the test's own that the APIServices trust.
    let pki = dir.join("metrics-api-pki");
    std::fs::create_dir_all(&pki).unwrap();
    issue(&pki, "ca", "/CN=metrics-api-ca", "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\n").unwrap();
    issue(
        &pki,
        "serving",
        "/CN=ballast-metrics-api",
        &format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:ballast-metrics-api.{OPERATOR_NS}.svc,IP:{host}\n"),
    )
    .unwrap();
    // A user certificate from the cluster's client CA, for the direct calls.
    let cluster_pki = dir.join("pki");

    let crd = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/ballast/crds/inferenceservices.ballast.dev.yaml");
    cp.kubectl(&["apply", "-f", crd.to_str().unwrap()]).unwrap();
    cp.kubectl(&["create", "namespace", OPERATOR_NS]).unwrap();
    cp.kubectl(&["create", "namespace", NS]).unwrap();

    let port = free_port();
    let keda_port = free_port();
    let logs = dir.join("logs");
    let _operator = Operator(
        spawn_logged(
            &logs,
            "operator",
            Command::new(env!("CARGO_BIN_EXE_ballast"))
                .arg("operator")
                .args(["--no-leader-election", "--metrics-host", "127.0.0.1"])
                .args(["--metrics-port", &free_port().to_string()])
                .args([
                    "--metrics-api-host",
                    &host,
                    "--metrics-api-port",
                    &port.to_string(),
                ])
                .args([
                    "--keda-host",
                    "127.0.0.1",
                    "--keda-port",
                    &keda_port.to_string(),
                ])
                .arg("--metrics-api-cert-file")
                .arg(pki.join("serving.crt"))
                .arg("--metrics-api-key-file")
                .arg(pki.join("serving.key"))
                .env("KUBECONFIG", &cp.admin_kubeconfig)
                .env("BALLAST_LOG", "info,ballast::metrics_api=debug"),
        )
        .unwrap(),
    );
    let op_log = || ballast_e2e::cluster::log_tail(&logs.join("operator.log"), 40);
    let direct = format!("https://{host}:{port}");
    wait_for(
        "the operator's metrics APIs",
        Duration::from_secs(30),
        op_log,
        || (curl(&format!("{direct}/healthz"), &[]).0 == 200).then_some(()),
    );

    // Registered as users register any aggregated server.
    let ca_bundle = base64(&pki.join("ca.crt"));
    let mut yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: ballast-metrics-api, namespace: {OPERATOR_NS}}}\nspec: {{ports: [{{name: https, port: 443, targetPort: {port}}}]}}\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {{name: ballast-metrics-api, namespace: {OPERATOR_NS}}}\nsubsets: [{{addresses: [{{ip: \"{host}\"}}], ports: [{{name: https, port: {port}}}]}}]\n"
    );
    for (group, version) in [
        ("custom.metrics.k8s.io", "v1beta2"),
        ("external.metrics.k8s.io", "v1beta1"),
    ] {
        yaml.push_str(&format!(
            "---\napiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: {version}.{group}}}\nspec: {{group: {group}, version: {version}, service: {{namespace: {OPERATOR_NS}, name: ballast-metrics-api, port: 443}}, caBundle: {ca_bundle}, groupPriorityMinimum: 100, versionPriority: 200}}\n"
        ));
    }
    cp.apply(&yaml).unwrap();
    let diag = || {
        format!(
            "{}\n--- operator\n{}\n--- kube-apiserver\n{}",
            cp.kubectl(&["get", "apiservices", "-o", "wide"])
                .unwrap_or_default(),
            op_log(),
            cp.log_tail("kube-apiserver", 20)
        )
    };
    let t0 = Instant::now();
    for name in [
        "v1beta2.custom.metrics.k8s.io",
        "v1beta1.external.metrics.k8s.io",
    ] {
        wait_for(
            &format!("APIService {name} Available"),
            Duration::from_secs(90),
            diag,
            || {
                let s: Value = serde_json::from_str(
                    &cp.kubectl(&["get", "apiservice", name, "-o", "json"])
                        .ok()?,
                )
                .ok()?;
                s["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Available" && c["status"] == "True")
                    .then_some(())
            },
        );
    }
    eprintln!("both APIServices Available after {:?}", t0.elapsed());

    // Discovery lists every metric, through the API server.
    let list: Value =
        serde_json::from_str(&cp.kubectl(&["get", "--raw", CUSTOM]).unwrap()).unwrap();
    let mut names: Vec<String> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "inferenceservices.ballast.dev/admission_rejections_per_second_per_replica",
            "inferenceservices.ballast.dev/capacity_waiting_per_replica",
            "inferenceservices.ballast.dev/deferred_waiting",
            "inferenceservices.ballast.dev/held_requests",
            "inferenceservices.ballast.dev/kv_cache_usage",
            "inferenceservices.ballast.dev/recommended_replicas",
            "inferenceservices.ballast.dev/ttft_p99_seconds",
            "pods/capacity_waiting",
            "pods/kv_cache_usage",
        ]
    );
    let ext: Value =
        serde_json::from_str(&cp.kubectl(&["get", "--raw", EXTERNAL]).unwrap()).unwrap();
    assert_eq!(ext["resources"].as_array().unwrap().len(), 7, "{ext}");
    assert!(
        ext["resources"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["kind"] == "ExternalMetricValueList")
    );

    // The API server's own discovery lists both groups (the HPA controller finds the
    // versions there), which it learns from the operator as the aggregator.
    wait_for(
        "both groups in the API server's discovery",
        Duration::from_secs(30),
        diag,
        || {
            let versions = cp.kubectl(&["api-versions"]).ok()?;
            (versions.contains("custom.metrics.k8s.io/v1beta2")
                && versions.contains("external.metrics.k8s.io/v1beta1"))
            .then_some(())
        },
    );

    // The same through a kube-rs client, as a program would discover it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let kube_names = rt.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&cp.admin_kubeconfig).unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let list = client
            .list_api_group_resources("custom.metrics.k8s.io/v1beta2")
            .await
            .unwrap();
        list.resources
            .into_iter()
            .map(|r| r.name)
            .collect::<Vec<_>>()
    });
    assert_eq!(kube_names.len(), 9, "{kube_names:?}");
    assert!(kube_names.contains(&"inferenceservices.ballast.dev/recommended_replicas".to_string()));

    // An InferenceService with no pod running yet (no node here): its metrics are absent,
    // NotFound, never 0.
    cp.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat, namespace: {NS}}}\nspec: {{model: {{source: 'synthetic:tiny'}}, engine: {{image: localhost/none:1}}, metrics: {{scrapeIntervalSeconds: 2, scrapeTimeoutSeconds: 1}}}}\n"
    ))
    .unwrap();
    wait_for(
        "the operator to decide on chat",
        Duration::from_secs(60),
        op_log,
        || {
            let s: Value = serde_json::from_str(
                &cp.kubectl(&["get", "inferenceservice", "chat", "-n", NS, "-o", "json"])
                    .ok()?,
            )
            .ok()?;
            s["status"]["lastDecision"]["reason"]
                .as_str()
                .map(str::to_string)
        },
    );
    let object = format!(
        "{CUSTOM}/namespaces/{NS}/inferenceservices.ballast.dev/chat/capacity_waiting_per_replica"
    );
    for path in [
        object.clone(),
        format!("{CUSTOM}/namespaces/{NS}/inferenceservices.ballast.dev/chat/recommended_replicas"),
        format!(
            "{CUSTOM}/namespaces/{NS}/pods/*/kv_cache_usage?labelSelector=app.kubernetes.io%2Finstance%3Dchat"
        ),
        format!(
            "{EXTERNAL}/namespaces/{NS}/kv_cache_usage?labelSelector=ballast.dev%2Finferenceservice%3Dchat"
        ),
    ] {
        let e = cp
            .kubectl(&["get", "--raw", &path])
            .expect_err(&format!("{path} absent"));
        assert!(
            e.contains("NotFound") || e.contains("not found"),
            "{path}: {e}"
        );
    }
    // A bad selector is a 400 through the aggregator too.
    let e = cp
        .kubectl(&[
            "get",
            "--raw",
            &format!("{EXTERNAL}/namespaces/{NS}/kv_cache_usage?labelSelector=a%20in%20(b"),
        ])
        .unwrap_err();
    assert!(e.contains("BadRequest") || e.contains("400"), "{e}");

    // A ServiceAccount without RBAC on the metrics: 403 from the operator's
    // SubjectAccessReview, naming the caller the aggregator passed on.
    cp.kubectl(&["create", "serviceaccount", "nobody", "-n", NS])
        .unwrap();
    let nobody = cp.service_account_kubeconfig(NS, "nobody").unwrap();
    let e = cp
        .kubectl_as(&nobody, &["get", "--raw", &object])
        .unwrap_err();
    assert!(e.contains("Forbidden") || e.contains("forbidden"), "{e}");
    assert!(
        e.contains("system:serviceaccount:e2e:nobody"),
        "the 403 names the caller: {e}"
    );

    // Straight at the operator: no certificate and no token is a 401 …
    let (code, body) = curl(&format!("{direct}{object}"), &[]);
    assert_eq!(code, 401, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["kind"],
        "Status"
    );
    // … and so is a forged caller on a connection without the front proxy's certificate:
    // the X-Remote-* headers are read only from the front proxy.
    let (code, body) = curl(
        &format!("{direct}{object}"),
        &[
            "-H",
            "X-Remote-User: admin",
            "-H",
            "X-Remote-Group: system:masters",
        ],
    );
    assert_eq!(code, 401, "a forged X-Remote-User is ignored: {body}");
    // A certificate from the cluster's client CA names its user: the admin may.
    let cert_arg = |f: &str| cluster_pki.join(f).display().to_string();
    let (code, body) = curl(
        &format!("{direct}{CUSTOM}"),
        &[
            "--cert",
            &cert_arg("admin.crt"),
            "--key",
            &cert_arg("admin.key"),
        ],
    );
    assert_eq!(code, 200, "{body}");
    // A bearer token goes through a TokenReview, then a SubjectAccessReview.
    let token = cp
        .kubectl(&["create", "token", "nobody", "-n", NS])
        .unwrap();
    let auth = format!("Authorization: Bearer {}", token.trim());
    let (code, body) = curl(&format!("{direct}{object}"), &["-H", &auth]);
    assert_eq!(code, 403, "{body}");
    let (code, body) = curl(
        &format!("{direct}{object}"),
        &["-H", "Authorization: Bearer not-a-token"],
    );
    assert_eq!(code, 401, "{body}");
    // Granted the metric, the same token gets through to the value: absent here.
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: read-metrics, namespace: {NS}}}\nrules: [{{apiGroups: [custom.metrics.k8s.io], resources: ['inferenceservices.ballast.dev/capacity_waiting_per_replica'], verbs: [get]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: read-metrics, namespace: {NS}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-metrics}}\nsubjects: [{{kind: ServiceAccount, name: nobody, namespace: {NS}}}]\n"
    ))
    .unwrap();
    // The 403 above is cached for 10 s.
    let (code, body) = wait_for(
        "the grant to take effect",
        Duration::from_secs(30),
        op_log,
        || {
            let (code, body) = curl(&format!("{direct}{object}"), &["-H", &auth]);
            (code != 403).then_some((code, body))
        },
    );
    assert_eq!(code, 404, "granted, and absent: {body}");
    // The operator's own health, unauthenticated.
    assert_eq!(curl(&format!("{direct}/readyz"), &[]).0, 200);

    // The accept loop every Ballast server runs, with the TLS handshake as its first step:
    // a flood of connections that never finish a handshake is cut to the cap at once, locks
    // out no client, and what is left of it is closed by the header timeout.
    ballast_serve::raise_open_files_limit();
    let cap = ballast_operator::metrics_api::server::LIMITS.max_connections;
    let flood = cap + 100;
    let addr = direct.strip_prefix("https://").unwrap().to_string();
    let started = Instant::now();
    let mut silent = common::Held::new(
        (0..flood)
            .map(|_| std::net::TcpStream::connect(&addr).unwrap())
            .collect(),
    );
    // Each connection's header timeout runs from its accept, which on a loaded 2-core
    // machine may come seconds after `started`: the bound below runs from the last
    // connect instead (CI once saw 48 of 612 still open 13 s after `started`).
    let connected = Instant::now();
    println!("{flood} connections made in {:?}", connected - started);
    for _ in 0..3 {
        let t = Instant::now();
        assert_eq!(curl(&format!("{direct}/healthz"), &[]).0, 200);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "served in {:?} behind {flood} silent connections",
            t.elapsed()
        );
    }
    let at_once = silent.closed();
    assert!(
        at_once >= flood - cap,
        "{at_once} of {flood} closed; cap {cap}"
    );
    let header = ballast_operator::metrics_api::server::LIMITS.header_timeout;
    let mut all = at_once;
    while all < flood && connected.elapsed() < header + Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(250));
        all = silent.closed();
    }
    assert_eq!(
        all,
        flood,
        "handshakes still waiting {:?} after the last connect ({:?} after the first)",
        connected.elapsed(),
        started.elapsed()
    );
    drop(silent);

    // KEDA's external scaler on the same process (--keda-port), called as KEDA calls it:
    // `chat` has no pod that could report, so it is inactive and its metric NotFound.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use ballast_operator::keda::proto::external_scaler_client::ExternalScalerClient;
        use ballast_operator::keda::proto::{GetMetricsRequest, ScaledObjectRef};
        let mut c = ExternalScalerClient::connect(format!("http://127.0.0.1:{keda_port}"))
            .await
            .unwrap_or_else(|e| panic!("KEDA's scaler: {e}\n{}", op_log()));
        let reference = ScaledObjectRef {
            name: "chat".into(),
            namespace: NS.into(),
            scaler_metadata: [(
                ballast_operator::keda::SERVICE_KEY.to_string(),
                "chat".to_string(),
            )]
            .into(),
        };
        assert!(
            !c.is_active(reference.clone())
                .await
                .unwrap()
                .get_ref()
                .result
        );
        let e = c
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(reference),
                metric_name: "recommended_replicas".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message());
    });

    // The chart's ScaledObjects, as a real API server with KEDA's CRD judges them.
    let keda_crd =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/keda/keda.sh_scaledobjects.yaml");
    cp.kubectl(&["apply", "--server-side", "-f", keda_crd.to_str().unwrap()])
        .unwrap();
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/scaledobjects.keda.sh",
        "--timeout=30s",
    ])
    .unwrap();
    let helm = ballast_helm::Helm::new().unwrap_or_else(|e| panic!("helm: {e}"));
    let values = format!(
        "keda:\n  enabled: true\n  scaledObjects:\n  - {{name: chat, namespace: {NS}, inferenceService: chat, metric: capacity_waiting_per_replica, target: 2, minReplicaCount: 0, maxReplicaCount: 4}}\n"
    );
    let rendered = helm
        .render_with(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/ballast"),
            "ballast",
            OPERATOR_NS,
            &values,
            &ballast_helm::RenderOptions::default().api_version("keda.sh/v1alpha1/ScaledObject"),
        )
        .unwrap_or_else(|e| panic!("the chart: {e}"));
    let scaled: Vec<String> = rendered
        .documents
        .iter()
        .filter(|d| d.content.contains("kind: ScaledObject"))
        .map(|d| d.content.clone())
        .collect();
    assert_eq!(scaled.len(), 1, "{:?}", rendered.documents.len());
    let accepted = cp
        .apply_with(&scaled[0], &["--dry-run=server"])
        .unwrap_or_else(|e| {
            panic!(
                "the API server refused the chart's ScaledObject: {e}\n{}",
                scaled[0]
            )
        });
    assert!(accepted.contains("scaledobject.keda.sh/chat"), "{accepted}");
    // The dry run judges: a trigger without its type is refused by KEDA's schema.
    let broken = scaled[0].replacen("type: external", "", 1);
    let refused = cp
        .apply_with(&broken, &["--dry-run=server"])
        .expect_err("a trigger without a type");
    assert!(refused.contains("type"), "{refused}");
    drop(cp);
    drop(network);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A certificate or key that is missing or not PEM is a flag error at start, naming the
/// file, before the operator looks for a cluster.
#[test]
fn a_bad_certificate_file_is_named_at_start() {
    let _group = crate::common::group(module_path!());
    let dir =
        std::env::temp_dir().join(format!("ballast-metrics-api-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.crt");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let key = dir.join("tls.key");
    std::fs::write(&key, "not a key either").unwrap();
    for (cert, named) in [
        (dir.join("missing.crt"), "missing.crt"),
        (garbage.clone(), "garbage.crt"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ballast"))
            .args(["operator", "--metrics-api-port", "0"])
            .arg("--metrics-api-cert-file")
            .arg(&cert)
            .arg("--metrics-api-key-file")
            .arg(&key)
            .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(named) && stderr.contains("--metrics-api-cert-file"),
            "the error names {named}: {stderr}"
        );
    }
    // One without the other is refused by the flag parser.
    let out = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args([
            "operator",
            "--metrics-api-port",
            "0",
            "--metrics-api-cert-file",
        ])
        .arg(&garbage)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-api-key-file"));
    let _ = std::fs::remove_dir_all(&dir);
}
