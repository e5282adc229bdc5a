//! What prometheus_client renders for vLLM's V1 metrics: every family of
//! `vllm/v1/metrics/loggers.py` (gauges, counters with their `_created` samples,
//! histograms with vLLM's default buckets) for `engines` engine cores and `models` served
//! models. Deterministic, so every run reads the same bytes. Shared by the benches.

use std::fmt::Write;

use ballast_rng::SplitMix64;

/// prometheus_client's float rendering (Go-like: exponent from 1e7 up, `.0` on integers).
fn go(v: f64) -> String {
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    let s = format!("{v:?}");
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let digits = format!("{}{}", &s[1..dot], &s[dot + 1..]);
            let mantissa = format!("{}.{}", &s[..1], digits);
            let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => s,
    }
}

const LATENCY: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
const TTFT: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const ITERATION: [f64; 13] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// build_1_2_5_buckets(max_model_len = 131072).
const TOKENS: [f64; 16] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0, 100000.0,
];
const N: [f64; 5] = [1.0, 2.0, 5.0, 10.0, 20.0];

/// The exposition of `engines` DP ranks serving `models` models.
pub fn exposition(engines: usize, models: usize) -> String {
    let gauges = [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
        ),
    ];
    let counters = [
        (
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ),
        (
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
        ),
        (
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
        ),
        ("vllm:prompt_tokens", "Number of prefill tokens processed."),
        (
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
        ),
    ];
    let histograms: [(&str, &str, &[f64]); 14] = [
        (
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &TOKENS,
        ),
        (
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            &TOKENS,
        ),
        (
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            &ITERATION,
        ),
        (
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            &TOKENS,
        ),
        (
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            &N,
        ),
        (
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            &TOKENS,
        ),
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &TTFT,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &ITL,
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            &ITL,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &LATENCY,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &LATENCY,
        ),
        (
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            &LATENCY,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &LATENCY,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &LATENCY,
        ),
    ];
    let models: Vec<String> = (0..models)
        .map(|m| format!("org-{m}/Llama-3.1-8B-Instruct-ft{m}"))
        .collect();
    let labels = |m: &str, e: usize| format!("engine=\"{e}\",model_name=\"{m}\"");
    let created = 1_795_951_203.618_451_6;
    // Deterministic, so every run parses the same bytes.
    let mut rng = SplitMix64::new(42);
    let mut t = String::new();
    let w = &mut t;

    for (name, help) in gauges {
        let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} gauge");
        for m in &models {
            for e in 0..engines {
                let v = if name.ends_with("perc") {
                    rng.below(10_000) as f64 / 10_000.0
                } else {
                    rng.below(64) as f64
                };
                let _ = writeln!(w, "{name}{{{}}} {}", labels(m, e), go(v));
            }
        }
    }
    let _ = writeln!(
        w,
        "# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.\n\
         # TYPE vllm:num_requests_waiting_by_reason gauge"
    );
    for m in &models {
        for e in 0..engines {
            for reason in ["capacity", "deferred"] {
                let v = rng.below(8) as f64;
                let _ = writeln!(
                    w,
                    "vllm:num_requests_waiting_by_reason{{{},reason=\"{reason}\"}} {}",
                    labels(m, e),
                    go(v)
                );
            }
        }
    }
    for (name, help) in counters {
        let _ = writeln!(w, "# HELP {name}_total {help}\n# TYPE {name}_total counter");
        for m in &models {
            for e in 0..engines {
                let v = rng.below(50_000_000) as f64;
                let _ = writeln!(w, "{name}_total{{{}}} {}", labels(m, e), go(v));
                let _ = writeln!(w, "{name}_created{{{}}} {}", labels(m, e), go(created));
            }
        }
    }
    let _ = writeln!(
        w,
        "# HELP vllm:request_success_total Count of successfully processed requests.\n\
         # TYPE vllm:request_success_total counter"
    );
    for m in &models {
        for e in 0..engines {
            for reason in ["stop", "length", "abort", "error"] {
                let l = format!("{},finished_reason=\"{reason}\"", labels(m, e));
                let v = rng.below(100_000) as f64;
                let _ = writeln!(w, "vllm:request_success_total{{{l}}} {}", go(v));
                let _ = writeln!(w, "vllm:request_success_created{{{l}}} {}", go(created));
            }
        }
    }
    for (name, help, bounds) in histograms {
        let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} histogram");
        for m in &models {
            for e in 0..engines {
                let mut cum = 0.0;
                for b in bounds.iter().copied().chain([f64::INFINITY]) {
                    cum += rng.below(5_000) as f64;
                    let _ = writeln!(
                        w,
                        "{name}_bucket{{engine=\"{e}\",le=\"{}\",model_name=\"{m}\"}} {}",
                        go(b),
                        go(cum)
                    );
                }
                let sum = cum * (rng.below(1_000_000) as f64 / 1e4);
                let _ = writeln!(w, "{name}_count{{{}}} {}", labels(m, e), go(cum));
                let _ = writeln!(w, "{name}_sum{{{}}} {}", labels(m, e), go(sum));
                let _ = writeln!(w, "{name}_created{{{}}} {}", labels(m, e), go(created));
            }
        }
    }
    let _ = writeln!(
        w,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge"
    );
    for m in &models {
        for e in 0..engines {
            let _ = writeln!(
                w,
                "vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"{e}\",gpu_memory_utilization=\"0.9\",model_name=\"{m}\",num_cpu_blocks=\"None\",num_gpu_blocks=\"27342\"}} 1.0"
            );
        }
    }
    t
}
