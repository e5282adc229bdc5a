//! Edge cases of the text format, and a property test that arbitrary input never panics and
//! never yields a sample that was not in it.

use super::*;
use proptest::prelude::*;

fn one(text: &str) -> Sample<'_> {
    let e = parse(text);
    assert_eq!(e.rejected_lines, 0, "{text:?} rejected");
    assert_eq!(e.samples.len(), 1, "{text:?}");
    e.samples.into_iter().next().unwrap()
}

fn rejected(text: &str) {
    let e = parse(text);
    assert!(e.samples.is_empty(), "{text:?} yielded {:?}", e.samples);
    assert_eq!(e.rejected_lines, 1, "{text:?}");
}

fn l<'a>(k: &'a str, v: &'a str) -> (&'a str, Cow<'a, str>) {
    (k, Cow::Borrowed(v))
}

#[test]
fn plain_sample_without_labels() {
    let s = one("up 1\n");
    assert_eq!(s.name, "up");
    assert!(s.labels.is_empty());
    assert_eq!(s.value, 1.0);
}

#[test]
fn colons_in_names_and_sorted_labels() {
    let s = one("vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 3.0\n");
    assert_eq!(s.name, "vllm:num_requests_running");
    assert_eq!(s.labels, vec![l("engine", "1"), l("model_name", "m")]);
    assert_eq!(s.label("engine"), Some("1"));
    assert_eq!(s.label("nope"), None);
}

#[test]
fn escapes_in_label_values() {
    let s = one("m{a=\"back\\\\slash\",b=\"say \\\"hi\\\"\",c=\"two\\nlines\"} 1\n");
    assert_eq!(
        s.labels,
        vec![
            l("a", "back\\slash"),
            l("b", "say \"hi\""),
            l("c", "two\nlines")
        ]
    );
}

#[test]
fn quoted_values_may_hold_separators_and_hashes() {
    let s = one("m{path=\"/a,b}c=d # e\",x=\"{\"} 2\n");
    assert_eq!(s.labels, vec![l("path", "/a,b}c=d # e"), l("x", "{")]);
    let s = one("m{v=\"ünïcödé ✓\"} 2\n");
    assert_eq!(s.label("v"), Some("ünïcödé ✓"));
}

#[test]
fn number_forms() {
    assert_eq!(one("m 1e3\n").value, 1000.0);
    assert_eq!(one("m -2.5E-2\n").value, -0.025);
    assert_eq!(one("m +7\n").value, 7.0);
    assert_eq!(one("m .5\n").value, 0.5);
    assert_eq!(one("m 8.128902e+06\n").value, 8_128_902.0);
}

#[test]
fn non_finite_values_are_rejected() {
    for v in ["NaN", "nan", "+Inf", "-Inf", "Inf", "1e999"] {
        rejected(&format!("m{{a=\"b\"}} {v}\n"));
    }
}

#[test]
fn inf_as_a_label_value_is_fine() {
    let s = one("h_bucket{le=\"+Inf\"} 4\n");
    assert_eq!(s.label("le"), Some("+Inf"));
}

#[test]
fn timestamps_blanks_and_trailing_comma() {
    assert_eq!(one("m{a=\"b\"} 3 1700000000000\n").value, 3.0);
    assert_eq!(one("m 3 -5\n").value, 3.0);
    let s = one("  m \t{ a = \"b\" , c=\"d\", } \t 4 \t 1 \t\n");
    assert_eq!(s.labels, vec![l("a", "b"), l("c", "d")]);
    assert_eq!(s.value, 4.0);
    assert_eq!(one("m{} 5\n").value, 5.0);
    assert_eq!(one("m{a=\"b\"}6\n").value, 6.0);
}

#[test]
fn crlf_and_empty_lines() {
    let e = parse("# HELP a x\r\n# TYPE a gauge\r\n\r\na 1\r\n\n   \nb 2\r\n");
    assert_eq!(e.rejected_lines, 0);
    assert_eq!(e.samples.len(), 2);
    assert_eq!(e.types.get("a"), Some(&MetricType::Gauge));
}

#[test]
fn types_and_comments() {
    let e = parse(
        "# just a comment\n#\n# HELP h Help with \\ and \"quotes\"\n# TYPE h histogram\n\
         # TYPE c counter\n# TYPE s summary\n# TYPE u untyped\n#TYPE g gauge\nh_count 1\n",
    );
    assert_eq!(e.rejected_lines, 0);
    assert_eq!(e.types.get("h"), Some(&MetricType::Histogram));
    assert_eq!(e.types.get("c"), Some(&MetricType::Counter));
    assert_eq!(e.types.get("s"), Some(&MetricType::Summary));
    assert_eq!(e.types.get("u"), Some(&MetricType::Untyped));
    assert_eq!(e.types.get("g"), Some(&MetricType::Gauge));
    assert_eq!(e.samples.len(), 1);
}

#[test]
fn bad_type_lines_are_rejected_and_the_first_declaration_stays() {
    let e = parse(
        "# TYPE a gauge\n# TYPE a counter\n# TYPE b bogus\n# TYPE\n# TYPE 9x gauge\n\
         # TYPE c gauge extra\n# HELP 9x nope\n",
    );
    assert_eq!(e.rejected_lines, 6);
    assert_eq!(e.types.len(), 1);
    assert_eq!(e.types.get("a"), Some(&MetricType::Gauge));
}

#[test]
fn malformed_lines_are_rejected_alone() {
    for bad in [
        "m\n",
        "m \n",
        "m{a=\"b\"}\n",
        "m{a=\"b\" 1\n",
        "m{a=b} 1\n",
        "m{a=\"b} 1\n",
        "m{9a=\"b\"} 1\n",
        "m{a.b=\"c\"} 1\n",
        "m{a=\"b\",,} 1\n",
        "m{a=\"b\"c=\"d\"} 1\n",
        "m{a=\"\\x\"} 1\n",
        "m{a=\"b\\\"} 1\n",
        "m{a=\"1\",a=\"2\"} 1\n",
        "9m 1\n",
        "m-x 1\n",
        "m 1 2 3\n",
        "m 1 1.5\n",
        "m 0x10\n",
        "m 1_000\n",
        "m one\n",
        "{a=\"b\"} 1\n",
        "m{a=\"b\"} 1 # comment\n",
        "m\u{fffd} 1\n",
    ] {
        rejected(bad);
    }
    let e = parse("ok 1\nbad{\nalso_ok{a=\"b\"} 2\n");
    assert_eq!(e.rejected_lines, 1);
    assert_eq!(e.samples.len(), 2);
}

#[test]
fn duplicate_series_are_dropped_entirely() {
    let e = parse(
        "a{x=\"1\"} 1\nb 5\na{x=\"1\"} 2\na{x=\"2\"} 3\n\
         c{p=\"1\",q=\"2\"} 1\nc{q=\"2\",p=\"1\"} 1\na{x=\"1\"} 4\n",
    );
    assert_eq!(e.ambiguous_series, 2);
    let names: Vec<_> = e.samples.iter().map(|s| (s.name, s.value)).collect();
    assert_eq!(names, vec![("b", 5.0), ("a", 3.0)]);
    assert_eq!(e.errors(), 2);
}

#[test]
fn unterminated_final_line_is_truncated() {
    let e = parse("a 1\nb 2");
    assert!(e.truncated);
    assert_eq!(e.rejected_lines, 1);
    assert_eq!(e.samples.len(), 1);
    // A final line of blanks is not a cut sample.
    let e = parse("a 1\n  ");
    assert!(!e.truncated);
    assert_eq!(e.rejected_lines, 0);
    let e = parse("# TYPE a gauge");
    assert!(e.truncated);
    assert!(e.types.is_empty());
}

#[test]
fn limits_reject_the_excess() {
    let limits = Limits {
        max_line_bytes: 40,
        max_labels: 2,
        max_samples: 3,
    };
    let long = format!("m{{a=\"{}\"}} 1\n", "x".repeat(100));
    let e = parse_with(&long, &limits);
    assert_eq!((e.samples.len(), e.rejected_lines), (0, 1));
    let e = parse_with(
        "m{a=\"1\",b=\"2\",c=\"3\"} 1\nm{a=\"1\",b=\"2\"} 1\n",
        &limits,
    );
    assert_eq!((e.samples.len(), e.rejected_lines), (1, 1));
    let e = parse_with("a 1\nb 1\nc 1\nd 1\ne 1\n", &limits);
    assert_eq!((e.samples.len(), e.rejected_lines), (3, 2));
    let e = parse_with(
        "# TYPE a gauge\n# TYPE b gauge\n# TYPE c gauge\n# TYPE d gauge\n",
        &limits,
    );
    assert_eq!((e.types.len(), e.rejected_lines), (3, 1));
}

#[test]
fn empty_input() {
    assert_eq!(parse(""), Exposition::default());
    assert_eq!(parse("\n\n\r\n"), Exposition::default());
}

/// Whether `s` could have come from `input`: its name is in it, and so is every label
/// name and value (values possibly escaped).
fn appears_in(s: &Sample<'_>, input: &str) -> bool {
    let escaped = |v: &str| {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    input.contains(s.name)
        && s.labels
            .iter()
            .all(|(k, v)| input.contains(k) && input.contains(&escaped(v)))
}

fn check(input: &str) {
    let e = parse(input);
    let small = parse_with(
        input,
        &Limits {
            max_line_bytes: 64,
            max_labels: 2,
            max_samples: 4,
        },
    );
    for s in e.samples.iter().chain(&small.samples) {
        assert!(s.value.is_finite(), "{s:?}");
        assert!(appears_in(s, input), "{s:?} not in {input:?}");
        assert!(s.labels.windows(2).all(|w| w[0].0 < w[1].0), "{s:?}");
    }
    assert!(small.samples.len() <= 4);
    assert!(small.samples.iter().all(|s| s.labels.len() <= 2));
    // The selective parse keeps exactly the full parse's samples and types of the names
    // it accepts, and rejects no more lines.
    let keep = |n: &str| n == "m" || n.starts_with("vllm:");
    let selected = parse_selected(input.as_bytes(), &Limits::default(), &keep);
    let want: Vec<&Sample> = e.samples.iter().filter(|s| keep(s.name)).collect();
    assert_eq!(selected.samples.iter().collect::<Vec<_>>(), want);
    assert!(selected.types.keys().all(|n| keep(n)));
    assert!(
        e.types
            .iter()
            .filter(|(n, _)| keep(n))
            .all(|(n, t)| selected.types.get(n) == Some(t))
    );
    assert!(selected.rejected_lines <= e.rejected_lines);
    assert_eq!(selected.truncated, e.truncated);
}

/// Lines built from the format's own pieces, so the property test reaches deep into the
/// parser rather than failing on the first byte.
fn line() -> impl Strategy<Value = String> {
    let name = prop::sample::select(vec![
        "m",
        "vllm:x",
        "sglang:y_bucket",
        "a_b",
        "9",
        "",
        "m{",
        "_",
    ]);
    let label = (
        prop::sample::select(vec!["le", "engine", "a", "1x", "", "le"]),
        prop::sample::select(vec![
            "\"0\"", "\"+Inf\"", "\"a,b}\"", "\"\\\\\"", "\"\\\"\"", "\"\\n\"", "\"\\q\"",
            "\"open", "bare", "\"#\"", "\"\"",
        ]),
    )
        .prop_map(|(k, v)| format!("{k}={v}"));
    let labels = prop::collection::vec(label, 0..70).prop_map(|ls| {
        if ls.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", ls.join(","))
        }
    });
    let value = prop::sample::select(vec![
        "1", "0", "-3.5", "1e308", "1e309", "NaN", "+Inf", "-Inf", "nan", "x", "", "2 3",
        "4 17000", "5 1.5",
    ]);
    let comment = prop::sample::select(vec![
        "# TYPE m gauge",
        "# TYPE m bogus",
        "# HELP m text",
        "# TYPE vllm:x histogram",
        "#",
    ]);
    prop_oneof![
        4 => (name, labels, value).prop_map(|(n, l, v)| format!("{n}{l} {v}")),
        1 => comment.prop_map(str::to_owned),
        1 => "[ -~]{0,40}",
        1 => Just("m ".to_owned() + &"9".repeat(70_000)),
    ]
}

#[test]
fn plain_values_are_borrowed_and_invalid_utf8_is_repaired() {
    let text = "m{a=\"plain\",b=\"esc\\\"aped\"} 1\n";
    let e = parse(text);
    let labels = &e.samples[0].labels;
    assert!(matches!(labels[0].1, Cow::Borrowed("plain")));
    assert!(matches!(&labels[1].1, Cow::Owned(v) if v == "esc\"aped"));
    // Invalid UTF-8 in a raw body spoils only its value, repaired as lossy decoding would.
    let body = b"m{a=\"x\xff\xfey\",b=\"\xe2\x82\\n\"} 2\nn 3\n";
    let e = parse_selected(body, &Limits::default(), &|_| true);
    assert_eq!(e.rejected_lines, 0);
    assert_eq!(e.samples[0].label("a"), Some("x\u{fffd}\u{fffd}y"));
    assert_eq!(e.samples[0].label("b"), Some("\u{fffd}\n"));
    assert_eq!(e.samples[1].value, 3.0);
}

#[test]
fn the_decimal_shortcut_reads_what_the_standard_parser_reads() {
    for v in [
        "0",
        "-0",
        "12.0",
        "0.1",
        "0.3",
        "123456789012345",
        "1234567890123456",
        "9007199254740993",
        "0.000000000000001",
        "99999999999999.9",
        "-7.25",
        "+3.",
        ".5",
        "1.",
        "5e-324",
        "1e22",
    ] {
        let ours = number(v.as_bytes()).unwrap();
        let std: f64 = v.parse().unwrap();
        assert_eq!(ours.to_bits(), std.to_bits(), "{v}");
    }
    for bad in ["", "-", ".", "+.", "1.2.3", "--1", "1-", "0x1"] {
        assert_eq!(number(bad.as_bytes()), bad.parse::<f64>().ok(), "{bad:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decimals_read_as_the_standard_parser_reads_them(
        sign in prop::sample::select(vec!["", "-", "+"]),
        int in "[0-9]{0,17}",
        frac in prop::option::of("[0-9]{0,17}"),
    ) {
        let v = format!("{sign}{int}{}", frac.map(|f| format!(".{f}")).unwrap_or_default());
        let ours = number(v.as_bytes());
        let std = v.parse::<f64>().ok();
        prop_assert_eq!(ours.map(f64::to_bits), std.map(f64::to_bits), "{}", v);
    }

    /// A raw body reads as its lossy decoding does (lines here are far below the line
    /// limit, which counts raw bytes).
    #[test]
    fn raw_bytes_read_as_their_lossy_text(
        lines in prop::collection::vec(
            (line(), prop::collection::vec(any::<u8>(), 0..3), 0usize..40),
            0..20,
        ),
    ) {
        let mut body = Vec::new();
        for (l, junk, at) in lines {
            let mut l = l.into_bytes();
            l.truncate(1000);
            let at = at.min(l.len());
            l.splice(at..at, junk);
            body.extend_from_slice(&l);
            body.push(b'\n');
        }
        let text = String::from_utf8_lossy(&body);
        let from_text = parse(&text);
        let from_bytes = parse_selected(&body, &Limits::default(), &|_| true);
        prop_assert_eq!(from_bytes, from_text);
    }

    #[test]
    fn arbitrary_strings_never_panic(input in any::<String>()) {
        check(&input);
    }

    #[test]
    fn byte_soup_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn format_shaped_input_never_panics(
        lines in prop::collection::vec(line(), 0..40),
        ending in prop::sample::select(vec!["\n", "\r\n"]),
        cut in any::<bool>(),
        dup in any::<bool>(),
    ) {
        let mut input = lines.join(ending);
        if dup && !lines.is_empty() {
            input.push_str(ending);
            input.push_str(&lines[0]);
        }
        if !cut {
            input.push_str(ending);
        }
        check(&input);
    }
}
