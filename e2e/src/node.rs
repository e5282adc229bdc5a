//! A real Kubernetes node on this machine: containerd (with runc), a CNI bridge, the
//! kubelet and kube-proxy, joined to a [`ControlPlane`]. Pods run from OCI images in
//! containers of their own, with IPs on the bridge; Services' cluster IPs are routed by
//! kube-proxy's iptables rules and EndpointSlices are filled by the control plane, as in any
//! cluster.
//!
//! What this machine needs, each handled here:
//! - cgroups are v1 controllers with a v2 mount ("hybrid"): runc with the cgroupfs driver
//!   (containerd's default runtime; the kubelet's `cgroupDriver: cgroupfs`);
//! - root lacks `CAP_SYS_RESOURCE`, so nothing may lower an oom_score_adj: containerd's
//!   `restrict_oom_score_adj` clamps what the kubelet asks;
//! - no image registry can be reached: the sandbox image is built from the `pause`
//!   program beside the Kubernetes binaries, and every other image is loaded with
//!   [`Node::load_image`] and used with `imagePullPolicy: Never` or `IfNotPresent`;
//! - pod → Service → pod traffic over the bridge needs `net.ipv4.ip_forward` and
//!   `net.bridge.bridge-nf-call-iptables`.
//!
//! Only one node runs on a machine at a time: the bridge and the pod network are fixed.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::cluster::{CLIENT_EXT, ControlPlane, SERVICE_RANGE, issue, kubeconfig};
use crate::process::{free_port, run, spawn_logged, stop_child};

/// The node's name.
pub const NODE_NAME: &str = "e2e-node";

/// The bridge the pods' interfaces join, with the pod network's gateway address.
const BRIDGE: &str = "ballast-e2e";

/// The sandbox image the kubelet of v1.28 asks for.
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.9";

/// The pod network: a Linux bridge with the gateway address 10.244.0.1/24, on which
/// every pod gets an address of 10.244.0.0/24. Deleted (with every pod interface on it)
/// when dropped.
pub struct PodNetwork {
    /// The bridge's address: the pods' default gateway, and where the API server listens.
    pub gateway: Ipv4Addr,
    /// The pods' subnet, `10.244.0.0/24`.
    pub subnet: &'static str,
}

impl PodNetwork {
    /// Creates the bridge (or takes over the one a killed run left), gives it the gateway
    /// address, routes [`SERVICE_RANGE`] onto it and turns on forwarding and iptables for
    /// bridged traffic.
    pub fn create() -> Result<PodNetwork, String> {
        let ip = |args: &[&str]| run(Command::new("ip").args(args));
        if ip(&["link", "show", BRIDGE]).is_err() {
            ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        }
        let net = PodNetwork {
            gateway: Ipv4Addr::new(10, 244, 0, 1),
            subnet: "10.244.0.0/24",
        };
        if !ip(&["-4", "addr", "show", BRIDGE])?.contains(&format!("inet {}/", net.gateway)) {
            ip(&["addr", "add", &format!("{}/24", net.gateway), "dev", BRIDGE])?;
        }
        ip(&["link", "set", BRIDGE, "up"])?;
        // Untranslated Service addresses stay on the bridge (the route goes with the link).
        ip(&["route", "replace", SERVICE_RANGE, "dev", BRIDGE])?;
        let probe = SERVICE_RANGE.replace("0.0/16", "0.10");
        let route = ip(&["route", "get", &probe])?;
        if !route.contains(&format!("dev {BRIDGE}")) {
            return Err(format!(
                "{SERVICE_RANGE} is not routed onto {BRIDGE}: `ip route get {probe}` says {route}"
            ));
        }
        for (key, value) in [
            ("net/ipv4/ip_forward", "1"),
            ("net/bridge/bridge-nf-call-iptables", "1"),
        ] {
            std::fs::write(Path::new("/proc/sys").join(key), value)
                .map_err(|e| format!("sysctl {key}={value}: {e}"))?;
        }
        Ok(net)
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        let _ = run(Command::new("ip").args(["link", "del", BRIDGE]));
    }
}

/// A running node; stopped when dropped: kubelet and kube-proxy, every container,
/// containerd, kube-proxy's iptables rules, and the mounts left under its folder.
pub struct Node {
    /// The node's state folder (containerd's root and state, the kubelet's root, CNI).
    pub dir: PathBuf,
    /// containerd's socket.
    pub socket: PathBuf,
    bin: PathBuf,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    kube_proxy: Option<Child>,
}

impl Node {
    /// Starts containerd, the kubelet (as [`NODE_NAME`], with a client certificate for
    /// `system:node:e2e-node`) and kube-proxy, and waits until the Node is Ready and
    /// untainted. State goes under `cp.dir/node`, logs beside the control plane's.
    pub fn start(cp: &ControlPlane, network: &PodNetwork) -> Result<Node, String> {
        let dir = cp.dir.join("node");
        let logs = cp.dir.join("logs");
        let pki = cp.dir.join("pki");
        std::fs::create_dir_all(dir.join("cni")).map_err(|e| e.to_string())?;
        let state = dir.join("containerd/state");
        let mut node = Node {
            socket: state.join("containerd.sock"),
            dir: dir.clone(),
            bin: cp.bin.clone(),
            containerd: None,
            kubelet: None,
            kube_proxy: None,
        };

        // containerd: its state under DIR, runc with cgroupfs, the CNI bridge, network
        // namespaces under its state (so they go with it), the local pause image.
        let defaults = run(Command::new("containerd").args(["config", "default"]))?;
        let config = containerd_config(&defaults, &dir)?;
        std::fs::write(dir.join("containerd.toml"), config).map_err(|e| e.to_string())?;
        std::fs::write(
            dir.join("cni/10-bridge.conflist"),
            format!(
                r#"{{"cniVersion": "0.4.0", "name": "ballast-e2e", "plugins": [
  {{"type": "bridge", "bridge": "{BRIDGE}", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{}", "gateway": "{}"}}]],
            "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{}"}}}},
  {{"type": "portmap", "capabilities": {{"portMappings": true}}}},
  {{"type": "loopback"}}]}}
"#,
                network.subnet,
                network.gateway,
                dir.join("cni/ipam").display()
            ),
        )
        .map_err(|e| e.to_string())?;
        node.containerd = Some(spawn_logged(
            &logs,
            "containerd",
            Command::new("containerd")
                .arg("--config")
                .arg(dir.join("containerd.toml")),
        )?);
        wait("containerd's socket", Duration::from_secs(20), || {
            node.socket.exists().then_some(())
        })?;
        node.pause_image()?;

        // The kubelet, as system:node:e2e-node (the Node authorizer's user).
        issue(
            &pki,
            "node",
            &format!("/O=system:nodes/CN=system:node:{NODE_NAME}"),
            CLIENT_EXT,
        )?;
        let p = |f: &str| pki.join(f).display().to_string();
        let node_kc = dir.join("node.kubeconfig");
        kubeconfig(
            &node_kc,
            &cp.server,
            &pki,
            &format!(
                "{{client-certificate: \"{}\", client-key: \"{}\"}}",
                p("node.crt"),
                p("node.key")
            ),
        )
        .map_err(|e| e.to_string())?;
        // Eviction and image GC are off: this machine's disk and memory are the tests' to
        // share, and a node that evicts under a full disk would fail them for no reason of
        // theirs.
        std::fs::write(
            dir.join("kubelet.yaml"),
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
address: {gateway}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
podCIDR: {subnet}
resolvConf: \"\"
serializeImagePulls: false
enforceNodeAllocatable: []
evictionHard: {{}}
imageGCHighThresholdPercent: 100
localStorageCapacityIsolation: false
syncFrequency: 10s
",
                socket = node.socket.display(),
                ca = p("ca.crt"),
                gateway = network.gateway,
                healthz = free_port(),
                subnet = network.subnet,
            ),
        )
        .map_err(|e| e.to_string())?;
        node.kubelet = Some(spawn_logged(
            &logs,
            "kubelet",
            Command::new(cp.bin.join("kubelet"))
                .arg("--config")
                .arg(dir.join("kubelet.yaml"))
                .arg("--kubeconfig")
                .arg(&node_kc)
                .args(["--hostname-override", NODE_NAME])
                .args(["--node-ip", &network.gateway.to_string()])
                .arg("--root-dir")
                .arg(dir.join("kubelet")),
        )?);

        // kube-proxy in iptables mode; rules a killed run left behind go first.
        let _ = run(Command::new(cp.bin.join("kube-proxy")).arg("--cleanup"));
        node.kube_proxy = Some(spawn_logged(
            &logs,
            "kube-proxy",
            Command::new(cp.bin.join("kube-proxy"))
                .arg("--kubeconfig")
                .arg(&cp.admin_kubeconfig)
                .args(["--hostname-override", NODE_NAME])
                .args(["--cluster-cidr", network.subnet])
                .args(["--proxy-mode", "iptables", "--conntrack-max-per-core", "0"])
                .args(["--bind-address", "127.0.0.1"])
                .args([
                    "--healthz-bind-address",
                    &format!("127.0.0.1:{}", free_port()),
                ])
                .args([
                    "--metrics-bind-address",
                    &format!("127.0.0.1:{}", free_port()),
                ]),
        )?);

        // Ready, and schedulable: the node lifecycle controller lifts the not-ready taint.
        wait(
            "the node Ready and untainted",
            Duration::from_secs(90),
            || {
                let ready = cp
                    .kubectl(&[
                        "get",
                        "node",
                        NODE_NAME,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.spec.taints}",
                    ])
                    .ok()?;
                (ready.trim() == "True").then_some(())
            },
        )
        .map_err(|e| {
            format!(
                "{e}; kubelet log:\n{}",
                crate::cluster::log_tail(&logs.join("kubelet.log"), 30)
            )
        })?;
        Ok(node)
    }

    /// `ctr` against this node's containerd, in the kubelet's namespace.
    fn ctr(&self, args: &[&str]) -> Result<String, String> {
        run(Command::new("ctr")
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args))
    }

    /// The sandbox image: a one-layer image of the static `pause` program, committed to
    /// buildah's store once and loaded into this node's containerd.
    fn pause_image(&self) -> Result<(), String> {
        let present = run(Command::new("buildah").args(["images", "-q", PAUSE_IMAGE]))
            .is_ok_and(|out| !out.trim().is_empty());
        if !present {
            let c = run(Command::new("buildah").args(["from", "scratch"]))?;
            let c = c.trim();
            let pause = self.bin.join("pause").display().to_string();
            let steps: [&[&str]; 4] = [
                &["copy", c, &pause, "/pause"],
                &[
                    "config",
                    "--entrypoint",
                    "[\"/pause\"]",
                    "--user",
                    "65535:65535",
                    c,
                ],
                &["commit", "-q", c, PAUSE_IMAGE],
                &["rm", c],
            ];
            for args in steps {
                run(Command::new("buildah").args(args))?;
            }
        }
        self.load_image(PAUSE_IMAGE)
    }

    /// Copies `reference` from buildah's local store into this node's containerd, where the
    /// kubelet finds it without pulling.
    pub fn load_image(&self, reference: &str) -> Result<(), String> {
        let archive = self.dir.join("image.tar");
        let _ = std::fs::remove_file(&archive);
        run(Command::new("buildah").args([
            "push",
            "-q",
            reference,
            &format!("oci-archive:{}:{reference}", archive.display()),
        ]))?;
        let loaded = self.ctr(&["images", "import", &archive.display().to_string()]);
        let _ = std::fs::remove_file(&archive);
        loaded.map(|_| ())
    }

    /// The host pid of the container whose status says `containerID` (`containerd://ID`).
    pub fn container_pid(&self, container_id: &str) -> Option<u32> {
        let id = container_id.strip_prefix("containerd://")?;
        self.ctr(&["tasks", "ls"]).ok()?.lines().find_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next()? == id).then(|| cols.next()?.parse().ok())?
        })
    }
}

/// containerd's default configuration with this node's paths, the sandbox image, the CNI
/// folders, network namespaces under its state, and the oom_score_adj clamp.
fn containerd_config(defaults: &str, dir: &Path) -> Result<String, String> {
    let root = dir.join("containerd/root").display().to_string();
    let state = dir.join("containerd/state").display().to_string();
    let cni = dir.join("cni").display().to_string();
    let mut out = String::with_capacity(defaults.len());
    let mut seen = 0;
    for line in defaults.lines() {
        let key = line.trim_start().split(" = ").next().unwrap_or_default();
        let indent = &line[..line.len() - line.trim_start().len()];
        let replaced = match key {
            "root" if indent.is_empty() => Some(format!("root = \"{root}\"")),
            "state" if indent.is_empty() => Some(format!("state = \"{state}\"")),
            "sandbox_image" => Some(format!("{indent}sandbox_image = \"{PAUSE_IMAGE}\"")),
            "bin_dir" => Some(format!("{indent}bin_dir = \"/usr/lib/cni\"")),
            "conf_dir" => Some(format!("{indent}conf_dir = \"{cni}\"")),
            "restrict_oom_score_adj" => Some(format!("{indent}restrict_oom_score_adj = true")),
            "netns_mounts_under_state_dir" => {
                Some(format!("{indent}netns_mounts_under_state_dir = true"))
            }
            _ => None,
        };
        match replaced {
            Some(l) => {
                seen += 1;
                out.push_str(&l);
            }
            None => out.push_str(&line.replace("/run/containerd", &state)),
        }
        out.push('\n');
    }
    if seen < 7 {
        return Err(format!(
            "containerd's default configuration has changed shape: {seen} of 7 settings found"
        ));
    }
    Ok(out)
}

/// Polls `f` every 200 ms until it returns `Some`, or fails naming `what`.
fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not in {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The kubelet first, so it restarts nothing that is stopped next.
        if let Some(c) = self.kubelet.as_mut() {
            stop_child(c, Duration::from_secs(5));
        }
        if let Some(c) = self.kube_proxy.as_mut() {
            stop_child(c, Duration::from_secs(5));
        }
        // Every container's processes, then the tasks, containers and containerd.
        if let Ok(tasks) = self.ctr(&["tasks", "ls"]) {
            for pid in tasks
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<i32>().ok())
            {
                // SAFETY: kill(2) with a pid containerd reported; at worst ESRCH.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(500));
            for id in tasks
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().next())
            {
                let _ = self.ctr(&["tasks", "delete", "-f", id]);
            }
        }
        if let Ok(containers) = self.ctr(&["containers", "ls", "-q"]) {
            for id in containers.lines() {
                let _ = self.ctr(&["containers", "rm", id]);
            }
        }
        if let Some(c) = self.containerd.as_mut() {
            stop_child(c, Duration::from_secs(5));
        }
        kill_shims(&self.dir);
        let _ = run(Command::new(self.bin.join("kube-proxy")).arg("--cleanup"));
        remove_kube_chains();
        unmount_under(&self.dir);
    }
}

/// Removes the iptables chains the kubelet and kube-proxy make and `kube-proxy --cleanup`
/// leaves (canaries, the masquerade mark, the firewall), where nothing refers to them.
fn remove_kube_chains() {
    for table in ["nat", "filter", "mangle"] {
        let Ok(rules) = run(Command::new("iptables").args(["-t", table, "-S"])) else {
            continue;
        };
        // Jumps from the built-in chains first, then the chains themselves.
        for rule in rules
            .lines()
            .filter_map(|l| l.strip_prefix("-A "))
            .filter(|r| !r.starts_with("KUBE-") && r.contains(" -j KUBE-"))
        {
            let _ = run(Command::new("iptables")
                .args(["-t", table, "-D"])
                .args(split_rule(rule)));
        }
        for chain in rules
            .lines()
            .filter_map(|l| l.strip_prefix("-N "))
            .filter(|c| c.starts_with("KUBE-"))
        {
            let _ = run(Command::new("iptables").args(["-t", table, "-F", chain]));
            let _ = run(Command::new("iptables").args(["-t", table, "-X", chain]));
        }
    }
}

/// Kills containerd's shims for this node (their command line names its state folder):
/// they outlive containerd by design.
fn kill_shims(dir: &Path) {
    let needle = dir.display().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("containerd-shim") && cmd.contains(&needle) {
            // SAFETY: kill(2) on a pid just read from /proc; at worst ESRCH.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The words of a rule as `iptables -S` prints it, where a quoted comment is one word.
fn split_rule(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let (mut word, mut quoted) = (String::new(), false);
    for ch in rule.chars() {
        match ch {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Unmounts (lazily, deepest first) everything mounted under `dir`: the kubelet's volumes,
/// containers' root filesystems, network namespaces.
fn unmount_under(dir: &Path) {
    let prefix = dir.display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    for p in points {
        let _ = run(Command::new("umount").args(["-l", p]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_comment_is_one_word() {
        assert_eq!(
            split_rule(
                r#"PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#
            ),
            [
                "PREROUTING",
                "-m",
                "comment",
                "--comment",
                "kubernetes service portals",
                "-j",
                "KUBE-SERVICES"
            ]
        );
    }

    #[test]
    fn containerd_gets_the_nodes_paths_or_says_its_defaults_changed() {
        let defaults = r#"root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
    netns_mounts_under_state_dir = false
    restrict_oom_score_adj = false
    sandbox_image = "registry.k8s.io/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/cni/net.d"
"#;
        let dir = Path::new("/tmp/n");
        let c = containerd_config(defaults, dir).unwrap();
        for want in [
            "root = \"/tmp/n/containerd/root\"",
            "state = \"/tmp/n/containerd/state\"",
            "  address = \"/tmp/n/containerd/state/containerd.sock\"",
            "    netns_mounts_under_state_dir = true",
            "    restrict_oom_score_adj = true",
            "    sandbox_image = \"registry.k8s.io/pause:3.9\"",
            "      bin_dir = \"/usr/lib/cni\"",
            "      conf_dir = \"/tmp/n/cni\"",
        ] {
            assert!(c.lines().any(|l| l == want), "{want} in\n{c}");
        }
        let err = containerd_config("root = \"/x\"\n", dir).unwrap_err();
        assert!(err.contains("1 of 7"), "{err}");
    }
}
