//! One control period, the same for both runtimes: scrape the ready replicas, aggregate
//! their samples into fleet signals, decide with the decision core, and record the
//! decision (the operator's metrics and the `ballast::decision` log line); plus the one
//! pool of control-API clients that DP weights go through.
//!
//! A runtime keeps only what differs: how it learns its replicas (it fills a
//! [`Replicas`]: `ballast local` from its processes, `ballast operator` from the pods in
//! its caches) and how it applies an [`Outcome`] (processes and a router, or a
//! Deployment, pod conditions and annotations). Each keeps one [`ControlPeriod`] per
//! service and calls [`ControlPeriod::run`] when [`ControlPeriod::due`] says so.
//!
//! ```text
//! runtime: learn replicas ─▶ ControlPeriod::run: scrape → aggregate → decide → record ─▶ runtime: apply
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use ballast_crds::{AutoscalingSpec, InferenceServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::control::ControlClients;
use crate::decide::{DecideInput, DpWeights, History, Outcome};
use crate::metrics::OperatorMetrics;
use crate::scrape::{ScrapeConfig, ScrapeKey, Scraper, Target, Tracker};
use crate::signals::{Dialect, FleetSignals};
use crate::status::{ConditionSet, ReplicaCounts};

/// What a runtime knows about a service's replicas when a period starts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replicas {
    /// The replica count last applied (the workload's size; HPA's `currentReplicas`).
    pub current: i32,
    /// The metrics endpoint of every ready replica.
    pub targets: Vec<Target>,
    /// Replicas started but not serving yet (counted toward the size, as HPA does).
    pub starting: usize,
    /// Ready replicas out of rotation now, as the runtime reads them back.
    pub out_of_rotation: BTreeSet<String>,
    /// The metrics endpoints of the service's ready gateway pickers, whose held requests
    /// are demand ([`crate::scrape::held`]); empty without a gateway.
    pub pickers: Vec<Target>,
    /// Every picker pod of the service, ready or not, with its containers' restarts: how a
    /// period tells a picker that died holding requests from one that sent them on.
    pub picker_restarts: BTreeMap<String, i32>,
}

/// What one period produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Period {
    /// The first successful scrape of a service by this process: counters have no
    /// previous sample, so no rate yet. Deciding now would flip conditions to "signal
    /// missing" and back one period later; this period only seeds them.
    Seeded(FleetSignals),
    /// A decision, already recorded, for the runtime to apply.
    Decided {
        /// The signals it was made on.
        fleet: FleetSignals,
        /// The decision.
        outcome: Box<Outcome>,
    },
}

/// One service's control loop memory: the decision history, the scrape tracker and
/// scraper, the schedule, the DP weights applied and the control-API clients.
pub struct ControlPeriod {
    namespace: String,
    name: String,
    history: History,
    tracker: Tracker,
    scraper: Option<(ScrapeConfig, Scraper)>,
    /// The decision core's clock: the same epoch every period.
    epoch: Instant,
    /// When the next period is due (`None`: now).
    next: Option<Instant>,
    /// The signals of the last period, for a decision between periods.
    last_fleet: Option<FleetSignals>,
    dp_weights: BTreeMap<String, Vec<f64>>,
    controls: ControlClients,
    /// The history of the decisions the built-in autoscaler would make while it is off
    /// (an external autoscaler owns the size): what `recommended_replicas` reports.
    shadow: History,
    /// The replicas the last decision recommends.
    recommended: Option<i32>,
    /// When the last period's scrape began (wall clock, for the metrics API's timestamps).
    scraped_at: Option<SystemTime>,
    /// The API key scrapes carry (`spec.auth`), if any.
    scrape_key: Option<ScrapeKey>,
    /// The scraper of the gateway pickers' `/metrics`, once there are pickers.
    pickers: Option<Scraper>,
    /// What each picker held at the last period, with its restarts then.
    held_by_picker: Holds,
}

/// Each picker's held requests and container restarts as last known, by pod name.
pub type Holds = BTreeMap<String, (f64, i32)>;

impl ControlPeriod {
    /// A service's control period, labelled `namespace`/`name` in metrics and logs; the
    /// first period is due at `first` (`None`: at once).
    pub fn new(namespace: &str, name: &str, first: Option<Instant>) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            history: History::default(),
            tracker: Tracker::new(),
            scraper: None,
            epoch: Instant::now(),
            next: first,
            last_fleet: None,
            dp_weights: BTreeMap::new(),
            controls: ControlClients::new(),
            shadow: History::default(),
            recommended: None,
            scraped_at: None,
            scrape_key: None,
            pickers: None,
            held_by_picker: BTreeMap::new(),
        }
    }

    /// The replica count the built-in autoscaler recommends after the last decision: its
    /// whole decision (every signal, deferred waiting excluded, replicas still starting
    /// counted), also while `autoscaling.enabled` is false, when it is worked out with a
    /// history of its own and not applied. `None` before the first decision.
    pub fn recommended_replicas(&self) -> Option<i32> {
        self.recommended
    }

    /// When the last period's scrape began (wall clock); `None` before the first period.
    pub fn scraped_at(&self) -> Option<SystemTime> {
        self.scraped_at
    }

    /// The control period of `spec` (`metrics.scrapeIntervalSeconds`, at least 1 s).
    pub fn interval(spec: &InferenceServiceSpec) -> Duration {
        Duration::from_secs(spec.metrics.scrape_interval_seconds.max(1) as u64)
    }

    /// Whether a period is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|t| now >= t)
    }

    /// How long until the next period is due (zero when it is).
    pub fn until_due(&self, now: Instant) -> Duration {
        self.next
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// The DP weights set on each replica (one per rank), as the engines confirmed them.
    pub fn dp_weights(&self) -> &BTreeMap<String, Vec<f64>> {
        &self.dp_weights
    }

    /// Forgets the DP weights and control clients of replicas for which `live` is false.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.dp_weights.retain(|r, _| live(r));
        self.controls.retain(&live);
    }

    /// One period: scrape `replicas`' targets with `spec.metrics`, aggregate, decide (or
    /// only seed the rates, see [`Period::Seeded`]), record the decision in `metrics` and
    /// the log, and schedule the next period one interval after this one was due.
    pub async fn run(
        &mut self,
        spec: &InferenceServiceSpec,
        replicas: &Replicas,
        metrics: &OperatorMetrics,
    ) -> Period {
        let now = Instant::now();
        let interval = Self::interval(spec);
        // Fixed steps from the first period; after a stall, one interval from now rather
        // than a burst of periods to catch up.
        let next = self.next.unwrap_or(now) + interval;
        self.next = Some(if next > now { next } else { now + interval });

        let config = ScrapeConfig {
            key: self.scrape_key.clone(),
            ..ScrapeConfig::from_spec(&spec.metrics)
        };
        let timeout = config.timeout;
        if self.scraper.as_ref().is_some_and(|(c, _)| *c != config) {
            self.scraper = None;
        }
        let (_, scraper) = self
            .scraper
            .get_or_insert_with(|| (config.clone(), Scraper::new(config)));
        let labels = [self.namespace.as_str(), self.name.as_str()];
        self.scraped_at = Some(SystemTime::now());
        let t0 = Instant::now();
        let outcomes = scraper
            .scrape(Dialect::from(spec.engine.kind), &replicas.targets)
            .await;
        metrics
            .scrape_duration
            .with_label_values(&labels)
            .observe(t0.elapsed().as_secs_f64());
        for o in &outcomes {
            if let Err(e) = &o.result {
                metrics
                    .scrape_errors
                    .with_label_values(&[labels[0], labels[1], e.reason()])
                    .inc();
            }
        }
        let seeding = self.tracker.tracked() == 0 && outcomes.iter().any(|o| o.result.is_ok());
        let held = if replicas.pickers.is_empty() {
            None
        } else {
            let pickers = self.pickers.get_or_insert_with(|| {
                Scraper::new(ScrapeConfig {
                    timeout,
                    ..ScrapeConfig::default()
                })
            });
            pickers.held(&replicas.pickers).await
        };
        let answered = held.as_ref().map_or(&[][..], |h| &h.by_picker[..]);
        let (lost, kept) = follow_holds(&self.held_by_picker, answered, &replicas.picker_restarts);
        for (picker, requests) in lost {
            tracing::warn!(
                namespace = %self.namespace,
                service = %self.name,
                picker = %picker,
                held = requests,
                "a gateway picker went away or restarted while holding {requests} requests: those are lost (their clients got an error from the proxy in front, not an answer); the requests it had sent on are not affected"
            );
        }
        self.held_by_picker = kept;
        let mut fleet = self
            .tracker
            .observe_outcomes(Instant::now(), &outcomes, replicas.starting);
        fleet.add_held(held);
        self.last_fleet = Some(fleet.clone());
        if seeding {
            return Period::Seeded(fleet);
        }
        let outcome = Box::new(self.decide(spec, replicas, fleet.clone(), metrics));
        Period::Decided { fleet, outcome }
    }

    /// A decision between periods, on the last period's signals (no scrape: a counter
    /// rate over a few milliseconds would mean nothing), for a spec that changed since.
    /// `None` before the first period.
    pub fn redecide(
        &mut self,
        spec: &InferenceServiceSpec,
        replicas: &Replicas,
        metrics: &OperatorMetrics,
    ) -> Option<(FleetSignals, Outcome)> {
        let fleet = self.last_fleet.clone()?;
        let outcome = self.decide(spec, replicas, fleet.clone(), metrics);
        Some((fleet, outcome))
    }

    fn decide(
        &mut self,
        spec: &InferenceServiceSpec,
        replicas: &Replicas,
        fleet: FleetSignals,
        metrics: &OperatorMetrics,
    ) -> Outcome {
        let mut input = DecideInput::new(spec, replicas.current, fleet);
        input.out_of_rotation = replicas.out_of_rotation.clone();
        input.dp_weights = self.dp_weights.clone();
        let outcome = crate::decide::decide(&input, &self.history, self.epoch.elapsed());
        // Both runtimes apply the size they are given in the same pass.
        self.history.record(
            &outcome.history,
            outcome.desired_replicas != replicas.current,
        );
        record_decision(metrics, &self.namespace, &self.name, &outcome);
        let recommended = if spec.autoscaling.enabled {
            outcome.desired_replicas
        } else {
            // What the autoscaler would decide were it on, remembered apart so that its
            // windows and rate limits hold as they would; nothing is applied or counted.
            input.autoscaling.enabled = true;
            let shadow = crate::decide::decide(&input, &self.shadow, self.epoch.elapsed());
            self.shadow
                .record(&shadow.history, shadow.desired_replicas != replicas.current);
            shadow.desired_replicas
        };
        self.recommended = Some(recommended);
        outcome
    }

    /// The API key later scrapes send as a bearer token (`None`: none). A change takes
    /// effect at the next period, on fresh connections.
    pub fn set_scrape_key(&mut self, key: Option<ScrapeKey>) {
        self.scrape_key = key;
    }

    /// The control tokens later control calls carry (the current one first).
    pub fn set_control_tokens(&mut self, tokens: crate::control::ControlTokens) {
        self.controls.set_tokens(tokens);
    }

    /// What later control calls to `https://` addresses trust (`None`: nothing).
    pub fn set_control_trust(&mut self, trust: Option<crate::control::ControlTrust>) {
        self.controls.set_trust(trust);
    }

    /// Sets the DP weights `plans` name over each replica's control API, at the address
    /// `address` gives (replicas without one are skipped), concurrently, each call bounded
    /// by [`CONTROL_TIMEOUT`](crate::control::CONTROL_TIMEOUT). What an engine confirmed is
    /// remembered for the next decision; a failure is logged and retried by a later one.
    /// Each call is counted in `ballast_operator_control_calls_total` by result.
    pub async fn set_dp_weights(
        &mut self,
        metrics: &OperatorMetrics,
        plans: &[DpWeights],
        address: impl Fn(&str) -> Option<String>,
    ) {
        let calls = plans
            .iter()
            .filter_map(|w| Some((w.replica.clone(), address(&w.replica)?, w.weights.clone())))
            .collect();
        for (replica, weights, result) in self.controls.set_dp_weights(calls).await {
            metrics
                .control_calls
                .with_label_values(&[
                    self.namespace.as_str(),
                    self.name.as_str(),
                    "set_dp_weights",
                    crate::control::result_label(&result),
                ])
                .inc();
            match result {
                Ok(()) => {
                    self.dp_weights.insert(replica, weights);
                }
                Err(error) => tracing::warn!(
                    target: "ballast::control",
                    namespace = %self.namespace,
                    service = %self.name,
                    %replica,
                    %error,
                    "cannot set DP weights"
                ),
            }
        }
    }
}

/// Counts a decision and sets the signal gauges it was made on, and writes its log line:
/// target `ballast::decision`, fields `namespace`, `service`, `action`, `reason`,
/// `current`, `desired`, `recommendations`, `message` (runbooks grep it).
pub fn record_decision(metrics: &OperatorMetrics, namespace: &str, name: &str, o: &Outcome) {
    metrics.record_decision(namespace, name, o);
    let recommendations: Vec<String> = o
        .recommendations()
        .iter()
        .map(|r| format!("{}={}", r.signal, r.replicas))
        .collect();
    tracing::info!(
        target: "ballast::decision",
        namespace = %namespace,
        service = %name,
        action = %o.action.as_str(),
        reason = o.reason.as_str(),
        current = o.current_replicas,
        desired = o.desired_replicas,
        recommendations = %recommendations.join(","),
        message = %o.message,
        "decision"
    );
}

/// The conditions a decision sets, as a status sets them.
pub fn conditions(o: &Outcome) -> Vec<ConditionSet<'_>> {
    o.conditions
        .iter()
        .map(|c| ConditionSet {
            type_: c.kind.as_str(),
            status: c.status,
            reason: c.reason,
            message: c.message.clone(),
        })
        .collect()
}

/// Sets a service's gauges from its state: replicas by state, the replicas wanted, the
/// autoscaling bounds and the conditions (and makes its error counters exist).
pub fn record_state(
    metrics: &OperatorMetrics,
    namespace: &str,
    name: &str,
    counts: ReplicaCounts,
    desired: i32,
    autoscaling: &AutoscalingSpec,
    conditions: &[Condition],
) {
    for (state, v) in [
        ("ready", counts.ready),
        ("starting", counts.starting),
        ("draining", counts.draining),
        ("accepting", counts.accepting),
    ] {
        metrics
            .replicas
            .with_label_values(&[namespace, name, state])
            .set(i64::from(v));
    }
    metrics
        .desired_replicas
        .with_label_values(&[namespace, name])
        .set(i64::from(desired));
    metrics.register_service(namespace, name);
    metrics.record_bounds(
        namespace,
        name,
        autoscaling.min_replicas,
        autoscaling.max_replicas,
    );
    metrics.record_conditions(namespace, name, conditions);
}

/// What each picker holds, followed across periods. `before`: each picker's held
/// requests and restarts as last known; `answered`: what pickers answered this period;
/// `restarts`: every picker pod now, with its restarts. Returns the pickers that held
/// requests and have since gone or restarted (their requests died with the process:
/// `(picker, requests)`, by name), and the new record: a picker that answered, at what it
/// answered; one that did not (unready, not scraped) at what it last held, until it
/// answers again, restarts or goes.
pub fn follow_holds(
    before: &Holds,
    answered: &[(String, f64)],
    restarts: &BTreeMap<String, i32>,
) -> (Vec<(String, f64)>, Holds) {
    let lost = before
        .iter()
        .filter(|(_, (requests, _))| *requests > 0.0)
        .filter(|(name, (_, then))| restarts.get(*name).is_none_or(|now| now > then))
        .map(|(name, (requests, _))| (name.clone(), *requests))
        .collect();
    let mut kept: Holds = before
        .iter()
        .filter(|(name, (_, then))| restarts.get(*name) == Some(then))
        .map(|(name, v)| (name.clone(), *v))
        .collect();
    for (name, requests) in answered {
        if let Some(&now) = restarts.get(name) {
            kept.insert(name.clone(), (*requests, now));
        }
    }
    (lost, kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> InferenceServiceSpec {
        ballast_crds::parse_yaml(&format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: InferenceService\nmetadata: {{name: chat}}\nspec: {yaml}\n"
        ))
        .unwrap()
        .remove(0)
        .spec
    }

    #[test]
    fn a_picker_that_died_holding_requests_lost_them_and_one_that_sent_them_on_did_not() {
        let before = BTreeMap::from([
            ("epp-a".to_string(), (3.0, 0)),
            ("epp-b".to_string(), (2.0, 1)),
            ("epp-c".to_string(), (4.0, 0)),
            ("epp-d".to_string(), (0.0, 0)),
        ]);
        // a restarted, b sent its two on, c is gone, d held nothing and is not scraped.
        let restarts = BTreeMap::from([
            ("epp-a".to_string(), 1),
            ("epp-b".to_string(), 1),
            ("epp-d".to_string(), 0),
        ]);
        let (lost, kept) = follow_holds(&before, &[("epp-b".to_string(), 0.0)], &restarts);
        assert_eq!(
            lost,
            [("epp-a".to_string(), 3.0), ("epp-c".to_string(), 4.0)]
        );
        assert_eq!(
            kept,
            BTreeMap::from([
                ("epp-b".to_string(), (0.0, 1)),
                ("epp-d".to_string(), (0.0, 0)),
            ])
        );
        // A picker that turns unready holding requests is remembered at what it held, so
        // its restart, periods later, is still seen as a loss.
        let held = BTreeMap::from([("epp-a".to_string(), (3.0, 0))]);
        let unready = BTreeMap::from([("epp-a".to_string(), 0)]);
        let (lost, kept) = follow_holds(&held, &[], &unready);
        assert!(lost.is_empty());
        assert_eq!(kept, held);
        let (lost, _) = follow_holds(&kept, &[], &BTreeMap::from([("epp-a".to_string(), 1)]));
        assert_eq!(lost, [("epp-a".to_string(), 3.0)]);
    }

    #[tokio::test]
    async fn periods_keep_their_step_and_a_stall_does_not_burst() {
        let s = spec("{model: {source: x}, metrics: {scrapeIntervalSeconds: 3}}");
        let m = OperatorMetrics::new();
        let t0 = Instant::now();
        let mut p = ControlPeriod::new("ns", "chat", Some(t0 + Duration::from_secs(3)));
        assert!(!p.due(t0));
        assert_eq!(p.until_due(t0), Duration::from_secs(3));
        assert!(p.due(t0 + Duration::from_secs(3)));
        // No replicas: nothing to seed, so it decides (hold: no replicas report).
        let Period::Decided { outcome, .. } = p.run(&s, &Replicas::default(), &m).await else {
            panic!("nothing to seed without a replica");
        };
        assert_eq!(outcome.desired_replicas, 1, "below minReplicas: up to it");
        // The next one is one interval after the first was due, not after it ran.
        assert_eq!(p.until_due(t0), Duration::from_secs(6));
        // A period run long after it was due schedules the next one interval from now.
        let mut late = ControlPeriod::new("ns", "chat", Some(t0 - Duration::from_secs(60)));
        late.run(&s, &Replicas::default(), &m).await;
        let left = late.until_due(Instant::now());
        assert!(
            left > Duration::from_secs(2) && left <= Duration::from_secs(3),
            "{left:?}"
        );
        let text = m.render();
        assert!(
            text.contains("ballast_operator_decisions_total{action=\"ScaleUp\",name=\"chat\",namespace=\"ns\",reason=\"BelowMinReplicas\"} 2"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_decision_between_periods_needs_a_period_first_and_scrapes_nothing() {
        let s = spec("{model: {source: x}, replicas: 2, autoscaling: {enabled: false}}");
        let m = OperatorMetrics::new();
        let mut p = ControlPeriod::new("ns", "chat", None);
        let replicas = Replicas {
            current: 2,
            ..Replicas::default()
        };
        assert!(p.redecide(&s, &replicas, &m).is_none());
        assert!(p.due(Instant::now()));
        p.run(&s, &replicas, &m).await;
        assert!(!p.due(Instant::now()));
        let scaled = spec("{model: {source: x}, replicas: 3, autoscaling: {enabled: false}}");
        let (_, o) = p.redecide(&scaled, &replicas, &m).unwrap();
        assert_eq!(
            (o.desired_replicas, o.reason.as_str()),
            (3, "FollowingSpecReplicas")
        );
        assert!(!p.due(Instant::now()), "the schedule is unchanged");
    }

    #[tokio::test]
    async fn the_recommendation_is_the_autoscalers_even_while_it_is_off() {
        let m = OperatorMetrics::new();
        let replicas = Replicas {
            current: 1,
            ..Replicas::default()
        };
        // Off: the decision follows spec.replicas (3); the autoscaler, were it on, would
        // bring the fleet into its range (2), and that is what is recommended.
        let off = spec(
            "{model: {source: x}, replicas: 3, autoscaling: {enabled: false, minReplicas: 2, maxReplicas: 5}}",
        );
        let mut p = ControlPeriod::new("ns", "chat", None);
        assert_eq!(p.recommended_replicas(), None);
        let Period::Decided { outcome, .. } = p.run(&off, &replicas, &m).await else {
            panic!("decided");
        };
        assert_eq!(outcome.desired_replicas, 3);
        assert_eq!(p.recommended_replicas(), Some(2));
        assert!(p.scraped_at().is_some());
        // On: the decision itself.
        let on = spec("{model: {source: x}, autoscaling: {minReplicas: 4, maxReplicas: 5}}");
        let mut p = ControlPeriod::new("ns", "chat", None);
        let Period::Decided { outcome, .. } = p.run(&on, &replicas, &m).await else {
            panic!("decided");
        };
        assert_eq!(p.recommended_replicas(), Some(outcome.desired_replicas));
        assert_eq!(outcome.desired_replicas, 4);
    }

    #[test]
    fn state_gauges_and_conditions() {
        let m = OperatorMetrics::new();
        let s = spec("{model: {source: x}, autoscaling: {minReplicas: 2, maxReplicas: 5}}");
        let counts = ReplicaCounts {
            ready: 2,
            starting: 1,
            draining: 0,
            accepting: 1,
        };
        record_state(&m, "ns", "chat", counts, 3, &s.autoscaling, &[]);
        let text = m.render();
        for line in [
            "ballast_operator_replicas{name=\"chat\",namespace=\"ns\",state=\"accepting\"} 1",
            "ballast_operator_replicas{name=\"chat\",namespace=\"ns\",state=\"starting\"} 1",
            "ballast_operator_desired_replicas{name=\"chat\",namespace=\"ns\"} 3",
            "ballast_operator_max_replicas{name=\"chat\",namespace=\"ns\"} 5",
            "ballast_operator_scrape_errors_total{name=\"chat\",namespace=\"ns\",reason=\"timeout\"} 0",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
