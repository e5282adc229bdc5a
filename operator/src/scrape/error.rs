//! Why a replica contributed no sample this period.

use std::time::Duration;

/// A failed scrape. Each variant has a stable [`reason`](ScrapeError::reason) label, used
/// as the `reason` of `ballast_operator_scrape_errors_total`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScrapeError {
    /// No complete response (headers and body) within the per-target timeout.
    #[error("no complete response within {0:?}")]
    Timeout(Duration),
    /// The request could not be sent: refused or unreachable, DNS, TLS, a bad URL, or the
    /// connection dropped before a response.
    #[error("cannot reach the replica: {0}")]
    Connect(String),
    /// The replica answered with a status other than 2xx (redirects are not followed).
    #[error("HTTP status {0}")]
    HttpStatus(u16),
    /// The body is larger than the limit; reading stopped at the limit (or before any
    /// byte, when `Content-Length` already said so).
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// The body held no usable sample of the engine's dialect at all.
    #[error(
        "no usable sample in the body ({samples} samples of the dialect's families parsed, {errors} malformed lines or ambiguous series)"
    )]
    Parse {
        /// Samples of the families the dialect reads that the parser accepted (with
        /// unusable values); other families are not parsed.
        samples: usize,
        /// Rejected lines plus ambiguous series.
        errors: usize,
    },
    /// The connection failed while the body was being read.
    #[error("reading the body failed: {0}")]
    Body(String),
}

impl ScrapeError {
    /// Every value [`reason`](ScrapeError::reason) can return, so metrics can be
    /// initialised at zero.
    pub const REASONS: [&'static str; 6] = [
        "timeout",
        "connect",
        "http_status",
        "too_large",
        "parse",
        "body",
    ];

    /// A stable, low-cardinality label for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            ScrapeError::Timeout(_) => "timeout",
            ScrapeError::Connect(_) => "connect",
            ScrapeError::HttpStatus(_) => "http_status",
            ScrapeError::TooLarge { .. } => "too_large",
            ScrapeError::Parse { .. } => "parse",
            ScrapeError::Body(_) => "body",
        }
    }
}
