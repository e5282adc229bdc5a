//! A request's output text as it is produced: incremental detokenization and stop strings.
//!
//! This runs on the output side (the compute layer), not in the HTTP handler: the step
//! whose token completes a stop string is the request's last, so the request is finished
//! there with `stop`, its counts and latencies are recorded once, and no token the engine
//! produced after the match is counted or sent.
//!
//! Text that might be the start of a stop string is held back until it is known not to be
//! one, and the stop string itself is never emitted.

use crate::compute::tokenizer::StreamDecoder;

/// One request's text: its decoder and its stop strings.
pub struct TextStream {
    decoder: Box<dyn StreamDecoder>,
    stop: StopMatcher,
}

/// What one token or the end of generation produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextStep {
    /// Text safe to send now (possibly empty).
    pub text: String,
    /// A stop string matched: the request ends here with `stop`.
    pub stopped: bool,
}

impl TextStream {
    /// A stream decoding with `decoder` and watching for `stops` (non-empty strings).
    pub fn new(decoder: Box<dyn StreamDecoder>, stops: Vec<String>) -> Self {
        Self {
            decoder,
            stop: StopMatcher::new(stops),
        }
    }

    /// A generated token. A token that itself ended the request (EOS, a stop token) is
    /// counted by the caller but has no text, as in vLLM: pass `is_stop_token`.
    pub fn token(&mut self, token: u32, is_stop_token: bool) -> TextStep {
        let piece = if is_stop_token {
            String::new()
        } else {
            self.decoder.push(token)
        };
        match self.stop.feed(&piece) {
            StopOutcome::Continue(text) => TextStep {
                text,
                stopped: false,
            },
            StopOutcome::Stopped(text) => TextStep {
                text,
                stopped: true,
            },
        }
    }

    /// Generation ended for another reason: the rest of the text, unless what the decoder
    /// still held completes a stop string.
    pub fn finish(&mut self) -> TextStep {
        match self.stop.feed(&self.decoder.finish()) {
            StopOutcome::Continue(text) => TextStep {
                text: text + &self.stop.flush(),
                stopped: false,
            },
            StopOutcome::Stopped(text) => TextStep {
                text,
                stopped: true,
            },
        }
    }
}

/// Watches one choice's text for its stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What [`StopMatcher::feed`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Text safe to send (possibly empty); generation goes on.
    Continue(String),
    /// A stop string matched: send this text (everything before the match) and finish.
    Stopped(String),
}

impl StopMatcher {
    /// A matcher for `stops` (non-empty strings).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            pending: String::new(),
        }
    }

    /// Adds newly decoded text.
    pub fn feed(&mut self, piece: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(piece.to_string());
        }
        self.pending.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return StopOutcome::Stopped(text);
        }
        let hold = self.longest_stop_prefix_suffix();
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopOutcome::Continue(text)
    }

    /// Text held back, released when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(p.len());
            for k in (best + 1..=max).rev() {
                let start = p.len() - k;
                if p.is_char_boundary(start) && s.is_char_boundary(k) && p[start..] == s[..k] {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.feed(p) {
                StopOutcome::Continue(t) => out.push_str(&t),
                StopOutcome::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn stop_split_across_pieces_is_found_and_not_emitted() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "Dxyz"]),
            ("abc ".into(), true)
        );
    }

    #[test]
    fn false_start_is_released() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.feed("abE"), StopOutcome::Continue("ab".into()));
        assert_eq!(m.feed("x"), StopOutcome::Continue("Ex".into()));
        assert_eq!(run(&["END"], &["abEN"]), ("abEN".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins_and_unicode_is_safe() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
        assert_eq!(run(&["✓✓"], &["é✓", "x✓✓"]), ("é✓x".into(), true));
        assert_eq!(run(&[], &["plain"]), ("plain".into(), false));
    }
}
