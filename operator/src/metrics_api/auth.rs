//! Who is calling and whether they may, as every aggregated API server decides it.
//!
//! - **Authentication**: a client certificate from the front proxy (verified against
//!   `requestheader-client-ca-file`, its common name in `requestheader-allowed-names`, or
//!   any name when that list is empty) makes the request-header identity the caller —
//!   `X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-*`, or whichever headers the
//!   ConfigMap names — and only then are those headers read. Otherwise a certificate from
//!   the cluster's client CA names a user (CN) and groups (O); otherwise a bearer token is
//!   asked about in a TokenReview; otherwise 401.
//! - **Authorization**: a SubjectAccessReview of the caller for the request's attributes
//!   ([`Attributes`]), cached for [`CACHE_TTL`]; a denial is a 403.
//!
//! The settings come from `kube-system/extension-apiserver-authentication`, which the
//! API server writes and the operator watches ([`AuthConfig::from_data`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::api::Attributes;
use super::tls::{ClientCas, PeerCert};

/// The group of every authenticated caller.
const AUTHENTICATED: &str = "system:authenticated";

/// How long a TokenReview's or SubjectAccessReview's answer is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(10);

/// The namespace and name of the ConfigMap the API server publishes its authentication
/// settings in.
pub const AUTH_CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// The API server's authentication settings for aggregated servers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// The client CAs (front proxy and users).
    pub cas: ClientCas,
    /// Common names the front proxy's certificate may have (empty: any).
    pub allowed_names: Vec<String>,
    /// Headers naming the user, first present wins (lower case).
    pub username_headers: Vec<String>,
    /// Headers naming groups, every value of each (lower case).
    pub group_headers: Vec<String>,
    /// Prefixes of headers carrying extra attributes (lower case).
    pub extra_prefixes: Vec<String>,
    /// Headers naming the user's UID (lower case).
    pub uid_headers: Vec<String>,
}

impl AuthConfig {
    /// From the ConfigMap's data. The `requestheader-*` lists are JSON arrays of strings;
    /// a missing key is an empty list; a list that is not JSON is an error naming the key.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<AuthConfig, String> {
        let text = |k: &str| data.get(k).cloned().unwrap_or_default();
        let list = |k: &str| -> Result<Vec<String>, String> {
            match data.get(k).map(|s| s.trim()).filter(|s| !s.is_empty()) {
                None => Ok(Vec::new()),
                Some(s) => serde_json::from_str::<Vec<String>>(s)
                    .map_err(|e| format!("{k} is not a JSON list of strings: {e}")),
            }
        };
        let lower = |v: Vec<String>| v.into_iter().map(|s| s.to_ascii_lowercase()).collect();
        Ok(AuthConfig {
            cas: ClientCas {
                requestheader: text("requestheader-client-ca-file"),
                client: text("client-ca-file"),
            },
            allowed_names: list("requestheader-allowed-names")?,
            username_headers: lower(list("requestheader-username-headers")?),
            group_headers: lower(list("requestheader-group-headers")?),
            extra_prefixes: lower(list("requestheader-extra-headers-prefix")?),
            uid_headers: lower(list("requestheader-uid-headers")?),
        })
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Caller {
    /// User name.
    pub user: String,
    /// UID, when known.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request is refused before it is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no identity.
    Unauthenticated(String),
    /// 403: the identity may not.
    Forbidden(String),
    /// 500: a review could not be made (the API server did not answer).
    ReviewFailed(String),
}

/// The identity the front proxy's headers carry; `None` when they name no user.
pub fn from_request_headers(config: &AuthConfig, headers: &HeaderMap) -> Option<Caller> {
    let values = |name: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let user = config
        .username_headers
        .iter()
        .find_map(|h| values(h).into_iter().find(|v| !v.is_empty()))?;
    let uid = config
        .uid_headers
        .iter()
        .find_map(|h| values(h).into_iter().next())
        .unwrap_or_default();
    let groups = config
        .group_headers
        .iter()
        .flat_map(|h| values(h))
        .collect();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        let name = name.as_str();
        if let Some(key) = config
            .extra_prefixes
            .iter()
            .find_map(|p| name.strip_prefix(p.as_str()))
            && let Ok(v) = value.to_str()
        {
            // Keys are percent-encoded in header names (e.g. %2F for '/').
            let key = percent_decode(key).to_ascii_lowercase();
            extra.entry(key).or_default().push(v.to_string());
        }
    }
    Some(Caller {
        user,
        uid,
        groups,
        extra,
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(v) = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The bearer token of an `Authorization` header.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Answers by key, with when they were given.
type Cached<K, V> = Mutex<HashMap<K, (Instant, V)>>;

/// Authenticates and authorizes with the API server's reviews, caching their answers.
pub struct Guard {
    client: Client,
    tokens: Cached<[u8; 32], Result<Caller, Refusal>>,
    decisions: Cached<(Caller, Attributes), Result<(), Refusal>>,
}

impl Guard {
    /// A guard asking the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            tokens: Mutex::default(),
            decisions: Mutex::default(),
        }
    }

    /// Who makes a request that came with `cert` (what the handshake verified) and
    /// `headers`.
    pub async fn authenticate(
        &self,
        config: &AuthConfig,
        cert: &PeerCert,
        headers: &HeaderMap,
    ) -> Result<Caller, Refusal> {
        // Every authenticated caller is in `system:authenticated`, as the API server puts
        // it: the aggregator's own discovery and OpenAPI requests (as
        // `system:kube-aggregator` and `system:aggregator`, with no group) are allowed by
        // the built-in `system:discovery` role through it.
        self.identify(config, cert, headers).await.map(|mut c| {
            if !c.groups.iter().any(|g| g == AUTHENTICATED) {
                c.groups.push(AUTHENTICATED.into());
            }
            c
        })
    }

    async fn identify(
        &self,
        config: &AuthConfig,
        cert: &PeerCert,
        headers: &HeaderMap,
    ) -> Result<Caller, Refusal> {
        match cert {
            PeerCert::FrontProxy { common_name }
                if config.allowed_names.is_empty()
                    || config.allowed_names.iter().any(|n| n == common_name) =>
            {
                if let Some(caller) = from_request_headers(config, headers) {
                    return Ok(caller);
                }
                return Err(Refusal::Unauthenticated(
                    "the front proxy's request names no user".into(),
                ));
            }
            PeerCert::User { name, groups } => {
                return Ok(Caller {
                    user: name.clone(),
                    groups: groups.clone(),
                    ..Caller::default()
                });
            }
            _ => {}
        }
        let Some(token) = bearer(headers) else {
            return Err(Refusal::Unauthenticated(
                "no client certificate from the front proxy or the cluster's client CA, and no bearer token".into(),
            ));
        };
        let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        if let Some(hit) = fresh(&self.tokens, &key) {
            return hit;
        }
        let result = self.token_review(token).await;
        if !matches!(result, Err(Refusal::ReviewFailed(_))) {
            remember(&self.tokens, key, result.clone());
        }
        result
    }

    async fn token_review(&self, token: &str) -> Result<Caller, Refusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refusal::ReviewFailed(format!("TokenReview: {e}")))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(Refusal::Unauthenticated(
                status
                    .error
                    .unwrap_or_else(|| "the bearer token is not valid".into()),
            ));
        }
        let user = status.user.unwrap_or_default();
        Ok(Caller {
            user: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default().into_iter().collect(),
        })
    }

    /// Whether `caller` may make a request with `attributes`.
    pub async fn authorize(&self, caller: &Caller, attributes: &Attributes) -> Result<(), Refusal> {
        let key = (caller.clone(), attributes.clone());
        if let Some(hit) = fresh(&self.decisions, &key) {
            return hit;
        }
        let result = self.access_review(caller, attributes).await;
        if !matches!(result, Err(Refusal::ReviewFailed(_))) {
            remember(&self.decisions, key, result.clone());
        }
        result
    }

    async fn access_review(&self, caller: &Caller, a: &Attributes) -> Result<(), Refusal> {
        let mut spec = SubjectAccessReviewSpec {
            user: Some(caller.user.clone()),
            uid: (!caller.uid.is_empty()).then(|| caller.uid.clone()),
            groups: Some(caller.groups.clone()),
            extra: (!caller.extra.is_empty()).then(|| caller.extra.clone().into_iter().collect()),
            ..SubjectAccessReviewSpec::default()
        };
        let what = match a {
            Attributes::Resource {
                group,
                version,
                resource,
                subresource,
                namespace,
                name,
            } => {
                spec.resource_attributes = Some(ResourceAttributes {
                    group: Some(group.to_string()),
                    version: Some(version.to_string()),
                    resource: Some(resource.clone()),
                    subresource: (!subresource.is_empty()).then(|| subresource.clone()),
                    namespace: Some(namespace.clone()),
                    name: (!name.is_empty()).then(|| name.clone()),
                    verb: Some("get".into()),
                    ..ResourceAttributes::default()
                });
                let sub = if subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{subresource}")
                };
                format!("get {resource}{sub} in {group} in namespace {namespace}")
            }
            Attributes::NonResource { path } => {
                spec.non_resource_attributes = Some(NonResourceAttributes {
                    path: Some(path.clone()),
                    verb: Some("get".into()),
                });
                format!("get path {path}")
            }
        };
        let review = SubjectAccessReview {
            spec,
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refusal::ReviewFailed(format!("SubjectAccessReview: {e}")))?;
        let status = answer.status.unwrap_or_default();
        if status.allowed {
            Ok(())
        } else {
            let why = status
                .reason
                .filter(|r| !r.is_empty())
                .map_or(String::new(), |r| format!(": {r}"));
            Err(Refusal::Forbidden(format!(
                "user {:?} cannot {what}{why}",
                caller.user
            )))
        }
    }
}

fn fresh<K: std::hash::Hash + Eq, V: Clone>(cache: &Cached<K, V>, key: &K) -> Option<V> {
    let cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .get(key)
        .filter(|(at, _)| at.elapsed() < CACHE_TTL)
        .map(|(_, r)| r.clone())
}

fn remember<K: std::hash::Hash + Eq, V>(cache: &Cached<K, V>, key: K, value: V) {
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache.retain(|_, (at, _)| at.elapsed() < CACHE_TTL);
    cache.insert(key, (Instant::now(), value));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> AuthConfig {
        let data: BTreeMap<String, String> = [
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            (
                "requestheader-extra-headers-prefix",
                r#"["X-Remote-Extra-"]"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        AuthConfig::from_data(&data).unwrap()
    }

    #[test]
    fn the_configmap_is_read_and_bad_lists_are_named() {
        let c = config();
        assert_eq!(c.allowed_names, ["front-proxy-client"]);
        assert_eq!(c.username_headers, ["x-remote-user"]);
        let bad = BTreeMap::from([(
            "requestheader-allowed-names".to_string(),
            "front-proxy-client".to_string(),
        )]);
        let e = AuthConfig::from_data(&bad).unwrap_err();
        assert!(e.contains("requestheader-allowed-names"), "{e}");
    }

    #[test]
    fn request_headers_make_the_caller() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-remote-user",
            "system:serviceaccount:kube-system:hpa".parse().unwrap(),
        );
        h.append("x-remote-group", "system:serviceaccounts".parse().unwrap());
        h.append("x-remote-group", "system:authenticated".parse().unwrap());
        h.insert(
            "x-remote-extra-authentication.kubernetes.io%2fpod-name",
            "p".parse().unwrap(),
        );
        let c = from_request_headers(&config(), &h).unwrap();
        assert_eq!(c.user, "system:serviceaccount:kube-system:hpa");
        assert_eq!(c.groups, ["system:serviceaccounts", "system:authenticated"]);
        assert_eq!(c.extra["authentication.kubernetes.io/pod-name"], ["p"]);
        assert_eq!(from_request_headers(&config(), &HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn forged_headers_without_the_front_proxy_certificate_are_ignored() {
        // No client is reached: without a certificate or token the guard refuses first.
        let (mock, handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        drop(handle);
        let client = kube::Client::new(mock, "default");
        let guard = Guard::new(client);
        let mut h = HeaderMap::new();
        h.insert("x-remote-user", "admin".parse().unwrap());
        h.insert("x-remote-group", "system:masters".parse().unwrap());
        for cert in [
            PeerCert::None,
            PeerCert::FrontProxy {
                common_name: "not-allowed".into(),
            },
        ] {
            let r = guard.authenticate(&config(), &cert, &h).await;
            assert!(
                matches!(r, Err(Refusal::Unauthenticated(_))),
                "{cert:?}: {r:?}"
            );
        }
        let ok = guard
            .authenticate(
                &config(),
                &PeerCert::FrontProxy {
                    common_name: "front-proxy-client".into(),
                },
                &h,
            )
            .await
            .unwrap();
        assert_eq!(ok.user, "admin");
        assert_eq!(
            ok.groups,
            ["system:masters", "system:authenticated"],
            "every authenticated caller is in system:authenticated"
        );
        // A token the API server cannot review is a review failure, not cached.
        h.insert(http::header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        let r = guard.authenticate(&config(), &PeerCert::None, &h).await;
        assert!(matches!(r, Err(Refusal::ReviewFailed(_))), "{r:?}");
        assert!(guard.tokens.lock().unwrap().is_empty());
    }

    #[test]
    fn bearer_tokens() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(http::header::AUTHORIZATION, "Bearer  tok ".parse().unwrap());
        assert_eq!(bearer(&h), Some("tok"));
        h.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}
