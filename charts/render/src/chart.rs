//! A Helm v3 chart on disk and its rendering: Helm's built-in objects (`.Values`,
//! `.Release`, `.Chart`, `.Capabilities`, `.Files`, `.Template`), values merged over
//! `values.yaml` and checked against `values.schema.json`, each template's output split
//! into YAML documents.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::exec::{Templates, glob_match};
use crate::schema::Schema;
use crate::{Error, Value};

/// The API versions every cluster serves, as Helm's default capabilities list them; the
/// ones in [`RenderOptions::api_versions`] are added (`helm template --api-versions`).
pub const DEFAULT_API_VERSIONS: &[&str] = &[
    "v1",
    "admissionregistration.k8s.io/v1",
    "apiextensions.k8s.io/v1",
    "apps/v1",
    "authentication.k8s.io/v1",
    "authorization.k8s.io/v1",
    "autoscaling/v1",
    "autoscaling/v2",
    "batch/v1",
    "certificates.k8s.io/v1",
    "coordination.k8s.io/v1",
    "discovery.k8s.io/v1",
    "events.k8s.io/v1",
    "networking.k8s.io/v1",
    "node.k8s.io/v1",
    "policy/v1",
    "rbac.authorization.k8s.io/v1",
    "scheduling.k8s.io/v1",
    "storage.k8s.io/v1",
];

/// The Kubernetes version `.Capabilities.KubeVersion` reports.
pub const KUBE_VERSION: (u32, u32) = (1, 33);

/// A chart loaded from its folder.
#[derive(Debug, Clone)]
pub struct Chart {
    dir: PathBuf,
    name: String,
    version: String,
    app_version: Option<String>,
    metadata: Value,
    values: Value,
    schema: Option<Schema>,
    templates: Templates,
    /// Paths (relative to the chart, `/`-separated) of the files in `templates/`.
    template_files: Vec<String>,
    /// `.Files`: every other file except Chart.yaml, values.yaml and values.schema.json.
    files: Arc<BTreeMap<String, String>>,
}

/// How to render.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// `.Release.Name`.
    pub release_name: String,
    /// `.Release.Namespace`.
    pub namespace: String,
    /// Merged over `values.yaml` (maps key by key, deeply; anything else replaces; a
    /// `null` removes the key), as `-f`/`--set` values are. [`Value::Nil`] for none.
    pub values_override: Value,
    /// API versions the cluster serves beyond [`DEFAULT_API_VERSIONS`], e.g.
    /// `monitoring.coreos.com/v1` when the Prometheus Operator is installed.
    pub api_versions: Vec<String>,
}

impl RenderOptions {
    /// Release `release_name` in `namespace`, default values, default API versions.
    pub fn new(release_name: &str, namespace: &str) -> Self {
        Self {
            release_name: release_name.into(),
            namespace: namespace.into(),
            ..Self::default()
        }
    }

    /// These values over `values.yaml`.
    pub fn values(mut self, values: impl Into<Value>) -> Self {
        self.values_override = values.into();
        self
    }

    /// These values, written as YAML, over `values.yaml`.
    pub fn values_yaml(self, yaml: &str) -> Result<Self, Error> {
        let v = Value::from_yaml(yaml).map_err(|message| Error::Invalid {
            file: "values override".into(),
            message,
        })?;
        Ok(self.values(v))
    }

    /// The cluster also serves `api_version`.
    pub fn api_version(mut self, api_version: &str) -> Self {
        self.api_versions.push(api_version.into());
        self
    }
}

/// One YAML document of the output.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// The file it came from, relative to the chart (`templates/deployment.yaml`).
    pub source: String,
    /// Its position among that file's documents, from 0.
    pub index: usize,
    /// The YAML text.
    pub content: String,
}

impl Document {
    /// The document parsed as JSON.
    pub fn parse(&self) -> Result<serde_json::Value, Error> {
        serde_saphyr::from_str(&self.content).map_err(|e| Error::Invalid {
            file: format!("{} (document {})", self.source, self.index),
            message: format!("the rendered YAML does not parse: {e}"),
        })
    }
}

/// What a render produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The documents of `crds/`, untemplated, as Helm v3 installs them before the rest.
    pub crds: Vec<Document>,
    /// The documents of each template (not `_` helpers, not NOTES.txt), by file name,
    /// in each file's order; documents holding only whitespace and comments are dropped.
    pub documents: Vec<Document>,
    /// `templates/NOTES.txt`, rendered (empty without one).
    pub notes: String,
}

impl Rendered {
    /// Every template document, parsed.
    pub fn objects(&self) -> Result<Vec<serde_json::Value>, Error> {
        self.documents.iter().map(Document::parse).collect()
    }

    /// The parsed template documents of this `kind`.
    pub fn of_kind(&self, kind: &str) -> Result<Vec<serde_json::Value>, Error> {
        Ok(self
            .objects()?
            .into_iter()
            .filter(|o| o["kind"] == kind)
            .collect())
    }
}

fn read(path: &Path) -> Result<String, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `.helmignore` rules: `#` comments, `!` negation, a trailing `/` for directories only,
/// patterns with a `/` against the path from the chart root, others against each name.
#[derive(Debug, Default)]
struct Ignore {
    rules: Vec<(bool, bool, String)>,
}

impl Ignore {
    fn parse(text: &str) -> Ignore {
        let mut rules = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (negate, line) = match line.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, line),
            };
            let (dir_only, line) = match line.strip_suffix('/') {
                Some(rest) => (true, rest),
                None => (false, line),
            };
            rules.push((negate, dir_only, line.trim_start_matches('/').to_string()));
        }
        Ignore { rules }
    }

    fn ignored(&self, rel: &str, is_dir: bool) -> bool {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        let mut ignored = false;
        for (negate, dir_only, pattern) in &self.rules {
            if *dir_only && !is_dir {
                continue;
            }
            let hit = if pattern.contains('/') {
                glob_match(pattern, rel)
            } else {
                glob_match(pattern, name)
            };
            if hit {
                ignored = !negate;
            }
        }
        ignored
    }
}

fn walk(
    dir: &Path,
    rel: &str,
    ignore: &Ignore,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), Error> {
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(io)?
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let child = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let meta = std::fs::metadata(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        if ignore.ignored(&child, meta.is_dir()) {
            continue;
        }
        if meta.is_dir() {
            walk(&path, &child, ignore, out)?;
        } else if meta.is_file() {
            out.push((child, path));
        }
    }
    Ok(())
}

/// Chart.yaml keys as Helm's `.Chart` spells them.
fn metadata_key(k: &str) -> String {
    match k {
        "apiVersion" => "APIVersion".into(),
        "appVersion" => "AppVersion".into(),
        "kubeVersion" => "KubeVersion".into(),
        k => {
            let mut c = k.chars();
            match c.next() {
                Some(first) => first.to_uppercase().chain(c).collect(),
                None => String::new(),
            }
        }
    }
}

/// Merges `over` into `base`: maps key by key, deeply; a `null` removes the key; anything
/// else replaces.
pub fn merge_values(base: &mut Value, over: Value) {
    match (base, over) {
        (_, Value::Nil) => {}
        (Value::Map(b), Value::Map(o)) => {
            for (k, v) in o {
                match (b.get_mut(&k), v) {
                    (_, Value::Nil) => {
                        b.remove(&k);
                    }
                    (Some(existing), v) => merge_values(existing, v),
                    (None, v) => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Splits rendered text into YAML documents at lines starting with `---` (Helm's
/// `SplitManifests`); documents with nothing but whitespace and comments are dropped.
pub fn split_documents(source: &str, text: &str) -> Vec<Document> {
    let mut chunks = vec![String::new()];
    for line in text.split_inclusive('\n') {
        let is_sep = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace));
        if is_sep {
            chunks.push(line[3..].trim_start().to_string());
        } else if let Some(last) = chunks.last_mut() {
            last.push_str(line);
        }
    }
    chunks
        .into_iter()
        .filter(|c| {
            c.lines().any(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#')
            })
        })
        .enumerate()
        .map(|(index, c)| {
            let mut body = c.trim_end();
            while let Some(nl) = body.find('\n') {
                if !body[..nl].trim().is_empty() {
                    break;
                }
                body = &body[nl + 1..];
            }
            Document {
                source: source.to_string(),
                index,
                content: format!("{body}\n"),
            }
        })
        .collect()
}

impl Chart {
    /// Loads the chart in `dir`: Chart.yaml (apiVersion v2), values.yaml,
    /// values.schema.json (checked to use only the supported keywords), every template
    /// (parsed now, so a syntax error fails the load), and the other files as `.Files`.
    /// `.helmignore` applies. Subcharts are not supported.
    pub fn load(dir: impl AsRef<Path>) -> Result<Chart, Error> {
        let dir = dir.as_ref().to_path_buf();
        let ignore_path = dir.join(".helmignore");
        let ignore = if ignore_path.is_file() {
            Ignore::parse(&read(&ignore_path)?)
        } else {
            Ignore::default()
        };
        let mut entries = Vec::new();
        walk(&dir, "", &ignore, &mut entries)?;

        let invalid = |file: &str, message: String| Error::Invalid {
            file: file.into(),
            message,
        };
        let chart_yaml = read(&dir.join("Chart.yaml"))?;
        let meta = Value::from_yaml(&chart_yaml).map_err(|m| invalid("Chart.yaml", m))?;
        let Value::Map(meta) = meta else {
            return Err(invalid("Chart.yaml", "not a map".into()));
        };
        let text = |k: &str| match meta.get(k) {
            Some(Value::Str(s)) if !s.is_empty() => Some(s.clone()),
            _ => None,
        };
        if text("apiVersion").as_deref() != Some("v2") {
            return Err(invalid(
                "Chart.yaml",
                "apiVersion must be v2 (a Helm 3 chart)".into(),
            ));
        }
        let name = text("name").ok_or_else(|| invalid("Chart.yaml", "name is required".into()))?;
        let version =
            text("version").ok_or_else(|| invalid("Chart.yaml", "version is required".into()))?;
        let app_version = text("appVersion");
        let metadata = Value::Map(
            meta.iter()
                .map(|(k, v)| (metadata_key(k), v.clone()))
                .collect(),
        );

        let values = match dir.join("values.yaml") {
            p if p.is_file() => {
                let v = Value::from_yaml(&read(&p)?).map_err(|m| invalid("values.yaml", m))?;
                match v {
                    Value::Nil => Value::Map(BTreeMap::new()),
                    m @ Value::Map(_) => m,
                    _ => return Err(invalid("values.yaml", "not a map".into())),
                }
            }
            _ => Value::Map(BTreeMap::new()),
        };
        let schema = match dir.join("values.schema.json") {
            p if p.is_file() => {
                let json: serde_json::Value = serde_json::from_str(&read(&p)?)
                    .map_err(|e| invalid("values.schema.json", e.to_string()))?;
                Some(Schema::new(json).map_err(|m| invalid("values.schema.json", m))?)
            }
            _ => None,
        };

        let mut templates = Templates::new();
        let mut template_files = Vec::new();
        let mut files = BTreeMap::new();
        for (rel, path) in entries {
            if rel.starts_with("charts/") {
                return Err(invalid(&rel, "subcharts are not supported".into()));
            }
            if let Some(_inner) = rel.strip_prefix("templates/") {
                templates.add(&format!("{name}/{rel}"), &read(&path)?)?;
                template_files.push(rel);
            } else if !matches!(
                rel.as_str(),
                "Chart.yaml" | "values.yaml" | "values.schema.json" | "Chart.lock"
            ) {
                files.insert(rel, read(&path)?);
            }
        }
        Ok(Chart {
            dir,
            name,
            version,
            app_version,
            metadata,
            values,
            schema,
            templates,
            template_files,
            files: Arc::new(files),
        })
    }

    /// The chart's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Chart.yaml `name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Chart.yaml `version`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Chart.yaml `appVersion`.
    pub fn app_version(&self) -> Option<&str> {
        self.app_version.as_deref()
    }

    /// The defaults of `values.yaml`.
    pub fn default_values(&self) -> &Value {
        &self.values
    }

    /// A file of `.Files` (any file outside `templates/` but Chart.yaml, values.yaml and
    /// values.schema.json), by its path in the chart.
    pub fn file(&self, path: &str) -> Option<&str> {
        self.files.get(path).map(String::as_str)
    }

    /// The files in `templates/`, relative to the chart.
    pub fn template_files(&self) -> &[String] {
        &self.template_files
    }

    /// The values a render with `values_override` sees: merged over `values.yaml` and
    /// checked against `values.schema.json` ([`Error::Schema`] lists every violation).
    pub fn values(&self, values_override: &Value) -> Result<Value, Error> {
        let mut values = self.values.clone();
        merge_values(&mut values, values_override.clone());
        if let Some(schema) = &self.schema {
            let errors = schema.validate(&values);
            if !errors.is_empty() {
                return Err(Error::Schema(errors));
            }
        }
        Ok(values)
    }

    /// Renders the chart as `helm template` would.
    pub fn render(&self, options: &RenderOptions) -> Result<Rendered, Error> {
        let values = self.values(&options.values_override)?;
        let mut api_versions: Vec<String> =
            DEFAULT_API_VERSIONS.iter().map(|s| s.to_string()).collect();
        api_versions.extend(options.api_versions.iter().cloned());
        let map = |entries: Vec<(&str, Value)>| {
            Value::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            )
        };
        let (major, minor) = KUBE_VERSION;
        let kube = format!("v{major}.{minor}.0");
        let base = vec![
            ("Values", values),
            (
                "Release",
                map(vec![
                    ("Name", Value::str(&options.release_name)),
                    ("Namespace", Value::str(&options.namespace)),
                    ("Service", Value::str("Helm")),
                    ("IsInstall", Value::Bool(true)),
                    ("IsUpgrade", Value::Bool(false)),
                    ("Revision", Value::Int(1)),
                ]),
            ),
            ("Chart", self.metadata.clone()),
            (
                "Capabilities",
                map(vec![
                    ("APIVersions", Value::ApiVersions(Arc::new(api_versions))),
                    (
                        "KubeVersion",
                        map(vec![
                            ("Version", Value::str(&kube)),
                            ("GitVersion", Value::str(&kube)),
                            ("Major", Value::str(major.to_string())),
                            ("Minor", Value::str(minor.to_string())),
                        ]),
                    ),
                ]),
            ),
            ("Files", Value::Files(Arc::clone(&self.files))),
        ];

        let mut rendered = Rendered {
            crds: Vec::new(),
            documents: Vec::new(),
            notes: String::new(),
        };
        for (path, content) in self.files.iter() {
            if path.starts_with("crds/")
                && (path.ends_with(".yaml") || path.ends_with(".yml") || path.ends_with(".json"))
            {
                rendered.crds.extend(split_documents(path, content));
            }
        }
        for rel in &self.template_files {
            let base_name = rel.rsplit('/').next().unwrap_or(rel);
            if base_name.starts_with('_') {
                continue;
            }
            let name = format!("{}/{rel}", self.name);
            let mut dot = base.clone();
            dot.push((
                "Template",
                map(vec![
                    ("Name", Value::str(&name)),
                    ("BasePath", Value::str(format!("{}/templates", self.name))),
                ]),
            ));
            let out = self.templates.execute(&name, &map(dot))?;
            if rel == "templates/NOTES.txt" {
                rendered.notes = out;
            } else {
                rendered.documents.extend(split_documents(rel, &out));
            }
        }
        Ok(rendered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_split_on_separator_lines() {
        let docs = split_documents(
            "t.yaml",
            "\n# only a comment\n---\na: 1\n---   \n\n---\n\nb: 2\n  ---x\n--- # c\nc: 3\n",
        );
        let contents: Vec<_> = docs.iter().map(|d| d.content.as_str()).collect();
        assert_eq!(contents, ["a: 1\n", "b: 2\n  ---x\n", "# c\nc: 3\n"]);
        assert_eq!(docs[2].index, 2);
    }

    #[test]
    fn values_merge_deeply_and_null_removes() {
        let mut base = Value::from(json!({"a": {"b": 1, "c": [1, 2], "d": "x"}, "e": true}));
        merge_values(
            &mut base,
            Value::from(json!({"a": {"b": 2, "c": [3], "d": null, "new": {"k": 1}}})),
        );
        assert_eq!(
            base,
            Value::from(json!({"a": {"b": 2, "c": [3], "new": {"k": 1}}, "e": true}))
        );
    }

    #[test]
    fn helmignore_rules() {
        let ig = Ignore::parse("# c\n*.bak\n/docs/\n!keep.bak\nfiles/tmp/*\n");
        assert!(ig.ignored("a/x.bak", false));
        assert!(!ig.ignored("keep.bak", false));
        assert!(ig.ignored("docs", true));
        assert!(!ig.ignored("docs", false));
        assert!(ig.ignored("files/tmp/a", false));
        assert!(!ig.ignored("files/a", false));
    }
}
