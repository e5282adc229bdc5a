//! API keys: `Authorization: Bearer KEY` on `/v1/*` (and on `/metrics` with
//! `--metrics-require-key`), checked in constant time, with the key file re-read when it
//! changes.
//!
//! Nothing here logs, formats or returns a key: errors name the line of a key file, never
//! its text, and the 401 bodies never echo what the client sent.

use std::path::PathBuf;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::{Choice, ConstantTimeEq};

use super::error::ApiError;
use crate::config::{ApiKey, ApiKeys, KeyError, read_api_key_file};

/// How often `--api-key-file` is read to see whether it changed. The kubelet updates a
/// mounted Secret about a minute after the Secret changes, so a few seconds more do not
/// matter, and reading a small file every 2 s costs nothing.
pub const KEY_FILE_POLL: Duration = Duration::from_secs(2);

/// A set of keys that may change while the process runs: the keys of `--api-key-file` or
/// of `--control-token-file`, replaced when the file changes.
pub struct KeyRing {
    keys: RwLock<Arc<[ApiKey]>>,
    /// What the keys are, for log lines ("API key file", "control token file").
    what: &'static str,
}

impl KeyRing {
    /// The keys of `keys` (`None` for [`ApiKeys::None`]). With a key file and inside a
    /// Tokio runtime, a task re-reads the file every [`KEY_FILE_POLL`] for as long as the
    /// ring lives (without a runtime the keys stay those read at start). `what` names the
    /// file in log lines.
    pub fn new(keys: &ApiKeys, what: &'static str) -> Option<Arc<KeyRing>> {
        let initial: Arc<[ApiKey]> = match keys {
            ApiKeys::None => return None,
            ApiKeys::Fixed(keys) => keys.clone().into(),
            ApiKeys::File { keys, .. } => keys.clone().into(),
        };
        let ring = Arc::new(KeyRing {
            keys: RwLock::new(initial),
            what,
        });
        if let ApiKeys::File { path, text, .. } = keys
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(watch_key_file(
                Arc::downgrade(&ring),
                path.clone(),
                text.clone(),
            ));
        }
        Some(ring)
    }

    /// Checks one `Authorization` value (or its absence; `several` when a request carried
    /// more than one, which is ambiguous and refused).
    pub fn check(&self, value: Option<&[u8]>, several: bool) -> Result<(), Refusal> {
        let value = value.ok_or(Refusal::Missing)?;
        if several {
            return Err(Refusal::Malformed);
        }
        let token = bearer_token(value).ok_or(Refusal::Malformed)?;
        let keys = Arc::clone(&self.keys.read().unwrap_or_else(|e| e.into_inner()));
        if matches_any(token, &keys) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }

    /// How many keys are loaded now.
    pub fn len(&self) -> usize {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Never true: a ring is made only with keys, and a file that loses them keeps the old.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn replace(&self, new: Vec<ApiKey>) {
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = new.into();
    }

    #[cfg(test)]
    fn fixed(text: &str) -> Arc<KeyRing> {
        Arc::new(KeyRing {
            keys: RwLock::new(
                crate::config::parse_api_keys(text.as_bytes())
                    .unwrap()
                    .into(),
            ),
            what: "test keys",
        })
    }
}

/// What the server checks requests against.
pub struct Auth {
    /// `None`: no key is required.
    keys: Option<Arc<KeyRing>>,
    metrics_require_key: bool,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization` header.
    Missing,
    /// Not `Bearer TOKEN`, or several `Authorization` headers.
    Malformed,
    /// A token that is no key.
    Wrong,
}

impl Refusal {
    /// The reason as a metric label: `missing`, `malformed` or `wrong`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Wrong => "wrong",
        }
    }

    fn error(self) -> ApiError {
        let message = match self {
            Refusal::Missing => {
                "missing API key: send it in an Authorization header, `Authorization: Bearer KEY`"
            }
            Refusal::Malformed => {
                "malformed Authorization header: expected `Authorization: Bearer KEY`"
            }
            Refusal::Wrong => "invalid API key",
        };
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: "invalid_api_key",
        }
    }

    /// The 401 response, with the challenge RFC 6750 asks for.
    pub fn into_response(self) -> Response {
        let mut resp = self.error().into_response();
        let challenge = match self {
            Refusal::Missing => "Bearer realm=\"ballast\"",
            Refusal::Malformed | Refusal::Wrong => {
                "Bearer realm=\"ballast\", error=\"invalid_token\""
            }
        };
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
        resp
    }
}

impl Auth {
    /// The keys of the configuration, re-read from `--api-key-file` while the value lives
    /// (see [`KeyRing::new`]).
    pub fn new(keys: &ApiKeys, metrics_require_key: bool) -> Arc<Auth> {
        Arc::new(Auth {
            keys: KeyRing::new(keys, "API key file"),
            metrics_require_key,
        })
    }

    /// Whether a request for `path` needs a key.
    pub fn guards(&self, path: &str) -> bool {
        self.keys.is_some()
            && (path.starts_with("/v1/") || (self.metrics_require_key && path == "/metrics"))
    }

    /// Checks the `Authorization` header of a request that needs a key.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(keys) = &self.keys else {
            return Ok(());
        };
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let first = values.next();
        keys.check(first.map(HeaderValue::as_bytes), values.next().is_some())
    }

    /// How many keys are loaded now (0 when none is required).
    pub fn key_count(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.len())
    }
}

/// The token of `Bearer TOKEN` (scheme case-insensitive, RFC 7235), `None` for anything
/// else. Works on bytes: a header that is not UTF-8 is malformed, not a panic.
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first().is_none_or(|&b| b != b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty() && token.iter().all(u8::is_ascii_graphic)).then_some(token)
}

/// Whether `token` is one of `keys`, in time that depends only on the keys' lengths:
/// every key is compared, every byte of it, whatever the token holds.
pub fn matches_any(token: &[u8], keys: &[ApiKey]) -> bool {
    let mut any = Choice::from(0);
    for key in keys {
        any |= matches(token, key.as_bytes());
    }
    any.into()
}

fn matches(token: &[u8], key: &[u8]) -> Choice {
    let mut equal = (token.len() as u64).ct_eq(&(key.len() as u64));
    for (i, k) in key.iter().enumerate() {
        // A shorter token reads as zeros here; the length check above already failed.
        equal &= token.get(i).copied().unwrap_or(0).ct_eq(k);
    }
    equal
}

/// Middleware (inside the HTTP metrics layer, so a 401 is counted with its status): the
/// key check for the routes [`Auth::guards`].
pub async fn require_key(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    if auth.guards(req.uri().path())
        && let Err(refusal) = auth.check(req.headers())
    {
        return refusal.into_response();
    }
    next.run(req).await
}

/// Re-reads the key file every [`KEY_FILE_POLL`] while `ring` lives. A changed file with
/// keys replaces the keys; a file that became unreadable, empty or invalid keeps the keys
/// loaded before and logs an error (once per distinct problem): it never opens the API.
async fn watch_key_file(ring: Weak<KeyRing>, path: PathBuf, mut text: Vec<u8>) {
    let mut last_problem: Option<KeyError> = None;
    let mut tick = tokio::time::interval(KEY_FILE_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(ring) = ring.upgrade() else {
            return;
        };
        let read_path = path.clone();
        let read = tokio::task::spawn_blocking(move || read_api_key_file(&read_path)).await;
        let Ok(read) = read else {
            return;
        };
        match read {
            Ok((new_text, keys)) => {
                last_problem = None;
                if new_text != text {
                    let count = keys.len();
                    ring.replace(keys);
                    text = new_text;
                    tracing::info!(
                        path = %path.display(),
                        keys = count,
                        "{} changed: keys replaced",
                        ring.what
                    );
                }
            }
            Err(problem) => {
                if last_problem.as_ref() != Some(&problem) {
                    tracing::error!(
                        path = %path.display(),
                        keys_kept = ring.len(),
                        "{} {problem}; keeping the keys loaded before",
                        ring.what
                    );
                    last_problem = Some(problem);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_api_keys;

    fn keys(text: &str) -> Vec<ApiKey> {
        parse_api_keys(text.as_bytes()).unwrap()
    }

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::AUTHORIZATION, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn bearer_tokens_are_parsed_from_bytes() {
        assert_eq!(bearer_token(b"Bearer sk-1"), Some(&b"sk-1"[..]));
        assert_eq!(bearer_token(b"bearer   sk-1  "), Some(&b"sk-1"[..]));
        assert_eq!(bearer_token(b"BEARER sk-1"), Some(&b"sk-1"[..]));
        for bad in [
            &b""[..],
            b"Bearer",
            b"Bearer ",
            b"Bearersk-1",
            b"Basic dXNlcjpwYXNz",
            b"sk-1",
            b"Bearer a b",
            b"Bearer \xff\xfe",
            b"Bear",
        ] {
            assert_eq!(
                bearer_token(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn every_key_of_a_rotation_matches_and_nothing_else_does() {
        let k = keys("old-key\nnew-key\n");
        assert!(matches_any(b"old-key", &k));
        assert!(matches_any(b"new-key", &k));
        for wrong in [
            &b""[..],
            b"old-ke",
            b"old-key2",
            b"new-kez",
            b"OLD-KEY",
            b"x",
        ] {
            assert!(!matches_any(wrong, &k), "{wrong:?}");
        }
        assert!(!matches_any(b"old-key", &[]));
    }

    #[test]
    fn check_tells_missing_malformed_and_wrong_apart() {
        let auth = Auth {
            keys: Some(KeyRing::fixed("sk-right")),
            metrics_require_key: false,
        };
        assert_eq!(auth.check(&headers(&[b"Bearer sk-right"])), Ok(()));
        assert_eq!(auth.check(&headers(&[])), Err(Refusal::Missing));
        assert_eq!(
            auth.check(&headers(&[b"Bearer sk-wrong"])),
            Err(Refusal::Wrong)
        );
        assert_eq!(
            auth.check(&headers(&[b"Token sk-right"])),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            auth.check(&headers(&[b"Bearer sk-right", b"Bearer sk-right"])),
            Err(Refusal::Malformed),
            "two headers are ambiguous"
        );
        let open = Auth {
            keys: None,
            metrics_require_key: false,
        };
        assert_eq!(open.check(&headers(&[])), Ok(()));
    }

    #[test]
    fn guarded_paths() {
        let auth = |metrics| Auth {
            keys: Some(KeyRing::fixed("k")),
            metrics_require_key: metrics,
        };
        for (path, plain, with_metrics) in [
            ("/v1/completions", true, true),
            ("/v1/models", true, true),
            ("/v1/nope", true, true),
            ("/health", false, false),
            ("/metrics", false, true),
            ("/", false, false),
            ("/v1", false, false),
        ] {
            assert_eq!(auth(false).guards(path), plain, "{path}");
            assert_eq!(auth(true).guards(path), with_metrics, "{path}");
        }
        let open = Auth {
            keys: None,
            metrics_require_key: true,
        };
        assert!(!open.guards("/v1/completions"));
    }

    #[test]
    fn refusals_are_openai_shaped_and_never_echo_the_token() {
        for r in [Refusal::Missing, Refusal::Malformed, Refusal::Wrong] {
            let e = r.error();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED);
            assert_eq!(e.code, "invalid_api_key");
            let resp = r.into_response();
            assert!(
                resp.headers()[header::WWW_AUTHENTICATE]
                    .to_str()
                    .unwrap()
                    .starts_with("Bearer")
            );
        }
    }
}
