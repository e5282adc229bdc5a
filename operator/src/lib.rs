//! The Ballast control plane.
//!
//! `scrape` turns replicas' Prometheus expositions (in the ballast, vLLM or SGLang
//! dialect) into [`signals`]; `decide` is a pure function from (spec, signals, history,
//! now) to a decision with its explanation; [`period`] is one control period (scrape →
//! aggregate → decide → record), the same for both runtimes, which act on its decisions:
//! [`local`] runs the whole loop on one machine with engine processes on loopback,
//! [`reconcile`] is the Kubernetes controller.

pub mod control;
pub mod decide;
pub mod engine_args;
pub mod inspect;
pub mod keda;
pub mod labels;
pub mod local;
pub mod metrics;
pub mod metrics_api;
pub mod period;
pub mod reconcile;
pub mod scrape;
pub mod signals;
pub mod status;

/// Limits of the operator's own small HTTP servers (`ballast operator`'s metrics and health
/// port, `ballast local`'s admin port), which answer GETs of scrapers, probes and a
/// browser: few connections, short waits.
pub const ADMIN_HTTP_LIMITS: ballast_serve::HttpLimits = ballast_serve::HttpLimits {
    max_connections: 256,
    header_timeout: std::time::Duration::from_secs(10),
    body_timeout: std::time::Duration::from_secs(10),
    idle_timeout: std::time::Duration::from_secs(60),
};
