//! values.schema.json refuses what `helm install` would refuse, naming the value.

mod common;

use ballast_chart::Error;
use common::*;
use serde_json::json;

fn violations(values: serde_json::Value) -> Vec<String> {
    match chart().render(&options().values(values.clone())) {
        Err(Error::Schema(v)) => v,
        Err(e) => panic!("{values}: not a schema error: {e}"),
        Ok(_) => panic!("{values}: accepted"),
    }
}

#[test]
fn the_defaults_conform() {
    let chart = chart();
    chart.values(&ballast_chart::Value::Nil).unwrap();
}

#[test]
fn wrong_types_are_refused() {
    assert_eq!(
        violations(json!({"operator": {"replicas": "two"}})),
        ["operator.replicas: \"two\" is a string, expected integer"]
    );
    assert_eq!(
        violations(json!({"operator": {"leaderElection": {"enabled": "yes"}}})),
        ["operator.leaderElection.enabled: \"yes\" is a string, expected boolean"]
    );
    assert_eq!(
        violations(json!({"operator": {"nodeSelector": {"disk": 1}}})),
        ["operator.nodeSelector.disk: 1 is an integer, expected string"]
    );
    assert_eq!(
        violations(json!({"operator": {"tolerations": {"key": "x"}}})),
        ["operator.tolerations: {\"key\":\"x\"} is an object, expected array"]
    );
}

#[test]
fn unknown_keys_are_refused() {
    let v = violations(json!({"operator": {"replica": 3}}));
    assert_eq!(v.len(), 1);
    assert!(
        v[0].starts_with("operator.replica: unknown key (allowed here: "),
        "{}",
        v[0]
    );
    assert!(violations(json!({"imge": {}}))[0].starts_with("imge: unknown key"));
    assert!(
        violations(json!({"operator": {"tolerations": [{"key": "a", "efect": "NoSchedule"}]}}))[0]
            .starts_with("operator.tolerations[0].efect: unknown key")
    );
    assert!(
        violations(json!({"monitoring": {"serviceMonitor": {"enable": true}}}))[0]
            .starts_with("monitoring.serviceMonitor.enable: unknown key")
    );
}

#[test]
fn out_of_range_values_are_refused() {
    assert_eq!(
        violations(json!({"operator": {"replicas": -1}})),
        ["operator.replicas: -1 is less than the minimum 1"]
    );
    assert_eq!(
        violations(json!({"operator": {"replicas": 0}})),
        ["operator.replicas: 0 is less than the minimum 1"]
    );
    assert_eq!(
        violations(json!({"operator": {"metrics": {"port": 70000}}})),
        ["operator.metrics.port: 70000 is greater than the maximum 65535"]
    );
    assert_eq!(
        violations(json!({"operator": {"securityContext": {"runAsUser": 0}}})),
        ["operator.securityContext.runAsUser: 0 is less than the minimum 1"],
        "never root"
    );
}

#[test]
fn bad_enums_and_patterns_are_refused() {
    assert_eq!(
        violations(json!({"image": {"pullPolicy": "Sometimes"}})),
        ["image.pullPolicy: \"Sometimes\" is not one of \"Always\", \"IfNotPresent\", \"Never\""]
    );
    assert_eq!(
        violations(json!({"operator": {"podAntiAffinity": "strict"}})),
        ["operator.podAntiAffinity: \"strict\" is not one of \"\", \"soft\", \"hard\""]
    );
    assert_eq!(
        violations(json!({"operator": {"metrics": {"host": "localhost"}}}))[0],
        "operator.metrics.host: \"localhost\" does not match the pattern \"^([0-9A-Fa-f:.]+|\\\\$\\\\([A-Za-z_][A-Za-z0-9_]*\\\\))$\""
    );
    assert!(
        violations(json!({"monitoring": {"serviceMonitor": {"interval": "30"}}}))[0]
            .starts_with("monitoring.serviceMonitor.interval: \"30\" does not match")
    );
    assert!(
        violations(json!({"image": {"repository": ""}}))[0]
            .starts_with("image.repository: \"\" is shorter than the minimum length 1")
    );
}

#[test]
fn every_violation_is_reported_at_once() {
    let v = violations(json!({"operator": {"replicas": 0, "podAntiAffinity": "x"}, "typo": 1}));
    assert_eq!(v.len(), 3, "{v:?}");
    let e = chart()
        .render(&options().values(json!({"operator": {"replicas": -1}})))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "values do not match values.schema.json:\noperator.replicas: -1 is less than the minimum 1"
    );
}

#[test]
fn removing_a_required_value_is_refused() {
    let v = violations(json!({"image": {"repository": null}}));
    assert_eq!(v, ["image: missing required key \"repository\""]);
}
