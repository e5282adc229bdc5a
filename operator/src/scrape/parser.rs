//! A parser for the Prometheus text exposition format, version 0.0.4.
//!
//! It reads what an engine's `/metrics` returned and yields samples (name, sorted labels,
//! value) plus the `# TYPE` of each declared family. It is written to be fed hostile input:
//! it never panics, never allocates without bound, and a line it cannot read costs that line
//! only, never the samples around it.
//!
//! # Rules
//!
//! - **A line that does not parse is rejected** and counted in
//!   [`Exposition::rejected_lines`]; it yields nothing, and parsing goes on with the next
//!   line. Syntax follows the 0.0.4 format: `name{label="value",...} value [timestamp]`,
//!   metric names `[a-zA-Z_:][a-zA-Z0-9_:]*` (so vLLM's `vllm:` and SGLang's `sglang:`
//!   prefixes are fine), label names `[a-zA-Z_][a-zA-Z0-9_]*`, label values in double quotes
//!   with the escapes `\\`, `\"` and `\n` (any other escape rejects the line), any other
//!   character — `,` `}` `=` `#` included — allowed inside the quotes, an optional trailing
//!   comma in the label set, blanks (spaces, tabs) around every token, an optional integer
//!   timestamp (ignored), `\r\n` line endings, and empty lines.
//! - **Values must be finite.** `NaN`, `+Inf` and `-Inf` are recognised, but the line is
//!   rejected: no signal the operator computes has a meaning for them, and the control-plane
//!   contract (§6) says NaN-laden metrics must never trigger an action. (`+Inf` as a *label*
//!   value, as in `le="+Inf"`, is of course fine.)
//! - **A series that appears twice is ambiguous**: two samples with the same name and label
//!   set cannot both be right, so every sample of that series is dropped and the series is
//!   counted once in [`Exposition::ambiguous_series`].
//! - **The last line must end with `\n`.** A body that stops mid-line was cut short (a
//!   closed connection, a size limit), so a non-empty final line without its newline is
//!   rejected and [`Exposition::truncated`] is set.
//! - **A sample with the same label name twice** is rejected.
//! - **Limits** ([`Limits`]): a line longer than `max_line_bytes` is rejected unread, a
//!   sample with more than `max_labels` labels is rejected, and once `max_samples` samples
//!   (or as many `# TYPE` families) are held, further ones are rejected rather than stored.
//! - `# HELP` lines and other comments are skipped; a `# TYPE` line with an unknown type, a
//!   bad name or a second declaration of the same family is rejected (the first one stays).
//!
//! # Borrowing and bytes
//!
//! An [`Exposition`] borrows from the text it was parsed from: names and label values are
//! slices of it (a label value is copied only when it holds an escape or invalid UTF-8),
//! so a scrape builds no strings. [`parse_selected`] reads the raw body: invalid UTF-8 only
//! spoils the values it is in, which read as [`String::from_utf8_lossy`] would make them,
//! and line lengths are counted in the body's bytes.
//!
//! # Selective parsing
//!
//! [`parse_selected`] keeps only the names a predicate accepts and skips every other line
//! once its name is known. Consecutive lines of one family share their name, so a line
//! that starts with a recently judged name is skipped with one comparison and a search
//! for its newline, without scanning or building anything.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

/// Bounds on what one exposition may make the parser hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest line read, in bytes (without its `\n`); longer ones are rejected unread.
    pub max_line_bytes: usize,
    /// Most labels one sample may carry.
    pub max_labels: usize,
    /// Most samples (and, separately, most `# TYPE` families) kept.
    pub max_samples: usize,
}

impl Default for Limits {
    /// 64 KiB lines, 64 labels, 500 000 samples: far above what a real engine exports
    /// (an 8-rank vLLM pod exports a few thousand samples) yet bounded.
    fn default() -> Self {
        Limits {
            max_line_bytes: 64 * 1024,
            max_labels: 64,
            max_samples: 500_000,
        }
    }
}

/// The `# TYPE` of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    /// `counter`.
    Counter,
    /// `gauge`.
    Gauge,
    /// `histogram`.
    Histogram,
    /// `summary`.
    Summary,
    /// `untyped`.
    Untyped,
}

impl MetricType {
    fn from_word(w: &[u8]) -> Option<Self> {
        Some(match w {
            b"counter" => MetricType::Counter,
            b"gauge" => MetricType::Gauge,
            b"histogram" => MetricType::Histogram,
            b"summary" => MetricType::Summary,
            b"untyped" => MetricType::Untyped,
            _ => return None,
        })
    }
}

/// One sample: a series (name and label set) and its value, borrowed from the text.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// Metric name as written, e.g. `vllm:time_to_first_token_seconds_bucket`.
    pub name: &'a str,
    /// Labels sorted by name; names are unique. Values are unescaped (owned only when
    /// unescaping or a UTF-8 repair changed them).
    pub labels: Vec<(&'a str, Cow<'a, str>)>,
    /// The value, always finite.
    pub value: f64,
}

impl Sample<'_> {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        // Sorted and short: a linear scan beats a binary search at these sizes.
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_ref())
    }
}

/// What one exposition contained, borrowed from its text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition<'a> {
    /// Samples in input order, without rejected lines and ambiguous series.
    pub samples: Vec<Sample<'a>>,
    /// The declared `# TYPE` of each family, by family name.
    pub types: HashMap<&'a str, MetricType>,
    /// Lines that were rejected (syntax, non-finite value, limits, truncation).
    pub rejected_lines: usize,
    /// Series that appeared more than once and were dropped entirely.
    pub ambiguous_series: usize,
    /// The body ended without a final `\n` after a non-empty line.
    pub truncated: bool,
}

impl<'a> Exposition<'a> {
    /// Rejected lines plus ambiguous series: everything that was wrong with the input.
    pub fn errors(&self) -> usize {
        self.rejected_lines + self.ambiguous_series
    }

    /// Samples named exactly `name`.
    pub fn named<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s Sample<'a>> + 's {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// Whether any sample is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// Whether the exposition carries the family `family`: a `# TYPE` line declares it, or
    /// a sample is named `family` or, for histograms and summaries, `family_bucket`,
    /// `family_sum` or `family_count`. A labelled counter that has not counted anything yet
    /// is often only declared.
    pub fn carries(&self, family: &str) -> bool {
        self.types.contains_key(family)
            || self.samples.iter().any(|s| {
                s.name
                    .strip_prefix(family)
                    .is_some_and(|rest| matches!(rest, "" | "_bucket" | "_sum" | "_count"))
            })
    }
}

/// Parses `text` with the default [`Limits`]. See the module docs for the rules.
pub fn parse(text: &str) -> Exposition<'_> {
    parse_with(text, &Limits::default())
}

/// Parses `text` with explicit `limits`. See the module docs for the rules.
pub fn parse_with<'a>(text: &'a str, limits: &Limits) -> Exposition<'a> {
    parse_lines(text.as_bytes(), limits, None)
}

/// Parses only the series and `# TYPE`/`# HELP` lines of `body` whose metric name `keep`
/// accepts. Any other line is skipped once its name is known: no sample is built, nothing
/// is copied, and a malformed line of a skipped family is not counted. For what it keeps,
/// the result is exactly [`parse_with`]'s on the same text (a line whose name cannot be
/// scanned is rejected, as it is there); only `max_samples` counts kept samples alone.
///
/// `body` is raw bytes, as a scrape received them: see the module docs for invalid UTF-8.
pub fn parse_selected<'a>(
    body: &'a [u8],
    limits: &Limits,
    keep: &dyn Fn(&str) -> bool,
) -> Exposition<'a> {
    parse_lines(body, limits, Some(keep))
}

/// The last few names judged by the `keep` predicate, as slices of the text, so that the
/// next line of the same family is judged by one comparison.
struct Judged<'a> {
    recent: [(&'a [u8], bool); 4],
    /// Where the next name is remembered; the one before it is the latest.
    next: usize,
    /// The entry that matched last: histogram lines come in runs of one name.
    hit: usize,
}

impl<'a> Judged<'a> {
    fn new() -> Self {
        Judged {
            recent: [(&[], false); 4],
            next: 0,
            hit: 0,
        }
    }

    /// The verdict on the sample line `line` (from its first non-blank byte) if it starts
    /// with a judged name followed by something that cannot continue a name.
    fn recall(&mut self, line: &[u8]) -> Option<bool> {
        let n = self.recent.len();
        for k in (0..n).map(|k| (self.hit + k) % n) {
            let (name, kept) = self.recent[k];
            if !name.is_empty()
                && starts_with(line, name)
                && line.get(name.len()).is_none_or(|c| !is_name_byte(*c))
            {
                self.hit = k;
                return Some(kept);
            }
        }
        None
    }

    fn remember(&mut self, name: &'a [u8], kept: bool) {
        self.recent[self.next] = (name, kept);
        self.hit = self.next;
        self.next = (self.next + 1) % self.recent.len();
    }
}

/// `line.starts_with(prefix)` in 8-byte words: names are a few dozen bytes, too short for
/// a library `memcmp` call to pay for itself, and this runs once per skipped line.
fn starts_with(line: &[u8], prefix: &[u8]) -> bool {
    let Some(head) = line.get(..prefix.len()) else {
        return false;
    };
    let mut a = head.chunks_exact(8);
    let mut b = prefix.chunks_exact(8);
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or_default());
    (&mut a).zip(&mut b).all(|(x, y)| word(x) == word(y))
        && a.remainder().iter().zip(b.remainder()).all(|(x, y)| x == y)
}

/// Whether `keep` rejects the line starting at `start`: a sample of a rejected name, or a
/// `# TYPE`/`# HELP` line about one. Unreadable names are not skipped (the full parse
/// rejects them, and so does this one).
fn skipped<'a>(
    line: &'a [u8],
    start: usize,
    keep: &dyn Fn(&str) -> bool,
    judged: &mut Judged<'a>,
) -> bool {
    if line[start] != b'#' {
        let rest = &line[start..];
        if let Some(kept) = judged.recall(rest) {
            return !kept;
        }
        let Some(end) = scan_metric_name(line, start) else {
            return false;
        };
        let name = &line[start..end];
        let kept = keep(ascii(name));
        judged.remember(name, kept);
        return !kept;
    }
    let i = skip_blank(line, start + 1);
    let kw_end = scan_token(line, i);
    if !matches!(&line[i..kw_end], b"TYPE" | b"HELP") {
        return false;
    }
    let n = skip_blank(line, kw_end);
    scan_metric_name(line, n).is_some_and(|end| !keep(ascii(&line[n..end])))
}

fn parse_lines<'a>(
    text: &'a [u8],
    limits: &Limits,
    keep: Option<&dyn Fn(&str) -> bool>,
) -> Exposition<'a> {
    let mut out = Exposition::default();
    let mut judged = Judged::new();
    let mut newlines = memchr::memchr_iter(b'\n', text);
    let mut begin = 0;
    while begin < text.len() {
        let Some(end) = newlines.next() else {
            if !is_blank_line(&text[begin..]) {
                out.rejected_lines += 1;
                out.truncated = true;
            }
            break;
        };
        let line = &text[begin..end];
        begin = end + 1;
        let lead = skip_blank(line, 0);
        if let Some(keep) = keep
            && lead < line.len()
            && skipped(line, lead, keep, &mut judged)
        {
            continue;
        }
        if line.len() > limits.max_line_bytes {
            out.rejected_lines += 1;
            continue;
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if lead >= line.len() {
            continue;
        }
        if line[lead] == b'#' {
            if !comment(&line[lead + 1..], limits, &mut out.types) {
                out.rejected_lines += 1;
            }
            continue;
        }
        if out.samples.len() >= limits.max_samples {
            out.rejected_lines += 1;
            continue;
        }
        match sample(line, lead, limits) {
            Some(s) => out.samples.push(s),
            None => out.rejected_lines += 1,
        }
    }
    drop_ambiguous(&mut out);
    out
}

fn is_blank_line(line: &[u8]) -> bool {
    line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r'))
}

/// Handles the text after `#`. Returns false when the line is a malformed `# TYPE` (or
/// `# HELP` with a bad name) and so counts as rejected.
fn comment<'a>(b: &'a [u8], limits: &Limits, types: &mut HashMap<&'a str, MetricType>) -> bool {
    let i = skip_blank(b, 0);
    let kw_end = scan_token(b, i);
    let keyword = &b[i..kw_end];
    if keyword != b"TYPE" && keyword != b"HELP" {
        return true; // a plain comment
    }
    // The keyword token ends at a blank or at the end: "# TYPE" alone names nothing.
    let n = skip_blank(b, kw_end);
    let Some(name_end) = scan_metric_name(b, n) else {
        return false;
    };
    if name_end < b.len() && !is_blank(b[name_end]) {
        return false;
    }
    if keyword == b"HELP" {
        return true; // the docstring may be anything
    }
    let t = skip_blank(b, name_end);
    let t_end = scan_token(b, t);
    if skip_blank(b, t_end) != b.len() {
        return false;
    }
    let Some(kind) = MetricType::from_word(&b[t..t_end]) else {
        return false;
    };
    if types.len() >= limits.max_samples {
        return false;
    }
    match types.entry(ascii(&b[n..name_end])) {
        Entry::Occupied(_) => false,
        Entry::Vacant(v) => {
            v.insert(kind);
            true
        }
    }
}

/// A line's bytes and, when they are valid UTF-8 (always, but for broken exporters), the
/// same line as text, so that names and values are slices of it without checking each.
struct Line<'a> {
    b: &'a [u8],
    text: Option<&'a str>,
}

impl<'a> Line<'a> {
    fn new(b: &'a [u8]) -> Self {
        Line {
            b,
            text: std::str::from_utf8(b).ok(),
        }
    }

    /// A name the scanners accepted (ASCII).
    fn name(&self, i: usize, j: usize) -> &'a str {
        match self.text.and_then(|t| t.get(i..j)) {
            Some(s) => s,
            None => ascii(&self.b[i..j]),
        }
    }

    /// Text between ASCII delimiters, repaired as [`String::from_utf8_lossy`] would.
    fn text(&self, i: usize, j: usize) -> Cow<'a, str> {
        match self.text.and_then(|t| t.get(i..j)) {
            Some(s) => Cow::Borrowed(s),
            None => String::from_utf8_lossy(&self.b[i..j]),
        }
    }
}

/// Parses one sample line starting at byte `start` (the first non-blank).
fn sample<'a>(b: &'a [u8], start: usize, limits: &Limits) -> Option<Sample<'a>> {
    let line = Line::new(b);
    let name_end = scan_metric_name(b, start)?;
    let mut i = skip_blank(b, name_end);
    let mut labels: Vec<(&'a str, Cow<'a, str>)> = Vec::new();
    if i < b.len() && b[i] == b'{' {
        labels.reserve(4);
        i += 1;
        loop {
            i = skip_blank(b, i);
            match b.get(i)? {
                b'}' => {
                    i += 1;
                    break;
                }
                _ => {
                    let ln_end = scan_label_name(b, i)?;
                    let label_name = line.name(i, ln_end);
                    i = skip_blank(b, ln_end);
                    if b.get(i) != Some(&b'=') {
                        return None;
                    }
                    i = skip_blank(b, i + 1);
                    if b.get(i) != Some(&b'"') {
                        return None;
                    }
                    let (value, after) = label_value(&line, i + 1)?;
                    if labels.len() >= limits.max_labels {
                        return None;
                    }
                    labels.push((label_name, value));
                    i = skip_blank(b, after);
                    match b.get(i)? {
                        b',' => i += 1,
                        b'}' => {
                            i += 1;
                            break;
                        }
                        _ => return None,
                    }
                }
            }
        }
        i = skip_blank(b, i);
    } else if i == name_end {
        // The name must be followed by a blank or `{`; anything else glued to it is junk.
        return None;
    }
    let v_end = scan_token(b, i);
    if v_end == i {
        return None;
    }
    let value = number(&b[i..v_end])?;
    i = skip_blank(b, v_end);
    if i < b.len() {
        let t_end = scan_token(b, i);
        line.text(i, t_end).parse::<i64>().ok()?;
        if skip_blank(b, t_end) != b.len() {
            return None;
        }
    }
    if !value.is_finite() {
        return None;
    }
    if !labels.is_sorted_by(|a, b| a.0 <= b.0) {
        labels.sort_unstable_by(|a, b| a.0.cmp(b.0));
    }
    if labels.windows(2).any(|w| w[0].0 == w[1].0) {
        return None;
    }
    Some(Sample {
        name: line.name(start, name_end),
        labels,
        value,
    })
}

/// A sample value, exactly as `f64::from_str` reads it. Plain decimals of up to 15 digits
/// (counts, and prometheus_client's `12.0`) take a shortcut: the digits are an integer
/// below 2^53 and a power of ten up to 10^22 is exact, so one correctly rounded division
/// gives the correctly rounded value, as the standard parser does.
fn number(token: &[u8]) -> Option<f64> {
    const POW10: [f64; 16] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
    ];
    let (negative, digits) = match token.first() {
        Some(b'-') => (true, &token[1..]),
        Some(b'+') => (false, &token[1..]),
        _ => (false, token),
    };
    let mut mantissa: u64 = 0;
    let mut count = 0;
    let mut fraction: Option<usize> = None;
    for &c in digits {
        match c {
            b'0'..=b'9' if count < 15 => {
                mantissa = mantissa * 10 + u64::from(c - b'0');
                count += 1;
                if let Some(f) = &mut fraction {
                    *f += 1;
                }
            }
            b'.' if fraction.is_none() => fraction = Some(0),
            _ => return std::str::from_utf8(token).ok()?.parse().ok(),
        }
    }
    if count == 0 {
        return std::str::from_utf8(token).ok()?.parse().ok();
    }
    let magnitude = mantissa as f64 / POW10[fraction.unwrap_or(0)];
    Some(if negative { -magnitude } else { magnitude })
}

/// Reads a quoted label value whose first byte (after the opening quote) is at `start`.
/// Returns the unescaped value and the index after the closing quote.
fn label_value<'a>(line: &Line<'a>, start: usize) -> Option<(Cow<'a, str>, usize)> {
    let b = line.b;
    let Some(end) = memchr::memchr2(b'"', b'\\', &b[start..]).map(|i| start + i) else {
        return None; // unterminated
    };
    // Fast path: most values have no escapes and are borrowed whole.
    if b[end] == b'"' {
        return Some((line.text(start, end), end + 1));
    }
    let mut out = String::with_capacity(end - start + 16);
    out.push_str(&line.text(start, end));
    let mut i = end;
    loop {
        // Here b[i] is a backslash. `"` and `\` are ASCII, so every piece between them
        // is repaired as the whole value would be.
        match b.get(i + 1)? {
            b'\\' => out.push('\\'),
            b'"' => out.push('"'),
            b'n' => out.push('\n'),
            _ => return None,
        }
        i += 2;
        let run = i;
        while i < b.len() && b[i] != b'"' && b[i] != b'\\' {
            i += 1;
        }
        out.push_str(&line.text(run, i));
        match b.get(i)? {
            b'"' => return Some((Cow::Owned(out), i + 1)),
            _ => continue, // another backslash
        }
    }
}

/// A name the scanners below accepted: ASCII only, so always valid UTF-8.
fn ascii(name: &[u8]) -> &str {
    debug_assert!(name.is_ascii());
    std::str::from_utf8(name).unwrap_or_default()
}

fn is_blank(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

/// Byte classes for names, one table lookup per byte: bit 0 continues a metric name
/// (`[a-zA-Z0-9_:]`), bit 1 continues a label name (`[a-zA-Z0-9_]`).
const NAME_BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphanumeric() || b == b'_' {
            t[c] = 0b11;
        } else if b == b':' {
            t[c] = 0b01;
        }
        c += 1;
    }
    t
};

fn is_name_byte(c: u8) -> bool {
    NAME_BYTES[c as usize] & 0b01 != 0
}

fn is_label_name_byte(c: u8) -> bool {
    NAME_BYTES[c as usize] & 0b10 != 0
}

fn skip_blank(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_blank(b[i]) {
        i += 1;
    }
    i
}

/// End of the run of non-blank bytes starting at `i`.
fn scan_token(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && !is_blank(b[i]) {
        i += 1;
    }
    i
}

/// End of a metric name `[a-zA-Z_:][a-zA-Z0-9_:]*` starting at `i`, if there is one.
fn scan_metric_name(b: &[u8], i: usize) -> Option<usize> {
    let first = *b.get(i)?;
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b':') {
        return None;
    }
    let mut j = i + 1;
    while j < b.len() && is_name_byte(b[j]) {
        j += 1;
    }
    Some(j)
}

/// End of a label name `[a-zA-Z_][a-zA-Z0-9_]*` starting at `i`, if there is one.
fn scan_label_name(b: &[u8], i: usize) -> Option<usize> {
    let first = *b.get(i)?;
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return None;
    }
    let mut j = i + 1;
    while j < b.len() && is_label_name_byte(b[j]) {
        j += 1;
    }
    Some(j)
}

/// Drops every sample of a series that occurs more than once.
fn drop_ambiguous(out: &mut Exposition<'_>) {
    type Key<'s, 'a> = (&'a str, &'s [(&'a str, Cow<'a, str>)]);
    // foldhash is randomly seeded per process, as std's SipHash is, so an exporter cannot
    // craft colliding series to make this quadratic; it hashes short strings much faster.
    let mut seen: HashMap<Key<'_, '_>, bool, foldhash::quality::RandomState> =
        HashMap::with_capacity_and_hasher(out.samples.len(), Default::default());
    let mut any_dup = false;
    for s in &out.samples {
        match seen.entry((s.name, s.labels.as_slice())) {
            Entry::Occupied(mut e) => {
                *e.get_mut() = true;
                any_dup = true;
            }
            Entry::Vacant(v) => {
                v.insert(false);
            }
        }
    }
    if !any_dup {
        return;
    }
    let dup: Vec<bool> = out
        .samples
        .iter()
        .map(|s| seen[&(s.name, s.labels.as_slice())])
        .collect();
    let ambiguous = seen.values().filter(|d| **d).count();
    drop(seen);
    let mut i = 0;
    out.samples.retain(|_| {
        i += 1;
        !dup[i - 1]
    });
    out.ambiguous_series += ambiguous;
}

#[cfg(test)]
#[path = "parser_tests.rs"]
mod tests;
