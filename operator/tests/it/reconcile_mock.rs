//! Reconcile against kube's mock service (tower-test): a small in-memory API server answers
//! every request the reconciler makes and records it, and each scenario checks the calls
//! and the bodies written — create, a no-op on an unchanged spec, the status patch, the
//! scale-subresource path, an invalid spec, a model volume, an API error with its
//! backoff, deletion costs before a scale-down, rotation through the readiness gate, and
//! what the status says of generations, pods under an invalid spec and a rollout, and DP
//! weights pushed over an engine's control API. Where a scenario needs a decision on
//! signals, engines' metrics endpoints run on loopback addresses (127.0.0.x, one per pod
//! IP) and the control period is one second; where it needs an engine's control API, a
//! stand-in serves the gRPC service over TLS with the pair the operator put in the
//! service's Secret.
//!
//! The real API server (admission, CEL, server-side apply semantics) is the e2e suite's
//! job; here every request is checked for method, path, parameters and content.

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ballast_crds::InferenceService;
use ballast_operator::control::proto as control;
use ballast_operator::metrics::OperatorMetrics;
use ballast_operator::reconcile::{Config, Context, error_policy, reconcile};
use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

/// One request the reconciler made.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    path: String,
    query: String,
    body: Value,
}

impl Call {
    fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

/// The in-memory API server: objects by path, every call, and paths that must fail.
#[derive(Default)]
struct Server {
    objects: BTreeMap<String, Value>,
    calls: Vec<Call>,
    fail: BTreeMap<String, u16>,
}

type Shared = Arc<Mutex<Server>>;

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

fn status_body(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason, "reason": reason, "code": code})
}

/// Merges `patch` into `into` (JSON merge, enough for apply and status patches here).
fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

/// Merges the `status.conditions` of a pod status patch into `pod` by condition type, as
/// the API server's strategic merge does.
fn merge_conditions(pod: &mut Value, patch: &Value) {
    let Some(new) = patch["status"]["conditions"].as_array() else {
        return;
    };
    if !pod["status"]["conditions"].is_array() {
        pod["status"]["conditions"] = json!([]);
    }
    let conditions = pod["status"]["conditions"].as_array_mut().unwrap();
    for c in new {
        match conditions.iter_mut().find(|o| o["type"] == c["type"]) {
            Some(o) => merge(o, c),
            None => conditions.push(c.clone()),
        }
    }
}

async fn serve(server: Shared, req: Request<Body>) -> Response<Body> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut s = server.lock().unwrap();
    s.calls.push(Call {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        body: body.clone(),
    });
    if let Some(&code) = s.fail.get(&path) {
        return respond(
            StatusCode::from_u16(code).unwrap(),
            &status_body(code, "InternalError"),
        );
    }
    // Collections: every stored object under the path.
    let list = [
        (
            "/horizontalpodautoscalers",
            "autoscaling/v2",
            "HorizontalPodAutoscalerList",
        ),
        ("/pods", "v1", "PodList"),
    ]
    .into_iter()
    .find(|(suffix, _, _)| method == "GET" && path.ends_with(suffix));
    if let Some((_, api_version, kind)) = list {
        let items: Vec<Value> = s
            .objects
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{path}/")))
            .map(|(_, v)| v.clone())
            .collect();
        return respond(
            StatusCode::OK,
            &json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}),
        );
    }
    if path == "/apis/monitoring.coreos.com/v1" {
        return respond(StatusCode::NOT_FOUND, &status_body(404, "NotFound"));
    }
    if method == "POST" && path.ends_with("/events") {
        return respond(StatusCode::CREATED, &body);
    }
    let (object_path, subresource) = match path.strip_suffix("/status") {
        Some(p) => (p.to_string(), true),
        None => (path.clone(), false),
    };
    match method.as_str() {
        "GET" => match s.objects.get(&object_path) {
            Some(o) => respond(StatusCode::OK, o),
            None => respond(StatusCode::NOT_FOUND, &status_body(404, "NotFound")),
        },
        "PATCH" => {
            let stored = s.objects.entry(object_path.clone()).or_insert(Value::Null);
            if stored.is_null() {
                if subresource {
                    return respond(StatusCode::NOT_FOUND, &status_body(404, "NotFound"));
                }
                *stored = json!({"metadata": {"resourceVersion": "1", "uid": "u"}});
            }
            if subresource && object_path.contains("/pods/") {
                // A pod's status patch is strategic: conditions merge by type.
                merge_conditions(stored, &body);
            } else if subresource {
                stored["status"] = body["status"].clone();
            } else {
                merge(stored, &body);
            }
            let out = stored.clone();
            respond(StatusCode::OK, &out)
        }
        // Create: the collection's path plus the body's name, which must be new.
        "POST" => {
            let name = body["metadata"]["name"].as_str().unwrap_or_default();
            let at = format!("{path}/{name}");
            if s.objects.contains_key(&at) {
                return respond(StatusCode::CONFLICT, &status_body(409, "AlreadyExists"));
            }
            let mut stored = body.clone();
            stored["metadata"]["resourceVersion"] = json!("1");
            s.objects.insert(at, stored.clone());
            respond(StatusCode::CREATED, &stored)
        }
        // Replace: only with the resourceVersion stored (optimistic concurrency).
        "PUT" => {
            let Some(stored) = s.objects.get_mut(&object_path) else {
                return respond(StatusCode::NOT_FOUND, &status_body(404, "NotFound"));
            };
            let version = stored["metadata"]["resourceVersion"].clone();
            if body["metadata"]["resourceVersion"] != version {
                return respond(StatusCode::CONFLICT, &status_body(409, "Conflict"));
            }
            let next = version
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            *stored = body.clone();
            stored["metadata"]["resourceVersion"] = json!(next.to_string());
            let out = stored.clone();
            respond(StatusCode::OK, &out)
        }
        _ => respond(
            StatusCode::METHOD_NOT_ALLOWED,
            &status_body(405, "MethodNotAllowed"),
        ),
    }
}

/// A client whose every request the in-memory server answers.
fn client(server: Shared) -> Client {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut handle = pin!(handle);
        while let Some((req, send)) = handle.next_request().await {
            send.send_response(serve(Arc::clone(&server), req).await);
        }
    });
    Client::new(service, "default")
}

fn context(server: &Shared) -> Arc<Context> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = client(Arc::clone(server));
    Context::new(
        c.clone(),
        Config {
            default_engine_image: "ballast:test".into(),
            advise: false,
        },
        Arc::new(OperatorMetrics::new()),
        Recorder::new(
            c,
            Reporter {
                controller: "ballast-operator".into(),
                instance: Some("test".into()),
            },
        ),
    )
}

const ISVC_PATH: &str = "/apis/ballast.dev/v1alpha1/namespaces/default/inferenceservices/chat";
const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/chat";
const SERVICE: &str = "/api/v1/namespaces/default/services/chat";
const PDB: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/chat";
const SECRETS: &str = "/api/v1/namespaces/default/secrets";
const TOKEN_SECRET: &str = "/api/v1/namespaces/default/secrets/chat-control-token";

fn isvc(spec: &str) -> InferenceService {
    let mut i = ballast_crds::parse_yaml(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat, namespace: default}}\nspec: {spec}\n"
    ))
    .unwrap()
    .remove(0);
    i.metadata.uid = Some("isvc-uid".into());
    i.metadata.generation = Some(1);
    i.metadata.resource_version = Some("1".into());
    i
}

/// Stores `i` in the server (so status patches have an object to land on).
fn store(server: &Shared, i: &InferenceService) {
    server
        .lock()
        .unwrap()
        .objects
        .insert(ISVC_PATH.into(), serde_json::to_value(i).unwrap());
}

/// The resource as the server holds it now (with the status the reconciler wrote).
fn stored(server: &Shared) -> InferenceService {
    serde_json::from_value(server.lock().unwrap().objects[ISVC_PATH].clone()).unwrap()
}

fn writes(server: &Shared) -> Vec<Call> {
    server
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.is_write())
        .cloned()
        .collect()
}

fn clear_calls(server: &Shared) {
    server.lock().unwrap().calls.clear();
}

fn write_to<'a>(calls: &'a [Call], path: &str) -> &'a Call {
    calls
        .iter()
        .find(|c| c.path == path)
        .unwrap_or_else(|| panic!("no write to {path}: {calls:#?}"))
}

const SPEC: &str =
    "{model: {source: 'synthetic:tiny'}, autoscaling: {minReplicas: 2, maxReplicas: 4}}";

#[tokio::test]
async fn create_applies_every_object_and_the_status() {
    let server = Shared::default();
    let i = isvc(SPEC);
    store(&server, &i);
    let action = reconcile(Arc::new(i), context(&server)).await.unwrap();
    assert!(
        action != Action::await_change(),
        "requeued for the next period"
    );
    let w = writes(&server);
    let paths: Vec<&str> = w.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            SECRETS,
            DEPLOYMENT,
            SERVICE,
            PDB,
            &format!("{ISVC_PATH}/status")
        ],
        "the control token first; no event: holding while replicas start changes nothing"
    );
    let secret = &w[0].body;
    assert_eq!(w[0].method, "POST");
    assert_eq!(secret["metadata"]["name"], "chat-control-token");
    assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "isvc-uid");
    let token = token_lines(&server);
    assert_eq!(token.len(), 1);
    assert_eq!(token[0].len(), 64, "256 bits as hex");
    for c in &w[1..] {
        assert_eq!(c.method, "PATCH");
        assert!(
            c.query.contains("fieldManager=ballast-operator") && c.query.contains("force=true"),
            "server-side apply under one field manager: {}",
            c.query
        );
    }
    let d = &write_to(&w, DEPLOYMENT).body;
    assert_eq!(d["apiVersion"], "apps/v1");
    assert_eq!(d["spec"]["replicas"], 2, "minReplicas to start");
    assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "isvc-uid");
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        "ballast:test"
    );
    let s = &write_to(&w, &format!("{ISVC_PATH}/status")).body;
    assert_eq!(s["apiVersion"], "ballast.dev/v1alpha1");
    assert_eq!(s["kind"], "InferenceService");
    let status = &s["status"];
    assert_eq!(status["desiredReplicas"], 2);
    assert_eq!(status["replicas"], 0);
    assert_eq!(
        status["selector"],
        "app.kubernetes.io/instance=chat,app.kubernetes.io/name=ballast-engine"
    );
    assert_eq!(status["lastDecision"]["action"], "Hold");
    let types: Vec<&str> = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert!(
        types.contains(&"Ready") && types.contains(&"MetricsAvailable"),
        "{types:?}"
    );
}

/// The tokens the stored control-token Secret holds, one a line.
fn token_lines(server: &Shared) -> Vec<String> {
    let s = server.lock().unwrap();
    let data = s.objects[TOKEN_SECRET]["data"]["token"].clone();
    let bytes: k8s_openapi::ByteString = serde_json::from_value(data).unwrap();
    String::from_utf8(bytes.0)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn the_control_token_rotates_on_request_and_the_old_one_outlives_the_change() {
    let server = Shared::default();
    let i = isvc(SPEC);
    store(&server, &i);
    let ctx = context(&server);
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    let first = token_lines(&server);
    // Asked for by an annotation: a new token first, the old one kept beside it.
    let mut asked = stored(&server);
    asked.metadata.annotations.get_or_insert_default().insert(
        "ballast.dev/rotate-control-token".into(),
        "2026-12-05".into(),
    );
    store(&server, &asked);
    clear_calls(&server);
    reconcile(Arc::new(asked.clone()), Arc::clone(&ctx))
        .await
        .unwrap();
    let w = writes(&server);
    let put = write_to(&w, TOKEN_SECRET);
    assert_eq!(
        put.method, "PUT",
        "a replace carrying the resourceVersion read"
    );
    assert_eq!(put.body["metadata"]["resourceVersion"], "1");
    let rotated = token_lines(&server);
    assert_eq!(rotated.len(), 2);
    assert_ne!(rotated[0], first[0]);
    assert_eq!(rotated[1], first[0], "the old token outlives the change");
    assert!(
        w.iter().all(|c| c.path != DEPLOYMENT),
        "a rotation restarts no pod: the kubelet refreshes the mounted file"
    );
    // The same request again rotates nothing.
    clear_calls(&server);
    reconcile(Arc::new(asked), ctx).await.unwrap();
    assert!(writes(&server).iter().all(|c| c.path != TOKEN_SECRET));
    assert_eq!(token_lines(&server), rotated);
    // A Secret someone deleted comes back, with a new token.
    server.lock().unwrap().objects.remove(TOKEN_SECRET);
    reconcile(Arc::new(stored(&server)), context(&server))
        .await
        .unwrap();
    let again = token_lines(&server);
    assert_eq!(again.len(), 1);
    assert!(!rotated.contains(&again[0]));
}

#[tokio::test]
async fn an_unchanged_resource_makes_no_write() {
    let server = Shared::default();
    let i = isvc(SPEC);
    store(&server, &i);
    let ctx = context(&server);
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    // A new context is a restarted operator: no memory, the same cluster.
    for ctx in [ctx, context(&server)] {
        clear_calls(&server);
        reconcile(Arc::new(stored(&server)), ctx).await.unwrap();
        let w = writes(&server);
        assert!(w.is_empty(), "writes on an unchanged resource: {w:#?}");
    }
}

#[tokio::test]
async fn autoscaling_off_follows_the_scale_subresource() {
    let server = Shared::default();
    let i = isvc("{model: {source: 'synthetic:tiny'}, replicas: 3, autoscaling: {enabled: false}}");
    store(&server, &i);
    reconcile(Arc::new(i), context(&server)).await.unwrap();
    let w = writes(&server);
    assert_eq!(write_to(&w, DEPLOYMENT).body["spec"]["replicas"], 3);
    // `kubectl scale --replicas 5` sets spec.replicas; the next reconcile follows it and
    // says so in an Event, without touching the spec.
    let mut scaled = stored(&server);
    scaled.spec.replicas = Some(5);
    clear_calls(&server);
    reconcile(Arc::new(scaled), context(&server)).await.unwrap();
    let w = writes(&server);
    assert_eq!(write_to(&w, DEPLOYMENT).body["spec"]["replicas"], 5);
    assert!(
        w.iter().all(|c| c.path != ISVC_PATH),
        "the spec is never written"
    );
    let event = w
        .iter()
        .find(|c| c.path.ends_with("/events"))
        .expect("an Event for the change");
    assert_eq!(event.body["reason"], "FollowingSpecReplicas");
    assert_eq!(event.body["type"], "Normal");
    assert_eq!(stored(&server).status.unwrap().desired_replicas, 5);
}

/// An HPA targeting a service whose built-in autoscaler is on: the operator does not fight
/// it. It follows spec.replicas (which the HPA writes), says so in `AutoscalerConflict`
/// naming the HPA and a Warning Event, and sets the condition False once the HPA is gone.
#[tokio::test]
async fn an_hpa_on_a_service_with_the_built_in_autoscaler_on_is_a_conflict_not_a_fight() {
    let server = Shared::default();
    let hpas = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers";
    for (name, target) in [("chat-hpa", "chat"), ("other-hpa", "other")] {
        server.lock().unwrap().objects.insert(
            format!("{hpas}/{name}"),
            json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                   "metadata": {"name": name, "namespace": "default"},
                   "spec": {"scaleTargetRef": {"apiVersion": "ballast.dev/v1alpha1", "kind": "InferenceService", "name": target},
                            "maxReplicas": 5}}),
        );
    }
    // The built-in autoscaler alone would run at least minReplicas (4); the HPA wrote 3.
    let i = isvc(
        "{model: {source: 'synthetic:tiny'}, replicas: 3, autoscaling: {minReplicas: 4, maxReplicas: 6}}",
    );
    store(&server, &i);
    reconcile(Arc::new(i), context(&server)).await.unwrap();
    let w = writes(&server);
    assert_eq!(
        write_to(&w, DEPLOYMENT).body["spec"]["replicas"],
        3,
        "the HPA's size, not the built-in autoscaler's"
    );
    let status = stored(&server).status.unwrap();
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == "AutoscalerConflict")
        .expect("an AutoscalerConflict condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "HorizontalPodAutoscaler")
    );
    assert!(
        c.message.contains("chat-hpa") && !c.message.contains("other-hpa"),
        "{}",
        c.message
    );
    let event = w
        .iter()
        .find(|c| c.path.ends_with("/events") && c.body["reason"] == "AutoscalerConflict")
        .expect("a Warning Event");
    assert_eq!(event.body["type"], "Warning");
    let reason = status.last_decision.clone().unwrap().reason;
    assert!(
        ["FollowingSpecReplicas", "AutoscalingDisabled"].contains(&reason.as_str()),
        "the size is spec.replicas': {reason}"
    );
    // The HPA deleted: the built-in autoscaler is back and the condition turns False.
    server
        .lock()
        .unwrap()
        .objects
        .remove(&format!("{hpas}/chat-hpa"));
    clear_calls(&server);
    let again = stored(&server);
    reconcile(Arc::new(again), context(&server)).await.unwrap();
    let status = stored(&server).status.unwrap();
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == "AutoscalerConflict")
        .unwrap();
    assert_eq!(c.status, "False");
    // The built-in autoscaler decides again (from the current size, which it does not
    // cut before a whole scale-down window).
    let reason = status.last_decision.unwrap().reason;
    assert!(
        !["FollowingSpecReplicas", "AutoscalingDisabled"].contains(&reason.as_str()),
        "{reason}"
    );
}

#[tokio::test]
async fn an_invalid_spec_waits_for_a_change_with_a_condition() {
    let server = Shared::default();
    // vLLM needs an image; the operator's default is for ballast engines only.
    let i = isvc("{model: {source: 'm'}, engine: {kind: vllm}}");
    store(&server, &i);
    let action = reconcile(Arc::new(i), context(&server)).await.unwrap();
    assert_eq!(action, Action::await_change());
    let w = writes(&server);
    assert!(
        w.iter().all(|c| c.path != DEPLOYMENT),
        "nothing is built from an invalid spec"
    );
    let status = stored(&server).status.unwrap();
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "InvalidSpec")
    );
    assert!(c.message.contains("spec.engine.image"), "{}", c.message);
    let event = w.iter().find(|c| c.path.ends_with("/events")).unwrap();
    assert_eq!(
        (event.body["type"].as_str(), event.body["reason"].as_str()),
        (Some("Warning"), Some("InvalidSpec"))
    );
    // Again: the condition is already there, so no second write or Event.
    clear_calls(&server);
    reconcile(Arc::new(stored(&server)), context(&server))
        .await
        .unwrap();
    assert!(writes(&server).is_empty());
    // The spec fixed: Degraded turns False instead of staying from before.
    let mut fixed = isvc(SPEC);
    fixed.status = stored(&server).status;
    store(&server, &fixed);
    reconcile(Arc::new(fixed), context(&server)).await.unwrap();
    let status = stored(&server).status.unwrap();
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SpecValid")
    );
}

fn degraded(server: &Shared) -> (String, String, String) {
    let status = stored(server).status.unwrap();
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[tokio::test]
async fn a_missing_api_key_secret_holds_the_service_until_it_appears() {
    const KEYS: &str = "/api/v1/namespaces/default/secrets/llm-keys";
    let server = Shared::default();
    let i = isvc(
        "{model: {source: 'synthetic:tiny'}, auth: {apiKeySecretRef: {name: llm-keys, key: api-key}}}",
    );
    store(&server, &i);
    // No Secret: nothing is built, a condition names it, and the operator looks again.
    let action = reconcile(Arc::new(i.clone()), context(&server))
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
    let w = writes(&server);
    assert!(w.iter().all(|c| c.path != DEPLOYMENT), "{w:#?}");
    let (status, reason, message) = degraded(&server);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ApiKeySecretMissing")
    );
    assert!(
        message.contains("Secret default/llm-keys not found"),
        "{message}"
    );
    let event = w.iter().find(|c| c.path.ends_with("/events")).unwrap();
    assert_eq!(event.body["reason"], "ApiKeySecretMissing");

    // The Secret without that key: named too.
    let secret = |data: Value| {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "llm-keys", "namespace": "default", "resourceVersion": "1"},
               "data": data})
    };
    server
        .lock()
        .unwrap()
        .objects
        .insert(KEYS.into(), secret(json!({"other": "eA=="})));
    reconcile(Arc::new(stored(&server)), context(&server))
        .await
        .unwrap();
    let (_, reason, message) = degraded(&server);
    assert_eq!(reason, "ApiKeySecretMissing");
    assert!(message.contains("has no key \"api-key\""), "{message}");

    // Fixed (the operator is not told: it finds it on its next look): the engines are
    // built with the key mounted, and the condition clears. No key text is written.
    server
        .lock()
        .unwrap()
        .objects
        .insert(KEYS.into(), secret(json!({"api-key": "c2stdGVzdC0xMjMK"})));
    clear_calls(&server);
    reconcile(Arc::new(stored(&server)), context(&server))
        .await
        .unwrap();
    let w = writes(&server);
    let d = &write_to(&w, DEPLOYMENT).body;
    let volumes = d["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let keys = volumes.iter().find(|v| v["name"] == "api-key").unwrap();
    assert_eq!(keys["secret"]["secretName"], "llm-keys");
    assert_eq!(keys["secret"]["items"][0]["key"], "api-key");
    let (status, reason, _) = degraded(&server);
    assert_eq!(status, "False", "{reason}");
    assert_ne!(reason, "ApiKeySecretMissing");
    for c in &w {
        assert!(!c.body.to_string().contains("sk-test-123"), "{c:#?}");
    }
}

#[tokio::test]
async fn a_model_volume_is_checked_then_mounted() {
    // Table: (spec.model.volume, a word the InvalidSpec message must have, or None if valid).
    let cases = [
        (
            "{persistentVolumeClaim: models, hostPath: /srv/models}",
            Some("exactly one of persistentVolumeClaim and hostPath"),
        ),
        ("{}", Some("exactly one of")),
        (
            "{persistentVolumeClaim: ''}",
            Some("model.volume.persistentVolumeClaim"),
        ),
        ("{hostPath: ''}", Some("model.volume.hostPath")),
        ("{persistentVolumeClaim: models}", None),
    ];
    for (volume, error) in cases {
        let server = Shared::default();
        let i = isvc(&format!(
            "{{model: {{source: smollm2-135m, volume: {volume}}}}}"
        ));
        store(&server, &i);
        reconcile(Arc::new(i), context(&server)).await.unwrap();
        let w = writes(&server);
        let Some(error) = error else {
            let pod = &write_to(&w, DEPLOYMENT).body["spec"]["template"]["spec"];
            assert_eq!(
                pod["volumes"][1],
                json!({"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": true}}),
                "{volume}"
            );
            let c = &pod["containers"][0];
            assert_eq!(
                c["volumeMounts"][1],
                json!({"name": "models", "mountPath": "/models", "readOnly": true})
            );
            assert!(
                c["env"]
                    .as_array()
                    .unwrap()
                    .contains(&json!({"name": "BALLAST_MODEL_CACHE", "value": "/models"})),
                "{}",
                c["env"]
            );
            continue;
        };
        assert!(
            w.iter().all(|c| c.path != DEPLOYMENT),
            "{volume}: nothing is built from an invalid spec"
        );
        let status = stored(&server).status.unwrap();
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap();
        assert_eq!(c.reason, "InvalidSpec", "{volume}");
        assert!(c.message.contains(error), "{volume}: {}", c.message);
    }
}

#[tokio::test]
async fn an_api_error_is_categorised_and_backs_off() {
    let server = Shared::default();
    let i = Arc::new(isvc(SPEC));
    store(&server, &i);
    server.lock().unwrap().fail.insert(DEPLOYMENT.into(), 500);
    let ctx = context(&server);
    let mut delays = Vec::new();
    for _ in 0..3 {
        let e = reconcile(Arc::clone(&i), Arc::clone(&ctx))
            .await
            .unwrap_err();
        assert_eq!(e.category(), "api");
        delays.push(error_policy(Arc::clone(&i), &e, Arc::clone(&ctx)));
    }
    assert_eq!(
        delays,
        [
            Action::requeue(Duration::from_secs(1)),
            Action::requeue(Duration::from_secs(2)),
            Action::requeue(Duration::from_secs(4)),
        ]
    );
    let metrics = ctx.metrics.render();
    assert!(
        metrics
            .contains("ballast_operator_reconcile_errors_total{category=\"api\",name=\"chat\",namespace=\"default\"} 3"),
        "{metrics}"
    );
    let warnings = writes(&server)
        .into_iter()
        .filter(|c| c.path.ends_with("/events"))
        .count();
    assert_eq!(
        warnings, 1,
        "one Warning for the run of failures, not one each"
    );
    // Once the API answers again, the failure count resets.
    server.lock().unwrap().fail.clear();
    reconcile(Arc::clone(&i), Arc::clone(&ctx)).await.unwrap();
    let e = kube::Error::Api(kube::core::Status::failure("x", "y").with_code(500).boxed());
    assert_eq!(
        error_policy(i, &e.into(), ctx),
        Action::requeue(Duration::from_secs(1))
    );
}

const PODS: &str = "/api/v1/namespaces/default/pods";

/// Puts a serving engine pod at `ip` in the server, with its accepting condition when set.
fn set_pod(server: &Shared, name: &str, ip: &str, accepting: Option<bool>) {
    let mut conditions = vec![json!({"type": "ContainersReady", "status": "True"})];
    if let Some(a) = accepting {
        conditions.push(
            json!({"type": "ballast.dev/accepting", "status": if a { "True" } else { "False" }}),
        );
    }
    server.lock().unwrap().objects.insert(
        format!("{PODS}/{name}"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": ballast_operator::labels::labels("chat")},
            "status": {"phase": "Running", "podIP": ip, "conditions": conditions},
        }),
    );
}

/// A pod as the server holds it now.
fn pod(server: &Shared, name: &str) -> Value {
    server.lock().unwrap().objects[&format!("{PODS}/{name}")].clone()
}

/// The status of a pod's `ballast.dev/accepting` condition, if it has one.
fn accepting(server: &Shared, name: &str) -> Option<String> {
    pod(server, name)["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "ballast.dev/accepting")
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

/// A ballast engine's metrics: running requests, capacity-waiting requests, KV usage.
fn engine_metrics(running: f64, waiting: f64, kv: f64) -> String {
    format!(
        "ballast_num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}\n\
         ballast_num_requests_waiting_by_reason{{engine=\"0\",model_name=\"m\",reason=\"capacity\"}} {waiting}\n\
         ballast_num_requests_waiting_by_reason{{engine=\"0\",model_name=\"m\",reason=\"deferred\"}} 0\n\
         ballast_kv_cache_usage_ratio{{engine=\"0\",model_name=\"m\"}} {kv}\n\
         ballast_admission_rejections_total{{engine=\"0\",model_name=\"m\",reason=\"max_num_queued_reqs\"}} 0\n"
    )
}

/// Engines' metrics endpoints, one per loopback address in `ips`, all on the one port the
/// spec's `engine.port` names (the operator scrapes each pod IP on it); the body each
/// answers can be changed between periods.
async fn engines(ips: &[&str]) -> (u16, Vec<Arc<Mutex<String>>>) {
    'port: loop {
        let first = tokio::net::TcpListener::bind((ips[0], 0)).await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for ip in &ips[1..] {
            match tokio::net::TcpListener::bind((*ip, port)).await {
                Ok(l) => listeners.push(l),
                Err(_) => continue 'port,
            }
        }
        let mut bodies = Vec::new();
        for listener in listeners {
            let body = Arc::new(Mutex::new(engine_metrics(0.0, 0.0, 0.1)));
            bodies.push(Arc::clone(&body));
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    let body = Arc::clone(&body);
                    async move { body.lock().unwrap().clone() }
                }),
            );
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        }
        return (port, bodies);
    }
}

/// Waits out one control period (`scrapeIntervalSeconds: 1`): the next reconcile scrapes.
async fn next_period() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

/// Index of the first write to `path` in `calls`.
fn position(calls: &[Call], path: &str) -> usize {
    calls
        .iter()
        .position(|c| c.path == path)
        .unwrap_or_else(|| panic!("no write to {path}: {calls:#?}"))
}

#[tokio::test]
async fn a_scale_down_sets_deletion_costs_before_the_smaller_size() {
    let ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
    let (port, bodies) = engines(&ips).await;
    // chat-a is busy, chat-b idle, chat-c in between.
    for (body, (running, waiting)) in bodies.iter().zip([(5.0, 2.0), (0.0, 0.0), (2.0, 0.0)]) {
        *body.lock().unwrap() = engine_metrics(running, waiting, 0.2);
    }
    let server = Shared::default();
    for (name, ip) in ["chat-a", "chat-b", "chat-c"].into_iter().zip(ips) {
        set_pod(&server, name, ip, Some(true));
    }
    let spec = |replicas: i32| {
        format!(
            "{{model: {{source: 'synthetic:tiny'}}, replicas: {replicas}, engine: {{port: {port}}}, \
             metrics: {{scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}}, autoscaling: {{enabled: false}}}}"
        )
    };
    let i = isvc(&spec(3));
    store(&server, &i);
    let ctx = context(&server);
    // The first period only seeds the rates: no decision, no deletion cost.
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    let w = writes(&server);
    assert_eq!(write_to(&w, DEPLOYMENT).body["spec"]["replicas"], 3);
    assert!(
        w.iter().all(|c| !c.path.starts_with(PODS)),
        "no pod write at the same size: {w:#?}"
    );

    let mut smaller = stored(&server);
    smaller.spec = isvc(&spec(2)).spec;
    smaller.metadata.generation = Some(2);
    store(&server, &smaller);
    next_period().await;
    clear_calls(&server);
    reconcile(Arc::new(smaller), Arc::clone(&ctx))
        .await
        .unwrap();
    let w = writes(&server);
    let deployment = position(&w, DEPLOYMENT);
    assert_eq!(w[deployment].body["spec"]["replicas"], 2);
    // Each pod's cost is its load (running + waiting): the idle one goes first.
    for (name, cost) in [("chat-a", "7"), ("chat-b", "0"), ("chat-c", "2")] {
        let path = format!("{PODS}/{name}");
        let at = position(&w, &path);
        assert!(
            at < deployment,
            "{name}'s cost after the scale-down: {w:#?}"
        );
        assert_eq!(w[at].method, "PATCH");
        assert_eq!(
            w[at].body,
            json!({"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": cost}}}),
            "{name}"
        );
        assert_eq!(
            pod(&server, name)["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"],
            cost
        );
    }
    let status = stored(&server).status.unwrap();
    assert_eq!(
        (status.observed_generation, status.desired_replicas),
        (Some(2), 2)
    );
}

#[tokio::test]
async fn a_hot_pod_leaves_rotation_through_its_readiness_gate_and_returns_when_cool() {
    let ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];
    let (port, bodies) = engines(&ips).await;
    let server = Shared::default();
    // chat-c is new: its gate has no condition yet.
    for (name, ip, gate) in [
        ("chat-a", ips[0], Some(true)),
        ("chat-b", ips[1], Some(true)),
        ("chat-c", ips[2], None),
    ] {
        set_pod(&server, name, ip, gate);
    }
    *bodies[0].lock().unwrap() = engine_metrics(2.0, 0.0, 0.97);
    for body in &bodies[1..] {
        *body.lock().unwrap() = engine_metrics(1.0, 0.0, 0.3);
    }
    let i = isvc(&format!(
        "{{model: {{source: 'synthetic:tiny'}}, replicas: 3, engine: {{port: {port}}}, \
         metrics: {{scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}}, autoscaling: {{enabled: false}}}}"
    ));
    store(&server, &i);
    let ctx = context(&server);
    // Seeding: no decision yet, but the new pod is put in rotation.
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    let w = writes(&server);
    let gates: Vec<&str> = w
        .iter()
        .filter(|c| c.path.starts_with(PODS))
        .map(|c| c.path.as_str())
        .collect();
    assert_eq!(gates, [format!("{PODS}/chat-c/status")]);
    assert_eq!(accepting(&server, "chat-c").as_deref(), Some("True"));

    // chat-a is hot (KV 0.97) in a cool fleet: out of rotation, through pods/status.
    next_period().await;
    clear_calls(&server);
    reconcile(Arc::new(stored(&server)), Arc::clone(&ctx))
        .await
        .unwrap();
    let w = writes(&server);
    let gates: Vec<&Call> = w.iter().filter(|c| c.path.starts_with(PODS)).collect();
    assert_eq!(gates.len(), 1, "{gates:#?}");
    assert_eq!(gates[0].path, format!("{PODS}/chat-a/status"));
    assert_eq!(gates[0].method, "PATCH");
    let c = &gates[0].body["status"]["conditions"][0];
    assert_eq!(
        (&c["type"], &c["status"], &c["reason"]),
        (
            &json!("ballast.dev/accepting"),
            &json!("False"),
            &json!("OutOfRotation")
        )
    );
    assert_eq!(accepting(&server, "chat-a").as_deref(), Some("False"));
    // The status counts the pods as read before this reconcile's writes: the next one
    // (between periods, no decision) counts chat-a out and writes nothing to the pods.
    clear_calls(&server);
    reconcile(Arc::new(stored(&server)), Arc::clone(&ctx))
        .await
        .unwrap();
    let w = writes(&server);
    assert!(w.iter().all(|c| !c.path.starts_with(PODS)), "{w:#?}");
    assert_eq!(stored(&server).status.unwrap().accepting_replicas, 2);

    // Cool again: back in rotation.
    *bodies[0].lock().unwrap() = engine_metrics(0.0, 0.0, 0.1);
    next_period().await;
    clear_calls(&server);
    reconcile(Arc::new(stored(&server)), Arc::clone(&ctx))
        .await
        .unwrap();
    let w = writes(&server);
    let gates: Vec<&Call> = w.iter().filter(|c| c.path.starts_with(PODS)).collect();
    assert_eq!(gates.len(), 1, "{gates:#?}");
    assert_eq!(gates[0].path, format!("{PODS}/chat-a/status"));
    let c = &gates[0].body["status"]["conditions"][0];
    assert_eq!(
        (&c["status"], &c["reason"]),
        (&json!("True"), &json!("InRotation"))
    );
    assert_eq!(accepting(&server, "chat-a").as_deref(), Some("True"));
    reconcile(Arc::new(stored(&server)), Arc::clone(&ctx))
        .await
        .unwrap();
    assert_eq!(stored(&server).status.unwrap().accepting_replicas, 3);
}

/// A port on loopback where nothing listens: a scrape of it fails at once.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `(observedGeneration, desiredReplicas)` of the stored status.
fn decided(server: &Shared) -> (Option<i64>, i32) {
    let s = stored(server).status.unwrap();
    (s.observed_generation, s.desired_replicas)
}

/// Stores `spec` as generation `generation` of the resource, keeping its status.
fn respec(server: &Shared, spec: &str, generation: i64) -> InferenceService {
    let mut i = stored(server);
    i.spec = isvc(spec).spec;
    i.metadata.generation = Some(generation);
    store(server, &i);
    i
}

#[tokio::test]
async fn observed_generation_names_the_spec_desired_replicas_was_decided_on() {
    let ips = ["127.0.0.1", "127.0.0.2"];
    let (port, _bodies) = engines(&ips).await;
    let server = Shared::default();
    for (name, ip) in ["chat-a", "chat-b"].into_iter().zip(ips) {
        set_pod(&server, name, ip, Some(true));
    }
    let spec = |replicas: i32| {
        format!(
            "{{model: {{source: 'synthetic:tiny'}}, replicas: {replicas}, engine: {{port: {port}}}, \
             metrics: {{scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}}, autoscaling: {{enabled: false}}}}"
        )
    };
    let i = isvc(&spec(2));
    store(&server, &i);
    let ctx = context(&server);
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    assert_eq!(decided(&server), (Some(1), 2));

    // Generation 2 asks for 3 between periods, before this process decided anything (the
    // first period only seeded): the size stays, and so does the generation it names.
    let i = respec(&server, &spec(3), 2);
    clear_calls(&server);
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    assert!(
        writes(&server).iter().all(|c| c.path != DEPLOYMENT),
        "not scaled before a decision"
    );
    assert_eq!(decided(&server), (Some(1), 2), "ahead of its decision");

    // The next period decides on generation 2.
    next_period().await;
    clear_calls(&server);
    reconcile(Arc::new(stored(&server)), Arc::clone(&ctx))
        .await
        .unwrap();
    assert_eq!(
        write_to(&writes(&server), DEPLOYMENT).body["spec"]["replicas"],
        3
    );
    assert_eq!(decided(&server), (Some(2), 3));

    // Once it has decided, a new spec is decided on at once, between periods.
    let i = respec(&server, &spec(4), 3);
    clear_calls(&server);
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    assert_eq!(
        write_to(&writes(&server), DEPLOYMENT).body["spec"]["replicas"],
        4
    );
    assert_eq!(decided(&server), (Some(3), 4));

    // A restarted operator seeds first: generation 4 waits, the status keeps naming 3.
    let i = respec(&server, &spec(5), 4);
    clear_calls(&server);
    reconcile(Arc::new(i), context(&server)).await.unwrap();
    assert!(writes(&server).iter().all(|c| c.path != DEPLOYMENT));
    assert_eq!(decided(&server), (Some(3), 4));
}

#[tokio::test]
async fn an_invalid_spec_counts_the_pods_that_still_run_at_the_deployment_size() {
    let server = Shared::default();
    let port = closed_port();
    set_pod(&server, "chat-a", "127.0.0.1", Some(true));
    set_pod(&server, "chat-b", "127.0.0.2", Some(true));
    // chat-c starts: not serving yet.
    set_pod(&server, "chat-c", "127.0.0.3", None);
    server
        .lock()
        .unwrap()
        .objects
        .get_mut(&format!("{PODS}/chat-c"))
        .unwrap()["status"]["conditions"][0]["status"] = json!("False");
    let i = isvc(&format!(
        "{{model: {{source: 'synthetic:tiny'}}, replicas: 3, engine: {{port: {port}}}, autoscaling: {{enabled: false}}}}"
    ));
    store(&server, &i);
    reconcile(Arc::new(i), context(&server)).await.unwrap();
    assert_eq!(
        write_to(&writes(&server), DEPLOYMENT).body["spec"]["replicas"],
        3
    );

    // vLLM without an image, asking for 5: nothing is built or scaled, the pods built
    // before keep serving and are counted as they run.
    let i = respec(
        &server,
        &format!(
            "{{model: {{source: m}}, replicas: 5, engine: {{kind: vllm, port: {port}}}, autoscaling: {{enabled: false}}}}"
        ),
        2,
    );
    clear_calls(&server);
    let action = reconcile(Arc::new(i), context(&server)).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(writes(&server).iter().all(|c| c.path != DEPLOYMENT));
    let s = stored(&server).status.unwrap();
    assert_eq!(
        (s.replicas, s.ready_replicas, s.accepting_replicas),
        (3, 2, 2),
        "the pods that run"
    );
    assert_eq!(
        s.desired_replicas, 3,
        "the Deployment's size, not the spec's"
    );
    let degraded = s.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
    assert_eq!(degraded.reason, "InvalidSpec");
}

#[tokio::test]
async fn updated_replicas_follows_the_deployment_rollout() {
    let server = Shared::default();
    let i = isvc(&format!(
        "{{model: {{source: 'synthetic:tiny'}}, replicas: 3, engine: {{port: {}}}, autoscaling: {{enabled: false}}}}",
        closed_port()
    ));
    store(&server, &i);
    let ctx = context(&server);
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    assert_eq!(stored(&server).status.unwrap().updated_replicas, 0);
    // The Deployment controller, mid-rollout: (generation, observedGeneration,
    // updatedReplicas) and the updatedReplicas the status must show.
    for (generation, observed, updated, want) in [
        (2, 2, 1, 1),
        (2, 2, 2, 2),
        // A new template it has not seen yet: its count is of the old one.
        (3, 2, 3, 0),
        (3, 3, 3, 3),
    ] {
        {
            let mut s = server.lock().unwrap();
            let d = s.objects.get_mut(DEPLOYMENT).unwrap();
            d["metadata"]["generation"] = json!(generation);
            d["status"] = json!({"observedGeneration": observed, "replicas": 3,
                "updatedReplicas": updated, "readyReplicas": 3});
        }
        clear_calls(&server);
        reconcile(Arc::new(stored(&server)), Arc::clone(&ctx))
            .await
            .unwrap();
        assert!(
            writes(&server).iter().all(|c| c.path != DEPLOYMENT),
            "the Deployment is unchanged"
        );
        assert_eq!(
            stored(&server).status.unwrap().updated_replicas,
            want,
            "generation {generation}, observed {observed}, updated {updated}"
        );
    }
}

/// An engine's control API as the operator sees it, standing in for a DP engine: it serves
/// the TLS pair of the service's Secret and records each `SetDpWeights` call with the
/// `authorization` header it carried. Other calls are not needed here.
#[derive(Clone, Default)]
struct ControlStandIn {
    calls: Arc<Mutex<Vec<WeightsCall>>>,
}

/// The weights a `SetDpWeights` call asked for, and its `authorization` header.
type WeightsCall = (Vec<f64>, Option<String>);

type StatsStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<control::StatsSnapshot, tonic::Status>> + Send>,
>;

#[tonic::async_trait]
impl control::engine_control_server::EngineControl for ControlStandIn {
    type StreamStatsStream = StatsStream;

    async fn get_stats(
        &self,
        _: tonic::Request<control::GetStatsRequest>,
    ) -> Result<tonic::Response<control::StatsSnapshot>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn stream_stats(
        &self,
        _: tonic::Request<control::StreamStatsRequest>,
    ) -> Result<tonic::Response<StatsStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn set_dp_weights(
        &self,
        req: tonic::Request<control::SetDpWeightsRequest>,
    ) -> Result<tonic::Response<control::SetDpWeightsResponse>, tonic::Status> {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let weights = req.into_inner().weights;
        self.calls.lock().unwrap().push((weights.clone(), auth));
        Ok(tonic::Response::new(control::SetDpWeightsResponse {
            weights,
        }))
    }

    async fn drain(
        &self,
        _: tonic::Request<control::DrainRequest>,
    ) -> Result<tonic::Response<control::DrainResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn resume(
        &self,
        _: tonic::Request<control::ResumeRequest>,
    ) -> Result<tonic::Response<control::ResumeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn reset_prefix_cache(
        &self,
        _: tonic::Request<control::ResetPrefixCacheRequest>,
    ) -> Result<tonic::Response<control::ResetPrefixCacheResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
}

/// A key of the stored control-token Secret, as text.
fn secret_text(server: &Shared, key: &str) -> String {
    let s = server.lock().unwrap();
    let data = s.objects[TOKEN_SECRET]["data"][key].clone();
    let bytes: k8s_openapi::ByteString = serde_json::from_value(data).unwrap();
    String::from_utf8(bytes.0).unwrap()
}

/// Serves `stand_in` on `listener` over TLS with the Secret's serving pair.
fn serve_control(server: &Shared, listener: tokio::net::TcpListener, stand_in: ControlStandIn) {
    let identity = tonic::transport::Identity::from_pem(
        secret_text(server, "tls.crt"),
        secret_text(server, "tls.key"),
    );
    let router = tonic::transport::Server::builder()
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
        .unwrap()
        .add_service(control::engine_control_server::EngineControlServer::new(
            stand_in,
        ));
    let incoming = futures::stream::unfold(listener, |l| async move {
        let accepted = l.accept().await.map(|(stream, _)| stream);
        Some((accepted, l))
    });
    tokio::spawn(router.serve_with_incoming(incoming));
}

/// A two-rank engine's metrics: the tokens each rank has scheduled so far.
fn dp_metrics(rank0: u64, rank1: u64) -> String {
    let mut body = String::new();
    for (rank, tokens) in [(0, rank0), (1, rank1)] {
        body.push_str(&format!(
            "ballast_num_requests_running{{engine=\"{rank}\",model_name=\"m\"}} 1\n\
             ballast_num_requests_waiting_by_reason{{engine=\"{rank}\",model_name=\"m\",reason=\"capacity\"}} 0\n\
             ballast_num_requests_waiting_by_reason{{engine=\"{rank}\",model_name=\"m\",reason=\"deferred\"}} 0\n\
             ballast_kv_cache_usage_ratio{{engine=\"{rank}\",model_name=\"m\"}} 0.2\n\
             ballast_dp_tokens_total{{engine=\"{rank}\",kind=\"scheduled\",model_name=\"m\"}} {tokens}\n"
        ));
    }
    body.push_str(
        "ballast_admission_rejections_total{engine=\"0\",model_name=\"m\",reason=\"max_num_queued_reqs\"} 0\n",
    );
    body
}

#[tokio::test]
async fn dp_weights_go_over_the_control_api_when_the_ranks_are_imbalanced() {
    let ips = ["127.0.0.1"];
    let (port, bodies) = engines(&ips).await;
    *bodies[0].lock().unwrap() = dp_metrics(1000, 1000);
    let control_listener = tokio::net::TcpListener::bind((ips[0], 0)).await.unwrap();
    let grpc_port = control_listener.local_addr().unwrap().port();
    let server = Shared::default();
    set_pod(&server, "chat-a", ips[0], Some(true));
    // The pod runs the engine with the control API's TLS on, as the Deployment builds it.
    server
        .lock()
        .unwrap()
        .objects
        .get_mut(&format!("{PODS}/chat-a"))
        .unwrap()["spec"] = json!({
        "containers": [{"name": "engine", "env": [
            {"name": "BALLAST_CONTROL_TLS_CERT", "value": "/var/run/ballast/control/tls.crt"}
        ]}]
    });
    let i = isvc(&format!(
        "{{model: {{source: 'synthetic:tiny'}}, replicas: 1, \
         engine: {{port: {port}, grpcPort: {grpc_port}, dataParallelSize: 2}}, \
         metrics: {{scrapeIntervalSeconds: 1, scrapeTimeoutSeconds: 1}}, autoscaling: {{enabled: false}}}}"
    ));
    store(&server, &i);
    let ctx = context(&server);
    // The first period makes the Secret (token and TLS pair) and seeds the rates.
    reconcile(Arc::new(i), Arc::clone(&ctx)).await.unwrap();
    let stand_in = ControlStandIn::default();
    serve_control(&server, control_listener, stand_in.clone());
    let token = token_lines(&server)[0].clone();

    // Over the period rank 0 scheduled 900 tokens and rank 1 100: a ratio of 1.8, above
    // the default 1.5. Even weights divided by the shares give rank 1 nine times rank 0's.
    *bodies[0].lock().unwrap() = dp_metrics(1900, 1100);
    next_period().await;
    reconcile(Arc::new(stored(&server)), Arc::clone(&ctx))
        .await
        .unwrap();
    let calls = stand_in.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (weights, auth) = &calls[0];
    assert_eq!(auth.as_deref(), Some(format!("Bearer {token}").as_str()));
    assert_eq!(weights.len(), 2);
    assert!(
        (weights[0] - 0.1).abs() < 1e-9 && (weights[1] - 0.9).abs() < 1e-9,
        "{weights:?}"
    );

    // Balanced under the new weights (500 each): nothing more to push.
    *bodies[0].lock().unwrap() = dp_metrics(2400, 1600);
    next_period().await;
    reconcile(Arc::new(stored(&server)), Arc::clone(&ctx))
        .await
        .unwrap();
    assert_eq!(stand_in.calls.lock().unwrap().len(), 1);
}
