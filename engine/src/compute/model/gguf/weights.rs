//! A Llama model's tensors from a GGUF file, checked against its hyperparameters: quantized
//! matrices stay in the mapped file, everything else is expanded to f32.

use std::borrow::Cow;
use std::ops::Deref;
use std::sync::Arc;

use super::{GgmlType, GgufError, GgufFile, TensorView};
use crate::compute::backend::HostWeight;
use crate::compute::backend::quant::{QuantFormat, QuantMatrix, SharedBytes};
use crate::compute::model::ModelSpec;
use crate::compute::model::llama::{LayerTensors, ModelTensors};

/// The ggml type of a kernel format.
pub fn quant_format_type(format: QuantFormat) -> GgmlType {
    match format {
        QuantFormat::Q8_0 => GgmlType::Q8_0,
        QuantFormat::Q4_0 => GgmlType::Q4_0,
        QuantFormat::Q4_1 => GgmlType::Q4_1,
        QuantFormat::Q5_0 => GgmlType::Q5_0,
        QuantFormat::Q5_1 => GgmlType::Q5_1,
        QuantFormat::Q4_K => GgmlType::Q4_K,
        QuantFormat::Q5_K => GgmlType::Q5_K,
        QuantFormat::Q6_K => GgmlType::Q6_K,
    }
}

/// The kernels' format for a quantized ggml type, if they have one.
pub fn quant_format(dtype: GgmlType) -> Option<QuantFormat> {
    Some(match dtype {
        GgmlType::Q8_0 => QuantFormat::Q8_0,
        GgmlType::Q4_0 => QuantFormat::Q4_0,
        GgmlType::Q4_1 => QuantFormat::Q4_1,
        GgmlType::Q5_0 => QuantFormat::Q5_0,
        GgmlType::Q5_1 => QuantFormat::Q5_1,
        GgmlType::Q4_K => QuantFormat::Q4_K,
        GgmlType::Q5_K => QuantFormat::Q5_K,
        GgmlType::Q6_K => QuantFormat::Q6_K,
        _ => return None,
    })
}

impl<D: Deref<Target = [u8]> + Send + Sync + 'static> GgufFile<D> {
    /// Every tensor of the Llama model `spec` (from [`GgufFile::llama_spec`]), by llama.cpp's
    /// names: `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
    /// ffn_gate, ffn_up, ffn_down}`, `output_norm`, and `output` unless the embeddings are tied.
    ///
    /// Each tensor's dims and type are checked. Quantized matrices ([`super::WEIGHT_TYPES`]) borrow
    /// the file's bytes; F32, F16 and BF16 ones are expanded to f32.
    pub fn llama_tensors(
        self: &Arc<Self>,
        spec: &ModelSpec,
    ) -> Result<ModelTensors<'static>, GgufError> {
        let h = spec.hidden_size as u64;
        let (q, kv, ffn, vocab) = (
            spec.q_size() as u64,
            spec.kv_size() as u64,
            spec.intermediate_size as u64,
            spec.vocab_size as u64,
        );
        let matrix = |name: &str, rows: u64, cols: u64| self.matrix(name, rows, cols);
        let vector = |name: &str| self.vector(name, h);
        let layers = (0..spec.num_layers)
            .map(|i| {
                let n = |t: &str| format!("blk.{i}.{t}.weight");
                Ok(LayerTensors {
                    attn_norm: vector(&n("attn_norm"))?,
                    wq: matrix(&n("attn_q"), q, h)?,
                    wk: matrix(&n("attn_k"), kv, h)?,
                    wv: matrix(&n("attn_v"), kv, h)?,
                    wo: matrix(&n("attn_output"), h, q)?,
                    ffn_norm: vector(&n("ffn_norm"))?,
                    w_gate: matrix(&n("ffn_gate"), ffn, h)?,
                    w_up: matrix(&n("ffn_up"), ffn, h)?,
                    w_down: matrix(&n("ffn_down"), h, ffn)?,
                })
            })
            .collect::<Result<Vec<_>, GgufError>>()?;
        let lm_head = match self.header().tensor_info("output.weight") {
            Some(_) => Some(matrix("output.weight", vocab, h)?),
            None => None,
        };
        Ok(ModelTensors {
            embed: matrix("token_embd.weight", vocab, h)?,
            layers,
            final_norm: vector("output_norm.weight")?,
            lm_head,
        })
    }

    fn checked(&self, name: &str, dims: &[u64]) -> Result<TensorView<'_>, GgufError> {
        let view = self.tensor(name)?;
        if view.info.dims != dims {
            return Err(GgufError::WrongTensorShape {
                tensor: name.to_string(),
                expected: dims.to_vec(),
                found: view.info.dims.clone(),
            });
        }
        Ok(view)
    }

    fn vector(&self, name: &str, len: u64) -> Result<Cow<'static, [f32]>, GgufError> {
        let view = self.checked(name, &[len])?;
        if !view.info.dtype.can_dequantize() {
            return Err(unsupported(&view));
        }
        Ok(Cow::Owned(view.dequantize()?))
    }

    fn matrix(
        self: &Arc<Self>,
        name: &str,
        rows: u64,
        cols: u64,
    ) -> Result<HostWeight<'static>, GgufError> {
        let view = self.checked(name, &[cols, rows])?;
        let format = match view.info.dtype {
            t if quant_format(t).is_some() => quant_format(t).expect("checked"),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                return Ok(HostWeight::F32 {
                    data: Cow::Owned(view.dequantize()?),
                    rows: rows as usize,
                    cols: cols as usize,
                });
            }
            _ => return Err(unsupported(&view)),
        };
        // The view's bytes lie inside the file's; their offset names them in the shared map.
        let start = view.bytes.as_ptr() as usize - self.data.as_ptr() as usize;
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.clone();
        let bytes = SharedBytes::new(owner, start, view.bytes.len());
        let m = QuantMatrix::new(format, rows as usize, cols as usize, bytes).map_err(|e| {
            GgufError::BadShape {
                tensor: name.to_string(),
                dims: view.info.dims.clone(),
                dtype: view.info.dtype,
                reason: match e {
                    crate::compute::backend::quant::QuantShapeError::PartialBlock { .. } => {
                        "rows are not whole blocks"
                    }
                    crate::compute::backend::quant::QuantShapeError::Length { .. } => {
                        "byte length does not match"
                    }
                },
            }
        })?;
        Ok(HostWeight::Quant(m))
    }
}

fn unsupported(view: &TensorView<'_>) -> GgufError {
    GgufError::UnsupportedTensorType {
        tensor: view.info.name.clone(),
        dtype: view.info.dtype,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_writer::GgufWriter;
    use super::super::{MetaArray, MetaValue};
    use super::*;
    use crate::compute::backend::cpu::{CpuBackend, CpuTensor};
    use crate::compute::model::{HostWeights, LlamaModel, LlamaWeights, ResolvedModel};

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Q8_0 blocks of a row-major matrix, as llama.cpp's quantizer makes them.
    fn q8_0_bytes(v: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in v.chunks(32) {
            let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            out.extend(block.iter().map(|x| (x * inv).round() as i8 as u8));
        }
        out
    }

    /// llama.cpp's converter reorders each head's Q/K rows from `[x₀…x_{d/2−1}, y₀…]` to
    /// `[x₀, y₀, x₁, y₁, …]` for its pairwise RoPE.
    fn permute_heads(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
        let rows = w.len() / cols;
        let d = rows / heads;
        let mut out = vec![0.0; w.len()];
        for h in 0..heads {
            for p in 0..2 {
                for i in 0..d / 2 {
                    let from = h * d + p * (d / 2) + i;
                    let to = h * d + 2 * i + p;
                    out[to * cols..(to + 1) * cols]
                        .copy_from_slice(&w[from * cols..(from + 1) * cols]);
                }
            }
        }
        out
    }

    /// The synthetic tiny model written as a GGUF file the way llama.cpp's converter would:
    /// matrices in `matrix_type` (F32 or Q8_0), Q/K rows permuted, a separate output head.
    fn tiny_as_gguf(matrix_type: GgmlType) -> (HostWeights, Vec<u8>) {
        let spec = ModelSpec::synthetic("tiny").unwrap();
        let host = HostWeights::synthetic(&spec, 7);
        let h = spec.hidden_size as u64;
        let mut w = GgufWriter::default()
            .kv("general.architecture", MetaValue::String("llama".into()))
            .kv("general.name", MetaValue::String("tiny as gguf".into()))
            .kv(
                "llama.context_length",
                MetaValue::U32(spec.max_model_len as u32),
            )
            .kv("llama.embedding_length", MetaValue::U32(h as u32))
            .kv("llama.block_count", MetaValue::U32(spec.num_layers as u32))
            .kv(
                "llama.feed_forward_length",
                MetaValue::U32(spec.intermediate_size as u32),
            )
            .kv(
                "llama.attention.head_count",
                MetaValue::U32(spec.num_heads as u32),
            )
            .kv(
                "llama.attention.head_count_kv",
                MetaValue::U32(spec.num_kv_heads as u32),
            )
            .kv("llama.rope.freq_base", MetaValue::F32(spec.rope_theta))
            .kv(
                "llama.attention.layer_norm_rms_epsilon",
                MetaValue::F32(spec.rms_norm_eps),
            )
            .kv("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
            .kv("tokenizer.ggml.pre", MetaValue::String("gpt2".into()))
            .kv("tokenizer.ggml.bos_token_id", MetaValue::U32(256))
            .kv("tokenizer.ggml.eos_token_id", MetaValue::U32(257))
            .kv(
                "tokenizer.ggml.merges",
                MetaValue::Array(MetaArray::String(Vec::new())),
            )
            .kv(
                "tokenizer.ggml.tokens",
                MetaValue::Array(MetaArray::String(
                    (0..spec.vocab_size).map(|i| format!("t{i}")).collect(),
                )),
            );
        let matrix = |w: GgufWriter, name: &str, data: &[f32], rows: usize| {
            let cols = (data.len() / rows) as u64;
            // Rows that are not whole blocks stay F32, as llama.cpp's quantizer leaves them.
            match matrix_type {
                GgmlType::Q8_0 if cols.is_multiple_of(32) => {
                    w.tensor(name, &[cols, rows as u64], matrix_type, q8_0_bytes(data))
                }
                _ => w.tensor(name, &[cols, rows as u64], GgmlType::F32, f32_bytes(data)),
            }
        };
        let vector = |w: GgufWriter, name: &str, data: &[f32]| {
            w.tensor(name, &[data.len() as u64], GgmlType::F32, f32_bytes(data))
        };
        w = matrix(w, "token_embd.weight", &host.embed, spec.vocab_size);
        for (i, l) in host.layers.iter().enumerate() {
            let n = |t: &str| format!("blk.{i}.{t}.weight");
            let wq = permute_heads(&l.wq, spec.num_heads, spec.hidden_size);
            let wk = permute_heads(&l.wk, spec.num_kv_heads, spec.hidden_size);
            w = vector(w, &n("attn_norm"), &l.attn_norm);
            w = matrix(w, &n("attn_q"), &wq, spec.q_size());
            w = matrix(w, &n("attn_k"), &wk, spec.kv_size());
            w = matrix(w, &n("attn_v"), &l.wv, spec.kv_size());
            w = matrix(w, &n("attn_output"), &l.wo, spec.hidden_size);
            w = vector(w, &n("ffn_norm"), &l.ffn_norm);
            w = matrix(w, &n("ffn_gate"), &l.w_gate, spec.intermediate_size);
            w = matrix(w, &n("ffn_up"), &l.w_up, spec.intermediate_size);
            w = matrix(w, &n("ffn_down"), &l.w_down, spec.hidden_size);
        }
        w = vector(w, "output_norm.weight", &host.final_norm);
        w = matrix(w, "output.weight", &host.lm_head, spec.vocab_size);
        (host, w.to_bytes())
    }

    fn logits(model: &LlamaModel<CpuBackend>, tokens: &[u32]) -> CpuTensor {
        crate::compute::model::sequence::prefill_logits(model, tokens)
    }

    fn from_file(bytes: Vec<u8>) -> LlamaModel<CpuBackend> {
        let dir = std::env::temp_dir().join(format!("ballast-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.gguf", bytes.len()));
        std::fs::write(&path, bytes).unwrap();
        let resolved = ResolvedModel::resolve(path.to_str().unwrap()).unwrap();
        let _ = std::fs::remove_file(&path);
        let crate::compute::model::ModelSource::Gguf { tensors, .. } = resolved.source else {
            panic!("a .gguf path resolves to a GGUF source");
        };
        let weights = LlamaWeights::upload(&CpuBackend, &resolved.spec, (*tensors).clone());
        LlamaModel::new(resolved.spec, CpuBackend, Arc::new(weights))
    }

    const TOKENS: [u32; 11] = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114];

    #[test]
    fn a_gguf_file_reproduces_the_synthetic_logits() {
        let (_, bytes) = tiny_as_gguf(GgmlType::F32);
        let spec = ModelSpec::synthetic("tiny").unwrap();
        let reference = logits(&LlamaModel::synthetic(spec, CpuBackend, 7), &TOKENS);
        let loaded = logits(&from_file(bytes), &TOKENS);
        // Permuted Q/K rows with pairwise RoPE are the same attention as the original rows
        // with half-split RoPE: only the f32 summation order inside a head can differ.
        for (a, b) in reference.data.iter().zip(&loaded.data) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }

    #[test]
    fn q8_0_weights_stay_close_to_f32_and_keep_the_argmax() {
        let (_, bytes) = tiny_as_gguf(GgmlType::Q8_0);
        let spec = ModelSpec::synthetic("tiny").unwrap();
        let reference = logits(&LlamaModel::synthetic(spec, CpuBackend, 7), &TOKENS);
        let loaded = logits(&from_file(bytes), &TOKENS);
        let mut same_top = 0;
        for r in 0..reference.rows {
            let (a, b) = (reference.row(r), loaded.row(r));
            let err = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            let spread = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(
                err < 0.05 * spread,
                "row {r}: max error {err} against logits up to {spread}"
            );
            let top = |v: &[f32]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
            same_top += usize::from(top(a) == top(b));
        }
        assert!(
            same_top >= reference.rows - 1,
            "argmax kept in {same_top} of {} rows",
            reference.rows
        );
    }

    #[test]
    fn a_wrongly_shaped_or_typed_tensor_is_named() {
        let (_, bytes) = tiny_as_gguf(GgmlType::F32);
        let file = Arc::new(GgufFile::from_bytes(bytes).unwrap());
        let mut spec = file.llama_spec().unwrap();
        spec.intermediate_size += 32;
        let err = file.llama_tensors(&spec).unwrap_err();
        assert!(
            matches!(&err, GgufError::WrongTensorShape { tensor, .. } if tensor == "blk.0.ffn_gate.weight"),
            "{err}"
        );
        // A matrix in a type without kernels is refused by name.
        let mut w = GgufWriter::default();
        let (_, f32_file) = tiny_as_gguf(GgmlType::F32);
        let parsed = GgufFile::from_bytes(f32_file).unwrap();
        for view in parsed.tensor_views() {
            let (dims, dtype, data) = if view.info.name == "blk.1.attn_v.weight" {
                let blocks = view.info.n_elements as usize / 32;
                (
                    view.info.dims.clone(),
                    GgmlType::Q8_1,
                    vec![0u8; blocks * 36],
                )
            } else {
                (view.info.dims.clone(), view.info.dtype, view.bytes.to_vec())
            };
            w = w.tensor(&view.info.name, &dims, dtype, data);
        }
        w.metadata = parsed
            .metadata()
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let file = Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap());
        let err = file.llama_tensors(&file.llama_spec().unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tensor \"blk.1.attn_v.weight\" is Q8_1; Ballast runs F32, F16, BF16, Q8_0, Q4_0, Q4_1, \
             Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights"
        );
    }
}
