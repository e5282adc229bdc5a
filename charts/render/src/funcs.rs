//! The functions templates may call: Go's builtins (`and`, `or`, `not`, `eq`… `len`,
//! `index`, `print`, `printf`, `println`) and the Sprig/Helm functions the chart uses.
//! `and`, `or` and `include` need the executor and live there; the rest are pure.
//!
//! Arguments are type-checked as Go checks a call through reflection: a function taking a
//! `string` refuses an integer or a missing value ("wrong type for value; expected
//! string; got int"), so a template that would fail in Helm fails here too.

use std::collections::BTreeMap;

use crate::Value;
use crate::value::go_float;
use crate::yaml::{to_json, to_yaml};

/// The widest padding `indent`, `nindent` and `printf` widths may ask for: a typo such as
/// `indent 40000000000` is an error, not an allocation that aborts the process.
const MAX_WIDTH: i64 = 1 << 20;

/// Whether `name` is a function.
pub(crate) fn exists(name: &str) -> bool {
    crate::FUNCTIONS.contains(&name)
}

/// Why a call failed.
#[derive(Debug, PartialEq)]
pub(crate) enum FuncError {
    /// A wrong call: reported as `error calling NAME: MESSAGE`.
    Call(String),
    /// `fail` and `required`: the template's own message, reported as is.
    User(String),
}

type Result<T> = std::result::Result<T, FuncError>;

fn call_err<T>(msg: impl Into<String>) -> Result<T> {
    Err(FuncError::Call(msg.into()))
}

fn arity(name: &str, args: &[Value], want: usize) -> Result<()> {
    if args.len() != want {
        return call_err(format!(
            "wrong number of args for {name}: want {want} got {}",
            args.len()
        ));
    }
    Ok(())
}

fn at_least(name: &str, args: &[Value], want: usize) -> Result<()> {
    if args.len() < want {
        return call_err(format!(
            "wrong number of args for {name}: want at least {want} got {}",
            args.len()
        ));
    }
    Ok(())
}

/// A `string` parameter.
fn string(v: &Value) -> Result<&str> {
    match v {
        Value::Str(s) => Ok(s),
        Value::Nil => call_err("invalid value; expected string"),
        v => call_err(format!(
            "wrong type for value; expected string; got {}",
            v.go_type()
        )),
    }
}

/// An `int` parameter.
fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::Nil => call_err("invalid value; expected int"),
        v => call_err(format!(
            "wrong type for value; expected int; got {}",
            v.go_type()
        )),
    }
}

/// Sprig's `strval`: strings as they are, everything else as `%v` prints it.
pub(crate) fn strval(v: &Value) -> String {
    match v {
        Value::Str(s) => s.clone(),
        v => v.to_go_string(),
    }
}

/// Calls a pure function.
pub(crate) fn call(name: &str, mut args: Vec<Value>) -> Result<Value> {
    let a = &args;
    Ok(match name {
        "not" => {
            arity(name, a, 1)?;
            Value::Bool(!a[0].truthy())
        }
        "eq" => {
            at_least(name, a, 2)?;
            let mut any = false;
            for b in &a[1..] {
                any |= equal(&a[0], b)?;
            }
            Value::Bool(any)
        }
        "ne" => {
            arity(name, a, 2)?;
            Value::Bool(!equal(&a[0], &a[1])?)
        }
        "lt" | "le" | "gt" | "ge" => {
            arity(name, a, 2)?;
            let ord = compare(&a[0], &a[1])?;
            Value::Bool(match name {
                "lt" => ord.is_lt(),
                "le" => ord.is_le(),
                "gt" => ord.is_gt(),
                _ => ord.is_ge(),
            })
        }
        "len" => {
            arity(name, a, 1)?;
            Value::Int(match &a[0] {
                Value::Str(s) => s.len() as i64,
                Value::List(l) => l.len() as i64,
                Value::Map(m) => m.len() as i64,
                Value::Files(f) => f.len() as i64,
                Value::Nil => return call_err("len of nil pointer"),
                v => return call_err(format!("len of type {}", v.go_type())),
            })
        }
        "index" => {
            at_least(name, a, 1)?;
            let mut item = a[0].to_data();
            for key in &a[1..] {
                item = match (&item, key) {
                    (Value::Map(m), Value::Str(k)) => m.get(k).cloned().unwrap_or(Value::Nil),
                    (Value::Map(_), k) => {
                        return call_err(format!(
                            "value has type {}; should be string",
                            k.go_type()
                        ));
                    }
                    (Value::List(l), Value::Int(i)) => {
                        match usize::try_from(*i).ok().and_then(|i| l.get(i)) {
                            Some(v) => v.clone(),
                            None => return call_err(format!("index out of range: {i}")),
                        }
                    }
                    (Value::List(_), k) => {
                        return call_err(format!(
                            "cannot index slice/array with type {}",
                            k.go_type()
                        ));
                    }
                    (Value::Nil, _) => return call_err("index of untyped nil"),
                    (v, _) => return call_err(format!("can't index item of type {}", v.go_type())),
                };
            }
            item
        }
        "print" => Value::Str(sprint(a)),
        "println" => {
            let parts: Vec<String> = a.iter().map(Value::to_go_string).collect();
            Value::Str(parts.join(" ") + "\n")
        }
        "printf" => {
            at_least(name, a, 1)?;
            Value::Str(sprintf(string(&a[0])?, &a[1..]))
        }
        "default" => {
            at_least(name, a, 1)?;
            match a.get(1) {
                Some(given) if given.truthy() => given.clone(),
                _ => args.swap_remove(0),
            }
        }
        "empty" => {
            arity(name, a, 1)?;
            Value::Bool(!a[0].truthy())
        }
        "quote" | "squote" => {
            let parts: Vec<String> = a
                .iter()
                .filter(|v| **v != Value::Nil)
                .map(|v| {
                    if name == "quote" {
                        go_quote(&strval(v))
                    } else {
                        format!("'{}'", strval(v))
                    }
                })
                .collect();
            Value::Str(parts.join(" "))
        }
        "toYaml" => {
            arity(name, a, 1)?;
            Value::Str(to_yaml(&a[0]).trim_end_matches('\n').to_string())
        }
        "toJson" => {
            arity(name, a, 1)?;
            Value::Str(to_json(&a[0]))
        }
        "toString" => {
            arity(name, a, 1)?;
            Value::Str(strval(&a[0]))
        }
        "indent" | "nindent" => {
            arity(name, a, 2)?;
            let n = int(&a[0])?;
            if n > MAX_WIDTH {
                return call_err(format!("indentation {n} is wider than {MAX_WIDTH}"));
            }
            let pad = " ".repeat(usize::try_from(n).unwrap_or(0));
            let body = format!("{pad}{}", string(&a[1])?.replace('\n', &format!("\n{pad}")));
            Value::Str(if name == "nindent" {
                format!("\n{body}")
            } else {
                body
            })
        }
        "trim" => {
            arity(name, a, 1)?;
            Value::str(string(&a[0])?.trim())
        }
        "trunc" => {
            arity(name, a, 2)?;
            let (c, s) = (int(&a[0])?, string(&a[1])?);
            let len = s.len() as i64;
            let (from, to) = if c < 0 && len + c > 0 {
                ((len + c) as usize, s.len())
            } else if c >= 0 && len > c {
                (0, c as usize)
            } else {
                (0, s.len())
            };
            // Sprig cuts bytes; keep whole characters.
            let mut from = from;
            while !s.is_char_boundary(from) {
                from += 1;
            }
            let mut to = to;
            while !s.is_char_boundary(to) {
                to -= 1;
            }
            Value::str(&s[from..to.max(from)])
        }
        "trimSuffix" => {
            arity(name, a, 2)?;
            let (suffix, s) = (string(&a[0])?, string(&a[1])?);
            Value::str(s.strip_suffix(suffix).unwrap_or(s))
        }
        "list" => Value::List(args),
        "dict" => {
            let mut m = BTreeMap::new();
            let mut it = args.into_iter();
            while let Some(k) = it.next() {
                m.insert(strval(&k), it.next().unwrap_or(Value::str("")));
            }
            Value::Map(m)
        }
        "hasKey" => {
            arity(name, a, 2)?;
            let key = string(&a[1])?;
            match &a[0] {
                Value::Map(m) => Value::Bool(m.contains_key(key)),
                Value::Files(f) => Value::Bool(f.contains_key(key)),
                Value::Nil => Value::Bool(false),
                v => {
                    return call_err(format!(
                        "wrong type for value; expected map[string]interface {{}}; got {}",
                        v.go_type()
                    ));
                }
            }
        }
        "required" => {
            arity(name, a, 2)?;
            let msg = string(&a[0])?;
            match &a[1] {
                Value::Nil => return Err(FuncError::User(msg.to_string())),
                Value::Str(s) if s.is_empty() => return Err(FuncError::User(msg.to_string())),
                _ => args.swap_remove(1),
            }
        }
        "fail" => {
            arity(name, a, 1)?;
            return Err(FuncError::User(string(&a[0])?.to_string()));
        }
        "b64enc" => {
            arity(name, a, 1)?;
            Value::Str(base64(string(&a[0])?.as_bytes()))
        }
        "base" => {
            arity(name, a, 1)?;
            Value::Str(path_base(string(&a[0])?))
        }
        "int" => {
            arity(name, a, 1)?;
            Value::Int(to_int(&a[0]))
        }
        "contains" => {
            arity(name, a, 2)?;
            Value::Bool(string(&a[1])?.contains(string(&a[0])?))
        }
        "replace" => {
            arity(name, a, 3)?;
            let (old, new, s) = (string(&a[0])?, string(&a[1])?, string(&a[2])?);
            Value::Str(s.replace(old, new))
        }
        "lower" => {
            arity(name, a, 1)?;
            Value::Str(string(&a[0])?.to_lowercase())
        }
        other => return call_err(format!("function {other:?} not defined")),
    })
}

/// Go's `eq` for one pair: basic values of the same kind compare; a missing value equals
/// only another; an integer against a float, or two lists or maps, cannot be compared.
fn equal(a: &Value, b: &Value) -> Result<bool> {
    Ok(match (a, b) {
        (Value::Nil, Value::Nil) => true,
        (Value::Nil, _) | (_, Value::Nil) => false,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x == y,
        (Value::Str(x), Value::Str(y)) => x == y,
        (x, y) if std::mem::discriminant(x) == std::mem::discriminant(y) => {
            return call_err(format!("non-comparable type {}", x.go_type()));
        }
        _ => return call_err("incompatible types for comparison"),
    })
}

/// Go's ordering for `lt`, `le`, `gt`, `ge`: integers, floats and strings, each only with
/// its own kind.
fn compare(a: &Value, b: &Value) -> Result<std::cmp::Ordering> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(x.cmp(y)),
        (Value::Float(x), Value::Float(y)) => x
            .partial_cmp(y)
            .ok_or(FuncError::Call("NaN is not ordered".into())),
        (Value::Str(x), Value::Str(y)) => Ok(x.cmp(y)),
        (
            Value::Int(_) | Value::Float(_) | Value::Str(_),
            Value::Int(_) | Value::Float(_) | Value::Str(_),
        ) => call_err("incompatible types for comparison"),
        _ => call_err("invalid type for comparison"),
    }
}

/// `cast.ToInt` as Sprig's `int` uses it: numbers truncated, numeric strings parsed
/// (`0x`, `0` octal), booleans 0/1, anything else 0.
fn to_int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::Float(f) if f.is_finite() => f.trunc() as i64,
        Value::Bool(b) => *b as i64,
        Value::Str(s) => {
            let t = s.trim();
            // cast trims a ".0…" tail first.
            let t = match t.split_once('.') {
                Some((i, frac)) if frac.bytes().all(|b| b == b'0') => i,
                _ => t,
            };
            match crate::lex::parse_number(t) {
                Some(Value::Int(i)) => i,
                _ => 0,
            }
        }
        _ => 0,
    }
}

/// `fmt.Sprint`: a space between operands when neither is a string.
fn sprint(args: &[Value]) -> String {
    let mut out = String::new();
    for (i, v) in args.iter().enumerate() {
        if i > 0 && !matches!(v, Value::Str(_)) && !matches!(args[i - 1], Value::Str(_)) {
            out.push(' ');
        }
        out.push_str(&v.to_go_string());
    }
    out
}

/// `%!verb(type=value)`: Go's note for an operand of the wrong type.
fn bad_verb(verb: char, v: &Value) -> String {
    match v {
        Value::Nil => format!("%!{verb}(<nil>)"),
        v => format!("%!{verb}({}={})", v.go_type(), v.to_go_string()),
    }
}

/// `fmt.Sprintf` for the verbs `%v %s %d %q %t %f %x %%`, with flags `-` and `0`, a
/// width and a precision; wrong types, missing and extra operands are written as Go
/// writes them.
pub(crate) fn sprintf(format: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut next = 0;
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let (mut left, mut zero, mut plus) = (false, false, false);
        while let Some(&f) = chars.peek() {
            match f {
                '-' => left = true,
                '0' => zero = true,
                '+' => plus = true,
                ' ' | '#' => {}
                _ => break,
            }
            chars.next();
        }
        let mut width = String::new();
        while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(d);
            chars.next();
        }
        let mut precision: Option<usize> = None;
        if chars.peek() == Some(&'.') {
            chars.next();
            let mut p = String::new();
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                p.push(d);
                chars.next();
            }
            precision = Some(p.parse().unwrap_or(0));
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.get(next) else {
            out.push_str(&format!("%!{verb}(MISSING)"));
            continue;
        };
        next += 1;
        let mut s = match (verb, arg) {
            ('v', v) => v.to_go_string(),
            ('s', Value::Str(s)) => s.clone(),
            ('s', v @ (Value::List(_) | Value::Map(_))) => v.to_go_string(),
            ('d', Value::Int(i)) => {
                if plus && *i >= 0 {
                    format!("+{i}")
                } else {
                    i.to_string()
                }
            }
            ('x', Value::Int(i)) => format!("{i:x}"),
            ('x', Value::Str(s)) => s.bytes().map(|b| format!("{b:02x}")).collect(),
            ('q', Value::Str(s)) => go_quote(s),
            ('t', Value::Bool(b)) => b.to_string(),
            ('f', Value::Float(f)) => format!("{f:.*}", precision.unwrap_or(6)),
            ('g', Value::Float(f)) => go_float(*f),
            (verb, v) => bad_verb(verb, v),
        };
        if let (Some(p), 's') = (precision, verb) {
            s = s.chars().take(p).collect();
        }
        let w: usize = width.parse().unwrap_or(0).min(MAX_WIDTH as usize);
        let len = s.chars().count();
        if len < w {
            let pad = w - len;
            if left {
                s.push_str(&" ".repeat(pad));
            } else if zero && matches!(verb, 'd' | 'f' | 'x') {
                let (sign, digits) = match s.strip_prefix('-') {
                    Some(d) => ("-", d.to_string()),
                    None => ("", s.clone()),
                };
                s = format!("{sign}{}{digits}", "0".repeat(pad));
            } else {
                s = format!("{}{s}", " ".repeat(pad));
            }
        }
        out.push_str(&s);
    }
    if next < args.len() {
        let extra: Vec<String> = args[next..]
            .iter()
            .map(|v| match v {
                Value::Nil => "<nil>".to_string(),
                v => format!("{}={}", v.go_type(), v.to_go_string()),
            })
            .collect();
        out.push_str(&format!("%!(EXTRA {})", extra.join(", ")));
    }
    out
}

/// `strconv.Quote`: double quotes, Go escapes for quotes, backslashes and unprintable
/// characters.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if c == ' ' || !(c.is_control() || c.is_whitespace()) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Go's `path.Base`.
fn path_base(p: &str) -> String {
    if p.is_empty() {
        return ".".into();
    }
    let trimmed = p.trim_end_matches('/');
    if trimmed.is_empty() {
        return "/".into();
    }
    trimmed.rsplit('/').next().unwrap_or(trimmed).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v(j: serde_json::Value) -> Value {
        Value::from(j)
    }

    fn ok(name: &str, args: Vec<Value>) -> Value {
        call(name, args).unwrap_or_else(|e| panic!("{name}: {e:?}"))
    }

    fn err(name: &str, args: Vec<Value>) -> String {
        match call(name, args) {
            Err(FuncError::Call(m)) | Err(FuncError::User(m)) => m,
            Ok(v) => panic!("{name} gave {v:?}"),
        }
    }

    #[test]
    fn comparisons_follow_go() {
        assert_eq!(
            ok("eq", vec![v(json!(1)), v(json!(2)), v(json!(1))]),
            Value::Bool(true)
        );
        assert_eq!(
            ok("eq", vec![v(json!("a")), v(json!("b"))]),
            Value::Bool(false)
        );
        assert_eq!(
            ok("eq", vec![Value::Nil, v(json!("b"))]),
            Value::Bool(false)
        );
        assert_eq!(
            ok("ne", vec![v(json!(true)), v(json!(false))]),
            Value::Bool(true)
        );
        assert_eq!(
            err("eq", vec![v(json!(1)), v(json!(1.5))]),
            "incompatible types for comparison"
        );
        assert_eq!(
            err("eq", vec![v(json!([1])), v(json!([1]))]),
            "non-comparable type []interface {}"
        );
        assert_eq!(ok("lt", vec![v(json!(1)), v(json!(2))]), Value::Bool(true));
        assert_eq!(ok("le", vec![v(json!(2)), v(json!(2))]), Value::Bool(true));
        assert_eq!(
            ok("gt", vec![v(json!("b")), v(json!("a"))]),
            Value::Bool(true)
        );
        assert_eq!(
            ok("ge", vec![v(json!(1.5)), v(json!(2.5))]),
            Value::Bool(false)
        );
        assert_eq!(
            err("lt", vec![v(json!(true)), v(json!(false))]),
            "invalid type for comparison"
        );
        assert_eq!(
            err("eq", vec![v(json!(1))]),
            "wrong number of args for eq: want at least 2 got 1"
        );
        assert_eq!(ok("not", vec![v(json!(""))]), Value::Bool(true));
    }

    #[test]
    fn sprig_string_functions() {
        assert_eq!(
            ok("default", vec![v(json!("d")), v(json!(""))]),
            v(json!("d"))
        );
        assert_eq!(
            ok("default", vec![v(json!("d")), v(json!("x"))]),
            v(json!("x"))
        );
        assert_eq!(ok("default", vec![v(json!("d"))]), v(json!("d")));
        assert_eq!(ok("default", vec![v(json!(3)), v(json!(0))]), v(json!(3)));
        assert_eq!(
            ok("quote", vec![v(json!("a\"b\n"))]),
            v(json!("\"a\\\"b\\n\""))
        );
        assert_eq!(
            ok("quote", vec![v(json!(8080)), Value::Nil, v(json!(true))]),
            v(json!("\"8080\" \"true\""))
        );
        assert_eq!(ok("squote", vec![v(json!("x"))]), v(json!("'x'")));
        assert_eq!(
            ok("indent", vec![v(json!(2)), v(json!("a\nb"))]),
            v(json!("  a\n  b"))
        );
        assert_eq!(
            ok("nindent", vec![v(json!(2)), v(json!("a"))]),
            v(json!("\n  a"))
        );
        assert_eq!(
            err("indent", vec![v(json!(2)), v(json!(5))]),
            "wrong type for value; expected string; got int"
        );
        assert_eq!(
            err("nindent", vec![v(json!(2)), Value::Nil]),
            "invalid value; expected string"
        );
        assert_eq!(
            err("indent", vec![v(json!("2")), v(json!("x"))]),
            "wrong type for value; expected int; got string"
        );
        assert!(err("indent", vec![v(json!(1i64 << 40)), v(json!("x"))]).contains("wider than"));
        assert_eq!(sprintf("%99999999999d", &[v(json!(1))]).len(), 1 << 20);
        assert_eq!(ok("trim", vec![v(json!("  a b \n"))]), v(json!("a b")));
        assert_eq!(
            ok("trunc", vec![v(json!(3)), v(json!("abcdef"))]),
            v(json!("abc"))
        );
        assert_eq!(
            ok("trunc", vec![v(json!(-2)), v(json!("abcdef"))]),
            v(json!("ef"))
        );
        assert_eq!(
            ok("trunc", vec![v(json!(63)), v(json!("short"))]),
            v(json!("short"))
        );
        assert_eq!(
            ok("trimSuffix", vec![v(json!("-")), v(json!("a-b-"))]),
            v(json!("a-b"))
        );
        assert_eq!(ok("b64enc", vec![v(json!("hello"))]), v(json!("aGVsbG8=")));
        assert_eq!(ok("b64enc", vec![v(json!("hi"))]), v(json!("aGk=")));
        assert_eq!(ok("b64enc", vec![v(json!("abc"))]), v(json!("YWJj")));
        assert_eq!(
            ok("base", vec![v(json!("files/dashboards/fleet.json"))]),
            v(json!("fleet.json"))
        );
        assert_eq!(ok("base", vec![v(json!("a/b/"))]), v(json!("b")));
        assert_eq!(ok("base", vec![v(json!(""))]), v(json!(".")));
        assert_eq!(
            ok("contains", vec![v(json!("las")), v(json!("ballast"))]),
            Value::Bool(true)
        );
        assert_eq!(
            ok("contains", vec![v(json!("x")), v(json!("ballast"))]),
            Value::Bool(false)
        );
        assert_eq!(
            ok(
                "replace",
                vec![v(json!("_")), v(json!("-")), v(json!("a_b_c"))]
            ),
            v(json!("a-b-c"))
        );
        assert_eq!(ok("lower", vec![v(json!("Fleet_A"))]), v(json!("fleet_a")));
        assert_eq!(ok("toString", vec![v(json!(1.5))]), v(json!("1.5")));
        assert_eq!(ok("toString", vec![v(json!([1, "a"]))]), v(json!("[1 a]")));
    }

    #[test]
    fn collections_and_conversions() {
        assert_eq!(
            ok("list", vec![v(json!(1)), v(json!("a"))]),
            v(json!([1, "a"]))
        );
        assert_eq!(
            ok(
                "dict",
                vec![
                    v(json!("b")),
                    v(json!(1)),
                    v(json!("a")),
                    v(json!(2)),
                    v(json!("odd"))
                ]
            ),
            v(json!({"a": 2, "b": 1, "odd": ""}))
        );
        assert_eq!(
            ok("hasKey", vec![v(json!({"a": null})), v(json!("a"))]),
            Value::Bool(true)
        );
        assert_eq!(
            ok("hasKey", vec![v(json!({})), v(json!("a"))]),
            Value::Bool(false)
        );
        assert_eq!(
            ok("hasKey", vec![Value::Nil, v(json!("a"))]),
            Value::Bool(false)
        );
        assert!(err("hasKey", vec![v(json!("s")), v(json!("a"))]).contains("expected map"));
        assert_eq!(ok("empty", vec![v(json!({}))]), Value::Bool(true));
        assert_eq!(ok("empty", vec![v(json!([0]))]), Value::Bool(false));
        assert_eq!(ok("int", vec![v(json!("12"))]), Value::Int(12));
        assert_eq!(ok("int", vec![v(json!(2.9))]), Value::Int(2));
        assert_eq!(ok("int", vec![v(json!("2.0"))]), Value::Int(2));
        assert_eq!(ok("int", vec![v(json!("x"))]), Value::Int(0));
        assert_eq!(ok("len", vec![v(json!({"a": 1}))]), Value::Int(1));
        assert_eq!(ok("len", vec![v(json!("héllo"))]), Value::Int(6));
        assert_eq!(err("len", vec![v(json!(3))]), "len of type int");
        assert_eq!(
            ok(
                "index",
                vec![v(json!({"a": [5, 6]})), v(json!("a")), v(json!(1))]
            ),
            Value::Int(6)
        );
        assert_eq!(
            ok("index", vec![v(json!({"a": 1})), v(json!("b"))]),
            Value::Nil
        );
        assert_eq!(
            err("index", vec![v(json!([1])), v(json!(3))]),
            "index out of range: 3"
        );
    }

    #[test]
    fn required_and_fail_carry_the_template_message() {
        assert_eq!(
            call("required", vec![v(json!("need x")), Value::Nil]),
            Err(FuncError::User("need x".into()))
        );
        assert_eq!(
            call("required", vec![v(json!("need x")), v(json!(""))]),
            Err(FuncError::User("need x".into()))
        );
        assert_eq!(
            ok("required", vec![v(json!("need x")), v(json!(0))]),
            Value::Int(0)
        );
        assert_eq!(
            call("fail", vec![v(json!("no"))]),
            Err(FuncError::User("no".into()))
        );
    }

    #[test]
    fn printf_writes_what_go_writes() {
        let p = |f: &str, a: Vec<Value>| sprintf(f, &a);
        assert_eq!(
            p(
                "%s-%d %v%%",
                vec![v(json!("a")), v(json!(3)), v(json!([1, 2]))]
            ),
            "a-3 [1 2]%"
        );
        assert_eq!(p("%d", vec![v(json!("x"))]), "%!d(string=x)");
        assert_eq!(p("%s", vec![v(json!(5))]), "%!s(int=5)");
        assert_eq!(p("%s %s", vec![v(json!("a"))]), "a %!s(MISSING)");
        assert_eq!(
            p("%s", vec![v(json!("a")), v(json!(1))]),
            "a%!(EXTRA int=1)"
        );
        assert_eq!(
            p(
                "%q|%5s|%-3d|%03d|%.2f",
                vec![
                    v(json!("q")),
                    v(json!("ab")),
                    v(json!(7)),
                    v(json!(7)),
                    v(json!(1.005))
                ]
            ),
            "\"q\"|   ab|7  |007|1.00"
        );
        assert_eq!(p("%v", vec![Value::Nil]), "<nil>");
        assert_eq!(
            ok(
                "print",
                vec![v(json!(1)), v(json!(2)), v(json!("a")), v(json!(3))]
            ),
            v(json!("1 2a3"))
        );
        assert_eq!(
            ok("println", vec![v(json!(1)), v(json!("a"))]),
            v(json!("1 a\n"))
        );
    }
}
