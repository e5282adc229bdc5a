//! Signals the replicas do not export versus signals that are missing, end to end: vLLM
//! expositions through the parser, the dialect adapter, the tracker and the decision core,
//! with the spec of `examples/vllm-fleet.yaml` (whose rejection target is defaulted).
//!
//! A family absent from every successful scrape is not exported by these replicas: its
//! target is ignored. A family that is exported but has no value (failed scrapes, no rate
//! yet) is missing: scale-up may proceed, scale-down may not.

use std::time::{Duration, Instant};

use ballast_crds::{Action, InferenceServiceSpec};
use ballast_operator::decide::{
    DecideInput, History, Outcome, Reason, SignalName, SignalState, decide,
};
use ballast_operator::scrape::Tracker;
use ballast_operator::scrape::dialect::adapt;
use ballast_operator::scrape::parser::parse;
use ballast_operator::signals::{Dialect, ReplicaSample};

const PERIOD: Duration = Duration::from_secs(15);

/// The first resource of `examples/vllm-fleet.yaml`: minReplicas 2, targets capacity 8,
/// KV 0.9, TTFT 2 s and, by default, 0.05 rejections/s per replica.
fn vllm_fleet_spec() -> InferenceServiceSpec {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/vllm-fleet.yaml");
    let docs = ballast_crds::parse_yaml(&std::fs::read_to_string(path).unwrap()).unwrap();
    let spec = docs[0].spec.clone();
    assert_eq!(
        spec.autoscaling.targets.admission_rejections_per_second,
        Some(0.05)
    );
    spec
}

/// How a replica's exposition carries the 429 counter.
#[derive(Clone, Copy)]
enum Counter {
    /// Not at all: a vLLM that predates `vllm:admission_rejections_total`.
    Absent,
    /// Declared (`# TYPE`) with no series: nothing rejected yet.
    Declared,
    /// One series with this lifetime count.
    Count(f64),
}

/// A light load in vLLM's format: one request running, none waiting, 10 % KV, and
/// `served` requests so far, all with a first token under 0.1 s.
fn vllm(served: f64, rejections: Counter) -> ReplicaSample {
    let mut text = format!(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"m\"}} 1.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"m\"}} 0.0\n\
         # TYPE vllm:gpu_cache_usage_perc gauge\n\
         vllm:gpu_cache_usage_perc{{model_name=\"m\"}} 0.1\n\
         # TYPE vllm:time_to_first_token_seconds histogram\n\
         vllm:time_to_first_token_seconds_bucket{{le=\"0.1\",model_name=\"m\"}} {served}\n\
         vllm:time_to_first_token_seconds_bucket{{le=\"1.0\",model_name=\"m\"}} {served}\n\
         vllm:time_to_first_token_seconds_bucket{{le=\"+Inf\",model_name=\"m\"}} {served}\n"
    );
    match rejections {
        Counter::Absent => {}
        Counter::Declared => text += "# TYPE vllm:admission_rejections_total counter\n",
        Counter::Count(n) => {
            text += &format!(
                "# TYPE vllm:admission_rejections_total counter\n\
                 vllm:admission_rejections_total{{engine=\"0\",model_name=\"m\",reason=\"max_num_queued_reqs\"}} {n}\n"
            )
        }
    }
    let exposition = parse(&text);
    assert_eq!(exposition.errors(), 0, "{text}");
    adapt(Dialect::Vllm, &exposition)
}

/// A runtime in miniature: scrape results in, decisions out, every 15 s.
struct Loop {
    spec: InferenceServiceSpec,
    tracker: Tracker,
    history: History,
    t0: Instant,
    now: Duration,
    current: i32,
}

impl Loop {
    fn new(spec: InferenceServiceSpec, current: i32) -> Loop {
        Loop {
            spec,
            tracker: Tracker::new(),
            history: History::default(),
            t0: Instant::now(),
            now: Duration::ZERO,
            current,
        }
    }

    /// One period: replica `i` scraped as `scrape(i)` (`None`: the scrape failed).
    fn period(&mut self, scrape: impl Fn(usize) -> Option<ReplicaSample>) -> Outcome {
        let names: Vec<String> = (0..self.current).map(|i| format!("r{i}")).collect();
        let samples: Vec<Option<ReplicaSample>> = (0..names.len()).map(&scrape).collect();
        let fleet = self.tracker.observe(
            self.t0 + self.now,
            names
                .iter()
                .map(String::as_str)
                .zip(samples.iter().map(Option::as_ref)),
            0,
        );
        let out = decide(
            &DecideInput::new(&self.spec, self.current, fleet),
            &self.history,
            self.now,
        );
        self.history.record(&out.history, true);
        self.current = out.desired_replicas;
        self.now += PERIOD;
        out
    }
}

fn rejections(out: &Outcome) -> (SignalState, String) {
    let r = out
        .reports
        .iter()
        .find(|r| r.signal == SignalName::AdmissionRejectionsPerSecond)
        .expect("the rejection target is set");
    (r.state, r.summary.clone())
}

/// Runs light-load periods until the first scale-down; returns when it came and to what.
fn until_scale_down(l: &mut Loop, counter: impl Fn(u32) -> Counter) -> (Duration, i32) {
    let mut period = 0;
    loop {
        let at = l.now;
        let served = 10.0 * f64::from(period);
        let c = counter(period);
        let out = l.period(|_| Some(vllm(served, c)));
        if out.action == Action::ScaleDown {
            return (at, out.desired_replicas);
        }
        assert_eq!(out.action, Action::Hold, "{}", out.message);
        assert!(
            at < Duration::from_secs(600),
            "never scaled down: {}",
            out.message
        );
        period += 1;
    }
}

#[test]
fn a_vllm_without_the_rejection_counter_scales_down_after_the_window() {
    let mut l = Loop::new(vllm_fleet_spec(), 4);
    let first = l.period(|_| Some(vllm(0.0, Counter::Absent)));
    let (state, summary) = rejections(&first);
    assert_eq!(state, SignalState::Unsupported);
    assert_eq!(
        summary,
        "admissionRejectionsPerSecond not exported by these replicas (target ignored)"
    );
    // The first period has no TTFT increase yet (a real miss); from the second on only
    // the scale-down window holds, and the first recommendation leaves it after 300 s.
    let (at, to) = until_scale_down(&mut l, |_| Counter::Absent);
    assert_eq!((at, to), (Duration::from_secs(300), 2));
}

#[test]
fn a_vllm_with_the_counter_gets_the_signal() {
    // Rejecting 3/s per replica against 0.05: scale up for that reason.
    let mut l = Loop::new(vllm_fleet_spec(), 2);
    let out = l.period(|_| Some(vllm(0.0, Counter::Count(100.0))));
    assert_eq!(
        rejections(&out).0,
        SignalState::Missing,
        "one sample: no rate yet"
    );
    assert_eq!(out.action, Action::Hold);
    let out = l.period(|_| Some(vllm(10.0, Counter::Count(145.0))));
    assert_eq!(rejections(&out).0, SignalState::Above);
    assert_eq!(out.reason, Reason::AdmissionRejections, "{}", out.message);
    assert_eq!((out.action, out.desired_replicas), (Action::ScaleUp, 6));

    // Declared but with no series yet (nothing rejected): a rate of 0, not missing, so
    // the signal takes part and the fleet may scale down.
    let mut l = Loop::new(vllm_fleet_spec(), 4);
    l.period(|_| Some(vllm(0.0, Counter::Declared)));
    let out = l.period(|_| Some(vllm(10.0, Counter::Declared)));
    assert_eq!(rejections(&out).0, SignalState::Below, "{}", out.message);
    let (at, to) = until_scale_down(&mut l, |_| Counter::Declared);
    assert_eq!((at, to), (Duration::from_secs(300), 2));
}

#[test]
fn failed_scrapes_of_the_replicas_with_the_counter_still_block_scale_down() {
    // A rolling upgrade: r0 and r1 run an older vLLM, r2 and r3 a newer one with the
    // counter. Once r2 and r3 stop answering, the signal is missing, not "not exported":
    // their last successful scrapes had it.
    let mut l = Loop::new(vllm_fleet_spec(), 4);
    let mixed = |served: f64, newer_answer: bool| {
        move |i: usize| match i {
            0 | 1 => Some(vllm(served, Counter::Absent)),
            _ if newer_answer => Some(vllm(served, Counter::Count(7.0))),
            _ => None,
        }
    };
    l.period(mixed(0.0, true));
    let out = l.period(mixed(10.0, true));
    assert_eq!(rejections(&out).0, SignalState::Below, "{}", out.message);
    for p in 2..40 {
        let out = l.period(mixed(10.0 * f64::from(p), false));
        assert_eq!(rejections(&out).0, SignalState::Missing, "{}", out.message);
        assert_eq!(
            (out.action, out.reason),
            (Action::Hold, Reason::SignalMissing),
            "period {p}: {}",
            out.message
        );
    }
    assert_eq!(l.current, 4);

    // No scrape succeeding at all says nothing about what is exported.
    let out = l.period(|_| None);
    assert_eq!(out.reason, Reason::MetricsUnavailable);
    assert_eq!(rejections(&out).0, SignalState::Missing);
}

#[test]
fn an_sglang_fleet_ignores_the_rejection_target() {
    // SGLang has no 429 counter; nothing in the spec or the code names the engine kind.
    let sglang = |served: f64| {
        let text = format!(
            "sglang:num_running_reqs{{dp_rank=\"0\"}} 1\n\
             sglang:num_queue_reqs{{dp_rank=\"0\"}} 0\n\
             sglang:token_usage{{dp_rank=\"0\"}} 0.1\n\
             sglang:time_to_first_token_seconds_bucket{{le=\"0.1\"}} {served}\n\
             sglang:time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {served}\n"
        );
        adapt(Dialect::Sglang, &parse(&text))
    };
    let mut l = Loop::new(vllm_fleet_spec(), 3);
    l.period(|_| Some(sglang(0.0)));
    let out = l.period(|_| Some(sglang(10.0)));
    assert_eq!(rejections(&out).0, SignalState::Unsupported);
    assert_eq!(out.reason, Reason::Stabilizing, "{}", out.message);
}
