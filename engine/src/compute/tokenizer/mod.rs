//! Tokenizers: the byte-level tokenizer of the synthetic models, the byte-level BPE
//! tokenizer of real models ([`BpeTokenizer`], from a GGUF file or a Hugging Face
//! `tokenizer.json`), chat templates rendered by a Jinja engine ([`ChatTemplate`]), and the
//! streaming decoders that turn generated token ids back into valid UTF-8 text piece by piece.

mod bpe;
mod byte;
mod chat;
mod error;
mod metadata;
#[cfg(test)]
mod tests;
mod traits;

pub use bpe::{BpeStreamDecoder, BpeTokenizer};
pub use byte::{ByteTokenizer, Utf8StreamDecoder};
pub use chat::{CHATML_TEMPLATE, ChatMessage, ChatTemplate, ChatTemplateError};
pub use error::{SUPPORTED_PRE_TOKENIZERS, TokenizerError};
pub use metadata::TokenizerMetadata;
pub use traits::{StreamDecoder, Tokenizer};
