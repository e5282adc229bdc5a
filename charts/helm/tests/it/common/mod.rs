//! Helpers of the chart tests: Helm, renders of the chart, a temporary copy of the chart
//! with extra files, and the typed round trip through k8s-openapi.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use ballast_helm::{Error, Helm, RenderOptions, Rendered};
use serde_json::Value as Json;

/// The API group of the Prometheus Operator, whose objects the chart makes only when the
/// cluster serves it.
pub const MONITORING: &str = "monitoring.coreos.com/v1";

/// Helm, set up once for the whole test binary.
pub fn helm() -> &'static Helm {
    static HELM: OnceLock<Helm> = OnceLock::new();
    HELM.get_or_init(|| Helm::new().unwrap_or_else(|e| panic!("Helm: {e}")))
}

/// The chart's folder.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ballast")
}

/// The names of the ConfigMaps of the chart's own dashboards (`files/dashboards/*.json`)
/// for release `ballast`.
pub fn dashboard_config_maps() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(chart_dir().join("files/dashboards"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_str()?.strip_suffix(".json")?.to_string();
                    Some(format!("ballast-dashboard-{name}"))
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// One render: which chart, which release, which values, which cluster.
pub struct Render {
    pub dir: PathBuf,
    pub release: String,
    pub namespace: String,
    pub values: Json,
    pub options: RenderOptions,
}

/// Release `ballast` of the committed chart in `ballast-system`, defaults, no
/// monitoring API.
pub fn options() -> Render {
    Render {
        dir: chart_dir(),
        release: "ballast".into(),
        namespace: "ballast-system".into(),
        values: Json::Object(Default::default()),
        options: RenderOptions::default(),
    }
}

impl Render {
    /// Another release name and namespace.
    pub fn release(mut self, release: &str, namespace: &str) -> Self {
        self.release = release.into();
        self.namespace = namespace.into();
        self
    }

    /// These values (as JSON, which is YAML too).
    pub fn values(mut self, values: Json) -> Self {
        self.values = values;
        self
    }

    /// The chart in `dir`.
    pub fn chart(mut self, dir: &Path) -> Self {
        self.dir = dir.to_path_buf();
        self
    }

    /// A cluster that serves the Prometheus Operator's API.
    pub fn with_monitoring(mut self) -> Self {
        for kind in ["", "/ServiceMonitor", "/PrometheusRule"] {
            self.options = self.options.api_version(format!("{MONITORING}{kind}"));
        }
        self
    }

    /// A cluster that serves these kinds of the Prometheus Operator's API only (Helm's
    /// `group/version/Kind` capabilities).
    pub fn with_monitoring_kinds(mut self, kinds: &[&str]) -> Self {
        self.options = self.options.api_version(MONITORING);
        for kind in kinds {
            self.options = self.options.api_version(format!("{MONITORING}/{kind}"));
        }
        self
    }

    /// A cluster that also serves `api_version` (`group/version` or `group/version/Kind`).
    pub fn with_api(mut self, api_version: &str) -> Self {
        self.options = self.options.api_version(api_version);
        self
    }

    /// The render, or Helm's error.
    pub fn try_render(&self) -> Result<Rendered, Error> {
        helm().render_with(
            &self.dir,
            &self.release,
            &self.namespace,
            &self.values.to_string(),
            &self.options,
        )
    }
}

/// Renders and panics with the error if it fails.
pub fn render(r: &Render) -> Rendered {
    r.try_render()
        .unwrap_or_else(|e| panic!("the chart renders: {e}"))
}

/// Every template document parsed.
pub fn objects(r: &Rendered) -> Vec<Json> {
    r.objects().unwrap_or_else(|e| panic!("{e}"))
}

/// `(kind, name)` of every template document, in order.
pub fn kinds(r: &Rendered) -> Vec<(String, String)> {
    objects(r)
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// The one object of `kind` (panics when there is not exactly one).
pub fn one(r: &Rendered, kind: &str) -> Json {
    let mut all = r.of_kind(kind).unwrap();
    assert_eq!(all.len(), 1, "exactly one {kind}: {:?}", kinds(r));
    all.remove(0)
}

/// The operator container of the rendered Deployment.
pub fn container(r: &Rendered) -> Json {
    one(r, "Deployment")["spec"]["template"]["spec"]["containers"][0].clone()
}

/// The container's args as strings.
pub fn args(r: &Rendered) -> Vec<String> {
    container(r)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// A copy of the chart in a temporary folder, removed on drop.
pub struct ChartCopy {
    pub dir: PathBuf,
}

static COPIES: AtomicUsize = AtomicUsize::new(0);

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

impl ChartCopy {
    /// The chart copied, plus `files` (path in the chart, content).
    pub fn with(files: &[(&str, &str)]) -> ChartCopy {
        let dir = std::env::temp_dir()
            .join(format!(
                "ballast-helm-test-{}-{}",
                std::process::id(),
                COPIES.fetch_add(1, Ordering::SeqCst)
            ))
            // Helm wants the folder named as the chart.
            .join("ballast");
        let _ = std::fs::remove_dir_all(&dir);
        copy_dir(&chart_dir(), &dir);
        // Dashboards given here replace the chart's own, so counts are the test's.
        if files
            .iter()
            .any(|(p, _)| p.starts_with("files/dashboards/"))
        {
            let _ = std::fs::remove_dir_all(dir.join("files/dashboards"));
        }
        for (path, content) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        ChartCopy { dir }
    }

    /// Renders of this copy.
    pub fn options(&self) -> Render {
        options().chart(&self.dir)
    }
}

impl Drop for ChartCopy {
    fn drop(&mut self) {
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

/// A small Grafana dashboard.
pub const DASHBOARD: &str = r#"{
  "title": "Ballast fleet",
  "uid": "ballast-fleet",
  "panels": [{"type": "timeseries", "title": "Desired replicas",
    "targets": [{"expr": "ballast_operator_desired_replicas"}]}]
}
"#;

/// A small Prometheus rules file, with Prometheus's own templating in an annotation.
pub const ALERTS: &str = r#"# Ballast alerts.
groups:
  - name: ballast
    rules:
      - alert: BallastReconcileErrors
        expr: sum by (name) (rate(ballast_operator_reconcile_errors_total[5m])) > 0
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: "{{ $labels.name }} fails to reconcile"
"#;

/// Deserializes `doc` into `T` and serializes it back: the same JSON comes back unless
/// the document has a field the type does not know (a misspelling serde would drop) or
/// a value of the wrong shape.
pub fn round_trip<T>(doc: &Json)
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| {
        panic!(
            "{} {} does not deserialize: {e}\n{doc:#}",
            doc["kind"], doc["metadata"]["name"]
        )
    });
    let back = serde_json::to_value(&typed).unwrap();
    if back != *doc {
        panic!(
            "{} {} changes through its type (an unknown or misspelt field?)\nrendered: {doc:#}\ntyped:    {back:#}",
            doc["kind"], doc["metadata"]["name"]
        );
    }
}

/// Checks every document of `r` (and its CRDs) against its Kubernetes type.
pub fn check_types(r: &Rendered) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    for crd in &r.crds {
        let doc = crd.parse().unwrap();
        assert_eq!(doc["kind"], "CustomResourceDefinition");
        round_trip::<CustomResourceDefinition>(&doc);
    }
    for doc in objects(r) {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        match (api_version, doc["kind"].as_str().unwrap_or_default()) {
            ("apps/v1", "Deployment") => round_trip::<Deployment>(&doc),
            ("v1", "Service") => round_trip::<Service>(&doc),
            ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(&doc),
            ("v1", "ConfigMap") => round_trip::<ConfigMap>(&doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(&doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                round_trip::<ClusterRoleBinding>(&doc)
            }
            ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(&doc),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(&doc),
            ("monitoring.coreos.com/v1", "ServiceMonitor") => check_service_monitor(&doc),
            ("monitoring.coreos.com/v1", "PrometheusRule") => check_prometheus_rule(&doc),
            (v, k) => panic!("unexpected document {v} {k}"),
        }
    }
}

fn check_metadata(doc: &Json) {
    let meta = doc["metadata"].as_object().expect("metadata");
    let name = meta["name"].as_str().expect("metadata.name");
    assert!(!name.is_empty() && name.len() <= 63, "{name}");
    assert!(meta["namespace"].is_string(), "namespaced: {doc}");
    for (k, v) in meta
        .get("labels")
        .and_then(Json::as_object)
        .into_iter()
        .flatten()
    {
        assert!(v.is_string(), "label {k} is a string");
    }
    let known = ["name", "namespace", "labels", "annotations"];
    for k in meta.keys() {
        assert!(known.contains(&k.as_str()), "unexpected metadata.{k}");
    }
}

/// A ServiceMonitor's required shape (monitoring.coreos.com/v1).
pub fn check_service_monitor(doc: &Json) {
    check_metadata(doc);
    let spec = doc["spec"].as_object().expect("spec");
    for k in spec.keys() {
        assert!(
            ["selector", "namespaceSelector", "endpoints"].contains(&k.as_str()),
            "unexpected ServiceMonitor spec.{k}"
        );
    }
    assert!(
        spec["selector"]["matchLabels"]
            .as_object()
            .is_some_and(|m| !m.is_empty()),
        "a selector"
    );
    let endpoints = spec["endpoints"].as_array().expect("endpoints");
    assert!(!endpoints.is_empty());
    for e in endpoints {
        let e = e.as_object().unwrap();
        for k in e.keys() {
            assert!(
                ["port", "path", "interval", "scrapeTimeout", "honorLabels"].contains(&k.as_str()),
                "unexpected endpoint field {k}"
            );
        }
        assert!(e["port"].is_string());
        assert_eq!(e["path"], "/metrics");
    }
}

/// A PrometheusRule's required shape: spec.groups, each with a name and rules that each
/// have an expr and an alert or record.
pub fn check_prometheus_rule(doc: &Json) {
    check_metadata(doc);
    let spec = doc["spec"].as_object().expect("spec");
    assert_eq!(spec.keys().collect::<Vec<_>>(), ["groups"]);
    let groups = spec["groups"].as_array().expect("groups");
    assert!(!groups.is_empty());
    for g in groups {
        assert!(g["name"].is_string(), "group name");
        for r in g["rules"].as_array().expect("rules") {
            assert!(r["expr"].is_string(), "expr");
            assert!(
                r["alert"].is_string() || r["record"].is_string(),
                "alert or record"
            );
        }
    }
}
