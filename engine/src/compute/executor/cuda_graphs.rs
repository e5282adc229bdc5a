//! CUDA graphs for decode steps: a rank's steps on the CUDA backend, pure decode steps
//! replayed from graphs captured at fixed batch sizes.

use std::collections::HashMap;

use super::Executor;
use crate::compute::backend::Backend;
use crate::compute::backend::cuda::{
    CudaBackend, CudaKvCache, CudaStepMeta, CudaTensor, GRAPH_BATCHES, StepGraph,
};
use crate::compute::model::LlamaModel;
use crate::compute::sampling::SamplingSlot;
use crate::step::{SeqSlice, StepMetadata};

/// One captured decode step and the fixed buffers it reads and writes.
struct Captured {
    graph: StepGraph,
    meta: CudaStepMeta,
    logits: CudaTensor,
}

/// Runs a rank's steps on the CUDA backend, replaying pure decode steps from CUDA graphs
/// captured at fixed batch sizes ([`GRAPH_BATCHES`]): one launch per step instead of a few
/// hundred. A step of `b` sequences runs the graph for the next batch size up, the extra rows
/// being dummy sequences that write a scratch KV block no request owns; attention is split for
/// the model's longest sequence. Other steps (prefill, mixed, larger batches) run op by op.
/// If a capture fails, the executor says why once and runs every step op by op.
pub struct GraphExecutor {
    model: LlamaModel<CudaBackend>,
    cache: CudaKvCache,
    scratch_block: u32,
    max_blocks: usize,
    graphs: HashMap<usize, Captured>,
    disabled: bool,
}

impl GraphExecutor {
    /// An executor with a fresh cache of `num_blocks` blocks (plus the scratch block).
    pub fn new(model: LlamaModel<CudaBackend>, num_blocks: usize, block_size: usize) -> Self {
        let cache = model
            .backend
            .alloc_kv_cache(model.kv_layout(num_blocks + 1, block_size));
        let max_blocks = model.spec.max_model_len.div_ceil(block_size);
        Self {
            model,
            cache,
            scratch_block: num_blocks as u32,
            max_blocks,
            graphs: HashMap::new(),
            disabled: false,
        }
    }

    /// Batch sizes captured so far.
    pub fn captured(&self) -> Vec<usize> {
        let mut b: Vec<usize> = self.graphs.keys().copied().collect();
        b.sort_unstable();
        b
    }

    /// The graph batch size for `meta`, if it is a decode step a graph can run.
    fn bucket(&self, meta: &StepMetadata) -> Option<usize> {
        let b = meta.seqs.len();
        let decode = meta.seqs.iter().enumerate().all(|(i, s)| {
            s.query_len == 1
                && s.query_start as usize == i
                && (s.block_table_len as usize) <= self.max_blocks
        });
        let samples_each = meta.logits_rows.len() == b
            && meta
                .logits_rows
                .iter()
                .enumerate()
                .all(|(i, &r)| r as usize == i);
        if self.disabled || b == 0 || !decode || !samples_each {
            return None;
        }
        GRAPH_BATCHES.iter().copied().find(|&g| g >= b)
    }

    /// `meta` padded to `bucket` sequences with block tables at a fixed stride.
    fn pad(&self, meta: &StepMetadata, bucket: usize) -> StepMetadata {
        let bs = meta.block_size;
        let mut p = StepMetadata {
            block_size: bs,
            ..StepMetadata::default()
        };
        for i in 0..bucket {
            let (token, pos, slot, context, table): (u32, u32, u32, u32, Vec<u32>) =
                match meta.seqs.get(i) {
                    Some(s) => {
                        let row = s.query_start as usize;
                        (
                            meta.token_ids[row],
                            meta.positions[row],
                            meta.slot_mapping[row],
                            s.context_len,
                            meta.block_table(s).to_vec(),
                        )
                    }
                    None => (0, 0, self.scratch_block * bs, 0, vec![self.scratch_block]),
                };
            p.token_ids.push(token);
            p.positions.push(pos);
            p.slot_mapping.push(slot);
            p.seqs.push(SeqSlice {
                query_start: i as u32,
                query_len: 1,
                context_len: context,
                block_table_start: (i * self.max_blocks) as u32,
                block_table_len: table.len() as u32,
            });
            let pad = self.max_blocks - table.len();
            p.block_tables.extend(table);
            p.block_tables
                .extend(std::iter::repeat_n(self.scratch_block, pad));
            p.logits_rows.push(i as u32);
        }
        p
    }

    fn capture(&mut self, bucket: usize, padded: &StepMetadata) -> Result<(), String> {
        let backend = self.model.backend.clone();
        let longest = self.max_blocks * padded.block_size as usize;
        let meta = backend.fixed_meta(padded, longest);
        // Once op by op first, so cuBLAS picks its kernels and loads them outside capture.
        drop(self.model.forward_prepared(&mut self.cache, &meta));
        let mut logits = backend.tensor(bucket, self.model.spec.vocab_size);
        let (model, cache) = (&self.model, &mut self.cache);
        let graph = backend.capture(|| model.forward_prepared(cache, &meta), &mut logits)?;
        self.graphs.insert(
            bucket,
            Captured {
                graph,
                meta,
                logits,
            },
        );
        Ok(())
    }
}

impl Executor for GraphExecutor {
    fn execute(&mut self, meta: &StepMetadata, slots: &mut [SamplingSlot]) -> Vec<u32> {
        if meta.num_tokens() == 0 {
            return Vec::new();
        }
        let backend = self.model.backend.clone();
        backend.run_step(|| {
            let bucket = if slots.is_empty() {
                None
            } else {
                self.bucket(meta)
            };
            let Some(bucket) = bucket else {
                let logits = self.model.forward_in_step(&mut self.cache, meta);
                return if slots.is_empty() {
                    Vec::new()
                } else {
                    backend.sample(&logits, slots)
                };
            };
            let padded = self.pad(meta, bucket);
            if !self.graphs.contains_key(&bucket)
                && let Err(why) = self.capture(bucket, &padded)
            {
                tracing::warn!("CUDA graphs off for this rank: {why}; steps run op by op");
                self.disabled = true;
                let logits = self.model.forward_in_step(&mut self.cache, meta);
                return backend.sample(&logits, slots);
            }
            let c = self.graphs.get_mut(&bucket).expect("captured above");
            backend.refill_meta(&mut c.meta, &padded);
            backend.replay(&c.graph);
            let rows = backend.first_rows(&c.logits, meta.seqs.len());
            backend.sample(&rows, slots)
        })
    }
}
