//! What `--model` names, resolved: a synthetic model, a known name in the model cache, a
//! GGUF file or a Hugging Face directory, with its tokenizer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::compute::tokenizer::{BpeTokenizer, ByteTokenizer, Tokenizer, TokenizerError};

use super::error::ModelError;
use super::known::KNOWN_MODELS;
use super::llama::ModelTensors;
use super::spec::{ModelSpec, WeightDtype};
use super::{gguf, hf};
use crate::compute::backend::RopeStyle;

/// The model cache: `$BALLAST_MODEL_CACHE`, else `$HOME/.cache/ballast/models` (the same
/// rule as `scripts/fetch-model.sh`).
pub fn model_cache_dir() -> PathBuf {
    match std::env::var_os("BALLAST_MODEL_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            Path::new(&home).join(".cache/ballast/models")
        }
    }
}

/// Test support: the cached file of the known model `name` (see [`KNOWN_MODELS`]) for a test
/// that needs a real model, or `None` when it has not been fetched, so the test can return
/// early; a "skipped" line on stderr says so. With `BALLAST_REQUIRE_MODEL` set (to anything)
/// a missing file panics instead, naming the file and the command that fetches it, so a CI
/// that fetched the model cannot skip these tests silently.
///
/// ```no_run
/// # use ballast_engine::compute::model::{KNOWN_MODELS, cached_model_or_skip};
/// let Some(path) = cached_model_or_skip(KNOWN_MODELS[0].name) else {
///     return; // not cached: skipped
/// };
/// println!("testing {}", path.display());
/// ```
///
/// # Panics
/// When `name` is not a known model, or the file is missing and `BALLAST_REQUIRE_MODEL` is set.
#[doc(hidden)]
pub fn cached_model_or_skip(name: &str) -> Option<PathBuf> {
    let required = std::env::var_os("BALLAST_REQUIRE_MODEL").is_some();
    cached_in_or_skip(&model_cache_dir(), name, required)
}

/// [`cached_model_or_skip`] with the cache directory and the requirement as arguments.
fn cached_in_or_skip(cache: &Path, name: &str, required: bool) -> Option<PathBuf> {
    let known = KNOWN_MODELS
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{name:?} is not one of KNOWN_MODELS"));
    let path = cache.join(known.file);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        !required,
        "BALLAST_REQUIRE_MODEL is set but {} is missing; run scripts/fetch-model.sh",
        path.display()
    );
    eprintln!(
        "skipped: {} is not cached (scripts/fetch-model.sh fetches it)",
        path.display()
    );
    None
}

/// Where a model's weights come from.
#[derive(Clone)]
pub enum ModelSource {
    /// Generated from the engine's seed.
    Synthetic,
    /// A Hugging Face directory: safetensors weights expanded to f32, tokenizer.json.
    Safetensors {
        /// The directory.
        path: PathBuf,
        /// Its tensors.
        tensors: Arc<ModelTensors<'static>>,
        /// Its tokenizer and chat template.
        tokenizer: Arc<dyn Tokenizer>,
    },
    /// A GGUF file, memory-mapped; its tensors already checked against the spec.
    Gguf {
        /// The file.
        path: PathBuf,
        /// The mapped file.
        file: Arc<gguf::GgufFile>,
        /// Its tensors (quantized ones borrow the map).
        tensors: Arc<ModelTensors<'static>>,
        /// Its tokenizer and chat template.
        tokenizer: Arc<dyn Tokenizer>,
    },
}

impl std::fmt::Debug for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Synthetic => f.write_str("Synthetic"),
            ModelSource::Gguf { path, .. } => f.debug_tuple("Gguf").field(path).finish(),
            ModelSource::Safetensors { path, .. } => {
                f.debug_tuple("Safetensors").field(path).finish()
            }
        }
    }
}

/// A `--model` value resolved to shapes and a weight source.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    /// Shapes.
    pub spec: ModelSpec,
    /// Weights.
    pub source: ModelSource,
}

impl ResolvedModel {
    /// Resolves a `--model` value for the CPU backend: `synthetic:NAME`, a known name
    /// ([`KNOWN_MODELS`]) or a path to a `.gguf` file. A file is mapped and every tensor it
    /// needs is checked, so a bad file fails here, before the engine starts.
    pub fn resolve(model: &str) -> Result<Self, ModelError> {
        Self::resolve_on(model, false)
    }

    /// [`ResolvedModel::resolve`] for a backend on a GPU (`gpu`), which also takes the
    /// synthetic models too large for the CPU.
    pub fn resolve_on(model: &str, gpu: bool) -> Result<Self, ModelError> {
        if let Some(name) = model.strip_prefix("synthetic:") {
            let spec = ModelSpec::synthetic(name)?;
            if !gpu && spec.num_params() > 1_000_000_000 {
                return Err(ModelError::NeedsGpu(
                    spec.name.clone(),
                    format!("{:.1} B", spec.num_params() as f64 / 1e9),
                ));
            }
            return Ok(Self {
                spec,
                source: ModelSource::Synthetic,
            });
        }
        let path = match KNOWN_MODELS.iter().find(|m| m.name == model) {
            Some(known) => {
                let path = model_cache_dir().join(known.file);
                if !path.is_file() {
                    return Err(ModelError::NotCached {
                        name: known.name.to_string(),
                        path,
                    });
                }
                path
            }
            None => PathBuf::from(model),
        };
        if path.is_dir() && path.join("config.json").is_file() {
            return Self::open_hf_dir(&path);
        }
        if !path.is_file() {
            return Err(ModelError::NotFound(model.to_string()));
        }
        if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
            return Err(ModelError::UnsupportedFormat(path));
        }
        Self::open_gguf(&path)
    }

    /// Reads a Hugging Face directory: `config.json`, every `*.safetensors`, the tokenizer
    /// files and `generation_config.json`'s EOS ids.
    pub fn open_hf_dir(dir: &Path) -> Result<Self, ModelError> {
        let err = |source| ModelError::Hf {
            path: dir.to_path_buf(),
            source,
        };
        let model = hf::HfModel::open(dir).map_err(err)?;
        let tensors = model.tensors().map_err(err)?;
        let tokenizer = model.tokenizer(dir)?;
        if tokenizer.vocab_size() > model.spec.vocab_size {
            return Err(ModelError::Tokenizer {
                path: dir.to_path_buf(),
                source: TokenizerError::Invalid {
                    key: "tokenizer.json".into(),
                    reason: format!(
                        "{} tokens, but the embedding table has {} rows",
                        tokenizer.vocab_size(),
                        model.spec.vocab_size
                    ),
                },
            });
        }
        Ok(Self {
            spec: model.spec,
            source: ModelSource::Safetensors {
                path: dir.to_path_buf(),
                tensors: Arc::new(tensors),
                tokenizer: Arc::new(tokenizer),
            },
        })
    }

    /// Maps a GGUF file and checks its hyperparameters and tensors.
    pub fn open_gguf(path: &Path) -> Result<Self, ModelError> {
        let err = |source| ModelError::File {
            path: path.to_path_buf(),
            source,
        };
        let file = Arc::new(gguf::GgufFile::open(path).map_err(err)?);
        let spec = file.llama_spec().map_err(err)?;
        let tensors = file.llama_tensors(&spec).map_err(err)?;
        let tokenizer = file.tokenizer_metadata().map_err(err).and_then(|meta| {
            BpeTokenizer::from_gguf(&meta).map_err(|source| ModelError::Tokenizer {
                path: path.to_path_buf(),
                source,
            })
        })?;
        if tokenizer.vocab_size() > spec.vocab_size {
            return Err(ModelError::Tokenizer {
                path: path.to_path_buf(),
                source: TokenizerError::Invalid {
                    key: "tokenizer.ggml.tokens".into(),
                    reason: format!(
                        "{} tokens, but the embedding table has {} rows",
                        tokenizer.vocab_size(),
                        spec.vocab_size
                    ),
                },
            });
        }
        Ok(Self {
            spec,
            source: ModelSource::Gguf {
                path: path.to_path_buf(),
                file,
                tensors: Arc::new(tensors),
                tokenizer: Arc::new(tokenizer),
            },
        })
    }
}

impl ModelSpec {
    /// Shapes of a built-in synthetic model.
    pub fn synthetic(name: &str) -> Result<Self, ModelError> {
        let byte_vocab = ByteTokenizer::VOCAB_SIZE;
        let spec = match name {
            // Small enough that a debug-build test runs a full request in milliseconds.
            "tiny" => Self {
                name: "synthetic:tiny".into(),
                vocab_size: byte_vocab,
                hidden_size: 64,
                num_layers: 2,
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 16,
                intermediate_size: 176,
                max_model_len: 1024,
                rope_theta: 10_000.0,
                rms_norm_eps: 1e-5,
                rope_style: RopeStyle::Halves,
                weight_dtype: WeightDtype::F32,
                kv_dtype: crate::compute::backend::KvDtype::F32,
            },
            // About 25 M parameters: a CPU benchmark model whose steps cost milliseconds.
            "small" => Self {
                name: "synthetic:small".into(),
                vocab_size: byte_vocab,
                hidden_size: 512,
                num_layers: 8,
                num_heads: 8,
                num_kv_heads: 4,
                head_dim: 64,
                intermediate_size: 1408,
                max_model_len: 4096,
                rope_theta: 10_000.0,
                rms_norm_eps: 1e-5,
                rope_style: RopeStyle::Halves,
                weight_dtype: WeightDtype::F32,
                kv_dtype: crate::compute::backend::KvDtype::F32,
            },
            // Llama-3-8B's shapes, so GPU benchmarks run at a realistic size.
            "llama-3-8b" => Self {
                name: "synthetic:llama-3-8b".into(),
                vocab_size: 128_256,
                hidden_size: 4096,
                num_layers: 32,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 128,
                intermediate_size: 14_336,
                max_model_len: 8192,
                rope_theta: 500_000.0,
                rms_norm_eps: 1e-5,
                rope_style: RopeStyle::Halves,
                weight_dtype: WeightDtype::Bf16,
                kv_dtype: crate::compute::backend::KvDtype::F32,
            },
            other => return Err(ModelError::UnknownSynthetic(other.to_string())),
        };
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::model::{HostWeights, SYNTHETIC_NAMES};

    #[test]
    fn presets_have_consistent_shapes() {
        for name in SYNTHETIC_NAMES {
            let s = ModelSpec::synthetic(name).unwrap();
            assert_eq!(s.num_heads % s.num_kv_heads, 0, "{name}");
            assert_eq!(s.head_dim % 2, 0, "{name}");
        }
        assert!(ModelSpec::synthetic("small").unwrap().num_params() > 20_000_000);
    }

    #[test]
    fn model_arg_errors_are_specific() {
        let resolve = |m: &str| ResolvedModel::resolve(m).map(|r| r.spec);
        assert!(matches!(
            resolve("synthetic:huge"),
            Err(ModelError::UnknownSynthetic(_))
        ));
        assert!(matches!(
            resolve("synthetic:llama-3-8b"),
            Err(ModelError::NeedsGpu(..))
        ));
        assert!(matches!(resolve("/models/x"), Err(ModelError::NotFound(_))));
        let not_gguf = std::env::current_exe().unwrap();
        assert!(matches!(
            resolve(not_gguf.to_str().unwrap()),
            Err(ModelError::UnsupportedFormat(_))
        ));
        assert_eq!(resolve("synthetic:tiny").unwrap().hidden_size, 64);
    }

    #[test]
    fn cached_model_is_found_skipped_or_required() {
        let cache = std::env::temp_dir().join(format!("ballast-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        std::fs::create_dir_all(&cache).unwrap();
        let name = KNOWN_MODELS[0].name;
        let file = cache.join(KNOWN_MODELS[0].file);

        assert_eq!(cached_in_or_skip(&cache, name, false), None);
        let required = std::panic::catch_unwind(|| cached_in_or_skip(&cache, name, true));
        let message = required.expect_err("a required, missing model panics");
        let message = message.downcast_ref::<String>().unwrap();
        assert!(message.contains(file.to_str().unwrap()), "{message}");
        assert!(message.contains("scripts/fetch-model.sh"), "{message}");

        // A directory by the file's name is not the model.
        std::fs::create_dir(&file).unwrap();
        assert_eq!(cached_in_or_skip(&cache, name, false), None);
        std::fs::remove_dir(&file).unwrap();

        std::fs::write(&file, b"GGUF").unwrap();
        assert_eq!(cached_in_or_skip(&cache, name, false), Some(file.clone()));
        assert_eq!(cached_in_or_skip(&cache, name, true), Some(file));
        let _ = std::fs::remove_dir_all(cache);
    }

    #[test]
    fn weights_depend_on_seed_only() {
        let spec = ModelSpec::synthetic("tiny").unwrap();
        let a = HostWeights::synthetic(&spec, 1);
        let b = HostWeights::synthetic(&spec, 1);
        let c = HostWeights::synthetic(&spec, 2);
        assert_eq!(a.layers[1].w_down, b.layers[1].w_down);
        assert_ne!(a.layers[1].w_down, c.layers[1].w_down);
        assert_eq!(a.embed.len(), spec.vocab_size * spec.hidden_size);
    }
}
