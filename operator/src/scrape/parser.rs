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
    fn from_word(w: &str) -> Option<Self> {
        Some(match w {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            "summary" => MetricType::Summary,
            "untyped" => MetricType::Untyped,
            _ => return None,
        })
    }
}

/// One sample: a series (name and label set) and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name as written, e.g. `vllm:time_to_first_token_seconds_bucket`.
    pub name: String,
    /// Labels sorted by name; names are unique. Values are unescaped.
    pub labels: Vec<(String, String)>,
    /// The value, always finite.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        // Sorted and short: a linear scan beats a binary search at these sizes.
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What one exposition contained.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    /// Samples in input order, without rejected lines and ambiguous series.
    pub samples: Vec<Sample>,
    /// The declared `# TYPE` of each family, by family name.
    pub types: HashMap<String, MetricType>,
    /// Lines that were rejected (syntax, non-finite value, limits, truncation).
    pub rejected_lines: usize,
    /// Series that appeared more than once and were dropped entirely.
    pub ambiguous_series: usize,
    /// The body ended without a final `\n` after a non-empty line.
    pub truncated: bool,
}

impl Exposition {
    /// Rejected lines plus ambiguous series: everything that was wrong with the input.
    pub fn errors(&self) -> usize {
        self.rejected_lines + self.ambiguous_series
    }

    /// Samples named exactly `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
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
pub fn parse(text: &str) -> Exposition {
    parse_with(text, &Limits::default())
}

/// Parses `text` with explicit `limits`. See the module docs for the rules.
pub fn parse_with(text: &str, limits: &Limits) -> Exposition {
    parse_lines(text, limits, &|_| true)
}

/// Parses only the series and `# TYPE`/`# HELP` lines whose metric name `keep` accepts.
/// Any other line is skipped once its name is scanned: no sample is built, nothing is
/// copied, and a malformed line of a skipped family is not counted. For what it keeps,
/// the result is exactly [`parse_with`]'s (a line whose name cannot be scanned is
/// rejected, as it is there); only `max_samples` counts kept samples alone.
pub fn parse_selected(text: &str, limits: &Limits, keep: &dyn Fn(&str) -> bool) -> Exposition {
    parse_lines(text, limits, keep)
}

/// The metric name a line starting at `start` is about: a sample's name, or the name a
/// `# TYPE` or `# HELP` line declares. `None` for other comments and unreadable names.
fn line_name(line: &str, start: usize) -> Option<&str> {
    let b = line.as_bytes();
    if b[start] != b'#' {
        let end = scan_metric_name(b, start)?;
        return Some(&line[start..end]);
    }
    let i = skip_blank(b, start + 1);
    let kw_end = scan_token(b, i);
    if !matches!(&line[i..kw_end], "TYPE" | "HELP") {
        return None;
    }
    let n = skip_blank(b, kw_end);
    let end = scan_metric_name(b, n)?;
    Some(&line[n..end])
}

fn parse_lines(text: &str, limits: &Limits, keep: &dyn Fn(&str) -> bool) -> Exposition {
    let mut out = Exposition::default();
    let mut rest = text;
    while !rest.is_empty() {
        let (line, terminated) = match rest.find('\n') {
            Some(i) => {
                let line = &rest[..i];
                rest = &rest[i + 1..];
                (line, true)
            }
            None => {
                let line = rest;
                rest = "";
                (line, false)
            }
        };
        if !terminated {
            if !is_blank_line(line) {
                out.rejected_lines += 1;
                out.truncated = true;
            }
            break;
        }
        // Skipped families cost a name scan (bounded by the line, which is in memory).
        let lead = skip_blank(line.as_bytes(), 0);
        if lead < line.len() && line_name(line, lead).is_some_and(|name| !keep(name)) {
            continue;
        }
        if line.len() > limits.max_line_bytes {
            out.rejected_lines += 1;
            continue;
        }
        let line = line.strip_suffix('\r').unwrap_or(line);
        let start = skip_blank(line.as_bytes(), 0);
        if start == line.len() {
            continue;
        }
        if line.as_bytes()[start] == b'#' {
            if !comment(&line[start + 1..], limits, &mut out.types) {
                out.rejected_lines += 1;
            }
            continue;
        }
        if out.samples.len() >= limits.max_samples {
            out.rejected_lines += 1;
            continue;
        }
        match sample(line, start, limits) {
            Some(s) => out.samples.push(s),
            None => out.rejected_lines += 1,
        }
    }
    drop_ambiguous(&mut out);
    out
}

fn is_blank_line(line: &str) -> bool {
    line.bytes().all(|b| b == b' ' || b == b'\t' || b == b'\r')
}

/// Handles the text after `#`. Returns false when the line is a malformed `# TYPE` (or
/// `# HELP` with a bad name) and so counts as rejected.
fn comment(text: &str, limits: &Limits, types: &mut HashMap<String, MetricType>) -> bool {
    let b = text.as_bytes();
    let i = skip_blank(b, 0);
    let kw_end = scan_token(b, i);
    let keyword = &text[i..kw_end];
    if keyword != "TYPE" && keyword != "HELP" {
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
    if keyword == "HELP" {
        return true; // the docstring may be anything
    }
    let t = skip_blank(b, name_end);
    let t_end = scan_token(b, t);
    if skip_blank(b, t_end) != b.len() {
        return false;
    }
    let Some(kind) = MetricType::from_word(&text[t..t_end]) else {
        return false;
    };
    if types.len() >= limits.max_samples {
        return false;
    }
    match types.entry(text[n..name_end].to_owned()) {
        Entry::Occupied(_) => false,
        Entry::Vacant(v) => {
            v.insert(kind);
            true
        }
    }
}

/// Parses one sample line starting at byte `start` (the first non-blank).
fn sample(line: &str, start: usize, limits: &Limits) -> Option<Sample> {
    let b = line.as_bytes();
    let name_end = scan_metric_name(b, start)?;
    let mut i = skip_blank(b, name_end);
    let mut labels: Vec<(String, String)> = Vec::new();
    if i < b.len() && b[i] == b'{' {
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
                    let label_name = &line[i..ln_end];
                    i = skip_blank(b, ln_end);
                    if b.get(i) != Some(&b'=') {
                        return None;
                    }
                    i = skip_blank(b, i + 1);
                    if b.get(i) != Some(&b'"') {
                        return None;
                    }
                    let (value, after) = label_value(line, i + 1)?;
                    if labels.len() >= limits.max_labels {
                        return None;
                    }
                    labels.push((label_name.to_owned(), value));
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
    let value: f64 = line[i..v_end].parse().ok()?;
    i = skip_blank(b, v_end);
    if i < b.len() {
        let t_end = scan_token(b, i);
        line[i..t_end].parse::<i64>().ok()?;
        if skip_blank(b, t_end) != b.len() {
            return None;
        }
    }
    if !value.is_finite() {
        return None;
    }
    if !labels.is_sorted_by(|a, b| a.0 <= b.0) {
        labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    }
    if labels.windows(2).any(|w| w[0].0 == w[1].0) {
        return None;
    }
    Some(Sample {
        name: line[start..name_end].to_owned(),
        labels,
        value,
    })
}

/// Reads a quoted label value whose first byte (after the opening quote) is at `start`.
/// Returns the unescaped value and the index after the closing quote.
fn label_value(line: &str, start: usize) -> Option<(String, usize)> {
    let b = line.as_bytes();
    let mut i = start;
    // Fast path: most values have no escapes and are copied in one piece.
    while i < b.len() {
        match b[i] {
            b'"' => return Some((line[start..i].to_owned(), i + 1)),
            b'\\' => break,
            _ => i += 1,
        }
    }
    if i >= b.len() {
        return None; // unterminated
    }
    let mut out = String::with_capacity(i - start + 16);
    out.push_str(&line[start..i]);
    loop {
        // Here b[i] is a backslash. `"` and `\` are ASCII, so every slice boundary below
        // falls between UTF-8 characters.
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
        out.push_str(&line[run..i]);
        match b.get(i)? {
            b'"' => return Some((out, i + 1)),
            _ => continue, // another backslash
        }
    }
}

fn is_blank(c: u8) -> bool {
    c == b' ' || c == b'\t'
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
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b':') {
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
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        j += 1;
    }
    Some(j)
}

/// Drops every sample of a series that occurs more than once.
fn drop_ambiguous(out: &mut Exposition) {
    #[derive(Hash, PartialEq, Eq)]
    struct Key<'a>(&'a str, &'a [(String, String)]);

    // The std hasher is randomly keyed, so an exporter cannot craft colliding series to
    // make this quadratic.
    let mut seen: HashMap<Key<'_>, bool> = HashMap::with_capacity(out.samples.len());
    let mut any_dup = false;
    for s in &out.samples {
        match seen.entry(Key(&s.name, &s.labels)) {
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
        .map(|s| seen[&Key(&s.name, &s.labels)])
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
