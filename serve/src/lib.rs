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
mod limits;

pub use body::{BodyError, read_body};
pub use conn::{Accept, BoxFuture, Connections, MAX_HEAD_BYTES};
pub use files::{FD_RESERVE, effective_cap, open_files_limit, raise_open_files_limit};
pub use limits::HttpLimits;
