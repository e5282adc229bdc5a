//! The engine handle the HTTP frontend uses: admission, dispatch, per-request streams,
//! draining and shutdown around the rank threads of [`crate::runtime::core`].

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};

use crate::compute::backend::Backend;
use crate::compute::backend::cpu::CpuBackend;
use crate::compute::device::ComputeBackend;
use crate::compute::executor::cuda_graphs::GraphExecutor;
use crate::compute::executor::{Executor, ModelExecutor};
use crate::compute::model::{LlamaModel, LlamaWeights, ModelSource};
use crate::compute::sampling::SamplingParams;
use crate::compute::tokenizer::{ByteTokenizer, Tokenizer};
use crate::config::EngineConfig;
use crate::runtime::admission::{AdmissionLedger, RejectReason};
use crate::runtime::core::{RankCommand, RankHandles, RankWorker};
use crate::runtime::dispatcher::Dispatcher;
use crate::runtime::dp::DpGroup;
use crate::runtime::output::{NewRoute, OutputProcessor, RequestUpdate, RouteTable};
use crate::runtime::scheduler::{EngineRequest, Scheduler};
use crate::runtime::tenants::{Tenant, TenantLedger};
use crate::runtime::text::TextStream;
use crate::step::events::RequestId;
use crate::telemetry::metrics::{EngineMetrics, MetricsConfig};
use crate::telemetry::spans::{SpanExporter, TraceContext};
use crate::telemetry::stats::board::ControlBoard;
use crate::telemetry::stats::timeline::RequestTimeline;
use ballast_rng::SplitMix64;

/// A request as the frontend submits it: tokenized and validated.
#[derive(Debug, Clone)]
pub struct Submission {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling and stop parameters.
    pub sampling: SamplingParams,
    /// Stop strings (not included in the output).
    pub stop: Vec<String>,
    /// Tenant for the running cap.
    pub tenant: Option<Tenant>,
    /// Frontend wall clock when the HTTP request arrived (before tokenization).
    pub arrival: SystemTime,
    /// Monotonic clock read together with `arrival`.
    pub arrival_instant: Instant,
    /// Where the request's spans go (when tracing is on).
    pub trace: Option<TraceContext>,
    /// The data-parallel rank asked for (the `X-Data-Parallel-Rank` header a gateway that
    /// picks ranks sends); `None`: the dispatcher picks. Out of range is `TooLarge` (400).
    pub rank: Option<usize>,
}

/// Why a submission was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The server is draining (SIGTERM): HTTP 503.
    #[error("the server is draining and accepts no new requests")]
    Draining,
    /// Over an admission limit: HTTP 429.
    #[error("{0}")]
    Rejected(RejectReason),
    /// The engine core stopped: HTTP 503.
    #[error("the engine core is not running")]
    CoreStopped,
    /// Larger than an admission limit even with an empty queue: HTTP 400, retrying cannot
    /// help.
    #[error("{0}")]
    TooLarge(String),
}

/// Where the process is in its shutdown (SIGTERM), as the HTTP server drives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ShutdownPhase {
    /// No shutdown signal yet.
    Running = 0,
    /// Signalled, inside `--shutdown-delay`: still admitting, but every HTTP/1 response
    /// says `Connection: close` and `/health` answers 503 `terminating`.
    Delaying = 1,
    /// Draining for good: new requests get 503, in-flight ones finish; the control API's
    /// `Resume` cannot undo it.
    Draining = 2,
}

struct Inner {
    config: EngineConfig,
    tokenizer: Arc<dyn Tokenizer>,
    /// The tokenizer's end-of-sequence ids, shared by every request.
    eos_token_ids: Arc<[u32]>,
    ranks: RankHandles,
    dispatcher: Arc<Dispatcher>,
    admission: Arc<AdmissionLedger>,
    tenants: Arc<TenantLedger>,
    routes: Arc<RouteTable>,
    metrics: Arc<EngineMetrics>,
    spans: Option<Arc<SpanExporter>>,
    board: Arc<ControlBoard>,
    next_id: AtomicU64,
    draining: AtomicBool,
    /// A [`ShutdownPhase`] as its `u8`.
    shutdown: AtomicU8,
    in_flight: watch::Sender<usize>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The model of `config` on `backend`, and its tokenizer.
fn build_model<B: Backend + Clone>(
    config: &EngineConfig,
    backend: B,
) -> (LlamaModel<B>, Arc<dyn Tokenizer>) {
    match &config.source {
        ModelSource::Synthetic => (
            LlamaModel::synthetic(config.model.clone(), backend, config.seed),
            Arc::new(ByteTokenizer),
        ),
        ModelSource::Gguf {
            tensors, tokenizer, ..
        }
        | ModelSource::Safetensors {
            tensors, tokenizer, ..
        } => {
            let weights = LlamaWeights::upload(&backend, &config.model, (**tensors).clone());
            let model = LlamaModel::new(config.model.clone(), backend, Arc::new(weights));
            (model, tokenizer.clone())
        }
    }
}

/// One executor (with its own KV cache) per rank, made by `executor` from the model.
fn per_rank<B: Backend + Clone, E: Executor + 'static>(
    config: &EngineConfig,
    model: &LlamaModel<B>,
    executor: impl Fn(LlamaModel<B>, usize, usize) -> E,
) -> Vec<Box<dyn Executor>> {
    let s = config.scheduler;
    (0..config.data_parallel_size)
        .map(|_| Box::new(executor(model.clone(), s.num_blocks, s.block_size)) as Box<dyn Executor>)
        .collect()
}

/// Tells glibc's allocator to serve large buffers from its heaps and keep freed memory, rather
/// than map each large buffer afresh and unmap it when freed. A CPU step allocates buffers of
/// megabytes (logits, attention scratch, activations of a batch) and frees them at its end; as
/// fresh mappings each page of them faulted in and was zeroed on every step, which a profile
/// of 16 concurrent streams showed as about 4 % of the engine's time (page faults, page
/// clearing, unmapping; docs/benchmarks.md). Skipped where the user set glibc's own
/// `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_`, and on other C libraries.
fn keep_large_buffers_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
            || std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some()
        {
            return;
        }
        // SAFETY: mallopt only changes allocator parameters; it is called before the ranks'
        // threads start allocating step buffers.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        }
    }
}

/// A running engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Builds the model on `backend` (the configured device, opened:
    /// [`ComputeBackend::open`]) and starts one thread per rank. Must be called inside a
    /// tokio runtime (the output router is a task).
    pub fn start(config: EngineConfig, backend: ComputeBackend) -> Engine {
        if let Some(n) = config.cpu_threads {
            // Only the first engine of a process can size the global pool; later ones share it.
            let _ = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build_global();
        }
        let (executors, tokenizer) = match &backend {
            ComputeBackend::Cpu => {
                keep_large_buffers_mapped();
                let (model, tokenizer) = build_model(&config, CpuBackend);
                if let ModelSource::Gguf { file, .. } = &config.source
                    && crate::compute::backend::quant::panel_kernel_available()
                {
                    // Every quantized matrix now lives in its repacked copy.
                    file.release_resident_pages();
                }
                (per_rank(&config, &model, ModelExecutor::new), tokenizer)
            }
            ComputeBackend::Cuda { backend, graphs } => {
                let (model, tokenizer) = build_model(&config, backend.clone());
                let executors = if *graphs {
                    per_rank(&config, &model, GraphExecutor::new)
                } else {
                    per_rank(&config, &model, ModelExecutor::new)
                };
                (executors, tokenizer)
            }
        };
        Self::start_with(config, executors, tokenizer)
    }

    /// Starts ranks over the given executors (one per rank), e.g. a no-op executor to
    /// measure scheduling alone.
    pub fn start_with(
        config: EngineConfig,
        executors: Vec<Box<dyn Executor>>,
        tokenizer: Arc<dyn Tokenizer>,
    ) -> Engine {
        let n = config.data_parallel_size;
        assert_eq!(executors.len(), n, "one executor per rank");
        let group = Arc::new(DpGroup::new(n));
        let dispatcher = Arc::new(Dispatcher::new(config.dispatch_policy, n));
        let admission = Arc::new(AdmissionLedger::new(config.admission));
        let tenants = Arc::new(TenantLedger::new(config.max_running_per_tenant));
        let routes = Arc::new(RouteTable::default());
        let s = config.scheduler;
        let metrics = Arc::new(EngineMetrics::new(&MetricsConfig::for_engine(&config)));
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let mut inboxes = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for (rank, executor) in executors.into_iter().enumerate() {
            let (tx, rx) = std::sync::mpsc::channel();
            inboxes.push(tx);
            let mut scheduler = Scheduler::new(s, Arc::clone(&tenants), Arc::clone(&admission));
            if let Some(rate) = config.stats.kv_residency_sample {
                scheduler.track_kv_residency(rate, config.seed ^ rank as u64);
            }
            let worker = RankWorker {
                rank,
                scheduler,
                executor,
                inbox: rx,
                group: Arc::clone(&group),
                outputs: out_tx.clone(),
            };
            let handle = std::thread::Builder::new()
                .name(format!("ballast-rank-{rank}"))
                .spawn(move || worker.run())
                .expect("spawn rank thread");
            threads.push(handle);
        }
        drop(out_tx);
        let ranks = RankHandles::new(inboxes, group);
        let st = &config.stats;
        let board = ControlBoard::new(n, config.scheduler.num_blocks);
        let loggers =
            crate::telemetry::stats::engine_loggers(&config, &metrics, &board, Instant::now());
        let spans = st.otlp_traces_endpoint.as_deref().and_then(|url| {
            match SpanExporter::new(url, "ballast-engine") {
                Ok(e) => Some(Arc::new(e)),
                Err(e) => {
                    tracing::error!(error = %e, "request tracing is off");
                    None
                }
            }
        });
        let processor = OutputProcessor {
            table: Arc::clone(&routes),
            dispatcher: Arc::clone(&dispatcher),
            ranks: ranks.clone(),
            loggers,
            tick: Some(st.log_interval),
            spans: spans.clone(),
            model_name: config.served_model_name.clone(),
        };
        tokio::spawn(processor.run(out_rx));
        Engine {
            inner: Arc::new(Inner {
                config,
                eos_token_ids: tokenizer.eos_token_ids().into(),
                tokenizer,
                ranks,
                dispatcher,
                admission,
                tenants,
                routes,
                metrics,
                spans,
                board,
                next_id: AtomicU64::new(1),
                draining: AtomicBool::new(false),
                shutdown: AtomicU8::new(ShutdownPhase::Running as u8),
                in_flight: watch::Sender::new(0),
                threads: Mutex::new(threads),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &dyn Tokenizer {
        &*self.inner.tokenizer
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.inner.metrics
    }

    /// Whether requests are traced (`--otlp-traces-endpoint`).
    pub fn tracing_enabled(&self) -> bool {
        self.inner.spans.is_some()
    }

    /// The metrics registry, shared.
    pub fn metrics_arc(&self) -> &Arc<EngineMetrics> {
        &self.inner.metrics
    }

    /// The DP dispatcher (weights can be changed at run time).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.inner.dispatcher
    }

    /// The admission ledger.
    pub fn admission(&self) -> &AdmissionLedger {
        &self.inner.admission
    }

    /// The tenant ledger.
    pub fn tenants(&self) -> &TenantLedger {
        &self.inner.tenants
    }

    /// Requests submitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        *self.inner.in_flight.borrow()
    }

    /// Submits requests that must be admitted together (the choices of one HTTP request):
    /// all are admitted or none is. Each gets its own stream.
    pub fn submit(&self, subs: Vec<Submission>) -> Result<Vec<RequestStream>, SubmitError> {
        let inner = &self.inner;
        if inner.draining.load(Ordering::SeqCst) {
            return Err(SubmitError::Draining);
        }
        if !self.core_alive() {
            return Err(SubmitError::CoreStopped);
        }
        let ranks = inner.config.data_parallel_size;
        if let Some(rank) = subs.iter().find_map(|s| s.rank.filter(|&r| r >= ranks)) {
            return Err(SubmitError::TooLarge(format!(
                "data-parallel rank {rank} does not exist: this engine has {ranks} (0 to {})",
                ranks - 1
            )));
        }
        let tokens = subs.iter().map(|s| s.prompt.len()).sum();
        if let Some(why) = inner.admission.never_admissible(subs.len(), tokens) {
            return Err(SubmitError::TooLarge(why));
        }
        if let Err(reason) = inner.admission.try_admit(subs.len(), tokens) {
            inner.metrics.observe_rejection(reason);
            return Err(SubmitError::Rejected(reason));
        }
        let mut streams = Vec::with_capacity(subs.len());
        let mut pending = subs.into_iter();
        while let Some(sub) = pending.next() {
            let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
            let charged = (sub.prompt.len() + sub.sampling.max_tokens as usize) as u64;
            let rank = match sub.rank {
                Some(rank) => {
                    inner.dispatcher.charge(rank, charged);
                    rank
                }
                None => inner.dispatcher.assign(charged),
            };
            let (tx, rx) = mpsc::unbounded_channel();
            // The timeline is kept even with --disable-log-stats: the counters (prompt
            // tokens by source, finishes by reason) need it; only histograms are off.
            let timeline = RequestTimeline::new(
                sub.arrival,
                sub.arrival_instant,
                sub.prompt.len() as u32,
                sub.sampling.max_tokens,
            );
            inner.routes.register(
                id,
                NewRoute {
                    rank,
                    charged_tokens: charged,
                    tx,
                    timeline,
                    trace: sub.trace,
                    text: TextStream::new(inner.tokenizer.stream_decoder(), sub.stop),
                },
            );
            inner.in_flight.send_modify(|n| *n += 1);
            let rng_seed = match sub.sampling.seed {
                Some(seed) => seed,
                None => SplitMix64::derive(inner.config.seed, id).next_u64(),
            };
            let prompt_len = sub.prompt.len();
            let req = EngineRequest {
                id,
                prompt: sub.prompt,
                sampling: sub.sampling,
                rng_seed,
                tenant: sub.tenant,
                eos_token_ids: Arc::clone(&inner.eos_token_ids),
            };
            let mut stream = RequestStream {
                id,
                rx,
                guard: StreamGuard {
                    engine: self.clone(),
                    id,
                    rank,
                    finished: false,
                },
            };
            if !inner.ranks.send(rank, RankCommand::Add(req)) {
                // The rank is gone: undo this request and release what the unsent ones
                // were charged. Streams already created abort themselves when dropped.
                inner.routes.remove(id);
                inner.dispatcher.release(rank, charged);
                inner.admission.release(prompt_len);
                for rest in pending {
                    inner.admission.release(rest.prompt.len());
                }
                stream.guard.finished = true;
                return Err(SubmitError::CoreStopped);
            }
            streams.push(stream);
        }
        inner.ranks.wake();
        Ok(streams)
    }

    /// False once the rank threads stopped (after a shutdown, or a rank failed).
    pub fn core_alive(&self) -> bool {
        !self.inner.ranks.group().is_closed()
    }

    fn abort(&self, id: RequestId, rank: usize) {
        self.inner.ranks.abort_all(rank, &[id]);
    }

    /// Forgets every rank's cached prefixes; false if some rank refused (blocks in use).
    pub fn reset_prefix_cache(&self) -> bool {
        let ranks = &self.inner.ranks;
        let replies: Vec<_> = (0..ranks.len())
            .map(|rank| {
                let (tx, rx) = std::sync::mpsc::channel();
                ranks.send(rank, RankCommand::ResetPrefixCache(tx));
                rx
            })
            .collect();
        ranks.wake();
        replies
            .into_iter()
            .all(|rx| rx.recv_timeout(Duration::from_secs(10)).unwrap_or(false))
    }

    /// Stops admitting: new submissions fail with [`SubmitError::Draining`].
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    /// Admits new requests again after [`Self::begin_drain`] (control API `Resume`); does
    /// nothing once the shutdown drain began ([`ShutdownPhase::Draining`]): a process on
    /// its way out does not take new work.
    pub fn resume(&self) {
        if self.shutdown_phase() == ShutdownPhase::Draining {
            tracing::warn!("resume ignored: the process is shutting down");
            return;
        }
        self.inner.draining.store(false, Ordering::SeqCst);
    }

    /// Moves the shutdown forward to `phase` (never back); [`ShutdownPhase::Draining`] also
    /// stops admitting, as [`Self::begin_drain`] does.
    pub fn advance_shutdown(&self, phase: ShutdownPhase) {
        self.inner.shutdown.fetch_max(phase as u8, Ordering::SeqCst);
        if phase == ShutdownPhase::Draining {
            self.begin_drain();
        }
    }

    /// Where the shutdown is.
    pub fn shutdown_phase(&self) -> ShutdownPhase {
        match self.inner.shutdown.load(Ordering::SeqCst) {
            0 => ShutdownPhase::Running,
            1 => ShutdownPhase::Delaying,
            _ => ShutdownPhase::Draining,
        }
    }

    /// Latest per-rank state for the control API.
    pub fn control_board(&self) -> &ControlBoard {
        &self.inner.board
    }

    /// Whether [`Self::begin_drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Waits until no request is in flight; false if `timeout` passed first.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.in_flight.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }

    /// Aborts every request in flight (drain timeout).
    pub fn abort_all(&self) {
        for (id, rank) in self.inner.routes.ids() {
            self.abort(id, rank);
        }
    }

    /// Stops the rank threads and waits for them. Requests still running are dropped, so
    /// call it after draining.
    pub fn shutdown(&self) {
        self.inner.ranks.group().close();
        let threads =
            std::mem::take(&mut *self.inner.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        if let Some(spans) = &self.inner.spans {
            spans.shutdown();
        }
    }

    /// Requests with a live output route (for tests and diagnostics).
    pub fn routed_requests(&self) -> usize {
        self.inner.routes.len()
    }
}

/// The outputs of one submitted request. Dropping it before the request finished aborts
/// the request, which frees its KV blocks at the rank's next step.
pub struct RequestStream {
    id: RequestId,
    rx: mpsc::UnboundedReceiver<RequestUpdate>,
    guard: StreamGuard,
}

impl RequestStream {
    /// The engine-wide request id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next update; `None` after the finishing update.
    pub async fn recv(&mut self) -> Option<RequestUpdate> {
        if self.guard.finished {
            return None;
        }
        let update = self.rx.recv().await?;
        if update.finish.is_some() {
            self.guard.finished = true;
        }
        Some(update)
    }
}

struct StreamGuard {
    engine: Engine,
    id: RequestId,
    rank: usize,
    finished: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.engine.abort(self.id, self.rank);
        }
        self.engine.inner.in_flight.send_modify(|n| *n -= 1);
    }
}
