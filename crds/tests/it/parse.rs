//! `parse_yaml` errors say which document is wrong and why, as typed variants.

use ballast_crds::{ParseError, parse_yaml};

const GOOD: &str = "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: a}\nspec: {model: {source: synthetic:tiny}}\n";

#[test]
fn invalid_yaml_is_a_yaml_error() {
    let e = parse_yaml("spec: {model: [unclosed\n").unwrap_err();
    assert!(matches!(e, ParseError::Yaml(_)), "{e:?}");
    assert_eq!(e.reason(), "yaml");
    assert!(e.to_string().starts_with("invalid YAML: "), "{e}");
}

#[test]
fn a_document_that_is_not_an_inference_service_is_named_by_position() {
    let text = format!(
        "{GOOD}---\n---\napiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: b}}\nspec: {{model: {{}}}}\n"
    );
    let e = parse_yaml(&text).unwrap_err();
    let ParseError::NotAnInferenceService { document, source } = &e else {
        panic!("{e:?}");
    };
    // The empty document between them does not count.
    assert_eq!(*document, 2);
    assert!(source.to_string().contains("source"), "{source}");
    assert_eq!(e.reason(), "not_an_inference_service");
    let message = e.to_string();
    assert!(
        message.starts_with("document 2 is not a valid ballast.dev/v1alpha1 InferenceService: "),
        "{message}"
    );
    assert!(message.contains("missing field `source`"), "{message}");
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn good_documents_parse() {
    let docs = parse_yaml(&format!("---\n{GOOD}---\n")).unwrap();
    assert_eq!(docs.len(), 1);
}
