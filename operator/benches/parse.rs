//! Parser throughput on a large vLLM-format exposition.
//!
//! Builds what prometheus_client renders for vLLM's V1 metrics — every family of
//! `vllm/v1/metrics/loggers.py` (gauges, counters with their `_created` samples,
//! histograms with vLLM's default buckets) for 8 engine cores — repeated for 10 served
//! models, as a gateway federating several vLLM servers would expose it (several MB).
//! It is written to `target/vllm-large.prom` so `scripts/bench-parse.sh` can time Python's
//! prometheus_client parser on the same bytes.
//!
//! `cargo bench -p ballast-operator --bench parse`

use std::time::{Duration, Instant};

use ballast_operator::scrape::dialect::{adapt, reads};
use ballast_operator::scrape::parser::{Limits, parse, parse_selected};
use ballast_operator::signals::Dialect;

const ENGINES: usize = 8;
const MODELS: usize = 10;
const REPS: usize = 40;

#[path = "common/vllm.rs"]
mod vllm;

fn main() {
    let text = vllm::exposition(ENGINES, MODELS);
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/vllm-large.prom");
    std::fs::write(&out, &text).expect("write exposition");
    let parsed = parse(&text);
    assert_eq!(parsed.errors(), 0, "the benchmark input must be valid");
    println!(
        "vLLM-format exposition: {ENGINES} engines x {MODELS} models, {} samples, {:.2} MB, written to {}",
        parsed.samples.len(),
        text.len() as f64 / 1e6,
        out.display()
    );

    // What a scrape does: parse only the families the vLLM adapter reads. The two parses
    // alternate, so that both see the same machine when it is busy.
    let keep = |name: &str| reads(Dialect::Vllm, name);
    let mut times: Vec<Duration> = Vec::with_capacity(REPS);
    let mut selective: Vec<Duration> = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let start = Instant::now();
        std::hint::black_box(parse(std::hint::black_box(&text)));
        times.push(start.elapsed());
        let start = Instant::now();
        std::hint::black_box(parse_selected(
            std::hint::black_box(text.as_bytes()),
            &Limits::default(),
            &keep,
        ));
        selective.push(start.elapsed());
    }
    times.sort();
    let median = times[REPS / 2];
    println!(
        "ballast parser (Rust): {:.1} MB/s (median of {REPS} parses, {:.2} ms each)",
        text.len() as f64 / 1e6 / median.as_secs_f64(),
        median.as_secs_f64() * 1e3
    );
    selective.sort();
    let selective_median = selective[REPS / 2];
    let selected = parse_selected(text.as_bytes(), &Limits::default(), &keep);
    assert_eq!(
        adapt(Dialect::Vllm, &selected),
        adapt(Dialect::Vllm, &parsed)
    );
    println!(
        "selective parse (vLLM adapter's families, {} of {} samples): {:.1} MB/s ({:.2} ms), {:.1}x the full parse",
        selected.samples.len(),
        parsed.samples.len(),
        text.len() as f64 / 1e6 / selective_median.as_secs_f64(),
        selective_median.as_secs_f64() * 1e3,
        median.as_secs_f64() / selective_median.as_secs_f64()
    );

    let start = Instant::now();
    let sample = adapt(Dialect::Vllm, &parsed);
    println!(
        "vllm dialect adapter: {:.2} ms (running {:?}, kv {:?})",
        start.elapsed().as_secs_f64() * 1e3,
        sample.running,
        sample.kv_usage
    );
}
