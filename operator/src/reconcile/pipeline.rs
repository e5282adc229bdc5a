//! One reconcile of one InferenceService: the steps of the module docs, in order, and
//! what happens when one fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ballast_crds::InferenceService;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::context::{Context, ServiceState};
use super::error::{self, Error};
use super::{apply, build, plan, report, snapshot, validate};

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
