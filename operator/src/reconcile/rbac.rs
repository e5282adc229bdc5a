//! Every Kubernetes API call `ballast operator` makes, as RBAC needs to grant it: the
//! operator's declared API access. The Helm chart's roles (from
//! `charts/ballast/files/operator-*-rules.yaml`) must grant exactly this list;
//! `charts/helm/tests/it/rbac.rs` fails on anything missing or extra, in both of the chart's
//! modes. Change this list in the same commit as the call that needs it.
//!
//! What is granted where follows `--namespace`: without it the operator watches every
//! namespace and [`Scope::Watched`] is a ClusterRole; with it, a Role in that namespace,
//! and the operator holds no cluster-wide right but those the metrics APIs cannot do
//! without (reviews, and the `caBundle` of its own APIServices, by name).
//!
//! Where each verb comes from:
//! - `run.rs`: the Controller lists and watches InferenceServices (cluster-wide, or one
//!   namespace with `--namespace`); one watch each of Deployments, Services,
//!   PodDisruptionBudgets and pods feeds the reflector stores reconciles read
//!   (`cache.rs`), so a settled reconcile reads nothing from the API server; one watch
//!   of HorizontalPodAutoscalers tells when one targets an InferenceService whose
//!   built-in autoscaler is on (a `list` when its store has not synced);
//! - `cache.rs`: ServiceMonitors are watched into a store too once discovery finds their
//!   CRD; a store that has not synced within `STORE_SYNC_WAIT` (a watch that cannot list)
//!   is bypassed: the reconcile `get`s each object (a `list` for pods);
//! - `apply.rs`: server-side apply, which is `patch`, and also `create` when the object
//!   does not exist yet (Deployment, Service, PodDisruptionBudget, ServiceMonitor, and for
//!   `spec.gateway` the InferencePool and the picker's ServiceAccount, Role and
//!   RoleBinding, each watched into a store by `run.rs`); `delete` of a ServiceMonitor the
//!   operator owns when the spec stops asking for one, and of the gateway's objects when
//!   `spec.gateway` is turned off;
//!   a merge `patch` of a pod's deletion cost and a strategic `patch` of `pods/status`
//!   for the readiness gate;
//! - `token.rs`: each service's control-token Secret, read from a store fed by a `list`
//!   and `watch` of the Secrets carrying the operator's label (RBAC cannot narrow a list
//!   by label: the selector keeps every other Secret out of the operator's memory),
//!   `create` when it is missing, `update` (a `replace` carrying the resourceVersion read)
//!   when it rotates, and a `get` only when such a write met a conflict;
//! - `report.rs`: server-side apply (`patch`) of `inferenceservices/status`, only when
//!   the status changed;
//! - events (kube's `Recorder`): `create` of an `events.k8s.io` Event, `patch` of a
//!   repeated one (its series);
//! - `leader.rs`: `get`, `create` and `update` (a `replace` carrying the
//!   resourceVersion it read) of the Lease in the operator's own namespace.
//!
//! - `metrics_api/auth.rs` (only with `--metrics-api-port`): `create` of TokenReviews
//!   and SubjectAccessReviews, to authenticate bearer tokens and authorize every request
//!   as an aggregated API server does; `metrics_api/server.rs` watches (`list`, `watch`)
//!   the ConfigMap `kube-system/extension-apiserver-authentication`;
//! - `metrics_api/certs.rs` (only with `--metrics-api-cert-secret`): `get`, `create` and
//!   `update` of that Secret in the operator's namespace, `get` and a merge `patch` of the
//!   APIServices named by `--metrics-api-apiservices` (their `caBundle`);
//! - `run.rs` (only with `--metrics-api-port` or `--keda-port`): a merge `patch` of the
//!   operator's own pod (its leader label), in its own namespace.
//!
//! Not listed: `cache.rs` reads the discovery documents
//! `/apis/monitoring.coreos.com/v1` and `/apis/inference.networking.k8s.io/v1`, which every authenticated client may read
//! (the built-in `system:discovery` role).

/// Where a grant applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// The namespaces the operator watches: every namespace (a ClusterRole), or with
    /// `--namespace` that one (a Role there).
    Watched,
    /// The operator's own namespace only (a Role there): its leader-election Lease.
    OwnNamespace,
    /// Cluster-wide, and only when the metrics APIs are on (the chart's
    /// `metricsApi.enabled`): the reviews every aggregated API server makes, as the
    /// built-in ClusterRole `system:auth-delegator` grants them.
    MetricsApi,
    /// `kube-system/extension-apiserver-authentication` only, when the metrics APIs are
    /// on: granted by binding the built-in Role `extension-apiserver-authentication-reader`
    /// there, which allows exactly these verbs on exactly that ConfigMap.
    AuthConfigMap,
    /// Cluster-wide but only the APIServices the operator sets the `caBundle` of
    /// (`resourceNames`), when it keeps its own certificate.
    MetricsApiCaBundle,
    /// The operator's own namespace, when the metrics APIs or KEDA's scaler are on: the
    /// patch of its own pod's leader label, which their Services select (RBAC cannot name
    /// a pod whose name the ReplicaSet picks).
    LeaderLabel,
    /// The operator's namespace, only the Secret it keeps its certificate in
    /// (`resourceNames`; `create` cannot be limited by name), when it keeps its own
    /// certificate.
    MetricsApiCertSecret,
}

/// One resource the operator calls, with the verbs it uses on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiAccess {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Resource or `resource/subresource`, plural.
    pub resource: &'static str,
    /// The verbs, in the order the rules file lists them.
    pub verbs: &'static [&'static str],
    /// Cluster-wide or own namespace.
    pub scope: Scope,
}

const fn watched(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
) -> ApiAccess {
    ApiAccess {
        group,
        resource,
        verbs,
        scope: Scope::Watched,
    }
}

/// What the operator does with the kinds it owns outright.
const ALL: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

/// Every API call of `ballast operator` (see the module docs for where each is made).
pub const API_ACCESS: &[ApiAccess] = &[
    watched("ballast.dev", "inferenceservices", &["list", "watch"]),
    watched("ballast.dev", "inferenceservices/status", &["patch"]),
    watched("apps", "deployments", ALL),
    watched("", "services", ALL),
    watched("policy", "poddisruptionbudgets", ALL),
    watched("", "pods", &["list", "watch", "patch"]),
    watched("", "pods/status", &["patch"]),
    watched("events.k8s.io", "events", &["create", "patch"]),
    watched(
        "autoscaling",
        "horizontalpodautoscalers",
        &["list", "watch"],
    ),
    watched("", "secrets", &["get", "list", "watch", "create", "update"]),
    watched("monitoring.coreos.com", "servicemonitors", ALL),
    watched("inference.networking.k8s.io", "inferencepools", ALL),
    watched("", "serviceaccounts", ALL),
    watched("rbac.authorization.k8s.io", "roles", ALL),
    watched("rbac.authorization.k8s.io", "rolebindings", ALL),
    ApiAccess {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update"],
        scope: Scope::OwnNamespace,
    },
    ApiAccess {
        group: "authentication.k8s.io",
        resource: "tokenreviews",
        verbs: &["create"],
        scope: Scope::MetricsApi,
    },
    ApiAccess {
        group: "authorization.k8s.io",
        resource: "subjectaccessreviews",
        verbs: &["create"],
        scope: Scope::MetricsApi,
    },
    ApiAccess {
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch"],
        scope: Scope::AuthConfigMap,
    },
    ApiAccess {
        group: "apiregistration.k8s.io",
        resource: "apiservices",
        verbs: &["get", "patch"],
        scope: Scope::MetricsApiCaBundle,
    },
    ApiAccess {
        group: "",
        resource: "secrets",
        verbs: &["get", "create", "update"],
        scope: Scope::MetricsApiCertSecret,
    },
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["patch"],
        scope: Scope::LeaderLabel,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_resource_is_declared_once_with_distinct_verbs() {
        let mut seen = std::collections::BTreeSet::new();
        for a in API_ACCESS {
            assert!(seen.insert((a.group, a.resource, a.scope)), "{a:?} twice");
            let verbs: std::collections::BTreeSet<_> = a.verbs.iter().collect();
            assert_eq!(verbs.len(), a.verbs.len(), "{a:?}");
            assert!(!a.verbs.is_empty(), "{a:?}");
        }
        let own: Vec<_> = API_ACCESS
            .iter()
            .filter(|a| a.scope == Scope::OwnNamespace)
            .map(|a| a.resource)
            .collect();
        assert_eq!(own, ["leases"], "only the Lease is namespaced");
    }
}
