//! Reconciles against kube's mock API server (tower-test): engine pods that cannot run,
//! as the kubelet reports them, and what the InferenceService's status and Events say.

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::{Arc, Mutex};

use ballast_crds::InferenceService;
use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

use super::{Config, Context, reconcile};
use crate::metrics::OperatorMetrics;

const ISVC: &str = "/apis/ballast.dev/v1alpha1/namespaces/default/inferenceservices/chat";
const PODS: &str = "/api/v1/namespaces/default/pods";

/// One request the reconciler made.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    path: String,
    body: Value,
}

/// Objects by path and every call.
#[derive(Default)]
struct Server {
    objects: BTreeMap<String, Value>,
    calls: Vec<Call>,
}

type Shared = Arc<Mutex<Server>>;

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

fn not_found() -> Response<Body> {
    respond(
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
    )
}

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
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut s = server.lock().unwrap();
    s.calls.push(Call {
        method: method.clone(),
        path: path.clone(),
        body: body.clone(),
    });
    if method == "GET" && path == PODS {
        let items: Vec<Value> = s
            .objects
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{PODS}/")))
            .map(|(_, v)| v.clone())
            .collect();
        return respond(
            StatusCode::OK,
            &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}),
        );
    }
    if method == "POST" && path.ends_with("/events") {
        return respond(StatusCode::CREATED, &body);
    }
    let (object, subresource) = match path.strip_suffix("/status") {
        Some(p) => (p.to_string(), true),
        None => (path.clone(), false),
    };
    match method.as_str() {
        "GET" => match s.objects.get(&object) {
            Some(o) => respond(StatusCode::OK, o),
            None => not_found(),
        },
        "PATCH" => {
            let stored = s.objects.entry(object).or_insert(Value::Null);
            if stored.is_null() {
                if subresource {
                    return not_found();
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
        // Create (the control-token Secret): stored under its name.
        "POST" => {
            let name = body["metadata"]["name"].as_str().unwrap_or_default();
            let at = format!("{path}/{name}");
            if s.objects.contains_key(&at) {
                return respond(
                    StatusCode::CONFLICT,
                    &json!({"kind": "Status", "code": 409}),
                );
            }
            let mut stored = body.clone();
            stored["metadata"]["resourceVersion"] = json!("1");
            s.objects.insert(at, stored.clone());
            respond(StatusCode::CREATED, &stored)
        }
        _ => respond(StatusCode::METHOD_NOT_ALLOWED, &json!({})),
    }
}

fn context(server: &Shared) -> Arc<Context> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let shared = Arc::clone(server);
    tokio::spawn(async move {
        let mut handle = pin!(handle);
        while let Some((req, send)) = handle.next_request().await {
            send.send_response(serve(Arc::clone(&shared), req).await);
        }
    });
    let client = Client::new(service, "default");
    Context::new(
        client.clone(),
        Config {
            default_engine_image: "ballast:test".into(),
            ..Config::default()
        },
        Arc::new(OperatorMetrics::new()),
        Recorder::new(
            client,
            Reporter {
                controller: "ballast-operator".into(),
                instance: Some("test".into()),
            },
        ),
    )
}

/// The resource as the server holds it (with the status written so far).
fn stored(server: &Shared) -> InferenceService {
    serde_json::from_value(server.lock().unwrap().objects[ISVC].clone()).unwrap()
}

/// Replaces the engine pods with ones whose `engine` container has `state` (and
/// `lastState`), as the kubelet reports them.
fn set_pods(server: &Shared, pods: &[(&str, Value, Value)]) {
    let mut s = server.lock().unwrap();
    s.objects.retain(|k, _| !k.starts_with(&format!("{PODS}/")));
    for (name, state, last) in pods {
        s.objects.insert(
            format!("{PODS}/{name}"),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": crate::labels::labels("chat")},
                "status": {
                    "phase": "Pending",
                    "conditions": [{"type": "ContainersReady", "status": "False"}],
                    "containerStatuses": [{"name": "engine", "ready": false, "restartCount": 3,
                        "image": "ballast:test", "imageID": "", "state": state, "lastState": last}],
                },
            }),
        );
    }
}

/// Reconciles the stored resource once; returns the Degraded condition as (status,
/// reason, message) and the Events published, as (type, reason, note).
async fn period(
    server: &Shared,
) -> (
    Option<(String, String, String)>,
    Vec<(String, String, String)>,
) {
    server.lock().unwrap().calls.clear();
    reconcile(Arc::new(stored(server)), context(server))
        .await
        .unwrap();
    let degraded = stored(server).status.and_then(|s| {
        s.conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded")
            .map(|c| (c.status, c.reason, c.message))
    });
    let events = server
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/events"))
        .map(|c| {
            let field = |k: &str| c.body[k].as_str().unwrap_or_default().to_string();
            (field("type"), field("reason"), field("note"))
        })
        .collect();
    (degraded, events)
}

fn waiting(reason: &str, message: &str) -> Value {
    json!({"waiting": {"reason": reason, "message": message}})
}

#[tokio::test]
async fn pods_that_cannot_run_make_it_degraded_with_an_event_until_they_run() {
    let server = Shared::default();
    let mut i = ballast_crds::parse_yaml(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: chat, namespace: default}\nspec: {model: {source: 'synthetic:tiny'}, replicas: 2, autoscaling: {enabled: false}}\n",
    )
    .unwrap()
    .remove(0);
    i.metadata.uid = Some("uid".into());
    i.metadata.generation = Some(1);
    server
        .lock()
        .unwrap()
        .objects
        .insert(ISVC.into(), serde_json::to_value(&i).unwrap());

    // Healthy from the start: no Degraded condition at all.
    set_pods(&server, &[("chat-a", json!({"running": {}}), json!({}))]);
    let (degraded, events) = period(&server).await;
    assert_eq!(degraded, None);
    assert!(events.is_empty(), "{events:?}");

    // The image is not on the node (pull policy Never) for one pod, backing off on the
    // other.
    let never = "Container image \"ballast:test\" is not present with pull policy of Never";
    set_pods(
        &server,
        &[
            ("chat-a", waiting("ErrImageNeverPull", never), json!({})),
            (
                "chat-b",
                waiting(
                    "ImagePullBackOff",
                    "Back-off pulling image \"ballast:test\"",
                ),
                json!({}),
            ),
        ],
    );
    let (degraded, events) = period(&server).await;
    let (status, reason, message) = degraded.expect("a Degraded condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ImagePullFailed")
    );
    assert_eq!(
        message,
        format!("pod chat-a container engine: ErrImageNeverPull: {never}; 2 of 2 pods cannot run")
    );
    assert_eq!(
        events,
        [("Warning".into(), "ImagePullFailed".into(), message.clone())]
    );
    // Nothing changed: no write, no second Event.
    let (again, events) = period(&server).await;
    assert_eq!(again.unwrap().2, message);
    assert!(events.is_empty(), "{events:?}");
    let writes = server
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.method != "GET")
        .count();
    assert_eq!(writes, 0);

    // The image fixed, the engine exits at start: a crash loop, with its last words.
    let last = json!({"terminated": {"exitCode": 2, "reason": "Error",
        "message": "error: --model: unknown model synthetic:nope\n"}});
    let backoff = |s: u32| {
        waiting(
            "CrashLoopBackOff",
            &format!("back-off {s}s restarting failed container=engine pod=chat-a"),
        )
    };
    set_pods(&server, &[("chat-a", backoff(10), last.clone())]);
    let (degraded, events) = period(&server).await;
    let (status, reason, message) = degraded.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "EngineCrashLoop")
    );
    assert_eq!(
        message,
        "pod chat-a container engine: CrashLoopBackOff: back-off 10s restarting failed container=engine pod=chat-a (last exit: exit code 2 (Error): error: --model: unknown model synthetic:nope)"
    );
    assert_eq!(events.len(), 1, "the reason changed: {events:?}");
    assert_eq!(
        (events[0].0.as_str(), events[0].1.as_str()),
        ("Warning", "EngineCrashLoop")
    );
    // The back-off grows: the message follows, without another Event.
    set_pods(&server, &[("chat-a", backoff(20), last)]);
    let (degraded, events) = period(&server).await;
    assert!(degraded.unwrap().2.contains("back-off 20s"));
    assert!(events.is_empty(), "{events:?}");

    // The pods run: Degraded turns False, once, with a Normal Event.
    set_pods(&server, &[("chat-a", json!({"running": {}}), json!({}))]);
    let (degraded, events) = period(&server).await;
    let (status, reason, _) = degraded.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "EnginesRunning")
    );
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0].0.as_str(), events[0].1.as_str()),
        ("Normal", "EnginesRunning")
    );
    let (degraded, events) = period(&server).await;
    assert_eq!(degraded.unwrap().0, "False");
    assert!(events.is_empty(), "{events:?}");
}

/// The size the reconciler last patched into the Deployment, if it patched it.
fn patched_replicas(server: &Shared) -> Option<i64> {
    let s = server.lock().unwrap();
    s.calls
        .iter()
        .rev()
        .find(|c| c.method == "PATCH" && c.path.ends_with("/deployments/chat"))
        .and_then(|c| c.body["spec"]["replicas"].as_i64())
}

#[tokio::test]
async fn an_advised_service_shows_its_decision_and_applies_none_until_it_acts() {
    let server = Shared::default();
    let spec = |mode: &str| {
        let mut i = ballast_crds::parse_yaml(&format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat, namespace: default}}\nspec: {{model: {{source: 'synthetic:tiny'}}, autoscaling: {{mode: {mode}, minReplicas: 3, maxReplicas: 4}}}}\n"
        ))
        .unwrap()
        .remove(0);
        i.metadata.uid = Some("uid".into());
        i.metadata.generation = Some(1);
        i
    };
    let put = |i: &InferenceService| {
        let mut v = serde_json::to_value(i).unwrap();
        let mut s = server.lock().unwrap();
        if let Some(status) = s.objects.get(ISVC).map(|o| o["status"].clone()) {
            v["status"] = status;
        }
        s.objects.insert(ISVC.into(), v);
    };
    put(&spec("Advise"));
    // The Deployment runs one replica (the team's own autoscaler sized it).
    server.lock().unwrap().objects.insert(
        "/apis/apps/v1/namespaces/default/deployments/chat".into(),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "chat", "namespace": "default", "resourceVersion": "1"},
               "spec": {"replicas": 1}}),
    );

    let (_, events) = period(&server).await;
    let status = stored(&server).status.unwrap();
    assert_eq!(status.desired_replicas, 3, "the advice");
    assert_eq!(
        patched_replicas(&server),
        Some(1),
        "the size is left as it is"
    );
    let advising = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Advising")
        .expect("an Advising condition");
    assert_eq!(
        (advising.status.as_str(), advising.reason.as_str()),
        ("True", "AdviseMode")
    );
    assert!(
        advising
            .message
            .contains("desiredReplicas 3 is advice, the service runs 1")
    );
    assert!(
        events
            .iter()
            .any(|(_, reason, note)| reason == "AdviseBelowMinReplicas"
                && note.starts_with("advice, not applied")),
        "{events:?}"
    );
    // The same advice again: said once, not every period.
    let (_, events) = period(&server).await;
    assert!(
        events.iter().all(|(_, r, _)| !r.starts_with("Advise")),
        "{events:?}"
    );
    assert!(
        patched_replicas(&server).is_none_or(|r| r == 1),
        "nothing resized"
    );

    // Act: the standing decision is applied, and the condition goes.
    put(&spec("Act"));
    let (_, events) = period(&server).await;
    assert_eq!(patched_replicas(&server), Some(3));
    let status = stored(&server).status.unwrap();
    assert!(status.conditions.iter().all(|c| c.type_ != "Advising"));
    assert!(
        events.iter().any(|(_, r, _)| r == "BelowMinReplicas"),
        "{events:?}"
    );
}
