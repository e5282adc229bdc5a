//! The operator's own metrics (control-plane contract §4 names), served by both runtimes:
//! `ballast local`'s admin port and `ballast operator`'s `/metrics`.
//!
//! Every per-service family is labelled with the InferenceService's `namespace` and `name`
//! (`namespace="local"` in `ballast local`), so services of the same name in two namespaces
//! never share a series. A Prometheus scraping the operator must keep that label
//! (`honorLabels: true`, as the chart's ServiceMonitor sets) rather than overwrite it with
//! the operator pod's namespace.

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The operator's metric families.
pub struct OperatorMetrics {
    registry: Registry,
    /// `ballast_operator_decisions_total{namespace, name, action, reason}`.
    pub decisions: IntCounterVec,
    /// `ballast_operator_desired_replicas{namespace, name}`.
    pub desired_replicas: IntGaugeVec,
    /// `ballast_operator_replicas{namespace, name, state}`: ready, starting, draining, accepting.
    pub replicas: IntGaugeVec,
    /// `ballast_operator_signal{namespace, name, signal}`: the aggregated signals decided on.
    pub signal: GaugeVec,
    /// `ballast_operator_scrape_errors_total{namespace, name, reason}`.
    pub scrape_errors: IntCounterVec,
    /// `ballast_operator_scrape_duration_seconds{namespace, name}`: one control period's scrape.
    pub scrape_duration: HistogramVec,
    /// `ballast_operator_reconcile_errors_total{namespace, name, category}` (Kubernetes runtime).
    pub reconcile_errors: IntCounterVec,
    /// `ballast_operator_api_writes_total{namespace, name, object}`: writes to the API server, by the
    /// object written (Kubernetes runtime). An unchanged resource adds none.
    pub api_writes: IntCounterVec,
    /// `ballast_operator_control_calls_total{namespace, name, call, result}`: calls to the
    /// engines' control API, by call and result (`ok`, `unauthenticated`, `error`).
    pub control_calls: IntCounterVec,
    /// `ballast_operator_signal_observed{namespace, name, signal}`: the value each configured signal
    /// was compared with its target on (per replica for capacity waiting, as the target
    /// is); NaN when missing.
    pub signal_observed: GaugeVec,
    /// `ballast_operator_signal_target{namespace, name, signal}`: each configured signal's target.
    pub signal_target: GaugeVec,
    /// `ballast_operator_min_replicas{namespace, name}` and `ballast_operator_max_replicas{namespace, name}`: the
    /// autoscaling bounds in force.
    pub min_replicas: IntGaugeVec,
    /// See [`min_replicas`](Self::min_replicas).
    pub max_replicas: IntGaugeVec,
    /// `ballast_operator_condition{namespace, name, type, status}`: 1 on the series of each
    /// condition's current status (`True` or `False`), 0 on the other.
    pub condition: IntGaugeVec,
    /// `ballast_operator_leader`: 1 while this operator replica holds the leader lease (or
    /// runs without election), 0 while it stands by.
    pub leader: prometheus::IntGauge,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorMetrics {
    /// Registers every family.
    pub fn new() -> Self {
        let registry = Registry::new();
        let decisions = IntCounterVec::new(
            Opts::new(
                "ballast_operator_decisions_total",
                "Decisions by service, action and reason.",
            ),
            &["namespace", "name", "action", "reason"],
        )
        .expect("valid");
        let desired_replicas = IntGaugeVec::new(
            Opts::new(
                "ballast_operator_desired_replicas",
                "Replicas the operator wants per service.",
            ),
            &["namespace", "name"],
        )
        .expect("valid");
        let replicas = IntGaugeVec::new(
            Opts::new(
                "ballast_operator_replicas",
                "Replicas per service by state: ready, starting, draining, accepting.",
            ),
            &["namespace", "name", "state"],
        )
        .expect("valid");
        let signal = GaugeVec::new(
            Opts::new(
                "ballast_operator_signal",
                "Aggregated fleet signals the last decision used.",
            ),
            &["namespace", "name", "signal"],
        )
        .expect("valid");
        let scrape_errors = IntCounterVec::new(
            Opts::new(
                "ballast_operator_scrape_errors_total",
                "Failed replica scrapes by reason.",
            ),
            &["namespace", "name", "reason"],
        )
        .expect("valid");
        let scrape_duration = HistogramVec::new(
            HistogramOpts::new(
                "ballast_operator_scrape_duration_seconds",
                "Time to scrape every replica of a service once.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["namespace", "name"],
        )
        .expect("valid");
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "ballast_operator_reconcile_errors_total",
                "Failed reconciles by service and error category.",
            ),
            &["namespace", "name", "category"],
        )
        .expect("valid");
        let api_writes = IntCounterVec::new(
            Opts::new(
                "ballast_operator_api_writes_total",
                "Writes to the Kubernetes API server by service and object (deployment, service, pdb, servicemonitor, status, pod).",
            ),
            &["namespace", "name", "object"],
        )
        .expect("valid");
        let control_calls = IntCounterVec::new(
            Opts::new(
                "ballast_operator_control_calls_total",
                "Calls to the engines' gRPC control API by service, call and result (ok, unauthenticated: the engine refused the control token, error).",
            ),
            &["namespace", "name", "call", "result"],
        )
        .expect("valid");
        let signal_observed = GaugeVec::new(
            Opts::new(
                "ballast_operator_signal_observed",
                "The value each configured signal was compared with its target on (per replica for capacityWaiting); NaN when missing.",
            ),
            &["namespace", "name", "signal"],
        )
        .expect("valid");
        let signal_target = GaugeVec::new(
            Opts::new(
                "ballast_operator_signal_target",
                "Each configured signal's target.",
            ),
            &["namespace", "name", "signal"],
        )
        .expect("valid");
        let min_replicas = IntGaugeVec::new(
            Opts::new(
                "ballast_operator_min_replicas",
                "The lower autoscaling bound per service.",
            ),
            &["namespace", "name"],
        )
        .expect("valid");
        let max_replicas = IntGaugeVec::new(
            Opts::new(
                "ballast_operator_max_replicas",
                "The upper autoscaling bound per service.",
            ),
            &["namespace", "name"],
        )
        .expect("valid");
        let condition = IntGaugeVec::new(
            Opts::new(
                "ballast_operator_condition",
                "1 on the current status (True or False) of each status condition, 0 on the other.",
            ),
            &["namespace", "name", "type", "status"],
        )
        .expect("valid");
        let leader = prometheus::IntGauge::new(
            "ballast_operator_leader",
            "1 while this operator replica holds the leader lease (or runs without election), 0 while it stands by.",
        )
        .expect("valid");
        for c in [
            Box::new(decisions.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(desired_replicas.clone()),
            Box::new(replicas.clone()),
            Box::new(signal.clone()),
            Box::new(scrape_errors.clone()),
            Box::new(scrape_duration.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(api_writes.clone()),
            Box::new(control_calls.clone()),
            Box::new(signal_observed.clone()),
            Box::new(signal_target.clone()),
            Box::new(min_replicas.clone()),
            Box::new(max_replicas.clone()),
            Box::new(condition.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(c).expect("unique");
        }
        Self {
            registry,
            decisions,
            desired_replicas,
            replicas,
            signal,
            scrape_errors,
            scrape_duration,
            reconcile_errors,
            api_writes,
            control_calls,
            signal_observed,
            signal_target,
            min_replicas,
            max_replicas,
            condition,
            leader,
        }
    }

    /// Counts one decision of `service` and sets the signal gauges it was made on (NaN
    /// for a signal without a value).
    pub fn record_decision(&self, ns: &str, service: &str, outcome: &crate::decide::Outcome) {
        self.decisions
            .with_label_values(&[
                ns,
                service,
                outcome.action.as_str(),
                outcome.reason.as_str(),
            ])
            .inc();
        let s = &outcome.signals;
        for (signal, v) in [
            ("capacityWaiting", s.capacity_waiting),
            ("deferredWaiting", s.deferred_waiting),
            ("kvCacheUsage", s.kv_cache_usage),
            (
                "admissionRejectionsPerSecond",
                s.admission_rejections_per_second,
            ),
            ("ttftP99Seconds", s.ttft_p99_seconds),
        ] {
            self.signal
                .with_label_values(&[ns, service, signal])
                .set(v.unwrap_or(f64::NAN));
        }
        for r in &outcome.reports {
            let signal = r.signal.as_str();
            self.signal_target
                .with_label_values(&[ns, service, signal])
                .set(r.target);
            self.signal_observed
                .with_label_values(&[ns, service, signal])
                .set(r.observed.unwrap_or(f64::NAN));
        }
    }

    /// Makes the counters of `service` exist at 0 (a scrape error per reason), so that a
    /// dashboard shows 0 rather than "no data" and `rate()` sees the first error.
    pub fn register_service(&self, ns: &str, service: &str) {
        for reason in crate::scrape::ScrapeError::REASONS {
            self.scrape_errors.with_label_values(&[ns, service, reason]);
        }
    }

    /// Sets the autoscaling bounds of `service`.
    pub fn record_bounds(&self, ns: &str, service: &str, min: i32, max: i32) {
        self.min_replicas
            .with_label_values(&[ns, service])
            .set(i64::from(min));
        self.max_replicas
            .with_label_values(&[ns, service])
            .set(i64::from(max));
    }

    /// Sets the condition series of `service` from its status conditions.
    pub fn record_conditions(
        &self,
        ns: &str,
        service: &str,
        conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    ) {
        for c in conditions {
            let is_true = c.status == "True";
            self.condition
                .with_label_values(&[ns, service, &c.type_, "True"])
                .set(i64::from(is_true));
            self.condition
                .with_label_values(&[ns, service, &c.type_, "False"])
                .set(i64::from(!is_true));
        }
    }

    /// `GET /metrics`: the exposition with the Prometheus text content type.
    pub fn http_response(&self) -> axum::response::Response {
        use axum::response::IntoResponse;
        (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            self.render(),
        )
            .into_response()
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encodes");
        String::from_utf8(buf).expect("UTF-8")
    }
}
