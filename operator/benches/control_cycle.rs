//! One control cycle (scrape + parse + aggregate + decide) over 1,000 loopback targets
//! serving a canned ballast exposition (2 DP ranks, captured from a real engine under load).
//!
//! `cargo bench -p ballast-operator --bench control_cycle` (goal: ≤ 1 s on 2 cores).

use std::time::{Duration, Instant};

use ballast_operator::decide::{DecideInput, History, decide};
use ballast_operator::scrape::{ScrapeConfig, Scraper, Target, Tracker};
use ballast_operator::signals::Dialect;

const TARGETS: usize = 1000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let exposition: &'static str = include_str!("../tests/fixtures/ballast_dp2_loaded.prom");
    let mut targets = Vec::with_capacity(TARGETS);
    for i in 0..TARGETS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || async move { exposition }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        targets.push(Target::new(
            format!("replica-{i}"),
            format!("http://{addr}"),
        ));
    }
    let spec: ballast_crds::InferenceServiceSpec =
        serde_json::from_value(serde_json::json!({"model": {"source": "synthetic:tiny"}, "autoscaling": {"maxReplicas": 2000}})).unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scraper = Scraper::new(ScrapeConfig {
        concurrency: 256,
        timeout: Duration::from_secs(5),
        ..ScrapeConfig::default()
    });
    let mut tracker = Tracker::new();
    let history = History::default();
    let epoch = Instant::now();
    let mut cycles = Vec::new();
    for cycle in 0..6 {
        let t0 = Instant::now();
        let outcomes = scraper.scrape(Dialect::Ballast, &targets).await;
        let scraped = t0.elapsed();
        let fleet = tracker.observe_outcomes(Instant::now(), &outcomes, 0);
        let reporting = fleet.reporting();
        let outcome = decide(
            &DecideInput::new(&spec, TARGETS as i32, fleet),
            &history,
            epoch.elapsed(),
        );
        let total = t0.elapsed();
        let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
        println!(
            "cycle {cycle}: {:.1} ms (scrape+parse {:.1} ms), {reporting} reporting, {failed} failed, decision {:?} {}",
            total.as_secs_f64() * 1e3,
            scraped.as_secs_f64() * 1e3,
            outcome.action,
            outcome.reason.as_str()
        );
        // The first cycle opens 1,000 connections; later ones reuse them.
        if cycle > 0 {
            cycles.push(total);
        }
    }
    cycles.sort();
    println!(
        "control cycle over {TARGETS} targets: median {:.1} ms, worst {:.1} ms (goal ≤ 1000 ms)",
        cycles[cycles.len() / 2].as_secs_f64() * 1e3,
        cycles.last().unwrap().as_secs_f64() * 1e3
    );
}
