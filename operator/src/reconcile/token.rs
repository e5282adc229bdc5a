//! The control token of a service: a Secret the operator owns (`NAME-control-token`, key
//! `token`), mounted into Ballast engine pods as `--control-token-file`, whose token the
//! operator sends as a bearer token on every control-API call.
//!
//! The Secret holds one random 256-bit token a line: the current one, and during a
//! rotation the one before it. A rotation is asked for by setting the InferenceService's
//! annotation [`ROTATE_ANNOTATION`] to a new value (any value: a date, a ticket number);
//! the operator then puts a fresh token first, keeps the old one second for
//! [`ROTATION_GRACE`], and then drops it. Engines accept every token of their file, and the
//! operator tries the current token first and the old one when an engine refuses it, so
//! control calls keep working while the kubelet refreshes each pod's copy of the Secret.
//!
//! The same Secret holds the control API's TLS pair: a CA (`ca.crt`, `ca.key`) and a
//! serving certificate for [`tls_name`] (`tls.crt`, `tls.key`), made with the Secret and
//! renewed before they expire ([`crate::metrics_api::certs`]'s rules: the serving
//! certificate 30 days before, the CA a year before, the old CA trusted until it expires).
//! Engine pods mount the token and the serving pair, never the CA key; engines re-read the
//! pair when the kubelet refreshes it, and the operator trusts the CA alone.
//!
//! The decision is pure ([`next`]); [`ensure`] reads the Secret and writes what it decides.
//! Nothing here logs a token or a key.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use ballast_crds::InferenceService;

use super::build::{BuildError, owner_reference};
use super::cache::Cache;
use crate::control::{ControlTokens, ControlTrust, fresh_token};
use crate::labels;
use crate::metrics_api::certs::{self, Pem, Renewal};

pub use super::names::{TOKEN_KEY, secret_name};

/// The InferenceService annotation that asks for a new control token: each new value
/// rotates once.
pub const ROTATE_ANNOTATION: &str = "ballast.dev/rotate-control-token";

/// On the Secret: the value of [`ROTATE_ANNOTATION`] its current token answers.
pub const ROTATED_FOR_ANNOTATION: &str = "ballast.dev/rotated-for";

/// On the Secret, while it still holds the previous token: when the rotation happened.
pub const ROTATED_AT_ANNOTATION: &str = "ballast.dev/rotated-at";

/// How long the previous token stays valid after a rotation: more than a control period,
/// and long enough for the kubelet to refresh every pod's mounted copy of the Secret (its
/// sync period plus its cache's time to live, about a minute with the defaults).
pub const ROTATION_GRACE: Duration = Duration::from_secs(120);

/// The DNS name in a service's control-API certificate, which the operator checks (it
/// dials pods by IP, so no address could be checked). Never resolved.
pub fn tls_name(isvc: &InferenceService) -> String {
    format!(
        "{}.{}.control.ballast.internal",
        isvc.name_any(),
        isvc.namespace().unwrap_or_default()
    )
}

/// The common name of a service's control-API CA.
const CA_NAME: &str = "ballast-operator control-API CA";

/// The TLS pair the Secret should hold, and whether it is new: the one there is, unless it
/// is missing, for another name, or due for renewal.
pub fn next_tls(
    existing: Option<&Secret>,
    name: &str,
    now: std::time::SystemTime,
) -> Result<(Pem, bool), String> {
    let pem = existing.and_then(Pem::from_secret);
    let names = [name.to_string()];
    match certs::renewal(pem.as_ref(), &names, now) {
        Renewal::Keep => Ok((pem.expect("Keep needs a pair"), false)),
        r => Ok((
            certs::issue_from(pem.as_ref(), r, &names, now, CA_NAME)?,
            true,
        )),
    }
}

/// How long a Secret's pair, once judged current by [`next_tls`], is not judged again while
/// the Secret is unchanged: parsing two certificates and two keys every control period
/// for every service is work for nothing when renewal comes days before expiry.
pub const TLS_RECHECK: Duration = Duration::from_secs(600);

/// The Secrets whose pair was judged current ([`Renewal::Keep`]), by namespace, name and
/// the certificate's name, with the resourceVersion judged and when.
#[derive(Debug, Default)]
pub struct KeptPairs {
    judged: std::sync::Mutex<std::collections::HashMap<String, (String, std::time::Instant)>>,
}

impl KeptPairs {
    fn key(secret: &Secret, tls_name: &str) -> Option<(String, String)> {
        let rv = secret.metadata.resource_version.clone()?;
        let key = format!(
            "{}/{}/{tls_name}",
            secret.metadata.namespace.as_deref().unwrap_or_default(),
            secret.metadata.name.as_deref().unwrap_or_default()
        );
        Some((key, rv))
    }

    /// Whether `secret` (this very version) was judged current within [`TLS_RECHECK`].
    pub fn recent(&self, secret: &Secret, tls_name: &str, now: std::time::Instant) -> bool {
        let Some((key, rv)) = Self::key(secret, tls_name) else {
            return false;
        };
        let judged = self.judged.lock().unwrap_or_else(|e| e.into_inner());
        judged
            .get(&key)
            .is_some_and(|(v, at)| *v == rv && now.saturating_duration_since(*at) < TLS_RECHECK)
    }

    /// Notes that `secret`'s pair was judged current at `now` (and forgets old verdicts).
    pub fn note(&self, secret: &Secret, tls_name: &str, now: std::time::Instant) {
        let Some((key, rv)) = Self::key(secret, tls_name) else {
            return;
        };
        let mut judged = self.judged.lock().unwrap_or_else(|e| e.into_inner());
        judged.retain(|_, (_, at)| now.saturating_duration_since(*at) < TLS_RECHECK);
        judged.insert(key, (rv, now));
    }
}

/// The verdicts of this process.
static KEPT: std::sync::LazyLock<KeptPairs> = std::sync::LazyLock::new(KeptPairs::default);

/// What the operator's control client trusts for the service's engines.
pub fn trust(isvc: &InferenceService, pem: &Pem) -> ControlTrust {
    ControlTrust {
        ca_pem: pem.ca_bundle(),
        server_name: tls_name(isvc),
    }
}

/// What the Secret should hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The tokens, the current one first.
    pub tokens: Vec<String>,
    /// The Secret's annotations that say how they came to be.
    pub annotations: BTreeMap<String, String>,
    /// Whether the Secret must be written (created when there is none).
    pub write: bool,
}

/// The tokens of a Secret's `token` key, `None` when it has none that an engine accepts.
fn tokens_of(secret: &Secret) -> Option<Vec<String>> {
    let text = secret.data.as_ref()?.get(TOKEN_KEY)?;
    let text = std::str::from_utf8(&text.0).ok()?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let valid = |t: &String| t.len() <= 4096 && t.bytes().all(|b| b.is_ascii_graphic());
    (!tokens.is_empty() && tokens.iter().all(valid)).then_some(tokens)
}

/// What the token Secret should hold, given the one there is (if any), the service's
/// rotation request ([`ROTATE_ANNOTATION`]) and the time; `fresh` makes a new token.
pub fn next(
    existing: Option<&Secret>,
    request: Option<&str>,
    now: Timestamp,
    fresh: impl FnOnce() -> String,
) -> Decision {
    let mut annotations: BTreeMap<String, String> = existing
        .and_then(|s| s.metadata.annotations.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == ROTATED_FOR_ANNOTATION || k == ROTATED_AT_ANNOTATION)
        .collect();
    let Some(mut tokens) = existing.and_then(tokens_of) else {
        // None yet, or one an engine would refuse: start over. The request, if any, counts
        // as answered: a new token is what it asked for.
        let mut annotations = BTreeMap::new();
        if let Some(r) = request {
            annotations.insert(ROTATED_FOR_ANNOTATION.to_string(), r.to_string());
        }
        return Decision {
            tokens: vec![fresh()],
            annotations,
            write: true,
        };
    };
    let answered = annotations.get(ROTATED_FOR_ANNOTATION).map(String::as_str);
    if let Some(r) = request
        && answered != Some(r)
    {
        tokens.truncate(1);
        tokens.insert(0, fresh());
        annotations.insert(ROTATED_FOR_ANNOTATION.to_string(), r.to_string());
        annotations.insert(ROTATED_AT_ANNOTATION.to_string(), now.to_string());
        return Decision {
            tokens,
            annotations,
            write: true,
        };
    }
    if tokens.len() > 1 {
        let rotated_at = annotations
            .get(ROTATED_AT_ANNOTATION)
            .and_then(|t| t.parse::<Timestamp>().ok());
        let expired = rotated_at
            .is_none_or(|at| now.duration_since(at).as_secs_f64() >= ROTATION_GRACE.as_secs_f64());
        if expired {
            tokens.truncate(1);
            annotations.remove(ROTATED_AT_ANNOTATION);
            return Decision {
                tokens,
                annotations,
                write: true,
            };
        }
    }
    Decision {
        tokens,
        annotations,
        write: false,
    }
}

/// The Secret a decision and a TLS pair imply for `isvc`, owned by it (its
/// `resourceVersion` is the caller's to set for an update).
pub fn secret(isvc: &InferenceService, d: &Decision, tls: &Pem) -> Result<Secret, BuildError> {
    let name = isvc.name_any();
    let mut text = d.tokens.join("\n");
    text.push('\n');
    let mut data = tls.data();
    data.insert(TOKEN_KEY.to_string(), ByteString(text.into_bytes()));
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&name)),
            namespace: isvc.namespace(),
            labels: Some(labels::labels(&name)),
            annotations: (!d.annotations.is_empty()).then(|| d.annotations.clone()),
            owner_references: Some(vec![owner_reference(isvc)?]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    })
}

/// Reads the token Secret of `isvc` from the cache (the operator's store of the Secrets it
/// owns: a settled service costs no request), writes it when [`next`] says so (a `create`,
/// or an `update` carrying the resourceVersion read, so a concurrent writer makes it fail
/// rather than lose a token), and returns the tokens control calls carry and whether it
/// wrote. A write refused as a conflict (the store had not seen this operator's own last
/// write yet, or someone else wrote) is decided again once on the Secret read afresh.
/// Also returns what control calls trust ([`trust`]).
pub async fn ensure(
    client: &Client,
    cache: &Cache,
    isvc: &InferenceService,
) -> Result<(ControlTokens, ControlTrust, bool), super::Error> {
    let ns = isvc.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let name = secret_name(&isvc.name_any());
    let request = isvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROTATE_ANNOTATION))
        .map(String::as_str);
    let mut existing = cache.secret(&ns, &name).await?;
    let mut retried = false;
    let tls_name = tls_name(isvc);
    loop {
        let d = next(existing.as_deref(), request, Timestamp::now(), fresh_token);
        let now = std::time::Instant::now();
        let kept = existing
            .as_deref()
            .filter(|s| KEPT.recent(s, &tls_name, now))
            .and_then(Pem::from_secret);
        let (pem, renewed) = match kept {
            Some(pem) => (pem, false),
            None => {
                let (pem, renewed) =
                    next_tls(existing.as_deref(), &tls_name, std::time::SystemTime::now())
                        .map_err(|e| BuildError::Certificate(format!("control API TLS: {e}")))?;
                if let (Some(s), false) = (existing.as_deref(), renewed) {
                    KEPT.note(s, &tls_name, now);
                }
                (pem, renewed)
            }
        };
        if !d.write && !renewed {
            return Ok((ControlTokens::new(d.tokens), trust(isvc, &pem), false));
        }
        let mut s = secret(isvc, &d, &pem)?;
        let written = match &existing {
            Some(old) => {
                s.metadata.resource_version = old.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), &s).await
            }
            None => api.create(&PostParams::default(), &s).await,
        };
        match written {
            Ok(_) => {
                tracing::info!(
                    target: "ballast::operator",
                    namespace = %ns,
                    secret = %name,
                    tokens = d.tokens.len(),
                    tls_renewed = renewed,
                    "control token Secret written"
                );
                return Ok((ControlTokens::new(d.tokens), trust(isvc, &pem), true));
            }
            Err(kube::Error::Api(e)) if e.code == 409 && !retried => {
                retried = true;
                existing = api.get_opt(&name).await?.map(std::sync::Arc::new);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(tokens: &str, annotations: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                TOKEN_KEY.to_string(),
                ByteString(tokens.as_bytes().to_vec()),
            )])),
            ..Secret::default()
        }
    }

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn fresh_tokens_are_256_bits_of_hex_and_differ() {
        let a = fresh_token();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, fresh_token());
    }

    #[test]
    fn a_missing_or_unusable_secret_gets_a_fresh_token() {
        let now = t("2026-12-05T00:00:00Z");
        let d = next(None, None, now, || "fresh".into());
        assert_eq!((d.tokens, d.write), (vec!["fresh".to_string()], true));
        assert!(d.annotations.is_empty());
        for bad in ["", "\n \n", "two words\n", "caf\u{e9}\n"] {
            let d = next(Some(&with(bad, &[])), Some("r1"), now, || "fresh".into());
            assert_eq!(d.tokens, ["fresh"], "{bad:?}");
            assert!(d.write);
            assert_eq!(d.annotations[ROTATED_FOR_ANNOTATION], "r1");
        }
    }

    #[test]
    fn a_settled_secret_is_left_alone() {
        let now = t("2026-12-05T00:00:00Z");
        let s = with("cur\n", &[(ROTATED_FOR_ANNOTATION, "r1"), ("other", "x")]);
        let d = next(Some(&s), Some("r1"), now, || panic!("no new token"));
        assert_eq!((d.tokens, d.write), (vec!["cur".to_string()], false));
        let d = next(Some(&with("cur\n", &[])), None, now, || {
            panic!("no new token")
        });
        assert!(!d.write);
    }

    #[test]
    fn a_rotation_keeps_the_old_token_for_the_grace_then_drops_it() {
        let at = t("2026-12-05T00:00:00Z");
        let d = next(Some(&with("old\n", &[])), Some("2026-12-05"), at, || {
            "new".into()
        });
        assert_eq!(d.tokens, ["new", "old"]);
        assert!(d.write);
        assert_eq!(d.annotations[ROTATED_FOR_ANNOTATION], "2026-12-05");
        let rotated = Secret {
            metadata: ObjectMeta {
                annotations: Some(d.annotations.clone()),
                ..ObjectMeta::default()
            },
            ..with("new\nold\n", &[])
        };
        // Within the grace: both, nothing written; the same request does not rotate again.
        let soon = t("2026-12-05T00:01:59Z");
        let d = next(Some(&rotated), Some("2026-12-05"), soon, || panic!("again"));
        assert_eq!((d.tokens.len(), d.write), (2, false));
        // After it: the old one goes, and with it the time of the rotation.
        let later = t("2026-12-05T00:02:00Z");
        let d = next(Some(&rotated), Some("2026-12-05"), later, || {
            panic!("again")
        });
        assert_eq!(d.tokens, ["new"]);
        assert!(d.write);
        assert!(!d.annotations.contains_key(ROTATED_AT_ANNOTATION));
        assert_eq!(d.annotations[ROTATED_FOR_ANNOTATION], "2026-12-05");
        // A second rotation during the grace keeps only the newest two.
        let d = next(Some(&rotated), Some("again"), soon, || "newer".into());
        assert_eq!(d.tokens, ["newer", "new"]);
    }

    #[test]
    fn the_tls_pair_is_made_once_and_renewed_for_another_name_or_near_its_end() {
        let now = std::time::SystemTime::now();
        let name = "chat.ml.control.ballast.internal";
        let (pem, new) = next_tls(None, name, now).unwrap();
        assert!(new);
        let held = Secret {
            data: Some(pem.data()),
            ..Secret::default()
        };
        let (again, new) = next_tls(Some(&held), name, now).unwrap();
        assert!(!new);
        assert_eq!(again, pem);
        // A Secret from before TLS (a token only) gets a pair.
        let (_, new) = next_tls(Some(&with("tok\n", &[])), name, now).unwrap();
        assert!(new);
        // Another service's name: a new serving certificate from the same CA.
        let (other, new) = next_tls(Some(&held), "x.ml.control.ballast.internal", now).unwrap();
        assert!(new);
        assert_eq!(
            (other.ca_crt == pem.ca_crt, other.tls_crt == pem.tls_crt),
            (true, false)
        );
        // Eleven months on the serving certificate is renewed, the CA kept.
        let later = now + std::time::Duration::from_secs(340 * 24 * 3600);
        let (renewed, new) = next_tls(Some(&held), name, later).unwrap();
        assert!(new);
        assert_eq!(renewed.ca_crt, pem.ca_crt);
        assert_ne!(renewed.tls_crt, pem.tls_crt);
    }

    #[test]
    fn the_secret_is_owned_labelled_and_holds_one_token_a_line() {
        let isvc: InferenceService = serde_json::from_value(serde_json::json!({
            "apiVersion": "ballast.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "ml", "uid": "u-1"},
            "spec": {"model": {"source": "synthetic:tiny"}}
        }))
        .unwrap();
        let d = next(None, None, t("2026-12-05T00:00:00Z"), || "abc".into());
        let (pem, _) = next_tls(None, &tls_name(&isvc), std::time::SystemTime::now()).unwrap();
        let s = secret(&isvc, &d, &pem).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("chat-control-token"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(s.metadata.owner_references.unwrap()[0].uid, "u-1");
        assert!(s.metadata.labels.unwrap().contains_key(labels::MANAGED_BY));
        let data = s.data.unwrap();
        assert_eq!(data[TOKEN_KEY].0, b"abc\n");
        for key in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
            assert!(!data[key].0.is_empty(), "{key}");
        }
        let debug = format!("{:?}", ControlTokens::new(vec!["abc".into()]));
        assert!(!debug.contains("abc"), "{debug}");
    }

    #[test]
    fn a_current_pair_is_judged_again_only_when_the_secret_changes_or_after_a_while() {
        let kept = KeptPairs::default();
        let name = "chat.ml.control.ballast.internal";
        let mut s = with("tok\n", &[]);
        s.metadata.namespace = Some("ml".into());
        s.metadata.name = Some("chat-control-token".into());
        let t0 = std::time::Instant::now();
        assert!(!kept.recent(&s, name, t0), "never judged");
        s.metadata.resource_version = Some("7".into());
        kept.note(&s, name, t0);
        assert!(kept.recent(&s, name, t0 + Duration::from_secs(60)));
        assert!(
            !kept.recent(&s, "other.ml.control.ballast.internal", t0),
            "another name"
        );
        assert!(
            !kept.recent(&s, name, t0 + TLS_RECHECK),
            "judged again after TLS_RECHECK"
        );
        let mut changed = s.clone();
        changed.metadata.resource_version = Some("8".into());
        assert!(!kept.recent(&changed, name, t0), "a new version is judged");
        let mut unversioned = s.clone();
        unversioned.metadata.resource_version = None;
        kept.note(&unversioned, name, t0);
        assert!(
            !kept.recent(&unversioned, name, t0),
            "no version, no verdict"
        );
    }
}
