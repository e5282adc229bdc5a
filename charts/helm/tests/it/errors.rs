//! Bad input gets a clear error of its own kind, never a panic: a missing chart, a
//! template that fails, a document that is not an object, an unreachable cluster.

use crate::common;

use std::path::{Path, PathBuf};

use ballast_helm::{Error, InstallOptions, UninstallOptions, UpgradeOptions, Wait};
use common::*;

/// A chart of a few templates in a temporary folder, removed on drop.
struct Scratch {
    root: PathBuf,
    dir: PathBuf,
}

impl Scratch {
    fn chart(name: &str, templates: &[(&str, &str)]) -> Scratch {
        let root =
            std::env::temp_dir().join(format!("ballast-helm-errors-{}-{name}", std::process::id()));
        let dir = root.join(name);
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(dir.join("templates")).unwrap();
        std::fs::write(
            dir.join("Chart.yaml"),
            format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n"),
        )
        .unwrap();
        for (file, text) in templates {
            std::fs::write(dir.join("templates").join(file), text).unwrap();
        }
        Scratch { root, dir }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn a_missing_chart_is_named() {
    let e = helm().render("/no/such/chart", "r", "ns", "").unwrap_err();
    assert!(
        matches!(&e, Error::Missing { what: "chart", path } if path == Path::new("/no/such/chart")),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "chart /no/such/chart does not exist");
    assert!(matches!(
        helm().lint("/no/such/chart", "", true),
        Err(Error::Missing { .. })
    ));
}

#[test]
fn a_folder_that_is_not_a_chart_does_not_load() {
    let dir = std::env::temp_dir().join(format!("ballast-helm-notachart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = helm().render(&dir, "r", "ns", "").unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    match e {
        Error::Chart(message) => assert!(message.contains("Chart.yaml"), "{message}"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn a_failing_template_is_named() {
    let s = Scratch::chart(
        "parse",
        &[("bad.yaml", "kind: {{ .Values.x | nosuchfunction }}\n")],
    );
    match helm().render(&s.dir, "r", "ns", "").unwrap_err() {
        Error::Render { template, message } => {
            assert_eq!(
                template.as_deref(),
                Some("parse/templates/bad.yaml"),
                "{message}"
            );
            assert!(message.contains("nosuchfunction"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    let s = Scratch::chart(
        "required",
        &[(
            "need.yaml",
            "name: {{ required \"name is required\" .Values.name }}\n",
        )],
    );
    match helm().render(&s.dir, "r", "ns", "").unwrap_err() {
        Error::Render { template, message } => {
            assert_eq!(template.as_deref(), Some("required/templates/need.yaml"));
            assert!(message.contains("name is required"), "{message}");
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn documents_are_split_numbered_and_checked() {
    let s = Scratch::chart(
        "split",
        &[
            (
                "many.yaml",
                "# leading comment only\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n\n---   \n# just a comment\n--- # a separator with a comment\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\ndata:\n  flag: yes\n  text: |\n    ---\n    not a separator\n",
            ),
            ("scalar.yaml", "just a string\n"),
            ("NOTES.txt", "Installed {{ .Release.Name }}.\n"),
            ("_helpers.tpl", "{{- define \"x\" }}x{{ end }}\n"),
        ],
    );
    let r = helm().render(&s.dir, "rel", "ns", "").unwrap();
    assert_eq!(r.notes, "Installed rel.\n");
    let where_: Vec<(&str, usize)> = r
        .documents
        .iter()
        .map(|d| (d.source.as_str(), d.index))
        .collect();
    assert_eq!(
        where_,
        [
            ("split/templates/many.yaml", 0),
            ("split/templates/many.yaml", 1),
            ("split/templates/scalar.yaml", 0),
        ]
    );
    let b = r.documents[1].parse().unwrap();
    assert_eq!(b["metadata"]["name"], "b");
    assert_eq!(b["data"]["flag"], true, "YAML 1.1, as Helm reads it");
    assert_eq!(b["data"]["text"], "---\nnot a separator\n");
    match r.documents[2].parse().unwrap_err() {
        Error::Document {
            template, index, ..
        } => assert_eq!(
            (template.as_str(), index),
            ("split/templates/scalar.yaml", 0)
        ),
        e => panic!("{e:?}"),
    }
    assert!(r.objects().is_err(), "one document is not an object");
    assert!(r.crds.is_empty());
    let printed = r.to_string();
    assert!(printed.starts_with("---\n# Source: split/templates/many.yaml\napiVersion: v1\n"));
}

/// A kubeconfig for an API server nobody listens on.
fn unreachable_kubeconfig(test: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "ballast-helm-unreachable-{}-{test}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    path
}

#[test]
fn an_unreachable_cluster_is_reported_as_such() {
    let kubeconfig = unreachable_kubeconfig("unreachable");
    let options = InstallOptions {
        wait: Wait::Ready,
        timeout: Some(std::time::Duration::from_secs(5)),
        ..InstallOptions::default()
    };
    let started = std::time::Instant::now();
    let e = helm()
        .install(
            &kubeconfig,
            chart_dir(),
            "ballast",
            "ballast-system",
            "",
            &options,
        )
        .unwrap_err();
    match &e {
        Error::Kube(message) => {
            assert!(message.contains("127.0.0.1:1"), "{message}");
            assert!(message.contains("connection refused"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    assert!(
        e.to_string().starts_with("the cluster is unreachable: "),
        "{e}"
    );
    assert!(
        started.elapsed().as_secs() < 30,
        "it fails at once, not after a wait"
    );
    let e = helm()
        .upgrade(
            &kubeconfig,
            chart_dir(),
            "ballast",
            "ballast-system",
            "",
            &UpgradeOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Kube(_)), "{e:?}");
    let e = helm()
        .uninstall(
            &kubeconfig,
            "ballast",
            "ballast-system",
            &UninstallOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Kube(_)), "{e:?}");
    let _ = std::fs::remove_file(kubeconfig);
}

#[test]
fn install_refuses_bad_input_before_the_cluster() {
    let kubeconfig = unreachable_kubeconfig("bad-input");
    let e = helm()
        .install(
            "/no/such/kubeconfig",
            chart_dir(),
            "ballast",
            "ns",
            "",
            &InstallOptions::default(),
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "kubeconfig /no/such/kubeconfig does not exist"
    );
    // Schema violations are reported as such, not as a failed connection.
    let e = helm()
        .install(
            &kubeconfig,
            chart_dir(),
            "ballast",
            "ns",
            "operator:\n  replicas: 0\n",
            &InstallOptions::default(),
        )
        .unwrap_err();
    match e {
        Error::Schema { violations, .. } => {
            assert_eq!(violations[0].path, "/operator/replicas")
        }
        e => panic!("{e:?}"),
    }
    let e = helm()
        .install(
            &kubeconfig,
            "/no/such/chart",
            "ballast",
            "ns",
            "",
            &InstallOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Missing { what: "chart", .. }), "{e:?}");
    let _ = std::fs::remove_file(kubeconfig);
}

#[test]
fn a_dry_run_install_returns_the_release_without_a_cluster() {
    let kubeconfig = unreachable_kubeconfig("dry-run");
    let release = helm()
        .install(
            &kubeconfig,
            chart_dir(),
            "dry",
            "ops",
            "operator:\n  replicas: 3\n",
            &InstallOptions {
                dry_run: true,
                ..InstallOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_file(kubeconfig);
    assert_eq!(
        (release.name.as_str(), release.namespace.as_str()),
        ("dry", "ops")
    );
    assert_eq!(release.revision, 1);
    assert_eq!(release.chart, "ballast");
    assert_eq!(release.chart_version, "0.1.0");
    assert!(
        release.manifest.contains("name: dry-ballast"),
        "{}",
        release.manifest
    );
    assert!(release.manifest.contains("replicas: 3"));
    assert!(
        release
            .notes
            .contains("kubectl -n ops rollout status deployment/dry-ballast")
    );
}
