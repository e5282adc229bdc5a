//! One sequence driven through a model without a scheduler: its own paged KV cache, blocks
//! 0, 1, 2, … in order, and the tokens it holds. What tests, benchmarks and examples use to
//! run a model directly; the engine's ranks use the scheduler and an executor instead.

use super::llama::LlamaModel;
use crate::compute::backend::{Backend, KvLayout};
use crate::step::StepMetadata;

/// A sequence's KV cache and how many tokens it holds.
pub struct Sequence<B: Backend> {
    cache: B::KvCache,
    len: u32,
    block_size: u32,
}

impl<B: Backend> Sequence<B> {
    /// Room for `capacity` tokens in blocks of `block_size`, in the model's KV layout.
    pub fn new(model: &LlamaModel<B>, capacity: usize, block_size: usize) -> Self {
        Self::with_layout(
            model,
            model.kv_layout(capacity.div_ceil(block_size), block_size),
        )
    }

    /// With `layout` (another KV element type, say); its `block_size` is the sequence's.
    pub fn with_layout(model: &LlamaModel<B>, layout: KvLayout) -> Self {
        Self {
            cache: model.backend.alloc_kv_cache(layout),
            len: 0,
            block_size: layout.block_size as u32,
        }
    }

    /// Tokens in the cache.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether nothing has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Computes `tokens` after the ones the sequence holds and returns the logits of the
    /// rows in `rows` (indexes into `tokens`), one row each.
    pub fn feed_rows(
        &mut self,
        model: &LlamaModel<B>,
        tokens: &[u32],
        rows: Vec<u32>,
    ) -> B::Tensor {
        let meta = StepMetadata::single_sequence(tokens, self.len, self.block_size, rows);
        let logits = model.forward(&mut self.cache, &meta);
        self.len += tokens.len() as u32;
        logits
    }

    /// [`Sequence::feed_rows`] with the last token's row only: what decoding needs.
    pub fn feed(&mut self, model: &LlamaModel<B>, tokens: &[u32]) -> B::Tensor {
        let last = tokens.len() as u32 - 1;
        self.feed_rows(model, tokens, vec![last])
    }
}

/// Logits of every position of `tokens` as one prefill of a fresh sequence (blocks of 4):
/// what the loaders' tests compare between weight sources.
#[cfg(test)]
pub(crate) fn prefill_logits(
    model: &LlamaModel<crate::compute::backend::cpu::CpuBackend>,
    tokens: &[u32],
) -> crate::compute::backend::cpu::CpuTensor {
    let n = tokens.len() as u32;
    Sequence::new(model, tokens.len(), 4).feed_rows(model, tokens, (0..n).collect())
}
