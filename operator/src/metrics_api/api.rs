//! The two metrics APIs as HTTP: which request a method, path, query and `Accept` make
//! ([`parse`]), what authorizing it asks ([`ApiRequest::attributes`]), and the answer from
//! the [`Board`] ([`respond`]). Pure: no I/O, no clock but the one passed in.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use http::StatusCode;
use serde_json::{Value as Json, json};

use super::selector::Selector;
use super::values::{Board, Metric, Record};

/// `custom.metrics.k8s.io`.
pub const CUSTOM_GROUP: &str = "custom.metrics.k8s.io";
/// The custom metrics API version served.
pub const CUSTOM_VERSION: &str = "v1beta2";
/// `external.metrics.k8s.io`.
pub const EXTERNAL_GROUP: &str = "external.metrics.k8s.io";
/// The external metrics API version served.
pub const EXTERNAL_VERSION: &str = "v1beta1";
/// The custom-metrics resource of an InferenceService.
pub const ISVC_RESOURCE: &str = "inferenceservices.ballast.dev";
/// The metric label (and `labelSelector` key) naming the InferenceService of an external
/// metric.
pub const SERVICE_LABEL: &str = "ballast.dev/inferenceservice";

/// What a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiRequest {
    /// `/healthz`, `/livez`, `/readyz` (answered without authentication).
    Health,
    /// `/openapi/v2` or `/openapi/v3` (the aggregator reads them; nothing to describe).
    OpenApi { v3: bool },
    /// `/apis`: both groups.
    Groups,
    /// `/apis/GROUP`.
    Group { external: bool },
    /// `/apis/GROUP/VERSION`: the resource list naming every metric.
    Resources { external: bool },
    /// An InferenceService's Object metric (`name` `*`: every one in the namespace).
    Object {
        namespace: String,
        name: String,
        metric: Metric,
        metric_selector: Selector,
    },
    /// Pods metrics: one pod, or `*` with a `labelSelector`.
    Pods {
        namespace: String,
        name: String,
        metric: Metric,
        selector: Selector,
        metric_selector: Selector,
    },
    /// An external metric of the InferenceServices the `labelSelector` picks.
    External {
        namespace: String,
        metric: Metric,
        selector: Selector,
    },
}

/// A refusal with its code, as a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// HTTP status.
    pub code: StatusCode,
    /// The `Status` reason (`NotFound`, `BadRequest`…).
    pub reason: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Failure {
    /// A failure with `code`, `reason` and `message`.
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFound", message)
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// The `Status` body.
    pub fn body(&self) -> Json {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        })
    }
}

/// What a SubjectAccessReview asks about a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attributes {
    /// A resource request (verb `get`).
    Resource {
        /// API group.
        group: &'static str,
        /// API version.
        version: &'static str,
        /// Resource (`inferenceservices.ballast.dev`, `pods`, or an external metric's name).
        resource: String,
        /// The metric, for custom metrics.
        subresource: String,
        /// Namespace.
        namespace: String,
        /// Object name (empty for `*` and external metrics).
        name: String,
    },
    /// A non-resource URL (discovery, OpenAPI).
    NonResource {
        /// The path.
        path: String,
    },
}

impl ApiRequest {
    /// What authorizing this request asks; `None` for health checks, which every caller
    /// may read.
    pub fn attributes(&self, path: &str) -> Option<Attributes> {
        let custom =
            |resource: &str, namespace: &str, name: &str, metric: Metric| Attributes::Resource {
                group: CUSTOM_GROUP,
                version: CUSTOM_VERSION,
                resource: resource.to_string(),
                subresource: metric.as_str().to_string(),
                namespace: namespace.to_string(),
                name: if name == "*" {
                    String::new()
                } else {
                    name.to_string()
                },
            };
        Some(match self {
            ApiRequest::Health => return None,
            ApiRequest::OpenApi { .. }
            | ApiRequest::Groups
            | ApiRequest::Group { .. }
            | ApiRequest::Resources { .. } => Attributes::NonResource {
                path: path.to_string(),
            },
            ApiRequest::Object {
                namespace,
                name,
                metric,
                ..
            } => custom(ISVC_RESOURCE, namespace, name, *metric),
            ApiRequest::Pods {
                namespace,
                name,
                metric,
                ..
            } => custom("pods", namespace, name, *metric),
            ApiRequest::External {
                namespace, metric, ..
            } => Attributes::Resource {
                group: EXTERNAL_GROUP,
                version: EXTERNAL_VERSION,
                resource: metric.as_str().to_string(),
                subresource: String::new(),
                namespace: namespace.clone(),
                name: String::new(),
            },
        })
    }
}

/// Whether an `Accept` header lets the server answer plain JSON. Absent, `*/*`,
/// `application/*` and `application/json` do — unless the JSON range asks for another
/// kind (`as=APIGroupDiscoveryList`, aggregated discovery, which this server does not
/// serve so that the aggregator falls back to per-version discovery).
pub fn accepts_json(accept: Option<&str>) -> bool {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return true;
    };
    accept.split(',').any(|range| {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let params: Vec<(String, String)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let quality_zero = params
            .iter()
            .any(|(k, v)| k == "q" && v.parse::<f64>().is_ok_and(|q| q <= 0.0));
        let other_kind = params.iter().any(|(k, _)| k == "as" || k == "g");
        matches!(media.as_str(), "*/*" | "application/*" | "application/json")
            && !quality_zero
            && !other_kind
    })
}

/// Decodes `%XX` escapes and `+` in a query component.
fn unescape(s: &str) -> Result<String, Failure> {
    unescape_with(s, true)
}

/// Decodes `%XX` escapes (`+` is `+` in a path; the aggregator sends `*` as `%2A`).
fn unescape_with(s: &str, plus_is_space: bool) -> Result<String, Failure> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| Failure::bad_request(format!("bad escape in {s:?}")))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| Failure::bad_request(format!("{s:?} is not UTF-8")))
}

/// The query's parameters (the last of a repeated one wins).
fn query_params(query: Option<&str>) -> Result<BTreeMap<String, String>, Failure> {
    let mut out = BTreeMap::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(unescape(k)?, unescape(v)?);
    }
    Ok(out)
}

fn selector(params: &BTreeMap<String, String>, key: &str) -> Result<Selector, Failure> {
    Selector::parse(params.get(key).map_or("", String::as_str))
        .map_err(|e| Failure::bad_request(format!("{key}: {e}")))
}

fn metric(name: &str, allowed: &[Metric], what: &str) -> Result<Metric, Failure> {
    Metric::parse(name)
        .filter(|m| allowed.contains(m))
        .ok_or_else(|| {
            let known: Vec<&str> = allowed.iter().map(|m| m.as_str()).collect();
            Failure::not_found(format!(
                "no metric {name:?} for {what}; known: {}",
                known.join(", ")
            ))
        })
}

/// A DNS-1123 name, or `*` where a wildcard is allowed.
fn object_name(s: &str, wildcard: bool) -> Result<String, Failure> {
    let ok = (wildcard && s == "*")
        || (!s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(Failure::bad_request(format!("invalid name {s:?}")))
    }
}

/// Reads a request. Errors are `Status` failures with their code: 405 for another method,
/// 406 for an `Accept` without plain JSON, 400 for a bad selector or name, 404 for
/// anything else unknown.
pub fn parse(
    method: &http::Method,
    path: &str,
    query: Option<&str>,
    accept: Option<&str>,
) -> Result<ApiRequest, Failure> {
    let decoded = path
        .trim_end_matches('/')
        .split('/')
        .skip(1)
        .map(|s| unescape_with(s, false))
        .collect::<Result<Vec<String>, Failure>>()?;
    let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
    if let ["healthz" | "livez" | "readyz", ..] = segments.as_slice() {
        return Ok(ApiRequest::Health);
    }
    if method != http::Method::GET {
        return Err(Failure::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not supported; the metrics APIs are read with GET"),
        ));
    }
    if let ["openapi", v @ ("v2" | "v3")] = segments.as_slice() {
        return Ok(ApiRequest::OpenApi { v3: *v == "v3" });
    }
    if !accepts_json(accept) {
        return Err(Failure::new(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            format!(
                "only application/json is served (no aggregated discovery, no protobuf); Accept was {:?}",
                accept.unwrap_or_default()
            ),
        ));
    }
    let params = query_params(query)?;
    let external = match segments.as_slice() {
        ["apis"] => return Ok(ApiRequest::Groups),
        ["apis", CUSTOM_GROUP, ..] => false,
        ["apis", EXTERNAL_GROUP, ..] => true,
        _ => return Err(Failure::not_found(format!("no such path {path:?}"))),
    };
    let version = if external {
        EXTERNAL_VERSION
    } else {
        CUSTOM_VERSION
    };
    let rest = &segments[2..];
    match rest {
        [] => return Ok(ApiRequest::Group { external }),
        [v] if *v == version => return Ok(ApiRequest::Resources { external }),
        [v, ..] if *v != version => {
            return Err(Failure::not_found(format!(
                "version {v:?} is not served; {} serves {version}",
                segments[1]
            )));
        }
        _ => {}
    }
    match (external, &rest[1..]) {
        (true, ["namespaces", ns, m]) => Ok(ApiRequest::External {
            namespace: object_name(ns, false)?,
            metric: metric(m, &Metric::SERVICE, "external metrics")?,
            selector: selector(&params, "labelSelector")?,
        }),
        (false, ["namespaces", ns, ISVC_RESOURCE, name, m]) => Ok(ApiRequest::Object {
            namespace: object_name(ns, false)?,
            name: object_name(name, true)?,
            metric: metric(m, &Metric::SERVICE, ISVC_RESOURCE)?,
            metric_selector: selector(&params, "metricLabelSelector")?,
        }),
        (false, ["namespaces", ns, "pods", name, m]) => Ok(ApiRequest::Pods {
            namespace: object_name(ns, false)?,
            name: object_name(name, true)?,
            metric: metric(m, &Metric::POD, "pods")?,
            selector: selector(&params, "labelSelector")?,
            metric_selector: selector(&params, "metricLabelSelector")?,
        }),
        (false, ["namespaces", _, resource, _, _]) => Err(Failure::not_found(format!(
            "no metrics for resource {resource:?}; served: {ISVC_RESOURCE}, pods"
        ))),
        _ => Err(Failure::not_found(format!("no such path {path:?}"))),
    }
}

/// A Kubernetes quantity for `v`: an integer when it is one, else milli-, micro- or
/// nano-units, whichever is exact at nanos (what HPA reads without rounding).
pub fn quantity(v: f64) -> String {
    let nanos = (v * 1e9).round().clamp(i64::MIN as f64, i64::MAX as f64) as i64;
    for (div, suffix) in [(1_000_000_000, ""), (1_000_000, "m"), (1_000, "u")] {
        if nanos % div == 0 {
            return format!("{}{suffix}", nanos / div);
        }
    }
    format!("{nanos}n")
}

fn timestamp(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.round(k8s_openapi::jiff::Unit::Second).unwrap_or(t))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn resource_list(external: bool) -> Json {
    let (gv, resources): (String, Vec<Json>) = if external {
        (
            format!("{EXTERNAL_GROUP}/{EXTERNAL_VERSION}"),
            Metric::SERVICE
                .iter()
                .map(|m| {
                    json!({"name": m.as_str(), "singularName": "", "namespaced": true,
                           "kind": "ExternalMetricValueList", "verbs": ["get"]})
                })
                .collect(),
        )
    } else {
        let of = |resource: &str, m: &Metric| {
            json!({"name": format!("{resource}/{}", m.as_str()), "singularName": "",
                   "namespaced": true, "kind": "MetricValueList", "verbs": ["get"]})
        };
        (
            format!("{CUSTOM_GROUP}/{CUSTOM_VERSION}"),
            Metric::SERVICE
                .iter()
                .map(|m| of(ISVC_RESOURCE, m))
                .chain(Metric::POD.iter().map(|m| of("pods", m)))
                .collect(),
        )
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

fn group(external: bool) -> Json {
    let (name, version) = if external {
        (EXTERNAL_GROUP, EXTERNAL_VERSION)
    } else {
        (CUSTOM_GROUP, CUSTOM_VERSION)
    };
    let v = json!({"groupVersion": format!("{name}/{version}"), "version": version});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": [v.clone()], "preferredVersion": v})
}

/// One custom-metrics item.
fn custom_item(
    kind: &str,
    api_version: &str,
    ns: &str,
    name: &str,
    metric: Metric,
    record: &Record,
    value: f64,
) -> Json {
    json!({
        "describedObject": {"kind": kind, "namespace": ns, "name": name, "apiVersion": api_version},
        "metric": {"name": metric.as_str()},
        "timestamp": timestamp(record.scraped_at),
        "windowSeconds": record.interval.as_secs(),
        "value": quantity(value),
    })
}

fn value_list(items: Vec<Json>) -> Json {
    json!({"kind": "MetricValueList", "apiVersion": format!("{CUSTOM_GROUP}/{CUSTOM_VERSION}"),
           "metadata": {}, "items": items})
}

fn absent(metric: Metric, what: String) -> Failure {
    Failure::not_found(format!(
        "{} is absent for {what}: no control period has it (no replica reported it, the replicas do not export it, or it is older than 3 control periods)",
        metric.as_str()
    ))
}

/// The answer to `req` from `board` at `now` (for staleness).
pub fn respond(req: &ApiRequest, board: &Board, now: Instant) -> Result<Json, Failure> {
    let no_labels = BTreeMap::new();
    match req {
        ApiRequest::Health => Ok(json!("ok")),
        ApiRequest::OpenApi { v3: false } => Ok(json!({
            "swagger": "2.0",
            "info": {"title": "Ballast metrics APIs", "version": "v1"},
            "paths": {},
            "definitions": {},
        })),
        ApiRequest::OpenApi { v3: true } => Ok(json!({"paths": {}})),
        ApiRequest::Groups => Ok(json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": [group(false), group(true)],
        })),
        ApiRequest::Group { external } => Ok(group(*external)),
        ApiRequest::Resources { external } => Ok(resource_list(*external)),
        ApiRequest::Object {
            namespace,
            name,
            metric,
            metric_selector,
        } => {
            let records: Vec<(String, Record)> = if name == "*" {
                board.in_namespace(namespace, now).into_iter().collect()
            } else {
                board
                    .get(namespace, name, now)
                    .map(|r| (name.clone(), r))
                    .into_iter()
                    .collect()
            };
            let items: Vec<Json> = records
                .iter()
                .filter(|_| metric_selector.matches(&no_labels))
                .filter_map(|(n, r)| {
                    let v = *r.values.get(metric)?;
                    Some(custom_item(
                        "InferenceService",
                        "ballast.dev/v1alpha1",
                        namespace,
                        n,
                        *metric,
                        r,
                        v,
                    ))
                })
                .collect();
            if items.is_empty() {
                return Err(absent(
                    *metric,
                    format!("{ISVC_RESOURCE} {namespace}/{name}"),
                ));
            }
            Ok(value_list(items))
        }
        ApiRequest::Pods {
            namespace,
            name,
            metric,
            selector,
            metric_selector,
        } => {
            let items: Vec<Json> = board
                .in_namespace(namespace, now)
                .values()
                .filter(|r| name != "*" || selector.matches(&r.pod_labels))
                .filter(|_| metric_selector.matches(&no_labels))
                .flat_map(|r| {
                    r.pods
                        .iter()
                        .filter(|p| name == "*" || p.name == *name)
                        .filter_map(move |p| {
                            let v = *p.values.get(metric)?;
                            Some(custom_item("Pod", "v1", namespace, &p.name, *metric, r, v))
                        })
                })
                .collect();
            if items.is_empty() {
                return Err(absent(*metric, format!("pods {namespace}/{name}")));
            }
            Ok(value_list(items))
        }
        ApiRequest::External {
            namespace,
            metric,
            selector,
        } => {
            let items: Vec<Json> = board
                .in_namespace(namespace, now)
                .iter()
                .filter_map(|(n, r)| {
                    let labels = BTreeMap::from([(SERVICE_LABEL.to_string(), n.clone())]);
                    if !selector.matches(&labels) {
                        return None;
                    }
                    let v = *r.values.get(metric)?;
                    Some(json!({
                        "metricName": metric.as_str(),
                        "metricLabels": labels,
                        "timestamp": timestamp(r.scraped_at),
                        "window": r.interval.as_secs(),
                        "value": quantity(v),
                    }))
                })
                .collect();
            if items.is_empty() {
                return Err(absent(
                    *metric,
                    format!("the InferenceServices in {namespace} that the selector picks"),
                ));
            }
            Ok(json!({
                "kind": "ExternalMetricValueList",
                "apiVersion": format!("{EXTERNAL_GROUP}/{EXTERNAL_VERSION}"),
                "metadata": {},
                "items": items,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics_api::values::PodValues;
    use std::time::Duration;

    const GET: http::Method = http::Method::GET;

    fn board() -> (Board, Instant) {
        let b = Board::default();
        let r = Record {
            scraped_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            published: Instant::now(),
            interval: Duration::from_secs(5),
            values: BTreeMap::from([
                (Metric::CapacityWaitingPerReplica, 2.5),
                (Metric::KvCacheUsage, 0.42),
                (Metric::RecommendedReplicas, 3.0),
            ]),
            pods: vec![
                PodValues {
                    name: "chat-a".into(),
                    values: BTreeMap::from([
                        (Metric::KvCacheUsage, 0.4),
                        (Metric::CapacityWaiting, 2.0),
                    ]),
                },
                PodValues {
                    name: "chat-b".into(),
                    values: BTreeMap::from([(Metric::KvCacheUsage, 0.44)]),
                },
            ],
            pod_labels: crate::labels::labels("chat"),
            in_flight: Some(4.0),
        };
        let now = r.published;
        b.publish("prod", "chat", r);
        (b, now)
    }

    fn get(path: &str, query: Option<&str>) -> Result<Json, Failure> {
        let (b, now) = board();
        respond(
            &parse(&GET, path, query, Some("application/json"))?,
            &b,
            now,
        )
    }

    #[test]
    fn discovery_names_every_metric() {
        let list = get("/apis/custom.metrics.k8s.io/v1beta2", None).unwrap();
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), 9);
        assert!(names.contains(&"inferenceservices.ballast.dev/recommended_replicas"));
        assert!(names.contains(&"inferenceservices.ballast.dev/held_requests"));
        assert!(names.contains(&"pods/capacity_waiting"));
        assert_eq!(list["resources"][0]["kind"], "MetricValueList");
        assert_eq!(list["resources"][0]["verbs"], json!(["get"]));
        let ext = get("/apis/external.metrics.k8s.io/v1beta1", None).unwrap();
        assert_eq!(ext["resources"].as_array().unwrap().len(), 7);
        assert_eq!(ext["resources"][0]["kind"], "ExternalMetricValueList");
        assert_eq!(
            get("/apis", None).unwrap()["groups"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            get("/apis/external.metrics.k8s.io", None).unwrap()["preferredVersion"]["version"],
            "v1beta1"
        );
    }

    #[test]
    fn aggregated_discovery_is_refused_with_406() {
        let agg = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        let e = parse(&GET, "/apis", None, Some(agg)).unwrap_err();
        assert_eq!(e.code, StatusCode::NOT_ACCEPTABLE);
        assert_eq!(e.body()["kind"], "Status");
        assert!(
            parse(
                &GET,
                "/apis",
                None,
                Some(&format!("{agg},application/json"))
            )
            .is_ok()
        );
        assert!(
            parse(
                &GET,
                "/apis",
                None,
                Some("application/vnd.kubernetes.protobuf")
            )
            .is_err()
        );
        assert!(parse(&GET, "/apis", None, Some("application/json;q=0")).is_err());
        assert!(parse(&GET, "/apis", None, Some("*/*")).is_ok());
        assert!(parse(&GET, "/apis", None, None).is_ok());
    }

    #[test]
    fn an_object_metric_is_one_item_with_its_object_and_scrape_time() {
        let v = get("/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/inferenceservices.ballast.dev/chat/capacity_waiting_per_replica", None).unwrap();
        let items = v["items"].as_array().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(
            items[0]["describedObject"],
            json!({"kind": "InferenceService", "namespace": "prod", "name": "chat", "apiVersion": "ballast.dev/v1alpha1"})
        );
        assert_eq!(items[0]["value"], "2500m");
        assert_eq!(items[0]["timestamp"], "2027-01-15T08:00:00Z");
        assert_eq!(items[0]["windowSeconds"], 5);
    }

    #[test]
    fn absent_is_not_found_never_zero() {
        for path in [
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/inferenceservices.ballast.dev/chat/ttft_p99_seconds",
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/inferenceservices.ballast.dev/other/kv_cache_usage",
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/pods/chat-b/capacity_waiting",
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/prod/deferred_waiting",
        ] {
            let e = get(path, None).unwrap_err();
            assert_eq!(
                (e.code, e.reason),
                (StatusCode::NOT_FOUND, "NotFound"),
                "{path}"
            );
            assert!(e.message.contains("absent"), "{}", e.message);
        }
        // Stale: older than 3 periods.
        let (b, now) = board();
        let req = parse(&GET, "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/inferenceservices.ballast.dev/chat/kv_cache_usage", None, None).unwrap();
        assert!(respond(&req, &b, now).is_ok());
        assert!(respond(&req, &b, now + Duration::from_secs(16)).is_err());
    }

    #[test]
    fn pods_metrics_by_selector_and_by_name() {
        let q = "labelSelector=app.kubernetes.io%2Finstance%3Dchat%2Capp.kubernetes.io%2Fname%3Dballast-engine";
        let v = get(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/pods/*/kv_cache_usage",
            Some(q),
        )
        .unwrap();
        let values: Vec<&str> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["value"].as_str().unwrap())
            .collect();
        assert_eq!(values, ["400m", "440m"]);
        assert_eq!(v["items"][1]["describedObject"]["kind"], "Pod");
        let other = get(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/pods/*/kv_cache_usage",
            Some("labelSelector=app.kubernetes.io/instance=other"),
        );
        assert_eq!(other.unwrap_err().code, StatusCode::NOT_FOUND);
        let one = get(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/pods/chat-a/capacity_waiting",
            None,
        )
        .unwrap();
        assert_eq!(one["items"][0]["value"], "2");
    }

    #[test]
    fn external_metrics_are_selected_by_service() {
        let v = get(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/prod/recommended_replicas",
            Some("labelSelector=ballast.dev/inferenceservice=chat"),
        )
        .unwrap();
        assert_eq!(v["items"][0]["value"], "3");
        assert_eq!(
            v["items"][0]["metricLabels"]["ballast.dev/inferenceservice"],
            "chat"
        );
        let none = get(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/prod/recommended_replicas",
            Some("labelSelector=ballast.dev/inferenceservice=gone"),
        );
        assert_eq!(none.unwrap_err().code, StatusCode::NOT_FOUND);
    }

    #[test]
    fn bad_requests_get_a_status_with_the_right_code() {
        let ext = "/apis/external.metrics.k8s.io/v1beta1/namespaces/prod/kv_cache_usage";
        for (method, path, query, code) in [
            (
                GET,
                ext,
                Some("labelSelector=a%20in%20(b"),
                StatusCode::BAD_REQUEST,
            ),
            (GET, ext, Some("labelSelector=%zz"), StatusCode::BAD_REQUEST),
            (
                GET,
                "/apis/external.metrics.k8s.io/v1beta1/namespaces/prod/nope",
                None,
                StatusCode::NOT_FOUND,
            ),
            (
                GET,
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/pods/x/recommended_replicas",
                None,
                StatusCode::NOT_FOUND,
            ),
            (
                GET,
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/deployments.apps/x/kv_cache_usage",
                None,
                StatusCode::NOT_FOUND,
            ),
            (
                GET,
                "/apis/custom.metrics.k8s.io/v1beta1",
                None,
                StatusCode::NOT_FOUND,
            ),
            (
                GET,
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces/Bad_NS/pods/x/kv_cache_usage",
                None,
                StatusCode::BAD_REQUEST,
            ),
            (GET, "/nothing/here", None, StatusCode::NOT_FOUND),
            (
                GET,
                "/apis/custom.metrics.k8s.io/v1beta2/namespaces",
                None,
                StatusCode::NOT_FOUND,
            ),
            (
                http::Method::POST,
                ext,
                None,
                StatusCode::METHOD_NOT_ALLOWED,
            ),
        ] {
            let e = parse(&method, path, query, None).and_then(|r| {
                let (b, now) = board();
                respond(&r, &b, now)
            });
            let e = e.unwrap_err();
            assert_eq!(e.code, code, "{method} {path} {query:?}: {}", e.message);
            assert_eq!(e.body()["code"], code.as_u16());
        }
    }

    #[test]
    fn quantities_are_exact_to_nanos() {
        assert_eq!(quantity(3.0), "3");
        assert_eq!(quantity(0.5), "500m");
        assert_eq!(quantity(0.0004), "400u");
        assert_eq!(quantity(1.0 / 3.0), "333333333n");
        assert_eq!(quantity(0.0), "0");
    }

    #[test]
    fn authorization_attributes() {
        let r = parse(&GET, "/apis/custom.metrics.k8s.io/v1beta2/namespaces/prod/inferenceservices.ballast.dev/chat/kv_cache_usage", None, None).unwrap();
        assert_eq!(
            r.attributes("ignored"),
            Some(Attributes::Resource {
                group: CUSTOM_GROUP,
                version: CUSTOM_VERSION,
                resource: ISVC_RESOURCE.into(),
                subresource: "kv_cache_usage".into(),
                namespace: "prod".into(),
                name: "chat".into(),
            })
        );
        let d = parse(&GET, "/apis/custom.metrics.k8s.io/v1beta2", None, None).unwrap();
        assert_eq!(
            d.attributes("/apis/custom.metrics.k8s.io/v1beta2"),
            Some(Attributes::NonResource {
                path: "/apis/custom.metrics.k8s.io/v1beta2".into()
            })
        );
        assert_eq!(
            parse(&GET, "/healthz", None, None)
                .unwrap()
                .attributes("/healthz"),
            None
        );
    }
}
