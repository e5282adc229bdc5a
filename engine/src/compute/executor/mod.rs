//! What runs a planned step: the model on a backend, or nothing at all (for measuring the
//! scheduler alone). The rank loop sees only this trait, never the backend.

pub mod cuda_graphs;

use crate::compute::backend::Backend;
use crate::compute::model::LlamaModel;
use crate::compute::sampling::SamplingSlot;
use crate::step::StepMetadata;

/// Runs one step and returns one sampled token per entry of `meta.logits_rows`.
pub trait Executor: Send {
    /// Computes the step's tokens (writing their KV) and samples with `slots`.
    fn execute(&mut self, meta: &StepMetadata, slots: &mut [SamplingSlot]) -> Vec<u32>;
}

/// A model and the KV cache of one rank.
pub struct ModelExecutor<B: Backend> {
    model: LlamaModel<B>,
    cache: B::KvCache,
}

impl<B: Backend> ModelExecutor<B> {
    /// An executor with a fresh cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: LlamaModel<B>, num_blocks: usize, block_size: usize) -> Self {
        let cache = model
            .backend
            .alloc_kv_cache(model.kv_layout(num_blocks, block_size));
        Self { model, cache }
    }
}

impl<B: Backend> Executor for ModelExecutor<B> {
    fn execute(&mut self, meta: &StepMetadata, slots: &mut [SamplingSlot]) -> Vec<u32> {
        if meta.num_tokens() == 0 {
            return Vec::new();
        }
        let (model, cache) = (&self.model, &mut self.cache);
        model.backend.run_step(|| {
            let logits = model.forward_in_step(cache, meta);
            if slots.is_empty() {
                return Vec::new();
            }
            model.backend.sample(&logits, slots)
        })
    }
}

/// Returns `token` for every sampling row without computing anything: isolates the cost of
/// scheduling in benchmarks, and makes scheduler tests independent of a model.
#[derive(Debug, Clone, Copy)]
pub struct NoopExecutor {
    /// The token every request "generates".
    pub token: u32,
}

impl Executor for NoopExecutor {
    fn execute(&mut self, meta: &StepMetadata, _slots: &mut [SamplingSlot]) -> Vec<u32> {
        vec![self.token; meta.logits_rows.len()]
    }
}
