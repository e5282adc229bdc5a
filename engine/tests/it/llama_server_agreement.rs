//! SmolLM2-135M through Ballast's CPU forward pass against llama.cpp's own server on the same
//! files: the shipped Q4_1 file and the Q4_K_M and Q6_K files `llama-quantize` makes of it
//! (`tests/fixtures/smollm2_*_goldens.json`, made by `scripts/reference/llama_server_goldens.py`;
//! provenance and server flags inside), on every CPU kernel path this machine can run.
//!
//! Teacher-forced: the prompt and llama.cpp's greedy continuation go through Ballast in one
//! step, and at every position Ballast's top-1 is compared with llama.cpp's token. A
//! position whose top-2 margin in llama.cpp's own logits is below [`MARGIN_EPSILON`] is a
//! near-tie that any rounding difference may resolve either way: it is counted apart. Every
//! other position is decisive; the goal is that all of them agree, and the test holds each
//! file and kernel path to the count measured (see [`FLOORS`]). Ballast's log-probabilities
//! of llama.cpp's 16 likeliest tokens must also stay within [`LOGPROB_TOLERANCE`].
//!
//! Kernel paths: the test runs itself once per `BALLAST_CPU_KERNEL` value this CPU runs (the
//! AVX-512 panels, the same kernel on emulated operations, the reference loop over panels,
//! AVX-VNNI, AVX2, and portable row kernels), since a process picks its kernel once.
//!
//! Needs the files: Q4_1 from `scripts/fetch-model.sh` (required when `BALLAST_REQUIRE_MODEL`
//! is set), the others from `scripts/quantize-model.sh Q4_K_M Q6_K` (required when
//! `BALLAST_REQUIRE_KQUANT_MODEL` is set); a file that is absent is skipped otherwise.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use ballast_engine::compute::backend::KvDtype;
use ballast_engine::compute::backend::cpu::CpuBackend;
use ballast_engine::compute::backend::quant::{CpuKernel, cpu_kernel, int8_kernel_name};
use ballast_engine::compute::model::{
    LlamaModel, LlamaWeights, ModelSource, ResolvedModel, model_cache_dir,
};
use serde_json::{Value, json};

use crate::common::{argmax, teacher_forced};

/// Top-2 margins (nats, in llama.cpp's log-softmax) below which a position is a near-tie.
const MARGIN_EPSILON: f32 = 0.1;

/// Largest difference between Ballast's and llama.cpp's log-probability of one of
/// llama.cpp's 16 likeliest tokens at the first generated position (the prompt's last row),
/// where both have read exactly the same tokens. Both read the same quantized weights and
/// keep an f16 KV cache; they round activations differently (llama.cpp quantizes them to 8
/// bits per 256-element super-block for k-quants and per 32 with f16 scales for Q4_1,
/// Ballast per 32-element block with f32 scales) and sum in other orders.
const FIRST_LOGPROB_TOLERANCE: f32 = 0.75;

/// The same at any position of the continuation, where differences compound through the
/// KV cache.
const LOGPROB_TOLERANCE: f32 = 2.0;

/// The files: quantization, file name, goldens.
const FILES: [(&str, &str, &str); 3] = [
    (
        "Q4_1",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        include_str!("../fixtures/smollm2_q4_1_goldens.json"),
    ),
    (
        "Q4_K_M",
        "SmolLM2-135M-Instruct.Q4_K_M.from-Q4_1.gguf",
        include_str!("../fixtures/smollm2_q4_k_m_goldens.json"),
    ),
    (
        "Q6_K",
        "SmolLM2-135M-Instruct.Q6_K.from-Q4_1.gguf",
        include_str!("../fixtures/smollm2_q6_k_goldens.json"),
    ),
];

/// Decisive positions that must agree, per file and kernel path: the counts measured on
/// 2026-12-06 with the tiled prefill attention (docs/models.md has the table and what the
/// misses are). The kernels are deterministic (threads split output columns, never a sum), so
/// another CPU running the same path gets the same count; a kernel change that loses a
/// position fails here. A change of rounding anywhere in the forward pass moves the panel
/// paths' counts (their activations are rounded to 8 bits) by a few positions either way, as
/// the attention change did: such a change measures them again and says so in docs/models.md.
/// AVX-VNNI was not measured (no such CPU here); its integer sums are exact, like AVX2's, and
/// its f32 steps AVX2's, so it is held to AVX2's counts.
const FLOORS: [(&str, CpuKernel, usize); 18] = [
    ("Q4_1", CpuKernel::Avx512Panels, 225),
    ("Q4_1", CpuKernel::EmulatedPanels, 225),
    ("Q4_1", CpuKernel::PortablePanels, 225),
    ("Q4_1", CpuKernel::AvxVnni, 225),
    ("Q4_1", CpuKernel::Avx2, 225),
    ("Q4_1", CpuKernel::Portable, 225),
    ("Q4_K_M", CpuKernel::Avx512Panels, 220),
    ("Q4_K_M", CpuKernel::EmulatedPanels, 222),
    ("Q4_K_M", CpuKernel::PortablePanels, 223),
    ("Q4_K_M", CpuKernel::AvxVnni, 223),
    ("Q4_K_M", CpuKernel::Avx2, 223),
    ("Q4_K_M", CpuKernel::Portable, 223),
    ("Q6_K", CpuKernel::Avx512Panels, 230),
    ("Q6_K", CpuKernel::EmulatedPanels, 231),
    ("Q6_K", CpuKernel::PortablePanels, 231),
    ("Q6_K", CpuKernel::AvxVnni, 230),
    ("Q6_K", CpuKernel::Avx2, 230),
    ("Q6_K", CpuKernel::Portable, 230),
];

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn cached_file(quant: &str, file: &str) -> Option<PathBuf> {
    let path = model_cache_dir().join(file);
    if path.is_file() {
        return Some(path);
    }
    let (var, how) = if quant == "Q4_1" {
        ("BALLAST_REQUIRE_MODEL", "scripts/fetch-model.sh")
    } else {
        ("BALLAST_REQUIRE_KQUANT_MODEL", "scripts/quantize-model.sh")
    };
    assert!(
        std::env::var_os(var).is_none(),
        "{var} is set but {} is missing ({how})",
        path.display()
    );
    eprintln!("skipped: {} is not cached ({how})", path.display());
    None
}

fn sha256(path: &std::path::Path) -> String {
    // coreutils' sha256sum: the digest the generator recorded.
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn model(path: &std::path::Path) -> LlamaModel<CpuBackend> {
    let mut resolved = ResolvedModel::resolve(path.to_str().unwrap()).expect("the file loads");
    resolved.spec.kv_dtype = KvDtype::F16;
    let ModelSource::Gguf { tensors, .. } = resolved.source else {
        panic!("a .gguf path resolves to a GGUF source")
    };
    let weights = Arc::new(LlamaWeights::upload(
        &CpuBackend,
        &resolved.spec,
        (*tensors).clone(),
    ));
    LlamaModel::new(resolved.spec, CpuBackend, weights)
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    row.iter().map(|&x| x - lse).collect()
}

/// One file's teacher-forced comparison on this process's kernel path.
fn agreement(path: &std::path::Path, f: &Value) -> Value {
    assert_eq!(
        f["model_sha256"].as_str().unwrap(),
        sha256(path),
        "{} is not the file the goldens were made from",
        path.display()
    );
    let model = model(path);
    let vocab = model.spec.vocab_size;
    let (mut agree, mut decisive, mut ties, mut tie_agree) = (0, 0, 0, 0);
    let mut worst = (0.0f32, String::new());
    let mut first_worst = 0.0f32;
    let mut misses = Vec::new();
    for (c, case) in f["cases"].as_array().unwrap().iter().enumerate() {
        let prompt = u32s(&case["prompt_ids"]);
        let steps = case["steps"].as_array().unwrap();
        let cont: Vec<u32> = steps
            .iter()
            .map(|s| s["id"].as_u64().unwrap() as u32)
            .collect();
        let logits = teacher_forced(&model, &prompt, &cont);
        for (p, (row, s)) in logits.chunks(vocab).zip(steps).enumerate() {
            let top = u32s(&s["top_ids"]);
            let lp: Vec<f32> = s["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let ours = log_softmax(row);
            for (&t, &want) in top.iter().zip(&lp) {
                let d = (ours[t as usize] - want).abs();
                if p == 0 {
                    first_worst = first_worst.max(d);
                }
                if d > worst.0 {
                    worst = (d, format!("case {c} position {p} token {t}"));
                }
            }
            let margin = lp[0] - lp[1];
            let mine = argmax(row);
            let same = mine == top[0];
            if margin < MARGIN_EPSILON {
                ties += 1;
                tie_agree += usize::from(same);
            } else {
                decisive += 1;
                agree += usize::from(same);
                if !same {
                    // Ballast's own margin between its choice and llama.cpp's token.
                    let ours_gap = ours[mine as usize] - ours[top[0] as usize];
                    misses.push(format!(
                        "case {c} position {p}: llama.cpp {} by {margin:.3}, Ballast {mine} by {ours_gap:.3}",
                        top[0]
                    ));
                }
            }
        }
    }
    json!({
        "agree": agree, "decisive": decisive, "ties": ties, "tie_agree": tie_agree,
        "worst": worst.0, "worst_at": worst.1, "first_worst": first_worst, "misses": misses,
    })
}

#[test]
fn the_fixtures_name_their_files_and_generator() {
    for (_, file, text) in FILES {
        let f = fixture(text);
        assert_eq!(f["model"], file);
        assert!(f["generator"].as_str().unwrap().contains("llama-server"));
        assert_eq!(f["cases"].as_array().unwrap().len(), 5);
        for case in f["cases"].as_array().unwrap() {
            let steps = case["steps"].as_array().unwrap();
            assert_eq!(steps.len(), 48);
            for s in steps {
                // Greedy: llama.cpp's token is its own likeliest.
                assert_eq!(s["id"], s["top_ids"][0], "{s}");
            }
        }
    }
}

/// Set in the child processes the test starts, one per kernel path.
const CHILD: &str = "BALLAST_AGREEMENT_CHILD";

#[test]
fn teacher_forced_tokens_agree_with_llama_server_on_every_kernel_path() {
    if std::env::var_os(CHILD).is_some() {
        // A child: this process's kernel path, every cached file, one JSON line.
        let mut out = BTreeMap::new();
        for (quant, file, text) in FILES {
            if let Some(path) = cached_file(quant, file) {
                out.insert(quant, agreement(&path, &fixture(text)));
            }
        }
        println!(
            "AGREEMENT {}",
            json!({"kernel": cpu_kernel().name(), "name": int8_kernel_name(), "files": out})
        );
        return;
    }
    let name = format!(
        "{}::teacher_forced_tokens_agree_with_llama_server_on_every_kernel_path",
        module_path!().split_once("::").map_or("", |(_, m)| m)
    );
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for kernel in CpuKernel::ALL.into_iter().filter(|k| k.runs_here()) {
        let t0 = std::time::Instant::now();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([&name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("BALLAST_CPU_KERNEL", kernel.name())
            .env_remove("BALLAST_NO_AVX512")
            .env_remove("BALLAST_NO_VNNI")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {stdout}\n{}",
            kernel.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("AGREEMENT ").map(|(_, r)| r))
            .unwrap_or_else(|| panic!("{}: no result in {stdout}", kernel.name()));
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            v["kernel"],
            kernel.name(),
            "the child ran another kernel: {v}"
        );
        for (quant, r) in v["files"].as_object().unwrap() {
            let (agree, decisive) = (
                r["agree"].as_u64().unwrap(),
                r["decisive"].as_u64().unwrap(),
            );
            let (worst, first) = (
                r["worst"].as_f64().unwrap(),
                r["first_worst"].as_f64().unwrap(),
            );
            table.push(format!(
                "{quant} {:>16} ({}): {agree}/{decisive} decisive, {}/{} near-ties, \
                 log-probabilities within {worst:.3} ({first:.3} first), {:.0} s\n    {}",
                kernel.name(),
                v["name"].as_str().unwrap(),
                r["tie_agree"],
                r["ties"],
                t0.elapsed().as_secs_f64(),
                r["misses"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m.as_str().unwrap())
                    .collect::<Vec<_>>()
                    .join("\n    ")
            ));
            assert!(
                decisive >= 200,
                "{quant}: only {decisive} decisive positions"
            );
            let floor = FLOORS
                .iter()
                .find(|(q, k, _)| q == quant && *k == kernel)
                .map_or(decisive as usize, |f| f.2);
            if (agree as usize) < floor {
                failures.push(format!(
                    "{quant} on {}: {agree} of {decisive} decisive positions agree, {floor} did",
                    kernel.name()
                ));
            }
            if first > f64::from(FIRST_LOGPROB_TOLERANCE) || worst > f64::from(LOGPROB_TOLERANCE) {
                failures.push(format!(
                    "{quant} on {}: log-probabilities {worst:.3} apart ({first:.3} first), at {}",
                    kernel.name(),
                    r["worst_at"]
                ));
            }
        }
    }
    eprintln!(
        "teacher-forced agreement with llama-server:\n{}",
        table.join("\n")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
