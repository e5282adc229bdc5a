//! Model shapes, the built-in synthetic models and their deterministic weights.

mod error;
pub mod gguf;
pub mod hf;
mod known;
pub mod llama;
mod sequence;
mod source;
mod spec;

pub use error::{HfError, ModelError};
pub use known::{KNOWN_MODELS, KnownModel, SYNTHETIC_NAMES};
pub use llama::{LayerTensors, LlamaModel, LlamaWeights, ModelTensors};
pub use sequence::Sequence;
pub use source::{ModelSource, ResolvedModel, cached_model_or_skip, model_cache_dir};
pub use spec::{HostLayer, HostWeights, ModelSpec, WeightDtype};
