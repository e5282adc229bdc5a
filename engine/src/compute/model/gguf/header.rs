//! What a GGUF file says before its tensor data: the header, the metadata and each
//! tensor's info record.

use std::collections::HashMap;

use super::{GgmlType, GgufError, MetaArray, MetaValue};

/// Metadata key/value pairs in file order, with lookup by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds a pair; a key seen before is an error.
    pub(super) fn insert(&mut self, key: String, value: MetaValue) -> Result<(), GgufError> {
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `key` as a string, `None` when absent, an error when another type.
    pub fn str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "string", MetaValue::as_str)
    }

    /// `key` as a non-negative integer of any width.
    pub fn u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.typed(key, "a non-negative integer", MetaValue::as_u64)
    }

    /// `key` as an `f32` or `f64`.
    pub fn f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "f32 or f64", MetaValue::as_f64)
    }

    /// `key` as a bool.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "bool", MetaValue::as_bool)
    }

    /// `key` as an array of any element type.
    pub fn array(&self, key: &str) -> Result<Option<&MetaArray>, GgufError> {
        self.typed(key, "array", MetaValue::as_array)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        get: impl Fn(&'a MetaValue) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => get(v).map(Some).ok_or_else(|| GgufError::WrongType {
                key: key.to_string(),
                expected,
                found: v.type_description(),
            }),
        }
    }
}

/// Where one tensor lives and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions innermost first, as ggml orders them: a `[out, in]` weight matrix has
    /// `dims == [in, out]`, and each of its `out` rows is `in` contiguous elements.
    pub dims: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Elements in the tensor.
    pub n_elements: u64,
    /// Bytes in the tensor.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Elements per row (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }

    /// Rows: the product of every dimension but the innermost (checked not to overflow when
    /// the file was parsed).
    pub fn rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }
}

/// Everything in a GGUF file before the tensor data, with every tensor's range checked
/// against the file length.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// Format version (always [`super::GGUF_VERSION`] once parsed).
    pub version: u32,
    /// Metadata pairs.
    pub metadata: Metadata,
    /// Tensor directory in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of tensor data.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    pub(super) tensor_index: HashMap<String, usize>,
}

impl GgufHeader {
    /// The info of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
}
