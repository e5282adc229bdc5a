//! `ballast signals` as a user runs it: on the vLLM, SGLang and Ballast captures in the
//! repository (each compared with what the operator's own dialect adapter reads from the
//! same file), on a live engine over two scrapes, and on bad input (exit 2, a clear error).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ballast_operator::scrape::dialect::adapt;
use ballast_operator::scrape::parser::parse;
use ballast_operator::signals::Dialect;
use common::engine::{Log, spawn_engine};
use serde_json::Value;

fn signals(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ballast"))
        .arg("signals")
        .args(args)
        .env_remove("BALLAST_SIGNALS_KEY")
        .output()
        .unwrap()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../operator/tests/fixtures/{name}.prom"))
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

fn opt(v: &Value) -> Option<f64> {
    v.as_f64()
}

#[test]
fn the_captures_read_as_the_operator_reads_them() {
    let _group = crate::common::group(module_path!());
    for (name, dialect, ranks) in [
        ("vllm_v1_dp2", Dialect::Vllm, 2),
        ("vllm_v0_single", Dialect::Vllm, 1),
        ("sglang_dp4", Dialect::Sglang, 4),
        ("ballast_dp2_loaded", Dialect::Ballast, 2),
        ("ballast_dp8_loaded", Dialect::Ballast, 8),
    ] {
        let path = fixture(name);
        let r = json_of(&signals(&[path.to_str().unwrap(), "--json"]));
        let text = std::fs::read_to_string(&path).unwrap();
        let want = adapt(dialect, &parse(&text));
        assert_eq!(r["detected"], true, "{name}");
        assert_eq!(opt(&r["running"]), want.running, "{name}");
        assert_eq!(opt(&r["capacity_waiting"]), want.waiting_capacity, "{name}");
        assert_eq!(opt(&r["deferred_waiting"]), want.waiting_deferred, "{name}");
        assert_eq!(opt(&r["kv_cache_usage_max"]), want.kv_usage, "{name}");
        assert_eq!(
            opt(&r["admission_rejections_total"]),
            want.rejections_sum(),
            "{name}"
        );
        let by_rank = r["kv_cache_usage_by_rank"].as_object().unwrap();
        assert_eq!(by_rank.len(), ranks, "{name}: {by_rank:?}");
        let max = by_rank
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::MIN, f64::max);
        assert_eq!(Some(max), want.kv_usage, "{name}: the fullest rank");
        // One file is one scrape: what needs two is absent, and says so.
        let absent = r["absent"].to_string();
        assert!(absent.contains("needs two scrapes"), "{name}: {absent}");
    }
    // What a dialect lacks is named, not shown as 0.
    let sglang = json_of(&signals(&[
        fixture("sglang_dp4").to_str().unwrap(),
        "--json",
    ]));
    let absent = sglang["absent"].as_array().unwrap();
    let reason = |signal: &str| {
        absent
            .iter()
            .find(|a| a["signal"] == signal)
            .map(|a| a["why"].as_str().unwrap().to_string())
    };
    assert!(sglang["admission_rejections_total"].is_null());
    assert!(
        reason("admission_rejections")
            .unwrap()
            .contains("not exported"),
        "{absent:?}"
    );
    assert!(
        reason("deferred_waiting")
            .unwrap()
            .contains("SGLang does not tell"),
        "{absent:?}"
    );
    // llama-server: detected by its names; slots busy are running, requests waiting for a
    // slot are capacity-waiting; what it does not export is named.
    let llama = json_of(&signals(&[
        fixture("llamacpp_parallel2_loaded").to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(
        (llama["dialect"].as_str(), &llama["detected"]),
        (Some("llamacpp"), &Value::Bool(true))
    );
    assert_eq!(
        (opt(&llama["running"]), opt(&llama["capacity_waiting"])),
        (Some(2.0), Some(4.0))
    );
    let absent = llama["absent"].to_string();
    for signal in [
        "kv_cache_usage",
        "admission_rejections",
        "ttft_p99_seconds",
        "deferred_waiting",
    ] {
        assert!(absent.contains(signal), "{signal}: {absent}");
    }
    assert!(absent.contains("no tenant caps"), "{absent}");
    // The table says the same.
    let out = signals(&[fixture("vllm_v1_dp2").to_str().unwrap()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("(vllm dialect, detected)"), "{table}");
    assert!(table.contains("(by rank 0: 0.8125, 1: 0.4375)"), "{table}");
}

#[test]
fn bad_input_is_exit_2_with_the_reason() {
    let _group = crate::common::group(module_path!());
    let dir = common::local::temp_dir("signals");
    let json = dir.join("not.prom");
    std::fs::write(&json, "{\"status\": \"ok\"}\n").unwrap();
    let vllm = fixture("vllm_v1_dp2");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["/no/such/file".into()], "cannot read /no/such/file"),
        (
            vec![json.display().to_string()],
            "is not an exposition of a known engine",
        ),
        (
            vec![
                vllm.display().to_string(),
                "--dialect".into(),
                "sglang".into(),
            ],
            "carries none of the series the operator reads in the sglang dialect (it looks like vllm)",
        ),
        (
            vec![vllm.display().to_string(), "--dialect".into(), "tgi".into()],
            "invalid value 'tgi'",
        ),
        (
            vec![vllm.display().to_string(), "--interval".into(), "1".into()],
            "--interval needs a URL",
        ),
        // Port 1 on loopback: nothing listens there.
        (
            vec!["http://127.0.0.1:1".into()],
            "cannot scrape http://127.0.0.1:1/metrics",
        ),
    ];
    for (args, words) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = signals(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(words), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }

    // A partial exposition: what could be read, and how much could not.
    let partial = dir.join("partial.prom");
    let mut text = std::fs::read_to_string(&vllm).unwrap();
    text.push_str("vllm:num_requests_running{engine=\"0\" 12\nthis is not a metric line\n");
    std::fs::write(&partial, &text).unwrap();
    let out = signals(&[partial.to_str().unwrap()]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("2 lines or series could not be read; the rest is shown"),
        "{table}"
    );
    assert!(
        table.contains("running                            19"),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_live_engine_over_two_scrapes_has_rates_and_ttft() {
    let _group = crate::common::group(module_path!());
    let engine = spawn_engine(&["--model", "synthetic:tiny"], Log::Inherit);
    let base = engine.base.clone();
    // Requests whose first token comes between the two scrapes.
    let load = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..3 {
            let out = Command::new("curl")
                .args(["-s", "-m", "20", "-H", "content-type: application/json"])
                .args(["-d", r#"{"prompt":"hello","max_tokens":4}"#])
                .arg(format!("{base}/v1/completions"))
                .output()
                .unwrap();
            assert!(out.status.success());
        }
    });
    let r = json_of(&signals(&[&engine.base, "--interval", "2", "--json"]));
    load.join().unwrap();
    assert_eq!(r["dialect"], "ballast");
    assert_eq!(r["source"], format!("{}/metrics", engine.base));
    assert!(r["interval_seconds"].as_f64().unwrap() >= 2.0, "{r:#}");
    let ttft = r["ttft_p99_seconds"].as_f64();
    assert!(ttft.is_some_and(|t| t > 0.0), "{r:#}");
    assert_eq!(
        r["admission_rejections_per_second"].as_f64(),
        Some(0.0),
        "{r:#}"
    );
    assert_eq!(r["kv_cache_usage_by_rank"].as_object().unwrap().len(), 1);
    assert!(r["absent"].as_array().unwrap().is_empty(), "{r:#}");
}
