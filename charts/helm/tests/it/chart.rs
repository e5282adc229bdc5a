//! The chart rendered with its defaults and with other values: which documents appear,
//! that each is a valid Kubernetes object of its kind, and what the operator's
//! Deployment holds.

use crate::common;

use ballast_helm::Error;
use common::*;
use serde_json::{Value as Json, json};

#[test]
fn the_crd_is_the_generated_one() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    let on_disk =
        std::fs::read_to_string(chart_dir().join("crds/inferenceservices.ballast.dev.yaml"))
            .unwrap();
    let generated = ballast_crds::crd_yaml();
    if on_disk != generated {
        let line = on_disk
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| on_disk.lines().count().min(generated.lines().count()));
        panic!(
            "charts/ballast/crds/ differs from `ballast crd` from line {}: copy crds/inferenceservices.ballast.dev.yaml there\nchart: {:?}\ncode:  {:?}",
            line + 1,
            on_disk.lines().nth(line),
            generated.lines().nth(line)
        );
    }
    let r = render(&options());
    assert_eq!(r.crds.len(), 1, "one CRD document");
    assert_eq!(
        r.crds[0].source,
        "ballast/crds/inferenceservices.ballast.dev.yaml"
    );
    let crd = r.crds[0].parse().unwrap();
    assert_eq!(crd["metadata"]["name"], "inferenceservices.ballast.dev");
    // As Helm reads it (YAML 1.1, where an unquoted `on` or `no` is a boolean), the CRD
    // is still the one the code wrote (YAML 1.2).
    let helms: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    let generated: CustomResourceDefinition = serde_saphyr::from_str(&on_disk).unwrap();
    let (helms, generated) = (
        serde_json::to_value(helms).unwrap(),
        serde_json::to_value(generated).unwrap(),
    );
    let mut differences = Vec::new();
    diff(&helms, &generated, String::new(), &mut differences);
    assert!(
        differences.is_empty(),
        "Helm reads the CRD differently from how it was written:\n{}",
        differences.join("\n")
    );
}

/// Where `a` and `b` differ: `path: a != b`, one line each.
fn diff(a: &Json, b: &Json, path: String, out: &mut Vec<String>) {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Json::Null),
                    y.get(k).unwrap_or(&Json::Null),
                );
                diff(va, vb, format!("{path}.{k}"), out);
            }
        }
        (Json::Array(x), Json::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                diff(va, vb, format!("{path}[{i}]"), out);
            }
        }
        // JSON has one kind of number: Helm reads `4.0` as 4, and so does the API server.
        (Json::Number(x), Json::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a != b => out.push(format!("{path}: {a} != {b}")),
        _ => {}
    }
}

#[test]
fn defaults_render_the_operator_its_rbac_and_dashboards_only() {
    let r = render(&options());
    let dashboards = dashboard_config_maps();
    assert_eq!(dashboards.len(), 6, "{dashboards:?}");
    let mut want: Vec<(String, String)> = [
        ("ClusterRole", "ballast-ballast-system"),
        ("ClusterRoleBinding", "ballast-ballast-system"),
        ("Deployment", "ballast"),
        ("Role", "ballast"),
        ("RoleBinding", "ballast"),
        ("Service", "ballast"),
        ("ServiceAccount", "ballast"),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), n.to_string()))
    .collect();
    want.extend(dashboards.into_iter().map(|n| ("ConfigMap".to_string(), n)));
    want.sort();
    let mut got = kinds(&r);
    got.sort();
    assert_eq!(
        got, want,
        "no monitoring API: the operator, its RBAC and the dashboards, nothing else"
    );
    check_types(&r);
    for o in objects(&r) {
        let labels = &o["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/name"], "ballast");
        assert_eq!(labels["app.kubernetes.io/instance"], "ballast");
        assert_eq!(labels["app.kubernetes.io/version"], "0.1.0");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
        assert_eq!(labels["helm.sh/chart"], "ballast-0.1.0");
        if !o["kind"].as_str().unwrap().starts_with("Cluster") {
            assert_eq!(
                o["metadata"]["namespace"], "ballast-system",
                "{}",
                o["kind"]
            );
        }
    }
    let d = one(&r, "Deployment");
    assert_eq!(
        d["spec"]["replicas"], 2,
        "two replicas with leader election"
    );
    assert_eq!(
        args(&r),
        [
            "operator",
            "--metrics-port=8080",
            "--metrics-host=$(POD_IP)",
            "--engine-image=ghcr.io/ballast-dev/ballast:0.1.0",
            "--lease-name=ballast-operator",
            "--lease-seconds=15",
        ]
    );
    assert_eq!(container(&r)["image"], "ghcr.io/ballast-dev/ballast:0.1.0");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "ballast");
    let anti =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(
        anti["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        anti["podAffinityTerm"]["labelSelector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    let svc = one(&r, "Service");
    assert_eq!(
        svc["spec"]["selector"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics");
    assert!(
        r.notes
            .contains("kubectl -n ballast-system rollout status deployment/ballast")
    );
    assert!(r.notes.contains("kind: InferenceService"));
    assert!(r.notes.contains("no Prometheus Operator"));
}

#[test]
fn the_deployment_is_locked_down_and_probed() {
    let r = render(&options());
    let d = one(&r, "Deployment");
    let pod = &d["spec"]["template"]["spec"];
    let psc = &pod["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true);
    assert_eq!(psc["runAsUser"], 65532);
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
    let c = container(&r);
    assert_eq!(c["command"], json!(["ballast"]), "the command is explicit");
    assert_eq!(c["args"][0], "operator");
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert!(sc["runAsUser"].as_i64().is_some_and(|u| u > 0));
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(sc["capabilities"].get("add").is_none());
    assert_eq!(
        c["ports"],
        json!([{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}])
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "metrics"})
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "metrics"})
    );
    let env: Vec<(String, Json)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["valueFrom"]["fieldRef"]["fieldPath"].clone(),
            )
        })
        .collect();
    for (name, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_IP", "status.podIP"),
    ] {
        assert!(
            env.contains(&(name.to_string(), json!(path))),
            "{name} from the downward API: {env:?}"
        );
    }
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
}

#[test]
fn other_values_change_what_renders() {
    let copy = ChartCopy::with(&[
        ("files/dashboards/fleet_Overview.json", DASHBOARD),
        (
            "files/dashboards/engines.json",
            "{\"title\": \"Engines\"}\n",
        ),
        ("files/alerts.yaml", ALERTS),
    ]);
    let values = json!({
        "image": {"repository": "registry.example/ballast", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "operator": {
            "replicas": 1,
            "leaderElection": {"enabled": false},
            "engineImage": "registry.example/engine:9",
            "watchNamespace": "team-a",
            "metrics": {"host": "$(POD_IP)", "port": 9090},
            "logLevel": "debug,kube=warn",
            "extraArgs": ["--lease-seconds=9"],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
            "podAnnotations": {"example.com/note": "x"},
            "podLabels": {"team": "ops"},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "ballast"}}}],
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
            "priorityClassName": "system-cluster-critical"
        },
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
        "service": {"port": 9091},
        "monitoring": {
            "serviceMonitor": {"labels": {"release": "prom"}, "interval": "15s"},
            "engineServiceMonitor": {"enabled": true},
            "prometheusRule": {"labels": {"release": "prom"}}
        },
        "dashboards": {"folder": "LLM", "labels": {"team": "ops"}}
    });
    let r = render(
        &copy
            .options()
            .release("prod", "ops")
            .values(values)
            .with_monitoring(),
    );
    check_types(&r);
    let names = kinds(&r);
    for want in [
        ("ConfigMap", "prod-ballast-dashboard-engines"),
        ("ConfigMap", "prod-ballast-dashboard-fleet-overview"),
        ("ServiceMonitor", "prod-ballast"),
        ("ServiceMonitor", "prod-ballast-engines"),
        ("PrometheusRule", "prod-ballast"),
        ("Deployment", "prod-ballast"),
    ] {
        assert!(
            names.contains(&(want.0.to_string(), want.1.to_string())),
            "{want:?} in {names:?}"
        );
    }
    let d = one(&r, "Deployment");
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(
        args(&r),
        [
            "operator",
            "--metrics-port=9090",
            "--metrics-host=$(POD_IP)",
            "--engine-image=registry.example/engine:9",
            "--no-leader-election",
            "--namespace=team-a",
            "--lease-seconds=9",
        ]
    );
    let c = container(&r);
    assert_eq!(c["image"], "registry.example/ballast:1.2.3");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(c["ports"][0]["containerPort"], 9090);
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "BALLAST_LOG", "value": "debug,kube=warn"}))
    );
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["topologySpreadConstraints"][0]["maxSkew"], 1);
    assert!(
        pod.get("affinity").is_none(),
        "one replica: no anti-affinity"
    );
    let tmeta = &d["spec"]["template"]["metadata"];
    assert_eq!(tmeta["annotations"]["example.com/note"], "x");
    assert_eq!(tmeta["labels"]["team"], "ops");
    assert_eq!(tmeta["labels"]["app.kubernetes.io/version"], "1.2.3");
    assert_eq!(one(&r, "Service")["spec"]["ports"][0]["port"], 9091);
    let sa = one(&r, "ServiceAccount");
    assert_eq!(
        sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::1:role/x"
    );

    // Monitoring.
    let sms = r.of_kind("ServiceMonitor").unwrap();
    let op_sm = sms
        .iter()
        .find(|s| s["metadata"]["name"] == "prod-ballast")
        .unwrap();
    assert_eq!(op_sm["metadata"]["labels"]["release"], "prom");
    assert_eq!(
        op_sm["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        op_sm["spec"]["namespaceSelector"],
        json!({"matchNames": ["ops"]})
    );
    assert_eq!(op_sm["spec"]["endpoints"][0]["interval"], "15s");
    assert_eq!(
        op_sm["spec"]["endpoints"][0]["honorLabels"], true,
        "the operator's namespace label is the InferenceService's"
    );
    let engines = sms
        .iter()
        .find(|s| s["metadata"]["name"] == "prod-ballast-engines")
        .unwrap();
    assert_eq!(
        engines["spec"]["selector"]["matchLabels"],
        json!({"app.kubernetes.io/name": "ballast-engine"})
    );
    assert_eq!(engines["spec"]["namespaceSelector"], json!({"any": true}));
    assert_eq!(engines["spec"]["endpoints"][0]["port"], "http");
    let rule = one(&r, "PrometheusRule");
    let want: Json = serde_saphyr::from_str::<Json>(ALERTS).unwrap();
    assert_eq!(
        rule["spec"]["groups"], want["groups"],
        "the rules file, verbatim"
    );
    assert_eq!(
        rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"],
        "{{ $labels.name }} fails to reconcile",
        "Prometheus templating is not Helm's"
    );

    // Dashboards.
    let cms = r.of_kind("ConfigMap").unwrap();
    assert_eq!(cms.len(), 2);
    let fleet = cms
        .iter()
        .find(|c| c["metadata"]["name"] == "prod-ballast-dashboard-fleet-overview")
        .unwrap();
    assert_eq!(fleet["metadata"]["namespace"], "ops");
    assert_eq!(fleet["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(fleet["metadata"]["labels"]["team"], "ops");
    assert_eq!(fleet["metadata"]["annotations"]["grafana_folder"], "LLM");
    let json_text = fleet["data"]["fleet_Overview.json"].as_str().unwrap();
    assert_eq!(
        json_text,
        DASHBOARD.trim_end(),
        "the dashboard, byte for byte"
    );
    let parsed: Json = serde_json::from_str(json_text).unwrap();
    assert_eq!(parsed["uid"], "ballast-fleet");
    assert!(r.notes.contains("2 Grafana dashboards"), "{}", r.notes);
    assert!(
        r.notes
            .contains("ServiceMonitor ops/prod-ballast scrapes it"),
        "{}",
        r.notes
    );

    // The same values without the monitoring API: no monitoring objects at all.
    let no_api = render(
        &copy
            .options()
            .release("prod", "ops")
            .values(json!({"monitoring": {"engineServiceMonitor": {"enabled": true}}})),
    );
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(
            no_api.of_kind(kind).unwrap().is_empty(),
            "{kind} without its API"
        );
    }
    assert_eq!(no_api.of_kind("ConfigMap").unwrap().len(), 2);

    // A cluster with the ServiceMonitor CRD and not the PrometheusRule one (the e2e's
    // node): the ServiceMonitors, and no PrometheusRule Helm could not create.
    let monitors_only = render(
        &copy
            .options()
            .release("prod", "ops")
            .values(json!({"monitoring": {"engineServiceMonitor": {"enabled": true}}}))
            .with_monitoring_kinds(&["ServiceMonitor"]),
    );
    assert_eq!(monitors_only.of_kind("ServiceMonitor").unwrap().len(), 2);
    assert!(monitors_only.of_kind("PrometheusRule").unwrap().is_empty());
}

#[test]
fn each_switch_turns_its_objects_off() {
    let copy = ChartCopy::with(&[
        ("files/dashboards/fleet.json", DASHBOARD),
        ("files/alerts.yaml", ALERTS),
    ]);
    let with_api = |values: Json| render(&copy.options().values(values).with_monitoring());
    let all = with_api(json!({}));
    assert_eq!(
        all.of_kind("ServiceMonitor").unwrap().len(),
        1,
        "the engine one is off by default"
    );
    assert_eq!(all.of_kind("PrometheusRule").unwrap().len(), 1);
    assert_eq!(all.of_kind("ConfigMap").unwrap().len(), 1);
    check_types(&all);

    let off = with_api(json!({
        "monitoring": {"serviceMonitor": {"enabled": false}, "prometheusRule": {"enabled": false}},
        "dashboards": {"enabled": false},
        "rbac": {"create": false},
        "serviceAccount": {"create": false, "name": "existing"}
    }));
    let kinds: Vec<String> = kinds(&off).into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, ["Deployment", "Service"]);
    assert_eq!(
        one(&off, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"],
        "existing"
    );
    assert!(off.notes.contains("Off (dashboards.enabled=false)"));

    // A dashboard folder of none: no annotation.
    let no_folder = with_api(json!({"dashboards": {"folder": ""}}));
    assert!(
        one(&no_folder, "ConfigMap")["metadata"]
            .get("annotations")
            .is_none()
    );

    // The committed chart has no dashboards or alerts of its own yet: nothing breaks.
    let bare = render(&options().with_monitoring());
    assert_eq!(bare.of_kind("ServiceMonitor").unwrap().len(), 1);
    check_types(&bare);
}

#[test]
fn the_rbac_subject_is_the_service_account() {
    let r = render(
        &options()
            .release("r", "ns")
            .values(json!({"serviceAccount": {"name": "op"}})),
    );
    for (kind, role) in [
        ("ClusterRoleBinding", "r-ballast-ns"),
        ("RoleBinding", "r-ballast"),
    ] {
        let b = one(&r, kind);
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": "op", "namespace": "ns"}])
        );
        assert_eq!(b["roleRef"]["name"], role);
    }
    assert_eq!(one(&r, "ServiceAccount")["metadata"]["name"], "op");
    assert_eq!(one(&r, "RoleBinding")["roleRef"]["kind"], "Role");
    assert_eq!(
        one(&r, "ClusterRoleBinding")["roleRef"]["kind"],
        "ClusterRole"
    );
}

#[test]
fn names_are_cut_at_63_characters() {
    let release = "a-release-name-that-is-much-longer-than-any-dns-label-allows-x";
    let r = render(&options().release(release, "ns"));
    for (kind, name) in kinds(&r) {
        // RBAC objects' names are path segments (253); the rest are DNS labels.
        let max = if kind.contains("Role") { 253 } else { 63 };
        assert!(name.len() <= max && !name.ends_with('-'), "{kind} {name}");
    }
    let r = render(
        &options()
            .release("x", "ns")
            .values(json!({"fullnameOverride": "op"})),
    );
    assert_eq!(one(&r, "Deployment")["metadata"]["name"], "op");
}

#[test]
fn leader_election_off_needs_one_replica() {
    let err = options()
        .values(json!({"operator": {"leaderElection": {"enabled": false}}}))
        .try_render()
        .unwrap_err();
    match &err {
        Error::Render { template, message } => {
            assert_eq!(
                template.as_deref(),
                Some("ballast/templates/deployment.yaml")
            );
            assert!(message.contains("operator.replicas must be 1"), "{message}");
        }
        e => panic!("{e}"),
    }
    let r = render(
        &options()
            .values(json!({"operator": {"leaderElection": {"enabled": false}, "replicas": 1}})),
    );
    assert!(args(&r).contains(&"--no-leader-election".to_string()));
    assert!(!args(&r).iter().any(|a| a.starts_with("--lease")));
    assert!(
        one(&r, "Deployment")["spec"]["template"]["spec"]
            .get("affinity")
            .is_none()
    );
}

#[test]
fn hard_anti_affinity_and_a_custom_affinity() {
    let r = render(&options().values(json!({"operator": {"podAntiAffinity": "hard"}})));
    let pod = one(&r, "Deployment")["spec"]["template"]["spec"].clone();
    assert_eq!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    check_types(&r);
    let custom = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}]}}});
    let r = render(&options().values(json!({"operator": {"affinity": custom.clone()}})));
    assert_eq!(
        one(&r, "Deployment")["spec"]["template"]["spec"]["affinity"],
        custom
    );
    check_types(&r);
}

#[test]
fn values_can_come_as_yaml() {
    let yaml = "# A values file, as `helm install -f` reads it.\noperator:\n  replicas: 3 # three\n  metrics:\n    port: 8181\n";
    let r = helm()
        .render(chart_dir(), "ballast", "ballast-system", yaml)
        .unwrap();
    assert_eq!(one(&r, "Deployment")["spec"]["replicas"], 3);
    assert!(args(&r).contains(&"--metrics-port=8181".to_string()));
}

#[test]
fn the_chart_ships_the_real_alerts_and_dashboards() {
    let r = render(&options().with_monitoring());
    check_types(&r);
    let rule = &r.of_kind("PrometheusRule").unwrap()[0];
    let file = chart_dir().join("files/alerts.yaml");
    let want: Json = serde_saphyr::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(rule["spec"]["groups"], want["groups"]);
    let alerts: usize = want["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_array().map_or(0, Vec::len))
        .sum();
    assert!(alerts >= 7, "{alerts} alerts");
    for name in dashboard_config_maps() {
        let cms = r.of_kind("ConfigMap").unwrap();
        let cm = cms
            .iter()
            .find(|c| c["metadata"]["name"] == name.as_str())
            .unwrap_or_else(|| panic!("no ConfigMap {name}"));
        let (key, text) = cm["data"].as_object().unwrap().iter().next().unwrap();
        let on_disk =
            std::fs::read_to_string(chart_dir().join("files/dashboards").join(key)).unwrap();
        assert_eq!(text.as_str().unwrap(), on_disk.trim_end(), "{key}");
        let dashboard: Json = serde_json::from_str(text.as_str().unwrap()).unwrap();
        assert!(
            dashboard["panels"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
        );
    }
}
