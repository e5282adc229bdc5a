//! Runs a model file's forward pass on token ids and prints the top logits and greedy
//! continuation: a check of the loader and kernels that needs no tokenizer.
//!
//! `cargo run --release -p ballast-engine --example model_step -- MODEL [ID ...] [--gen N]`

use std::sync::Arc;
use std::time::Instant;

use ballast_engine::compute::backend::cpu::CpuBackend;
use ballast_engine::compute::model::{
    LlamaModel, LlamaWeights, ModelSource, ResolvedModel, Sequence,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let model_arg = args
        .next()
        .expect("usage: model_step MODEL [ID ...] [--gen N]");
    let mut ids = Vec::new();
    let mut gen_n = 16usize;
    while let Some(a) = args.next() {
        if a == "--gen" {
            gen_n = args.next().and_then(|v| v.parse().ok()).expect("--gen N");
        } else {
            ids.push(a.parse::<u32>().expect("token ids are integers"));
        }
    }
    let resolved = ResolvedModel::resolve(&model_arg).unwrap_or_else(|e| panic!("{e}"));
    let ModelSource::Gguf { file, tensors, .. } = resolved.source else {
        panic!("model_step reads model files")
    };
    let vocab = file.tokenizer_metadata().unwrap().tokens.to_vec();
    let spec = resolved.spec;
    let weights = Arc::new(LlamaWeights::upload(&CpuBackend, &spec, (*tensors).clone()));
    let model = LlamaModel::new(spec.clone(), CpuBackend, weights);
    let mut seq = Sequence::new(&model, 64 * 16, 16);
    let t = Instant::now();
    let logits = seq.feed(&model, &ids).data;
    let prefill = t.elapsed();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    for &i in &order[..5] {
        println!("top {i:6} {:10.4} {:?}", logits[i], vocab[i]);
    }
    let mut next = order[0] as u32;
    let mut out = vec![next];
    let t = Instant::now();
    for _ in 0..gen_n.saturating_sub(1) {
        let l = seq.feed(&model, &[next]).data;
        next = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
        out.push(next);
    }
    let decode = t.elapsed();
    let text: String = out
        .iter()
        .map(|&i| vocab[i as usize].replace('Ġ', " ").replace('Ċ', "\n"))
        .collect();
    println!("greedy ids: {out:?}");
    println!("greedy text: {text:?}");
    println!(
        "prefill {} tokens in {:.1} ms ({:.0} tok/s); decode {} tokens at {:.1} tok/s",
        ids.len(),
        prefill.as_secs_f64() * 1e3,
        ids.len() as f64 / prefill.as_secs_f64(),
        gen_n - 1,
        (gen_n - 1) as f64 / decode.as_secs_f64()
    );
}
