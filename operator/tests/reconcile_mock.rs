//! Reconcile against kube's mock service (tower-test): a small in-memory API server answers
//! every request the reconciler makes and records it, and each scenario checks the calls
//! and the bodies written — create, a no-op on an unchanged spec, the status patch, the
//! scale-subresource path, an invalid spec, a model volume, and an API error with its
//! backoff.
//!
//! The real API server (admission, CEL, server-side apply semantics) is the e2e suite's
//! job; here every request is checked for method, path, parameters and content.

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ballast_crds::InferenceService;
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
    // Collections.
    if method == "GET" && path.ends_with("/pods") {
        let items: Vec<Value> = s
            .objects
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{path}/")))
            .map(|(_, v)| v.clone())
            .collect();
        return respond(
            StatusCode::OK,
            &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}),
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
            if subresource {
                stored["status"] = body["status"].clone();
            } else {
                merge(stored, &body);
            }
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
        [DEPLOYMENT, SERVICE, PDB, &format!("{ISVC_PATH}/status")],
        "no event: holding while replicas start changes nothing"
    );
    for c in &w {
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
