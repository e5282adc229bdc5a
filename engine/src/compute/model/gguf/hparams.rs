//! What a GGUF file's metadata says about the model: Llama hyperparameters as a
//! [`ModelSpec`], and the raw tokenizer and chat-template values.

use std::ops::Deref;

use super::{GgufError, GgufFile, MetaArray, Metadata, SUPPORTED_ARCHITECTURES};
use crate::compute::backend::RopeStyle;
use crate::compute::model::ModelSpec;
use crate::compute::tokenizer::TokenizerMetadata;

/// RoPE base when `{arch}.rope.freq_base` is absent (the GGUF spec makes it optional).
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

impl<D: Deref<Target = [u8]>> GgufFile<D> {
    /// The model's shapes from `general.architecture` and the `{arch}.*` keys.
    ///
    /// Required: `context_length`, `embedding_length`, `block_count`, `feed_forward_length`,
    /// `attention.head_count`, `attention.layer_norm_rms_epsilon` and the
    /// `tokenizer.ggml.tokens` array (the vocabulary size). Optional, as in the GGUF spec:
    /// `attention.head_count_kv` (defaults to the head count) and `rope.freq_base` (10,000).
    /// When the file has `token_embd.weight`, its shape must be `[hidden, vocab]`.
    pub fn llama_spec(&self) -> Result<ModelSpec, GgufError> {
        let md = self.metadata();
        let arch = md
            .str("general.architecture")?
            .ok_or_else(|| GgufError::MissingKey("general.architecture".into()))?;
        if !SUPPORTED_ARCHITECTURES.contains(&arch) {
            return Err(GgufError::UnsupportedArchitecture(arch.to_string()));
        }
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let count = |suffix: &str| required_count(md, &key(suffix));

        let max_model_len = count("context_length")?;
        let hidden_size = count("embedding_length")?;
        let num_layers = count("block_count")?;
        let intermediate_size = count("feed_forward_length")?;
        let num_heads = count("attention.head_count")?;
        let num_kv_heads = match md.u64(&key("attention.head_count_kv"))? {
            None => num_heads,
            Some(_) => count("attention.head_count_kv")?,
        };
        if !num_heads.is_multiple_of(num_kv_heads) {
            return Err(invalid(
                key("attention.head_count_kv"),
                format!("{num_kv_heads} KV heads do not divide {num_heads} query heads"),
            ));
        }
        let head_dim = match md.u64(&key("attention.key_length"))? {
            Some(_) => count("attention.key_length")?,
            None if hidden_size.is_multiple_of(num_heads) => hidden_size / num_heads,
            None => {
                return Err(invalid(
                    key("attention.head_count"),
                    format!("{num_heads} heads do not divide the embedding length {hidden_size}"),
                ));
            }
        };
        if let Some(v) = md.u64(&key("attention.value_length"))?
            && v != head_dim as u64
        {
            return Err(invalid(
                key("attention.value_length"),
                format!("{v} differs from the key length {head_dim}; Ballast needs them equal"),
            ));
        }
        if !head_dim.is_multiple_of(2) {
            return Err(invalid(
                key("attention.head_count"),
                format!("head size {head_dim} is odd; RoPE needs an even head size"),
            ));
        }
        if let Some(d) = md.u64(&key("rope.dimension_count"))?
            && d != head_dim as u64
        {
            return Err(invalid(
                key("rope.dimension_count"),
                format!("partial rotary embedding ({d} of {head_dim}) is not supported"),
            ));
        }
        if let Some(t) = md.str(&key("rope.scaling.type"))?
            && t != "none"
        {
            return Err(invalid(
                key("rope.scaling.type"),
                format!("RoPE scaling {t:?} is not supported"),
            ));
        }
        let rope_theta = positive_float(md, &key("rope.freq_base"))?.unwrap_or(DEFAULT_ROPE_THETA);
        let eps_key = key("attention.layer_norm_rms_epsilon");
        let rms_norm_eps = positive_float(md, &eps_key)?.ok_or(GgufError::MissingKey(eps_key))?;

        let tokens = md
            .array("tokenizer.ggml.tokens")?
            .ok_or_else(|| GgufError::MissingKey("tokenizer.ggml.tokens".into()))?;
        let vocab_size = tokens.len();
        if vocab_size == 0 {
            return Err(invalid("tokenizer.ggml.tokens", "is empty".into()));
        }
        if let Some(n) = md.u64(&key("vocab_size"))?
            && n != vocab_size as u64
        {
            return Err(invalid(
                key("vocab_size"),
                format!("{n} differs from the {vocab_size} tokens of tokenizer.ggml.tokens"),
            ));
        }
        if let Some(embd) = self.header().tensor_info("token_embd.weight") {
            let want = [hidden_size as u64, vocab_size as u64];
            if embd.dims != want {
                return Err(invalid(
                    "token_embd.weight",
                    format!(
                        "shape {:?} does not match [embedding_length, vocabulary] = {want:?}",
                        embd.dims
                    ),
                ));
            }
        }

        let name = md.str("general.name")?.unwrap_or(arch).to_string();
        Ok(ModelSpec {
            name,
            vocab_size,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            max_model_len,
            rope_theta: rope_theta as f32,
            rms_norm_eps: rms_norm_eps as f32,
            // llama.cpp's converter permutes Llama Q/K rows for its pairwise rotation.
            rope_style: RopeStyle::Pairs,
            weight_dtype: crate::compute::model::WeightDtype::F32,
            kv_dtype: crate::compute::backend::KvDtype::F32,
        })
    }

    /// The tokenizer's raw metadata (`tokenizer.ggml.*`) and `tokenizer.chat_template`.
    /// Lengths and special-token ids are checked against the vocabulary.
    pub fn tokenizer_metadata(&self) -> Result<TokenizerMetadata<'_>, GgufError> {
        TokenizerMetadata::from_metadata(self.metadata())
    }
}

impl<'a> TokenizerMetadata<'a> {
    fn from_metadata(md: &'a Metadata) -> Result<Self, GgufError> {
        let model = md
            .str("tokenizer.ggml.model")?
            .ok_or_else(|| GgufError::MissingKey("tokenizer.ggml.model".into()))?;
        let tokens = typed_array(
            md,
            "tokenizer.ggml.tokens",
            "array of string",
            |a| match a {
                MetaArray::String(v) => Some(v.as_slice()),
                _ => None,
            },
        )?
        .ok_or_else(|| GgufError::MissingKey("tokenizer.ggml.tokens".into()))?;
        let token_types = typed_array(
            md,
            "tokenizer.ggml.token_type",
            "array of i32",
            |a| match a {
                MetaArray::I32(v) => Some(v.as_slice()),
                _ => None,
            },
        )?;
        let scores = typed_array(md, "tokenizer.ggml.scores", "array of f32", |a| match a {
            MetaArray::F32(v) => Some(v.as_slice()),
            _ => None,
        })?;
        for (key, len) in [
            ("tokenizer.ggml.token_type", token_types.map(<[_]>::len)),
            ("tokenizer.ggml.scores", scores.map(<[_]>::len)),
        ] {
            if let Some(len) = len
                && len != tokens.len()
            {
                return Err(invalid(
                    key,
                    format!("has {len} entries for {} tokens", tokens.len()),
                ));
            }
        }
        let merges = typed_array(
            md,
            "tokenizer.ggml.merges",
            "array of string",
            |a| match a {
                MetaArray::String(v) => Some(v.as_slice()),
                _ => None,
            },
        )?;
        let token_id = |key: &str| -> Result<Option<u32>, GgufError> {
            match md.u64(key)? {
                None => Ok(None),
                Some(id) if id < tokens.len() as u64 => Ok(Some(id as u32)),
                Some(id) => Err(invalid(
                    key,
                    format!(
                        "token id {id} is outside the {}-token vocabulary",
                        tokens.len()
                    ),
                )),
            }
        };
        Ok(Self {
            model,
            pre: md.str("tokenizer.ggml.pre")?,
            tokens,
            token_types,
            scores,
            merges,
            bos_token_id: token_id("tokenizer.ggml.bos_token_id")?,
            eos_token_id: token_id("tokenizer.ggml.eos_token_id")?,
            unknown_token_id: token_id("tokenizer.ggml.unknown_token_id")?,
            padding_token_id: token_id("tokenizer.ggml.padding_token_id")?,
            add_bos_token: md.bool("tokenizer.ggml.add_bos_token")?,
            chat_template: md.str("tokenizer.chat_template")?,
        })
    }
}

fn typed_array<'a, T: ?Sized>(
    md: &'a Metadata,
    key: &str,
    expected: &'static str,
    get: impl Fn(&'a MetaArray) -> Option<&'a T>,
) -> Result<Option<&'a T>, GgufError> {
    let Some(value) = md.get(key) else {
        return Ok(None);
    };
    value
        .as_array()
        .and_then(get)
        .map(Some)
        .ok_or_else(|| GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: value.type_description(),
        })
}

fn required_count(md: &Metadata, key: &str) -> Result<usize, GgufError> {
    let v = md
        .u64(key)?
        .ok_or_else(|| GgufError::MissingKey(key.to_string()))?;
    match usize::try_from(v) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(invalid(key, format!("{v} is not a usable size"))),
    }
}

fn positive_float(md: &Metadata, key: &str) -> Result<Option<f64>, GgufError> {
    match md.f64(key)? {
        Some(v) if !(v.is_finite() && v > 0.0) => {
            Err(invalid(key, format!("{v} is not a positive number")))
        }
        other => Ok(other),
    }
}

fn invalid(key: impl Into<String>, reason: String) -> GgufError {
    GgufError::InvalidHyperparameter {
        key: key.into(),
        reason,
    }
}
