//! Why a tokenizer could not be built from a model's files, and the pre-tokenizers that
//! can be.

use super::ChatTemplateError;

/// Values of `tokenizer.ggml.pre` that [`super::BpeTokenizer::from_gguf`] accepts:
///
/// - `smollm`: Hugging Face SmolLM2's pre-tokenizer, every digit on its own, then GPT-2's
///   byte-level split (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_SMOLLM`);
/// - `gpt2` and `gpt-2` (the name llama.cpp's converter writes): GPT-2's byte-level split;
/// - `llama-bpe`, `llama3` and `llama-v3`: Llama 3's split (contractions, letters, numbers
///   of up to three digits, punctuation, newlines), then byte-level without a regex, with
///   `ignore_merges` (a word already in the vocabulary is one token).
pub const SUPPORTED_PRE_TOKENIZERS: [&str; 6] =
    ["smollm", "gpt2", "gpt-2", "llama-bpe", "llama3", "llama-v3"];

/// Why a tokenizer could not be built from a model's files.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a tokenizer Ballast does not implement (SentencePiece
    /// `llama`, WordPiece `bert`, …).
    #[error("tokenizer model {0:?} is not supported yet (supported: \"gpt2\", byte-level BPE)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer Ballast does not implement; splitting the
    /// text differently from training would give the model token sequences it never saw.
    #[error(
        "pre-tokenizer {name:?} is not supported yet (supported: {})",
        SUPPORTED_PRE_TOKENIZERS.join(", ")
    )]
    UnsupportedPreTokenizer {
        /// The value of `tokenizer.ggml.pre`.
        name: String,
    },
    /// A byte-level BPE file without `tokenizer.ggml.pre`; llama.cpp guesses ("generation
    /// quality will be degraded"), Ballast refuses.
    #[error(
        "tokenizer.ggml.pre is missing, so how text is split before BPE is unknown; \
         regenerate the GGUF file with a current llama.cpp converter"
    )]
    MissingPreTokenizer,
    /// A required piece of the tokenizer is absent or malformed.
    #[error("{key}: {reason}")]
    Invalid {
        /// The metadata key or file the problem is in.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The `tokenizers` crate rejected the vocabulary, merges or `tokenizer.json`.
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
    /// The model's chat template does not compile.
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
}
