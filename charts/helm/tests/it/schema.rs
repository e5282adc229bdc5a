//! values.schema.json refuses what `helm install` would refuse, naming the value: Helm
//! itself checks the values, coalesced over values.yaml, before rendering anything.

use crate::common;

use ballast_helm::Error;
use common::*;
use serde_json::json;

/// What Helm says is wrong with `values`, one `path: message` per violation; panics
/// when Helm accepts them or fails for another reason.
fn violations(values: serde_json::Value) -> Vec<String> {
    let from_render = match options().values(values.clone()).try_render() {
        Err(Error::Schema { violations, .. }) => violations,
        Err(e) => panic!("{values}: not a schema error: {e}"),
        Ok(_) => panic!("{values}: accepted"),
    };
    let shown: Vec<String> = from_render.iter().map(ToString::to_string).collect();
    // validate_schema says the same without rendering.
    match helm().validate_schema(chart_dir(), &values.to_string()) {
        Err(Error::Schema { violations, .. }) => assert_eq!(violations, from_render),
        other => panic!("{values}: validate_schema gave {other:?}"),
    }
    shown
}

#[test]
fn the_defaults_conform() {
    helm().validate_schema(chart_dir(), "").unwrap();
    helm().validate_schema(chart_dir(), "{}\n").unwrap();
}

#[test]
fn wrong_types_are_refused() {
    assert_eq!(
        violations(json!({"operator": {"replicas": "two"}})),
        ["/operator/replicas: got string, want integer"]
    );
    assert_eq!(
        violations(json!({"operator": {"replicas": 2.5}})),
        ["/operator/replicas: got number, want integer"]
    );
    assert_eq!(
        violations(json!({"operator": {"leaderElection": {"enabled": "yes"}}})),
        ["/operator/leaderElection/enabled: got string, want boolean"]
    );
    assert_eq!(
        violations(json!({"operator": {"nodeSelector": {"disk": 1}}})),
        ["/operator/nodeSelector/disk: got number, want string"]
    );
    assert_eq!(
        violations(json!({"operator": {"tolerations": {"key": "x"}}})),
        ["/operator/tolerations: got object, want array"]
    );
}

#[test]
fn unknown_keys_are_refused() {
    assert_eq!(
        violations(json!({"operator": {"replica": 3}})),
        ["/operator: additional properties 'replica' not allowed"]
    );
    assert_eq!(
        violations(json!({"imge": {}})),
        ["/: additional properties 'imge' not allowed"]
    );
    assert_eq!(
        violations(json!({"operator": {"tolerations": [{"key": "a", "efect": "NoSchedule"}]}})),
        ["/operator/tolerations/0: additional properties 'efect' not allowed"]
    );
    assert_eq!(
        violations(json!({"monitoring": {"serviceMonitor": {"enable": true}}})),
        ["/monitoring/serviceMonitor: additional properties 'enable' not allowed"]
    );
}

#[test]
fn out_of_range_values_are_refused() {
    assert_eq!(
        violations(json!({"operator": {"replicas": -1}})),
        ["/operator/replicas: minimum: got -1, want 1"]
    );
    assert_eq!(
        violations(json!({"operator": {"replicas": 0}})),
        ["/operator/replicas: minimum: got 0, want 1"]
    );
    assert_eq!(
        violations(json!({"operator": {"metrics": {"port": 70000}}})),
        ["/operator/metrics/port: maximum: got 70,000, want 65,535"]
    );
    assert_eq!(
        violations(json!({"operator": {"securityContext": {"runAsUser": 0}}})),
        ["/operator/securityContext/runAsUser: minimum: got 0, want 1"],
        "never root"
    );
}

#[test]
fn bad_enums_and_patterns_are_refused() {
    assert_eq!(
        violations(json!({"image": {"pullPolicy": "Sometimes"}})),
        ["/image/pullPolicy: value must be one of 'Always', 'IfNotPresent', 'Never'"]
    );
    assert_eq!(
        violations(json!({"operator": {"podAntiAffinity": "strict"}})),
        ["/operator/podAntiAffinity: value must be one of '', 'soft', 'hard'"]
    );
    assert_eq!(
        violations(json!({"operator": {"metrics": {"host": "localhost"}}})),
        [
            "/operator/metrics/host: 'localhost' does not match pattern '^([0-9A-Fa-f:.]+|\\\\$\\\\([A-Za-z_][A-Za-z0-9_]*\\\\))$'"
        ]
    );
    // What the pattern lets through renders.
    for host in ["0.0.0.0", "::", "$(POD_IP)"] {
        render(&options().values(json!({"operator": {"metrics": {"host": host}}})));
    }
    assert_eq!(
        violations(json!({"monitoring": {"serviceMonitor": {"interval": "30"}}})),
        [
            "/monitoring/serviceMonitor/interval: '30' does not match pattern '^([0-9]+(ms|s|m|h))+$'"
        ]
    );
    assert_eq!(
        violations(json!({"image": {"repository": ""}})),
        ["/image/repository: minLength: got 0, want 1"]
    );
}

#[test]
fn every_violation_is_reported_at_once() {
    let v = violations(json!({"operator": {"replicas": 0, "podAntiAffinity": "x"}, "typo": 1}));
    assert_eq!(
        v,
        [
            "/: additional properties 'typo' not allowed",
            "/operator/podAntiAffinity: value must be one of '', 'soft', 'hard'",
            "/operator/replicas: minimum: got 0, want 1",
        ]
    );
    let e = options()
        .values(json!({"operator": {"replicas": -1}}))
        .try_render()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the values break values.schema.json:\nballast:\n- at '/operator/replicas': minimum: got -1, want 1"
    );
}

#[test]
fn removing_a_required_value_is_refused() {
    // A null in the values removes the default, as with `--set image.repository=null`.
    assert_eq!(
        violations(json!({"image": {"repository": null}})),
        ["/image: missing property 'repository'"]
    );
}

#[test]
fn values_that_are_not_a_yaml_mapping_are_refused() {
    for bad in ["- a\n- list\n", "operator: [unclosed\n", "just a string\n"] {
        match helm().render(chart_dir(), "ballast", "ballast-system", bad) {
            Err(Error::ValuesYaml(message)) => assert!(!message.is_empty(), "{bad:?}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn coalesced_values_are_what_a_release_gets() {
    let v = helm()
        .values(
            chart_dir(),
            "operator:\n  replicas: 5\nimage:\n  tag: null\n",
        )
        .unwrap();
    assert_eq!(v["operator"]["replicas"], 5);
    assert_eq!(
        v["operator"]["leaderElection"]["enabled"], true,
        "a default kept"
    );
    assert!(v["image"].get("tag").is_none(), "null removes a default");
    assert!(v["image"]["repository"].is_string());
}
