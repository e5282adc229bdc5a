//! ballast-helm's integration tests, one binary: a module per subject, the Helm set up once
//! for all of them in `common`.

mod chart;
mod common;
mod docs;
mod errors;
mod keda;
mod lint;
mod network_policy;
mod rbac;
mod schema;
mod setup;
