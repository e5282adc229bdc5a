//! The [`Backend`] trait and what crosses it: the KV cache's layout and element type, the
//! rotary style, and sampling on the host for backends that download logits.

use super::weight::HostWeight;
use crate::compute::sampling::SamplingSlot;
use crate::step::StepMetadata;

/// How rotary embedding pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeStyle {
    /// Dimension `i` rotates with `i + head_dim/2` (Hugging Face Llama checkpoints).
    #[default]
    Halves,
    /// Dimension `2i` rotates with `2i + 1` (GGUF Llama files, whose converter permutes the
    /// Q and K rows into this order). Same attention as `Halves` on unpermuted weights.
    Pairs,
}

/// Shape of one rank's paged KV cache. Every layer holds a K and a V array laid out as
/// `[num_blocks, block_size, num_kv_heads, head_dim]`, so token slot `s` of layer `l` lives at
/// `s * num_kv_heads * head_dim` in that layer's arrays (slot = block · block_size + offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Transformer layers.
    pub num_layers: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Key/value heads (GQA groups).
    pub num_kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Element type of the K and V arrays.
    pub dtype: KvDtype,
}

/// Element type of a KV cache (`--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// f32: exact copies of the keys and values the step computed.
    #[default]
    F32,
    /// IEEE half precision, rounded to nearest even on write and widened to f32 for every
    /// product: half the memory and half the bytes attention reads (llama.cpp's default).
    F16,
}

impl KvDtype {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    /// The name `--kv-cache-dtype` takes.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        }
    }
}

impl KvLayout {
    /// Elements one token occupies in one layer's K (or V) array.
    pub fn token_stride(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Elements in one layer's K (or V) array.
    pub fn layer_len(&self) -> usize {
        self.num_blocks * self.block_size * self.token_stride()
    }

    /// Bytes of the whole cache (K and V, every layer).
    pub fn bytes(&self) -> usize {
        2 * self.num_layers * self.layer_len() * self.dtype.size()
    }
}

/// Tensor operations a model needs. Tensors are 2-D, row-major `[rows, cols]`.
///
/// Weight matrices are stored `[out_features, in_features]`, so `matmul(x, w)` computes
/// `x · wᵀ`, which keeps each output a dot product of two contiguous rows.
pub trait Backend: Send + Sync + 'static {
    /// A device buffer with a 2-D shape.
    type Tensor: Send + Sync;
    /// A weight matrix, possibly quantized.
    type Weight: Send + Sync;
    /// One rank's paged KV cache (every layer).
    type KvCache: Send;
    /// Step metadata after the backend has made it usable (uploaded to the device, indexed).
    type StepMeta: Send;

    /// Short name for logs (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Copies host data into a new tensor of shape `[rows, cols]`.
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Self::Tensor;
    /// Copies a tensor back to the host.
    fn download(&self, t: &Self::Tensor) -> Vec<f32>;
    /// `(rows, cols)` of a tensor.
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);
    /// Makes a weight matrix usable by [`Backend::matmul`] and [`Backend::embedding`].
    fn upload_weight(&self, w: HostWeight<'_>) -> Self::Weight;
    /// `(rows, cols)` of a weight matrix.
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);
    /// A zeroed KV cache with the given layout.
    fn alloc_kv_cache(&self, layout: KvLayout) -> Self::KvCache;
    /// Prepares the step metadata once per step, before any op uses it.
    fn prepare_step(&self, meta: &StepMetadata) -> Self::StepMeta;
    /// Runs `step` (one model step's ops) where the backend's own threads are, so that the
    /// ops inside it hand work to one another without a thread switch each time. The default
    /// runs it on the calling thread.
    fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R {
        step()
    }

    /// Rows of `table` selected by the step's token ids: `[tokens, hidden]`.
    fn embedding(&self, table: &Self::Weight, meta: &Self::StepMeta) -> Self::Tensor;
    /// `x · wᵀ` with `x: [m, k]`, `w: [n, k]` → `[m, n]`.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Weight) -> Self::Tensor;
    /// Several products of the same `x` (Q/K/V, gate/up), which a backend may run as one
    /// pass; equal to [`Backend::matmul`] on each.
    fn matmul_n<const N: usize>(
        &self,
        x: &Self::Tensor,
        ws: [&Self::Weight; N],
    ) -> [Self::Tensor; N] {
        ws.map(|w| self.matmul(x, w))
    }
    /// Row-wise RMSNorm: `x / sqrt(mean(x²) + eps) * weight`, `weight: [1, cols]`.
    fn rms_norm(&self, x: &Self::Tensor, weight: &Self::Tensor, eps: f32) -> Self::Tensor;
    /// Rotary embedding in place on `x: [tokens, num_heads * head_dim]` at the step's
    /// positions, pairing dimensions as `style` says; frequency `i` of the table rotates pair
    /// `i`. `cos`/`sin` are `[max_positions, head_dim / 2]` tables.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        cos: &Self::Tensor,
        sin: &Self::Tensor,
        meta: &Self::StepMeta,
        num_heads: usize,
        style: RopeStyle,
    );
    /// Writes each token's K and V row into its slot of layer `layer`.
    fn write_kv(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
        meta: &Self::StepMeta,
    );
    /// Causal attention of the step's queries `q: [tokens, num_heads * head_dim]` over each
    /// sequence's paged keys and values (context plus this step's tokens, already written).
    /// Works for prefill chunks and decode alike. Returns `[tokens, num_heads * head_dim]`.
    fn paged_attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        layer: usize,
        meta: &Self::StepMeta,
        num_heads: usize,
    ) -> Self::Tensor;
    /// `silu(gate) * up`, element-wise.
    fn silu_mul(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Self::Tensor;
    /// `x += y`, element-wise.
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// The rows of `x` named by the step's `logits_rows`.
    fn gather_logits_rows(&self, x: &Self::Tensor, meta: &Self::StepMeta) -> Self::Tensor;
    /// One token per row of `logits`, drawn with each row's sampler and generator.
    fn sample(&self, logits: &Self::Tensor, slots: &mut [SamplingSlot]) -> Vec<u32> {
        let (rows, cols) = self.shape(logits);
        assert_eq!(rows, slots.len(), "one sampling slot per logits row");
        sample_on_host(&mut self.download(logits), cols, slots)
    }
}

/// One token per row of host `logits` (`cols` wide), drawn with each row's sampler and
/// generator: what [`Backend::sample`] does by default after reading the logits back.
pub fn sample_on_host(logits: &mut [f32], cols: usize, slots: &mut [SamplingSlot]) -> Vec<u32> {
    logits
        .chunks_mut(cols.max(1))
        .zip(slots.iter_mut())
        .map(|(row, slot)| {
            let suppress = slot.suppress.as_deref().unwrap_or(&[]);
            crate::compute::sampling::sample_row(row, &slot.spec, suppress, &mut slot.rng)
        })
        .collect()
}
