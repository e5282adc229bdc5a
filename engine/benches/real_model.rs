//! Single-stream prefill and decode speed of the default real model (SmolLM2-135M, Q4_1
//! GGUF) on the CPU backend, with the decode rate as a fraction of the memory-bandwidth
//! roofline measured in the same run. `scripts/bench-anchor.sh` and
//! `scripts/bench-serving-path.sh` run it beside the served engine, so the cost of the
//! serving path shows in the same run.
//!
//! `cargo bench -p ballast-engine --bench real_model [-- PROMPT_TOKENS DECODE_TOKENS]`

use std::sync::Arc;
use std::time::Instant;

use ballast_engine::compute::backend::KvDtype;
use ballast_engine::compute::backend::cpu::CpuBackend;
use ballast_engine::compute::model::{
    KNOWN_MODELS, LlamaModel, LlamaWeights, ModelSource, ResolvedModel, Sequence, model_cache_dir,
};
use rayon::prelude::*;

/// Read bandwidth of all threads summing a 512 MiB buffer, best of three (bytes/s).
fn read_bandwidth() -> f64 {
    let buf: Vec<u64> = (0..64u64 << 20).collect();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(s);
        best = best.max((buf.len() * 8) as f64 / t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (prompt_len, decode_len) = (
        args.first().copied().unwrap_or(128),
        args.get(1).copied().unwrap_or(128),
    );
    let path = model_cache_dir().join(KNOWN_MODELS[0].file);
    if !path.is_file() {
        eprintln!(
            "{} is not cached; run scripts/fetch-model.sh",
            path.display()
        );
        std::process::exit(2);
    }
    let resolved = ResolvedModel::resolve(KNOWN_MODELS[0].name).expect("model loads");
    let ModelSource::Gguf { file, tensors, .. } = resolved.source else {
        unreachable!()
    };
    // Bytes a decode step must read: every matrix (the tied head once), norms aside.
    let weight_bytes: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.dims.len() == 2)
        .map(|t| t.n_bytes)
        .sum();
    let mut spec = resolved.spec;
    // The engine's `--kv-cache-dtype auto` for a GGUF file on the CPU, unless
    // BALLAST_KV_CACHE_DTYPE=f32 asks for the exact cache.
    spec.kv_dtype = match std::env::var("BALLAST_KV_CACHE_DTYPE").as_deref() {
        Ok("f32") => KvDtype::F32,
        _ => KvDtype::F16,
    };
    let weights = Arc::new(LlamaWeights::upload(&CpuBackend, &spec, (*tensors).clone()));
    let model = LlamaModel::new(spec, CpuBackend, weights);
    let bandwidth = read_bandwidth();
    // A fixed token pattern (ids of ordinary words) so runs are comparable.
    let prompt: Vec<u32> = (0..prompt_len as u32)
        .map(|i| 1000 + (i * 7919) % 30000)
        .collect();
    let blocks = (prompt_len + decode_len).div_ceil(16) + 1;
    // Warm the map and the caches once.
    Sequence::new(&model, blocks * 16, 16).feed(&model, &prompt[..16.min(prompt_len)]);

    let mut seq = Sequence::new(&model, blocks * 16, 16);
    let t = Instant::now();
    let logits = seq.feed(&model, &prompt).data;
    let prefill = t.elapsed().as_secs_f64();
    let mut next = (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap() as u32;
    let t = Instant::now();
    for _ in 0..decode_len {
        let l = seq.feed(&model, &[next]).data;
        next = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
    }
    let decode = t.elapsed().as_secs_f64();
    let decode_rate = decode_len as f64 / decode;
    let roofline = bandwidth / weight_bytes as f64;
    println!("threads            {}", rayon::current_num_threads());
    println!(
        "int8 kernel        {}",
        ballast_engine::compute::backend::quant::int8_kernel_name()
    );
    println!("kv cache           {}", model.spec.kv_dtype.name());
    println!("weights per step   {:.1} MB", weight_bytes as f64 / 1e6);
    println!("read bandwidth     {:.1} GB/s", bandwidth / 1e9);
    println!("roofline           {roofline:.0} tok/s");
    println!(
        "prefill            {:.1} tok/s ({prompt_len} tokens)",
        prompt_len as f64 / prefill
    );
    println!("decode             {decode_rate:.1} tok/s ({decode_len} tokens)");
    println!("decode / roofline  {:.1} %", 100.0 * decode_rate / roofline);
}
