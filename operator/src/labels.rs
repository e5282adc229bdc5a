//! The labels every runtime puts on a service's replicas, and the selector derived from
//! them (`status.selector`, the scale subresource's `labelSelectorPath`, the Deployment's and
//! Service's selector, the PodDisruptionBudget's).

use std::collections::BTreeMap;

/// `app.kubernetes.io/name`: what the replicas are.
pub const NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance`: which InferenceService they belong to.
pub const INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/managed-by`: who writes them.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// `app.kubernetes.io/component`.
pub const COMPONENT: &str = "app.kubernetes.io/component";

/// The label a leading operator puts on its own pod when it serves the metrics APIs
/// (value `true`): the chart's metrics-API Service selects it, so that only the leader,
/// which alone has values, is asked.
pub const METRICS_API_LEADER: &str = "ballast.dev/metrics-api-leader";

/// The value of [`NAME`] on engine replicas.
pub const ENGINE: &str = "ballast-engine";
/// The value of [`MANAGED_BY`] on everything the operator owns.
pub const OPERATOR: &str = "ballast-operator";

/// The value of [`NAME`] on a service's gateway picker pods (`ballast gateway --pool`).
pub const PICKER: &str = "ballast-gateway";

/// The labels that select one service's gateway picker pods (never its engine pods).
pub fn picker_selector_labels(service: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME.to_string(), PICKER.to_string()),
        (INSTANCE.to_string(), service.to_string()),
    ])
}

/// Every label on the picker's objects: its selector labels plus `managed-by` and
/// `component: gateway`.
pub fn picker_labels(service: &str) -> BTreeMap<String, String> {
    let mut l = picker_selector_labels(service);
    l.insert(MANAGED_BY.to_string(), OPERATOR.to_string());
    l.insert(COMPONENT.to_string(), "gateway".to_string());
    l
}

/// The labels that select one service's replicas (and nothing else).
pub fn selector_labels(service: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME.to_string(), ENGINE.to_string()),
        (INSTANCE.to_string(), service.to_string()),
    ])
}

/// Every label on the objects owned for `service`: the selector labels plus
/// `managed-by` and `component`.
pub fn labels(service: &str) -> BTreeMap<String, String> {
    let mut l = selector_labels(service);
    l.insert(MANAGED_BY.to_string(), OPERATOR.to_string());
    l.insert(COMPONENT.to_string(), "inference".to_string());
    l
}

/// The selector as a string, `key=value,key=value` in key order (`status.selector`).
pub fn selector(service: &str) -> String {
    selector_labels(service)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_is_a_subset_of_the_labels() {
        let all = labels("chat");
        for (k, v) in selector_labels("chat") {
            assert_eq!(all.get(&k), Some(&v));
        }
        assert_eq!(
            selector("chat"),
            "app.kubernetes.io/instance=chat,app.kubernetes.io/name=ballast-engine"
        );
    }
}
