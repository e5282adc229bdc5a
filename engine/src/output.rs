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

use crate::core::StepOutput;
use crate::dispatcher::Dispatcher;
use crate::events::{RequestId, RequestStepOutput};
use crate::spans::{SpanExporter, TraceContext};
use crate::stats::timeline::{RequestTimeline, TokenSample};
use crate::stats::{IterationStats, StatLogger, StepStats};

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
    /// `None` with `--disable-log-stats`: no per-request stats are computed.
    timeline: Option<RequestTimeline>,
    /// Where the request's spans go, when tracing is on.
    trace: Option<TraceContext>,
}

/// Request id → handler channel and per-request stats state.
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
        timeline: Option<RequestTimeline>,
        trace: Option<TraceContext>,
    ) {
        self.lock().insert(
            id,
            Route {
                tx,
                rank,
                charged_tokens,
                timeline,
                trace,
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
    pub fn process(&mut self, step: StepOutput) {
        let wall_now = SystemTime::now();
        let mut it = IterationStats::default();
        {
            let mut routes = self.table.lock();
            for out in &step.outputs {
                let Some(route) = routes.get_mut(&out.id) else {
                    continue;
                };
                let Some(tl) = route.timeline.as_mut() else {
                    it.generation_tokens += out.new_token.is_some() as u64;
                    continue;
                };
                tl.on_events(&out.events);
                if let Some(c) = out.num_cached_tokens {
                    tl.num_cached_tokens = c;
                }
                if out.new_token.is_some() {
                    it.generation_tokens += 1;
                    match tl.on_token(step.new_tokens_ts, wall_now) {
                        TokenSample::First { ttft } => {
                            it.ttft.push(ttft.as_secs_f64());
                            it.prompt_tokens += tl.prompt_len as u64;
                            it.prompt_cached_tokens += tl.num_cached_tokens as u64;
                        }
                        TokenSample::Next { itl } => it.itl.push(itl.as_secs_f64()),
                    }
                }
                if let Some(reason) = out.finish {
                    let finished = tl.finish(reason, wall_now);
                    if let (Some(spans), Some(ctx)) = (&self.spans, &route.trace) {
                        spans.export(ctx, out.id, &self.model_name, tl, &finished);
                    }
                    it.finished.push(finished);
                }
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
        for out in &step.outputs {
            let Some(route) = routes.get(&out.id) else {
                continue;
            };
            // A handler that went away aborts its request through its guard; a failed send
            // here needs no action.
            let _ = route.tx.send(RequestUpdate {
                output: *out,
                step_ts: step.new_tokens_ts,
            });
            if out.finish.is_some() {
                let route = routes.remove(&out.id).expect("present");
                self.dispatcher.release(route.rank, route.charged_tokens);
            }
        }
    }
}
