//! `helm lint --strict` passes on the chart, with its defaults and with the values the
//! other tests render; and it does fail a chart with something wrong in it.

use crate::common;

use ballast_helm::{LintMessage, Severity};
use common::*;
use serde_json::json;

/// The one finding the chart keeps: Helm recommends a Chart.yaml `icon`, and Ballast has
/// no image to point one at.
fn icon_only(messages: &[LintMessage]) -> bool {
    messages.len() == 1
        && messages[0].severity == Severity::Info
        && messages[0].path == "Chart.yaml"
        && messages[0].message == "icon is recommended"
}

#[test]
fn the_chart_passes_strict_lint() {
    for values in [
        json!({}),
        json!({"operator": {"replicas": 1, "leaderElection": {"enabled": false},
            "podAntiAffinity": "hard", "watchNamespace": "team-a"}}),
        json!({"monitoring": {"engineServiceMonitor": {"enabled": true}},
            "dashboards": {"enabled": false}, "rbac": {"create": false},
            "serviceAccount": {"create": false, "name": "existing"}}),
        json!({"metricsApi": {"enabled": true}}),
        json!({"metricsApi": {"enabled": true, "certManager": true, "port": 8443}}),
        json!({"metricsApi": {"enabled": true}, "networkPolicy": {"enabled": true,
            "monitoringNamespace": "monitoring", "engineNamespaces": ["ml", "chat"],
            "clientPeers": [{"namespaceSelector": {"matchLabels": {"team": "web"}}}]}}),
    ] {
        let report = helm()
            .lint(chart_dir(), &values.to_string(), true)
            .unwrap_or_else(|e| panic!("{e}"));
        let shown: Vec<String> = report.messages.iter().map(ToString::to_string).collect();
        assert!(report.passed(), "{values}: {shown:#?} {:?}", report.errors);
        assert_eq!(report.charts_linted, 1);
        assert!(
            icon_only(&report.messages),
            "{values}: lint finds more than the icon: {shown:#?}"
        );
    }
}

#[test]
fn strict_lint_fails_on_a_warning_and_any_lint_on_an_error() {
    // A removed API version is a warning: strict fails it, plain lint does not.
    let deprecated = ChartCopy::with(&[(
        "templates/pdb.yaml",
        "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  minAvailable: 1\n",
    )]);
    let plain = helm().lint(&deprecated.dir, "", false).unwrap();
    assert!(plain.passed(), "{:?}", plain.messages);
    let warnings = plain.at_least(Severity::Warning);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].path, "templates/pdb.yaml");
    assert!(
        warnings[0]
            .message
            .contains("policy/v1beta1 PodDisruptionBudget"),
        "{}",
        warnings[0]
    );
    let strict = helm().lint(&deprecated.dir, "", true).unwrap();
    assert!(!strict.passed());
    assert_eq!(strict.errors.len(), 1, "{:?}", strict.errors);

    // A template that does not execute is an error either way.
    let broken = ChartCopy::with(&[(
        "templates/broken.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Values.no.such.value }}\n",
    )]);
    let report = helm().lint(&broken.dir, "", false).unwrap();
    assert!(!report.passed());
    let errors = report.at_least(Severity::Error);
    assert!(
        errors
            .iter()
            .any(|m| m.message.contains("templates/broken.yaml")),
        "{errors:?}"
    );
}

#[test]
fn lint_checks_the_values_against_the_schema() {
    let report = helm()
        .lint(chart_dir(), "operator:\n  replicas: zero\n", true)
        .unwrap();
    assert!(!report.passed());
    assert!(
        report
            .errors
            .iter()
            .any(|e| e.contains("/operator/replicas")),
        "{:?}",
        report.errors
    );
}
