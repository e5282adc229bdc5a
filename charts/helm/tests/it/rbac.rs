//! The chart grants the operator exactly the API access it declares
//! (`ballast_operator::reconcile::rbac::API_ACCESS`): nothing missing, nothing extra, each
//! in its scope, whether it watches every namespace or one.

use crate::common;

use std::collections::BTreeSet;

use ballast_operator::reconcile::rbac::{API_ACCESS, Scope};
use common::*;
use serde_json::Value as Json;

/// (scope, group, resource, verb).
type Grant = (Scope, String, String, String);

fn grants(rules: &Json, scope: Scope) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules.as_array().expect("rules") {
        let keys: BTreeSet<&str> = rule
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            BTreeSet::from(["apiGroups", "resources", "verbs"]),
            "no resourceNames, nonResourceURLs or anything else: {rule}"
        );
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    assert!(g != "*" && r != "*" && v != "*", "no wildcards: {rule}");
                    assert!(
                        out.insert((scope, g.clone(), r.clone(), v)),
                        "granted twice: {rule}"
                    );
                }
            }
        }
    }
    out
}

/// The declared access of `scopes`.
fn declared_in(scopes: &[Scope]) -> BTreeSet<Grant> {
    API_ACCESS
        .iter()
        .filter(|a| scopes.contains(&a.scope))
        .flat_map(|a| {
            a.verbs.iter().map(move |v| {
                (
                    a.scope,
                    a.group.to_string(),
                    a.resource.to_string(),
                    v.to_string(),
                )
            })
        })
        .collect()
}

/// The (group, resource, verb) of the declared access of `scopes`.
fn declared_verbs(scopes: &[Scope]) -> BTreeSet<(String, String, String)> {
    declared_in(scopes)
        .into_iter()
        .map(|(_, g, r, v)| (g, r, v))
        .collect()
}

/// The (group, resource, verb) that `rules` grant.
fn granted_verbs(rules: &Json) -> BTreeSet<(String, String, String)> {
    grants(rules, Scope::Watched)
        .into_iter()
        .map(|(_, g, r, v)| (g, r, v))
        .collect()
}

/// The object of `kind` named `name` (in `namespace`, for a namespaced kind).
fn named(r: &ballast_helm::Rendered, kind: &str, name: &str, namespace: Option<&str>) -> Json {
    r.of_kind(kind)
        .unwrap()
        .into_iter()
        .find(|o| o["metadata"]["name"] == name && o["metadata"]["namespace"].as_str() == namespace)
        .unwrap_or_else(|| panic!("no {kind} {name} in {namespace:?}: {:?}", kinds(r)))
}

/// What both modes share: exactly the declared access where the operator watches (a role
/// named `ballast-ballast-system` of `kind`, in `watched` for a Role), the Lease (and with
/// `leader_label`, for the metrics APIs or KEDA's scaler, its own pod's label) in its own
/// namespace, each bound to its ServiceAccount.
fn check_grants(r: &ballast_helm::Rendered, watched: Option<&str>, leader_label: bool) {
    let (kind, binding) = match watched {
        None => ("ClusterRole", "ClusterRoleBinding"),
        Some(_) => ("Role", "RoleBinding"),
    };
    let role = named(r, kind, "ballast-ballast-system", watched);
    let missing: Vec<_> = declared_verbs(&[Scope::Watched])
        .difference(&granted_verbs(&role["rules"]))
        .cloned()
        .collect();
    let extra: Vec<_> = granted_verbs(&role["rules"])
        .difference(&declared_verbs(&[Scope::Watched]))
        .cloned()
        .collect();
    assert!(missing.is_empty(), "{kind} does not grant {missing:?}");
    assert!(
        extra.is_empty(),
        "{kind} grants more than the operator uses: {extra:?}"
    );
    let bound = named(r, binding, "ballast-ballast-system", watched);
    assert_eq!(bound["roleRef"]["kind"], kind);
    assert_eq!(bound["roleRef"]["name"], "ballast-ballast-system");
    assert_eq!(
        bound["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "ballast", "namespace": "ballast-system"}])
    );

    let own = named(r, "Role", "ballast", Some("ballast-system"));
    let mut want = vec![Scope::OwnNamespace];
    if leader_label {
        want.push(Scope::LeaderLabel);
    }
    assert_eq!(
        granted_verbs(&own["rules"]),
        declared_verbs(&want),
        "the Role in the operator's namespace"
    );
}

#[test]
fn every_namespace_gets_a_cluster_role_of_exactly_the_declared_access() {
    for metrics_api in [false, true] {
        let r =
            render(&options().values(serde_json::json!({"metricsApi": {"enabled": metrics_api}})));
        check_grants(&r, None, metrics_api);
    }
    // KEDA's scaler alone: its Service selects the leader's label too.
    let r = render(&options().values(serde_json::json!({"keda": {"enabled": true}})));
    check_grants(&r, None, true);
}

#[test]
fn one_watched_namespace_gets_a_role_there_and_no_cluster_wide_right_of_its_own() {
    for (watched, metrics_api) in [
        ("team-a", false),
        ("team-a", true),
        ("ballast-system", false),
    ] {
        let r = render(&options().values(serde_json::json!({
            "operator": {"watchNamespace": watched},
            "metricsApi": {"enabled": metrics_api},
        })));
        check_grants(&r, Some(watched), metrics_api);
        assert!(
            args(&r).contains(&format!("--namespace={watched}")),
            "{:?}",
            args(&r)
        );
        // Cluster-wide: only what the metrics APIs cannot do without, each named.
        let cluster: BTreeSet<String> = kinds(&r)
            .into_iter()
            .filter(|(k, _)| k.starts_with("Cluster"))
            .map(|(k, n)| format!("{k}/{n}"))
            .collect();
        let want: BTreeSet<String> = if metrics_api {
            [
                "ClusterRole/ballast-ballast-system-metrics-api",
                "ClusterRoleBinding/ballast-ballast-system-metrics-api",
                "ClusterRole/ballast-ballast-system-metrics-api-cabundle",
                "ClusterRoleBinding/ballast-ballast-system-metrics-api-cabundle",
            ]
            .map(String::from)
            .into()
        } else {
            BTreeSet::new()
        };
        assert_eq!(cluster, want, "{watched}, metrics APIs {metrics_api}");
    }
}

/// Two releases of one name in two namespaces: no cluster-scoped name in common, so Helm
/// can install both.
#[test]
fn cluster_scoped_names_carry_the_release_namespace() {
    let cluster_names = |ns: &str| -> BTreeSet<String> {
        let r = render(
            &options()
                .release("ballast", ns)
                .values(serde_json::json!({"metricsApi": {"enabled": true}})),
        );
        kinds(&r)
            .into_iter()
            .filter(|(k, _)| k.starts_with("Cluster"))
            .map(|(k, n)| format!("{k}/{n}"))
            .collect()
    };
    let (a, b) = (cluster_names("team-a"), cluster_names("team-b"));
    assert_eq!(a.len(), 6, "{a:?}");
    assert!(a.iter().all(|n| n.contains("-team-a")), "{a:?}");
    assert!(a.is_disjoint(&b), "{a:?} and {b:?}");
}

#[test]
fn the_rules_files_list_the_declared_access_in_order() {
    for (file, scope) in [
        ("files/operator-rbac-rules.yaml", Scope::Watched),
        ("files/operator-lease-rules.yaml", Scope::OwnNamespace),
        ("files/operator-own-pod-rules.yaml", Scope::LeaderLabel),
        ("files/operator-metrics-api-rules.yaml", Scope::MetricsApi),
    ] {
        let text = std::fs::read_to_string(chart_dir().join(file)).unwrap();
        let rules: Json = serde_saphyr::from_str(&text).unwrap();
        let from_file: Vec<(String, String, Vec<String>)> = rules
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let one = |k: &str| {
                    let a = r[k].as_array().unwrap();
                    assert_eq!(a.len(), 1, "one {k} per rule in {file}");
                    a[0].as_str().unwrap().to_string()
                };
                let verbs = r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect();
                (one("apiGroups"), one("resources"), verbs)
            })
            .collect();
        let declared: Vec<(String, String, Vec<String>)> = API_ACCESS
            .iter()
            .filter(|a| a.scope == scope)
            .map(|a| {
                (
                    a.group.to_string(),
                    a.resource.to_string(),
                    a.verbs.iter().map(|v| v.to_string()).collect(),
                )
            })
            .collect();
        assert_eq!(
            from_file, declared,
            "{file} and operator/src/reconcile/rbac.rs"
        );
    }
}

#[test]
fn the_metrics_apis_get_their_reviews_and_the_auth_configmap_only_when_enabled() {
    let off = render(&options());
    assert!(
        !kinds(&off)
            .iter()
            .any(|(_, n)| n.contains("metrics-api") || n.contains("auth-reader")),
        "{:?}",
        kinds(&off)
    );
    let r = render(&options().values(serde_json::json!({"metricsApi": {"enabled": true}})));
    let roles = r.of_kind("ClusterRole").unwrap();
    let role = roles
        .iter()
        .find(|o| o["metadata"]["name"] == "ballast-ballast-system-metrics-api")
        .expect("the metrics-API ClusterRole");
    assert_eq!(
        grants(&role["rules"], Scope::MetricsApi),
        declared_in(&[Scope::MetricsApi])
    );
    let bindings = r.of_kind("ClusterRoleBinding").unwrap();
    assert!(bindings.iter().any(
        |b| b["roleRef"]["name"] == "ballast-ballast-system-metrics-api"
            && b["subjects"][0]["namespace"] == "ballast-system"
    ));
    // The ConfigMap: the built-in Role that Kubernetes' bootstrap policy makes for
    // aggregated servers grants get, list and watch of that one ConfigMap — what the
    // operator declares.
    let reader = r
        .of_kind("RoleBinding")
        .unwrap()
        .into_iter()
        .find(|b| b["metadata"]["namespace"] == "kube-system")
        .expect("a RoleBinding in kube-system");
    assert_eq!(reader["roleRef"]["kind"], "Role");
    assert_eq!(
        reader["roleRef"]["name"],
        "extension-apiserver-authentication-reader"
    );
    assert_eq!(reader["subjects"][0]["name"], "ballast");
    let builtin: BTreeSet<Grant> = ["get", "list", "watch"]
        .iter()
        .map(|v| {
            (
                Scope::AuthConfigMap,
                String::new(),
                "configmaps".to_string(),
                v.to_string(),
            )
        })
        .collect();
    assert_eq!(declared_in(&[Scope::AuthConfigMap]), builtin);
}

/// Rules that may carry `resourceNames`: the grants (names aside) and the names.
fn named_grants(rules: &Json, scope: Scope) -> (BTreeSet<Grant>, BTreeSet<String>) {
    let mut out = BTreeSet::new();
    let mut names = BTreeSet::new();
    for rule in rules.as_array().expect("rules") {
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        names.extend(list("resourceNames"));
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    out.insert((scope, g.clone(), r.clone(), v));
                }
            }
        }
    }
    (out, names)
}

#[test]
fn the_operator_kept_certificate_gets_exactly_its_secret_and_the_two_ca_bundles() {
    let r = render(&options().values(serde_json::json!({"metricsApi": {"enabled": true}})));
    let args = container(&r)["args"].to_string();
    assert!(
        args.contains("--metrics-api-cert-secret=ballast-metrics-api-tls"),
        "{args}"
    );
    assert!(args.contains("--metrics-api-port=6443"), "{args}");
    assert!(
        args.contains("--metrics-api-service=ballast-metrics-api"),
        "{args}"
    );
    // The Secret: by name, except create, which RBAC cannot limit by name.
    let role = r
        .of_kind("Role")
        .unwrap()
        .into_iter()
        .find(|o| o["metadata"]["name"] == "ballast-metrics-api-cert")
        .expect("the certificate Secret's Role");
    let (granted, names) = named_grants(&role["rules"], Scope::MetricsApiCertSecret);
    assert_eq!(granted, declared_in(&[Scope::MetricsApiCertSecret]));
    assert_eq!(
        names,
        BTreeSet::from(["ballast-metrics-api-tls".to_string()])
    );
    for rule in role["rules"].as_array().unwrap() {
        let create_only = rule["verbs"] == serde_json::json!(["create"]);
        assert_eq!(
            rule["resourceNames"].is_null(),
            create_only,
            "every verb but create is limited by name: {rule}"
        );
    }
    // The APIServices: exactly the two the chart renders, which are the operator's default
    // --metrics-api-apiservices.
    let apiservices: BTreeSet<String> = r
        .of_kind("APIService")
        .unwrap()
        .iter()
        .map(|a| a["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        apiservices,
        BTreeSet::from([
            "v1beta1.external.metrics.k8s.io".to_string(),
            "v1beta2.custom.metrics.k8s.io".to_string()
        ])
    );
    let cabundle = r
        .of_kind("ClusterRole")
        .unwrap()
        .into_iter()
        .find(|o| o["metadata"]["name"] == "ballast-ballast-system-metrics-api-cabundle")
        .expect("the caBundle ClusterRole");
    let (granted, names) = named_grants(&cabundle["rules"], Scope::MetricsApiCaBundle);
    assert_eq!(granted, declared_in(&[Scope::MetricsApiCaBundle]));
    assert_eq!(names, apiservices);
    let defaults = ballast_operator::metrics_api::server::MetricsApiArgs::default_apiservices();
    assert_eq!(defaults.into_iter().collect::<BTreeSet<_>>(), apiservices);
    // The Service reaches the leader alone.
    let svc = r
        .of_kind("Service")
        .unwrap()
        .into_iter()
        .find(|s| s["metadata"]["name"] == "ballast-metrics-api")
        .expect("the metrics-API Service");
    assert_eq!(
        svc["spec"]["selector"][ballast_operator::labels::METRICS_API_LEADER],
        "true"
    );
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics-api");
    for a in r.of_kind("APIService").unwrap() {
        assert_eq!(a["spec"]["service"]["name"], "ballast-metrics-api");
        assert!(a["spec"]["caBundle"].is_null() && a["spec"]["insecureSkipTLSVerify"].is_null());
    }
}

#[test]
fn with_cert_manager_the_operator_reads_files_and_needs_no_secret_rights() {
    let r = render(
        &options()
            .values(serde_json::json!({"metricsApi": {"enabled": true, "certManager": true}})),
    );
    let c = container(&r);
    let args = c["args"].to_string();
    assert!(
        args.contains("--metrics-api-cert-file=/var/run/ballast/metrics-api-tls/tls.crt"),
        "{args}"
    );
    assert!(!args.contains("--metrics-api-cert-secret"), "{args}");
    assert_eq!(
        c["volumeMounts"][0]["mountPath"],
        "/var/run/ballast/metrics-api-tls"
    );
    let names: Vec<String> = kinds(&r)
        .into_iter()
        .map(|(k, n)| format!("{k}/{n}"))
        .collect();
    assert!(
        names.contains(&"Certificate/ballast-metrics-api".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"Issuer/ballast-metrics-api-selfsigned".to_string()),
        "{names:?}"
    );
    assert!(
        !names
            .iter()
            .any(|n| n.contains("metrics-api-cert") || n.contains("cabundle")),
        "{names:?}"
    );
    for a in r.of_kind("APIService").unwrap() {
        assert_eq!(
            a["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "ballast-system/ballast-metrics-api"
        );
    }
}
