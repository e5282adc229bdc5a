//! The end-to-end harness for a real Kubernetes control plane on one machine.
//!
//! - [`cluster`]: etcd, kube-apiserver (RBAC on), kube-controller-manager and
//!   kube-scheduler from binaries built from a Kubernetes source snapshot, on loopback with
//!   free ports, and clients for them;
//! - [`kubelet`]: a *process kubelet* that registers a Node and runs the pods bound to it
//!   as local processes on loopback addresses of their own (127.0.0.N), with probes,
//!   readiness gates, restarts and graceful deletion;
//! - [`proxy`]: what kube-proxy would do for one Service: send each request to one of the
//!   pods its selector matches whose Ready condition is True, and nothing more (no retry).
//!
//! Nothing here contacts anything but loopback addresses. Where the binaries are missing,
//! [`cluster::binaries`] says so and the suite skips.

pub mod cluster;
pub mod image;
pub mod kubelet;
pub mod proxy;
