//! The end-to-end harness: a real Kubernetes cluster on one machine.
//!
//! - [`cluster`]: etcd, kube-apiserver, kube-controller-manager and kube-scheduler (v1.28
//!   binaries from `../shared/k8s/install.sh`), with certificates and kubeconfigs;
//! - [`node`]: the pod network (a bridge), containerd with runc, the kubelet and
//!   kube-proxy: a real node that runs pods from OCI images;
//! - [`image`]: the project's image built from its Dockerfile with buildah, on a runtime
//!   base assembled from Debian packages;
//! - [`process`]: finding, running, starting and stopping the programs all of it is made of.
//!
//! [`Cluster::start`] starts all of it. Nothing listens beyond loopback and the bridge,
//! and nothing is sent beyond this machine: pod and Service addresses exist only inside
//! it. Where a program is missing, [`cluster::binaries`] says which and the suite skips.

pub mod cluster;
pub mod image;
pub mod node;
pub mod process;

use std::path::Path;

/// A control plane and one node on its pod network; everything stops when dropped (the
/// node first, then the control plane, then the bridge).
pub struct Cluster {
    /// The node.
    pub node: node::Node,
    /// The control plane.
    pub cp: cluster::ControlPlane,
    /// The pod network.
    pub network: node::PodNetwork,
}

impl Cluster {
    /// Creates the pod network, then starts the control plane on its gateway and the node,
    /// with state under `dir` and the Kubernetes binaries in `bin` ([`cluster::binaries`]).
    pub fn start(bin: &Path, dir: &Path) -> Result<Cluster, String> {
        let network = node::PodNetwork::create()?;
        let cp = cluster::ControlPlane::start(bin, dir, network.gateway)?;
        let node = node::Node::start(&cp, &network)?;
        Ok(Cluster { node, cp, network })
    }
}
