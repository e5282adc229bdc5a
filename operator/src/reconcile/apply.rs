//! Step 6: make the cluster hold what `build` produced, writing nothing when it already
//! does.
//!
//! Each object is applied with server-side apply under the operator's field manager, but
//! only when the live object does not already contain every field the operator sets
//! ([`contains`]): an unchanged spec, or an operator restart, produces no write at all.
//! Pods get two small patches: the accepting readiness-gate condition (rotation) and, before
//! a scale-down, a deletion cost so the Deployment removes the least-loaded pods first.

use std::fmt::Debug;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::build::{ACCEPTING_CONDITION, DELETION_COST};

/// The field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "ballast-operator";

/// Whether `live` holds every field of `desired` with the same value: objects key by key
/// (extra keys in `live` are fields the API server defaulted or others own), arrays of the
/// same length element by element, scalars equal. `null` in `desired` means "not set".
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (_, Value::Null) => true,
        (Value::Object(l), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| dv.is_null() || l.get(k).is_some_and(|lv| contains(lv, dv))),
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(lv, dv)| contains(lv, dv))
        }
        (Value::Number(l), Value::Number(d)) => l.as_f64() == d.as_f64(),
        (l, d) => l == d,
    }
}

/// Applies `desired` as `name` unless the live object already contains it. True when it
/// wrote.
pub async fn apply<K>(api: &Api<K>, name: &str, desired: &K) -> Result<bool, kube::Error>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    let want = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    if let Some(live) = api.get_opt(name).await? {
        let live = serde_json::to_value(&live).map_err(kube::Error::SerdeError)?;
        if contains(&live, &want) {
            return Ok(false);
        }
    }
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&want),
    )
    .await?;
    Ok(true)
}

/// The ServiceMonitor resource of the Prometheus Operator.
pub fn service_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    )
}

/// Whether the ServiceMonitor CRD is installed (its API group serves the resource).
pub async fn service_monitor_crd(client: &Client) -> Result<bool, kube::Error> {
    match client
        .list_api_group_resources("monitoring.coreos.com/v1")
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "servicemonitors")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Applies the ServiceMonitor when one is wanted, deletes one the operator owns when not.
/// True when it wrote.
pub async fn service_monitor(
    client: &Client,
    namespace: &str,
    name: &str,
    desired: Option<&Value>,
    installed: bool,
) -> Result<bool, kube::Error> {
    if !installed {
        return Ok(false);
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &service_monitor_resource());
    let live = api.get_opt(name).await?;
    match (desired, live) {
        (Some(want), live) => {
            if let Some(live) = live {
                let live = serde_json::to_value(&live).map_err(kube::Error::SerdeError)?;
                if contains(&live, want) {
                    return Ok(false);
                }
            }
            api.patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(want),
            )
            .await?;
            Ok(true)
        }
        (None, Some(live)) if managed_by_us(&live.metadata) => {
            api.delete(name, &Default::default()).await?;
            Ok(true)
        }
        (None, _) => Ok(false),
    }
}

fn managed_by_us(meta: &kube::core::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(crate::labels::MANAGED_BY))
        .is_some_and(|v| v == crate::labels::OPERATOR)
}

/// Sets a pod's accepting condition (its readiness gate): True keeps or puts it in its
/// Service's rotation, False takes it out.
pub async fn set_accepting(
    pods: &Api<Pod>,
    pod: &str,
    accepting: bool,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let patch = json!({"status": {"conditions": [{
        "type": ACCEPTING_CONDITION,
        "status": if accepting { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastTransitionTime": Timestamp::now().to_string(),
    }]}});
    pods.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}

/// Sets a pod's deletion cost (lower goes first on scale-down).
pub async fn set_deletion_cost(pods: &Api<Pod>, pod: &str, cost: i32) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {DELETION_COST: cost.to_string()}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment_ignores_what_the_server_adds_and_sees_what_changed() {
        let desired = json!({
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "engine", "ports": [{"containerPort": 8000, "name": "http"}]}
            ]}}},
            "status": null,
        });
        let live = json!({
            "metadata": {"resourceVersion": "7", "managedFields": []},
            "spec": {"replicas": 2, "revisionHistoryLimit": 10, "template": {"spec": {
                "dnsPolicy": "ClusterFirst",
                "containers": [{"name": "engine", "imagePullPolicy": "IfNotPresent",
                    "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}]}]
            }}},
            "status": {"replicas": 2},
        });
        assert!(
            contains(&live, &desired),
            "defaults and status are not changes"
        );
        let mut scaled = desired.clone();
        scaled["spec"]["replicas"] = json!(3);
        assert!(!contains(&live, &scaled));
        let mut more = live.clone();
        more["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar"}));
        assert!(
            !contains(&more, &desired),
            "a list of another length differs"
        );
        assert!(
            contains(&json!({"a": 1.0}), &json!({"a": 1})),
            "numbers by value"
        );
        assert!(
            !contains(&json!({}), &json!({"a": "x"})),
            "a missing field differs"
        );
    }
}
