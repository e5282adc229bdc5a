//! What is wrong with a GGUF file, or with a request made of one.

use std::path::PathBuf;

use super::{
    DEQUANTIZABLE, GGUF_VERSION, GgmlType, MAX_DIMS, SUPPORTED_ARCHITECTURES, WEIGHT_TYPES,
    type_list,
};

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
