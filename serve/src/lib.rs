//! The HTTP accept loop every Ballast server runs: the engine's OpenAI port, the
//! operator's metrics and health port, and `ballast local`'s router and admin port. One
//! implementation, so that each has the same defences: a cap on open connections that a
//! flood of slow clients cannot use to lock out a normal one, header and idle timeouts
//! ([`Connections`], whose module docs give the rules), a bound on the request head
//! ([`MAX_HEAD_BYTES`]), and bodies read within a size and a time ([`read_body`]).
//!
//! It knows nothing of what it serves: an axum `Router` and an [`HttpLimits`].

mod body;
mod conn;
mod files;

use std::time::Duration;

pub use body::{BodyError, read_body};
pub use conn::{Accept, BoxFuture, Connections, MAX_HEAD_BYTES};
pub use files::{FD_RESERVE, effective_cap, open_files_limit, raise_open_files_limit};

/// A server's limits (docs/security.md says why each default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most connections open at once, as asked (the server lowers it to what the
    /// open-files limit allows: [`effective_cap`]).
    pub max_connections: usize,
    /// From a connection's start, or the first byte of a later HTTP/1 request head, to the
    /// head's end.
    pub header_timeout: Duration,
    /// From a request's handler start to its body's end ([`read_body`]).
    pub body_timeout: Duration,
    /// A connection with no request in flight that sends nothing is closed after this.
    pub idle_timeout: Duration,
}

impl Default for HttpLimits {
    /// The engine's defaults: 4,096 connections, 10 s for a head, 60 s for a body, 120 s
    /// idle.
    fn default() -> Self {
        HttpLimits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
        }
    }
}
