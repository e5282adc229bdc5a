//! `values.schema.json`: the JSON-Schema subset the chart uses, checked as Helm checks it
//! (after merging the user's values over `values.yaml`, before rendering).
//!
//! Keywords: `type` (one or a list; `integer` is a number without a fraction),
//! `properties`, `required`, `additionalProperties` (false or a schema), `enum`,
//! `minimum`, `maximum`, `minLength`, `maxLength`, `pattern` (unanchored, as JSON Schema
//! says) and `items`; plus the annotations `$schema`, `$id`, `$comment`, `title`,
//! `description`, `default` and `examples`. A schema using any other keyword is refused
//! when the chart loads, so nothing in it is silently left unchecked.

use serde_json::Value as Json;

use crate::Value;

const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "items",
];
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
];
const TYPES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "integer", "string",
];

/// A checked schema.
#[derive(Debug, Clone)]
pub struct Schema {
    root: Json,
}

impl Schema {
    /// Checks that `root` uses only the supported subset, correctly.
    pub fn new(root: Json) -> Result<Schema, String> {
        check(&root, "(root)")?;
        Ok(Schema { root })
    }

    /// Every way `value` breaks the schema, one message each, in document order; empty
    /// when it conforms.
    pub fn validate(&self, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        validate(&self.root, &value.to_data(), &mut Vec::new(), &mut errors);
        errors
    }
}

fn check(schema: &Json, at: &str) -> Result<(), String> {
    let Json::Object(o) = schema else {
        if schema.is_boolean() {
            return Ok(());
        }
        return Err(format!("{at}: a schema must be an object or a boolean"));
    };
    for (k, v) in o {
        let bad = |what: &str| Err(format!("{at}: {k:?} must be {what}"));
        match k.as_str() {
            k if ANNOTATIONS.contains(&k) => {}
            "type" => {
                let names: Vec<&Json> = match v {
                    Json::Array(a) => a.iter().collect(),
                    v => vec![v],
                };
                for n in names {
                    if !n.as_str().is_some_and(|n| TYPES.contains(&n)) {
                        return Err(format!("{at}: unknown type {n}"));
                    }
                }
            }
            "properties" => {
                let Json::Object(props) = v else {
                    return bad("an object");
                };
                for (name, sub) in props {
                    check(sub, &format!("{at}.properties.{name}"))?;
                }
            }
            "required" => {
                if !v.as_array().is_some_and(|a| a.iter().all(Json::is_string)) {
                    return bad("a list of strings");
                }
            }
            "additionalProperties" => check(v, &format!("{at}.additionalProperties"))?,
            "items" => check(v, &format!("{at}.items"))?,
            "enum" => {
                if v.as_array().is_none_or(|a| a.is_empty()) {
                    return bad("a non-empty list");
                }
            }
            "minimum" | "maximum" => {
                if !v.is_number() {
                    return bad("a number");
                }
            }
            "minLength" | "maxLength" => {
                if !v.is_u64() {
                    return bad("a non-negative integer");
                }
            }
            "pattern" => {
                let Some(p) = v.as_str() else {
                    return bad("a string");
                };
                regex::Regex::new(p).map_err(|e| format!("{at}: invalid pattern {p:?}: {e}"))?;
            }
            other => {
                return Err(format!(
                    "{at}: unsupported keyword {other:?} (this renderer checks {})",
                    KEYWORDS.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// One step of a path into the values.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn path(steps: &[Step<'_>]) -> String {
    if steps.is_empty() {
        return "(root)".into();
    }
    let mut out = String::new();
    for s in steps {
        match s {
            Step::Key(k)
                if !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
            {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Key(k) => out.push_str(&format!("[{k:?}]")),
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Nil => "null",
        Value::Bool(_) => "a boolean",
        Value::Int(_) => "an integer",
        Value::Float(_) => "a number",
        Value::Str(_) => "a string",
        Value::List(_) => "a list",
        _ => "an object",
    }
}

fn has_type(v: &Value, t: &str) -> bool {
    match (t, v) {
        ("null", Value::Nil) => true,
        ("boolean", Value::Bool(_)) => true,
        ("integer", Value::Int(_)) => true,
        ("integer", Value::Float(f)) => f.fract() == 0.0,
        ("number", Value::Int(_) | Value::Float(_)) => true,
        ("string", Value::Str(_)) => true,
        ("array", Value::List(_)) => true,
        ("object", Value::Map(_)) => true,
        _ => false,
    }
}

/// A value as written in a message: JSON, shortened.
fn show(v: &Value) -> String {
    let s = v.to_json().to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(57).collect::<String>())
    } else {
        s
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

fn same(v: &Value, j: &Json) -> bool {
    match (v, j) {
        (Value::Int(_) | Value::Float(_), Json::Number(n)) => number(v) == n.as_f64(),
        (v, j) => v.to_json() == *j,
    }
}

fn validate<'v>(schema: &Json, v: &'v Value, at: &mut Vec<Step<'v>>, errors: &mut Vec<String>) {
    let o = match schema {
        Json::Bool(true) => return,
        Json::Bool(false) => {
            errors.push(format!("{}: no value is allowed here", path(at)));
            return;
        }
        Json::Object(o) => o,
        _ => return,
    };
    if let Some(t) = o.get("type") {
        let types: Vec<&str> = match t {
            Json::Array(a) => a.iter().filter_map(Json::as_str).collect(),
            t => t.as_str().into_iter().collect(),
        };
        if !types.iter().any(|t| has_type(v, t)) {
            errors.push(format!(
                "{}: {} is {}, expected {}",
                path(at),
                show(v),
                type_name(v),
                types.join(" or ")
            ));
            return;
        }
    }
    if let Some(Json::Array(allowed)) = o.get("enum")
        && !allowed.iter().any(|a| same(v, a))
    {
        let list: Vec<String> = allowed.iter().map(Json::to_string).collect();
        errors.push(format!(
            "{}: {} is not one of {}",
            path(at),
            show(v),
            list.join(", ")
        ));
    }
    if let Some(n) = number(v) {
        if let Some(min) = o.get("minimum").and_then(Json::as_f64)
            && n < min
        {
            errors.push(format!(
                "{}: {} is less than the minimum {}",
                path(at),
                show(v),
                o["minimum"]
            ));
        }
        if let Some(max) = o.get("maximum").and_then(Json::as_f64)
            && n > max
        {
            errors.push(format!(
                "{}: {} is greater than the maximum {}",
                path(at),
                show(v),
                o["maximum"]
            ));
        }
    }
    if let Value::Str(s) = v {
        let len = s.chars().count() as u64;
        if let Some(min) = o.get("minLength").and_then(Json::as_u64)
            && len < min
        {
            errors.push(format!(
                "{}: {} is shorter than the minimum length {min}",
                path(at),
                show(v)
            ));
        }
        if let Some(max) = o.get("maxLength").and_then(Json::as_u64)
            && len > max
        {
            errors.push(format!(
                "{}: {} is longer than the maximum length {max}",
                path(at),
                show(v)
            ));
        }
        if let Some(p) = o.get("pattern").and_then(Json::as_str)
            && regex::Regex::new(p).is_ok_and(|re| !re.is_match(s))
        {
            errors.push(format!(
                "{}: {} does not match the pattern {p:?}",
                path(at),
                show(v)
            ));
        }
    }
    if let Value::Map(m) = v {
        if let Some(Json::Array(required)) = o.get("required") {
            for r in required.iter().filter_map(Json::as_str) {
                if !m.contains_key(r) {
                    errors.push(format!("{}: missing required key {r:?}", path(at)));
                }
            }
        }
        let props = o.get("properties").and_then(Json::as_object);
        for (k, child) in m {
            at.push(Step::Key(k));
            match (props.and_then(|p| p.get(k)), o.get("additionalProperties")) {
                (Some(sub), _) => validate(sub, child, at, errors),
                (None, Some(Json::Bool(false))) => {
                    let mut known: Vec<&str> = props
                        .map(|p| p.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    known.sort_unstable();
                    errors.push(format!(
                        "{}: unknown key (allowed here: {})",
                        path(at),
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ));
                }
                (None, Some(sub)) => validate(sub, child, at, errors),
                (None, None) => {}
            }
            at.pop();
        }
    }
    if let (Value::List(items), Some(sub)) = (v, o.get("items")) {
        for (i, item) in items.iter().enumerate() {
            at.push(Step::Index(i));
            validate(sub, item, at, errors);
            at.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::new(json!({
            "$schema": "https://json-schema.org/draft-07/schema#",
            "type": "object",
            "additionalProperties": false,
            "required": ["operator"],
            "properties": {
                "operator": {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
                        "pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
                        "name": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[a-z]+$"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "ports": {"type": "array", "items": {"type": "integer"}},
                        "host": {"type": ["string", "null"]}
                    }
                }
            }
        }))
        .unwrap()
    }

    fn errors(v: serde_json::Value) -> Vec<String> {
        schema().validate(&Value::from(v))
    }

    #[test]
    fn conforming_values_pass() {
        assert!(
            errors(
                json!({"operator": {"replicas": 2, "pullPolicy": "Always", "name": "abc",
            "labels": {"a.b/c": "d"}, "ports": [1, 2.0], "host": null}})
            )
            .is_empty()
        );
    }

    #[test]
    fn each_violation_names_its_path() {
        assert_eq!(
            errors(json!({"operator": {"replicas": -1}})),
            ["operator.replicas: -1 is less than the minimum 1"]
        );
        assert_eq!(
            errors(json!({"operator": {"replicas": 11}})),
            ["operator.replicas: 11 is greater than the maximum 10"]
        );
        assert_eq!(
            errors(json!({"operator": {"replicas": "two"}})),
            ["operator.replicas: \"two\" is a string, expected integer"]
        );
        assert_eq!(
            errors(json!({"operator": {"replicas": 1.5}})),
            ["operator.replicas: 1.5 is a number, expected integer"]
        );
        assert_eq!(
            errors(json!({"operator": {"replica": 1}})),
            [
                "operator.replica: unknown key (allowed here: host, labels, name, ports, pullPolicy, replicas)"
            ]
        );
        assert_eq!(
            errors(json!({"operator": {"pullPolicy": "Sometimes"}})),
            [
                "operator.pullPolicy: \"Sometimes\" is not one of \"Always\", \"IfNotPresent\", \"Never\""
            ]
        );
        assert_eq!(
            errors(json!({"operator": {"name": ""}})),
            [
                "operator.name: \"\" is shorter than the minimum length 1",
                "operator.name: \"\" does not match the pattern \"^[a-z]+$\"",
            ]
        );
        assert_eq!(
            errors(json!({"operator": {"name": "abcdef"}})),
            ["operator.name: \"abcdef\" is longer than the maximum length 5"]
        );
        assert_eq!(
            errors(json!({"operator": {"labels": {"a.b/c": 1}}})),
            ["operator.labels[\"a.b/c\"]: 1 is an integer, expected string"]
        );
        assert_eq!(
            errors(json!({"operator": {"ports": [1, "x"]}})),
            ["operator.ports[1]: \"x\" is a string, expected integer"]
        );
        assert_eq!(
            errors(json!({})),
            ["(root): missing required key \"operator\""]
        );
        assert_eq!(
            errors(json!({"operator": {"host": 1}})),
            ["operator.host: 1 is an integer, expected string or null"]
        );
    }

    #[test]
    fn unsupported_schemas_are_refused() {
        assert!(
            Schema::new(json!({"oneOf": []}))
                .unwrap_err()
                .contains("unsupported keyword \"oneOf\"")
        );
        assert!(
            Schema::new(json!({"properties": {"a": {"type": "int"}}}))
                .unwrap_err()
                .contains("unknown type")
        );
        assert!(
            Schema::new(json!({"pattern": "("}))
                .unwrap_err()
                .contains("invalid pattern")
        );
        assert!(Schema::new(json!({"minimum": "1"})).is_err());
    }
}
