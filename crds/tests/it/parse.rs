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

/// `minReplicas: 0` only with the gateway, which alone can bring the service back (the
/// CRD's CEL rule says the same; `cli/tests/it/gateway_pods.rs` has the API server say it).
#[test]
fn zero_min_replicas_needs_the_gateway() {
    let spec = |extra: &str| {
        let yaml = format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat}}\nspec:\n  model: {{source: 'synthetic:tiny'}}\n{extra}"
        );
        ballast_crds::parse_yaml(&yaml).unwrap().remove(0).spec
    };
    let errs = spec("  autoscaling: {minReplicas: 0}\n")
        .validate()
        .unwrap_err();
    assert!(
        errs.iter()
            .any(|e| e.contains("minReplicas: 0 needs gateway.enabled")),
        "{errs:?}"
    );
    spec("  autoscaling: {minReplicas: 0}\n  gateway: {enabled: true}\n")
        .validate()
        .unwrap();
    spec("  autoscaling: {enabled: false, minReplicas: 0}\n")
        .validate()
        .unwrap();
}

/// `autoscaling.mode` is `Act` unless set; `Advise` parses; anything else is refused
/// naming the allowed values (the CRD's schema holds the same enum for the API server).
#[test]
fn the_autoscaling_mode_is_act_or_advise() {
    let parse = |extra: &str| {
        ballast_crds::parse_yaml(&format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat}}\nspec:\n  model: {{source: 'synthetic:tiny'}}\n{extra}"
        ))
    };
    let mode = |extra: &str| parse(extra).unwrap().remove(0).spec.autoscaling.mode;
    assert_eq!(mode(""), ballast_crds::AutoscalingMode::Act);
    assert_eq!(
        mode("  autoscaling: {mode: Advise}\n"),
        ballast_crds::AutoscalingMode::Advise
    );
    let err = parse("  autoscaling: {mode: Maybe}\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("Act") && err.contains("Advise"), "{err}");
    let crd = ballast_crds::crd_yaml();
    assert!(
        crd.contains("- Act\n") && crd.contains("- Advise\n"),
        "the schema's enum"
    );
}
