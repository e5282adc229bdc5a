//! The output side of the engine: routes each step's per-request outputs to the waiting
//! HTTP handlers and feeds the step's snapshot to the metrics.
//!
//! One task owns this loop, so per-request bookkeeping needs no locks beyond the route
//! table that handlers register in before their request reaches a rank.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::core::StepOutput;
use crate::dispatcher::Dispatcher;
use crate::events::{RequestId, RequestStepOutput};
use crate::metrics::EngineMetrics;

/// One update for a request's handler.
#[derive(Debug, Clone, Copy)]
pub struct RequestUpdate {
    /// What the request did in the step.
    pub output: RequestStepOutput,
    /// The step's NEW_TOKENS time.
    pub step_ts: Instant,
}

struct Route {
    tx: UnboundedSender<RequestUpdate>,
    rank: usize,
    charged_tokens: u64,
}

/// Request id → handler channel.
#[derive(Default)]
pub struct RouteTable {
    routes: Mutex<HashMap<RequestId, Route>>,
}

impl RouteTable {
    /// Registers a request before it is sent to `rank`.
    pub fn register(
        &self,
        id: RequestId,
        rank: usize,
        charged_tokens: u64,
        tx: UnboundedSender<RequestUpdate>,
    ) {
        self.lock().insert(
            id,
            Route {
                tx,
                rank,
                charged_tokens,
            },
        );
    }

    /// Every routed request and its rank.
    pub fn ids(&self) -> Vec<(RequestId, usize)> {
        self.lock().iter().map(|(&id, r)| (id, r.rank)).collect()
    }

    /// Requests with a live route.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no request is routed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RequestId, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Consumes step outputs until every rank is gone.
pub async fn route_outputs(
    mut rx: UnboundedReceiver<StepOutput>,
    table: Arc<RouteTable>,
    dispatcher: Arc<Dispatcher>,
    metrics: EngineMetrics,
) {
    while let Some(step) = rx.recv().await {
        // Gauges first: whoever sees a token can rely on metrics being at least this fresh.
        metrics.observe_snapshot(step.rank, &step.snapshot);
        {
            let mut routes = table.lock();
            for out in &step.outputs {
                let done = out.finish.is_some();
                let Some(route) = routes.get(&out.id) else {
                    continue;
                };
                // A handler that went away aborts its request through its guard; a failed
                // send here needs no action.
                let _ = route.tx.send(RequestUpdate {
                    output: *out,
                    step_ts: step.new_tokens_ts,
                });
                if done {
                    let route = routes.remove(&out.id).expect("present");
                    dispatcher.release(route.rank, route.charged_tokens);
                }
            }
        }
        if let Err(e) = &step.dp {
            tracing::error!(rank = step.rank, step = step.step, error = %e, "invalid data-parallel statistics");
        }
    }
}
