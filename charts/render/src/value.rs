//! The values templates work on: what Go's `interface{}` holds after Helm parsed YAML,
//! plus the two Helm objects that have methods (`.Files` and
//! `.Capabilities.APIVersions`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

/// A template value.
///
/// Integers stay integers (Helm turns numbers from `values.yaml` into `float64`; the
/// chart's templates convert with `int` wherever that matters, so both render alike).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Value {
    /// Go's `nil`, and a missing map key.
    #[default]
    Nil,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(String),
    /// A list (`[]interface{}`).
    List(Vec<Value>),
    /// A map with string keys (`map[string]interface{}`), iterated in key order as Go's
    /// templates do.
    Map(BTreeMap<String, Value>),
    /// `.Files`: the chart's non-template files by path; methods `Get` and `Glob`.
    Files(Arc<BTreeMap<String, String>>),
    /// `.Capabilities.APIVersions`: method `Has`.
    ApiVersions(Arc<Vec<String>>),
}

impl Value {
    /// A string value.
    pub fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }

    /// Go's notion of truth in `if`, `with`, `and`, `or` and `not`: false, 0, nil and
    /// empty strings, lists and maps are false; everything else is true.
    pub fn truthy(&self) -> bool {
        match self {
            Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
            Value::Files(_) | Value::ApiVersions(_) => true,
        }
    }

    /// The Go type name used in error messages (`string`, `int`, `map[string]interface {}`…).
    pub fn go_type(&self) -> &'static str {
        match self {
            Value::Nil => "<nil>",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Str(_) => "string",
            Value::List(_) => "[]interface {}",
            Value::Map(_) => "map[string]interface {}",
            Value::Files(_) => "chart.Files",
            Value::ApiVersions(_) => "chartutil.VersionSet",
        }
    }

    /// The value as `fmt.Sprint` prints it (`%v`); `nil` prints as Go's `<nil>`.
    pub fn to_go_string(&self) -> String {
        let mut out = String::new();
        self.write_go(&mut out);
        out
    }

    fn write_go(&self, out: &mut String) {
        match self {
            Value::Nil => out.push_str("<nil>"),
            Value::Bool(b) => {
                let _ = write!(out, "{b}");
            }
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::Float(f) => out.push_str(&go_float(*f)),
            Value::Str(s) => out.push_str(s),
            Value::List(l) => {
                out.push('[');
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    v.write_go(out);
                }
                out.push(']');
            }
            Value::Map(m) => write_go_map(out, m.iter()),
            Value::Files(f) => write_go_map(out, f.iter().map(|(k, v)| (k, Value::str(v)))),
            Value::ApiVersions(v) => Value::List(v.iter().map(Value::str).collect()).write_go(out),
        }
    }

    /// What an action prints: like [`Value::to_go_string`], except that `nil` prints
    /// nothing (Go prints `<no value>` and Helm removes it).
    pub fn to_output(&self) -> String {
        match self {
            Value::Nil => String::new(),
            v => v.to_go_string(),
        }
    }

    /// The value as a plain data tree: `.Files` becomes a map of path to content and
    /// `.Capabilities.APIVersions` a list.
    pub fn to_data(&self) -> Value {
        match self {
            Value::Files(f) => {
                Value::Map(f.iter().map(|(k, v)| (k.clone(), Value::str(v))).collect())
            }
            Value::ApiVersions(v) => Value::List(v.iter().map(Value::str).collect()),
            Value::List(l) => Value::List(l.iter().map(Value::to_data).collect()),
            Value::Map(m) => Value::Map(m.iter().map(|(k, v)| (k.clone(), v.to_data())).collect()),
            v => v.clone(),
        }
    }

    /// Parses one YAML document into a value.
    pub fn from_yaml(text: &str) -> Result<Value, String> {
        if text.trim().is_empty() {
            return Ok(Value::Nil);
        }
        let json: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        Ok(Value::from(json))
    }

    /// The value as JSON (`.Files` and `.Capabilities.APIVersions` as plain data).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Nil => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::List(l) => serde_json::Value::Array(l.iter().map(Value::to_json).collect()),
            Value::Map(m) => {
                serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
            }
            v @ (Value::Files(_) | Value::ApiVersions(_)) => v.to_data().to_json(),
        }
    }
}

fn write_go_map<'a>(
    out: &mut String,
    entries: impl Iterator<Item = (&'a String, impl std::borrow::Borrow<Value>)>,
) {
    out.push_str("map[");
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(k);
        out.push(':');
        v.borrow().write_go(out);
    }
    out.push(']');
}

impl From<serde_json::Value> for Value {
    fn from(v: serde_json::Value) -> Self {
        match v {
            serde_json::Value::Null => Value::Nil,
            serde_json::Value::Bool(b) => Value::Bool(b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::Str(s),
            serde_json::Value::Array(a) => Value::List(a.into_iter().map(Value::from).collect()),
            serde_json::Value::Object(o) => {
                Value::Map(o.into_iter().map(|(k, v)| (k, Value::from(v))).collect())
            }
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

/// A float as Go's `%v` prints it (`strconv.FormatFloat(f, 'g', -1, 64)`): the shortest
/// representation that reads back the same, in exponent form when the decimal exponent
/// is below -4 or at least 6.
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip mantissa: "1.2345e6", "-5e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        format!("{f}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_go() {
        assert_eq!(go_float(2.0), "2");
        assert_eq!(go_float(2.5), "2.5");
        assert_eq!(go_float(100000.0), "100000");
        assert_eq!(go_float(1000000.0), "1e+06");
        assert_eq!(go_float(1234567.0), "1.234567e+06");
        assert_eq!(go_float(123456.5), "123456.5");
        assert_eq!(go_float(0.0001), "0.0001");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(-3.25), "-3.25");
    }

    #[test]
    fn truth_and_printing_follow_go() {
        for v in [
            Value::Nil,
            Value::Bool(false),
            Value::Int(0),
            Value::Float(0.0),
            Value::str(""),
            Value::List(vec![]),
            Value::Map(BTreeMap::new()),
        ] {
            assert!(!v.truthy(), "{v:?}");
        }
        assert!(Value::str("0").truthy());
        let m = Value::from(serde_json::json!({"b": [1, "x"], "a": true}));
        assert_eq!(m.to_go_string(), "map[a:true b:[1 x]]");
        assert_eq!(Value::Nil.to_output(), "");
        assert_eq!(Value::Nil.to_go_string(), "<nil>");
    }
}
