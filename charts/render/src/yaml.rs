//! `toYaml` and `toJson` as Helm writes them.
//!
//! Helm's `toYaml` goes through `sigs.k8s.io/yaml`: JSON first, then go-yaml v2's block
//! emitter. What that means for the text, and what this writer reproduces:
//! - maps in go-yaml's key order (letters after other characters, digit runs by value);
//! - a list under a map key is not indented (`key:\n- a`), a map in a list item starts on
//!   the dash line (`- a: 1\n  b: 2`);
//! - `{}` and `[]` for empty collections, `null` for nil;
//! - strings plain when they read back as the same string, double-quoted when they would
//!   read as something else (`"1"`, `"true"`, `""`, `"2024-01-01"`), single-quoted when
//!   they hold indicators (`'*'`, `'a: b'`), a literal block (`|`, `|-`, `|+`) when they
//!   span lines;
//! - floats with an integral value as integers (they went through JSON).
//!
//! Not reproduced: go-yaml folds plain scalars longer than 80 columns onto several lines;
//! this writer keeps them on one (both read back as the same string).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::Value;
use crate::value::go_float;

/// The YAML of a value, ending in a newline (`toYaml` removes it).
pub fn to_yaml(v: &Value) -> String {
    let v = v.to_data();
    let mut out = String::new();
    match &v {
        Value::Map(m) if !m.is_empty() => mapping(&mut out, m, 0, false),
        Value::List(l) if !l.is_empty() => sequence(&mut out, l, 0, false),
        v => {
            scalar_value(&mut out, v, 0);
            out.push('\n');
        }
    }
    out
}

/// Map entries in go-yaml v2's key order.
fn sorted(m: &BTreeMap<String, Value>) -> Vec<(&String, &Value)> {
    let mut entries: Vec<_> = m.iter().collect();
    entries.sort_by(|a, b| key_order(a.0, b.0));
    entries
}

/// go-yaml v2's `keyList.Less`: runs of digits compare by value, a letter sorts after a
/// non-letter, otherwise by code point.
pub(crate) fn key_order(a: &str, b: &str) -> Ordering {
    let ar: Vec<char> = a.chars().collect();
    let br: Vec<char> = b.chars().collect();
    let mut i = 0;
    while i < ar.len() && i < br.len() {
        if ar[i] == br[i] {
            i += 1;
            continue;
        }
        let al = ar[i].is_alphabetic();
        let bl = br[i].is_alphabetic();
        if al && bl {
            return ar[i].cmp(&br[i]);
        }
        if al || bl {
            return if bl {
                Ordering::Less
            } else {
                Ordering::Greater
            };
        }
        let (mut an, mut bn) = (0i64, 0i64);
        if ar[i] == '0' || br[i] == '0' {
            let mut j = i;
            while j > 0 && ar[j - 1].is_ascii_digit() {
                j -= 1;
                if ar[j] != '0' {
                    an = 1;
                    bn = 1;
                    break;
                }
            }
        }
        let mut ai = i;
        while ai < ar.len() && ar[ai].is_ascii_digit() {
            an = an
                .saturating_mul(10)
                .saturating_add(i64::from(ar[ai] as u8 - b'0'));
            ai += 1;
        }
        let mut bi = i;
        while bi < br.len() && br[bi].is_ascii_digit() {
            bn = bn
                .saturating_mul(10)
                .saturating_add(i64::from(br[bi] as u8 - b'0'));
            bi += 1;
        }
        if an != bn {
            return an.cmp(&bn);
        }
        if ai != bi {
            return ai.cmp(&bi);
        }
        return ar[i].cmp(&br[i]);
    }
    ar.len().cmp(&br.len())
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// A non-empty map whose keys sit at column `indent`; when `inline`, the first key
/// continues the current line (after `- `).
fn mapping(out: &mut String, m: &BTreeMap<String, Value>, indent: usize, inline: bool) {
    for (i, (k, v)) in sorted(m).into_iter().enumerate() {
        if i > 0 || !inline {
            pad(out, indent);
        }
        out.push_str(&scalar_string(k, true, indent));
        out.push(':');
        match v {
            Value::Map(child) if !child.is_empty() => {
                out.push('\n');
                mapping(out, child, indent + 2, false);
            }
            Value::List(child) if !child.is_empty() => {
                out.push('\n');
                sequence(out, child, indent, false);
            }
            v => {
                out.push(' ');
                scalar_value(out, v, indent);
                out.push('\n');
            }
        }
    }
}

/// A non-empty list whose dashes sit at column `indent`.
fn sequence(out: &mut String, l: &[Value], indent: usize, inline: bool) {
    for (i, v) in l.iter().enumerate() {
        if i > 0 || !inline {
            pad(out, indent);
        }
        out.push_str("- ");
        match v {
            Value::Map(child) if !child.is_empty() => mapping(out, child, indent + 2, true),
            Value::List(child) if !child.is_empty() => sequence(out, child, indent + 2, true),
            v => {
                scalar_value(out, v, indent);
                out.push('\n');
            }
        }
    }
}

/// A scalar or empty collection, without the line's end. `indent` is the column of the
/// key or dash it belongs to (a literal block is indented two more).
fn scalar_value(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Nil => out.push_str("null"),
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => out.push_str(&yaml_float(*f)),
        Value::Str(s) => out.push_str(&scalar_string(s, false, indent)),
        Value::List(_) => out.push_str("[]"),
        Value::Map(_) => out.push_str("{}"),
        // to_data removed these.
        Value::Files(_) | Value::ApiVersions(_) => out.push_str("{}"),
    }
}

/// A float after the JSON round trip: integral values below 1e21 became integers.
fn yaml_float(f: f64) -> String {
    if f.is_nan() {
        return ".nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    if f.fract() == 0.0 && f.abs() < 1e21 {
        return format!("{}", f as i128);
    }
    // go-yaml formats with 'g' and the shortest precision, as Go's %v does.
    go_float(f)
}

/// What libyaml's scalar analysis finds in a string.
struct Analysis {
    block_plain: bool,
    single_quoted: bool,
    block: bool,
    multiline: bool,
}

fn printable(c: char) -> bool {
    let u = c as u32;
    u == 0x0A
        || (0x20..=0x7E).contains(&u)
        || u == 0x85
        || (0xA0..=0xD7FF).contains(&u)
        || ((0xE000..=0xFFFD).contains(&u) && u != 0xFEFF)
        || (0x10000..=0x10FFFF).contains(&u)
}

fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blankz(c: Option<char>) -> bool {
    match c {
        None => true,
        Some(c) => c == ' ' || c == '\t' || is_break(c) || c == '\0',
    }
}

fn analyze(s: &str) -> Analysis {
    if s.is_empty() {
        return Analysis {
            block_plain: true,
            single_quoted: true,
            block: false,
            multiline: false,
        };
    }
    let chars: Vec<char> = s.chars().collect();
    let (mut flow_ind, mut block_ind) = (false, false);
    if s.starts_with("---") || s.starts_with("...") {
        flow_ind = true;
        block_ind = true;
    }
    let (mut leading_space, mut leading_break, mut trailing_space, mut trailing_break) =
        (false, false, false, false);
    let (mut break_space, mut space_break, mut special, mut line_breaks) =
        (false, false, false, false);
    let (mut prev_space, mut prev_break) = (false, false);
    let mut preceded_by_ws = true;
    let n = chars.len();
    for (i, &c) in chars.iter().enumerate() {
        let followed_by_ws = is_blankz(chars.get(i + 1).copied());
        if i == 0 {
            if "#,[]{}&*!|>'\"%@`".contains(c) {
                flow_ind = true;
                block_ind = true;
            }
            if c == '?' || c == ':' {
                flow_ind = true;
                if followed_by_ws {
                    block_ind = true;
                }
            }
            if c == '-' && followed_by_ws {
                flow_ind = true;
                block_ind = true;
            }
        } else {
            if ",?[]{}".contains(c) {
                flow_ind = true;
            }
            if c == ':' {
                flow_ind = true;
                if followed_by_ws {
                    block_ind = true;
                }
            }
            if c == '#' && preceded_by_ws {
                flow_ind = true;
                block_ind = true;
            }
        }
        if !printable(c) {
            special = true;
        }
        if is_break(c) {
            line_breaks = true;
        }
        if c == ' ' {
            if i == 0 {
                leading_space = true;
            }
            if i == n - 1 {
                trailing_space = true;
            }
            if prev_break {
                break_space = true;
            }
            prev_space = true;
            prev_break = false;
        } else if is_break(c) {
            if i == 0 {
                leading_break = true;
            }
            if i == n - 1 {
                trailing_break = true;
            }
            if prev_space {
                space_break = true;
            }
            prev_break = true;
            prev_space = false;
        } else {
            prev_space = false;
            prev_break = false;
        }
        preceded_by_ws = is_blankz(Some(c));
    }
    let _ = flow_ind;
    let mut a = Analysis {
        block_plain: true,
        single_quoted: true,
        block: true,
        multiline: line_breaks,
    };
    if leading_space || leading_break || trailing_space || trailing_break {
        a.block_plain = false;
    }
    if trailing_space {
        a.block = false;
    }
    if break_space {
        a.block_plain = false;
        a.single_quoted = false;
    }
    if space_break || special {
        a.block_plain = false;
        a.single_quoted = false;
        a.block = false;
    }
    if line_breaks {
        a.block_plain = false;
    }
    if block_ind {
        a.block_plain = false;
    }
    a
}

/// Whether go-yaml v2 would read `s`, unquoted, as something other than a string.
fn resolves_to_non_string(s: &str) -> bool {
    const SPECIAL: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", "n", "N", "no",
        "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", "", "~", "null", "Null",
        "NULL", ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf",
        "-.Inf", "-.INF",
    ];
    let Some(first) = s.chars().next() else {
        return true;
    };
    let hint = match first {
        '+' | '-' => 'S',
        '0'..='9' => 'D',
        'y' | 'Y' | 'n' | 'N' | 't' | 'T' | 'f' | 'F' | 'o' | 'O' | '~' => 'M',
        '.' => '.',
        _ => return false,
    };
    if SPECIAL.contains(&s) {
        return true;
    }
    match hint {
        '.' => go_parse_float(s),
        'D' | 'S' => {
            if is_timestamp(s) {
                return true;
            }
            let plain = s.replace('_', "");
            if go_parse_int(&plain) || yaml_style_float(&plain) {
                return true;
            }
            for prefix in ["0b", "-0b"] {
                if let Some(bits) = plain.strip_prefix(prefix)
                    && !bits.is_empty()
                    && bits.bytes().all(|b| b == b'0' || b == b'1')
                {
                    return true;
                }
            }
            false
        }
        _ => false,
    }
}

/// `strconv.ParseInt(s, 0, 64)` (or ParseUint) succeeds.
fn go_parse_int(s: &str) -> bool {
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = body.to_ascii_lowercase();
    let (digits, radix) = if let Some(h) = lower.strip_prefix("0x") {
        (h, 16)
    } else if let Some(o) = lower.strip_prefix("0o") {
        (o, 8)
    } else if let Some(b) = lower.strip_prefix("0b") {
        (b, 2)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (&lower[1..], 8)
    } else {
        (lower.as_str(), 10)
    };
    !digits.is_empty() && u64::from_str_radix(digits, radix).is_ok()
}

/// go-yaml's `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if i < b.len() && b[i] == b'.' {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if i < b.len() && b[i] == b'.' {
            i += 1;
            digits(&mut i);
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// `strconv.ParseFloat` succeeds (for strings starting with '.').
fn go_parse_float(s: &str) -> bool {
    yaml_style_float(s)
}

/// go-yaml's timestamp check: four digits, a dash, then a date (and maybe a time).
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 8 || !b[..4].iter().all(u8::is_ascii_digit) || b[4] != b'-' {
        return false;
    }
    let rest = &s[5..];
    let (date, time) = match rest.find(['T', 't', ' ']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut parts = date.split('-');
    let ok_part = |p: Option<&str>| {
        p.is_some_and(|p| (1..=2).contains(&p.len()) && p.bytes().all(|c| c.is_ascii_digit()))
    };
    if !ok_part(parts.next()) || !ok_part(parts.next()) || parts.next().is_some() {
        return false;
    }
    match time {
        None => true,
        Some(t) => t.split(':').count() >= 3 && t.starts_with(|c: char| c.is_ascii_digit()),
    }
}

/// go-yaml's `isBase60Float`: `1:20`, `-1:30:00.5`.
fn is_base60_float(s: &str) -> bool {
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let Some(first) = body.chars().next() else {
        return false;
    };
    if !first.is_ascii_digit() || !body.contains(':') {
        return false;
    }
    let (main, frac) = match body.split_once('.') {
        Some((m, f)) => (m, Some(f)),
        None => (body, None),
    };
    if frac.is_some_and(|f| !f.bytes().all(|b| b.is_ascii_digit() || b == b'_')) {
        return false;
    }
    let mut parts = main.split(':');
    let head = parts.next().unwrap_or("");
    if !head.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return false;
    }
    parts.all(|p| {
        (1..=2).contains(&p.len())
            && p.bytes().all(|b| b.is_ascii_digit())
            && (p.len() == 1 || p.as_bytes()[0] <= b'5')
    })
}

/// A string as go-yaml v2 writes it; `key` for map keys (no block scalars there).
fn scalar_string(s: &str, key: bool, indent: usize) -> String {
    let a = analyze(s);
    let can_plain = !resolves_to_non_string(s) && !is_base60_float(s);
    if s.contains('\n') {
        if a.block && !key {
            return literal(s, indent);
        }
        return double_quoted(s);
    }
    if can_plain {
        if a.block_plain && !(key && a.multiline) {
            return s.to_string();
        }
        if a.single_quoted {
            return format!("'{}'", s.replace('\'', "''"));
        }
    }
    double_quoted(s)
}

/// A literal block scalar, its lines indented two past `indent`.
fn literal(s: &str, indent: usize) -> String {
    let mut out = String::from("|");
    if s.starts_with([' ', '\n']) {
        out.push('2');
    }
    if !s.ends_with('\n') {
        out.push('-');
    } else if s == "\n" || s.ends_with("\n\n") {
        out.push('+');
    }
    let body = s.strip_suffix('\n').unwrap_or(s);
    for line in body.split('\n') {
        out.push('\n');
        if !line.is_empty() {
            pad(&mut out, indent + 2);
            out.push_str(line);
        }
    }
    out
}

fn double_quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\0' => out.push_str("\\0"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{b}' => out.push_str("\\v"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{85}' => out.push_str("\\N"),
            '\u{a0}' => out.push_str("\\_"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if printable(c) && c != '\u{feff}' => out.push(c),
            c if (c as u32) <= 0xFF => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c if (c as u32) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08X}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// JSON as Go's `json.Marshal` writes it: compact, map keys in byte order, `<`, `>`
/// and `&` escaped, integral floats without a fraction.
pub fn to_json(v: &Value) -> String {
    let mut out = String::new();
    json(&mut out, &v.to_data());
    out
}

fn json(out: &mut String, v: &Value) {
    match v {
        Value::Nil => out.push_str("null"),
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => out.push_str(&json_float(*f)),
        Value::Str(s) => json_string(out, s),
        Value::List(l) => {
            out.push('[');
            for (i, v) in l.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json(out, v);
            }
            out.push(']');
        }
        Value::Map(m) => {
            out.push('{');
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_string(out, k);
                out.push(':');
                json(out, v);
            }
            out.push('}');
        }
        Value::Files(_) | Value::ApiVersions(_) => json(out, &v.to_data()),
    }
}

fn json_float(f: f64) -> String {
    if !f.is_finite() {
        // Go refuses these; Helm's toJson then prints nothing. null keeps the JSON valid.
        return "null".into();
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Go: 'e' format with a two-digit minimum exponent trimmed ("1e-07" → "1e-7").
        let s = format!("{f:e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        return format!("{m}e{}{}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    if f.fract() == 0.0 {
        return format!("{}", f as i128);
    }
    format!("{f}")
}

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn y(j: serde_json::Value) -> String {
        to_yaml(&Value::from(j))
    }

    #[test]
    fn block_style_like_go_yaml() {
        let v = json!({
            "resources": {"limits": {"memory": "256Mi"}, "requests": {"cpu": "50m"}},
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            "args": ["a", "b"],
            "nested": [["x", "y"], []],
            "empty": {},
            "none": null,
            "flag": true,
            "num": 3,
            "f": 2.5,
            "whole": 4.0,
        });
        // "y" is a boolean to go-yaml (YAML 1.1), so it is quoted.
        assert_eq!(
            y(v),
            "args:\n- a\n- b\nempty: {}\nf: 2.5\nflag: true\nnested:\n- - x\n  - \"y\"\n- []\nnone: null\nnum: 3\nresources:\n  limits:\n    memory: 256Mi\n  requests:\n    cpu: 50m\ntolerations:\n- effect: NoSchedule\n  key: k\n  operator: Exists\nwhole: 4\n"
        );
        assert_eq!(y(json!([{"a": {"b": [1]}}])), "- a:\n    b:\n    - 1\n");
        assert_eq!(y(json!({})), "{}\n");
        assert_eq!(y(json!(null)), "null\n");
        assert_eq!(y(json!("x")), "x\n");
    }

    #[test]
    fn keys_sort_as_go_yaml_sorts_them() {
        let mut keys = vec!["b", "a10", "a9", "A", "_x", "a_b", "ab", "a-b", "a.b"];
        keys.sort_by(|a, b| key_order(a, b));
        assert_eq!(
            keys,
            ["_x", "A", "a-b", "a.b", "a_b", "a9", "a10", "ab", "b"]
        );
    }

    #[test]
    fn strings_are_quoted_only_when_needed() {
        let cases = [
            ("plain", "plain"),
            ("0.0.0.0", "0.0.0.0"),
            ("$(POD_IP)", "$(POD_IP)"),
            (
                "ghcr.io/ballast-dev/ballast:0.1.0",
                "ghcr.io/ballast-dev/ballast:0.1.0",
            ),
            ("", "\"\""),
            ("1", "\"1\""),
            ("1.5", "\"1.5\""),
            ("0x1F", "\"0x1F\""),
            ("1e3", "\"1e3\""),
            ("true", "\"true\""),
            ("yes", "\"yes\""),
            ("Off", "\"Off\""),
            ("null", "\"null\""),
            ("~", "\"~\""),
            ("2024-01-02", "\"2024-01-02\""),
            ("1:20", "\"1:20\""),
            ("*", "'*'"),
            ("a: b", "'a: b'"),
            ("- x", "'- x'"),
            ("x #y", "'x #y'"),
            ("x#y", "x#y"),
            (" lead", "' lead'"),
            ("it's", "it's"),
            ("'q'", "'''q'''"),
            ("tab\there", "\"tab\\there\""),
            ("---", "'---'"),
            ("a:b", "a:b"),
            ("-x", "-x"),
            ("héllo", "héllo"),
        ];
        for (s, want) in cases {
            assert_eq!(y(json!({"k": s})), format!("k: {want}\n"), "{s:?}");
        }
        assert_eq!(y(json!({"1": "a", "true": "b"})), "\"1\": a\n\"true\": b\n");
    }

    #[test]
    fn multi_line_strings_are_literal_blocks() {
        assert_eq!(y(json!({"k": "a\nb"})), "k: |-\n  a\n  b\n");
        assert_eq!(y(json!({"k": "a\n\nb\n"})), "k: |\n  a\n\n  b\n");
        assert_eq!(y(json!({"k": "a\n\n"})), "k: |+\n  a\n\n");
        assert_eq!(y(json!({"k": " a\nb"})), "k: |2-\n   a\n  b\n");
        assert_eq!(y(json!([{"k": "a\nb"}])), "- k: |-\n    a\n    b\n");
        assert_eq!(y(json!(["a\nb"])), "- |-\n  a\n  b\n");
        // A space before a line break rules the block out.
        assert_eq!(y(json!({"k": "a \nb"})), "k: \"a \\nb\"\n");
    }

    #[test]
    fn json_like_go() {
        let v = Value::from(json!({"b": [1, 2.5, 3.0, "<&>"], "a": null, "c": {"x": true}}));
        assert_eq!(
            to_json(&v),
            r#"{"a":null,"b":[1,2.5,3,"\u003c\u0026\u003e"],"c":{"x":true}}"#
        );
        assert_eq!(json_float(1e21), "1e+21");
        assert_eq!(json_float(1e-7), "1e-7");
        assert_eq!(json_float(0.5), "0.5");
    }
}
