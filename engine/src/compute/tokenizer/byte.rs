//! The byte-level tokenizer of the synthetic models and the UTF-8 stream decoder.

use super::{ChatMessage, StreamDecoder, Tokenizer};

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
