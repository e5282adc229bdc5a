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

mod dequant;
mod dtype;
mod error;
mod file;
mod header;
mod hparams;
mod parse;
mod support;
mod value;
mod weights;

#[cfg(test)]
pub(crate) mod test_writer;
#[cfg(test)]
mod tests;

pub use crate::compute::tokenizer::TokenizerMetadata;
pub use dequant::dequantize;
pub use dtype::{DEQUANTIZABLE, GgmlType, QK, QK_K, type_list};
pub use value::{MetaArray, MetaValue, ValueType};
pub use weights::{quant_format, quant_format_type};

pub use error::GgufError;
pub use file::{GgufFile, TensorView};
pub use header::{GgufHeader, Metadata, TensorInfo};
pub use support::{
    DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_DIMS, SUPPORTED_ARCHITECTURES, WEIGHT_TYPES,
};
