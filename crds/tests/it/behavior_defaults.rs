//! `autoscaling.behavior` fills each unset field from HPA's default for its direction, one
//! field at a time, as Kubernetes' `GenerateHPAScaleUpRules` / `GenerateHPAScaleDownRules`
//! (pkg/apis/autoscaling/v2/defaults.go) do: every combination of set and unset fields in
//! both directions, parsed from YAML, against the rules the decision core applies.

use ballast_crds::{
    BehaviorSpec, PolicyType, ResolvedBehavior, ResolvedRules, ScalingPolicy, SelectPolicy,
    parse_yaml,
};

fn policy(type_: PolicyType, value: i32, period_seconds: i32) -> ScalingPolicy {
    ScalingPolicy {
        type_,
        value,
        period_seconds,
    }
}

/// HPA's defaults, written out rather than taken from the code under test.
fn hpa_up() -> ResolvedRules {
    ResolvedRules {
        stabilization_window_seconds: 0,
        select_policy: SelectPolicy::Max,
        policies: vec![
            policy(PolicyType::Pods, 4, 15),
            policy(PolicyType::Percent, 100, 15),
        ],
    }
}

fn hpa_down() -> ResolvedRules {
    ResolvedRules {
        stabilization_window_seconds: 300,
        select_policy: SelectPolicy::Max,
        policies: vec![policy(PolicyType::Percent, 100, 15)],
    }
}

/// Which of a direction's three fields a case sets (to values unlike any default).
#[derive(Clone, Copy, Debug)]
struct Set {
    window: bool,
    select: bool,
    policies: bool,
}

impl Set {
    fn all() -> impl Iterator<Item = Set> {
        (0..8).map(|bits| Set {
            window: bits & 1 != 0,
            select: bits & 2 != 0,
            policies: bits & 4 != 0,
        })
    }

    fn any(self) -> bool {
        self.window || self.select || self.policies
    }

    /// The direction's YAML mapping, e.g. `{stabilizationWindowSeconds: 45}`.
    fn yaml(self) -> String {
        let mut fields = Vec::new();
        if self.window {
            fields.push("stabilizationWindowSeconds: 45".to_string());
        }
        if self.select {
            fields.push("selectPolicy: Min".to_string());
        }
        if self.policies {
            fields.push("policies: [{type: Pods, value: 2, periodSeconds: 60}]".to_string());
        }
        format!("{{{}}}", fields.join(", "))
    }

    /// What the decision core must apply: set fields as written, the rest from `default`.
    fn expected(self, default: ResolvedRules) -> ResolvedRules {
        ResolvedRules {
            stabilization_window_seconds: if self.window {
                45
            } else {
                default.stabilization_window_seconds
            },
            select_policy: if self.select {
                SelectPolicy::Min
            } else {
                default.select_policy
            },
            policies: if self.policies {
                vec![policy(PolicyType::Pods, 2, 60)]
            } else {
                default.policies
            },
        }
    }
}

/// The resolved behaviour of a resource whose `spec.autoscaling` has `autoscaling` (YAML
/// flow mapping entries, possibly none).
fn resolved(autoscaling: &str) -> ResolvedBehavior {
    let text = format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: m}}\n\
         spec: {{model: {{source: synthetic:tiny}}, autoscaling: {{{autoscaling}}}}}\n"
    );
    let docs = parse_yaml(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let spec = &docs[0].spec;
    spec.validate().unwrap_or_else(|e| panic!("{text}: {e:?}"));
    spec.autoscaling.behavior.resolved()
}

#[test]
fn every_partial_behavior_takes_hpa_defaults_field_by_field() {
    let mut cases = 0;
    for up in Set::all() {
        for down in Set::all() {
            // A direction that sets nothing is left out entirely.
            let mut directions = Vec::new();
            if up.any() {
                directions.push(format!("scaleUp: {}", up.yaml()));
            }
            if down.any() {
                directions.push(format!("scaleDown: {}", down.yaml()));
            }
            let yaml = format!("behavior: {{{}}}", directions.join(", "));
            let got = resolved(&yaml);
            let want = ResolvedBehavior {
                scale_up: up.expected(hpa_up()),
                scale_down: down.expected(hpa_down()),
            };
            assert_eq!(got, want, "{yaml}");
            cases += 1;
        }
    }
    assert_eq!(cases, 64);
}

#[test]
fn the_issue_examples() {
    // Policies alone keep the 300 s scale-down window (it was 0).
    let b =
        resolved("behavior: {scaleDown: {policies: [{type: Pods, value: 1, periodSeconds: 60}]}}");
    assert_eq!(b.scale_down.stabilization_window_seconds, 300);
    assert_eq!(b.scale_down.policies, [policy(PolicyType::Pods, 1, 60)]);
    // A window alone keeps the scale-up rate limits (they were removed).
    let b = resolved("behavior: {scaleUp: {stabilizationWindowSeconds: 60}}");
    assert_eq!(b.scale_up.policies, hpa_up().policies);
    assert_eq!(b.scale_up.stabilization_window_seconds, 60);
}

#[test]
fn absent_empty_and_null_all_mean_the_defaults() {
    let defaults = ResolvedBehavior {
        scale_up: hpa_up(),
        scale_down: hpa_down(),
    };
    for yaml in [
        "",
        "behavior: {}",
        "behavior: {scaleUp: {}, scaleDown: {}}",
        "behavior: {scaleUp: {policies: []}, scaleDown: {policies: []}}",
        "behavior: {scaleUp: {stabilizationWindowSeconds: null, selectPolicy: null}}",
    ] {
        assert_eq!(resolved(yaml), defaults, "{yaml:?}");
    }
    assert_eq!(BehaviorSpec::default().resolved(), defaults);
    assert!(BehaviorSpec::default().is_unset());
}

#[test]
fn what_the_user_wrote_round_trips_unchanged() {
    // Defaults are applied when read, never written back: the spec stays as written.
    let text = "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: m}\n\
                spec: {model: {source: synthetic:tiny}, autoscaling: {behavior: {scaleDown: {selectPolicy: Min}}}}\n";
    let isvc = &parse_yaml(text).unwrap()[0];
    let json = serde_json::to_value(&isvc.spec.autoscaling).unwrap();
    assert_eq!(
        json["behavior"],
        serde_json::json!({"scaleDown": {"selectPolicy": "Min"}})
    );
}
