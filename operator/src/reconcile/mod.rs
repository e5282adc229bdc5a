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
pub mod leader;
pub mod names;
pub mod plan;
pub mod rbac;
pub mod report;
mod run;
pub mod snapshot;
#[cfg(test)]
mod tests;
pub mod token;
pub mod validate;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_crds::InferenceService;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

pub use context::{Config, Context, ServiceState};
pub use error::Error;
pub use run::{OperatorArgs, OperatorError, run};

/// The soonest a reconcile is requeued for the next period.
const MIN_REQUEUE: Duration = Duration::from_millis(100);

/// Reconciles one InferenceService (see the module docs for the steps).
pub async fn reconcile(isvc: Arc<InferenceService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = isvc.namespace().unwrap_or_default();
    let name = isvc.name_any();
    if isvc.metadata.deletion_timestamp.is_some() {
        // Owner references garbage-collect every owned object.
        ctx.forget(&ns, &name);
        return Ok(Action::await_change());
    }
    let state = ctx.state(&ns, &name);
    let mut state = state.lock().await;
    match pipeline(&isvc, &ctx, &mut state).await {
        Ok(action) => {
            state.failures = 0;
            Ok(action)
        }
        Err(e) => {
            state.failures += 1;
            if state.failures == 1 {
                ctx.event(
                    &isvc,
                    EventType::Warning,
                    "ReconcileFailed",
                    format!("{} ({})", e, e.category()),
                )
                .await;
            }
            Err(e)
        }
    }
}

/// The steps, in order.
async fn pipeline(
    isvc: &InferenceService,
    ctx: &Context,
    state: &mut ServiceState,
) -> Result<Action, Error> {
    let snapshot = snapshot::read(&ctx.cache, isvc).await?;
    let valid = match validate::validate(isvc, &ctx.config.default_engine_image, snapshot) {
        Ok(valid) => valid,
        Err(invalid) => {
            let recheck = invalid.recheck();
            report::invalid(ctx, *invalid).await?;
            return Ok(recheck.map_or_else(Action::await_change, Action::requeue));
        }
    };
    state
        .period
        .set_scrape_key(valid.snapshot.api_keys.scrape_key());
    let plan = plan::plan(ctx, state, valid).await;
    let built = build::objects(plan, &ctx.config.default_engine_image)?;
    let applied = apply::apply(ctx, state, built).await?;
    report::report(ctx, applied).await?;
    let next = state.period.until_due(Instant::now());
    Ok(Action::requeue(next.max(MIN_REQUEUE)))
}

/// After a failed reconcile: count it by category and retry with a backoff that doubles
/// per failure in a row, starting from the category's base.
pub fn error_policy(isvc: Arc<InferenceService>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = isvc.name_any();
    let ns = isvc.namespace().unwrap_or_default();
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[&ns, &name, error.category()])
        .inc();
    let failures = ctx
        .state(&ns, &name)
        .try_lock()
        .map_or(1, |s| s.failures.max(1));
    let delay = error::backoff(error.base_backoff(), failures);
    tracing::warn!(target: "ballast::operator", namespace = %ns, service = %name, category = error.category(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
