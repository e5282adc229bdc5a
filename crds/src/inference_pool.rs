//! The Gateway API Inference Extension's `InferencePool` (`inference.networking.k8s.io/v1`):
//! the fields Ballast writes (the operator, for a service with `spec.gateway.enabled`) and
//! reads (`ballast gateway --pool`). The CRD is the extension's, not Ballast's: clusters
//! install it with their gateway; the tests use a vendored copy
//! (`e2e/gie/inferencepools.yaml`, with its version and source).

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// A set of model-server pods and the endpoint picker a gateway asks which of them gets
/// each request.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
    kind = "InferencePool",
    plural = "inferencepools",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// The pool's pods: those whose labels hold every one of these.
    pub selector: PoolSelector,
    /// The ports of each pod that serve requests; each pod and port is one endpoint.
    pub target_ports: Vec<Port>,
    /// `http` (HTTP/1.1, the default) or `kubernetes.io/h2c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    /// The endpoint picker's Service.
    pub endpoint_picker_ref: EndpointPickerRef,
}

/// A pool's label selector (equality only).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PoolSelector {
    /// Labels every pod of the pool carries.
    pub match_labels: BTreeMap<String, String>,
}

impl PoolSelector {
    /// As a label selector string, `key=value,…` in key order.
    pub fn to_selector_string(&self) -> String {
        self.match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A port by number.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port {
    /// 1..65535.
    pub number: i32,
}

/// Where the gateway finds the endpoint picker.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerRef {
    /// The API group of the referent; `""` (core) for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Its kind; `Service` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Its name.
    pub name: String,
    /// The Service's port (not the target port) of the picker's ext_proc gRPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    /// `FailClose` (the default) or `FailOpen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<String>,
}

/// The plural resource name and group, as discovery and RBAC name them.
pub const RESOURCE: &str = "inferencepools.inference.networking.k8s.io";
/// The group and version Ballast speaks.
pub const API_VERSION: &str = "inference.networking.k8s.io/v1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_reads_as_the_extension_writes_it() {
        let pool: InferencePool = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": "InferencePool",
            "metadata": {"name": "chat", "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm", "tier": "a"}},
                "targetPorts": [{"number": 8000}, {"number": 8001}],
                "endpointPickerRef": {"name": "chat-epp", "port": {"number": 9002}},
            },
            "status": {"parents": []},
        }))
        .unwrap();
        assert_eq!(pool.spec.selector.to_selector_string(), "app=vllm,tier=a");
        assert_eq!(
            pool.spec.target_ports,
            [Port { number: 8000 }, Port { number: 8001 }]
        );
        assert_eq!(pool.spec.endpoint_picker_ref.failure_mode, None);
    }
}
