//! What the engine needs from a tokenizer, and from a stream decoder.

use super::{ChatMessage, ChatTemplateError};

/// What the engine needs from a tokenizer: [`super::ByteTokenizer`] for the synthetic models,
/// [`super::BpeTokenizer`] for real ones.
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
    /// only when the model was trained with it, as [`super::BpeTokenizer`] does).
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
