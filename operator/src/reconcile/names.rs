//! The names the operator writes into the cluster and reads back: its field manager, the
//! pod condition of its readiness gate, the deletion-cost annotation, the ServiceMonitor
//! resource. Shared by the steps, so it sits below them and imports none of them.

use kube::core::{ApiResource, GroupVersionKind};

/// The field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "ballast-operator";

/// The pod condition the operator sets to take a pod out of its Service's rotation (False)
/// or keep it in (True). Pods carry it as a readiness gate, so a pod is Ready (and an
/// endpoint) only while it is True.
pub const ACCEPTING_CONDITION: &str = "ballast.dev/accepting";

/// The annotation a Deployment reads to choose which pods a scale-down removes first
/// (lowest cost first).
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The Prometheus Operator's API group and version that serve ServiceMonitors.
pub const SERVICE_MONITOR_API: &str = "monitoring.coreos.com/v1";

/// The ServiceMonitor resource of the Prometheus Operator.
pub fn service_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    )
}

/// The Gateway API Inference Extension's API group and version of InferencePools.
pub const INFERENCE_POOL_API: &str = ballast_crds::inference_pool::API_VERSION;

/// The InferencePool resource (v1).
pub fn inference_pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool"),
        "inferencepools",
    )
}

/// The label selector of what the operator owns (`app.kubernetes.io/managed-by`), which
/// its Services, PDBs, ServiceMonitors and engine pods carry: the caches hold only those.
pub fn owned_selector() -> String {
    format!("{}={}", crate::labels::MANAGED_BY, crate::labels::OPERATOR)
}

/// The control-token Secret's key, and the file name engines read it from.
pub const TOKEN_KEY: &str = "token";

/// The name of a service's token Secret.
pub fn secret_name(service: &str) -> String {
    format!("{service}-control-token")
}

/// The variables `ballast engine --control-tls-cert` and `--control-tls-key` read.
pub const CONTROL_TLS_CERT_ENV: &str = "BALLAST_CONTROL_TLS_CERT";
/// See [`CONTROL_TLS_CERT_ENV`].
pub const CONTROL_TLS_KEY_ENV: &str = "BALLAST_CONTROL_TLS_KEY";

/// The name of a service's gateway picker: its Deployment, Service, PodDisruptionBudget,
/// ServiceAccount, Role and RoleBinding.
pub fn picker_name(service: &str) -> String {
    format!("{service}-epp")
}
