//! Whatever a template contains, parsing and rendering it ends in output or an error,
//! never a panic: templates built from random text and actions, the actions from random
//! sequences of the pieces an action is made of.

use ballast_chart::{Error, Templates, Value};
use proptest::prelude::*;

/// Pieces of an action.
const PIECES: &[&str] = &[
    ".",
    ".a",
    ".a.b",
    ".l",
    ".m",
    ".n",
    ".n.x",
    "$",
    "$x",
    "$.a",
    "$x := ",
    "$x = ",
    "(",
    ")",
    " | ",
    "\"s\"",
    "`raw`",
    "'c'",
    "1",
    "-2",
    "3.5",
    "0x1F",
    "nil",
    "true",
    "printf \"%s %d %v\"",
    "len",
    "index",
    "default",
    "quote",
    "squote",
    "toYaml",
    "toJson",
    "indent 2",
    "nindent 2",
    "trunc 3",
    "trimSuffix \"s\"",
    "required \"r\"",
    "fail \"f\"",
    "dict \"k\"",
    "list",
    "hasKey",
    "eq",
    "ne",
    "lt",
    "ge",
    "and",
    "or",
    "not",
    "int",
    "base",
    "b64enc",
    "trim",
    "empty",
    "toString",
    "include \"d\"",
    "print",
    "println",
    "/*",
    "*/",
    "-",
    ",",
    "=",
];

/// Whole actions, so that control structures sometimes balance.
const ACTIONS: &[&str] = &[
    "{{ if .a }}",
    "{{ if .n }}",
    "{{ else }}",
    "{{ else if .l }}",
    "{{ end }}",
    "{{- end -}}",
    "{{ range .l }}",
    "{{ range $i, $v := .m }}",
    "{{ with .a }}",
    "{{ with .n }}",
    "{{ define \"d\" }}",
    "{{ template \"d\" . }}",
    "{{ block \"b\" .l }}",
    "{{ break }}",
    "{{ continue }}",
    "{{ $x := .l }}",
    "{{ /* c */ }}",
    "{{/* c */}}",
];

#[derive(Debug, Clone)]
enum Part {
    Text(&'static str),
    Action(&'static str),
    Built(bool, Vec<usize>, bool),
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        prop::sample::select(vec!["x", " ", "\n", "a: b\n", "  "]).prop_map(Part::Text),
        prop::sample::select(ACTIONS.to_vec()).prop_map(Part::Action),
        (
            any::<bool>(),
            prop::collection::vec(0..PIECES.len(), 0..7),
            any::<bool>()
        )
            .prop_map(|(l, p, r)| Part::Built(l, p, r)),
    ]
}

fn source(parts: &[Part]) -> String {
    let mut s = String::new();
    for p in parts {
        match p {
            Part::Text(t) | Part::Action(t) => s.push_str(t),
            Part::Built(left, pieces, right) => {
                s.push_str(if *left { "{{- " } else { "{{ " });
                for (i, &piece) in pieces.iter().enumerate() {
                    if i > 0 {
                        s.push(' ');
                    }
                    s.push_str(PIECES[piece]);
                }
                s.push_str(if *right { " -}}" } else { " }}" });
            }
        }
    }
    s
}

fn dot() -> Value {
    Value::from(serde_json::json!({
        "a": {"b": "text"}, "l": [1, "two", null, {"k": "v"}], "m": {"z": 1, "a": [true]}, "n": null
    }))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn any_template_renders_or_fails_cleanly(parts in prop::collection::vec(part(), 0..16)) {
        let src = source(&parts);
        let mut t = Templates::new();
        // A parse error is a fine answer; a panic here fails the test.
        if t.add("t", &src).is_ok() {
            match t.execute("t", &dot()) {
                Ok(_) => {}
                Err(Error::Exec { message, .. }) => {
                    // Execute runs on its own thread and reports a panic as this message.
                    prop_assert!(!message.contains("failed unexpectedly"), "{src:?} panicked");
                }
                Err(e) => prop_assert!(false, "{src:?}: unexpected error kind {e}"),
            }
        }
    }
}
