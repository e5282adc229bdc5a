//! The error type returned by [`crate::run`].

use std::path::PathBuf;

/// Why a benchmark could not run (or could not save its results).
///
/// Individual request failures are *not* errors: they are counted in the
/// [`crate::Report`]. These variants are for problems the user has to fix.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag (or its `BALLAST_BENCH_*` variable) has an unusable value.
    #[error("invalid value {value:?} for {flag}: {reason}")]
    InvalidArg {
        /// The flag, e.g. `--input-len`.
        flag: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// No HTTP connection could be made to the server.
    #[error("cannot reach server at {url}: {reason} (is it running, and is --url right?)")]
    Unreachable {
        /// The URL that was tried.
        url: String,
        /// The underlying connection error.
        reason: String,
    },
    /// `--model` was omitted and the server did not list a model.
    #[error("could not discover a model from {url}: {reason}; pass --model NAME")]
    ModelDiscovery {
        /// The `/v1/models` URL that was queried.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The HTTP client could not be set up (e.g. TLS initialisation failed).
    #[error("cannot create HTTP client: {0}")]
    Client(String),
    /// The `--json` report could not be written.
    #[error("cannot write JSON report to {}: {source}", path.display())]
    WriteJson {
        /// The `--json` path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl BenchError {
    pub(crate) fn invalid(flag: &'static str, value: impl ToString, reason: impl ToString) -> Self {
        BenchError::InvalidArg {
            flag,
            value: value.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// Formats an error with its whole `source()` chain: reqwest's top-level
/// messages ("error sending request") hide the useful part ("connection
/// refused") one or two levels down.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !msg.contains(&part) {
            msg.push_str(": ");
            msg.push_str(&part);
        }
        source = s.source();
    }
    msg
}
