//! What can be wrong with a `--model` value, a model file or a Hugging Face directory.

use std::path::PathBuf;

use super::gguf::GgufError;
use super::known::{KNOWN_MODELS, SYNTHETIC_NAMES};
use crate::compute::tokenizer::TokenizerError;

/// Errors naming what is wrong with a `--model` value.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `synthetic:NAME` with an unknown NAME.
    #[error("unknown synthetic model {0:?}; available: {available}", available = SYNTHETIC_NAMES.join(", "))]
    UnknownSynthetic(String),
    /// A model that needs a GPU backend.
    #[error(
        "{0} has {1} parameters and is reserved for the CUDA backend; use synthetic:tiny or synthetic:small on CPU"
    )]
    NeedsGpu(String, String),
    /// Neither a synthetic model, a known name nor an existing file.
    #[error(
        "--model {0:?} is not a file, a known model ({known}) or synthetic:NAME ({synthetic})",
        known = KNOWN_MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", "),
        synthetic = SYNTHETIC_NAMES.join(", ")
    )]
    NotFound(String),
    /// A known model whose file has not been fetched.
    #[error(
        "{name} is not in the model cache (looked for {path}); run scripts/fetch-model.sh first, or set BALLAST_MODEL_CACHE"
    )]
    NotCached {
        /// The documented name.
        name: String,
        /// Where its file should be.
        path: PathBuf,
    },
    /// A file that is not a model Ballast can run.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: GgufError,
    },
    /// A model file whose tokenizer cannot be built.
    #[error("{path}: {source}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What is wrong with the tokenizer.
        source: TokenizerError,
    },
    /// A Hugging Face directory that cannot be served.
    #[error("{path}: {source}")]
    Hf {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        source: HfError,
    },
    /// A file format Ballast does not read.
    #[error(
        "{0}: Ballast reads GGUF files (.gguf) and Hugging Face directories (config.json with *.safetensors)"
    )]
    UnsupportedFormat(PathBuf),
}

/// What is wrong with a Hugging Face directory.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// A file that cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A JSON file that does not parse, or lacks or mistypes a key.
    #[error("{file}: {reason}")]
    Config {
        /// `config.json`, `generation_config.json`, …
        file: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A model this loader cannot run.
    #[error("config.json: {0}")]
    Unsupported(String),
    /// A safetensors file that does not parse.
    #[error("{path}: not a safetensors file: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// A tensor missing from every file.
    #[error("no tensor named {0:?} in the directory's safetensors files")]
    Missing(String),
    /// The same tensor in two files.
    #[error("tensor {0:?} appears in more than one safetensors file")]
    Duplicate(String),
    /// A tensor whose shape or type does not fit.
    #[error("tensor {tensor:?}: {reason}")]
    Tensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
}
