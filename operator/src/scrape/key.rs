//! The API key scrapes carry, kept out of logs.

/// An API key the scrapes carry. Its `Debug` shows only that there is one, so a config can
/// be logged without it.
#[derive(Clone, PartialEq, Eq)]
pub struct ScrapeKey(String);

impl ScrapeKey {
    /// `key`, when it can go in a header as it is: 1 to 4096 visible ASCII characters.
    pub fn new(key: &str) -> Option<Self> {
        (!key.is_empty() && key.len() <= 4096 && key.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| ScrapeKey(key.to_string()))
    }

    /// The first key of key-file text (one a line, surrounding whitespace and blank lines
    /// ignored, as the engine's `--api-key-file` reads it), if it is one [`ScrapeKey::new`]
    /// takes.
    pub fn first_of(text: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(text).ok()?;
        Self::new(text.lines().map(str::trim).find(|l| !l.is_empty())?)
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ScrapeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScrapeKey(redacted)")
    }
}
