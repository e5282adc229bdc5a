//! The per-rank scheduler: continuous batching in the style of vLLM v1.
//!
//! Every step has a token budget (`--max-num-batched-tokens`) shared by running requests
//! (decode tokens and unfinished prefill chunks, served first, in order) and then waiting
//! requests (first come, first served) while the batch has fewer than `--max-num-seqs`.
//! Prefill is chunked: a prompt longer than the remaining budget takes what is left and
//! continues next step. A new request first looks up its prompt in the prefix cache.
//!
//! When a running request needs a KV block and none is free, the scheduler **preempts by
//! recompute**: the victim is the running request scheduled most recently (the tail of the
//! running list), which in FCFS order is the request with the least claim to the batch and
//! usually the least computed work. It loses its blocks, keeps its generated tokens, and
//! goes to the front of the waiting queue; when it resumes, prompt and generated tokens are
//! prefilled again (often largely from the prefix cache). No waiting request is admitted in
//! a step that preempted.
//!
//! A waiting request whose tenant is at `--max-running-per-tenant` is skipped (deferred)
//! without blocking the requests behind it.
//!
//! The end-of-step snapshot classifies each waiting request by what held it when the step
//! was planned, as vLLM takes its stats after scheduling: a request whose tenant was at its
//! cap then is *deferred*, every other waiting request waits for *capacity*. Re-reading the
//! tenant ledger after the step's finishes released their slots would call a deferred
//! request a capacity one for exactly the moment between two steps.

pub use crate::config::runtime::SchedulerConfig;

mod request;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

pub use request::{EngineRequest, Request, Status};

use crate::compute::sampling::SamplingSlot;
use crate::runtime::admission::AdmissionLedger;
use crate::runtime::kv::KvCacheManager;
use crate::runtime::kv::manager::CachedPrefix;
use crate::runtime::tenants::TenantLedger;
use crate::step::events::{
    EventKind, FinishReason, RequestId, RequestStepOutput, SchedulerSnapshot, StepCounters,
};
use crate::step::{SeqSlice, StepMetadata};

/// One request's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The request.
    pub id: RequestId,
    /// Tokens computed for it this step.
    pub num_new_tokens: usize,
    /// Tokens already in its KV cache before this step.
    pub context_len: usize,
    /// Whether this step computes its last known token, so a new token is sampled.
    pub samples: bool,
}

/// The plan of one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// Scheduled requests in batch order.
    pub seqs: Vec<ScheduledSeq>,
    /// Σ num_new_tokens.
    pub num_tokens: usize,
}

impl SchedulerOutput {
    /// Causal (query, key) pairs of the step: a chunk of q new tokens on p cached ones has
    /// q·p + q(q+1)/2. Feeds the data-parallel balance statistics.
    pub fn attention_pairs(&self) -> u64 {
        self.seqs
            .iter()
            .map(|s| attention_pairs(s.num_new_tokens as u64, s.context_len as u64))
            .sum()
    }
}

/// Causal (query, key) pairs of `q` new tokens on top of `p` cached ones.
pub fn attention_pairs(q: u64, p: u64) -> u64 {
    q * p + q * (q + 1) / 2
}

/// The scheduler of one data-parallel rank. Owns its requests and its KV cache manager.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    requests: HashMap<RequestId, Request>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    tenants: Arc<TenantLedger>,
    admission: Arc<AdmissionLedger>,
    step: u64,
    outputs: Vec<RequestStepOutput>,
    counters: StepCounters,
    /// Waiting requests whose tenant was at its cap when the last step was planned.
    deferred_at_schedule: usize,
}

impl Scheduler {
    /// A scheduler with an empty KV pool of `cfg.num_blocks` blocks.
    pub fn new(
        cfg: SchedulerConfig,
        tenants: Arc<TenantLedger>,
        admission: Arc<AdmissionLedger>,
    ) -> Self {
        Self {
            kv: KvCacheManager::new(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching),
            cfg,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            tenants,
            admission,
            step: 0,
            outputs: Vec::new(),
            counters: StepCounters::default(),
            deferred_at_schedule: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The KV cache manager (read-only: block tables and counts).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Whether anything is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Requests in the running batch.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests in the waiting queue (capacity and deferred).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// A request by id.
    pub fn request(&self, id: RequestId) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// Queues a new request (QUEUED event at `now`).
    pub fn add(&mut self, r: EngineRequest, now: Instant) {
        let id = r.id;
        let mut req = Request::new(r, self.cfg.block_size, self.cfg.enable_prefix_caching);
        out_entry(&mut self.outputs, self.step, &mut req)
            .events
            .push(EventKind::Queued, now);
        self.requests.insert(id, req);
        self.waiting.push_back(id);
    }

    /// Ends a request at once, wherever it is, releasing its blocks and slots. Returns false
    /// when the request is unknown (already finished).
    pub fn abort(&mut self, id: RequestId) -> bool {
        let Some(req) = self.requests.get(&id) else {
            return false;
        };
        match req.status {
            Status::Waiting => self.waiting.retain(|&w| w != id),
            Status::Running => self.running.retain(|&r| r != id),
        }
        if !req.started {
            self.admission.release(req.prompt_len);
        }
        self.finish(id, FinishReason::Abort);
        true
    }

    /// Plans one step at time `now`.
    pub fn schedule(&mut self, now: Instant) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = false;

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let req = &self.requests[&id];
            let num_new = (req.num_tokens() - req.num_computed).min(budget);
            if num_new == 0 {
                i += 1;
                continue;
            }
            let mut fits = false;
            loop {
                let req = &self.requests[&id];
                if self.kv.allocate_slots(
                    id,
                    req.num_computed,
                    &CachedPrefix::default(),
                    num_new,
                    &req.block_hashes,
                ) {
                    fits = true;
                    break;
                }
                let victim = self.running.pop().expect("the request itself is running");
                self.preempt(victim, now);
                preempted = true;
                if victim == id {
                    break;
                }
            }
            if !fits {
                break;
            }
            let req = &self.requests[&id];
            out.seqs.push(ScheduledSeq {
                id,
                num_new_tokens: num_new,
                context_len: req.num_computed,
                samples: req.num_computed + num_new == req.num_tokens(),
            });
            budget -= num_new;
            i += 1;
        }

        let mut w = 0;
        while !preempted
            && w < self.waiting.len()
            && budget > 0
            && self.running.len() < self.cfg.max_num_seqs
        {
            let id = self.waiting[w];
            let req = &self.requests[&id];
            if let Some(t) = &req.tenant
                && !self.tenants.try_acquire(t)
            {
                // Deferred: its tenant is at the cap. Requests behind it may still run.
                w += 1;
                continue;
            }
            let prefix = self
                .kv
                .find_cached_prefix(&req.block_hashes, req.num_tokens());
            let num_new = (req.num_tokens() - prefix.num_tokens).min(budget);
            if !self
                .kv
                .allocate_slots(id, 0, &prefix, num_new, &req.block_hashes)
            {
                if let Some(t) = &req.tenant {
                    self.tenants.release(t);
                }
                break; // Out of KV blocks: FCFS waits here.
            }
            if self.cfg.enable_prefix_caching {
                self.kv
                    .record_lookup(req.num_preemptions > 0, req.num_tokens(), prefix.num_tokens);
            }
            self.waiting.remove(w);
            let req = self.requests.get_mut(&id).expect("waiting request exists");
            req.holds_tenant_slot = req.tenant.is_some();
            req.num_computed = prefix.num_tokens;
            req.num_cached = prefix.num_tokens;
            req.status = Status::Running;
            let first = !req.started;
            if first {
                req.started = true;
                self.admission.release(req.prompt_len);
            }
            let entry = out_entry(&mut self.outputs, self.step, req);
            entry.events.push(EventKind::Scheduled, now);
            if first {
                entry.num_cached_tokens = Some(prefix.num_tokens as u32);
            }
            out.seqs.push(ScheduledSeq {
                id,
                num_new_tokens: num_new,
                context_len: prefix.num_tokens,
                samples: prefix.num_tokens + num_new == req.num_tokens(),
            });
            self.running.push(id);
            budget -= num_new;
        }
        out.num_tokens = self.cfg.max_num_batched_tokens - budget;
        self.deferred_at_schedule = self.count_deferred();
        out
    }

    /// Waiting requests whose tenant is at its cap now.
    fn count_deferred(&self) -> usize {
        self.tenants.count_at_cap(
            self.waiting
                .iter()
                .map(|id| self.requests[id].tenant.as_ref()),
        )
    }

    fn preempt(&mut self, id: RequestId, now: Instant) {
        self.kv.free(id);
        let req = self.requests.get_mut(&id).expect("running request exists");
        let c = &mut self.counters;
        c.preemptions += 1;
        // Only work this request computed is thrown away; what it found in the prefix
        // cache when it was scheduled stays cached for others and is not retracted.
        let (computed, cached, prompt) = (req.num_computed, req.num_cached, req.prompt_len);
        c.retracted_input_tokens += computed.min(prompt).saturating_sub(cached) as u32;
        c.retracted_output_tokens += computed.saturating_sub(cached.max(prompt)) as u32;
        req.num_computed = 0;
        req.num_cached = 0;
        req.status = Status::Waiting;
        req.num_preemptions += 1;
        if req.holds_tenant_slot {
            req.holds_tenant_slot = false;
            if let Some(t) = &req.tenant {
                self.tenants.release(t);
            }
        }
        out_entry(&mut self.outputs, self.step, req)
            .events
            .push(EventKind::Preempted, now);
        self.waiting.push_front(id);
    }

    /// Writes the step's model inputs for `out` into `meta` (cleared first) and one sampling
    /// slot per sampling sequence into `slots`.
    pub fn fill_step(
        &self,
        out: &SchedulerOutput,
        meta: &mut StepMetadata,
        slots: &mut Vec<SamplingSlot>,
    ) {
        let bs = self.cfg.block_size;
        meta.token_ids.clear();
        meta.positions.clear();
        meta.slot_mapping.clear();
        meta.seqs.clear();
        meta.block_tables.clear();
        meta.logits_rows.clear();
        meta.block_size = bs as u32;
        slots.clear();
        for s in &out.seqs {
            let req = &self.requests[&s.id];
            let table = self.kv.block_table(s.id);
            let end = s.context_len + s.num_new_tokens;
            let query_start = meta.token_ids.len() as u32;
            for p in s.context_len..end {
                meta.token_ids.push(req.tokens[p]);
                meta.positions.push(p as u32);
                meta.slot_mapping
                    .push(table[p / bs] * bs as u32 + (p % bs) as u32);
            }
            let blocks = end.div_ceil(bs);
            meta.seqs.push(SeqSlice {
                query_start,
                query_len: s.num_new_tokens as u32,
                context_len: s.context_len as u32,
                block_table_start: meta.block_tables.len() as u32,
                block_table_len: blocks as u32,
            });
            meta.block_tables.extend_from_slice(&table[..blocks]);
            if s.samples {
                meta.logits_rows
                    .push(query_start + s.num_new_tokens as u32 - 1);
                let suppress = req
                    .min_tokens_suppress
                    .as_ref()
                    .filter(|_| req.num_output() < req.sampling.min_tokens as usize)
                    .cloned();
                slots.push(SamplingSlot {
                    spec: req.sampling.spec,
                    rng: req.rng.clone(),
                    suppress,
                });
            }
        }
    }

    /// Applies a finished step: advances computed tokens, appends the `sampled` tokens (one
    /// per sampling sequence, in order, with the generators in `slots` after sampling), and
    /// finishes requests that hit a stop condition.
    pub fn update(&mut self, out: &SchedulerOutput, sampled: &[u32], slots: &[SamplingSlot]) {
        let bs = self.cfg.block_size;
        let hashing = self.cfg.enable_prefix_caching;
        let mut k = 0;
        let mut any_finished = false;
        for s in &out.seqs {
            let req = self
                .requests
                .get_mut(&s.id)
                .expect("scheduled request exists");
            let prompt_end = req
                .prompt_len
                .clamp(s.context_len, s.context_len + s.num_new_tokens);
            let c = &mut self.counters;
            c.prefill_tokens += (prompt_end - s.context_len) as u32;
            c.scheduled_tokens += s.num_new_tokens as u32;
            c.attention_pairs += attention_pairs(s.num_new_tokens as u64, s.context_len as u64);
            c.context_tokens += (s.context_len + s.num_new_tokens) as u64;
            c.sampled += s.samples as u32;
            req.num_computed += s.num_new_tokens;
            if !s.samples {
                continue;
            }
            let token = sampled[k];
            req.rng = slots[k].rng.clone();
            k += 1;
            req.push_token(token, bs, hashing);
            out_entry(&mut self.outputs, self.step, req).new_token = Some(token);
            if let Some(reason) = stop_reason(req, token, self.cfg.max_model_len) {
                self.finish(s.id, reason);
                any_finished = true;
            }
        }
        if any_finished {
            let requests = &self.requests;
            self.running.retain(|id| requests.contains_key(id));
        }
    }

    /// Removes a request that is no longer in either queue.
    fn finish(&mut self, id: RequestId, reason: FinishReason) {
        self.kv.free(id);
        let Some(mut req) = self.requests.remove(&id) else {
            return;
        };
        if req.holds_tenant_slot
            && let Some(t) = &req.tenant
        {
            self.tenants.release(t);
        }
        out_entry(&mut self.outputs, self.step, &mut req).finish = Some(reason);
    }

    /// End-of-step state (gauges). Waiting requests are split by what held them when the
    /// step was planned (see the module docs); requests added or aborted since then are
    /// not in a published snapshot, because ranks publish only after planning.
    pub fn snapshot(&self) -> SchedulerSnapshot {
        let deferred = self.deferred_at_schedule.min(self.waiting.len());
        let counts = self.kv.pool().counts();
        SchedulerSnapshot {
            running: self.running.len() as u32,
            waiting_capacity: (self.waiting.len() - deferred) as u32,
            waiting_deferred: deferred as u32,
            kv_blocks: counts,
            block_size: self.cfg.block_size as u32,
            kv_usage: self.kv.pool().usage(),
        }
    }

    /// The step's increments, zeroed for the next step (prefix-cache stats included).
    pub fn take_counters(&mut self) -> StepCounters {
        let mut c = std::mem::take(&mut self.counters);
        c.prefix_cache = self.kv.take_stats();
        c
    }

    /// The step's per-request outputs; starts the next step.
    pub fn take_outputs(&mut self) -> Vec<RequestStepOutput> {
        self.step += 1;
        std::mem::take(&mut self.outputs)
    }

    /// Samples KV residency of a `rate` fraction of block allocations (`--kv-cache-metrics`).
    pub fn track_kv_residency(&mut self, rate: f64, seed: u64) {
        self.kv.track_residency(rate, seed);
    }

    /// KV residency samples since the last call (take-and-reset).
    pub fn take_residency(&mut self) -> Vec<crate::runtime::kv::ResidencySample> {
        self.kv.take_residency()
    }

    /// Forgets cached prefixes; refused while any request holds blocks.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.kv.reset_prefix_cache()
    }
}

/// The request's entry in this step's outputs, created on first use.
fn out_entry<'a>(
    outputs: &'a mut Vec<RequestStepOutput>,
    step: u64,
    req: &mut Request,
) -> &'a mut RequestStepOutput {
    match req.out_slot {
        Some((s, i)) if s == step => &mut outputs[i as usize],
        _ => {
            req.out_slot = Some((step, outputs.len() as u32));
            outputs.push(RequestStepOutput::new(req.id));
            outputs.last_mut().expect("just pushed")
        }
    }
}

/// Whether `token`, just appended to `req`, ends it.
fn stop_reason(req: &Request, token: u32, max_model_len: usize) -> Option<FinishReason> {
    let p = &req.sampling;
    let generated = req.num_output();
    if generated >= p.min_tokens as usize
        && ((!p.ignore_eos && req.eos_token_ids.contains(&token))
            || p.stop_token_ids.contains(&token))
    {
        return Some(FinishReason::Stop);
    }
    if generated >= p.max_tokens as usize || req.num_tokens() >= max_model_len {
        return Some(FinishReason::Length);
    }
    None
}

#[cfg(test)]
mod tests;
