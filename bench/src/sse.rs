//! Incremental Server-Sent Events parser.
//!
//! Network reads split the stream at arbitrary byte offsets, so the parser
//! buffers partial lines and only yields complete events. It implements the
//! parts of the SSE format that OpenAI-compatible servers use: `data:` fields
//! (several per event are joined with `\n`), blank-line event boundaries,
//! `:` comments (keep-alives), and `\n` or `\r\n` line endings. Other fields
//! (`event:`, `id:`, `retry:`) are ignored; a lone `\r` line ending is not
//! supported because no LLM server emits it.

/// Accumulates bytes and yields the `data` payload of each complete event.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes after the last complete line.
    partial: Vec<u8>,
    /// `data` lines of the event being read, if any.
    data: Option<String>,
}

impl SseParser {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Feeds one network chunk; returns the events it completed, in order.
    /// `[DONE]` is returned like any other payload; the caller decides.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        self.partial.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(pos) = self.partial[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            let mut line = &self.partial[start..end];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            // Splitting at '\n' never cuts a UTF-8 sequence in half, so lossy
            // decoding only replaces genuinely invalid bytes.
            let line = String::from_utf8_lossy(line).into_owned();
            if let Some(event) = self.line(&line) {
                events.push(event);
            }
            start = end + 1;
        }
        self.partial.drain(..start);
        events
    }

    /// Flushes an event left unterminated when the stream ended (some servers
    /// close the connection right after the last `data:` line).
    pub(crate) fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.partial);
        if !rest.is_empty() {
            let line = String::from_utf8_lossy(&rest).into_owned();
            if let Some(event) = self.line(line.trim_end_matches('\r')) {
                return Some(event);
            }
        }
        self.data.take()
    }

    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(buf) => {
                    buf.push('\n');
                    buf.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        ": keep-alive\n",
        "\n",
        "data: {\"a\":1}\n",
        "\n",
        "event: message\r\n",
        "id: 7\r\n",
        "data: {\"b\":\r\n",
        "data: 2}\r\n",
        "\r\n",
        ":another comment\n",
        "data:{\"c\":\"é\"}\n",
        "\n",
        "data: [DONE]\n",
        "\n",
    );

    fn expected() -> Vec<String> {
        vec![
            "{\"a\":1}".to_string(),
            "{\"b\":\n2}".to_string(),
            "{\"c\":\"é\"}".to_string(),
            "[DONE]".to_string(),
        ]
    }

    #[test]
    fn whole_stream_at_once() {
        let mut p = SseParser::new();
        assert_eq!(p.feed(STREAM.as_bytes()), expected());
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let bytes = STREAM.as_bytes();
        for cut in 0..=bytes.len() {
            let mut p = SseParser::new();
            let mut got = p.feed(&bytes[..cut]);
            got.extend(p.feed(&bytes[cut..]));
            assert_eq!(got, expected(), "split at byte {cut}");
        }
    }

    #[test]
    fn byte_by_byte_including_inside_a_multibyte_char() {
        let mut p = SseParser::new();
        let got: Vec<String> = STREAM
            .as_bytes()
            .iter()
            .flat_map(|b| p.feed(std::slice::from_ref(b)))
            .collect();
        assert_eq!(got, expected());
    }

    #[test]
    fn events_complete_only_at_a_blank_line() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: x\n").is_empty());
        assert!(p.feed(b": ping\n").is_empty());
        assert_eq!(p.feed(b"\n"), vec!["x".to_string()]);
        // Blank lines without data dispatch nothing.
        assert!(p.feed(b"\n\n\n").is_empty());
    }

    #[test]
    fn unterminated_last_event_is_flushed_by_finish() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: {\"x\":1}").is_empty());
        assert_eq!(p.finish(), Some("{\"x\":1}".to_string()));
        let mut p = SseParser::new();
        assert!(p.feed(b"data: y\n").is_empty());
        assert_eq!(p.finish(), Some("y".to_string()));
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn error_objects_pass_through_as_data() {
        let mut p = SseParser::new();
        let got = p.feed(b"data: {\"text\":\"a\"}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n");
        assert_eq!(got[1], "{\"error\":{\"message\":\"boom\"}}");
    }
}
