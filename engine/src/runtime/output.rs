//! The output side of the engine (the compute layer of the metrics pipeline): routes each
//! step's per-request outputs to the waiting HTTP handlers, turns engine events and
//! timestamps into per-request intervals, and hands one [`StepStats`] per step to every
//! stat logger.
//!
//! One task owns this loop. Handlers register their request in the route table before the
//! request reaches a rank, so no output can arrive for an unknown request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::runtime::core::{RankHandles, StepOutput};
use crate::runtime::dispatcher::Dispatcher;
use crate::runtime::text::TextStream;
use crate::step::events::{FinishReason, RequestId};
use crate::telemetry::spans::{SpanExporter, TraceContext};
use crate::telemetry::stats::timeline::RequestTimeline;
use crate::telemetry::stats::{IterationStats, StatLogger, StepStats};

/// One update for a request's handler: what its request did in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestUpdate {
    /// Output text released in this step (possibly empty: held back for a stop string, or
    /// a token that ends the request).
    pub text: String,
    /// Generated tokens this update counts (0 or 1; a token after a stop-string match is
    /// never delivered).
    pub new_tokens: u32,
    /// Set on the request's last update.
    pub finish: Option<FinishReason>,
    /// Prompt tokens served from the prefix cache, on the update of its first scheduling.
    pub num_cached_tokens: Option<u32>,
}

/// What a handler registers for a request before it reaches a rank.
pub struct NewRoute {
    /// The rank the request goes to.
    pub rank: usize,
    /// Tokens charged to the rank by the dispatcher (released when the request ends).
    pub charged_tokens: u64,
    /// Where the request's updates go.
    pub tx: UnboundedSender<RequestUpdate>,
    /// The request's clocks and counts.
    pub timeline: RequestTimeline,
    /// Where the request's spans go, when tracing is on.
    pub trace: Option<TraceContext>,
    /// Its text: decoder and stop strings.
    pub text: TextStream,
}

struct Route {
    tx: UnboundedSender<RequestUpdate>,
    rank: usize,
    charged_tokens: u64,
    timeline: RequestTimeline,
    trace: Option<TraceContext>,
    text: TextStream,
}

/// Request id → handler channel and per-request stats state.
#[derive(Default)]
pub struct RouteTable {
    routes: Mutex<HashMap<RequestId, Route>>,
}

impl RouteTable {
    /// Registers a request before it is sent to its rank.
    pub fn register(&self, id: RequestId, r: NewRoute) {
        self.lock().insert(
            id,
            Route {
                tx: r.tx,
                rank: r.rank,
                charged_tokens: r.charged_tokens,
                timeline: r.timeline,
                trace: r.trace,
                text: r.text,
            },
        );
    }

    /// Removes a route without delivering anything.
    pub fn remove(&self, id: RequestId) -> bool {
        self.lock().remove(&id).is_some()
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

/// Consumes step outputs and feeds handlers and loggers.
pub struct OutputProcessor {
    /// Routes of live requests.
    pub table: Arc<RouteTable>,
    /// Released when a request finishes.
    pub dispatcher: Arc<Dispatcher>,
    /// Ends, on its rank, a request the output side finished (a stop string matched).
    pub ranks: RankHandles,
    /// Every consumer of the stats feed.
    pub loggers: Vec<Box<dyn StatLogger>>,
    /// How often loggers tick (log line, throughput decay); `None`: never.
    pub tick: Option<Duration>,
    /// Request traces, when `--otlp-traces-endpoint` is set.
    pub spans: Option<Arc<SpanExporter>>,
    /// `gen_ai.response.model` of the spans.
    pub model_name: String,
}

impl OutputProcessor {
    /// Runs until every rank is gone.
    pub async fn run(mut self, mut rx: UnboundedReceiver<StepOutput>) {
        let mut tick = self.tick.map(|d| {
            let mut i = tokio::time::interval(d);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        });
        loop {
            tokio::select! {
                step = rx.recv() => match step {
                    Some(step) => self.process(step),
                    None => {
                        // Every rank is gone (shutdown, or the core failed). Dropping the
                        // routes closes every handler's channel, so their requests end as
                        // aborted instead of waiting forever.
                        let orphans = std::mem::take(&mut *self.table.lock());
                        if !orphans.is_empty() {
                            tracing::error!(requests = orphans.len(), "engine core stopped with requests in flight");
                        }
                        return;
                    }
                },
                _ = async { tick.as_mut().expect("guarded").tick().await }, if tick.is_some() => {
                    let now = Instant::now();
                    for l in &mut self.loggers {
                        l.tick(now);
                    }
                }
            }
        }
    }

    /// Computes the step's stats, publishes them, then delivers the outputs. Loggers run
    /// first so whoever sees a token can rely on `/metrics` being at least that fresh.
    ///
    /// A request finishes here when its engine output says so, or when its text completes a
    /// stop string: then it is recorded as a `stop` finish at once, its route is removed so
    /// later tokens from the rank are neither counted nor sent, and the rank is told to
    /// drop it.
    pub fn process(&mut self, step: StepOutput) {
        let wall_now = SystemTime::now();
        let mut it = IterationStats::default();
        let mut updates: Vec<(RequestId, RequestUpdate)> = Vec::with_capacity(step.outputs.len());
        let mut stopped: Vec<RequestId> = Vec::new();
        {
            let mut routes = self.table.lock();
            for out in &step.outputs {
                let Some(route) = routes.get_mut(&out.id) else {
                    continue;
                };
                it.record_output(&mut route.timeline, out, step.new_tokens_ts, wall_now);
                let mut matched = false;
                let mut update = RequestUpdate {
                    finish: out.finish,
                    num_cached_tokens: out.num_cached_tokens,
                    ..RequestUpdate::default()
                };
                if let Some(token) = out.new_token {
                    update.new_tokens = 1;
                    let t = route
                        .text
                        .token(token, out.finish == Some(FinishReason::Stop));
                    update.text = t.text;
                    if t.stopped {
                        matched = true;
                        if out.finish.is_none() {
                            stopped.push(out.id);
                        }
                        update.finish = Some(FinishReason::Stop);
                    }
                }
                if out.finish.is_some() && !matched {
                    let t = route.text.finish();
                    update.text.push_str(&t.text);
                    if t.stopped {
                        update.finish = Some(FinishReason::Stop);
                    }
                }
                if let Some(reason) = update.finish {
                    let finished = it.record_finish(&route.timeline, reason, wall_now);
                    if let (Some(spans), Some(ctx)) = (&self.spans, &route.trace) {
                        spans.export(ctx, out.id, &self.model_name, &route.timeline, finished);
                    }
                }
                updates.push((out.id, update));
            }
        }
        let stats = StepStats {
            rank: step.rank,
            ts: step.new_tokens_ts,
            snapshot: &step.snapshot,
            counters: &step.counters,
            iteration: &it,
            dp: step.dp.as_ref().ok().and_then(Option::as_ref),
            residency: &step.residency,
        };
        for l in &mut self.loggers {
            l.record(&stats);
        }
        if let Err(e) = &step.dp {
            tracing::error!(rank = step.rank, step = step.step, error = %e, "invalid data-parallel statistics");
        }
        let mut routes = self.table.lock();
        for (id, update) in updates {
            let finished = update.finish.is_some();
            let Some(route) = routes.get(&id) else {
                continue;
            };
            // A handler that went away aborts its request through its guard; a failed send
            // here needs no action.
            let _ = route.tx.send(update);
            if finished {
                let route = routes.remove(&id).expect("present");
                self.dispatcher.release(route.rank, route.charged_tokens);
            }
        }
        drop(routes);
        if !stopped.is_empty() {
            self.ranks.abort_all(step.rank, &stopped);
        }
    }
}
