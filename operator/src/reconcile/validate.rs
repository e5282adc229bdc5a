//! Step 2: whether the spec can be run: the CRD's rules (`InferenceServiceSpec::validate`,
//! for an API server that skipped them) and what only a cluster needs (an image). Pure.
//! An invalid spec builds nothing and waits for a change; the service's pods keep running
//! what was built before, and its status still counts them (the snapshot goes on either
//! way).

use ballast_crds::{EngineKind, InferenceService};

use super::snapshot::Snapshot;

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
}

impl Invalid<'_> {
    /// One line: every broken rule.
    pub fn message(&self) -> String {
        self.errors.join("; ")
    }
}

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
    errors
}

/// Step 2: `snapshot` judged runnable or not.
pub fn validate<'a>(
    isvc: &'a InferenceService,
    default_image: &str,
    snapshot: Snapshot,
) -> Result<Valid<'a>, Invalid<'a>> {
    let errors = errors(isvc, default_image);
    if errors.is_empty() {
        Ok(Valid { isvc, snapshot })
    } else {
        Err(Invalid {
            isvc,
            snapshot,
            errors,
        })
    }
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
    }
}
