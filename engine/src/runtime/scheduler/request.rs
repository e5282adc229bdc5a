//! A request as one rank's scheduler sees it.

use crate::compute::sampling::SamplingParams;
use crate::runtime::kv::{BlockHash, hash_block};
use crate::runtime::tenants::Tenant;
use crate::step::events::RequestId;
use ballast_rng::SplitMix64;

/// What the frontend hands to a rank: a tokenized, validated request.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Engine-wide id.
    pub id: RequestId,
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Sampling and stop parameters.
    pub sampling: SamplingParams,
    /// Seed of the request's generator (the request's own seed, or one the frontend derived).
    pub rng_seed: u64,
    /// Tenant for the running cap, if any.
    pub tenant: Option<Tenant>,
    /// The model's end-of-sequence tokens (usually one; some models end turns with others too).
    pub eos_token_ids: std::sync::Arc<[u32]>,
}

/// Where a request is in the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// In the waiting queue (new, deferred or preempted).
    Waiting,
    /// In the running batch.
    Running,
}

/// Scheduler-side state of a request.
#[derive(Debug)]
pub struct Request {
    pub(crate) id: RequestId,
    /// Prompt followed by every generated token.
    pub(crate) tokens: Vec<u32>,
    pub(crate) prompt_len: usize,
    /// Tokens whose K/V are in the cache (after a preemption: 0 again).
    pub(crate) num_computed: usize,
    /// Of those, tokens found in the prefix cache when it was last scheduled from waiting.
    pub(crate) num_cached: usize,
    pub(crate) sampling: SamplingParams,
    pub(crate) rng: SplitMix64,
    pub(crate) tenant: Option<Tenant>,
    pub(crate) eos_token_ids: std::sync::Arc<[u32]>,
    pub(crate) status: Status,
    pub(crate) holds_tenant_slot: bool,
    /// Scheduled at least once (the admission ledger was released then).
    pub(crate) started: bool,
    pub(crate) num_preemptions: u32,
    /// Hash of each full block of `tokens` (kept only when prefix caching is on).
    pub(crate) block_hashes: Vec<BlockHash>,
    /// EOS (unless ignored) and stop tokens, masked while fewer than `min_tokens` exist.
    pub(crate) min_tokens_suppress: Option<std::sync::Arc<[u32]>>,
    /// Index of this request's entry in the current step's outputs, if it has one.
    pub(crate) out_slot: Option<(u64, u32)>,
}

impl Request {
    pub(crate) fn new(r: EngineRequest, block_size: usize, hashing: bool) -> Self {
        let min_tokens_suppress = (r.sampling.min_tokens > 0).then(|| {
            let eos: &[u32] = if r.sampling.ignore_eos {
                &[]
            } else {
                &r.eos_token_ids
            };
            eos.iter()
                .copied()
                .chain(r.sampling.stop_token_ids.iter().copied())
                .collect()
        });
        let mut req = Self {
            min_tokens_suppress,
            id: r.id,
            prompt_len: r.prompt.len(),
            tokens: r.prompt,
            num_computed: 0,
            num_cached: 0,
            sampling: r.sampling,
            rng: SplitMix64::new(r.rng_seed),
            tenant: r.tenant,
            eos_token_ids: r.eos_token_ids,
            status: Status::Waiting,
            holds_tenant_slot: false,
            started: false,
            num_preemptions: 0,
            block_hashes: Vec::new(),
            out_slot: None,
        };
        if hashing {
            req.extend_hashes(block_size);
        }
        req
    }

    /// Known tokens: prompt plus generated.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Generated tokens.
    pub fn num_output(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    pub(crate) fn push_token(&mut self, token: u32, block_size: usize, hashing: bool) {
        self.tokens.push(token);
        if hashing {
            self.extend_hashes(block_size);
        }
    }

    fn extend_hashes(&mut self, block_size: usize) {
        let full = self.tokens.len() / block_size;
        while self.block_hashes.len() < full {
            let i = self.block_hashes.len();
            let parent = self.block_hashes.last().copied();
            self.block_hashes.push(hash_block(
                parent,
                &self.tokens[i * block_size..(i + 1) * block_size],
            ));
        }
    }
}
