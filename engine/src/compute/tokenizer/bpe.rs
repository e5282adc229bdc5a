//! Byte-level BPE (GPT-2 style) tokenizers of real models, built on the `tokenizers` crate
//! from a GGUF file's `tokenizer.ggml.*` metadata or from a Hugging Face `tokenizer.json`.

use std::sync::Arc;

use tokenizers::models::ModelWrapper;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, SplitDelimiterBehavior};

use super::metadata::TokenizerMetadata;
use super::{
    ChatMessage, ChatTemplate, ChatTemplateError, StreamDecoder, Tokenizer, TokenizerError,
    Utf8StreamDecoder,
};

/// Llama 3's pre-tokenizer regex, as its tokenizer.json has it.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
mod token_type {
    pub const NORMAL: i32 = 1;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
}

/// Texts of special tokens that end a turn: llama.cpp treats a control token with one of
/// these texts as end-of-generation even when it is not the EOS token (a subset of its list).
const END_OF_TURN_TOKENS: [&str; 8] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<eos>",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreTokenizer {
    SmolLm,
    Gpt2,
    Llama3,
}

impl PreTokenizer {
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "smollm" => Some(Self::SmolLm),
            "gpt2" | "gpt-2" => Some(Self::Gpt2),
            "llama-bpe" | "llama3" | "llama-v3" => Some(Self::Llama3),
            _ => None,
        }
    }

    fn build(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        // ByteLevel::new(add_prefix_space, trim_offsets, use_regex); offsets are unused.
        Ok(match self {
            Self::SmolLm => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            Self::Gpt2 => ByteLevel::new(false, true, true).into(),
            Self::Llama3 => {
                let split = Split::new(
                    SplitPattern::Regex(LLAMA3_SPLIT.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| TokenizerError::Build(format!("Llama 3 split regex: {e}")))?;
                Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, true, false).into(),
                ])
                .into()
            }
        })
    }
}

/// Where the BOS token comes from when [`Tokenizer::encode`] is asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BosPolicy {
    /// GGUF: prepend `bos` when `tokenizer.ggml.add_bos_token` says the model wants it.
    Prepend(bool),
    /// Hugging Face: the tokenizer.json post-processor adds whatever special tokens it adds;
    /// whether that includes the BOS token was found once by encoding the empty text.
    PostProcessor { adds_bos: bool },
}

/// The raw bytes of every token, computed once per tokenizer: byte-level BPE tokens are
/// strings over GPT-2's byte alphabet (`Ġ` is a space), mapped back to bytes; user-defined
/// tokens are their own UTF-8 text; control and other special tokens are empty.
#[derive(Debug)]
struct TokenBytes {
    data: Vec<u8>,
    /// `ends[id]` is where token `id`'s bytes end in `data` (they start at `ends[id - 1]`).
    ends: Vec<usize>,
}

impl TokenBytes {
    fn get(&self, id: u32) -> Option<&[u8]> {
        let id = id as usize;
        let end = *self.ends.get(id)?;
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        Some(&self.data[start..end])
    }
}

/// GPT-2's byte-to-character table inverted: entry `c` is the byte that character `c`
/// stands for, or -1. Printable bytes stand for themselves; the other 68, in order, were
/// shifted to U+0100, U+0101, … U+0143.
const BYTE_LEVEL_CHARS: [i16; 0x144] = {
    let mut table = [-1i16; 0x144];
    let mut next = 0x100;
    let mut b = 0;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if printable {
            table[b] = b as i16;
        } else {
            table[next] = b as i16;
            next += 1;
        }
        b += 1;
    }
    table
};

/// The byte a byte-level BPE character stands for, if it is one of the 256.
fn byte_level_char_to_byte(c: char) -> Option<u8> {
    let b = *BYTE_LEVEL_CHARS.get(c as usize)?;
    u8::try_from(b).ok()
}

/// A token string's bytes under the byte-level alphabet. A character outside it (only in
/// tokens that were not byte-level encoded) stands for its own UTF-8 bytes, as in llama.cpp.
fn byte_level_decode(token: &str, out: &mut Vec<u8>) {
    for c in token.chars() {
        match byte_level_char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

/// A byte-level BPE tokenizer (GPT-2, SmolLM2, Llama 3, Qwen-style vocabularies) with the
/// model's special tokens and chat template.
///
/// - **Encoding** runs the `tokenizers` crate's BPE with the model's pre-tokenizer. Special
///   tokens written in the text (`<|im_start|>`) encode to their single id, as vLLM does for
///   prompts and llama.cpp with `parse_special`.
/// - **BOS**: `encode(text, add_bos)` adds the BOS token only when `add_bos` is true *and*
///   the model wants one: for a GGUF file, `tokenizer.ggml.add_bos_token` (absent: true for
///   the Llama 3 pre-tokenizer, false otherwise, as llama.cpp decides; SmolLM2 says false);
///   for a Hugging Face tokenizer, whatever the tokenizer.json post-processor adds. Chat
///   templates usually write the BOS token themselves (`{{ bos_token }}`), so a rendered
///   chat prompt should be encoded with `add_bos = false`.
/// - **Decoding** maps each id to its raw bytes (precomputed once) and releases text only at
///   UTF-8 character boundaries; control tokens produce no text (vLLM's
///   `skip_special_tokens=True`), user-defined tokens their own text.
/// - **Chat**: the model's Jinja template through [`ChatTemplate`], or ChatML
///   ([`super::CHATML_TEMPLATE`]) when the model ships none.
pub struct BpeTokenizer {
    inner: tokenizers::Tokenizer,
    vocab_size: usize,
    bos: Option<u32>,
    eos: u32,
    eos_ids: Vec<u32>,
    bos_policy: BosPolicy,
    bytes: Arc<TokenBytes>,
    chat_template: ChatTemplate,
}

impl std::fmt::Debug for BpeTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpeTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos_ids", &self.eos_ids)
            .field("bos_policy", &self.bos_policy)
            .finish_non_exhaustive()
    }
}

impl BpeTokenizer {
    /// Builds the tokenizer a GGUF file describes (`GgufFile::tokenizer_metadata`).
    ///
    /// Requires `tokenizer.ggml.model = "gpt2"` (byte-level BPE; SentencePiece `llama` and
    /// others are [`TokenizerError::UnsupportedModel`]), a `tokenizer.ggml.pre` among
    /// [`super::SUPPORTED_PRE_TOKENIZERS`], the merges and the EOS id. Tokens typed control (3) or
    /// user defined (4) become special tokens matched in the text before BPE. Token strings
    /// that repeat keep their first id. EOS ids ([`Tokenizer::eos_token_ids`]) are the EOS
    /// token, then control tokens whose text marks an end of turn (`<|im_end|>`,
    /// `<|eot_id|>`, `<|endoftext|>`, … as llama.cpp counts them).
    pub fn from_gguf(meta: &TokenizerMetadata<'_>) -> Result<Self, TokenizerError> {
        match meta.model {
            "gpt2" => {}
            "llama" => {
                return Err(TokenizerError::UnsupportedModel(
                    "llama (SentencePiece)".into(),
                ));
            }
            other => return Err(TokenizerError::UnsupportedModel(other.into())),
        }
        let pre = match meta.pre {
            None => return Err(TokenizerError::MissingPreTokenizer),
            Some(name) => PreTokenizer::from_name(name)
                .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer { name: name.into() })?,
        };
        let gguf_merges = meta.merges.ok_or_else(|| TokenizerError::Invalid {
            key: "tokenizer.ggml.merges".into(),
            reason: "missing; a byte-level BPE tokenizer needs its merges".into(),
        })?;
        let eos = meta.eos_token_id.ok_or_else(|| TokenizerError::Invalid {
            key: "tokenizer.ggml.eos_token_id".into(),
            reason: "missing; generation could never end".into(),
        })?;
        let tokens = meta.tokens;
        let type_of = |id: usize| {
            meta.token_types
                .map_or(token_type::NORMAL, |types| types[id])
        };

        let mut vocab = Vocab::default();
        for (id, token) in tokens.iter().enumerate() {
            vocab.entry(token.clone()).or_insert(id as u32);
        }
        let mut merges: Merges = Vec::with_capacity(gguf_merges.len());
        for (i, merge) in gguf_merges.iter().enumerate() {
            // As llama.cpp splits: at the first space after the first character (so a merge
            // of a space token, were there one, still splits).
            let first = merge.chars().next().map_or(0, char::len_utf8);
            let split = merge[first..].find(' ').map(|p| p + first);
            let Some(at) = split else {
                return Err(TokenizerError::Invalid {
                    key: "tokenizer.ggml.merges".into(),
                    reason: format!("merge {i} ({merge:?}) is not \"left right\""),
                });
            };
            merges.push((merge[..at].to_string(), merge[at + 1..].to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre == PreTokenizer::Llama3)
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre.build()?));
        let added = |wanted: i32, special: bool| {
            tokens
                .iter()
                .enumerate()
                .filter(|&(id, t)| type_of(id) == wanted && !t.is_empty())
                .map(|(_, t)| AddedToken::from(t.as_str(), special).normalized(false))
                .collect::<Vec<_>>()
        };
        inner
            .add_special_tokens(added(token_type::CONTROL, true))
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        inner
            .add_tokens(added(token_type::USER_DEFINED, false))
            .map_err(|e| TokenizerError::Build(e.to_string()))?;

        let mut data = Vec::new();
        let mut ends = Vec::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            match type_of(id) {
                token_type::NORMAL => byte_level_decode(token, &mut data),
                token_type::USER_DEFINED => data.extend_from_slice(token.as_bytes()),
                // Control, unknown, unused and byte tokens: no text (llama.cpp's BPE
                // `token_to_piece` without `special`).
                _ => {}
            }
            ends.push(data.len());
        }

        let mut eos_ids = vec![eos];
        eos_ids.extend(
            tokens
                .iter()
                .enumerate()
                .filter(|&(id, t)| {
                    type_of(id) == token_type::CONTROL
                        && id as u32 != eos
                        && END_OF_TURN_TOKENS.contains(&t.as_str())
                })
                .map(|(id, _)| id as u32),
        );
        let add_bos = meta.add_bos_token.unwrap_or(pre == PreTokenizer::Llama3);
        let text_of = |id: Option<u32>| id.map_or("", |id| tokens[id as usize].as_str());
        let chat_template = match meta.chat_template {
            Some(source) => {
                ChatTemplate::new(source, text_of(meta.bos_token_id), text_of(Some(eos)))?
            }
            None => ChatTemplate::chatml(text_of(meta.bos_token_id), text_of(Some(eos))),
        };
        Ok(Self {
            inner,
            vocab_size: tokens.len(),
            bos: meta.bos_token_id,
            eos,
            eos_ids,
            bos_policy: BosPolicy::Prepend(add_bos),
            bytes: Arc::new(TokenBytes { data, ends }),
            chat_template,
        })
    }

    /// Builds the tokenizer of a Hugging Face model directory: `tokenizer.json` (a BPE model
    /// with a byte-level decoder) and, when given, `tokenizer_config.json` for
    /// `chat_template` (a string, or a list of `{name, template}` of which `default` or the
    /// first is used), `bos_token` and `eos_token` (strings or `{"content": …}` objects).
    /// Without a config, or without `eos_token` in it, the EOS token is the first special
    /// token whose text marks an end of turn (`<|endoftext|>`, `<|im_end|>`, …); without a
    /// template, ChatML. `encode(text, true)` applies the tokenizer.json post-processor
    /// (which adds the BOS token for Llama 3, nothing for SmolLM2).
    pub fn from_hf_json(
        tokenizer_json: &str,
        tokenizer_config_json: Option<&str>,
    ) -> Result<Self, TokenizerError> {
        Self::from_hf_files(tokenizer_json, tokenizer_config_json, None)
    }

    /// [`BpeTokenizer::from_hf_json`] with the text of the directory's `chat_template.jinja`,
    /// when it has one. Newer transformers save the template in that file rather than in
    /// `tokenizer_config.json`, and load it in preference to the config's `chat_template`, so
    /// when `chat_template` is `Some` the config's field is not read at all.
    pub fn from_hf_files(
        tokenizer_json: &str,
        tokenizer_config_json: Option<&str>,
        chat_template: Option<&str>,
    ) -> Result<Self, TokenizerError> {
        let invalid = |key: &str, reason: String| TokenizerError::Invalid {
            key: key.into(),
            reason,
        };
        let inner = <tokenizers::Tokenizer as std::str::FromStr>::from_str(tokenizer_json)
            .map_err(|e| invalid("tokenizer.json", e.to_string()))?;
        match inner.get_model() {
            ModelWrapper::BPE(_) => {}
            ModelWrapper::Unigram(_) => {
                return Err(TokenizerError::UnsupportedModel("Unigram".into()));
            }
            ModelWrapper::WordPiece(_) => {
                return Err(TokenizerError::UnsupportedModel("WordPiece".into()));
            }
            ModelWrapper::WordLevel(_) => {
                return Err(TokenizerError::UnsupportedModel("WordLevel".into()));
            }
        }
        if !is_byte_level(inner.get_decoder()) {
            return Err(TokenizerError::UnsupportedModel(
                "BPE without a byte-level decoder (SentencePiece-style)".into(),
            ));
        }
        let config: serde_json::Value = match tokenizer_config_json {
            None => serde_json::Value::Null,
            Some(text) => serde_json::from_str(text)
                .map_err(|e| invalid("tokenizer_config.json", e.to_string()))?,
        };
        let token_text = |key: &str| -> Option<String> {
            match config.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                v => v.get("content")?.as_str().map(str::to_string),
            }
        };
        let token_id = |key: &str| -> Result<Option<(u32, String)>, TokenizerError> {
            let Some(text) = token_text(key) else {
                return Ok(None);
            };
            match inner.token_to_id(&text) {
                Some(id) => Ok(Some((id, text))),
                None => Err(invalid(
                    "tokenizer_config.json",
                    format!("{key} {text:?} is not in the vocabulary"),
                )),
            }
        };
        let added = inner.get_added_tokens_decoder();
        let mut specials: Vec<(u32, &AddedToken)> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, t)| (id, t))
            .collect();
        specials.sort_by_key(|&(id, _)| id);
        let end_of_turn: Vec<u32> = specials
            .iter()
            .filter(|(_, t)| END_OF_TURN_TOKENS.contains(&t.content.as_str()))
            .map(|&(id, _)| id)
            .collect();
        let bos = token_id("bos_token")?;
        let (eos, eos_text) = match token_id("eos_token")? {
            Some(found) => found,
            None => {
                let id = *end_of_turn.first().ok_or_else(|| {
                    invalid(
                        "tokenizer_config.json",
                        "no eos_token, and no special token that ends a turn".into(),
                    )
                })?;
                (id, inner.id_to_token(id).unwrap_or_default())
            }
        };
        let mut eos_ids = vec![eos];
        eos_ids.extend(end_of_turn.iter().copied().filter(|&id| id != eos));

        let vocab_size = inner.get_vocab_size(true);
        let mut data = Vec::new();
        let mut ends = Vec::with_capacity(vocab_size);
        for id in 0..vocab_size as u32 {
            match added.get(&id) {
                Some(t) if t.special => {}
                Some(t) => data.extend_from_slice(t.content.as_bytes()),
                None => {
                    if let Some(token) = inner.id_to_token(id) {
                        byte_level_decode(&token, &mut data);
                    }
                }
            }
            ends.push(data.len());
        }

        // The file wins; the config's field is then not even checked, as in transformers.
        let template_source = match (chat_template, config.get("chat_template")) {
            (Some(file), _) => Some(file.to_string()),
            (None, None | Some(serde_json::Value::Null)) => None,
            (None, Some(serde_json::Value::String(s))) => Some(s.clone()),
            (None, Some(serde_json::Value::Array(list))) => {
                let named = |name: &str| {
                    list.iter()
                        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some(name))
                };
                named("default")
                    .or_else(|| list.first())
                    .and_then(|t| t.get("template")?.as_str())
                    .map(str::to_string)
            }
            (None, Some(other)) => {
                return Err(invalid(
                    "tokenizer_config.json",
                    format!("chat_template is neither a string nor a list: {other}"),
                ));
            }
        };
        let bos_text = bos.as_ref().map_or("", |(_, t)| t.as_str());
        let adds_bos = bos.as_ref().is_some_and(|(bos, _)| {
            inner
                .encode_fast("", true)
                .is_ok_and(|e| e.get_ids().first() == Some(bos))
        });
        let chat_template = match template_source {
            Some(source) => ChatTemplate::new(&source, bos_text, eos_text.as_str())?,
            None => ChatTemplate::chatml(bos_text, eos_text.as_str()),
        };
        Ok(Self {
            inner,
            vocab_size,
            bos: bos.map(|(id, _)| id),
            eos,
            eos_ids,
            bos_policy: BosPolicy::PostProcessor { adds_bos },
            bytes: Arc::new(TokenBytes { data, ends }),
            chat_template,
        })
    }

    /// The chat template in use (the model's, or ChatML).
    /// Adds end-of-sequence ids from outside the tokenizer files (a Hugging Face
    /// `generation_config.json`), keeping the order and dropping repeats and ids outside the
    /// vocabulary.
    pub fn with_extra_eos(mut self, ids: &[u32]) -> Self {
        for &id in ids {
            if (id as usize) < self.vocab_size && !self.eos_ids.contains(&id) {
                self.eos_ids.push(id);
            }
        }
        self
    }

    /// The chat template.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat_template
    }

    /// Whether `encode(text, true)` starts with the BOS token.
    pub fn adds_bos(&self) -> bool {
        match self.bos_policy {
            BosPolicy::Prepend(add) => add && self.bos.is_some(),
            BosPolicy::PostProcessor { adds_bos } => adds_bos,
        }
    }

    /// The id of a token by its vocabulary string (byte-level form: `Ġthe` for " the"), or
    /// of a special token by its text.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The raw bytes token `id` decodes to (empty for control tokens), or `None` outside the
    /// vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id)
    }

    /// Decodes a whole sequence at once, as the stream decoder would: special tokens produce
    /// no text, ids outside the vocabulary are skipped, invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .filter_map(|&id| self.bytes.get(id))
            .flatten()
            .copied()
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn is_byte_level(decoder: Option<&DecoderWrapper>) -> bool {
    match decoder {
        Some(DecoderWrapper::ByteLevel(_)) => true,
        Some(DecoderWrapper::Sequence(seq)) => seq
            .get_decoders()
            .iter()
            .any(|d| matches!(d, DecoderWrapper::ByteLevel(_))),
        _ => false,
    }
}

impl Tokenizer for BpeTokenizer {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn eos_token_id(&self) -> u32 {
        self.eos
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// See [`BpeTokenizer`] for when the BOS token is added. The `tokenizers` crate cannot
    /// fail on a byte-level vocabulary short of a bug; if it ever does, the error is logged
    /// and the result is empty (which the HTTP layer rejects as an empty prompt).
    fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        let post_process = add_bos && matches!(self.bos_policy, BosPolicy::PostProcessor { .. });
        let encoding = match self.inner.encode_fast(text, post_process) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "tokenizer failed to encode a prompt");
                return Vec::new();
            }
        };
        let ids = encoding.get_ids();
        match (self.bos_policy, self.bos) {
            (BosPolicy::Prepend(true), Some(bos)) if add_bos => {
                let mut out = Vec::with_capacity(ids.len() + 1);
                out.push(bos);
                out.extend_from_slice(ids);
                out
            }
            _ => ids.to_vec(),
        }
    }

    /// Renders with the model's template; if that fails, logs a warning and renders ChatML
    /// instead. Use [`Tokenizer::try_apply_chat_template`] to report the failure.
    fn apply_chat_template(&self, messages: &[ChatMessage]) -> String {
        self.try_apply_chat_template(messages).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "chat template failed; rendering ChatML instead");
            ChatTemplate::chatml("", "")
                .render(messages, true)
                .unwrap_or_default()
        })
    }

    fn try_apply_chat_template(
        &self,
        messages: &[ChatMessage],
    ) -> Result<String, ChatTemplateError> {
        self.chat_template.render(messages, true)
    }

    fn stream_decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(BpeStreamDecoder {
            bytes: Arc::clone(&self.bytes),
            utf8: Utf8StreamDecoder::default(),
        })
    }
}

/// The stream decoder of a [`BpeTokenizer`]: each token's precomputed bytes go through a
/// [`Utf8StreamDecoder`], so a character split across tokens is held back until complete.
/// Control tokens and ids outside the vocabulary produce no text.
#[derive(Debug)]
pub struct BpeStreamDecoder {
    bytes: Arc<TokenBytes>,
    utf8: Utf8StreamDecoder,
}

impl StreamDecoder for BpeStreamDecoder {
    fn push(&mut self, token: u32) -> String {
        let bytes = self.bytes.get(token).unwrap_or_default();
        self.utf8.push_bytes(bytes)
    }

    fn finish(&mut self) -> String {
        self.utf8.finish_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_inverts_gpt2_table() {
        assert_eq!(byte_level_char_to_byte('!'), Some(b'!'));
        assert_eq!(byte_level_char_to_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_char_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_char_to_byte('ĉ'), Some(b'\t'));
        assert_eq!(byte_level_char_to_byte('Ā'), Some(0));
        assert_eq!(byte_level_char_to_byte('ł'), Some(0xA0));
        assert_eq!(byte_level_char_to_byte('Ń'), Some(0xAD));
        assert_eq!(byte_level_char_to_byte('ń'), None);
        assert_eq!(byte_level_char_to_byte(' '), None);
        // Each of the 256 bytes has exactly one character.
        let mut seen = [false; 256];
        for c in (0u32..0x200).filter_map(char::from_u32) {
            if let Some(b) = byte_level_char_to_byte(c) {
                assert!(!seen[b as usize], "byte {b} twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
}
