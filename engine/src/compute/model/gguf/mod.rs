//! GGUF v3 model files: header, metadata, tensor directory and memory-mapped tensor data.
//!
//! A GGUF file is a header (magic `GGUF`, version, tensor and metadata counts), metadata
//! key/value pairs, one info record per tensor (name, dims, ggml type, offset) and, after
//! padding to the file's alignment, the tensor data. [`GgufFile::open`] maps the file and
//! parses everything before the data; tensor bytes stay in the page cache until a caller reads
//! them through a [`TensorView`].
//!
//! Every length and offset is checked against the bytes that are there before it is used, so a
//! truncated or hostile file gives a [`GgufError`], never a panic or an allocation larger than
//! the file justifies.
//!
//! ```no_run
//! use ballast_engine::compute::model::gguf::GgufFile;
//! let file = GgufFile::open("model.gguf".as_ref())?;
//! let spec = file.llama_spec()?;
//! let embed = file.tensor("token_embd.weight")?.dequantize()?;
//! assert_eq!(embed.len(), spec.vocab_size * spec.hidden_size);
//! # Ok::<(), ballast_engine::compute::model::gguf::GgufError>(())
//! ```

mod dtype;
mod hparams;
mod parse;
mod value;
mod weights;

#[cfg(test)]
pub(crate) mod test_writer;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use dtype::{DEQUANTIZABLE, GgmlType, QK, QK_K, dequantize, k_scale_min, type_list};
pub use hparams::{SUPPORTED_ARCHITECTURES, TokenizerMetadata};
pub use value::{MetaArray, MetaValue, ValueType};
pub use weights::{WEIGHT_TYPES, quant_format, quant_format_type};

/// The only version read: v3 is what every current converter writes. v1 used 32-bit counts
/// and v2 differs from v3 only in lacking big-endian files, but neither is worth a code path
/// that nothing exercises.
pub const GGUF_VERSION: u32 = 3;
/// `GGUF` in file order.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's limit).
pub const MAX_DIMS: usize = 4;

/// What is wrong with a GGUF file, or with a request made of one.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file ends inside a field.
    #[error(
        "GGUF file is truncated: {what} at byte {offset} needs {needed} bytes, {available} remain"
    )]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs (may be absurd in a hostile file).
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes are {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    /// A version other than 3.
    #[error("GGUF version {0} is not supported; only version {GGUF_VERSION} is")]
    UnsupportedVersion(u32),
    /// A version whose bytes read as a byte-swapped 3.
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    /// A count (metadata pairs, tensors, array elements) larger than the remaining bytes can hold.
    #[error(
        "{what} count {count} at byte {offset} cannot fit in the {available} bytes that remain"
    )]
    CountTooLarge {
        /// What is being counted.
        what: &'static str,
        /// The count in the file.
        count: u64,
        /// Where it was read.
        offset: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A metadata value type tag outside 0..=12.
    #[error("metadata {key:?}: unknown value type {type_id}")]
    UnknownValueType {
        /// The key whose value has the tag.
        key: String,
        /// The tag.
        type_id: u32,
    },
    /// A string that is not UTF-8.
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field.
        what: &'static str,
        /// Where its bytes start.
        offset: u64,
    },
    /// A bool byte other than 0 or 1.
    #[error("metadata {key:?}: bool byte {byte} is neither 0 nor 1")]
    InvalidBool {
        /// The key.
        key: String,
        /// The byte.
        byte: u8,
    },
    /// Arrays nested more than 8 deep (real files never nest).
    #[error("metadata {key:?}: arrays nested more than {max} deep")]
    ArrayTooDeep {
        /// The key.
        key: String,
        /// The limit.
        max: usize,
    },
    /// The same metadata key twice.
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    /// The same tensor name twice.
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    /// `general.alignment` is not a non-zero power of two (or not an integer).
    #[error("general.alignment {0} is not a power of two")]
    BadAlignment(String),
    /// A tensor with no dimensions or more than [`MAX_DIMS`].
    #[error("tensor {tensor:?} has {n_dims} dimensions; 1 to {MAX_DIMS} are allowed")]
    BadDimCount {
        /// The tensor.
        tensor: String,
        /// Its dimension count.
        n_dims: u32,
    },
    /// A ggml type id this reader does not know.
    #[error("tensor {tensor:?} has unknown ggml type {type_id}")]
    UnknownGgmlType {
        /// The tensor.
        tensor: String,
        /// The id.
        type_id: u32,
    },
    /// Dimensions that overflow or do not fit the type's blocks.
    #[error("tensor {tensor:?} has an invalid shape {dims:?} for {dtype}: {reason}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// Its dims, innermost first.
        dims: Vec<u64>,
        /// Its type.
        dtype: GgmlType,
        /// Why.
        reason: &'static str,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor {tensor:?} offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset within the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose bytes run past the end of the file.
    #[error(
        "tensor {tensor:?} occupies bytes {start}..{end} but the file has {file_len} bytes (truncated download?)"
    )]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// First byte (may be absurd in a hostile file).
        start: u128,
        /// One past the last byte.
        end: u128,
        /// File length.
        file_len: u64,
    },
    /// A row index past the last row.
    #[error("tensor {tensor:?} has {rows} rows; row {row} does not exist")]
    RowOutOfRange {
        /// The tensor.
        tensor: String,
        /// The row asked for.
        row: u64,
        /// Rows in the tensor.
        rows: u64,
    },
    /// No tensor of that name.
    #[error("no tensor named {0:?} in the GGUF file")]
    TensorNotFound(String),
    /// Dequantization of a type without a reference implementation yet.
    #[error("dequantizing {0} is not supported yet; supported: {list}", list = type_list(&DEQUANTIZABLE))]
    DequantUnsupported(GgmlType),
    /// Bytes and output length that do not match.
    #[error("{bytes} bytes of {dtype} do not hold exactly {elements} elements")]
    DequantLength {
        /// The type.
        dtype: GgmlType,
        /// Bytes given.
        bytes: usize,
        /// Elements asked for.
        elements: usize,
    },
    /// A metadata key the model needs is absent.
    #[error("GGUF metadata has no {0:?}")]
    MissingKey(String),
    /// A metadata value of the wrong type.
    #[error("metadata {key:?} is {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What was wanted.
        expected: &'static str,
        /// What the file has.
        found: String,
    },
    /// `general.architecture` names a model Ballast cannot run.
    #[error("model architecture {0:?} is not supported; supported: {list}", list = SUPPORTED_ARCHITECTURES.join(", "))]
    UnsupportedArchitecture(String),
    /// A hyperparameter that is present but unusable.
    #[error("metadata {key:?}: {reason}")]
    InvalidHyperparameter {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// A model tensor whose shape differs from what the hyperparameters say.
    #[error("tensor {tensor:?} has dims {found:?}; the hyperparameters need {expected:?}")]
    WrongTensorShape {
        /// The tensor.
        tensor: String,
        /// Dims expected, innermost first.
        expected: Vec<u64>,
        /// Dims in the file.
        found: Vec<u64>,
    },
    /// A model tensor in a type the engine cannot compute with.
    #[error(
        "tensor {tensor:?} is {dtype}; Ballast runs {list} weights",
        list = type_list(&WEIGHT_TYPES)
    )]
    UnsupportedTensorType {
        /// The tensor.
        tensor: String,
        /// Its type.
        dtype: GgmlType,
    },
}

impl GgufError {
    /// Stable short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            GgufError::Io { .. } => "io",
            GgufError::Truncated { .. } => "truncated",
            GgufError::BadMagic(_) => "bad_magic",
            GgufError::UnsupportedVersion(_) => "unsupported_version",
            GgufError::BigEndian => "big_endian",
            GgufError::CountTooLarge { .. } => "count_too_large",
            GgufError::UnknownValueType { .. } => "unknown_value_type",
            GgufError::InvalidUtf8 { .. } => "invalid_utf8",
            GgufError::InvalidBool { .. } => "invalid_bool",
            GgufError::ArrayTooDeep { .. } => "array_too_deep",
            GgufError::DuplicateKey(_) => "duplicate_key",
            GgufError::DuplicateTensor(_) => "duplicate_tensor",
            GgufError::BadAlignment(_) => "bad_alignment",
            GgufError::BadDimCount { .. } => "bad_dim_count",
            GgufError::UnknownGgmlType { .. } => "unknown_ggml_type",
            GgufError::BadShape { .. } => "bad_shape",
            GgufError::MisalignedTensor { .. } => "misaligned_tensor",
            GgufError::TensorOutOfBounds { .. } => "tensor_out_of_bounds",
            GgufError::RowOutOfRange { .. } => "row_out_of_range",
            GgufError::TensorNotFound(_) => "tensor_not_found",
            GgufError::DequantUnsupported(_) => "dequant_unsupported",
            GgufError::DequantLength { .. } => "dequant_length",
            GgufError::MissingKey(_) => "missing_key",
            GgufError::WrongType { .. } => "wrong_type",
            GgufError::UnsupportedArchitecture(_) => "unsupported_architecture",
            GgufError::InvalidHyperparameter { .. } => "invalid_hyperparameter",
            GgufError::WrongTensorShape { .. } => "wrong_tensor_shape",
            GgufError::UnsupportedTensorType { .. } => "unsupported_tensor_type",
        }
    }
}

/// Metadata key/value pairs in file order, with lookup by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds a pair; a key seen before is an error.
    fn insert(&mut self, key: String, value: MetaValue) -> Result<(), GgufError> {
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
    /// Format version (always [`GGUF_VERSION`] once parsed).
    pub version: u32,
    /// Metadata pairs.
    pub metadata: Metadata,
    /// Tensor directory in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of tensor data.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    tensor_index: HashMap<String, usize>,
}

impl GgufHeader {
    /// Parses the header of a GGUF file whose whole contents are `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Self, GgufError> {
        parse::parse_header(bytes)
    }

    /// The info of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
}

/// A parsed GGUF file over its bytes: a memory map ([`GgufFile::open`]) or, in tests, any
/// byte buffer ([`GgufFile::from_bytes`]).
pub struct GgufFile<D = Mmap> {
    data: D,
    header: GgufHeader,
}

/// Shows the header and length, not the (possibly gigabytes of) bytes.
impl<D: Deref<Target = [u8]>> std::fmt::Debug for GgufFile<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("len", &self.data.len())
            .field("header", &self.header)
            .finish()
    }
}

impl GgufFile<Mmap> {
    /// Maps and parses the file at `path`. Tensor data is not read.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Like every mmap-based model
        // loader, we rely on nobody truncating or rewriting the model file while it is served;
        // if someone does, reads may fault, but no Rust reference outlives the map.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_bytes(map)
    }

    /// Drops this process's resident pages of the map (`MADV_DONTNEED`): for once the weights
    /// were copied out (repacked for the AVX-512 kernel) and the map is no longer read, so that
    /// resident memory does not count the model twice. A later read faults the pages back in
    /// from the page cache or the file, unchanged.
    pub fn release_resident_pages(&self) {
        #[cfg(unix)]
        // SAFETY: the map is shared and read-only, so a dropped page reads back exactly as it
        // was; no reference into it is invalidated.
        if let Err(e) = unsafe {
            self.data
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        } {
            tracing::debug!("madvise(DONTNEED) on the model map: {e}");
        }
    }
}

/// The whole file, so tensors can borrow from a shared file ([`crate::compute::backend::quant::SharedBytes`]).
impl<D: Deref<Target = [u8]>> AsRef<[u8]> for GgufFile<D> {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl<D: Deref<Target = [u8]>> GgufFile<D> {
    /// Parses a GGUF file held in `data`.
    pub fn from_bytes(data: D) -> Result<Self, GgufError> {
        let header = GgufHeader::parse(&data)?;
        Ok(Self { data, header })
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// Metadata pairs.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Tensor directory in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// File length in bytes.
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Whether the file is empty (never true for a parsed file).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// A view of tensor `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self
            .header
            .tensor_info(name)
            .ok_or_else(|| GgufError::TensorNotFound(name.to_string()))?;
        Ok(self.view(info))
    }

    /// Views of every tensor in file order.
    pub fn tensor_views(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.header.tensors.iter().map(|info| self.view(info))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // Parsing checked start + n_bytes <= file length for every tensor.
        let start = (self.header.data_offset + info.offset) as usize;
        TensorView {
            info,
            bytes: &self.data[start..start + info.n_bytes as usize],
        }
    }
}

/// One tensor's info and its bytes in the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// Name, shape, type.
    pub info: &'a TensorInfo,
    /// Exactly `info.n_bytes` bytes, in the mapped file.
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    /// The whole tensor as f32, in row-major order (rows of `dims[0]` elements).
    pub fn dequantize(&self) -> Result<Vec<f32>, GgufError> {
        if !self.info.dtype.can_dequantize() {
            return Err(GgufError::DequantUnsupported(self.info.dtype));
        }
        // Bounded by the file: no supported type packs more than two elements in a byte.
        let mut out = vec![0.0; self.info.n_elements as usize];
        dequantize(self.info.dtype, self.bytes, &mut out)?;
        Ok(out)
    }

    /// Row `row` (of `dims[0]` elements) as f32, into `out`.
    pub fn dequantize_row(&self, row: u64, out: &mut [f32]) -> Result<(), GgufError> {
        let row_bytes = self.info.dtype.bytes_for(self.info.row_len()).unwrap_or(0);
        if row >= self.info.rows() {
            return Err(GgufError::RowOutOfRange {
                tensor: self.info.name.clone(),
                row,
                rows: self.info.rows(),
            });
        }
        let start = (row * row_bytes) as usize;
        dequantize(
            self.info.dtype,
            &self.bytes[start..start + row_bytes as usize],
            out,
        )
    }
}
