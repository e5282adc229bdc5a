//! The CRD YAML committed under crds/ is exactly what the Rust types generate.

#[test]
fn committed_crd_matches_the_types() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/inferenceservices.ballast.dev.yaml"
    );
    let generated = ballast_crds::crd_yaml();
    if std::env::var_os("BALLAST_UPDATE_CRD").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "{path} differs from the types; regenerate with `ballast crd > {path}` (or BALLAST_UPDATE_CRD=1 cargo test -p ballast-crds)"
    );
}

/// `isvc` is KServe's short name for its own InferenceService: on a cluster with both, a
/// shared short name makes `kubectl get isvc` ambiguous. Ballast's is `bisvc`, only.
#[test]
fn the_short_name_is_bisvc_and_not_kserves() {
    use kube::CustomResourceExt;
    let crd = ballast_crds::InferenceService::crd();
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["bisvc".to_string()][..])
    );
    assert!(
        !ballast_crds::crd_yaml().contains("- isvc"),
        "no other short name in the YAML"
    );
}
