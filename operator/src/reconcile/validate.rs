//! Step 2: whether the spec can be run: the CRD's rules (`InferenceServiceSpec::validate`,
//! for an API server that skipped them), what only a cluster needs (an image), and the
//! Secret `spec.auth` names. Pure. An invalid spec builds nothing and waits for a change
//! (a missing Secret, which no watch reports, is looked for again every
//! [`REFERENCED_SECRET_REFRESH`]); the service's pods keep running what was built before,
//! and its status still counts them (the snapshot goes on either way).

use ballast_crds::{EngineKind, InferenceService};

use super::cache::REFERENCED_SECRET_REFRESH;
use super::snapshot::{ApiKeys, Snapshot};

/// A spec that can be run, with what the cluster holds.
#[derive(Debug)]
pub struct Valid<'a> {
    /// The resource.
    pub isvc: &'a InferenceService,
    /// Step 1's snapshot.
    pub snapshot: Snapshot,
}

/// A spec that cannot, with every rule it breaks.
#[derive(Debug)]
pub struct Invalid<'a> {
    /// The resource.
    pub isvc: &'a InferenceService,
    /// Step 1's snapshot.
    pub snapshot: Snapshot,
    /// The rules broken, as the CRD's validation messages say them.
    pub errors: Vec<String>,
    /// What is wrong, as a condition's reason: `InvalidSpec`, or `ApiKeySecretMissing`
    /// when the spec is fine but the Secret it names is not.
    pub reason: &'static str,
}

impl Invalid<'_> {
    /// One line: every broken rule.
    pub fn message(&self) -> String {
        self.errors.join("; ")
    }

    /// When to look again without a change to the resource: a fix to a Secret reaches no
    /// watch of the operator's.
    pub fn recheck(&self) -> Option<std::time::Duration> {
        (self.reason == API_KEY_SECRET_MISSING).then_some(REFERENCED_SECRET_REFRESH)
    }
}

/// The reason of a spec that is valid but names an API-key Secret, or a key of it, that
/// is not there.
pub const API_KEY_SECRET_MISSING: &str = "ApiKeySecretMissing";

/// The rules `isvc` breaks in a cluster whose operator's `--engine-image` is
/// `default_image` (empty: none).
pub fn errors(isvc: &InferenceService, default_image: &str) -> Vec<String> {
    let mut errors = isvc.spec.validate().err().unwrap_or_default();
    if isvc.spec.engine.image.is_empty()
        && (isvc.spec.engine.kind != EngineKind::Ballast || default_image.is_empty())
    {
        errors.push(
            "spec.engine.image is required (the operator's --engine-image applies to kind ballast only)"
                .into(),
        );
    }
    let g = &isvc.spec.gateway;
    if g.enabled && g.image.is_empty() && default_image.is_empty() {
        errors.push(
            "spec.gateway.image is required (the operator has no --engine-image to run the picker with)"
                .into(),
        );
    }
    errors
}

/// Step 2: `snapshot` judged runnable or not.
pub fn validate<'a>(
    isvc: &'a InferenceService,
    default_image: &str,
    snapshot: Snapshot,
) -> Result<Valid<'a>, Box<Invalid<'a>>> {
    let errors = errors(isvc, default_image);
    if !errors.is_empty() {
        return Err(Box::new(Invalid {
            isvc,
            snapshot,
            errors,
            reason: "InvalidSpec",
        }));
    }
    if let ApiKeys::Missing(why) = &snapshot.api_keys {
        let errors = vec![why.clone()];
        return Err(Box::new(Invalid {
            isvc,
            snapshot,
            errors,
            reason: API_KEY_SECRET_MISSING,
        }));
    }
    Ok(Valid { isvc, snapshot })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isvc(spec: &str) -> InferenceService {
        ballast_crds::parse_yaml(&format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat}}\nspec: {spec}\n"
        ))
        .unwrap()
        .remove(0)
    }

    #[test]
    fn an_image_is_needed_unless_the_operator_has_one_for_ballast() {
        let ballast = isvc("{model: {source: x}}");
        assert!(errors(&ballast, "ballast:1").is_empty());
        assert_eq!(errors(&ballast, "").len(), 1);
        let vllm = isvc("{model: {source: x}, engine: {kind: vllm}}");
        assert!(errors(&vllm, "ballast:1")[0].contains("spec.engine.image"));
        let given = isvc("{model: {source: x}, engine: {kind: vllm, image: v}}");
        assert!(errors(&given, "").is_empty());
        let bad = isvc(
            "{model: {source: x}, engine: {kind: vllm}, autoscaling: {minReplicas: 3, maxReplicas: 2}}",
        );
        let e = validate(&bad, "", Snapshot::default()).unwrap_err();
        assert_eq!(e.errors.len(), 2, "{:?}", e.errors);
        assert!(e.message().contains("; "));
        assert_eq!((e.reason, e.recheck()), ("InvalidSpec", None));
    }

    #[test]
    fn a_missing_api_key_secret_holds_the_service_and_is_looked_for_again() {
        let with_auth = isvc("{model: {source: x}, auth: {apiKeySecretRef: {name: keys, key: k}}}");
        let missing = Snapshot {
            api_keys: ApiKeys::Missing("Secret ml/keys not found".into()),
            ..Snapshot::default()
        };
        let e = validate(&with_auth, "ballast:1", missing).unwrap_err();
        assert_eq!(e.reason, API_KEY_SECRET_MISSING);
        assert_eq!(e.message(), "Secret ml/keys not found");
        assert_eq!(e.recheck(), Some(REFERENCED_SECRET_REFRESH));
        // A broken spec is told first: the Secret may be fine once the spec is.
        let both = isvc(
            "{model: {source: x}, replicas: -1, auth: {apiKeySecretRef: {name: keys, key: k}}}",
        );
        let missing = Snapshot {
            api_keys: ApiKeys::Missing("gone".into()),
            ..Snapshot::default()
        };
        assert_eq!(
            validate(&both, "b", missing).unwrap_err().reason,
            "InvalidSpec"
        );
        let found = Snapshot {
            api_keys: ApiKeys::Found(crate::scrape::ScrapeKey::new("k").unwrap()),
            ..Snapshot::default()
        };
        assert!(validate(&with_auth, "ballast:1", found).is_ok());
    }
}
