//! Renders the Ballast Helm chart (`charts/ballast`) without Helm, so that tests can check
//! what a `helm install` would create.
//!
//! It implements Go's text/template for the subset charts use — actions with `{{-`/`-}}`
//! trimming, comments, field chains, variables, `if`/`else if`/`else`, `with`, `range`
//! over lists, maps (in key order) and integers with `break`/`continue`, `define`,
//! `template`, `block`, `include`, pipelines and parenthesized calls — with Helm's
//! built-in objects (`.Values`, `.Release`, `.Chart`, `.Capabilities`, `.Files`,
//! `.Template`) and the functions listed in [`FUNCTIONS`]. Values are merged over
//! `values.yaml` and validated against `values.schema.json` first, as Helm does.
//!
//! Errors name the template file and line; nothing a template or a values file contains
//! makes it panic.
//!
//! ```no_run
//! use ballast_chart::{Chart, RenderOptions};
//!
//! let chart = Chart::load("charts/ballast")?;
//! let out = chart.render(
//!     &RenderOptions::new("ballast", "ballast-system")
//!         .values(serde_json::json!({"operator": {"replicas": 3}}))
//!         .api_version("monitoring.coreos.com/v1"),
//! )?;
//! for doc in &out.documents {
//!     println!("# {}\n{}", doc.source, doc.content);
//! }
//! # Ok::<(), ballast_chart::Error>(())
//! ```

#![warn(missing_docs)]

mod chart;
mod exec;
mod funcs;
mod lex;
mod parse;
mod schema;
mod value;
mod yaml;

use std::path::PathBuf;

pub use chart::{
    Chart, DEFAULT_API_VERSIONS, Document, KUBE_VERSION, RenderOptions, Rendered, merge_values,
    split_documents,
};
pub use exec::{MAX_CALL_DEPTH, MAX_RANGE, Templates};
pub use schema::Schema;
pub use value::Value;
pub use yaml::{to_json, to_yaml};

/// The functions templates may call: Go's builtins, then the Sprig and Helm ones.
pub const FUNCTIONS: &[&str] = &[
    "and",
    "or",
    "not",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "len",
    "index",
    "print",
    "printf",
    "println",
    "default",
    "empty",
    "quote",
    "squote",
    "toYaml",
    "toJson",
    "toString",
    "indent",
    "nindent",
    "trim",
    "trunc",
    "trimSuffix",
    "list",
    "dict",
    "hasKey",
    "required",
    "fail",
    "b64enc",
    "base",
    "int",
    "include",
    "contains",
    "replace",
    "lower",
];

/// Why a chart did not load or render.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Chart.yaml, values.yaml, values.schema.json or a rendered document is not what it
    /// must be.
    #[error("{file}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// A template does not parse: a syntax error, an unknown function, an undefined
    /// variable, a missing `{{end}}`.
    #[error("{template}:{line}: parse error: {message}")]
    Parse {
        /// The template's name (`ballast/templates/deployment.yaml`).
        template: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A template failed while rendering: `fail`, `required`, a nil pointer, a function
    /// called with the wrong types.
    #[error("{template}:{line}: {message}")]
    Exec {
        /// The file the failing action is in.
        template: String,
        /// 1-based line of the action.
        line: usize,
        /// What happened.
        message: String,
    },
    /// The values break values.schema.json: one message per violation, each naming the
    /// value's path (`operator.replicas: -1 is less than the minimum 1`).
    #[error("values do not match values.schema.json:\n{}", .0.join("\n"))]
    Schema(Vec<String>),
}
