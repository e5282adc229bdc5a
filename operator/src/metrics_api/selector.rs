//! Kubernetes label selectors as the metrics APIs receive them in `labelSelector=` and
//! `metricLabelSelector=`: equality-based (`a=b`, `a==b`, `a!=b`) and set-based
//! (`a in (x,y)`, `a notin (x)`, `a`, `!a`) requirements joined by commas, all of which
//! must hold. The empty selector matches everything.

use std::collections::BTreeMap;

/// One requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses `text`; the error says what is wrong, for a 400.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut out = Vec::new();
        for part in split_top(text)? {
            let part = part.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(format!("empty requirement in selector {text:?}"));
            }
            out.push(requirement(part)?);
        }
        Ok(Selector(out))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }

    /// The value an equality requirement on `key` asks for (`key=value` or
    /// `key in (value)`), if there is exactly one.
    pub fn equals(&self, key: &str) -> Option<&str> {
        self.0.iter().find_map(|r| match r {
            Requirement::In(k, vs) if k == key && vs.len() == 1 => Some(vs[0].as_str()),
            _ => None,
        })
    }
}

/// Splits at commas outside parentheses.
fn split_top(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unbalanced ')' in selector {text:?}"));
                }
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in selector {text:?}"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim())?));
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = part.split_once(op) {
            let (k, v) = (key_of(k.trim())?, value_of(v.trim())?);
            return Ok(if negate {
                Requirement::NotIn(k, vec![v])
            } else {
                Requirement::In(k, vec![v])
            });
        }
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = key_of(words.next().unwrap_or_default())?;
    let Some(rest) = words.next().map(str::trim) else {
        return Ok(Requirement::Exists(key));
    };
    let (negate, set) = if let Some(s) = rest.strip_prefix("notin") {
        (true, s)
    } else if let Some(s) = rest.strip_prefix("in") {
        (false, s)
    } else {
        return Err(format!("unknown operator in requirement {part:?}"));
    };
    let set = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesized set in {part:?}"))?;
    let values = set
        .split(',')
        .map(|v| value_of(v.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if negate {
        Requirement::NotIn(key, values)
    } else {
        Requirement::In(key, values)
    })
}

fn key_of(k: &str) -> Result<String, String> {
    let (prefix, name) = k.rsplit_once('/').unwrap_or(("", k));
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.len() <= 253
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'));
    if name_ok && prefix_ok && (k.matches('/').count() == 0 || !prefix.is_empty()) {
        Ok(k.to_string())
    } else {
        Err(format!("invalid label key {k:?}"))
    }
}

fn value_of(v: &str) -> Result<String, String> {
    if v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        Ok(v.to_string())
    } else {
        Err(format!("invalid label value {v:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_and_set_requirements() {
        let l = labels(&[("app.kubernetes.io/instance", "chat"), ("tier", "gpu")]);
        for (s, want) in [
            ("", true),
            ("app.kubernetes.io/instance=chat", true),
            ("app.kubernetes.io/instance==chat,tier=gpu", true),
            ("app.kubernetes.io/instance=other", false),
            ("tier!=cpu", true),
            ("tier in (cpu, gpu)", true),
            ("tier notin (gpu)", false),
            ("tier", true),
            ("!tier", false),
            ("missing!=x", true),
            ("missing", false),
        ] {
            assert_eq!(Selector::parse(s).unwrap().matches(&l), want, "{s}");
        }
        let s = Selector::parse("ballast.dev/inferenceservice=chat").unwrap();
        assert_eq!(s.equals("ballast.dev/inferenceservice"), Some("chat"));
    }

    #[test]
    fn bad_selectors_are_errors() {
        for s in [
            "a=b,",
            "a in (b",
            "a)",
            "a ~ b",
            "a in b",
            "bad key=x",
            "a=b c",
            "/a=b",
        ] {
            assert!(Selector::parse(s).is_err(), "{s:?} parsed");
        }
    }
}
