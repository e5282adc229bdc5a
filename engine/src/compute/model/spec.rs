//! A model's shapes (Llama architecture) and the deterministic weights of synthetic
//! models (the presets are in `source.rs`, with what `--model` names).

use ballast_rng::SplitMix64;

use crate::compute::backend::RopeStyle;
use crate::compute::tokenizer::ByteTokenizer;

/// Shapes of a Llama-architecture model (RMSNorm, RoPE, GQA, SwiGLU).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Name shown in logs and `/v1/models` when no served name is given.
    pub name: String,
    /// Rows of the embedding table and the output head.
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Transformer layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Longest sequence (prompt + output) the model accepts.
    pub max_model_len: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// How RoPE pairs the dimensions of a head, which follows how the Q and K rows are stored.
    pub rope_style: RopeStyle,
    /// The type generated weight matrices are stored in. Model files keep their own types;
    /// this only decides what synthetic weights become on upload.
    pub weight_dtype: WeightDtype,
    /// Element type of the KV cache: f32 unless the engine's `--kv-cache-dtype` resolves
    /// otherwise (f16 for GGUF files on the CPU, as llama.cpp).
    pub kv_dtype: crate::compute::backend::KvDtype,
}

/// Storage type of synthetic weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDtype {
    /// f32: the CPU backend's native type, and an f32 GEMM on CUDA.
    #[default]
    F32,
    /// bf16, multiplied as a bf16 GEMM with f32 accumulation on every backend (the CPU rounds
    /// its activations to bf16 to match).
    Bf16,
}

impl ModelSpec {
    /// Width of the query projection.
    pub fn q_size(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the key (and value) projection.
    pub fn kv_size(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Parameter count (embedding and output head counted separately).
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let per_layer =
            h * self.q_size() * 2 + h * self.kv_size() * 2 + 3 * h * self.intermediate_size + 2 * h;
        2 * self.vocab_size * h + self.num_layers * per_layer + h
    }
}

/// Host copy of every weight, generated deterministically from a seed.
#[derive(Debug, Clone)]
pub struct HostWeights {
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    /// One entry per layer.
    pub layers: Vec<HostLayer>,
    /// `[hidden]`.
    pub final_norm: Vec<f32>,
    /// `[vocab, hidden]`.
    pub lm_head: Vec<f32>,
}

/// Host weights of one transformer layer, each matrix `[out, in]`.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub struct HostLayer {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Vec<f32>,
    pub w_up: Vec<f32>,
    pub w_down: Vec<f32>,
}

impl HostWeights {
    /// Weights of `spec` drawn from `seed`. Each tensor has its own generator stream, so a
    /// tensor's values do not depend on the order tensors are generated in.
    pub fn synthetic(spec: &ModelSpec, seed: u64) -> Self {
        let mut stream = 0u64;
        let mut next = |n: usize, bound: f32| {
            stream += 1;
            stream_values(n, bound, seed, stream)
        };
        // Uniform in [-√(3/fan_in), √(3/fan_in)) has variance 1/fan_in, which keeps
        // activations at unit scale through every matmul; the embedding has unit variance.
        let fan_in = |cols: usize| (3.0 / cols as f32).sqrt();
        let h = spec.hidden_size;
        let embed = next(spec.vocab_size * h, 3f32.sqrt());
        let layers = (0..spec.num_layers)
            .map(|_| HostLayer {
                attn_norm: vec![1.0; h],
                wq: next(spec.q_size() * h, fan_in(h)),
                wk: next(spec.kv_size() * h, fan_in(h)),
                wv: next(spec.kv_size() * h, fan_in(h)),
                wo: next(h * spec.q_size(), fan_in(spec.q_size())),
                ffn_norm: vec![1.0; h],
                w_gate: next(spec.intermediate_size * h, fan_in(h)),
                w_up: next(spec.intermediate_size * h, fan_in(h)),
                w_down: next(h * spec.intermediate_size, fan_in(spec.intermediate_size)),
            })
            .collect();
        let mut lm_head = next(spec.vocab_size * h, fan_in(h));
        if spec.vocab_size == ByteTokenizer::VOCAB_SIZE {
            // Tilt byte models towards printable ASCII so their output reads as text in a
            // demo rather than as replacement characters. Greedy and sampled decoding stay
            // deterministic functions of the seed.
            for byte in (b' '..=b'~').chain([b'\n']) {
                for w in &mut lm_head[byte as usize * h..(byte as usize + 1) * h] {
                    *w *= 3.0;
                }
            }
        }
        Self {
            embed,
            layers,
            final_norm: vec![1.0; h],
            lm_head,
        }
    }
}

/// `n` values uniform in [-bound, bound) from one generator stream, filled in parallel by
/// deriving a sub-stream per chunk (the result does not depend on the thread count).
fn stream_values(n: usize, bound: f32, seed: u64, stream: u64) -> Vec<f32> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0.0f32; n];
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng = SplitMix64::derive_path(seed, &[stream, c as u64]);
            for v in chunk {
                *v = (rng.next_f32() * 2.0 - 1.0) * bound;
            }
        });
    out
}
