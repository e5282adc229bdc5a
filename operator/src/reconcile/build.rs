//! Step 4: the objects an InferenceService implies, as plain values: a Deployment of engine
//! pods, a Service, a PodDisruptionBudget and (when the Prometheus Operator is installed) a
//! ServiceMonitor. Pure: no client, no clock, so every field is table-tested.
//!
//! Each object carries only the fields the operator owns: they are applied with server-side
//! apply under one field manager, and compared with the live object field by field (step
//! 5), so what the API server defaults is never fought over.

use ballast_crds::{EngineKind, InferenceService, MODEL_MOUNT_PATH};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, HostPathVolumeSource, KeyToPath, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, PodReadinessGate, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext,
    Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

pub use super::error::BuildError;
use super::gateway::{GatewayInput, GatewayObjects};
use super::names::ACCEPTING_CONDITION;
use super::plan::Plan;
use crate::engine_args::{self, Listen};
use crate::labels;

/// The shutdown delay of Ballast engine pods ([`SHUTDOWN_DELAY_ENV`]): how long after
/// SIGTERM the engine keeps serving new requests (each with `Connection: close`) before it
/// drains. Long enough for the pod's removal from its Service's endpoints to reach
/// kube-proxy on every node (about a second on a healthy cluster) with room for a busy one.
pub const ENGINE_SHUTDOWN_DELAY_SECONDS: u32 = 5;

/// The variable `ballast engine --shutdown-delay` reads. The operator sets it rather than
/// the flag: an engine image older than the flag ignores it instead of refusing to start,
/// and `--shutdown-delay` in `spec.engine.args` (or the variable in `spec.engine.env`)
/// still wins, with no flag given twice.
pub const SHUTDOWN_DELAY_ENV: &str = "BALLAST_SHUTDOWN_DELAY";

/// The variable `ballast engine --drain-timeout` reads (not set by the operator).
pub const DRAIN_TIMEOUT_ENV: &str = "BALLAST_DRAIN_TIMEOUT";

/// `ballast engine --drain-timeout`'s default: how long in-flight requests may run after
/// the shutdown delay before they are aborted.
pub const ENGINE_DRAIN_TIMEOUT_SECONDS: u32 = 600;

/// Time for the engine to close its connections and exit after the drain.
pub const EXIT_MARGIN_SECONDS: u32 = 30;

/// The pods' termination grace period with the operator's shutdown delay and the engine's
/// default drain limit, plus a margin to exit, so Kubernetes never kills a replica that is
/// still finishing what it accepted. (`spec.engine.args` or `env` that set longer ones get
/// a longer period, see [`termination_grace_seconds`].)
pub const TERMINATION_GRACE_SECONDS: i64 =
    (ENGINE_SHUTDOWN_DELAY_SECONDS + ENGINE_DRAIN_TIMEOUT_SECONDS + EXIT_MARGIN_SECONDS) as i64;

/// The variable `ballast engine --control-token-file` reads. Set (rather than the flag)
/// for the same reason as [`SHUTDOWN_DELAY_ENV`].
pub const CONTROL_TOKEN_FILE_ENV: &str = "BALLAST_CONTROL_TOKEN_FILE";

/// Where engine pods mount their service's control-token Secret (the token and the
/// control API's serving pair; never the CA key).
pub const CONTROL_TOKEN_DIR: &str = "/var/run/ballast/control";

pub use super::names::{CONTROL_TLS_CERT_ENV, CONTROL_TLS_KEY_ENV};

/// The variable `ballast engine --api-key-file` reads.
pub const API_KEY_FILE_ENV: &str = "BALLAST_API_KEY_FILE";

/// Where Ballast engine pods mount the key of `spec.auth.apiKeySecretRef`, as the file
/// [`API_KEY_FILE_NAME`]: a directory mount, so the kubelet's refresh of a changed Secret
/// reaches the engine, which re-reads the file.
pub const API_KEY_DIR: &str = "/var/run/ballast/api-key";

/// The file name of the key in [`API_KEY_DIR`], whatever the Secret's key is called.
pub const API_KEY_FILE_NAME: &str = "keys";

/// The variable vLLM reads its API key from.
pub const VLLM_API_KEY_ENV: &str = "VLLM_API_KEY";

/// The variable the operator sets for SGLang, whose `--api-key $(SGLANG_API_KEY)` the
/// kubelet expands (SGLang reads its key from the flag only).
pub const SGLANG_API_KEY_ENV: &str = "SGLANG_API_KEY";

/// Whether the service's engines run a control API the operator calls (a Ballast engine
/// with a `grpcPort`), and so get a control token ([`super::token`]).
pub fn uses_control_token(isvc: &InferenceService) -> bool {
    let e = &isvc.spec.engine;
    e.kind == EngineKind::Ballast && e.grpc_port > 0
}

/// Non-root user the engine container runs as.
pub const RUN_AS_USER: i64 = 65532;

/// Everything `build` needs besides the resource.
#[derive(Debug, Clone)]
pub struct BuildInput<'a> {
    /// The resource.
    pub isvc: &'a InferenceService,
    /// The replica count to run.
    pub replicas: i32,
    /// Image for `kind: ballast` when `spec.engine.image` is empty (the operator's
    /// `--engine-image`).
    pub default_image: &'a str,
    /// Whether the ServiceMonitor CRD (monitoring.coreos.com/v1) is installed.
    pub service_monitor_crd: bool,
    /// Whether the InferencePool CRD (inference.networking.k8s.io/v1) is installed.
    pub inference_pool_crd: bool,
}

/// What the spec implies.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// The engine pods.
    pub deployment: Deployment,
    /// Their Service.
    pub service: Service,
    /// At most one pod down at a time by voluntary disruption.
    pub pdb: PodDisruptionBudget,
    /// A ServiceMonitor, when its CRD is installed.
    pub service_monitor: Option<Value>,
    /// The gateway, when `spec.gateway.enabled` and the InferencePool CRD is installed.
    pub gateway: Option<GatewayObjects>,
}

fn kind_word(kind: EngineKind) -> &'static str {
    match kind {
        EngineKind::Ballast => "ballast",
        EngineKind::Vllm => "vllm",
        EngineKind::Sglang => "sglang",
    }
}

/// The owner reference that makes the resource own (and garbage-collect) an object.
pub fn owner_reference(isvc: &InferenceService) -> Result<OwnerReference, BuildError> {
    Ok(OwnerReference {
        api_version: "ballast.dev/v1alpha1".into(),
        kind: "InferenceService".into(),
        name: name(isvc)?,
        uid: isvc
            .metadata
            .uid
            .clone()
            .ok_or(BuildError::Incomplete("uid"))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// The resource's name.
fn name(isvc: &InferenceService) -> Result<String, BuildError> {
    isvc.metadata
        .name
        .clone()
        .ok_or(BuildError::Incomplete("name"))
}

fn meta(isvc: &InferenceService) -> Result<ObjectMeta, BuildError> {
    let name = name(isvc)?;
    Ok(ObjectMeta {
        labels: Some(labels::labels(&name)),
        namespace: Some(
            isvc.metadata
                .namespace
                .clone()
                .ok_or(BuildError::Incomplete("namespace"))?,
        ),
        owner_references: Some(vec![owner_reference(isvc)?]),
        name: Some(name),
        ..ObjectMeta::default()
    })
}

/// Step 4's output: the plan and the objects it implies.
#[derive(Debug)]
pub struct Built<'a> {
    /// Step 3's plan.
    pub plan: Plan<'a>,
    /// The objects to hold.
    pub objects: Desired,
}

/// Step 4: the objects of `plan` (its replica count), with `default_image` for ballast
/// engines whose spec names none.
pub fn objects<'a>(plan: Plan<'a>, default_image: &str) -> Result<Built<'a>, BuildError> {
    let objects = build(&BuildInput {
        isvc: plan.isvc,
        // Advising writes no size: the Deployment keeps the one it runs.
        replicas: if plan.advising.is_some() {
            plan.current
        } else {
            plan.wanted.replicas
        },
        default_image,
        service_monitor_crd: plan.snapshot.service_monitor.installed(),
        inference_pool_crd: plan.snapshot.gateway.pool.installed(),
    })?;
    Ok(Built { plan, objects })
}

/// Every object the spec implies.
pub fn build(input: &BuildInput<'_>) -> Result<Desired, BuildError> {
    Ok(Desired {
        deployment: deployment(input)?,
        service: service(input.isvc)?,
        pdb: pdb(input.isvc)?,
        service_monitor: if input.service_monitor_crd {
            Some(service_monitor(input.isvc)?)
        } else {
            None
        },
        gateway: if input.isvc.spec.gateway.enabled && input.inference_pool_crd {
            let meta = meta(input.isvc)?;
            Some(super::gateway::objects(&GatewayInput {
                isvc: input.isvc,
                name: meta.name.as_deref().unwrap_or_default(),
                namespace: meta.namespace.as_deref().unwrap_or_default(),
                owner: owner_reference(input.isvc)?,
                default_image: input.default_image,
            })?)
        } else {
            None
        },
    })
}

fn http_get(port: &str) -> Option<HTTPGetAction> {
    Some(HTTPGetAction {
        path: Some("/health".into()),
        port: IntOrString::String(port.into()),
        ..HTTPGetAction::default()
    })
}

/// The engine Deployment: the image, the command and its ports, the environment, the
/// volumes, the container, the pod, in that order.
pub fn deployment(input: &BuildInput<'_>) -> Result<Deployment, BuildError> {
    let isvc = input.isvc;
    let e = &isvc.spec.engine;
    let name = name(isvc)?;
    let image = engine_image(input)?;
    let grpc_port = if e.kind == EngineKind::Ballast {
        e.grpc_port
    } else {
        0
    };
    let mut cmd = engine_args::command(
        isvc,
        Listen {
            host: "$(POD_IP)",
            port: e.port,
            grpc_port,
        },
    );
    let models = model_volume(isvc);
    let control_token = uses_control_token(isvc);
    let env = engine_env(isvc, &mut cmd, models.is_some(), control_token);
    let termination_grace = termination_grace_seconds(e.kind, &cmd.args, &env);
    let (volume_mounts, volumes) = engine_volumes(isvc, &name, models, control_token);
    let container = Container {
        name: "engine".into(),
        image: Some(image),
        command: cmd.command,
        args: Some(cmd.args),
        env: Some(env),
        ports: Some(container_ports(e.port, grpc_port)),
        resources: (e.resources != Default::default()).then(|| e.resources.clone()),
        volume_mounts: Some(volume_mounts),
        ..locked_down_container()
    };
    let pod = pod_spec(container, termination_grace, volumes);
    Ok(Deployment {
        metadata: meta(isvc)?,
        spec: Some(DeploymentSpec {
            replicas: Some(input.replicas.max(0)),
            selector: LabelSelector {
                match_labels: Some(labels::selector_labels(&name)),
                ..LabelSelector::default()
            },
            // Capacity never dips during a rollout: a new pod first, then an old one goes.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(k8s_openapi::api::apps::v1::RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels::labels(&name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

/// The engine's image: the spec's, else (Ballast engines only) the operator's default.
fn engine_image(input: &BuildInput<'_>) -> Result<String, BuildError> {
    let e = &input.isvc.spec.engine;
    match (e.image.is_empty(), e.kind) {
        (false, _) => Ok(e.image.clone()),
        (true, EngineKind::Ballast) if !input.default_image.is_empty() => {
            Ok(input.default_image.to_string())
        }
        (true, kind) => Err(BuildError::NoImage(kind_word(kind))),
    }
}

/// The named ports: `http`, and `grpc` when the control API is on.
fn container_ports(port: i32, grpc_port: i32) -> Vec<ContainerPort> {
    let named = |name: &str, container_port: i32| ContainerPort {
        name: Some(name.into()),
        container_port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    };
    let mut ports = vec![named("http", port)];
    if grpc_port > 0 {
        ports.push(named("grpc", grpc_port));
    }
    ports
}

/// A variable with a plain value.
fn var(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// The engine's environment: what the operator sets (the pod IP, a writable home, the
/// model cache, the shutdown delay, the control token and TLS pair, the API key), then the
/// spec's `engine.env`, whose variables win (the operator sets none the user set). The
/// SGLang API key also adds an argument to `cmd`.
fn engine_env(
    isvc: &InferenceService,
    cmd: &mut engine_args::EngineCommand,
    models: bool,
    control_token: bool,
) -> Vec<EnvVar> {
    let e = &isvc.spec.engine;
    let user_sets = |name: &str| e.env.iter().any(|v| v.name == name);
    // POD_IP first: `$(POD_IP)` in the arguments is expanded from it. HOME and the cache
    // go to the writable /tmp volume, since the root filesystem is read-only.
    let mut env = vec![
        EnvVar {
            name: "POD_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        var("HOME", "/tmp"),
        var("XDG_CACHE_HOME", "/tmp/.cache"),
    ];
    // The engine resolves known model names in its cache.
    if models && !user_sets(MODEL_CACHE_ENV) {
        env.push(var(MODEL_CACHE_ENV, MODEL_MOUNT_PATH));
    }
    if e.kind == EngineKind::Ballast && !user_sets(SHUTDOWN_DELAY_ENV) {
        env.push(var(
            SHUTDOWN_DELAY_ENV,
            ENGINE_SHUTDOWN_DELAY_SECONDS.to_string(),
        ));
    }
    if control_token {
        // The token, and the control API over TLS with the pair of the same Secret; TLS
        // is on only with both of the pair's variables the operator's.
        let tls_own = user_sets(CONTROL_TLS_CERT_ENV) || user_sets(CONTROL_TLS_KEY_ENV);
        let mut vars = vec![(CONTROL_TOKEN_FILE_ENV, super::token::TOKEN_KEY)];
        if !tls_own {
            vars.push((CONTROL_TLS_CERT_ENV, "tls.crt"));
            vars.push((CONTROL_TLS_KEY_ENV, "tls.key"));
        }
        for (name, file) in vars {
            if !user_sets(name) {
                env.push(var(name, format!("{CONTROL_TOKEN_DIR}/{file}")));
            }
        }
    }
    api_key_env(isvc, cmd, &mut env);
    env.extend(e.env.iter().cloned());
    env
}

/// Where each engine kind takes `spec.auth`'s key: a Ballast engine a file from the
/// mounted Secret, vLLM a variable, SGLang a variable passed as `--api-key`.
fn api_key_env(
    isvc: &InferenceService,
    cmd: &mut engine_args::EngineCommand,
    env: &mut Vec<EnvVar>,
) {
    let e = &isvc.spec.engine;
    let Some(key) = isvc.spec.auth.as_ref().map(|a| &a.api_key_secret_ref) else {
        return;
    };
    let user_sets = |name: &str| e.env.iter().any(|v| v.name == name);
    let from_secret = |name: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: key.name.clone(),
                key: key.key.clone(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    match e.kind {
        EngineKind::Ballast if !user_sets(API_KEY_FILE_ENV) => {
            env.push(var(
                API_KEY_FILE_ENV,
                format!("{API_KEY_DIR}/{API_KEY_FILE_NAME}"),
            ));
        }
        EngineKind::Vllm if !user_sets(VLLM_API_KEY_ENV) => env.push(from_secret(VLLM_API_KEY_ENV)),
        EngineKind::Sglang if !user_sets(SGLANG_API_KEY_ENV) => {
            env.push(from_secret(SGLANG_API_KEY_ENV));
            cmd.args.push("--api-key".into());
            cmd.args.push(format!("$({SGLANG_API_KEY_ENV})"));
        }
        _ => {}
    }
}

/// The volumes and their mounts: a writable /tmp, the models (read-only), the control
/// token with the serving pair (never the CA key), and a Ballast engine's API key.
fn engine_volumes(
    isvc: &InferenceService,
    name: &str,
    models: Option<Volume>,
    control_token: bool,
) -> (Vec<VolumeMount>, Vec<Volume>) {
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let mut mounts = vec![mount("tmp", "/tmp", false)];
    let mut volumes = vec![Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }];
    if let Some(models) = models {
        mounts.push(mount(&models.name, MODEL_MOUNT_PATH, true));
        volumes.push(models);
    }
    let files = |items: Vec<(String, String)>| {
        Some(
            items
                .into_iter()
                .map(|(key, path)| KeyToPath {
                    key,
                    path,
                    ..KeyToPath::default()
                })
                .collect(),
        )
    };
    if control_token {
        mounts.push(mount("control-token", CONTROL_TOKEN_DIR, true));
        volumes.push(Volume {
            name: "control-token".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(super::token::secret_name(name)),
                // The token and the serving pair only: the CA key stays in the Secret.
                items: files(
                    [super::token::TOKEN_KEY, "tls.crt", "tls.key"]
                        .into_iter()
                        .map(|k| (k.to_string(), k.to_string()))
                        .collect(),
                ),
                // Readable by the engine (its group is the pod's fsGroup), by no one else.
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let api_key = isvc.spec.auth.as_ref().map(|a| &a.api_key_secret_ref);
    if let Some(r) = api_key.filter(|_| isvc.spec.engine.kind == EngineKind::Ballast) {
        mounts.push(mount("api-key", API_KEY_DIR, true));
        volumes.push(Volume {
            name: "api-key".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(r.name.clone()),
                items: files(vec![(r.key.clone(), API_KEY_FILE_NAME.to_string())]),
                default_mode: Some(0o440),
                optional: Some(false),
            }),
            ..Volume::default()
        });
    }
    (mounts, volumes)
}

/// What every engine container has, whatever it runs: the probes, a locked-down security
/// context, and the end of its log as the termination message.
fn locked_down_container() -> Container {
    Container {
        // Loading a model can take minutes: the startup probe allows 30 of them, then
        // readiness and liveness take over.
        startup_probe: Some(Probe {
            http_get: http_get("http"),
            period_seconds: Some(2),
            failure_threshold: Some(900),
            ..Probe::default()
        }),
        readiness_probe: Some(Probe {
            http_get: http_get("http"),
            period_seconds: Some(2),
            failure_threshold: Some(2),
            ..Probe::default()
        }),
        liveness_probe: Some(Probe {
            http_get: http_get("http"),
            period_seconds: Some(10),
            timeout_seconds: Some(5),
            failure_threshold: Some(6),
            ..Probe::default()
        }),
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
        // An engine that exits with an error says why on stderr; with this the kubelet
        // keeps the end of that log as the termination message, which the operator quotes
        // in the Degraded condition of a crash loop.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Container::default()
    }
}

/// The pod: the container behind the readiness gate, no ServiceAccount token, a
/// non-root user and the runtime's seccomp profile.
fn pod_spec(container: Container, termination_grace: i64, volumes: Vec<Volume>) -> PodSpec {
    PodSpec {
        containers: vec![container],
        readiness_gates: Some(vec![PodReadinessGate {
            condition_type: ACCEPTING_CONDITION.into(),
        }]),
        termination_grace_period_seconds: Some(termination_grace),
        // Engines never call the API server: no ServiceAccount token in their pods.
        automount_service_account_token: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS_USER),
            run_as_group: Some(RUN_AS_USER),
            fs_group: Some(RUN_AS_USER),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        volumes: Some(volumes),
        ..PodSpec::default()
    }
}

/// The termination grace period for a pod running `args` with `env`: for a Ballast
/// engine its shutdown delay plus drain timeout, as the engine will read them (the flag in
/// `args`, else the variable in `env`, else the default), plus [`EXIT_MARGIN_SECONDS`];
/// for other engines, whose shutdown the operator does not configure,
/// [`TERMINATION_GRACE_SECONDS`].
pub fn termination_grace_seconds(kind: EngineKind, args: &[String], env: &[EnvVar]) -> i64 {
    if kind != EngineKind::Ballast {
        return TERMINATION_GRACE_SECONDS;
    }
    let seconds = |flag: &str, var: &str, default: u32| {
        let from_env = || {
            env.iter()
                .rev()
                .find(|v| v.name == var)
                .and_then(|v| v.value.as_deref())
        };
        last_flag_value(args, flag)
            .or_else(from_env)
            .and_then(|v| v.trim().parse::<f64>().ok())
            // A value the engine refuses fails the pod at start; nothing to cover then.
            // (A variable from a Secret or ConfigMap is unknown here: the default.)
            .filter(|v| v.is_finite() && *v >= 0.0)
            .unwrap_or(f64::from(default))
    };
    let total = seconds(
        "--shutdown-delay",
        SHUTDOWN_DELAY_ENV,
        ENGINE_SHUTDOWN_DELAY_SECONDS,
    ) + seconds(
        "--drain-timeout",
        DRAIN_TIMEOUT_ENV,
        ENGINE_DRAIN_TIMEOUT_SECONDS,
    ) + f64::from(EXIT_MARGIN_SECONDS);
    // Kubernetes takes whole seconds in an int64; anything near that bound is absurd, and
    // the cast saturates rather than wraps.
    total.ceil() as i64
}

/// The value the last `--flag V` or `--flag=V` in `args` gives, if any.
fn last_flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut found = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == flag {
            found = args.get(i + 1).map(String::as_str);
            i += 1;
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v);
        }
        i += 1;
    }
    found
}

/// The variable the Ballast engine reads its model cache directory from.
pub const MODEL_CACHE_ENV: &str = "BALLAST_MODEL_CACHE";

/// The `models` volume `spec.model.volume` names, read-only, or `None` without one. The
/// spec was validated first (exactly one source); should both be set anyway, the claim wins.
fn model_volume(isvc: &InferenceService) -> Option<Volume> {
    let v = isvc.spec.model.volume.as_ref()?;
    let mut volume = Volume {
        name: "models".into(),
        ..Volume::default()
    };
    if let Some(claim) = &v.persistent_volume_claim {
        volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.clone(),
            read_only: Some(true),
        });
    } else if let Some(path) = &v.host_path {
        volume.host_path = Some(HostPathVolumeSource {
            path: path.clone(),
            // Must exist: a typo fails the pod with a clear event instead of mounting a
            // new empty directory.
            type_: Some("Directory".into()),
        });
    } else {
        return None;
    }
    Some(volume)
}

/// The Service in front of the pods (its endpoints are the pods whose accepting gate is
/// True). It publishes the OpenAI port only: the control API is the operator's, which
/// dials each pod on its IP, and has no business behind a load-balanced name.
pub fn service(isvc: &InferenceService) -> Result<Service, BuildError> {
    let e = &isvc.spec.engine;
    let name = name(isvc)?;
    let ports = vec![ServicePort {
        name: Some("http".into()),
        port: e.port,
        target_port: Some(IntOrString::String("http".into())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }];
    Ok(Service {
        metadata: meta(isvc)?,
        spec: Some(ServiceSpec {
            selector: Some(labels::selector_labels(&name)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// At most one pod unavailable through voluntary disruptions (drains, upgrades).
pub fn pdb(isvc: &InferenceService) -> Result<PodDisruptionBudget, BuildError> {
    let name = name(isvc)?;
    Ok(PodDisruptionBudget {
        metadata: meta(isvc)?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(labels::selector_labels(&name)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

/// A `monitoring.coreos.com/v1` ServiceMonitor scraping the engines' metrics at the spec's
/// interval.
pub fn service_monitor(isvc: &InferenceService) -> Result<Value, BuildError> {
    let meta = meta(isvc)?;
    let name = meta.name.clone().unwrap_or_default();
    let m = &isvc.spec.metrics;
    Ok(json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": labels::selector_labels(&name)},
            "endpoints": [{
                "port": "http",
                "path": m.path,
                "interval": format!("{}s", m.scrape_interval_seconds),
                "scrapeTimeout": format!("{}s", m.scrape_timeout_seconds),
            }],
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isvc(engine: &str) -> InferenceService {
        let mut i = ballast_crds::parse_yaml(&format!(
            r#"
apiVersion: ballast.dev/v1alpha1
kind: InferenceService
metadata: {{name: chat, namespace: prod}}
spec:
  model: {{source: "synthetic:small"}}
  engine: {engine}
  metrics: {{scrapeIntervalSeconds: 3, scrapeTimeoutSeconds: 2}}
"#
        ))
        .unwrap()
        .remove(0);
        i.metadata.uid = Some("uid-1".into());
        i
    }

    fn input(i: &InferenceService) -> BuildInput<'_> {
        BuildInput {
            isvc: i,
            replicas: 3,
            default_image: "ballast:dev",
            service_monitor_crd: false,
            inference_pool_crd: false,
        }
    }

    fn container(d: &Deployment) -> &Container {
        &d.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
    }

    #[test]
    fn the_deployment_runs_the_engine_the_spec_implies() {
        let i = isvc("{maxNumSeqs: 8}");
        let d = deployment(&input(&i)).unwrap();
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(
            spec.selector.match_labels.as_ref(),
            Some(&labels::selector_labels("chat"))
        );
        let meta = &d.metadata;
        assert_eq!(meta.namespace.as_deref(), Some("prod"));
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("InferenceService", "uid-1", Some(true))
        );
        let c = container(&d);
        assert_eq!(c.image.as_deref(), Some("ballast:dev"), "the default image");
        assert_eq!(c.command.as_deref(), Some(&["ballast".to_string()][..]));
        let args = c.args.as_ref().unwrap();
        let at = |flag: &str| args[args.iter().position(|a| a == flag).unwrap() + 1].clone();
        assert_eq!(args[0], "engine");
        assert_eq!(at("--host"), "$(POD_IP)");
        assert_eq!(at("--port"), "8000");
        assert_eq!(at("--grpc-port"), "9000");
        assert_eq!(at("--max-num-seqs"), "8");
        let env = c.env.as_ref().unwrap();
        assert_eq!(env[0].name, "POD_IP", "declared before the args use it");
        assert_eq!(
            env[0]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "status.podIP"
        );
        let ports: Vec<(&str, i32)> = c
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.name.as_deref().unwrap(), p.container_port))
            .collect();
        assert_eq!(ports, [("http", 8000), ("grpc", 9000)]);
        for probe in [&c.startup_probe, &c.readiness_probe, &c.liveness_probe] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some("/health"));
        }
    }

    #[test]
    fn a_control_api_gets_the_services_token_and_no_service_port() {
        let i = isvc("{}");
        let d = deployment(&input(&i)).unwrap();
        let c = container(&d);
        assert_eq!(
            env_value(c, CONTROL_TOKEN_FILE_ENV),
            [Some("/var/run/ballast/control/token")]
        );
        let mount = mount(c, "control-token").expect("the token is mounted");
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (CONTROL_TOKEN_DIR, Some(true))
        );
        let volume = volume(&d, "control-token").unwrap();
        let secret = volume.secret.as_ref().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("chat-control-token"));
        assert_eq!(secret.default_mode, Some(0o440));
        // The token and the serving pair, never the CA key; the engine serves TLS with it.
        let items: Vec<&str> = secret
            .items
            .as_ref()
            .unwrap()
            .iter()
            .map(|k| k.key.as_str())
            .collect();
        assert_eq!(items, ["token", "tls.crt", "tls.key"]);
        let c = container(&d);
        assert_eq!(
            env_value(c, CONTROL_TLS_CERT_ENV),
            [Some("/var/run/ballast/control/tls.crt")]
        );
        assert_eq!(
            env_value(c, CONTROL_TLS_KEY_ENV),
            [Some("/var/run/ballast/control/tls.key")]
        );
        // A pair of the user's own: theirs, and neither of ours.
        let own_tls = isvc(
            "{env: [{name: BALLAST_CONTROL_TLS_CERT, value: /etc/c}, {name: BALLAST_CONTROL_TLS_KEY, value: /etc/k}]}",
        );
        let d2 = deployment(&input(&own_tls)).unwrap();
        assert_eq!(
            env_value(container(&d2), CONTROL_TLS_CERT_ENV),
            [Some("/etc/c")]
        );
        assert_eq!(
            env_value(container(&d2), CONTROL_TLS_KEY_ENV),
            [Some("/etc/k")]
        );
        // The Service publishes the OpenAI port only: the operator dials pods directly.
        let ports = service(&i).unwrap().spec.unwrap().ports.unwrap();
        let names: Vec<_> = ports.iter().map(|p| p.name.as_deref().unwrap()).collect();
        assert_eq!(names, ["http"]);
        // A user's own variable wins and is not repeated; without a control API, no token.
        let own = isvc("{env: [{name: BALLAST_CONTROL_TOKEN_FILE, value: /etc/mine}]}");
        let d = deployment(&input(&own)).unwrap();
        assert_eq!(
            env_value(container(&d), CONTROL_TOKEN_FILE_ENV),
            [Some("/etc/mine")]
        );
        for spec in [
            "{grpcPort: 0}",
            "{kind: vllm, image: 'vllm/vllm-openai:v0.11.0'}",
        ] {
            let i = isvc(spec);
            assert!(!uses_control_token(&i), "{spec}");
            let d = deployment(&input(&i)).unwrap();
            assert!(
                env_value(container(&d), CONTROL_TOKEN_FILE_ENV).is_empty(),
                "{spec}"
            );
            assert!(
                env_value(container(&d), CONTROL_TLS_CERT_ENV).is_empty(),
                "{spec}"
            );
            assert!(
                pod(&d)
                    .volumes
                    .as_ref()
                    .unwrap()
                    .iter()
                    .all(|v| v.name != "control-token")
            );
        }
    }

    #[test]
    fn pods_are_locked_down_and_gated() {
        let i = isvc("{}");
        let d = deployment(&input(&i)).unwrap();
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let sc = container(&d).security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        assert_eq!(
            pod.security_context.as_ref().unwrap().run_as_user,
            Some(RUN_AS_USER)
        );
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(
            pod.readiness_gates.as_ref().unwrap()[0].condition_type,
            ACCEPTING_CONDITION
        );
        assert_eq!(
            pod.termination_grace_period_seconds,
            Some(5 + 600 + 30),
            "covers the engine's shutdown delay and drain, with a margin"
        );
        let mounts = container(&d).volume_mounts.as_ref().unwrap();
        assert_eq!(mounts[0].mount_path, "/tmp", "a writable /tmp");
        assert_eq!(
            container(&d).termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError"),
            "a crash loop's status can quote the engine's last words"
        );
    }

    fn pod(d: &Deployment) -> &PodSpec {
        d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn model_isvc(model: &str, engine: &str) -> InferenceService {
        let mut i = isvc(engine);
        i.spec.model = serde_json::from_str::<Value>(model)
            .and_then(serde_json::from_value)
            .unwrap();
        i
    }

    fn env_value<'a>(c: &'a Container, name: &str) -> Vec<Option<&'a str>> {
        c.env
            .as_ref()
            .unwrap()
            .iter()
            .filter(|v| v.name == name)
            .map(|v| v.value.as_deref())
            .collect()
    }

    fn with_auth(engine: &str) -> InferenceService {
        let mut i = isvc(engine);
        i.spec.auth = Some(ballast_crds::AuthSpec {
            api_key_secret_ref: ballast_crds::SecretKeyRef {
                name: "llm-keys".into(),
                key: "api-key".into(),
            },
        });
        i
    }

    fn mount<'a>(c: &'a Container, name: &str) -> Option<&'a VolumeMount> {
        c.volume_mounts.as_ref()?.iter().find(|m| m.name == name)
    }

    fn volume<'a>(d: &'a Deployment, name: &str) -> Option<&'a Volume> {
        pod(d).volumes.as_ref()?.iter().find(|v| v.name == name)
    }

    fn secret_ref<'a>(c: &'a Container, name: &str) -> Option<&'a SecretKeySelector> {
        let v = c.env.as_ref()?.iter().find(|v| v.name == name)?;
        v.value_from.as_ref()?.secret_key_ref.as_ref()
    }

    #[test]
    fn api_keys_reach_each_engine_the_way_it_reads_them() {
        // Ballast: the Secret's key as a file in a directory mount (so a change reaches the
        // engine), pointed at by the variable `--api-key-file` reads.
        let i = with_auth("{}");
        let d = deployment(&input(&i)).unwrap();
        let c = container(&d);
        assert_eq!(
            env_value(c, API_KEY_FILE_ENV),
            [Some("/var/run/ballast/api-key/keys")]
        );
        let mount = mount(c, "api-key").expect("the keys are mounted");
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only, &mount.sub_path),
            (API_KEY_DIR, Some(true), &None)
        );
        let volume = volume(&d, "api-key")
            .and_then(|v| v.secret.as_ref())
            .unwrap();
        assert_eq!(volume.secret_name.as_deref(), Some("llm-keys"));
        let items = volume.items.as_ref().unwrap();
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("api-key", API_KEY_FILE_NAME)
        );
        assert_eq!(volume.default_mode, Some(0o440));
        assert!(secret_ref(c, VLLM_API_KEY_ENV).is_none());

        // vLLM: its variable, from the Secret.
        let v = with_auth("{kind: vllm, image: v}");
        let d = deployment(&input(&v)).unwrap();
        let c = container(&d);
        let r = secret_ref(c, VLLM_API_KEY_ENV).unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("llm-keys", "api-key"));
        assert!(env_value(c, API_KEY_FILE_ENV).is_empty());
        assert!(
            pod(&d)
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .all(|v| v.name != "api-key")
        );

        // SGLang: a variable the kubelet expands into its flag.
        let g = with_auth("{kind: sglang, image: s}");
        let d = deployment(&input(&g)).unwrap();
        let c = container(&d);
        assert!(secret_ref(c, SGLANG_API_KEY_ENV).is_some());
        let args = c.args.as_ref().unwrap();
        let at = args.iter().position(|a| a == "--api-key").unwrap();
        assert_eq!(args[at + 1], "$(SGLANG_API_KEY)");

        // Without spec.auth none of it; a user's own variable wins and is not repeated.
        for engine in ["{}", "{kind: vllm, image: v}", "{kind: sglang, image: s}"] {
            let d = deployment(&input(&isvc(engine))).unwrap();
            let c = container(&d);
            assert!(env_value(c, API_KEY_FILE_ENV).is_empty(), "{engine}");
            assert!(secret_ref(c, VLLM_API_KEY_ENV).is_none(), "{engine}");
            assert!(secret_ref(c, SGLANG_API_KEY_ENV).is_none(), "{engine}");
            assert!(!c.args.as_ref().unwrap().contains(&"--api-key".to_string()));
        }
        let own = with_auth("{env: [{name: BALLAST_API_KEY_FILE, value: /etc/keys}]}");
        let d = deployment(&input(&own)).unwrap();
        assert_eq!(
            env_value(container(&d), API_KEY_FILE_ENV),
            [Some("/etc/keys")]
        );
    }

    #[test]
    fn a_model_volume_is_mounted_read_only_as_the_model_cache() {
        // Table: (spec.model, the volume's source as JSON).
        let cases = [
            (
                r#"{"source": "smollm2-135m", "volume": {"persistentVolumeClaim": "models"}}"#,
                json!({"persistentVolumeClaim": {"claimName": "models", "readOnly": true}}),
            ),
            (
                r#"{"source": "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "volume": {"hostPath": "/srv/models"}}"#,
                json!({"hostPath": {"path": "/srv/models", "type": "Directory"}}),
            ),
        ];
        for (model, want) in cases {
            let i = model_isvc(model, "{}");
            let d = deployment(&input(&i)).unwrap();
            let volumes = pod(&d).volumes.as_ref().unwrap();
            assert_eq!(
                volumes.len(),
                3,
                "{model}: /tmp, the models and the control token"
            );
            let models = volumes.iter().find(|v| v.name == "models").unwrap();
            let mut got = serde_json::to_value(models).unwrap();
            got.as_object_mut().unwrap().remove("name");
            assert_eq!(got, want, "{model}");

            let c = container(&d);
            let mount = mount(c, "models").unwrap_or_else(|| panic!("{model}: no mount"));
            assert_eq!(mount.mount_path, MODEL_MOUNT_PATH);
            assert_eq!(mount.read_only, Some(true), "{model}");
            assert_eq!(env_value(c, MODEL_CACHE_ENV), [Some(MODEL_MOUNT_PATH)]);
            // The source reaches the engine unchanged; the engine resolves it there.
            let args = c.args.as_ref().unwrap();
            let source = &args[args.iter().position(|a| a == "--model").unwrap() + 1];
            assert_eq!(source, &i.spec.model.source);
        }
    }

    #[test]
    fn without_a_model_volume_only_tmp_and_the_control_token_are_mounted() {
        let d = deployment(&input(&isvc("{}"))).unwrap();
        let names: Vec<&str> = pod(&d)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(names, ["tmp", "control-token"]);
        assert_eq!(container(&d).volume_mounts.as_ref().unwrap().len(), 2);
        assert!(env_value(container(&d), MODEL_CACHE_ENV).is_empty());
    }

    #[test]
    fn the_users_model_cache_variable_wins_and_is_not_repeated() {
        let i = model_isvc(
            r#"{"source": "smollm2-135m", "volume": {"hostPath": "/srv/models"}}"#,
            "{env: [{name: BALLAST_MODEL_CACHE, value: /models/cache}]}",
        );
        let d = deployment(&input(&i)).unwrap();
        assert_eq!(
            env_value(container(&d), MODEL_CACHE_ENV),
            [Some("/models/cache")]
        );
    }

    #[test]
    fn images_and_engine_kinds() {
        // Table: (engine spec, default image, Ok(image, command head) or the error).
        type Want = Result<(&'static str, Option<&'static str>), BuildError>;
        let cases: [(&str, &str, Want); 5] = [
            (
                "{image: 'my/ballast:1'}",
                "",
                Ok(("my/ballast:1", Some("ballast"))),
            ),
            ("{}", "ballast:dev", Ok(("ballast:dev", Some("ballast")))),
            ("{}", "", Err(BuildError::NoImage("ballast"))),
            (
                "{kind: vllm}",
                "ballast:dev",
                Err(BuildError::NoImage("vllm")),
            ),
            (
                "{kind: sglang, image: 'lmsysorg/sglang:v0.5.0', grpcPort: 9000}",
                "",
                Ok(("lmsysorg/sglang:v0.5.0", Some("python3"))),
            ),
        ];
        for (engine, default_image, want) in cases {
            let i = isvc(engine);
            let got = deployment(&BuildInput {
                default_image,
                ..input(&i)
            });
            match (got, want) {
                (Ok(d), Ok((image, head))) => {
                    let c = container(&d);
                    assert_eq!(c.image.as_deref(), Some(image), "{engine}");
                    assert_eq!(c.command.as_ref().map(|c| c[0].as_str()), head, "{engine}");
                    if i.spec.engine.kind != EngineKind::Ballast {
                        assert_eq!(c.ports.as_ref().unwrap().len(), 1, "no control API port");
                    }
                }
                (Err(e), Err(w)) => assert_eq!(e, w, "{engine}"),
                (got, want) => panic!("{engine}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn service_pdb_and_service_monitor() {
        let i = isvc("{port: 8080, grpcPort: 0}");
        let s = service(&i).unwrap();
        let spec = s.spec.as_ref().unwrap();
        assert_eq!(
            spec.selector.as_ref(),
            Some(&labels::selector_labels("chat"))
        );
        let ports = spec.ports.as_ref().unwrap();
        assert_eq!(ports.len(), 1, "the OpenAI port only");
        assert_eq!(ports[0].port, 8080);
        let p = pdb(&i).unwrap();
        assert_eq!(
            p.spec.as_ref().unwrap().max_unavailable,
            Some(IntOrString::Int(1))
        );
        let all = build(&input(&i)).unwrap();
        assert!(all.service_monitor.is_none(), "not without its CRD");
        let all = build(&BuildInput {
            service_monitor_crd: true,
            inference_pool_crd: false,
            ..input(&i)
        })
        .unwrap();
        let sm = all.service_monitor.unwrap();
        assert_eq!(sm["spec"]["endpoints"][0]["interval"], "3s");
        assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
        assert_eq!(sm["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    }

    #[test]
    fn ballast_pods_get_a_shutdown_delay_and_a_grace_period_that_covers_it() {
        let c = |d: &Deployment| container(d).clone();
        let grace = |d: &Deployment| pod(d).termination_grace_period_seconds;

        let d = deployment(&input(&isvc("{}"))).unwrap();
        assert_eq!(env_value(&c(&d), SHUTDOWN_DELAY_ENV), [Some("5")]);
        assert!(
            !c(&d)
                .args
                .unwrap()
                .iter()
                .any(|a| a.contains("shutdown-delay")),
            "no flag: an older engine image would refuse it"
        );
        assert_eq!(grace(&d), Some(TERMINATION_GRACE_SECONDS));
        const { assert!(TERMINATION_GRACE_SECONDS >= 5 + 600) };

        // Table: spec.engine (args, env), the shutdown delay variable the pod gets, and
        // the grace period.
        let cases: [(&str, &str, i64); 7] = [
            ("{args: [--shutdown-delay, '10']}", "5", 10 + 600 + 30),
            ("{args: ['--drain-timeout=1200']}", "5", 5 + 1200 + 30),
            (
                "{args: [--drain-timeout, '0.5', --shutdown-delay, '0']}",
                "5",
                31,
            ),
            // The user's variables: theirs, once, and counted.
            (
                "{env: [{name: BALLAST_SHUTDOWN_DELAY, value: '20'}, {name: BALLAST_DRAIN_TIMEOUT, value: '60'}]}",
                "20",
                20 + 60 + 30,
            ),
            // The flag beats the variable, as in the engine.
            (
                "{args: [--drain-timeout, '100'], env: [{name: BALLAST_DRAIN_TIMEOUT, value: '900'}]}",
                "5",
                5 + 100 + 30,
            ),
            // A value the engine refuses fails the pod; the default period stays.
            (
                "{args: [--drain-timeout, soon]}",
                "5",
                TERMINATION_GRACE_SECONDS,
            ),
            (
                "{args: ['--drain-timeout=-3']}",
                "5",
                TERMINATION_GRACE_SECONDS,
            ),
        ];
        for (engine, delay, want) in cases {
            let d = deployment(&input(&isvc(engine))).unwrap();
            assert_eq!(
                env_value(&c(&d), SHUTDOWN_DELAY_ENV),
                [Some(delay)],
                "{engine}"
            );
            assert_eq!(grace(&d), Some(want), "{engine}");
        }

        // Other engines get no variable, and the default period.
        let d = deployment(&input(&isvc(
            "{kind: sglang, image: 'lmsysorg/sglang:v0.5.0'}",
        )))
        .unwrap();
        assert!(env_value(&c(&d), SHUTDOWN_DELAY_ENV).is_empty());
        assert_eq!(grace(&d), Some(TERMINATION_GRACE_SECONDS));
    }

    #[test]
    fn last_flag_values() {
        let a: Vec<String> = ["--x", "1", "--x=2", "--xy", "9", "--x"]
            .map(String::from)
            .to_vec();
        // The trailing `--x` has no value: the engine would refuse it; nothing to read.
        assert_eq!(last_flag_value(&a, "--x"), None);
        assert_eq!(last_flag_value(&a[..5], "--x"), Some("2"));
        assert_eq!(last_flag_value(&a[..2], "--x"), Some("1"));
        assert_eq!(last_flag_value(&a, "--y"), None);
        assert_eq!(last_flag_value(&a, "--xy"), Some("9"));
    }

    #[test]
    fn an_unsaved_resource_cannot_be_built() {
        let mut i = isvc("{}");
        i.metadata.uid = None;
        assert_eq!(
            build(&input(&i)).unwrap_err(),
            BuildError::Incomplete("uid")
        );
    }

    #[test]
    fn every_object_deserializes_into_its_api_type() {
        let i = isvc("{}");
        let all = build(&BuildInput {
            service_monitor_crd: true,
            inference_pool_crd: false,
            ..input(&i)
        })
        .unwrap();
        let d: Deployment =
            serde_json::from_value(serde_json::to_value(&all.deployment).unwrap()).unwrap();
        assert_eq!(d, all.deployment);
        let _: Service =
            serde_json::from_value(serde_json::to_value(&all.service).unwrap()).unwrap();
        let _: PodDisruptionBudget =
            serde_json::from_value(serde_json::to_value(&all.pdb).unwrap()).unwrap();
    }
}
