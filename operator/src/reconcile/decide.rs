//! Steps 3–4 glue: scrape targets from the ready pods, the decision core's input from what
//! was fetched and scraped, and what a decision means for pods (rotation, deletion cost).
//! Pure: the decision itself is `crate::decide`, unchanged.

use std::collections::BTreeMap;

use ballast_crds::InferenceService;

use super::fetch::Observed;
use crate::decide::{DecideInput, RebalancePlan};
use crate::scrape::Target;
use crate::signals::FleetSignals;

/// Every ready pod's metrics endpoint, on its pod IP (never the Service's cluster IP).
pub fn targets(isvc: &InferenceService, observed: &Observed) -> Vec<Target> {
    let port = isvc.spec.engine.port;
    observed
        .ready_pods()
        .values()
        .filter_map(|p| {
            let ip = p.ip.as_deref()?;
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.to_string()
            };
            Some(Target::new(p.name.clone(), format!("http://{host}:{port}")))
        })
        .collect()
}

/// The decision core's input: the spec, the replica count last applied, what is out of
/// rotation (read from the pods, level-triggered) and the DP weights set on live pods.
pub fn input(
    isvc: &InferenceService,
    observed: &Observed,
    fleet: FleetSignals,
    dp_weights: &BTreeMap<String, Vec<f64>>,
) -> DecideInput {
    let current = observed
        .deployment_replicas()
        .unwrap_or_else(|| isvc.spec.initial_replicas());
    let mut input = DecideInput::new(&isvc.spec, current, fleet);
    input.out_of_rotation = observed.out_of_rotation();
    let ready = observed.ready_pods();
    input.dp_weights = dp_weights
        .iter()
        .filter(|(pod, _)| ready.contains_key(pod.as_str()))
        .map(|(pod, w)| (pod.clone(), w.clone()))
        .collect();
    input
}

/// The accepting condition each ready pod should have after `plan`, for the pods whose
/// condition must change: taken out → false, restored → true, a new pod (no condition yet)
/// → true unless taken out now.
pub fn rotation(observed: &Observed, plan: &RebalancePlan) -> Vec<(String, bool)> {
    observed
        .ready_pods()
        .values()
        .filter_map(|p| {
            let want = if plan.take_out.contains(&p.name) {
                false
            } else if plan.restore.contains(&p.name) {
                true
            } else {
                p.accepting.unwrap_or(true)
            };
            (p.accepting != Some(want)).then(|| (p.name.clone(), want))
        })
        .collect()
}

/// Deletion costs for a scale-down: each ready pod's load (running plus waiting requests in
/// its latest sample), so the Deployment removes the least-loaded first. Only pods whose
/// annotation differs are returned; pods without a sample are left alone (the Deployment
/// already prefers pods that are not ready).
pub fn deletion_costs(observed: &Observed, fleet: &FleetSignals) -> Vec<(String, i32)> {
    let load: BTreeMap<&str, f64> = fleet
        .replicas
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.running + r.capacity_waiting + r.deferred_waiting,
            )
        })
        .collect();
    observed
        .ready_pods()
        .values()
        .filter_map(|p| {
            let l = load.get(p.name.as_str())?;
            let cost = l.round().clamp(0.0, i32::MAX as f64) as i32;
            (p.deletion_cost.as_deref() != Some(cost.to_string().as_str()))
                .then(|| (p.name.clone(), cost))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::fetch::PodView;
    use crate::signals::ReplicaSignals;

    fn pod(name: &str, accepting: Option<bool>, cost: Option<&str>) -> PodView {
        PodView {
            name: name.into(),
            ip: Some("127.0.0.2".into()),
            serving: true,
            terminating: false,
            accepting,
            deletion_cost: cost.map(str::to_string),
            start_failure: None,
        }
    }

    fn isvc(yaml_spec: &str) -> InferenceService {
        ballast_crds::parse_yaml(&format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat}}\nspec: {yaml_spec}\n"
        ))
        .unwrap()
        .remove(0)
    }

    #[test]
    fn initial_size_follows_the_spec() {
        let i = |s: &str| isvc(s).spec.initial_replicas();
        let m = "model: {source: x}";
        assert_eq!(i(&format!("{{{m}}}")), 1);
        assert_eq!(
            i(&format!(
                "{{{m}, autoscaling: {{minReplicas: 2, maxReplicas: 5}}}}"
            )),
            2
        );
        assert_eq!(
            i(&format!(
                "{{{m}, replicas: 9, autoscaling: {{maxReplicas: 5}}}}"
            )),
            5
        );
        assert_eq!(
            i(&format!(
                "{{{m}, replicas: 9, autoscaling: {{enabled: false}}}}"
            )),
            9
        );
    }

    #[test]
    fn targets_are_pod_ips_and_the_engine_port() {
        let o = Observed {
            deployment: None,
            pods: vec![
                pod("a", Some(true), None),
                PodView {
                    ip: Some("fd00::5".into()),
                    ..pod("b", None, None)
                },
                PodView {
                    serving: false,
                    ..pod("c", None, None)
                },
            ],
        };
        let t = targets(&isvc("{model: {source: x}, engine: {port: 8080}}"), &o);
        let urls: Vec<&str> = t.iter().map(|t| t.base_url.as_str()).collect();
        assert_eq!(urls, ["http://127.0.0.2:8080", "http://[fd00::5]:8080"]);
    }

    #[test]
    fn rotation_changes_only_what_must_change() {
        let o = Observed {
            deployment: None,
            pods: vec![
                pod("hot", Some(true), None),
                pod("cool", Some(false), None),
                pod("new", None, None),
                pod("steady", Some(true), None),
                pod("out", Some(false), None),
            ],
        };
        let plan = RebalancePlan {
            take_out: vec!["hot".into()],
            restore: vec!["cool".into()],
            dp_weights: vec![],
        };
        let mut got = rotation(&o, &plan);
        got.sort();
        assert_eq!(
            got,
            [
                ("cool".to_string(), true),
                ("hot".to_string(), false),
                ("new".to_string(), true)
            ]
        );
    }

    #[test]
    fn deletion_costs_follow_load_and_skip_unchanged() {
        let o = Observed {
            deployment: None,
            pods: vec![
                pod("busy", Some(true), None),
                pod("idle", Some(true), Some("0")),
                pod("unknown", Some(true), None),
            ],
        };
        let signals = |name: &str, running: f64, waiting: f64| ReplicaSignals {
            name: name.into(),
            running,
            capacity_waiting: waiting,
            ..ReplicaSignals::default()
        };
        let fleet = FleetSignals {
            replicas: vec![signals("busy", 6.0, 2.0), signals("idle", 0.0, 0.0)],
            ..FleetSignals::default()
        };
        assert_eq!(deletion_costs(&o, &fleet), [("busy".to_string(), 8)]);
    }
}
