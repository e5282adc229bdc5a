//! Malformed, huge, NaN, duplicate and truncated input: never a panic, never a sample, and
//! each rejection is counted.

use ballast_operator::scrape::dialect::{adapt, is_usable};
use ballast_operator::scrape::parser::{Limits, parse, parse_with};
use ballast_operator::signals::Dialect;

struct Case {
    what: &'static str,
    input: String,
    rejected: usize,
    ambiguous: usize,
}

fn case(what: &'static str, input: impl Into<String>, rejected: usize, ambiguous: usize) -> Case {
    Case {
        what,
        input: input.into(),
        rejected,
        ambiguous,
    }
}

fn cases() -> Vec<Case> {
    let many_labels: String = (0..100).map(|i| format!("l{i}=\"v\",")).collect();
    vec![
        case("empty body", "", 0, 0),
        case(
            "html error page",
            "<html><body>502 Bad Gateway</body></html>\n",
            1,
            0,
        ),
        case("json", "{\"error\": \"nope\"}\n", 1, 0),
        case(
            "binary",
            String::from_utf8_lossy(&[0, 159, 146, 150, 255, 10]),
            1,
            0,
        ),
        case("name only", "ballast_num_requests_running\n", 1, 0),
        case(
            "unclosed labels",
            "ballast_num_requests_running{engine=\"0\" 1\n",
            1,
            0,
        ),
        case(
            "unclosed quote",
            "ballast_num_requests_running{engine=\"0} 1\n",
            1,
            0,
        ),
        case(
            "bad escape",
            "ballast_num_requests_running{engine=\"\\t\"} 1\n",
            1,
            0,
        ),
        case(
            "value not a number",
            "ballast_num_requests_running{engine=\"0\"} many\n",
            1,
            0,
        ),
        case(
            "trailing junk",
            "ballast_num_requests_running{engine=\"0\"} 1 2 3\n",
            1,
            0,
        ),
        case(
            "NaN",
            "ballast_num_requests_running{engine=\"0\"} NaN\n",
            1,
            0,
        ),
        case(
            "+Inf",
            "ballast_kv_cache_usage_ratio{engine=\"0\"} +Inf\n",
            1,
            0,
        ),
        case(
            "-Inf",
            "ballast_kv_cache_usage_ratio{engine=\"0\"} -Inf\n",
            1,
            0,
        ),
        case(
            "overflow",
            "ballast_kv_cache_usage_ratio{engine=\"0\"} 1e400\n",
            1,
            0,
        ),
        case(
            "NaN-laden exposition",
            "ballast_num_requests_running{engine=\"0\"} NaN\n\
             ballast_kv_cache_usage_ratio{engine=\"0\"} NaN\n\
             ballast_num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} NaN\n\
             ballast_time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\"} NaN\n",
            4,
            0,
        ),
        case(
            "duplicate series",
            "ballast_num_requests_running{engine=\"0\"} 1\n\
             ballast_num_requests_running{engine=\"0\"} 9\n",
            0,
            1,
        ),
        case(
            "duplicate with labels reordered",
            "ballast_kv_cache_usage_ratio{engine=\"0\",model_name=\"m\"} 0.1\n\
             ballast_kv_cache_usage_ratio{model_name=\"m\",engine=\"0\"} 0.9\n",
            0,
            1,
        ),
        case(
            "duplicate label name",
            "ballast_num_requests_running{engine=\"0\",engine=\"1\"} 1\n",
            1,
            0,
        ),
        case(
            "truncated final line",
            "ballast_num_requests_running{engine=\"0\"} 1",
            1,
            0,
        ),
        case(
            "truncated mid-label",
            "ballast_num_requests_running{engi",
            1,
            0,
        ),
        case(
            "huge line",
            format!(
                "ballast_num_requests_running{{engine=\"{}\"}} 1\n",
                "0".repeat(1 << 20)
            ),
            1,
            0,
        ),
        case(
            "too many labels",
            format!("ballast_num_requests_running{{{many_labels}}} 1\n"),
            1,
            0,
        ),
        case("huge body of junk lines", "x{\n".repeat(50_000), 50_000, 0),
    ]
}

#[test]
fn malformed_input_yields_no_sample() {
    for c in cases() {
        let e = parse(&c.input);
        assert!(e.samples.is_empty(), "{}: yielded {:?}", c.what, e.samples);
        assert_eq!(e.rejected_lines, c.rejected, "{}: rejected lines", c.what);
        assert_eq!(e.ambiguous_series, c.ambiguous, "{}: ambiguous", c.what);
        for d in [
            Dialect::Ballast,
            Dialect::Vllm,
            Dialect::Sglang,
            Dialect::Llamacpp,
        ] {
            assert!(!is_usable(&adapt(d, &e)), "{}: usable as {d:?}", c.what);
        }
    }
}

#[test]
fn sample_limit_keeps_memory_bounded() {
    let body: String = (0..10_000)
        .map(|i| format!("ballast_num_requests_running{{engine=\"{i}\"}} 1\n"))
        .collect();
    let limits = Limits {
        max_samples: 100,
        ..Limits::default()
    };
    let e = parse_with(&body, &limits);
    assert_eq!(e.samples.len(), 100);
    assert_eq!(e.rejected_lines, 9_900);
}

#[test]
fn good_lines_survive_among_bad_ones() {
    let e = parse(
        "garbage\n\
         ballast_num_requests_running{engine=\"0\"} 2\n\
         ballast_num_requests_running{engine=\"1\"} NaN\n\
         ballast_kv_cache_usage_ratio{engine=\"0\"} 0.5\n\
         ballast_kv_cache_usage_ratio{engine=\"0\"} 0.6\n\
         ballast_num_requests_running{engine=\"2\"} 3",
    );
    assert_eq!(e.rejected_lines, 3);
    assert_eq!(e.ambiguous_series, 1);
    let s = adapt(Dialect::Ballast, &e);
    assert_eq!(s.running, Some(2.0));
    assert_eq!(s.kv_usage, None);
}
