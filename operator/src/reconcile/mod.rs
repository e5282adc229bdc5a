//! The Kubernetes runtime (`ballast operator`): a kube-runtime `Controller` over
//! InferenceServices that runs each one's control loop in the cluster.
//!
//! A reconcile is a pipeline, one module and one typed function per step, in the order
//! they run, each taking the previous step's output:
//!
//! ```text
//! snapshot::read → validate::validate → plan::plan → build::objects → apply::apply → report::report
//!      Snapshot  →   Valid (or Invalid → report::invalid)  →  Plan  →  Built  →  Applied  →  ()
//! ```
//!
//! - [`snapshot`]: the service's Deployment, Service, PDB, ServiceMonitor and pods, read
//!   from the reflector stores ([`cache`]), each pod reduced to a [`snapshot::PodView`];
//! - [`validate`]: the CRD's rules and what only a cluster needs (an image); an invalid
//!   spec builds nothing and waits for a change, with a status that still counts its pods;
//! - [`plan`]: the shared control period ([`crate::period`]: scrape the ready pods on
//!   their IPs, aggregate, decide, record) when it is due, else the last decision; the
//!   replica count, rotation, deletion costs and DP weights that follow;
//! - [`build`]: the Deployment, Service, PDB and ServiceMonitor as plain values;
//! - [`apply`]: server-side apply of what differs from the snapshot (nothing when the spec
//!   is unchanged), deletion costs before a scale-down, rotation through the
//!   `ballast.dev/accepting` readiness gate, DP weights over each pod's control API with
//!   the service's control token ([`token`]: a Secret the operator owns, read each time);
//! - [`report`]: the status subresource, written only when it changed, Events, gauges.
//!
//! Below the steps, used by them and using none of them: [`context`] (what reconciles
//! share and what each service keeps), [`cache`] (the stores and the discovery cache),
//! [`names`] (what the operator writes into the cluster by name) and [`error`].

pub mod apply;
pub mod build;
pub mod cache;
pub mod context;
pub mod error;
pub mod gateway;
pub mod leader;
pub mod names;
mod pipeline;
pub mod plan;
pub mod rbac;
pub mod report;
mod run;
pub mod snapshot;
#[cfg(test)]
mod tests;
pub mod token;
pub mod validate;

pub use context::{Config, Context, ServiceState};
pub use error::Error;
pub use pipeline::{error_policy, reconcile};
pub use run::{OperatorArgs, OperatorError, run};
