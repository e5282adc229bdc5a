//! The Llama architecture written once against [`Backend`]: RMSNorm, RoPE, grouped-query
//! attention over the paged KV cache, SwiGLU feed-forward.

use std::borrow::Cow;
use std::sync::Arc;

use super::spec::{HostWeights, ModelSpec, WeightDtype};
use crate::compute::backend::{Backend, HostWeight, KvLayout};
use crate::step::StepMetadata;

/// Every tensor of a Llama model on the host, before upload: borrowed from generated
/// weights or from a memory-mapped model file.
#[derive(Debug, Clone)]
pub struct ModelTensors<'a> {
    /// `[vocab, hidden]`.
    pub embed: HostWeight<'a>,
    /// One entry per layer.
    pub layers: Vec<LayerTensors<'a>>,
    /// `[hidden]`.
    pub final_norm: Cow<'a, [f32]>,
    /// `[vocab, hidden]`, or `None` when the output head is the embedding table (tied).
    pub lm_head: Option<HostWeight<'a>>,
}

/// The tensors of one transformer layer, matrices `[out, in]`.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct LayerTensors<'a> {
    pub attn_norm: Cow<'a, [f32]>,
    pub wq: HostWeight<'a>,
    pub wk: HostWeight<'a>,
    pub wv: HostWeight<'a>,
    pub wo: HostWeight<'a>,
    pub ffn_norm: Cow<'a, [f32]>,
    pub w_gate: HostWeight<'a>,
    pub w_up: HostWeight<'a>,
    pub w_down: HostWeight<'a>,
}

impl HostWeights {
    /// Views of these weights as model tensors.
    pub fn tensors(&self, spec: &ModelSpec) -> ModelTensors<'_> {
        let h = spec.hidden_size;
        fn dense(data: &[f32], rows: usize) -> HostWeight<'_> {
            HostWeight::F32 {
                data: Cow::Borrowed(data),
                rows,
                cols: data.len() / rows.max(1),
            }
        }
        ModelTensors {
            embed: dense(&self.embed, spec.vocab_size),
            layers: self
                .layers
                .iter()
                .map(|l| LayerTensors {
                    attn_norm: Cow::Borrowed(&l.attn_norm),
                    wq: dense(&l.wq, spec.q_size()),
                    wk: dense(&l.wk, spec.kv_size()),
                    wv: dense(&l.wv, spec.kv_size()),
                    wo: dense(&l.wo, h),
                    ffn_norm: Cow::Borrowed(&l.ffn_norm),
                    w_gate: dense(&l.w_gate, spec.intermediate_size),
                    w_up: dense(&l.w_up, spec.intermediate_size),
                    w_down: dense(&l.w_down, h),
                })
                .collect(),
            final_norm: Cow::Borrowed(&self.final_norm),
            lm_head: Some(dense(&self.lm_head, spec.vocab_size)),
        }
    }
}

/// Device weights of one layer.
struct Layer<B: Backend> {
    attn_norm: B::Tensor,
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    wo: B::Weight,
    ffn_norm: B::Tensor,
    w_gate: B::Weight,
    w_up: B::Weight,
    w_down: B::Weight,
}

/// Device weights of a whole model plus its RoPE tables. Shared read-only by all DP ranks.
pub struct LlamaWeights<B: Backend> {
    embed: B::Weight,
    layers: Vec<Layer<B>>,
    final_norm: B::Tensor,
    /// `None` when tied to `embed`.
    lm_head: Option<B::Weight>,
    rope_cos: B::Tensor,
    rope_sin: B::Tensor,
}

impl<B: Backend> LlamaWeights<B> {
    /// Uploads host tensors to `backend`. Shapes must already have been checked against
    /// `spec` (the loaders do; [`HostWeights::tensors`] cannot be wrong).
    pub fn upload(backend: &B, spec: &ModelSpec, host: ModelTensors<'_>) -> Self {
        let h = spec.hidden_size;
        let norm = |data: &[f32]| backend.upload(data, 1, h);
        let up = |w: HostWeight<'_>| match (spec.weight_dtype, &w) {
            (WeightDtype::Bf16, HostWeight::F32 { .. }) => backend.upload_weight(w.to_bf16()),
            _ => backend.upload_weight(w),
        };
        let layers = host
            .layers
            .into_iter()
            .map(|l| Layer {
                attn_norm: norm(&l.attn_norm),
                wq: up(l.wq),
                wk: up(l.wk),
                wv: up(l.wv),
                wo: up(l.wo),
                ffn_norm: norm(&l.ffn_norm),
                w_gate: up(l.w_gate),
                w_up: up(l.w_up),
                w_down: up(l.w_down),
            })
            .collect();
        let (cos, sin) = rope_tables(spec);
        let half = spec.head_dim / 2;
        Self {
            embed: up(host.embed),
            layers,
            final_norm: norm(&host.final_norm),
            lm_head: host.lm_head.map(up),
            rope_cos: backend.upload(&cos, spec.max_model_len, half),
            rope_sin: backend.upload(&sin, spec.max_model_len, half),
        }
    }

    /// Whether the output head is the embedding table.
    pub fn tied_embeddings(&self) -> bool {
        self.lm_head.is_none()
    }
}

/// cos/sin of position · θ^(−2i/d) for every position and frequency.
fn rope_tables(spec: &ModelSpec) -> (Vec<f32>, Vec<f32>) {
    let half = spec.head_dim / 2;
    let mut cos = Vec::with_capacity(spec.max_model_len * half);
    let mut sin = Vec::with_capacity(spec.max_model_len * half);
    for pos in 0..spec.max_model_len {
        for i in 0..half {
            let freq = (spec.rope_theta as f64).powf(-2.0 * i as f64 / spec.head_dim as f64);
            let angle = pos as f64 * freq;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// A Llama model on backend `B`. Cheap to clone: weights are shared.
pub struct LlamaModel<B: Backend> {
    /// Shapes.
    pub spec: ModelSpec,
    /// The backend that runs the ops.
    pub backend: B,
    weights: Arc<LlamaWeights<B>>,
}

impl<B: Backend + Clone> Clone for LlamaModel<B> {
    fn clone(&self) -> Self {
        Self {
            spec: self.spec.clone(),
            backend: self.backend.clone(),
            weights: Arc::clone(&self.weights),
        }
    }
}

impl<B: Backend> LlamaModel<B> {
    /// A model over already uploaded weights.
    pub fn new(spec: ModelSpec, backend: B, weights: Arc<LlamaWeights<B>>) -> Self {
        Self {
            spec,
            backend,
            weights,
        }
    }

    /// Builds the synthetic model `spec` with weights from `seed`.
    pub fn synthetic(spec: ModelSpec, backend: B, seed: u64) -> Self {
        let host = HostWeights::synthetic(&spec, seed);
        let weights = Arc::new(LlamaWeights::upload(&backend, &spec, host.tensors(&spec)));
        Self::new(spec, backend, weights)
    }

    /// The KV layout this model needs for `num_blocks` blocks of `block_size` tokens.
    pub fn kv_layout(&self, num_blocks: usize, block_size: usize) -> KvLayout {
        KvLayout {
            num_layers: self.spec.num_layers,
            num_blocks,
            block_size,
            num_kv_heads: self.spec.num_kv_heads,
            head_dim: self.spec.head_dim,
            dtype: self.spec.kv_dtype,
        }
    }

    /// Runs one batched step: writes every new token's K/V into `cache` and returns the
    /// logits `[logits_rows, vocab]` of the rows that sample.
    pub fn forward(&self, cache: &mut B::KvCache, meta: &StepMetadata) -> B::Tensor {
        self.backend.run_step(|| self.forward_in_step(cache, meta))
    }

    /// [`LlamaModel::forward`] for a caller already inside [`Backend::run_step`].
    pub(crate) fn forward_in_step(&self, cache: &mut B::KvCache, meta: &StepMetadata) -> B::Tensor {
        let m = self.backend.prepare_step(meta);
        self.forward_prepared(cache, &m)
    }

    /// [`LlamaModel::forward`] over step metadata the backend already holds (a CUDA graph
    /// replays this with the metadata in fixed device buffers), on the calling thread.
    pub fn forward_prepared(&self, cache: &mut B::KvCache, m: &B::StepMeta) -> B::Tensor {
        let b = &self.backend;
        let w = &*self.weights;
        let s = &self.spec;
        let mut x = b.embedding(&w.embed, m);
        for (i, l) in w.layers.iter().enumerate() {
            let h = b.rms_norm(&x, &l.attn_norm, s.rms_norm_eps);
            let [mut q, mut k, v] = b.matmul_n(&h, [&l.wq, &l.wk, &l.wv]);
            b.rope(
                &mut q,
                &w.rope_cos,
                &w.rope_sin,
                m,
                s.num_heads,
                s.rope_style,
            );
            b.rope(
                &mut k,
                &w.rope_cos,
                &w.rope_sin,
                m,
                s.num_kv_heads,
                s.rope_style,
            );
            // Every token's K/V is written before any attention reads, so a sequence in this
            // batch may attend to blocks another sequence fills in the same step.
            b.write_kv(cache, i, &k, &v, m);
            let attn = b.paged_attention(&q, cache, i, m, s.num_heads);
            b.add_assign(&mut x, &b.matmul(&attn, &l.wo));
            let h = b.rms_norm(&x, &l.ffn_norm, s.rms_norm_eps);
            let [gate, up] = b.matmul_n(&h, [&l.w_gate, &l.w_up]);
            let act = b.silu_mul(&gate, &up);
            b.add_assign(&mut x, &b.matmul(&act, &l.w_down));
        }
        // Only rows that sample need the (vocab-wide) output head.
        let last = b.gather_logits_rows(&x, m);
        let last = b.rms_norm(&last, &w.final_norm, s.rms_norm_eps);
        b.matmul(&last, w.lm_head.as_ref().unwrap_or(&w.embed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::backend::cpu::{CpuBackend, CpuTensor};
    use crate::compute::model::Sequence;

    const BLOCK: usize = 4;

    fn model() -> LlamaModel<CpuBackend> {
        LlamaModel::synthetic(ModelSpec::synthetic("tiny").unwrap(), CpuBackend, 7)
    }

    /// Computes `tokens[start..end]` after the `start` tokens `seq` holds and returns the
    /// logits of every computed row.
    fn step(
        m: &LlamaModel<CpuBackend>,
        seq: &mut Sequence<CpuBackend>,
        tokens: &[u32],
        start: usize,
        end: usize,
    ) -> CpuTensor {
        assert_eq!(seq.len() as usize, start);
        seq.feed_rows(m, &tokens[start..end], (0..(end - start) as u32).collect())
    }

    fn tokens() -> Vec<u32> {
        (0..23u32).map(|i| (i * 37 + 11) % 256).collect()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-3, "{x} vs {y}");
        }
    }

    #[test]
    fn decode_with_kv_cache_equals_full_recompute() {
        let m = model();
        let t = tokens();
        let mut full_cache = Sequence::new(&m, 16 * BLOCK, BLOCK);
        let full = step(&m, &mut full_cache, &t, 0, t.len());
        let mut cache = Sequence::new(&m, 16 * BLOCK, BLOCK);
        step(&m, &mut cache, &t, 0, 5);
        for p in 5..t.len() {
            let one = step(&m, &mut cache, &t, p, p + 1);
            close(one.row(0), full.row(p));
        }
    }

    #[test]
    fn chunked_prefill_equals_unchunked() {
        let m = model();
        let t = tokens();
        let mut cache = Sequence::new(&m, 16 * BLOCK, BLOCK);
        let whole = step(&m, &mut cache, &t, 0, t.len());
        for chunk in [1, 3, 4, 7] {
            let mut cache = Sequence::new(&m, 16 * BLOCK, BLOCK);
            let mut start = 0;
            let mut last = None;
            while start < t.len() {
                let end = (start + chunk).min(t.len());
                last = Some(step(&m, &mut cache, &t, start, end));
                start = end;
            }
            let last = last.unwrap();
            close(last.row(last.rows - 1), whole.row(t.len() - 1));
        }
    }

    #[test]
    fn logits_are_not_degenerate() {
        let m = model();
        let t = tokens();
        let mut cache = Sequence::new(&m, 16 * BLOCK, BLOCK);
        let out = step(&m, &mut cache, &t, 0, t.len());
        let row = out.row(out.rows - 1);
        let mean = row.iter().sum::<f32>() / row.len() as f32;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / row.len() as f32;
        assert!(row.iter().all(|v| v.is_finite()));
        assert!(var > 0.1 && var < 100.0, "logit variance {var}");
    }
}
