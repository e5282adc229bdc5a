//! The model names `--model` accepts besides files: synthetic presets and real models in
//! the model cache.

/// Names accepted after `synthetic:`.
pub const SYNTHETIC_NAMES: [&str; 3] = ["tiny", "small", "llama-3-8b"];

/// A real model `--model` accepts by name, resolved to a file in the model cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// What to pass to `--model`.
    pub name: &'static str,
    /// File name in the cache directory.
    pub file: &'static str,
}

/// Real models known by name. `scripts/fetch-model.sh` puts the default one in the cache.
pub const KNOWN_MODELS: [KnownModel; 1] = [KnownModel {
    name: "smollm2-135m",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
}];
