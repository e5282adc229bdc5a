//! The `InferenceService` custom resource (`ballast.dev/v1alpha1`): the Rust types from
//! which the CRD YAML in this folder is generated, and the defaults every runtime applies.
//!
//! Field names are the public API of `../shared/spec/control-plane.md` §1: add fields
//! freely, rename none. Doc comments become `kubectl explain` text.

pub mod inference_pool;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

/// A fleet of LLM inference replicas that Ballast scales, rebalances or holds on what the
/// replicas report about themselves.
// Several `printcolumn(type_ = …)` look like duplicated attributes to clippy; they are not.
// The short name is `bisvc` ("Ballast InferenceService"), not `isvc`: KServe's
// InferenceService claims `isvc`, and with both CRDs installed `kubectl get isvc` would pick
// one of them. Short names are cluster-wide, so a change here breaks users' scripts: do not.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ballast.dev",
    version = "v1alpha1",
    kind = "InferenceService",
    plural = "inferenceservices",
    doc = "A fleet of LLM inference replicas that Ballast scales, rebalances or holds on what the replicas report about themselves.",
    shortname = "bisvc",
    namespaced,
    status = "InferenceServiceStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Model",
        type_ = "string",
        json_path = ".spec.model.source",
        description = "Model source"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.autoscaling.mode",
        description = "Act: decisions applied; Advise: shown only"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".status.desiredReplicas",
        description = "Replicas the operator wants"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Ready replicas"
    ),
    printcolumn(
        name = "Action",
        type_ = "string",
        json_path = ".status.lastDecision.action",
        description = "Last decision"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas > 0 || (has(self.autoscaling.enabled) && !self.autoscaling.enabled) || (has(self.gateway) && has(self.gateway.enabled) && self.gateway.enabled)").message(MIN_ZERO_NEEDS_GATEWAY))]
pub struct InferenceServiceSpec {
    /// The model every replica serves.
    pub model: ModelSpec,
    /// How each replica runs.
    #[serde(default)]
    pub engine: EngineSpec,
    /// Replica count set through the scale subresource (`kubectl scale`, HPA, KEDA). With
    /// `autoscaling.enabled: false` the operator follows it; otherwise it is ignored and the
    /// operator writes `status.desiredReplicas` instead (the spec is never rewritten).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("replicas must not be negative"))]
    pub replicas: Option<i32>,
    /// Scaling on capacity-waiting requests, KV cache usage, admission rejections and TTFT.
    #[serde(default)]
    pub autoscaling: AutoscalingSpec,
    /// Taking hot replicas out of rotation and shifting data-parallel weights.
    #[serde(default)]
    pub rebalancing: RebalancingSpec,
    /// How replicas are scraped.
    #[serde(default)]
    pub metrics: MetricsSpec,
    /// Who may call the service's OpenAI API (Kubernetes only). Unset: whoever reaches the
    /// Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
    /// The request path through a gateway (Kubernetes only): an `InferencePool`
    /// (`inference.networking.k8s.io/v1`) of the engine pods and a `ballast gateway`
    /// endpoint picker that Envoy-based gateways call for each request.
    #[serde(default)]
    pub gateway: GatewaySpec,
}

/// The gateway's endpoint picker and the InferencePool that names it (docs/gateway.md).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// On: the operator keeps an InferencePool named like the resource, selecting its
    /// engine pods, and the picker's Deployment, Service and PodDisruptionBudget
    /// (`NAME-epp`). Needs the Gateway API Inference Extension's InferencePool CRD; without
    /// it the `Gateway` condition says so and the service runs without a gateway.
    #[serde(default)]
    pub enabled: bool,
    /// Picker replicas. Each keeps its own view of the pool; two or more keep requests
    /// flowing through a picker's restart.
    #[serde(default = "one")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 16").message(GATEWAY_REPLICAS))]
    pub replicas: i32,
    /// Resources of the picker container.
    #[serde(default)]
    pub resources: ResourceRequirements,
    /// What the gateway does when it cannot reach the picker: `FailClose` (the Gateway
    /// API Inference Extension's default) answers an error; `FailOpen` sends the request
    /// to an endpoint of the gateway's own choosing.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// Picker image; empty: the operator's `--engine-image` (the `ballast` binary).
    #[serde(default)]
    pub image: String,
    /// Extra `ballast gateway` arguments (weights, hold limits), appended after the ones
    /// this resource implies.
    #[serde(default)]
    pub args: Vec<String>,
}

const GATEWAY_REPLICAS: &str = "gateway.replicas must be 1..16";
const MIN_ZERO_NEEDS_GATEWAY: &str = "autoscaling.minReplicas: 0 needs gateway.enabled: true: at zero replicas only the gateway holds arriving requests and reports them as demand, so without it nothing would scale the service back up";

/// Whether the operator applies its decisions (`spec.autoscaling.mode`).
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum AutoscalingMode {
    // Decisions are applied.
    #[default]
    Act,
    // Decisions are made, shown and explained, never applied.
    Advise,
}

impl AutoscalingMode {
    /// The value as the spec writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            AutoscalingMode::Act => "Act",
            AutoscalingMode::Advise => "Advise",
        }
    }
}

/// `endpointPickerRef.failureMode` of an InferencePool.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum FailureMode {
    // The gateway answers an error while the picker cannot be reached (GIE's default).
    #[default]
    FailClose,
    // The gateway picks an endpoint itself while the picker cannot be reached.
    FailOpen,
}

impl FailureMode {
    /// The word the InferencePool API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::FailClose => "FailClose",
            FailureMode::FailOpen => "FailOpen",
        }
    }
}

/// API keys for the service's OpenAI API.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// The key of a Secret in the resource's namespace that holds the API keys, one a line.
    /// Clients send one as `Authorization: Bearer KEY`; without one `/v1/*` answers 401.
    /// Ballast engines read the keys from a file mounted from the Secret and pick up a
    /// change without a restart. vLLM (`VLLM_API_KEY`) and SGLang (`--api-key`) take the
    /// value whole, once, when the pod starts: for them it must be exactly one key, with no
    /// trailing newline (`kubectl create secret generic --from-literal`). The operator sends the first key
    /// on its scrapes, so a Ballast engine's `--metrics-require-key` does not blind it. A
    /// missing Secret or key holds the service (no pod is created) with a `Degraded`
    /// condition naming it, until it appears.
    pub api_key_secret_ref: SecretKeyRef,
}

/// One key of a Secret in the resource's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    // maxLength bounds the API server's cost estimate of the regular expression.
    #[schemars(length(max = 253))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message(SECRET_NAME))]
    pub name: String,
    /// The key within its `data`.
    #[schemars(length(max = 253))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[-._a-zA-Z0-9]+$')").message(SECRET_KEY))]
    pub key: String,
}

const SECRET_NAME: &str = "auth.apiKeySecretRef.name must be a DNS subdomain name";
const SECRET_KEY: &str =
    "auth.apiKeySecretRef.key must be a Secret key: letters, digits, '-', '_' and '.'";

/// Whether `key` can be a key of a Secret's `data`; the same rule as the CRD's pattern.
fn is_secret_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The model.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// `synthetic:NAME`, a model name the Ballast engine knows (`smollm2-135m`), a `.gguf`
    /// path, or a Hugging Face style directory.
    #[x_kube(validation = kube::core::Rule::new("self != ''").message("model.source must not be empty"))]
    pub source: String,
    /// The `model` name clients send; defaults to the resource's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,
    /// Where the model files come from (Kubernetes only): a volume mounted read-only at
    /// `/models` in every engine pod, which is also the Ballast engine's model cache
    /// (`BALLAST_MODEL_CACHE`), so `source` may be a path under `/models` or a model name
    /// the engine knows. Unset: no volume; `source` must exist in the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<ModelVolumeSpec>,
}

/// The volume holding the model files: exactly one of a PersistentVolumeClaim and a
/// directory on the node. Either is mounted read-only; the files must be readable by the
/// engine's user (65532).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.persistentVolumeClaim) != has(self.hostPath)").message(MODEL_VOLUME_ONE_OF))]
pub struct ModelVolumeSpec {
    /// Name of a PersistentVolumeClaim in the resource's namespace. With more than one
    /// replica it must allow several readers (`ReadOnlyMany`, or `ReadWriteMany`), or every
    /// pod must land on one node (`ReadWriteOnce`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // maxLength bounds the API server's cost estimate of the regular expression.
    #[schemars(length(max = 253))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message(MODEL_VOLUME_CLAIM_NAME))]
    pub persistent_volume_claim: Option<String>,
    /// An absolute path to a directory that already exists on every node the engine pods
    /// may run on (a `hostPath` volume of type `Directory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('/')").message(MODEL_VOLUME_HOST_PATH))]
    pub host_path: Option<String>,
}

/// Where an engine pod mounts [`ModelSpec::volume`], and the model cache it points the
/// Ballast engine at.
pub const MODEL_MOUNT_PATH: &str = "/models";

const MODEL_VOLUME_ONE_OF: &str =
    "model.volume needs exactly one of persistentVolumeClaim and hostPath";
const MODEL_VOLUME_CLAIM_NAME: &str =
    "model.volume.persistentVolumeClaim must be a DNS subdomain name";
const MODEL_VOLUME_HOST_PATH: &str = "model.volume.hostPath must be an absolute path";

/// Whether `name` is a DNS subdomain name (RFC 1123), what object names such as a
/// PersistentVolumeClaim's must be; the same rule as the CRD's CEL pattern.
fn is_dns_subdomain(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.';
    let end = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 253
        && b.first().is_some_and(end)
        && b.last().is_some_and(end)
        && b.iter().all(inner)
}

/// Which server runs in each replica.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    // Ballast's own engine: full signals (waiting by reason, DP balance, control API).
    #[default]
    Ballast,
    // vLLM: scraped in its dialect; no control API.
    Vllm,
    // SGLang: scraped in its dialect; no control API.
    Sglang,
}

/// How each replica runs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    /// Which server the replicas run: `ballast` (full signals, control API), `vllm` or
    /// `sglang` (scraped in their dialects, no control API).
    #[serde(default)]
    pub kind: EngineKind,
    /// Container image (Kubernetes only).
    #[serde(default)]
    pub image: String,
    /// Extra engine arguments, appended after the ones this resource implies.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables of the engine container (Kubernetes only).
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// Resources of the engine container (Kubernetes only).
    #[serde(default)]
    pub resources: ResourceRequirements,
    /// Engine HTTP port: OpenAI API, /health, /metrics.
    #[serde(default = "default_port")]
    #[x_kube(validation = kube::core::Rule::new("self > 0 && self < 65536").message("port must be 1..65535"))]
    pub port: i32,
    /// Engine control API (gRPC) port; 0 disables it.
    #[serde(default = "default_grpc_port")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0 && self < 65536").message("grpcPort must be 0..65535"))]
    pub grpc_port: i32,
    /// Data-parallel ranks per replica.
    #[serde(default = "one")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("dataParallelSize must be at least 1"))]
    pub data_parallel_size: i32,
    /// Running requests per rank.
    #[serde(default = "default_max_num_seqs")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("maxNumSeqs must be at least 1"))]
    pub max_num_seqs: i32,
    /// Tokens computed per step per rank.
    #[serde(default = "default_max_num_batched_tokens")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("maxNumBatchedTokens must be at least 1"))]
    pub max_num_batched_tokens: i32,
    /// Requests that may wait before new ones get HTTP 429.
    #[serde(default = "default_max_queued_requests")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("maxQueuedRequests must be at least 1"))]
    pub max_queued_requests: i64,
    /// Prompt tokens that may wait before new requests get HTTP 429.
    #[serde(default = "default_max_queued_tokens")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("maxQueuedTokens must be at least 1"))]
    pub max_queued_tokens: i64,
    /// Running requests per tenant; more wait as deferred. Unset: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("maxRunningPerTenant must be at least 1"))]
    pub max_running_per_tenant: Option<i32>,
    /// KV cache shape per rank.
    #[serde(default)]
    pub kv_cache: KvCacheSpec,
    /// Share KV blocks between requests with equal prefixes.
    #[serde(default = "yes")]
    pub enable_prefix_caching: bool,
}

/// KV cache shape per rank.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KvCacheSpec {
    /// Blocks per rank; unset lets the engine size it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("kvCache.numBlocks must be at least 1"))]
    pub num_blocks: Option<i64>,
    /// Tokens per block.
    #[serde(default = "default_block_size")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("kvCache.blockSize must be at least 1"))]
    pub block_size: i32,
}

/// Scaling on what replicas report, with HPA's algorithm and behaviour.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.minReplicas <= self.maxReplicas").message("minReplicas must not exceed maxReplicas"))]
#[x_kube(validation = kube::core::Rule::new("!self.enabled || has(self.targets.capacityWaitingPerReplica) || has(self.targets.kvCacheUsage) || has(self.targets.admissionRejectionsPerSecond) || has(self.targets.ttftP99Seconds)").message("autoscaling needs at least one target"))]
pub struct AutoscalingSpec {
    /// False: follow `spec.replicas` (set by `kubectl scale`, an HPA or KEDA).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// `Act` (the default) applies each decision; `Advise` scrapes, decides and explains
    /// the same (status, conditions, Events, metrics, the metrics APIs) but writes no
    /// replica count, deletion cost or DP weight and takes no pod out of rotation: what
    /// Ballast would do, beside the autoscaler a team runs now.
    #[serde(default)]
    pub mode: AutoscalingMode,
    /// Fewest replicas.
    #[serde(default = "one")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("minReplicas must not be negative"))]
    pub min_replicas: i32,
    /// With `minReplicas: 0` (and the gateway): seconds without any request (none running,
    /// waiting, deferred or held by the gateway) after which the service scales to zero.
    #[serde(default = "default_scale_to_zero_after")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 86400").message("scaleToZeroAfterSeconds must be 1..86400"))]
    pub scale_to_zero_after_seconds: i32,
    /// Most replicas.
    #[serde(default = "default_max_replicas")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("maxReplicas must be at least 1"))]
    pub max_replicas: i32,
    /// Per-signal targets; each is optional.
    #[serde(default)]
    pub targets: TargetsSpec,
    /// No change while |observed / target − 1| is at most this.
    #[serde(default = "default_tolerance")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0 && self < 1.0").message("tolerance must be in [0, 1)"))]
    pub tolerance: f64,
    /// Stabilisation windows and rate policies, as HPA's `behavior`; each field left out
    /// takes HPA's default for its direction.
    #[serde(default, skip_serializing_if = "BehaviorSpec::is_unset")]
    pub behavior: BehaviorSpec,
}

/// Targets per signal. A target left out takes its default (capacity waiting 4 per replica,
/// KV cache usage 0.85, admission rejections 0.05/s per replica; TTFT none); an explicit
/// `null` turns it off. At least one must be set when autoscaling is enabled.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TargetsSpec {
    /// Requests waiting for capacity, fleet total divided by replicas.
    #[serde(
        default = "default_capacity_waiting",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("capacityWaitingPerReplica must be positive"))]
    pub capacity_waiting_per_replica: Option<f64>,
    /// KV cache usage: per replica the max over its ranks, averaged over replicas.
    #[serde(default = "default_kv_usage", skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0 && self <= 1.0").message("kvCacheUsage must be in (0, 1]"))]
    pub kv_cache_usage: Option<f64>,
    /// HTTP 429 admission rejections per second, per replica.
    #[serde(
        default = "default_rejections",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("admissionRejectionsPerSecond must be positive"))]
    pub admission_rejections_per_second: Option<f64>,
    /// Fleet p99 time to first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("ttftP99Seconds must be positive"))]
    pub ttft_p99_seconds: Option<f64>,
}

/// Scale-up and scale-down behaviour, as HPA's `behavior`. Every field left out takes HPA's
/// default for its direction, one field at a time (as Kubernetes' `GenerateHPAScaleUpRules`
/// and `GenerateHPAScaleDownRules` fill them): `scaleDown: {policies: [...]}` keeps the
/// 300 s window, `scaleUp: {stabilizationWindowSeconds: 60}` keeps the rate limits.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BehaviorSpec {
    /// Scale-up rules. Unset fields: no stabilisation window, `selectPolicy: Max`, and the
    /// policies +4 pods and +100 % per 15 s (the larger change wins).
    #[serde(default, skip_serializing_if = "ScalingRules::is_unset")]
    pub scale_up: ScalingRules,
    /// Scale-down rules. Unset fields: a 300 s stabilisation window, `selectPolicy: Max`,
    /// and the policy −100 % per 15 s.
    #[serde(default, skip_serializing_if = "ScalingRules::is_unset")]
    pub scale_down: ScalingRules,
}

/// One direction's stabilisation window and rate policies. A field left out takes the
/// direction's default (see `scaleUp` and `scaleDown`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScalingRules {
    /// Seconds of recommendations considered: scale-down takes the highest in the window,
    /// scale-up the lowest. Unset: 0 for `scaleUp`, 300 for `scaleDown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0 && self <= 3600").message("stabilizationWindowSeconds must be 0..3600"))]
    pub stabilization_window_seconds: Option<i32>,
    /// Which policy wins when several allow different changes: `Max` (largest change),
    /// `Min` (smallest) or `Disabled` (no change in this direction). Unset: `Max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<SelectPolicy>,
    /// Limits on the change per period. Unset or empty: the direction's default policies
    /// (HPA's API refuses an empty list; Ballast reads it as unset).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<ScalingPolicy>,
}

impl BehaviorSpec {
    /// Both directions' rules with every unset field filled from HPA's defaults: what the
    /// decision core applies.
    pub fn resolved(&self) -> ResolvedBehavior {
        ResolvedBehavior {
            scale_up: self.scale_up.resolve(ResolvedRules::scale_up_defaults()),
            scale_down: self
                .scale_down
                .resolve(ResolvedRules::scale_down_defaults()),
        }
    }

    /// Nothing set in either direction (all of HPA's defaults).
    pub fn is_unset(&self) -> bool {
        self.scale_up.is_unset() && self.scale_down.is_unset()
    }
}

impl ScalingRules {
    /// Nothing set: every field takes the direction's default.
    pub fn is_unset(&self) -> bool {
        self == &ScalingRules::default()
    }

    /// These rules with each unset field (and an empty policy list) taken from
    /// `defaults`, field by field, as Kubernetes' `copyHPAScalingRules`.
    pub fn resolve(&self, defaults: ResolvedRules) -> ResolvedRules {
        ResolvedRules {
            stabilization_window_seconds: self
                .stabilization_window_seconds
                .unwrap_or(defaults.stabilization_window_seconds),
            select_policy: self.select_policy.unwrap_or(defaults.select_policy),
            policies: if self.policies.is_empty() {
                defaults.policies
            } else {
                self.policies.clone()
            },
        }
    }
}

/// [`BehaviorSpec`] with HPA's defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedBehavior {
    /// Scale-up rules.
    pub scale_up: ResolvedRules,
    /// Scale-down rules.
    pub scale_down: ResolvedRules,
}

/// One direction's rules with nothing left unset.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedRules {
    /// Seconds of recommendations considered.
    pub stabilization_window_seconds: i32,
    /// How the policies combine.
    pub select_policy: SelectPolicy,
    /// The rate policies; never empty after [`ScalingRules::resolve`].
    pub policies: Vec<ScalingPolicy>,
}

impl ResolvedRules {
    /// HPA's scale-up defaults: no window; the larger of +4 pods and +100 % per 15 s.
    pub fn scale_up_defaults() -> ResolvedRules {
        ResolvedRules {
            stabilization_window_seconds: 0,
            select_policy: SelectPolicy::Max,
            policies: vec![
                ScalingPolicy {
                    type_: PolicyType::Pods,
                    value: 4,
                    period_seconds: 15,
                },
                ScalingPolicy {
                    type_: PolicyType::Percent,
                    value: 100,
                    period_seconds: 15,
                },
            ],
        }
    }

    /// HPA's scale-down defaults: a 300 s window (the controller's
    /// `--horizontal-pod-autoscaler-downscale-stabilization`); −100 % per 15 s.
    pub fn scale_down_defaults() -> ResolvedRules {
        ResolvedRules {
            stabilization_window_seconds: 300,
            select_policy: SelectPolicy::Max,
            policies: vec![ScalingPolicy {
                type_: PolicyType::Percent,
                value: 100,
                period_seconds: 15,
            }],
        }
    }
}

/// How policies combine.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum SelectPolicy {
    // The policy allowing the largest change.
    #[default]
    Max,
    // The policy allowing the smallest change.
    Min,
    // No change in this direction.
    Disabled,
}

/// A rate limit on scaling.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScalingPolicy {
    /// `Pods` (absolute) or `Percent` (of the replicas at the start of the period).
    #[serde(rename = "type")]
    pub type_: PolicyType,
    /// Pods or percent per period.
    #[x_kube(validation = kube::core::Rule::new("self > 0").message("policy value must be positive"))]
    pub value: i32,
    /// Length of the period.
    #[x_kube(validation = kube::core::Rule::new("self > 0 && self <= 1800").message("periodSeconds must be 1..1800"))]
    pub period_seconds: i32,
}

/// Unit of a scaling policy.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyType {
    // Absolute number of pods.
    Pods,
    // Percent of the current replicas.
    Percent,
}

/// Moving traffic away from hot replicas before (or instead of) scaling.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RebalancingSpec {
    /// Off: never take replicas out of rotation or change DP weights.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A replica whose KV usage (max over ranks) is above this stops taking new traffic…
    #[serde(default = "default_hot_kv")]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0 && self <= 1.0").message("hotKvCacheUsage must be in (0, 1]"))]
    pub hot_kv_cache_usage: f64,
    /// …or with this many requests waiting for capacity.
    #[serde(default = "default_hot_waiting")]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("hotCapacityWaiting must be positive"))]
    pub hot_capacity_waiting: f64,
    /// …and returns below this fraction of the hot thresholds.
    #[serde(default = "default_cool_fraction")]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0 && self < 1.0").message("coolFraction must be in (0, 1)"))]
    pub cool_fraction: f64,
    /// Never fewer replicas taking traffic.
    #[serde(default = "one")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("minAccepting must be at least 1"))]
    pub min_accepting: i32,
    /// Above this DP token imbalance ratio, shift the replica's DP dispatch weights.
    #[serde(default = "default_dp_imbalance")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1.0").message("dpImbalanceRatio must be at least 1"))]
    pub dp_imbalance_ratio: f64,
}

/// How replicas are scraped.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.scrapeTimeoutSeconds <= self.scrapeIntervalSeconds").message("scrapeTimeoutSeconds must not exceed scrapeIntervalSeconds"))]
pub struct MetricsSpec {
    /// Path of the Prometheus exposition on the engine port.
    #[serde(default = "default_metrics_path")]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('/')").message("metrics.path must start with /"))]
    pub path: String,
    /// Seconds between control periods (scrape, decide, act).
    #[serde(default = "default_scrape_interval")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("scrapeIntervalSeconds must be at least 1"))]
    pub scrape_interval_seconds: i32,
    /// A replica slower than this contributes no sample.
    #[serde(default = "default_scrape_timeout")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("scrapeTimeoutSeconds must be at least 1"))]
    pub scrape_timeout_seconds: i32,
    /// A larger exposition is refused (no sample).
    #[serde(default = "default_max_body")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1024").message("maxBodyBytes must be at least 1024"))]
    pub max_body_bytes: i64,
    /// With fewer ready replicas reporting than this fraction, hold with
    /// `MetricsAvailable=False` instead of acting on partial data.
    #[serde(default = "default_min_reporting")]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0 && self <= 1.0").message("minReportingFraction must be in (0, 1]"))]
    pub min_reporting_fraction: f64,
}

/// What the operator observed and decided. Written only by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct InferenceServiceStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Replicas that exist (scale subresource `statusReplicasPath`).
    #[serde(default)]
    pub replicas: i32,
    /// Replicas that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Replicas in rotation (not taken out by rebalancing).
    #[serde(default)]
    pub accepting_replicas: i32,
    /// Replicas (not leaving) that run the latest pod template: fewer than `replicas`
    /// while a rollout is in progress.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Replicas the operator wants.
    #[serde(default)]
    pub desired_replicas: i32,
    /// Label selector of the replicas (scale subresource `labelSelectorPath`).
    #[serde(default)]
    pub selector: String,
    /// When the replica count last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<String>,
    /// Ready, ScalingActive, ScalingLimited, MetricsAvailable, Degraded; one per type (a
    /// list-map keyed by `type`, so server-side apply merges them by type).
    #[serde(default)]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The latest decision and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<Decision>,
}

/// What the operator does this control period.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    // Add replicas.
    ScaleUp,
    // Drain and remove replicas.
    ScaleDown,
    // Move traffic between replicas or DP ranks.
    Rebalance,
    // Change nothing.
    Hold,
}

impl Action {
    /// The CamelCase word, as in `status.lastDecision.action` (the serde form) and the
    /// `action` label of `ballast_operator_decisions_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::ScaleUp => "ScaleUp",
            Action::ScaleDown => "ScaleDown",
            Action::Rebalance => "Rebalance",
            Action::Hold => "Hold",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision with its explanation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// What was decided: `ScaleUp`, `ScaleDown`, `Rebalance` or `Hold`.
    pub action: Action,
    /// A stable CamelCase word: CapacityWaiting, KvCacheHot, DeferredWaiting, MetricsStale, …
    pub reason: String,
    /// One line a person can read.
    pub message: String,
    /// When (RFC 3339).
    pub time: String,
    /// The aggregated signals the decision was made on.
    pub signals: Signals,
    /// Replicas each signal asked for.
    #[serde(default)]
    pub recommendations: Vec<Recommendation>,
}

/// Aggregated fleet signals; a signal no replica reported is null.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Signals {
    /// Requests waiting for capacity, fleet total.
    pub capacity_waiting: Option<f64>,
    /// Requests deferred by tenant caps, fleet total.
    pub deferred_waiting: Option<f64>,
    /// Per replica max over ranks, averaged over replicas.
    pub kv_cache_usage: Option<f64>,
    /// Fleet 429 rate per replica.
    pub admission_rejections_per_second: Option<f64>,
    /// Fleet p99 TTFT.
    pub ttft_p99_seconds: Option<f64>,
    /// Requests the gateway holds (`spec.gateway`), waiting for capacity no replica has;
    /// counted in `capacityWaiting` too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_requests: Option<f64>,
    /// How long the longest-held of them has been held, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_hold_seconds: Option<f64>,
}

/// Replicas one signal asked for.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Recommendation {
    /// The signal's name as in `signals`.
    pub signal: String,
    /// Replicas it recommends.
    pub replicas: i32,
}

fn yes() -> bool {
    true
}
fn one() -> i32 {
    1
}
fn default_port() -> i32 {
    8000
}
fn default_grpc_port() -> i32 {
    9000
}
fn default_max_num_seqs() -> i32 {
    256
}
fn default_max_num_batched_tokens() -> i32 {
    8192
}
fn default_max_queued_requests() -> i64 {
    1024
}
fn default_max_queued_tokens() -> i64 {
    1_048_576
}
fn default_block_size() -> i32 {
    16
}
fn default_scale_to_zero_after() -> i32 {
    300
}
fn default_max_replicas() -> i32 {
    4
}
fn default_tolerance() -> f64 {
    0.1
}
fn default_capacity_waiting() -> Option<f64> {
    Some(4.0)
}
fn default_kv_usage() -> Option<f64> {
    Some(0.85)
}
fn default_rejections() -> Option<f64> {
    Some(0.05)
}
fn default_hot_kv() -> f64 {
    0.95
}
fn default_hot_waiting() -> f64 {
    8.0
}
fn default_cool_fraction() -> f64 {
    0.8
}
fn default_dp_imbalance() -> f64 {
    1.5
}
fn default_metrics_path() -> String {
    "/metrics".into()
}
fn default_scrape_interval() -> i32 {
    5
}
fn default_scrape_timeout() -> i32 {
    2
}
fn default_max_body() -> i64 {
    4 * 1024 * 1024
}
fn default_min_reporting() -> f64 {
    0.5
}

macro_rules! default_from_serde {
    ($($t:ty),*) => {$(
        impl Default for $t {
            /// The defaults of the CRD schema (an empty object deserialised).
            fn default() -> Self {
                serde_json::from_value(serde_json::json!({})).expect("every field has a default")
            }
        }
    )*};
}
default_from_serde!(
    EngineSpec,
    KvCacheSpec,
    AutoscalingSpec,
    TargetsSpec,
    BehaviorSpec,
    RebalancingSpec,
    MetricsSpec,
    GatewaySpec
);

impl InferenceServiceSpec {
    /// The replica count a new service starts with: `replicas` within
    /// `[minReplicas, maxReplicas]`, or `minReplicas`; with autoscaling off, `replicas` or 1.
    pub fn initial_replicas(&self) -> i32 {
        let n = if self.autoscaling.enabled {
            self.replicas
                .unwrap_or(self.autoscaling.min_replicas)
                .clamp(self.autoscaling.min_replicas, self.autoscaling.max_replicas)
        } else {
            self.replicas.unwrap_or(1)
        };
        n.max(0)
    }

    /// Checks every rule the CRD's CEL validations state, for runtimes without an API server
    /// (`ballast local`) and as the reconciler's second line. Returns every violation, each
    /// as the same message the CRD uses.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
        let mut check = |ok: bool, msg: &str| {
            if !ok {
                errs.push(msg.to_string());
            }
        };
        let e = &self.engine;
        check(
            !self.model.source.is_empty(),
            "model.source must not be empty",
        );
        if let Some(v) = &self.model.volume {
            check(
                v.persistent_volume_claim.is_some() != v.host_path.is_some(),
                MODEL_VOLUME_ONE_OF,
            );
            check(
                v.persistent_volume_claim
                    .as_deref()
                    .is_none_or(is_dns_subdomain),
                MODEL_VOLUME_CLAIM_NAME,
            );
            check(
                v.host_path.as_deref().is_none_or(|p| p.starts_with('/')),
                MODEL_VOLUME_HOST_PATH,
            );
        }
        check(
            self.replicas.is_none_or(|r| r >= 0),
            "replicas must not be negative",
        );
        check(e.port > 0 && e.port < 65536, "port must be 1..65535");
        check(
            e.grpc_port >= 0 && e.grpc_port < 65536,
            "grpcPort must be 0..65535",
        );
        check(
            e.data_parallel_size >= 1,
            "dataParallelSize must be at least 1",
        );
        check(e.max_num_seqs >= 1, "maxNumSeqs must be at least 1");
        check(
            e.max_num_batched_tokens >= 1,
            "maxNumBatchedTokens must be at least 1",
        );
        check(
            e.max_queued_requests >= 1,
            "maxQueuedRequests must be at least 1",
        );
        check(
            e.max_queued_tokens >= 1,
            "maxQueuedTokens must be at least 1",
        );
        check(
            e.max_running_per_tenant.is_none_or(|n| n >= 1),
            "maxRunningPerTenant must be at least 1",
        );
        check(
            e.kv_cache.num_blocks.is_none_or(|n| n >= 1),
            "kvCache.numBlocks must be at least 1",
        );
        check(
            e.kv_cache.block_size >= 1,
            "kvCache.blockSize must be at least 1",
        );
        let a = &self.autoscaling;
        check(a.min_replicas >= 0, "minReplicas must not be negative");
        check(a.max_replicas >= 1, "maxReplicas must be at least 1");
        check(
            (1..=86400).contains(&a.scale_to_zero_after_seconds),
            "scaleToZeroAfterSeconds must be 1..86400",
        );
        check(
            a.min_replicas <= a.max_replicas,
            "minReplicas must not exceed maxReplicas",
        );
        check(
            a.tolerance >= 0.0 && a.tolerance < 1.0,
            "tolerance must be in [0, 1)",
        );
        let t = &a.targets;
        check(
            t.capacity_waiting_per_replica.is_none_or(|v| v > 0.0),
            "capacityWaitingPerReplica must be positive",
        );
        check(
            t.kv_cache_usage.is_none_or(|v| v > 0.0 && v <= 1.0),
            "kvCacheUsage must be in (0, 1]",
        );
        check(
            t.admission_rejections_per_second.is_none_or(|v| v > 0.0),
            "admissionRejectionsPerSecond must be positive",
        );
        check(
            t.ttft_p99_seconds.is_none_or(|v| v > 0.0),
            "ttftP99Seconds must be positive",
        );
        let any_target = t.capacity_waiting_per_replica.is_some()
            || t.kv_cache_usage.is_some()
            || t.admission_rejections_per_second.is_some()
            || t.ttft_p99_seconds.is_some();
        check(
            !a.enabled || any_target,
            "autoscaling needs at least one target",
        );
        for rules in [&a.behavior.scale_up, &a.behavior.scale_down] {
            check(
                rules
                    .stabilization_window_seconds
                    .is_none_or(|w| (0..=3600).contains(&w)),
                "stabilizationWindowSeconds must be 0..3600",
            );
            for p in &rules.policies {
                check(p.value > 0, "policy value must be positive");
                check(
                    p.period_seconds > 0 && p.period_seconds <= 1800,
                    "periodSeconds must be 1..1800",
                );
            }
        }
        let r = &self.rebalancing;
        check(
            r.hot_kv_cache_usage > 0.0 && r.hot_kv_cache_usage <= 1.0,
            "hotKvCacheUsage must be in (0, 1]",
        );
        check(
            r.hot_capacity_waiting > 0.0,
            "hotCapacityWaiting must be positive",
        );
        check(
            r.cool_fraction > 0.0 && r.cool_fraction < 1.0,
            "coolFraction must be in (0, 1)",
        );
        check(r.min_accepting >= 1, "minAccepting must be at least 1");
        check(
            r.dp_imbalance_ratio >= 1.0,
            "dpImbalanceRatio must be at least 1",
        );
        let m = &self.metrics;
        check(m.path.starts_with('/'), "metrics.path must start with /");
        check(
            m.scrape_interval_seconds >= 1,
            "scrapeIntervalSeconds must be at least 1",
        );
        check(
            m.scrape_timeout_seconds >= 1,
            "scrapeTimeoutSeconds must be at least 1",
        );
        check(
            m.scrape_timeout_seconds <= m.scrape_interval_seconds,
            "scrapeTimeoutSeconds must not exceed scrapeIntervalSeconds",
        );
        check(
            m.max_body_bytes >= 1024,
            "maxBodyBytes must be at least 1024",
        );
        check(
            m.min_reporting_fraction > 0.0 && m.min_reporting_fraction <= 1.0,
            "minReportingFraction must be in (0, 1]",
        );
        check((1..=16).contains(&self.gateway.replicas), GATEWAY_REPLICAS);
        check(
            !a.enabled || a.min_replicas != 0 || self.gateway.enabled,
            MIN_ZERO_NEEDS_GATEWAY,
        );
        if let Some(auth) = &self.auth {
            let r = &auth.api_key_secret_ref;
            check(is_dns_subdomain(&r.name), SECRET_NAME);
            check(is_secret_key(&r.key), SECRET_KEY);
        }
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }
}

impl InferenceService {
    /// The `model` name clients send: `spec.model.servedName`, else the resource name.
    pub fn served_name(&self) -> String {
        self.spec
            .model
            .served_name
            .clone()
            .unwrap_or_else(|| self.metadata.name.clone().unwrap_or_default())
    }
}

/// The CRD as YAML, exactly what `ballast crd` prints and `crds/` holds.
pub fn crd_yaml() -> String {
    let crd = InferenceService::crd();
    let body = serde_saphyr::to_string(&crd).expect("the CRD serialises");
    format!(
        "# Generated by `ballast crd` from crds/src/lib.rs; do not edit by hand.\n---\n{}",
        body.trim_start_matches("---\n")
    )
}

/// Why a YAML file did not give InferenceServices.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The text is not YAML (a syntax error, a tab in the indentation, a bad anchor…); the
    /// message says where.
    #[error("invalid YAML: {0}")]
    Yaml(#[from] serde_saphyr::Error),
    /// A document is YAML but not an InferenceService of this version: a required field is
    /// missing, a field has the wrong type, or an enum value is unknown.
    #[error("document {document} is not a valid ballast.dev/v1alpha1 InferenceService: {source}")]
    NotAnInferenceService {
        /// The document's position among the file's non-empty documents, from 1.
        document: usize,
        /// What serde found wrong, with the field's name.
        source: serde_json::Error,
    },
}

impl ParseError {
    /// A stable, low-cardinality label for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            ParseError::Yaml(_) => "yaml",
            ParseError::NotAnInferenceService { .. } => "not_an_inference_service",
        }
    }
}

/// Parses one or more `---`-separated YAML documents into resources, skipping empty ones.
pub fn parse_yaml(text: &str) -> Result<Vec<InferenceService>, ParseError> {
    // serde-saphyr already skips empty and `null` documents.
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text)?;
    docs.into_iter()
        .filter(|v| !v.is_null())
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value(v).map_err(|source| ParseError::NotAnInferenceService {
                document: i + 1,
                source,
            })
        })
        .collect()
}
