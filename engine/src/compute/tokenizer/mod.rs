//! Tokenizers: the byte-level tokenizer of the synthetic models, the byte-level BPE
//! tokenizer of real models ([`BpeTokenizer`], from a GGUF file or a Hugging Face
//! `tokenizer.json`), chat templates rendered by a Jinja engine ([`ChatTemplate`]), and the
//! streaming decoders that turn generated token ids back into valid UTF-8 text piece by piece.

mod bpe;
mod chat;
#[cfg(test)]
mod tests;

pub use bpe::{BpeStreamDecoder, BpeTokenizer, SUPPORTED_PRE_TOKENIZERS};
pub use chat::{CHATML_TEMPLATE, ChatTemplate, ChatTemplateError};

/// One chat message after the HTTP layer has validated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// What the engine needs from a tokenizer: [`ByteTokenizer`] for the synthetic models,
/// [`BpeTokenizer`] for real ones.
pub trait Tokenizer: Send + Sync {
    /// Number of token ids the model's embedding table has.
    fn vocab_size(&self) -> usize;
    /// Token that ends generation unless the request sets `ignore_eos`.
    fn eos_token_id(&self) -> u32;
    /// Every token that ends generation: the EOS token first, then any end-of-turn tokens the
    /// model also stops on (Llama 3's `<|eot_id|>` next to its `<|end_of_text|>`, say). The
    /// default is the EOS token alone.
    fn eos_token_ids(&self) -> Vec<u32> {
        vec![self.eos_token_id()]
    }
    /// The model's beginning-of-sequence token, if it has one. Whether [`Tokenizer::encode`]
    /// prepends it is up to the implementation (see its documentation).
    fn bos_token_id(&self) -> Option<u32>;
    /// Text to token ids; `add_bos` asks for the BOS token first (implementations may add it
    /// only when the model was trained with it, as [`BpeTokenizer`] does).
    fn encode(&self, text: &str, add_bos: bool) -> Vec<u32>;
    /// Renders chat messages into the prompt text the model was trained on, ending with the
    /// assistant turn header so the model continues as the assistant. Infallible: an
    /// implementation whose template can fail falls back to something documented; prefer
    /// [`Tokenizer::try_apply_chat_template`], which reports the failure.
    fn apply_chat_template(&self, messages: &[ChatMessage]) -> String;
    /// [`Tokenizer::apply_chat_template`], with a template's failure (a syntax error, or the
    /// template rejecting the conversation through `raise_exception`) as an error the HTTP
    /// layer can return as a 400. The default never fails.
    fn try_apply_chat_template(
        &self,
        messages: &[ChatMessage],
    ) -> Result<String, ChatTemplateError> {
        Ok(self.apply_chat_template(messages))
    }
    /// A decoder that turns tokens into text incrementally for one output stream.
    fn stream_decoder(&self) -> Box<dyn StreamDecoder>;
}

/// Turns a stream of token ids into text without ever emitting half a UTF-8 character.
pub trait StreamDecoder: Send {
    /// Feeds one token; returns the text that became complete (possibly empty).
    fn push(&mut self, token: u32) -> String;
    /// Ends the stream: bytes of an incomplete character become U+FFFD.
    fn finish(&mut self) -> String;
}

/// Byte-level tokenizer of the synthetic models: ids 0..=255 are bytes, then BOS and EOS.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// Beginning-of-sequence token.
    pub const BOS: u32 = 256;
    /// End-of-sequence token.
    pub const EOS: u32 = 257;
    /// 256 bytes plus the two special tokens.
    pub const VOCAB_SIZE: usize = 258;
}

impl Tokenizer for ByteTokenizer {
    fn vocab_size(&self) -> usize {
        Self::VOCAB_SIZE
    }

    fn eos_token_id(&self) -> u32 {
        Self::EOS
    }

    fn bos_token_id(&self) -> Option<u32> {
        Some(Self::BOS)
    }

    fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() + 1);
        if add_bos {
            ids.push(Self::BOS);
        }
        ids.extend(text.bytes().map(u32::from));
        ids
    }

    fn apply_chat_template(&self, messages: &[ChatMessage]) -> String {
        let mut out = String::new();
        for m in messages {
            out.push_str("<|");
            out.push_str(&m.role);
            out.push_str("|>\n");
            out.push_str(&m.content);
            out.push_str("<|end|>\n");
        }
        out.push_str("<|assistant|>\n");
        out
    }

    fn stream_decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(Utf8StreamDecoder::default())
    }
}

/// Accumulates bytes and releases the longest valid UTF-8 prefix; special tokens (ids ≥ 256)
/// produce no text.
#[derive(Debug, Default)]
pub struct Utf8StreamDecoder {
    pending: Vec<u8>,
}

impl Utf8StreamDecoder {
    /// Feeds raw bytes (one token's worth, or none); returns the text that became complete.
    /// A character split across calls is held back until its last byte arrives; bytes that
    /// can never form a character become U+FFFD.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: keep it until more bytes arrive.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes can never become valid: replace and carry on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: the bytes of an incomplete character become U+FFFD.
    pub fn finish_bytes(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

impl StreamDecoder for Utf8StreamDecoder {
    fn push(&mut self, token: u32) -> String {
        match u8::try_from(token) {
            Ok(byte) => self.push_bytes(&[byte]),
            Err(_) => String::new(),
        }
    }

    fn finish(&mut self) -> String {
        self.finish_bytes()
    }
}

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

#[cfg(test)]
mod byte_tests {
    use super::*;

    fn decode_all(ids: &[u32]) -> String {
        let mut d = ByteTokenizer.stream_decoder();
        let mut s: String = ids.iter().map(|&t| d.push(t)).collect();
        s.push_str(&d.finish());
        s
    }

    #[test]
    fn round_trip_including_multibyte() {
        let text = "héllo ✓ 🚀";
        let ids = ByteTokenizer.encode(text, true);
        assert_eq!(ids[0], ByteTokenizer::BOS);
        assert_eq!(decode_all(&ids), text);
    }

    #[test]
    fn partial_character_is_held_back() {
        let mut d = Utf8StreamDecoder::default();
        let bytes = "✓".as_bytes();
        assert_eq!(d.push(bytes[0] as u32), "");
        assert_eq!(d.push(bytes[1] as u32), "");
        assert_eq!(d.push(bytes[2] as u32), "✓");
    }

    #[test]
    fn invalid_bytes_become_replacement_chars() {
        assert_eq!(decode_all(&[0xff, b'a' as u32]), "\u{fffd}a");
        // A truncated character at the very end is flushed lossily.
        assert_eq!(decode_all(&[b'a' as u32, 0xe2, 0x9c]), "a\u{fffd}");
        assert_eq!(decode_all(&[ByteTokenizer::EOS]), "");
    }

    #[test]
    fn chat_template_ends_with_assistant_header() {
        let t = ByteTokenizer.apply_chat_template(&[ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        }]);
        assert_eq!(t, "<|user|>\nhi<|end|>\n<|assistant|>\n");
    }
}
