//! Starts the e2e cluster (control plane and node) and keeps it up until Enter is pressed
//! or stdin closes, for trying things by hand:
//!
//! ```sh
//! cargo run -p ballast-e2e --example cluster -- /tmp/ballast-cluster
//! kubectl --kubeconfig /tmp/ballast-cluster/admin.kubeconfig get nodes -o wide
//! ```
//!
//! Needs root and what `ballast_e2e::cluster::binaries` lists.

fn main() {
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ballast-cluster"));
    let bin = ballast_e2e::cluster::binaries().unwrap_or_else(|e| {
        eprintln!("cannot start a cluster here: {e}");
        std::process::exit(1)
    });
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = ballast_e2e::Cluster::start(&bin, &dir).unwrap_or_else(|e| {
        eprintln!("the cluster did not start: {e}");
        std::process::exit(1)
    });
    println!(
        "cluster up: kubectl --kubeconfig {} get nodes\ncontainerd: {}\npress Enter to stop",
        cluster.cp.admin_kubeconfig.display(),
        cluster.node.socket.display()
    );
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(cluster);
}
