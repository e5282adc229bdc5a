//! A minimal GGUF writer for tests: builds files in memory so tests own their fixtures, and
//! exposes the raw byte layout so malformed files are easy to make.

use super::{GgmlType, MetaArray, MetaValue};

/// A GGUF file under construction.
#[derive(Debug, Clone)]
pub(crate) struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, MetaValue)>,
    /// Name, dims (innermost first), type, data.
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self {
            version: 3,
            alignment: 32,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    pub fn kv(mut self, key: &str, value: MetaValue) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], dtype: GgmlType, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), dtype, data));
        self
    }

    /// The file's bytes. Tensor data is laid out in order, each at the next multiple of the
    /// alignment, which is also written as `general.alignment` when not the default 32 (and
    /// not already among the pairs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut metadata = self.metadata.clone();
        if self.alignment != 32 && !metadata.iter().any(|(k, _)| k == "general.alignment") {
            metadata.push((
                "general.alignment".into(),
                MetaValue::U32(self.alignment as u32),
            ));
        }
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in &metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, dtype, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&dtype.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).next_multiple_of(self.alignment);
        }
        let data_start = (out.len() as u64).next_multiple_of(self.alignment);
        if !self.tensors.is_empty() {
            out.resize(data_start as usize, 0);
        }
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(a) => put_array(out, a),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &MetaArray) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        MetaArray::Array(items) => items.iter().for_each(|inner| put_array(out, inner)),
        _ => {
            for i in 0..a.len() {
                put_value(out, &a.get(i).expect("index below len"));
            }
        }
    }
}

/// A small valid Llama file: every hyperparameter key, a 6-token gpt2 vocabulary and an F32
/// `token_embd.weight` of `[hidden = 8, vocab = 6]`.
pub(crate) fn tiny_llama() -> GgufWriter {
    let tokens = ["<|im_start|>", "<|im_end|>", "a", "b", "Ġa", "ab"];
    let embd: Vec<u8> = (0..48).flat_map(|i| (i as f32).to_le_bytes()).collect();
    GgufWriter::default()
        .kv("general.architecture", MetaValue::String("llama".into()))
        .kv("general.name", MetaValue::String("Tiny Llama".into()))
        .kv("llama.context_length", MetaValue::U32(2048))
        .kv("llama.embedding_length", MetaValue::U32(8))
        .kv("llama.block_count", MetaValue::U32(2))
        .kv("llama.feed_forward_length", MetaValue::U32(24))
        .kv("llama.attention.head_count", MetaValue::U32(4))
        .kv("llama.attention.head_count_kv", MetaValue::U32(2))
        .kv("llama.rope.freq_base", MetaValue::F32(100_000.0))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .kv("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", MetaValue::String("smollm".into()))
        .kv(
            "tokenizer.ggml.tokens",
            MetaValue::Array(MetaArray::String(
                tokens.iter().map(|t| t.to_string()).collect(),
            )),
        )
        .kv(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(vec![3, 3, 1, 1, 1, 1])),
        )
        .kv(
            "tokenizer.ggml.merges",
            MetaValue::Array(MetaArray::String(vec!["a b".into(), "Ġ a".into()])),
        )
        .kv("tokenizer.ggml.bos_token_id", MetaValue::U32(0))
        .kv("tokenizer.ggml.eos_token_id", MetaValue::U32(1))
        .kv(
            "tokenizer.chat_template",
            MetaValue::String(
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    .into(),
            ),
        )
        .tensor("token_embd.weight", &[8, 6], GgmlType::F32, embd)
}
