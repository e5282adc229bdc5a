//! The chart grants the operator exactly the API access it declares
//! (`ballast_operator::reconcile::rbac::API_ACCESS`): nothing missing, nothing extra, each
//! in its scope.

mod common;

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

fn declared() -> BTreeSet<Grant> {
    API_ACCESS
        .iter()
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

#[test]
fn the_chart_grants_exactly_the_declared_access() {
    let r = render(&options());
    let mut granted = grants(&one(&r, "ClusterRole")["rules"], Scope::Cluster);
    granted.extend(grants(&one(&r, "Role")["rules"], Scope::OwnNamespace));
    let want = declared();
    let missing: Vec<_> = want.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&want).collect();
    assert!(missing.is_empty(), "the chart does not grant {missing:?}");
    assert!(
        extra.is_empty(),
        "the chart grants more than the operator uses: {extra:?}"
    );
    assert_eq!(
        one(&r, "Role")["metadata"]["namespace"],
        "ballast-system",
        "the Lease's namespace"
    );
}

#[test]
fn the_rules_files_list_the_declared_access_in_order() {
    for (file, scope) in [
        ("files/operator-rbac-rules.yaml", Scope::Cluster),
        ("files/operator-lease-rules.yaml", Scope::OwnNamespace),
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
