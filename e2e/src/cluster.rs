//! A real Kubernetes control plane on loopback: etcd (Debian's `etcd-server`),
//! kube-apiserver with RBAC and service-account tokens, kube-controller-manager (garbage
//! collector, Deployment and ReplicaSet controllers; no node lifecycle, no cloud) and
//! kube-scheduler. Certificates are made with `openssl` (X.509 v3, which rustls requires).
//!
//! What is not there: a kubelet (see [`crate::kubelet`]), kube-proxy (see
//! [`crate::proxy`]), a CNI. Service cluster IPs are allocated but nothing routes them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the control-plane binaries are: `$BALLAST_K8S_BIN`, else
/// `~/.cache/ballast-k8s/bin`. `None` (with the reason) when kube-apiserver,
/// kube-controller-manager, kube-scheduler, kubectl or etcd is missing.
pub fn binaries() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("BALLAST_K8S_BIN") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
            PathBuf::from(home).join(".cache/ballast-k8s/bin")
        }
    };
    for b in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
    ] {
        if !dir.join(b).is_file() {
            return Err(format!(
                "no {} (set BALLAST_K8S_BIN or run e2e/k8s.sh; see docs/e2e.md)",
                dir.join(b).display()
            ));
        }
    }
    if which("etcd").is_none() {
        return Err("no etcd on PATH (Debian package etcd-server)".into());
    }
    if which("openssl").is_none() {
        return Err("no openssl on PATH".into());
    }
    Ok(dir)
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A running control plane; stopped (every process killed) when dropped.
pub struct ControlPlane {
    /// State: certificates, etcd data, logs, kubeconfigs.
    pub dir: PathBuf,
    /// The binaries.
    pub bin: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// A kubeconfig for user `admin` in `system:masters`.
    pub admin_kubeconfig: PathBuf,
    children: Vec<(String, Child)>,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for (_, c) in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Makes the certificate authority, the API server's serving certificate, the admin's
/// client certificate and the service-account key pair under `pki`.
fn certificates(pki: &Path) -> Result<(), String> {
    std::fs::create_dir_all(pki).map_err(|e| e.to_string())?;
    let o = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(pki));
    std::fs::write(
        pki.join("ca.ext"),
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign,digitalSignature\n",
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(
        pki.join("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n",
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(
        pki.join("client.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    .map_err(|e| e.to_string())?;
    // A key and a signing request for `name`, then its certificate: self-signed for the
    // CA, signed by the CA for the others, each with its v3 extensions.
    let issue = |name: &str, subject: &str, ext: &str| -> Result<(), String> {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
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
        args.extend(["-days", "7", "-extfile", ext, "-out", crt.as_str()]);
        o(&args)
    };
    issue("ca", "/CN=ballast-e2e-ca", "ca.ext")?;
    issue("apiserver", "/CN=kube-apiserver", "server.ext")?;
    issue("admin", "/O=system:masters/CN=admin", "client.ext")?;
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
    /// Starts etcd, the API server (waiting until it is ready), the controller manager and
    /// the scheduler, with state under `dir`.
    pub fn start(bin: &Path, dir: &Path) -> Result<ControlPlane, String> {
        let pki = dir.join("pki");
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        certificates(&pki)?;
        let log = |name: &str| {
            std::fs::File::create(logs.join(format!("{name}.log"))).map_err(|e| e.to_string())
        };
        let mut cp = ControlPlane {
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
            server: String::new(),
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            children: Vec::new(),
        };
        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let spawn = |cp: &mut ControlPlane, name: &str, cmd: &mut Command| -> Result<(), String> {
            let child = cmd
                .stdin(Stdio::null())
                .stdout(log(name)?)
                .stderr(log(name)?)
                .spawn()
                .map_err(|e| format!("{name}: {e}"))?;
            cp.children.push((name.to_string(), child));
            Ok(())
        };
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        spawn(
            &mut cp,
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
        let p = |f: &str| pki.join(f).display().to_string();
        spawn(
            &mut cp,
            "kube-apiserver",
            Command::new(bin.join("kube-apiserver"))
                .args(["--etcd-servers", &client_url])
                .args([
                    "--bind-address",
                    "127.0.0.1",
                    "--advertise-address",
                    "127.0.0.1",
                ])
                .args(["--secure-port", &api_port.to_string()])
                .args(["--tls-cert-file", &p("apiserver.crt")])
                .args(["--tls-private-key-file", &p("apiserver.key")])
                .args(["--client-ca-file", &p("ca.crt")])
                .args(["--authorization-mode", "Node,RBAC"])
                .args(["--service-account-issuer", "https://kubernetes.default.svc"])
                .args(["--api-audiences", "https://kubernetes.default.svc"])
                .args(["--service-account-key-file", &p("sa.pub")])
                .args(["--service-account-signing-key-file", &p("sa.key")])
                .args(["--service-cluster-ip-range", "10.96.0.0/16"])
                .args(["--profiling=false"]),
        )?;
        cp.server = format!("https://127.0.0.1:{api_port}");
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
        spawn(
            &mut cp,
            "kube-controller-manager",
            Command::new(bin.join("kube-controller-manager"))
                .args(["--kubeconfig", &kc, "--authentication-kubeconfig", &kc])
                .args(["--authorization-kubeconfig", &kc, "--leader-elect=false"])
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &free_port().to_string()])
                .args(["--service-account-private-key-file", &p("sa.key")])
                .args(["--root-ca-file", &p("ca.crt")])
                .args(["--use-service-account-credentials=false"])
                .args([
                    "--controllers",
                    "*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service,-route",
                ]),
        )?;
        spawn(
            &mut cp,
            "kube-scheduler",
            Command::new(bin.join("kube-scheduler"))
                .args(["--kubeconfig", &kc, "--authentication-kubeconfig", &kc])
                .args(["--authorization-kubeconfig", &kc, "--leader-elect=false"])
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &free_port().to_string()]),
        )?;
        Ok(cp)
    }

    /// `kubectl` with the admin kubeconfig (or `kubeconfig`), its output or its error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_as(&self.admin_kubeconfig, args)
    }

    /// `kubectl` with `kubeconfig`.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
        self.kubectl_with(kubeconfig, args, None)
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<String, String> {
        self.kubectl_with(&self.admin_kubeconfig, &["apply", "-f", "-"], Some(yaml))
    }

    /// `kubectl ARGS` with `input` on its stdin: its stdout, or its stderr as the error.
    fn kubectl_with(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String, String> {
        kubectl_run(&self.bin, kubeconfig, args, input)
    }

    /// A kubeconfig (written under the state dir) that authenticates as ServiceAccount
    /// `namespace/name` with a fresh token.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, String> {
        self.credentials().kubeconfig(namespace, name)
    }

    /// What the process kubelet needs to give pods their ServiceAccount's credentials.
    pub fn credentials(&self) -> Credentials {
        Credentials {
            bin: self.bin.clone(),
            admin_kubeconfig: self.admin_kubeconfig.clone(),
            server: self.server.clone(),
            dir: self.dir.clone(),
        }
    }

    /// A kube client with the admin credentials.
    pub async fn client(&self) -> Result<kube::Client, String> {
        let kc = kube::config::Kubeconfig::read_from(&self.admin_kubeconfig)
            .map_err(|e| e.to_string())?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| e.to_string())?;
        kube::Client::try_from(config).map_err(|e| e.to_string())
    }

    /// The last lines of a component's log, for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("logs").join(format!("{name}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
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

/// Makes kubeconfigs that authenticate as a ServiceAccount, as a kubelet mounts a
/// ServiceAccount token into a pod. Cheap to clone; owns no process.
#[derive(Debug, Clone)]
pub struct Credentials {
    bin: PathBuf,
    admin_kubeconfig: PathBuf,
    server: String,
    dir: PathBuf,
}

impl Credentials {
    /// A kubeconfig (written under the state dir) for ServiceAccount `namespace/name`
    /// with a fresh token from the TokenRequest API.
    pub fn kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf, String> {
        let token = kubectl_run(
            &self.bin,
            &self.admin_kubeconfig,
            &["create", "token", name, "-n", namespace, "--duration", "6h"],
            None,
        )?;
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
}
