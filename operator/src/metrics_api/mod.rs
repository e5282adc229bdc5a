//! `custom.metrics.k8s.io` and `external.metrics.k8s.io`, served by `ballast operator`
//! through the API server's aggregation layer, so that a HorizontalPodAutoscaler (or KEDA,
//! which drives one) scales on exactly the signals the operator decides on.
//!
//! ```text
//! reconcile (leader) ─▶ Board (last control period per service) ◀─ server: TLS → authn → authz → api
//! ```
//!
//! - [`values`]: the [`Board`](values::Board) of each service's last control period, and
//!   what makes a value absent;
//! - [`api`]: paths, discovery, `Status` failures and the metric lists, pure;
//! - [`selector`]: label selectors;
//! - [`tls`]: the serving certificate and which CA a client certificate chains to;
//! - [`certs`]: the CA and serving certificate the operator keeps in a Secret itself, and
//!   the APIServices' `caBundle`;
//! - [`auth`]: authentication (front proxy, client certificates, TokenReview) and
//!   authorization (SubjectAccessReview), cached;
//! - [`server`]: the flags, the accept loop and each request's way through the above.

pub mod api;
pub mod auth;
pub mod certs;
pub mod selector;
pub mod server;
pub mod tls;
pub mod values;
