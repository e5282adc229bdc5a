//! The words of a decision: numbers and per-signal phrases for its one-line message.

use super::input::SignalName;
use super::observe::{Observation, Observed};

/// A number as people write it: `14`, `0.91`, `3.5`, `0.05` (at most three decimals).
pub(crate) fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_string();
    }
    if (v - v.round()).abs() < 1e-9 {
        return format!("{}", v.round() as i64);
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `>`, `<` or `=` for an observed value against its target.
fn cmp(observed: f64, target: f64) -> &'static str {
    if observed > target {
        ">"
    } else if observed < target {
        "<"
    } else {
        "="
    }
}

/// One signal's phrase, e.g. "capacity waiting 14 over 2 replicas > target 4 per replica".
pub(crate) fn summary(o: &Observation, reporting: usize) -> String {
    let t = num(o.target);
    let (v, fleet) = match o.observed {
        Observed::Value { compared, fleet } => (compared, fleet),
        Observed::Idle => {
            return format!("TTFT p99 n/a (no requests this period) < target {t}s");
        }
        Observed::Missing => return format!("{} missing", o.signal),
        Observed::NotExported => {
            return format!(
                "{} not exported by these replicas (target ignored)",
                o.signal
            );
        }
    };
    let c = cmp(v, o.target);
    match o.signal {
        SignalName::CapacityWaiting => {
            let plural = if reporting == 1 {
                "replica"
            } else {
                "replicas"
            };
            format!(
                "capacity waiting {} over {reporting} {plural} {c} target {t} per replica",
                num(fleet)
            )
        }
        SignalName::KvCacheUsage => format!("KV cache usage {} {c} target {t}", num(v)),
        SignalName::AdmissionRejectionsPerSecond => {
            format!(
                "admission rejections {}/s per replica {c} target {t}/s",
                num(v)
            )
        }
        SignalName::TtftP99Seconds => format!("TTFT p99 {}s {c} target {t}s", num(v)),
    }
}

/// Names joined for a message: "a", "a and b", "a, b and c".
pub(crate) fn list<S: AsRef<str>>(items: &[S]) -> String {
    match items {
        [] => String::new(),
        [one] => one.as_ref().to_string(),
        [init @ .., last] => {
            let head: Vec<&str> = init.iter().map(AsRef::as_ref).collect();
            format!("{} and {}", head.join(", "), last.as_ref())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(num(14.0), "14");
        assert_eq!(num(0.91), "0.91");
        assert_eq!(num(3.5), "3.5");
        assert_eq!(num(0.05), "0.05");
        assert_eq!(num(0.12345), "0.123");
        assert_eq!(num(f64::NAN), "n/a");
    }

    #[test]
    fn contract_example_phrase() {
        let o = Observation {
            signal: SignalName::CapacityWaiting,
            target: 4.0,
            observed: Observed::Value {
                compared: 7.0,
                fleet: 14.0,
            },
        };
        assert_eq!(
            summary(&o, 2),
            "capacity waiting 14 over 2 replicas > target 4 per replica"
        );
    }

    #[test]
    fn lists() {
        assert_eq!(list::<&str>(&[]), "");
        assert_eq!(list(&["a"]), "a");
        assert_eq!(list(&["a", "b", "c"]), "a, b and c");
    }
}
