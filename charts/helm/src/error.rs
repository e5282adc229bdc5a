//! What can go wrong, one variant per cause a caller may want to tell apart.

use std::fmt;
use std::path::PathBuf;

/// Why Helm could not be set up or an action failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No Python with helm-python-sdk could be found or made: the venv could not be
    /// created, pip could not install the package, or `BALLAST_HELM_PYTHON` names a
    /// Python without it. The message says what to do.
    #[error("{0}")]
    Setup(String),
    /// Python ran but did not answer as `helm.py` does: it could not be started, it
    /// died, or its reply was not the JSON expected.
    #[error("{message}{}", stderr_tail(stderr))]
    Python {
        /// What went wrong.
        message: String,
        /// What the process wrote to stderr (Helm's own warnings included).
        stderr: String,
    },
    /// A chart folder or a kubeconfig given to an action does not exist.
    #[error("{what} {} does not exist", path.display())]
    Missing {
        /// `"chart"` or `"kubeconfig"`.
        what: &'static str,
        /// The path as given.
        path: PathBuf,
    },
    /// The values YAML is not a YAML mapping Helm can read.
    #[error("the values are not YAML Helm reads: {0}")]
    ValuesYaml(String),
    /// The values (coalesced over values.yaml) break values.schema.json. `message` is
    /// Helm's, one line per violation, each at its JSON pointer
    /// (`- at '/operator/replicas': got string, want integer`).
    #[error("the values break values.schema.json:\n{message}")]
    Schema {
        /// Helm's report.
        message: String,
        /// The same report, one entry per violation, by chart and path.
        violations: Vec<Violation>,
    },
    /// Helm refused the values for another reason than the schema.
    #[error("Helm refused the values: {0}")]
    Values(String),
    /// The chart does not load: no or a bad Chart.yaml, an unreadable file.
    #[error("the chart does not load: {0}")]
    Chart(String),
    /// A template failed: a parse error, `fail`, `required`, a nil pointer.
    #[error("{message}")]
    Render {
        /// The template Helm named (`ballast/templates/deployment.yaml`), when it did.
        template: Option<String>,
        /// Helm's message.
        message: String,
    },
    /// A rendered document is not a YAML mapping (so not a Kubernetes object).
    #[error("{template} (document {index}) is not a Kubernetes object: {message}")]
    Document {
        /// The template (or CRD file) it came from.
        template: String,
        /// Its position among that template's documents, from 0.
        index: usize,
        /// Why it did not read.
        message: String,
    },
    /// The cluster could not be reached, or the kubeconfig does not work.
    #[error("the cluster is unreachable: {0}")]
    Kube(String),
    /// An install, upgrade or uninstall failed in the cluster.
    #[error("the release failed: {0}")]
    Release(String),
    /// The release (or something else Helm looked up) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// An argument Helm refused: a release name that is not a DNS label, a bad version.
    #[error("Helm refused an argument: {0}")]
    InvalidArgument(String),
    /// Any other error Helm reported.
    #[error("Helm ({kind}): {message}")]
    Helm {
        /// helm-python-sdk's exception class.
        kind: String,
        /// Its message.
        message: String,
    },
}

fn stderr_tail(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        return String::new();
    }
    // The end of a traceback is where its cause is.
    let start = s.char_indices().rev().nth(3000).map_or(0, |(i, _)| i);
    format!("\nstderr:\n{}", &s[start..])
}

/// One violation of values.schema.json, as Helm reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The chart whose schema it breaks (`ballast`, or a subchart).
    pub chart: String,
    /// The JSON pointer of the value (`/operator/replicas`; `""` for the top level).
    pub path: String,
    /// What is wrong (`got string, want integer`).
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "/"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.message)
    }
}

/// The violations in Helm's schema report:
///
/// ```text
/// ballast:
/// - at '/operator': validation failed
///   - at '/operator/replicas': minimum: got 0, want 1
/// - at '': additional properties 'typo' not allowed
/// ```
///
/// Lines that only group others (`validation failed`) are not violations themselves.
pub(crate) fn parse_violations(report: &str) -> Vec<Violation> {
    let mut chart = String::new();
    let mut out = Vec::new();
    for line in report.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("- at '") {
            let Some((path, message)) = rest.split_once("': ") else {
                continue;
            };
            if message == "validation failed" {
                continue;
            }
            out.push(Violation {
                chart: chart.clone(),
                path: path.to_string(),
                message: message.to_string(),
            });
        } else if !line.starts_with(' ')
            && let Some(name) = trimmed.strip_suffix(':')
            && !name.contains(' ')
        {
            chart = name.to_string();
        }
    }
    out
}

/// The template an error of Helm's names: `... at (ballast/templates/x.yaml:3:4): ...`
/// or `template: ballast/templates/x.yaml:3:4: ...`.
pub(crate) fn template_of(message: &str) -> Option<String> {
    let after = if let Some((_, rest)) = message.split_once(" at (") {
        rest
    } else {
        message.split_once("template: ")?.1
    };
    let end = after.find(':')?;
    let path = &after[..end];
    (!path.is_empty() && !path.contains(' ')).then(|| path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_are_read_from_helms_report() {
        let report = "ballast:\n- at '/operator': validation failed\n  - at '/operator/replicas': minimum: got 0, want 1\n  - at '/operator/podAntiAffinity': value must be one of '', 'soft', 'hard'\n- at '': additional properties 'typo' not allowed\n";
        let v = parse_violations(report);
        let shown: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "/operator/replicas: minimum: got 0, want 1",
                "/operator/podAntiAffinity: value must be one of '', 'soft', 'hard'",
                "/: additional properties 'typo' not allowed",
            ]
        );
        assert!(v.iter().all(|v| v.chart == "ballast"));
        assert!(parse_violations("something else entirely").is_empty());
    }

    #[test]
    fn the_failing_template_is_named() {
        assert_eq!(
            template_of(
                "execution error at (ballast/templates/deployment.yaml:3:4): replicas must be 1"
            )
            .as_deref(),
            Some("ballast/templates/deployment.yaml")
        );
        assert_eq!(
            template_of("parse error at (c/templates/a.yaml:2): function \"nope\" not defined")
                .as_deref(),
            Some("c/templates/a.yaml")
        );
        assert_eq!(
            template_of("template: c/templates/a.yaml:10:15: executing ...").as_deref(),
            Some("c/templates/a.yaml")
        );
        assert_eq!(template_of("no template here"), None);
    }

    #[test]
    fn a_long_stderr_is_cut_to_its_end() {
        let long = format!("{}the cause", "x".repeat(10_000));
        let shown = Error::Python {
            message: "died".into(),
            stderr: long,
        }
        .to_string();
        assert!(shown.starts_with("died\nstderr:\n"));
        assert!(shown.ends_with("the cause"));
        assert!(shown.len() < 3100);
    }
}
