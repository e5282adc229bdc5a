//! The limits one server holds its connections to.

use std::time::Duration;

/// A server's limits (docs/security.md says why each default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most connections open at once, as asked (the server lowers it to what the
    /// open-files limit allows: [`crate::effective_cap`]).
    pub max_connections: usize,
    /// From a connection's start, or the first byte of a later HTTP/1 request head, to the
    /// head's end.
    pub header_timeout: Duration,
    /// From a request's handler start to its body's end ([`crate::read_body`]).
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
