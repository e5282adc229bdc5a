//! Why a reconcile failed, each with a stable category for metrics and the backoff. Below
//! the steps: each returns these.

use std::time::Duration;

/// A failed reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// The resource cannot be turned into objects (it was not read from the API server).
    #[error(transparent)]
    Build(#[from] BuildError),
    /// An object could not be serialized (a bug).
    #[error("cannot serialize {what}: {source}")]
    Serialize {
        /// Which object.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
}

impl Error {
    /// A stable, low-cardinality label (`ballast_operator_reconcile_errors_total{category}`).
    pub fn category(&self) -> &'static str {
        match self {
            Error::Api(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Api(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Error::Api(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => "invalid",
            Error::Api(kube::Error::Api(s)) if s.code == 404 => "not_found",
            Error::Api(kube::Error::Api(_)) => "api",
            Error::Api(_) => "transport",
            Error::Build(_) => "build",
            Error::Serialize { .. } => "internal",
        }
    }

    /// The first retry delay of this category; it doubles with each failure in a row up to
    /// [`MAX_BACKOFF`]. A conflict is someone else's write and usually clears at once; an
    /// unreachable API server or a refused object needs longer.
    pub fn base_backoff(&self) -> Duration {
        match self.category() {
            "conflict" => Duration::from_millis(200),
            "transport" | "api" | "not_found" => Duration::from_secs(1),
            "forbidden" | "invalid" => Duration::from_secs(10),
            _ => Duration::from_secs(5),
        }
    }
}

/// Why the objects cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The resource has no name, namespace or uid (not read from the API server).
    #[error("the InferenceService has no {0}")]
    Incomplete(&'static str),
    /// No image for the engine container.
    #[error(
        "spec.engine.image is required for engine.kind {0} (the operator has a default only for ballast)"
    )]
    NoImage(&'static str),
    /// `spec.gateway.enabled` without `spec.gateway.image` or the operator's
    /// `--engine-image`.
    #[error(
        "spec.gateway.image is required: the operator has no --engine-image to run the picker (ballast gateway) with"
    )]
    NoGatewayImage,
    /// An object could not be turned into JSON (a bug).
    #[error("cannot serialize {0}")]
    Unserializable(String),
    /// A certificate could not be made (the system's random generator failed, say).
    #[error("{0}")]
    Certificate(String),
}

/// The longest retry delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The delay before retry number `failures` (1 for the first) of `base`.
pub fn backoff(base: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_stops_at_the_cap() {
        let b = Duration::from_secs(1);
        assert_eq!(backoff(b, 1), Duration::from_secs(1));
        assert_eq!(backoff(b, 2), Duration::from_secs(2));
        assert_eq!(backoff(b, 4), Duration::from_secs(8));
        assert_eq!(backoff(b, 40), MAX_BACKOFF);
    }

    #[test]
    fn api_errors_have_categories() {
        let api = |code| {
            Error::Api(kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert_eq!(api(409).category(), "conflict");
        assert_eq!(api(403).category(), "forbidden");
        assert_eq!(api(422).category(), "invalid");
        assert_eq!(api(500).category(), "api");
        assert!(api(409).base_backoff() < api(403).base_backoff());
    }
}
