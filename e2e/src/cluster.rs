//! A real Kubernetes control plane on this machine: etcd (Debian's `etcd-server`),
//! kube-apiserver (RBAC and Node authorizers, PodSecurity admission, service-account tokens,
//! the aggregation layer as kubeadm sets it up — a front-proxy CA and client certificate,
//! the `X-Remote-*` request headers, aggregator routing — a client certificate for kubelets),
//! kube-controller-manager (every controller but the cloud's, node IPAM and routes) and
//! kube-scheduler. Certificates are made with `openssl` (X.509 v3, which rustls requires).
//!
//! The API server binds the pod network's gateway address (see [`crate::node::PodNetwork`]),
//! so pods reach it through the `kubernetes` Service (10.96.0.1:443) as in any cluster,
//! and the tests reach it from the host at the same address.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, run, spawn_logged, stop_child, which};

/// The control-plane and node programs a cluster needs and the host commands it runs, or
/// the reason (naming each thing missing) why a cluster cannot start here.
///
/// The Kubernetes binaries are looked up in `$BALLAST_K8S_BIN`, else
/// `~/.cache/ballast-k8s/bin` (where `../shared/k8s/install.sh` unpacks them):
/// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
/// and pause (the sandbox image's program). On the PATH: etcd, openssl, curl,
/// containerd, ctr, runc, iptables, ip, buildah; and the CNI plugins in `/usr/lib/cni`.
/// The node also needs root.
pub fn binaries() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("BALLAST_K8S_BIN") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
            PathBuf::from(home).join(".cache/ballast-k8s/bin")
        }
    };
    let mut missing = Vec::new();
    for b in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
        "kubectl",
        "pause",
    ] {
        if !dir.join(b).is_file() {
            missing.push(dir.join(b).display().to_string());
        }
    }
    if !missing.is_empty() {
        return Err(format!(
            "no {} (set BALLAST_K8S_BIN, or run ../shared/k8s/install.sh; see docs/e2e.md)",
            missing.join(", ")
        ));
    }
    // Debian package of each host command, for the message.
    let commands = [
        ("etcd", "etcd-server"),
        ("openssl", "openssl"),
        ("curl", "curl"),
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("iptables", "iptables"),
        ("ip", "iproute2"),
        ("buildah", "buildah"),
    ];
    for (cmd, package) in commands {
        if which(cmd).is_none() {
            missing.push(format!("{cmd} (Debian package {package})"));
        }
    }
    for plugin in ["bridge", "host-local", "loopback", "portmap"] {
        if !Path::new("/usr/lib/cni").join(plugin).is_file() {
            missing.push(format!(
                "/usr/lib/cni/{plugin} (Debian package containernetworking-plugins)"
            ));
        }
    }
    if !missing.is_empty() {
        return Err(format!("not on this machine: {}", missing.join(", ")));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("a node (containerd, the kubelet, a bridge) needs root".into());
    }
    Ok(dir)
}

/// The API server's audit policy: the metadata of every request once it completes.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
";

/// One request the API server completed, from its audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditedRequest {
    /// The authenticated user (`system:serviceaccount:NS:NAME` for a ServiceAccount).
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `patch`, `update`, `delete`…
    pub verb: String,
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource, with `/SUBRESOURCE` when there is one (`""` for a non-resource URL).
    pub resource: String,
    /// The request URI.
    pub uri: String,
}

/// A running control plane; stopped (every process killed) when dropped.
pub struct ControlPlane {
    /// State: certificates, etcd data, logs, kubeconfigs.
    pub dir: PathBuf,
    /// The Kubernetes binaries.
    pub bin: PathBuf,
    /// The address the API server binds and advertises.
    pub address: Ipv4Addr,
    /// `https://ADDRESS:PORT`.
    pub server: String,
    /// A kubeconfig for user `admin` in `system:masters`.
    pub admin_kubeconfig: PathBuf,
    children: Vec<(String, Child)>,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for (_, c) in self.children.iter_mut().rev() {
            stop_child(c, Duration::from_secs(5));
        }
    }
}

/// Makes an X.509 v3 key and certificate `NAME.{key,crt}` under `pki`, signed by the CA
/// there (self-signed for `ca`), with `subject` and the extensions `ext`.
pub fn issue(pki: &Path, name: &str, subject: &str, ext: &str) -> Result<(), String> {
    let ext_file = format!("{name}.ext");
    std::fs::write(pki.join(&ext_file), ext).map_err(|e| e.to_string())?;
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    let o = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(pki)).map(|_| ());
    o(&[
        "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
        subject,
    ])?;
    let signer: &[&str] = if name == "ca" {
        &["-signkey", "ca.key"]
    } else {
        &["-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"]
    };
    let mut args = vec!["x509", "-req", "-in", csr.as_str()];
    args.extend_from_slice(signer);
    args.extend(["-days", "7", "-extfile", &ext_file, "-out", crt.as_str()]);
    o(&args)
}

/// The cluster's Service range (`--service-cluster-ip-range`). The node routes it onto its
/// bridge so a cluster IP that kube-proxy has not translated (yet) never leaves the machine
/// by the default route, as `../shared/k8s/up.sh` does.
pub const SERVICE_RANGE: &str = "10.96.0.0/16";

/// v3 extensions of a client certificate.
pub(crate) const CLIENT_EXT: &str = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n";

/// Makes the certificate authority, the API server's serving certificate (for `address`,
/// the `kubernetes` Service's 10.96.0.1 and its DNS names), the admin's client
/// certificate, the API server's client certificate for kubelets and the service-account
/// key pair under `pki`.
fn certificates(pki: &Path, address: Ipv4Addr) -> Result<(), String> {
    std::fs::create_dir_all(pki).map_err(|e| e.to_string())?;
    issue(
        pki,
        "ca",
        "/CN=ballast-e2e-ca",
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\n",
    )?;
    issue(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        &format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:{address},IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        ),
    )?;
    issue(pki, "admin", "/O=system:masters/CN=admin", CLIENT_EXT)?;
    // `kubectl logs` and `exec` go from the API server to the kubelet with this identity.
    issue(
        pki,
        "kubelet-client",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        CLIENT_EXT,
    )?;
    // The aggregation layer, as kubeadm sets it up: a CA of its own and the front
    // proxy's client certificate, which the API server presents to extension servers.
    let front = pki.join("front-proxy");
    std::fs::create_dir_all(&front).map_err(|e| e.to_string())?;
    issue(
        &front,
        "ca",
        "/CN=ballast-e2e-front-proxy-ca",
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\n",
    )?;
    issue(
        &front,
        "front-proxy-client",
        "/CN=front-proxy-client",
        CLIENT_EXT,
    )?;
    let o = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(pki)).map(|_| ());
    o(&["genrsa", "-out", "sa.key", "2048"])?;
    o(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    Ok(())
}

/// Writes a kubeconfig for `server` with the CA at `pki/ca.crt` and `user` (YAML lines).
pub fn kubeconfig(path: &Path, server: &str, pki: &Path, user: &str) -> std::io::Result<()> {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}\nusers:\n- name: u\n  user: {user}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: u, namespace: default}}\ncurrent-context: e2e\n",
            pki.join("ca.crt").display()
        ),
    )
}

impl ControlPlane {
    /// Starts etcd, the API server on `address` (waiting until it is ready), the
    /// controller manager and the scheduler, with state under `dir`. `address` is the pod
    /// network's gateway ([`crate::node::PodNetwork::gateway`]), which must exist first.
    pub fn start(bin: &Path, dir: &Path, address: Ipv4Addr) -> Result<ControlPlane, String> {
        let pki = dir.join("pki");
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        certificates(&pki, address)?;
        let mut cp = ControlPlane {
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
            address,
            server: String::new(),
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            children: Vec::new(),
        };
        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = spawn_logged(
            &logs,
            "etcd",
            Command::new("etcd")
                .args(["--name", "e2e", "--data-dir"])
                .arg(dir.join("etcd"))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("e2e={peer_url}")]),
        )?;
        cp.children.push(("etcd".into(), etcd));
        let p = |f: &str| pki.join(f).display().to_string();
        let addr = address.to_string();
        // Every request's metadata (who, verb, resource; no bodies), so a test can tell
        // which component made a request; `apiserver_request_total` cannot.
        std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY).map_err(|e| e.to_string())?;
        let audit_policy = dir.join("audit-policy.yaml").display().to_string();
        let audit_log = dir.join("audit.log").display().to_string();
        let apiserver = spawn_logged(
            &logs,
            "kube-apiserver",
            Command::new(bin.join("kube-apiserver"))
                .args(["--etcd-servers", &client_url])
                .args(["--bind-address", &addr, "--advertise-address", &addr])
                .args(["--secure-port", &api_port.to_string()])
                .args(["--tls-cert-file", &p("apiserver.crt")])
                .args(["--tls-private-key-file", &p("apiserver.key")])
                .args(["--client-ca-file", &p("ca.crt")])
                // The aggregation layer (kubeadm's flags): extension servers trust the
                // front proxy's CA and read the caller from these headers; the API server
                // dials an APIService's endpoints directly.
                .args(["--requestheader-client-ca-file", &p("front-proxy/ca.crt")])
                .args(["--requestheader-allowed-names", "front-proxy-client"])
                .args(["--requestheader-username-headers", "X-Remote-User"])
                .args(["--requestheader-group-headers", "X-Remote-Group"])
                .args(["--requestheader-extra-headers-prefix", "X-Remote-Extra-"])
                .args([
                    "--proxy-client-cert-file",
                    &p("front-proxy/front-proxy-client.crt"),
                ])
                .args([
                    "--proxy-client-key-file",
                    &p("front-proxy/front-proxy-client.key"),
                ])
                .args(["--enable-aggregator-routing=true"])
                .args(["--kubelet-client-certificate", &p("kubelet-client.crt")])
                .args(["--kubelet-client-key", &p("kubelet-client.key")])
                // The node's name resolves nowhere: reach kubelets at their InternalIP.
                .args(["--kubelet-preferred-address-types", "InternalIP"])
                .args(["--authorization-mode", "Node,RBAC"])
                .args(["--service-account-issuer", "https://kubernetes.default.svc"])
                .args(["--api-audiences", "https://kubernetes.default.svc"])
                .args(["--service-account-key-file", &p("sa.pub")])
                .args(["--service-account-signing-key-file", &p("sa.key")])
                .args(["--service-cluster-ip-range", SERVICE_RANGE])
                .args(["--audit-policy-file", &audit_policy])
                .args(["--audit-log-path", &audit_log, "--audit-log-format", "json"])
                .args(["--audit-log-maxsize", "0", "--audit-log-mode", "blocking"])
                .args(["--profiling=false"]),
        )?;
        cp.children.push(("kube-apiserver".into(), apiserver));
        cp.server = format!("https://{address}:{api_port}");
        kubeconfig(
            &cp.admin_kubeconfig,
            &cp.server,
            &pki,
            &format!(
                "{{client-certificate: \"{}\", client-key: \"{}\"}}",
                p("admin.crt"),
                p("admin.key")
            ),
        )
        .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ok = Command::new("curl")
                .args(["-fs", "-o", "/dev/null", "--cacert", &p("ca.crt")])
                .args(["--cert", &p("admin.crt"), "--key", &p("admin.key")])
                .arg(format!("{}/readyz", cp.server))
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "kube-apiserver not ready in 90 s; see {}",
                    logs.join("kube-apiserver.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let kc = cp.admin_kubeconfig.display().to_string();
        let cm = spawn_logged(
            &logs,
            "kube-controller-manager",
            Command::new(bin.join("kube-controller-manager"))
                .args(["--kubeconfig", &kc, "--authentication-kubeconfig", &kc])
                .args(["--authorization-kubeconfig", &kc, "--leader-elect=false"])
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &free_port().to_string()])
                .args(["--service-account-private-key-file", &p("sa.key")])
                .args(["--root-ca-file", &p("ca.crt")])
                // Each controller calls as its own ServiceAccount, as kubeadm sets it up:
                // the HPA controller reaches the metrics APIs as
                // system:serviceaccount:kube-system:horizontal-pod-autoscaler.
                .args(["--use-service-account-credentials=true"])
                .args(["--horizontal-pod-autoscaler-sync-period", "5s"])
                // No cloud, no node IPAM or routes (the node's pod CIDR is its own);
                // the node lifecycle controller lifts the not-ready taint once the
                // kubelet reports Ready.
                .args([
                    "--controllers",
                    "*,-nodeipam,-cloud-node-lifecycle,-service,-route",
                ]),
        )?;
        cp.children.push(("kube-controller-manager".into(), cm));
        let scheduler = spawn_logged(
            &logs,
            "kube-scheduler",
            Command::new(bin.join("kube-scheduler"))
                .args(["--kubeconfig", &kc, "--authentication-kubeconfig", &kc])
                .args(["--authorization-kubeconfig", &kc, "--leader-elect=false"])
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &free_port().to_string()]),
        )?;
        cp.children.push(("kube-scheduler".into(), scheduler));
        Ok(cp)
    }

    /// The requests the API server has completed so far, in order (its audit log).
    pub fn audited_requests(&self) -> Vec<AuditedRequest> {
        let text = std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .map(|e| {
                let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                let o = &e["objectRef"];
                let mut resource = s(&o["resource"]);
                if let Some(sub) = o["subresource"].as_str() {
                    resource = format!("{resource}/{sub}");
                }
                AuditedRequest {
                    user: s(&e["user"]["username"]),
                    verb: s(&e["verb"]),
                    group: s(&o["apiGroup"]),
                    resource,
                    uri: s(&e["requestURI"]),
                }
            })
            .collect()
    }

    /// `kubectl` with the admin kubeconfig: its stdout, or its stderr as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_as(&self.admin_kubeconfig, args)
    }

    /// `kubectl` with `kubeconfig`.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
        kubectl_run(&self.bin, kubeconfig, args, None)
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<String, String> {
        kubectl_run(
            &self.bin,
            &self.admin_kubeconfig,
            &["apply", "-f", "-"],
            Some(yaml),
        )
    }

    /// `kubectl apply -f - ARGS` of `yaml` (`--dry-run=server`, say).
    pub fn apply_with(&self, yaml: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["apply", "-f", "-"];
        all.extend(args);
        kubectl_run(&self.bin, &self.admin_kubeconfig, &all, Some(yaml))
    }

    /// A kubeconfig (written under the state dir) that authenticates as ServiceAccount
    /// `namespace/name` with a fresh token from the TokenRequest API.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, String> {
        let token = self.kubectl(&["create", "token", name, "-n", namespace])?;
        let path = self.dir.join(format!("{namespace}-{name}.kubeconfig"));
        kubeconfig(
            &path,
            &self.server,
            &self.dir.join("pki"),
            &format!("{{token: \"{}\"}}", token.trim()),
        )
        .map_err(|e| e.to_string())?;
        Ok(path)
    }

    /// The last `lines` lines of a component's log, for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        log_tail(&self.dir.join("logs").join(format!("{name}.log")), lines)
    }
}

/// The last `lines` lines of the file at `path` (empty when it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `kubectl ARGS` from `bin` with `kubeconfig` and `input` on its stdin: its stdout, or its
/// stderr as the error.
fn kubectl_run(
    bin: &Path,
    kubeconfig: &Path,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new(bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut stdin = child.stdin.take().expect("piped");
    if let Some(text) = input {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}
