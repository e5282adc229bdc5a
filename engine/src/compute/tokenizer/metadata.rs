//! The tokenizer as a GGUF file describes it, borrowed from the parsed metadata (the model
//! loader reads it; [`super::BpeTokenizer::from_gguf`] builds from it).

/// The tokenizer as the file describes it, borrowed from the parsed metadata. Building a
/// tokenizer from it is a later step.
#[derive(Debug, Clone, Copy)]
pub struct TokenizerMetadata<'a> {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE), `llama` (SentencePiece), …
    pub model: &'a str,
    /// `tokenizer.ggml.pre`: the pre-tokenizer's name, e.g. `smollm`, `llama-bpe`.
    pub pre: Option<&'a str>,
    /// `tokenizer.ggml.tokens`: the vocabulary, indexed by token id.
    pub tokens: &'a [String],
    /// `tokenizer.ggml.token_type`: one per token (1 normal, 2 unknown, 3 control, 4 user
    /// defined, 5 unused, 6 byte).
    pub token_types: Option<&'a [i32]>,
    /// `tokenizer.ggml.scores`: one per token (SentencePiece models).
    pub scores: Option<&'a [f32]>,
    /// `tokenizer.ggml.merges`: BPE merges, `"left right"` each.
    pub merges: Option<&'a [String]>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos_token: Option<bool>,
    /// `tokenizer.chat_template`: a Jinja template, unrendered.
    pub chat_template: Option<&'a str>,
}
