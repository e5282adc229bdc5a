//! Within step 4: the gateway's objects of a service with `spec.gateway.enabled`, as plain
//! values (pure). The InferencePool (`inference.networking.k8s.io/v1`, named like the
//! service) selects the engine pods on their HTTP port and names the endpoint picker's
//! Service; the picker is `ballast gateway --pool NAME` in a Deployment of its own
//! (`NAME-epp`, with a Service and a PodDisruptionBudget), running as a ServiceAccount of
//! its own whose Role allows exactly what it reads: `list` and `watch` of pods and of
//! InferencePools in the service's namespace.
//!
//! The owner reference and labels come from step 4 (`build.rs`), which calls this; nothing
//! here imports a step.

use std::collections::BTreeMap;

use ballast_crds::inference_pool::{EndpointPickerRef, InferencePool, InferencePoolSpec, Port};
use ballast_crds::{EngineKind, InferenceService};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, GRPCAction, KeyToPath, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SeccompProfile, SecretVolumeSource, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use super::error::BuildError;
pub use super::names::picker_name;
use crate::labels;

/// The picker's ext_proc gRPC port, in its container and on its Service (the GIE's
/// conventional 9002).
pub const GRPC_PORT: i32 = 9002;
/// The picker's `/metrics` port.
pub const METRICS_PORT: i32 = 9090;
/// The annotation on the InferencePool holding a hash of the spec the operator last
/// applied: a live spec that differs while the hash matches was edited by someone else.
pub const POOL_SPEC_HASH: &str = "ballast.dev/spec-hash";
/// Non-root user of the picker container (the image's).
const RUN_AS_USER: i64 = 65532;

/// Where a picker of a service with `spec.auth` finds the API keys (the Secret's key as
/// the file [`SCRAPE_KEY_FILE`]): it sends the first on its scrapes of the engines.
pub const SCRAPE_KEY_DIR: &str = "/var/run/ballast/scrape-key";
/// The file name of the keys in [`SCRAPE_KEY_DIR`].
pub const SCRAPE_KEY_FILE: &str = "keys";

/// What the gateway of a service is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayObjects {
    /// The InferencePool, as the JSON that is applied (its CRD is not Ballast's).
    pub pool: Value,
    /// The picker's ServiceAccount.
    pub service_account: ServiceAccount,
    /// What it may read.
    pub role: Role,
    /// The Role granted to the ServiceAccount.
    pub role_binding: RoleBinding,
    /// The picker pods.
    pub deployment: Deployment,
    /// The Service the InferencePool's `endpointPickerRef` names.
    pub service: Service,
    /// At most one picker down at a time by voluntary disruption.
    pub pdb: PodDisruptionBudget,
}

/// Everything `objects` needs besides the resource.
#[derive(Debug, Clone)]
pub struct GatewayInput<'a> {
    /// The resource (with a name and namespace).
    pub isvc: &'a InferenceService,
    /// Its name.
    pub name: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// The reference that makes the resource own each object.
    pub owner: OwnerReference,
    /// The operator's `--engine-image`, used when `spec.gateway.image` is empty.
    pub default_image: &'a str,
}

/// The gateway's objects.
pub fn objects(input: &GatewayInput<'_>) -> Result<GatewayObjects, BuildError> {
    let g = &input.isvc.spec.gateway;
    let image = if !g.image.is_empty() {
        g.image.clone()
    } else if !input.default_image.is_empty() {
        input.default_image.to_string()
    } else {
        return Err(BuildError::NoGatewayImage);
    };
    let picker = picker_name(input.name);
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(input.namespace.to_string()),
        labels: Some(labels::picker_labels(input.name)),
        owner_references: Some(vec![input.owner.clone()]),
        ..ObjectMeta::default()
    };
    let selector = LabelSelector {
        match_labels: Some(labels::picker_selector_labels(input.name)),
        ..LabelSelector::default()
    };
    let (service_account, role, role_binding) = access(input, meta(&picker), &picker);
    Ok(GatewayObjects {
        pool: pool(input)?,
        service_account,
        role,
        role_binding,
        deployment: Deployment {
            metadata: meta(&picker),
            spec: Some(DeploymentSpec {
                replicas: Some(g.replicas),
                selector: selector.clone(),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels::picker_labels(input.name)),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(pod_spec(input, image, &picker)),
                },
                ..DeploymentSpec::default()
            }),
            status: None,
        },
        service: Service {
            metadata: meta(&picker),
            spec: Some(ServiceSpec {
                selector: Some(labels::picker_selector_labels(input.name)),
                ports: Some(vec![ServicePort {
                    name: Some("grpc".into()),
                    port: GRPC_PORT,
                    target_port: Some(IntOrString::String("grpc".into())),
                    protocol: Some("TCP".into()),
                    // Envoy's ext_proc stream is gRPC.
                    app_protocol: Some("kubernetes.io/h2c".into()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        },
        pdb: PodDisruptionBudget {
            metadata: meta(&picker),
            spec: Some(PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString::Int(1)),
                selector: Some(selector),
                ..PodDisruptionBudgetSpec::default()
            }),
            status: None,
        },
    })
}

/// The picker's own account: a ServiceAccount, and a Role (bound to it) that allows
/// exactly what it reads, `list` and `watch` of pods and InferencePools.
fn access(
    input: &GatewayInput<'_>,
    meta: ObjectMeta,
    picker: &str,
) -> (ServiceAccount, Role, RoleBinding) {
    (
        ServiceAccount {
            metadata: meta.clone(),
            // The picker reads the API with it; nothing else in its pods does.
            automount_service_account_token: Some(true),
            ..ServiceAccount::default()
        },
        Role {
            metadata: meta.clone(),
            rules: Some(vec![
                read_rule("", "pods"),
                read_rule("inference.networking.k8s.io", "inferencepools"),
            ]),
        },
        RoleBinding {
            metadata: meta,
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: picker.to_string(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: picker.to_string(),
                namespace: Some(input.namespace.to_string()),
                ..Subject::default()
            }]),
        },
    )
}

fn read_rule(group: &str, resource: &str) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: vec!["list".into(), "watch".into()],
        ..PolicyRule::default()
    }
}

/// The InferencePool: the engine pods' selector and HTTP port, the picker's Service.
fn pool(input: &GatewayInput<'_>) -> Result<Value, BuildError> {
    let spec = InferencePoolSpec {
        selector: ballast_crds::inference_pool::PoolSelector {
            match_labels: labels::selector_labels(input.name),
        },
        target_ports: vec![Port {
            number: input.isvc.spec.engine.port,
        }],
        app_protocol: None,
        endpoint_picker_ref: EndpointPickerRef {
            group: Some(String::new()),
            kind: Some("Service".into()),
            name: picker_name(input.name),
            port: Some(Port { number: GRPC_PORT }),
            failure_mode: Some(input.isvc.spec.gateway.failure_mode.as_str().into()),
        },
    };
    let mut pool = InferencePool::new(input.name, spec);
    let hash = spec_hash(&serde_json::to_value(&pool.spec).map_err(serialize)?);
    pool.metadata = ObjectMeta {
        name: Some(input.name.to_string()),
        namespace: Some(input.namespace.to_string()),
        labels: Some(labels::labels(input.name)),
        annotations: Some(BTreeMap::from([(POOL_SPEC_HASH.to_string(), hash)])),
        owner_references: Some(vec![input.owner.clone()]),
        ..ObjectMeta::default()
    };
    serde_json::to_value(&pool).map_err(serialize)
}

fn serialize(e: serde_json::Error) -> BuildError {
    BuildError::Unserializable(format!("the InferencePool: {e}"))
}

/// A stable hash (FNV-1a, 64 bits, hex) of a JSON value's text.
pub fn spec_hash(spec: &Value) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in spec.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Whether a live InferencePool was changed by someone else: its spec hash annotation is
/// the one the operator wrote for `desired`, yet its spec no longer holds `desired`'s.
pub fn edited_by_hand(
    live: &Value,
    desired: &Value,
    contains: impl Fn(&Value, &Value) -> bool,
) -> bool {
    let hash = |v: &Value| {
        v.pointer("/metadata/annotations")
            .and_then(|a| a.get(POOL_SPEC_HASH))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let same_hash = hash(live).is_some() && hash(live) == hash(desired);
    let spec = |v: &Value| v.get("spec").cloned().unwrap_or(Value::Null);
    same_hash && !contains(&spec(live), &spec(desired))
}

/// The dialect flag of the engines a pool holds.
fn dialect(kind: EngineKind) -> &'static str {
    match kind {
        EngineKind::Ballast => "ballast",
        EngineKind::Vllm => "vllm",
        EngineKind::Sglang => "sglang",
    }
}

/// `ballast gateway`'s arguments: the pool, the pod's addresses, the model, the dialect,
/// then the spec's own.
pub fn picker_args(isvc: &InferenceService, name: &str, namespace: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "gateway",
        "--pool",
        name,
        "--namespace",
        namespace,
        "--host",
        "0.0.0.0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--port".to_string(),
        GRPC_PORT.to_string(),
        "--metrics-port".to_string(),
        METRICS_PORT.to_string(),
        "--model-name".to_string(),
        isvc.served_name(),
        "--dialect".to_string(),
        dialect(isvc.spec.engine.kind).to_string(),
        "--metrics-path".to_string(),
        isvc.spec.metrics.path.clone(),
    ]);
    if isvc.spec.auth.is_some() {
        args.extend([
            "--scrape-key-file".to_string(),
            format!("{SCRAPE_KEY_DIR}/{SCRAPE_KEY_FILE}"),
        ]);
    }
    args.extend(isvc.spec.gateway.args.iter().cloned());
    args
}

fn grpc_probe(service: &str, period: i32, failures: i32) -> Probe {
    Probe {
        grpc: Some(GRPCAction {
            port: GRPC_PORT,
            service: Some(service.into()),
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

fn pod_spec(input: &GatewayInput<'_>, image: String, picker: &str) -> PodSpec {
    let g = &input.isvc.spec.gateway;
    let key = input.isvc.spec.auth.as_ref().map(|a| &a.api_key_secret_ref);
    let port = |name: &str, container_port: i32| ContainerPort {
        name: Some(name.into()),
        container_port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    };
    let container = Container {
        name: "gateway".into(),
        image: Some(image),
        args: Some(picker_args(input.isvc, input.name, input.namespace)),
        ports: Some(vec![port("grpc", GRPC_PORT), port("metrics", METRICS_PORT)]),
        resources: (g.resources != Default::default()).then(|| g.resources.clone()),
        // The health service names `ballast gateway` serves (lib.rs `LIVENESS`, `READINESS`).
        liveness_probe: Some(grpc_probe("liveness", 10, 3)),
        readiness_probe: Some(grpc_probe("readiness", 2, 2)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: key.is_some().then(|| {
            vec![VolumeMount {
                name: "scrape-key".into(),
                mount_path: SCRAPE_KEY_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            }]
        }),
        ..Container::default()
    };
    PodSpec {
        containers: vec![container],
        volumes: key.map(|r| {
            vec![Volume {
                name: "scrape-key".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(r.name.clone()),
                    items: Some(vec![KeyToPath {
                        key: r.key.clone(),
                        path: SCRAPE_KEY_FILE.into(),
                        ..KeyToPath::default()
                    }]),
                    // Readable by the picker (its group is the pod's fsGroup), by no one else.
                    default_mode: Some(0o440),
                    optional: Some(false),
                }),
                ..Volume::default()
            }]
        }),
        service_account_name: Some(picker.to_string()),
        // Its open streams finish within `--drain-seconds` (30) after SIGTERM.
        termination_grace_period_seconds: Some(40),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS_USER),
            run_as_group: Some(RUN_AS_USER),
            fs_group: key.is_some().then_some(RUN_AS_USER),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        ..PodSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isvc(yaml: &str) -> InferenceService {
        let mut s = ballast_crds::parse_yaml(yaml).unwrap().remove(0);
        s.metadata.uid = Some("u-1".into());
        s
    }

    fn input(isvc: &InferenceService) -> GatewayInput<'_> {
        GatewayInput {
            isvc,
            name: "chat",
            namespace: "ml",
            owner: OwnerReference {
                api_version: "ballast.dev/v1alpha1".into(),
                kind: "InferenceService".into(),
                name: "chat".into(),
                uid: "u-1".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
            default_image: "localhost/ballast:dev",
        }
    }

    const SPEC: &str = "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: chat, namespace: ml}\nspec:\n  model: {source: 'synthetic:tiny', servedName: smol}\n  engine: {port: 8080}\n  gateway: {enabled: true, replicas: 2, failureMode: FailOpen, args: [--queue-max, '8']}\n";

    #[test]
    fn with_api_keys_the_picker_scrapes_with_the_first_of_the_secrets() {
        let s = isvc(&format!(
            "{SPEC}  auth: {{apiKeySecretRef: {{name: chat-keys, key: tokens}}}}\n"
        ));
        let o = objects(&input(&s)).unwrap();
        let pod = o.deployment.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        let args = c.args.clone().unwrap();
        let at = args.iter().position(|a| a == "--scrape-key-file").unwrap();
        assert_eq!(args[at + 1], "/var/run/ballast/scrape-key/keys");
        let mount = &c.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (SCRAPE_KEY_DIR, Some(true))
        );
        let secret = pod.volumes.unwrap()[0].secret.clone().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("chat-keys"));
        let item = &secret.items.unwrap()[0];
        assert_eq!((item.key.as_str(), item.path.as_str()), ("tokens", "keys"));
        assert_eq!(pod.security_context.unwrap().fs_group, Some(RUN_AS_USER));
        // Without keys: no flag, no volume.
        let plain = objects(&input(&isvc(SPEC))).unwrap();
        let pod = plain.deployment.spec.unwrap().template.spec.unwrap();
        assert!(pod.volumes.is_none());
        assert!(
            !pod.containers[0]
                .args
                .as_ref()
                .unwrap()
                .iter()
                .any(|a| a == "--scrape-key-file")
        );
    }

    #[test]
    fn the_pool_selects_the_engine_pods_and_names_the_pickers_service() {
        let s = isvc(SPEC);
        let o = objects(&input(&s)).unwrap();
        let pool: InferencePool = serde_json::from_value(o.pool.clone()).unwrap();
        assert_eq!(o.pool["apiVersion"], "inference.networking.k8s.io/v1");
        assert_eq!(
            pool.spec.selector.match_labels,
            labels::selector_labels("chat")
        );
        assert_eq!(pool.spec.target_ports, [Port { number: 8080 }]);
        let r = &pool.spec.endpoint_picker_ref;
        assert_eq!(r.name, "chat-epp");
        assert_eq!(r.port, Some(Port { number: GRPC_PORT }));
        assert_eq!(r.failure_mode.as_deref(), Some("FailOpen"));
        assert_eq!(o.service.metadata.name.as_deref(), Some("chat-epp"));
        assert_eq!(
            o.service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port,
            GRPC_PORT
        );
        assert_eq!(
            pool.metadata.owner_references.unwrap()[0].uid,
            "u-1",
            "the pool goes with the service"
        );
    }

    #[test]
    fn picker_pods_are_never_engine_pods() {
        let s = isvc(SPEC);
        let o = objects(&input(&s)).unwrap();
        let template = o.deployment.spec.as_ref().unwrap().template.clone();
        let pod_labels = template.metadata.unwrap().labels.unwrap();
        let engine = labels::selector_labels("chat");
        assert!(
            !engine.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "the engine selector must not select picker pods: {pod_labels:?}"
        );
        let spec = template.spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("chat-epp"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("localhost/ballast:dev"));
        let args = c.args.clone().unwrap();
        let after = |flag: &str| {
            let i = args.iter().position(|a| a == flag).unwrap();
            args[i + 1].clone()
        };
        assert_eq!(args[0], "gateway");
        assert_eq!(after("--pool"), "chat");
        assert_eq!(after("--namespace"), "ml");
        assert_eq!(after("--model-name"), "smol");
        assert_eq!(after("--dialect"), "ballast");
        assert_eq!(
            &args[args.len() - 2..],
            ["--queue-max", "8"],
            "the spec's args last"
        );
        assert_eq!(o.deployment.spec.as_ref().unwrap().replicas, Some(2));
    }

    #[test]
    fn the_picker_may_only_list_and_watch_pods_and_pools() {
        let s = isvc(SPEC);
        let o = objects(&input(&s)).unwrap();
        let rules = o.role.rules.unwrap();
        let mut granted: Vec<(String, String, Vec<String>)> = rules
            .iter()
            .flat_map(|r| {
                let groups = r.api_groups.clone().unwrap_or_default();
                let resources = r.resources.clone().unwrap_or_default();
                groups.into_iter().flat_map(move |g| {
                    resources
                        .clone()
                        .into_iter()
                        .map(move |res| (g.clone(), res, r.verbs.clone()))
                })
            })
            .collect();
        granted.sort();
        let rw = |g: &str, r: &str| {
            (
                g.to_string(),
                r.to_string(),
                vec!["list".to_string(), "watch".to_string()],
            )
        };
        assert_eq!(
            granted,
            [
                rw("", "pods"),
                rw("inference.networking.k8s.io", "inferencepools")
            ]
        );
        assert_eq!(o.role_binding.role_ref.name, "chat-epp");
        assert_eq!(o.role_binding.subjects.unwrap()[0].name, "chat-epp");
    }

    #[test]
    fn without_any_image_the_gateway_cannot_be_built() {
        let s = isvc(SPEC);
        let mut i = input(&s);
        i.default_image = "";
        assert_eq!(objects(&i).unwrap_err(), BuildError::NoGatewayImage);
    }

    #[test]
    fn an_edit_by_hand_is_told_from_a_change_of_spec() {
        let s = isvc(SPEC);
        let desired = objects(&input(&s)).unwrap().pool;
        let same = |a: &Value, b: &Value| a == b;
        assert!(!edited_by_hand(&desired, &desired, same));
        let mut edited = desired.clone();
        edited["spec"]["targetPorts"][0]["number"] = 9999.into();
        assert!(edited_by_hand(&edited, &desired, same));
        // The spec changed (port 8000 now): a new hash, so not an edit by hand.
        let s2 = isvc(&SPEC.replace("port: 8080", "port: 8000"));
        let changed = objects(&input(&s2)).unwrap().pool;
        assert!(!edited_by_hand(&desired, &changed, same));
    }
}
