//! Every example manifest parses, validates, and survives a serde round trip; bad specs
//! are refused with the CRD's own messages.

use ballast_crds::{
    AuthSpec, InferenceService, InferenceServiceSpec, ModelVolumeSpec, PolicyType, SecretKeyRef,
    parse_yaml,
};

fn examples() -> Vec<(String, Vec<InferenceService>)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let docs = parse_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path.display().to_string(), docs));
        }
    }
    assert!(out.len() >= 2);
    out
}

#[test]
fn examples_parse_validate_and_round_trip() {
    for (path, docs) in examples() {
        assert!(!docs.is_empty(), "{path}");
        for isvc in docs {
            isvc.spec
                .validate()
                .unwrap_or_else(|e| panic!("{path}: {e:?}"));
            let json = serde_json::to_value(&isvc).unwrap();
            let back: InferenceService = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), json, "{path}");
            assert_eq!(back.spec, isvc.spec, "{path}");
            let yaml = serde_saphyr::to_string(&isvc).unwrap();
            let again = parse_yaml(&yaml).unwrap();
            assert_eq!(again.len(), 1);
            assert_eq!(serde_json::to_value(&again[0]).unwrap(), json, "{path}");
        }
    }
}

#[test]
fn defaults_follow_the_contract() {
    let docs = parse_yaml("apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: m}\nspec: {model: {source: synthetic:tiny}}\n").unwrap();
    let s = &docs[0].spec;
    assert_eq!(docs[0].served_name(), "m");
    assert_eq!(
        (
            s.engine.port,
            s.engine.grpc_port,
            s.engine.data_parallel_size
        ),
        (8000, 9000, 1)
    );
    assert_eq!(
        (s.engine.max_num_seqs, s.engine.max_num_batched_tokens),
        (256, 8192)
    );
    assert_eq!(
        (s.engine.max_queued_requests, s.engine.max_queued_tokens),
        (1024, 1_048_576)
    );
    assert_eq!(s.engine.kv_cache.block_size, 16);
    assert!(s.engine.enable_prefix_caching);
    let a = &s.autoscaling;
    assert!(a.enabled);
    assert_eq!((a.min_replicas, a.max_replicas, a.tolerance), (1, 4, 0.1));
    assert_eq!(a.targets.capacity_waiting_per_replica, Some(4.0));
    assert_eq!(a.targets.kv_cache_usage, Some(0.85));
    assert_eq!(a.targets.admission_rejections_per_second, Some(0.05));
    assert_eq!(a.targets.ttft_p99_seconds, None);
    let behavior = a.behavior.resolved();
    assert_eq!(behavior.scale_up.stabilization_window_seconds, 0);
    assert_eq!(behavior.scale_down.stabilization_window_seconds, 300);
    let up: Vec<_> = behavior
        .scale_up
        .policies
        .iter()
        .map(|p| (p.type_, p.value, p.period_seconds))
        .collect();
    assert_eq!(
        up,
        [(PolicyType::Pods, 4, 15), (PolicyType::Percent, 100, 15)]
    );
    let r = &s.rebalancing;
    assert_eq!(
        (
            r.hot_kv_cache_usage,
            r.hot_capacity_waiting,
            r.cool_fraction,
            r.min_accepting,
            r.dp_imbalance_ratio
        ),
        (0.95, 8.0, 0.8, 1, 1.5)
    );
    let m = &s.metrics;
    assert_eq!(
        (
            m.path.as_str(),
            m.scrape_interval_seconds,
            m.scrape_timeout_seconds,
            m.max_body_bytes,
            m.min_reporting_fraction
        ),
        ("/metrics", 5, 2, 4_194_304, 0.5)
    );
}

#[test]
fn bad_specs_are_refused_with_the_crd_messages() {
    let base = || -> InferenceServiceSpec {
        serde_json::from_value(serde_json::json!({"model": {"source": "synthetic:tiny"}})).unwrap()
    };
    let crd = ballast_crds::crd_yaml();
    type Mutation = Box<dyn Fn(&mut InferenceServiceSpec)>;
    let cases: Vec<(Mutation, &str)> = vec![
        (
            Box::new(|s| s.autoscaling.min_replicas = 5),
            "minReplicas must not exceed maxReplicas",
        ),
        (
            Box::new(|s| s.autoscaling.tolerance = 1.0),
            "tolerance must be in [0, 1)",
        ),
        (
            Box::new(|s| s.autoscaling.targets.kv_cache_usage = Some(0.0)),
            "kvCacheUsage must be in (0, 1]",
        ),
        (
            Box::new(|s| {
                let t = &mut s.autoscaling.targets;
                t.capacity_waiting_per_replica = None;
                t.kv_cache_usage = None;
                t.admission_rejections_per_second = None;
            }),
            "autoscaling needs at least one target",
        ),
        (
            Box::new(|s| s.metrics.scrape_timeout_seconds = 10),
            "scrapeTimeoutSeconds must not exceed scrapeIntervalSeconds",
        ),
        (
            Box::new(|s| s.rebalancing.cool_fraction = 1.5),
            "coolFraction must be in (0, 1)",
        ),
        (
            Box::new(|s| s.model.source.clear()),
            "model.source must not be empty",
        ),
        (
            Box::new(|s| {
                s.model.volume = Some(ModelVolumeSpec {
                    persistent_volume_claim: Some("models".into()),
                    host_path: Some("/srv/models".into()),
                })
            }),
            "model.volume needs exactly one of persistentVolumeClaim and hostPath",
        ),
        (
            Box::new(|s| s.model.volume = Some(ModelVolumeSpec::default())),
            "model.volume needs exactly one of persistentVolumeClaim and hostPath",
        ),
        (
            Box::new(|s| s.model.volume = Some(claim(""))),
            "model.volume.persistentVolumeClaim must be a DNS subdomain name",
        ),
        (
            Box::new(|s| s.model.volume = Some(claim("Models"))),
            "model.volume.persistentVolumeClaim must be a DNS subdomain name",
        ),
        (
            Box::new(|s| s.model.volume = Some(claim("models-"))),
            "model.volume.persistentVolumeClaim must be a DNS subdomain name",
        ),
        (
            Box::new(|s| s.model.volume = Some(host_path(""))),
            "model.volume.hostPath must be an absolute path",
        ),
        (
            Box::new(|s| s.model.volume = Some(host_path("srv/models"))),
            "model.volume.hostPath must be an absolute path",
        ),
        (
            Box::new(|s| s.auth = Some(auth("Keys", "api-key"))),
            "auth.apiKeySecretRef.name must be a DNS subdomain name",
        ),
        (
            Box::new(|s| s.auth = Some(auth("keys", ""))),
            "auth.apiKeySecretRef.key must be a Secret key: letters, digits, '-', '_' and '.'",
        ),
        (
            Box::new(|s| s.auth = Some(auth("keys", "api/key"))),
            "auth.apiKeySecretRef.key must be a Secret key: letters, digits, '-', '_' and '.'",
        ),
    ];
    for (mutate, message) in cases {
        let mut s = base();
        mutate(&mut s);
        let errs = s.validate().unwrap_err();
        assert!(errs.iter().any(|e| e == message), "{message}: {errs:?}");
        assert!(
            crd.contains(message),
            "the CRD states the same rule: {message}"
        );
    }
    assert_eq!(base().validate(), Ok(()));
    for volume in [
        claim("models"),
        claim("llm.models-0"),
        host_path("/srv/models"),
    ] {
        let mut s = base();
        s.model.volume = Some(volume.clone());
        assert_eq!(s.validate(), Ok(()), "{volume:?}");
    }
    let mut s = base();
    s.auth = Some(auth("llm-keys.v2", "API_key-1.txt"));
    assert_eq!(s.validate(), Ok(()));
}

fn auth(name: &str, key: &str) -> AuthSpec {
    AuthSpec {
        api_key_secret_ref: SecretKeyRef {
            name: name.into(),
            key: key.into(),
        },
    }
}

fn claim(name: &str) -> ModelVolumeSpec {
    ModelVolumeSpec {
        persistent_volume_claim: Some(name.into()),
        host_path: None,
    }
}

fn host_path(path: &str) -> ModelVolumeSpec {
    ModelVolumeSpec {
        persistent_volume_claim: None,
        host_path: Some(path.into()),
    }
}
