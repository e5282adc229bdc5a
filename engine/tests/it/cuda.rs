//! The CUDA backend against the CPU backend (the reference): every op on the same inputs, and
//! greedy decoding of synthetic models, token for token.
//!
//! All `#[ignore]`d: they need an NVIDIA GPU, its driver, NVRTC and cuBLAS. Run them with
//! `kernels/device-check.sh`. They have been compiled on machines without a GPU and have not
//! run yet.

use ballast_engine::compute::backend::cpu::CpuBackend;
use ballast_engine::compute::backend::cuda::CudaBackend;
use ballast_engine::compute::backend::{Backend, HostWeight, KvDtype, KvLayout, RopeStyle};
use ballast_engine::compute::executor::cuda_graphs::GraphExecutor;
use ballast_engine::compute::executor::{Executor, ModelExecutor};
use ballast_engine::compute::model::{LlamaModel, ModelSpec, WeightDtype};
use ballast_engine::compute::sampling::{SampleSpec, SamplingSlot};
use ballast_engine::step::{SeqSlice, StepMetadata};
use ballast_rng::SplitMix64;

const BLOCK: u32 = 16;

fn gpu() -> CudaBackend {
    CudaBackend::new(0).unwrap_or_else(|e| panic!("CUDA backend on GPU 0: {e}"))
}

fn random(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
    (0..n).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
}

/// Largest |a − b| / (1 + |b|).
fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

/// Appends one sequence to a step: `new` tokens on top of `context` cached ones, its KV on
/// consecutive blocks from `first_block`, sampling from its last row.
fn push_seq(meta: &mut StepMetadata, first_block: u32, new: &[u32], context: u32) {
    let query_start = meta.token_ids.len() as u32;
    for (j, &tok) in new.iter().enumerate() {
        let pos = context + j as u32;
        meta.token_ids.push(tok);
        meta.positions.push(pos);
        meta.slot_mapping
            .push((first_block + pos / BLOCK) * BLOCK + pos % BLOCK);
    }
    let blocks = (context + new.len() as u32).div_ceil(BLOCK);
    meta.seqs.push(SeqSlice {
        query_start,
        query_len: new.len() as u32,
        context_len: context,
        block_table_start: meta.block_tables.len() as u32,
        block_table_len: blocks,
    });
    meta.block_tables.extend(first_block..first_block + blocks);
    meta.logits_rows.push(query_start + new.len() as u32 - 1);
}

/// A step of `seqs` sequences, each `(context, new)` tokens, on disjoint runs of blocks;
/// every sequence samples from its last row.
fn step_meta(seqs: &[(u32, u32)], rng: &mut SplitMix64, vocab: u32) -> StepMetadata {
    let mut meta = StepMetadata {
        block_size: BLOCK,
        ..StepMetadata::default()
    };
    let mut next_block = 0u32;
    for &(context, new) in seqs {
        let tokens: Vec<u32> = (0..new)
            .map(|_| rng.below(u64::from(vocab)) as u32)
            .collect();
        push_seq(&mut meta, next_block, &tokens, context);
        next_block += (context + new).div_ceil(BLOCK);
    }
    meta
}

/// Runs the same ops on both backends and compares each result. Every op gets identical
/// inputs (the CPU's result of the op before, uploaded), so a difference is that op's own.
fn compare_ops(spec: &ModelSpec, meta: &StepMetadata, dtype: WeightDtype) {
    let gpu = gpu();
    let cpu = CpuBackend;
    let mut rng = SplitMix64::new(9);
    let t = meta.num_tokens();
    let (h, q_size, kv_size) = (spec.hidden_size, spec.q_size(), spec.kv_size());
    let weight = |rows: usize, cols: usize, rng: &mut SplitMix64| {
        let w = HostWeight::F32 {
            data: random(rows * cols, rng).into(),
            rows,
            cols,
        };
        match dtype {
            WeightDtype::F32 => w,
            WeightDtype::Bf16 => w.to_bf16(),
        }
    };
    let check = |what: &str, g: Vec<f32>, c: Vec<f32>, tol: f32| {
        let d = max_rel_diff(&g, &c);
        eprintln!("{what}: max relative difference {d:.2e}");
        assert!(
            d <= tol,
            "{what}: GPU and CPU differ by {d:e} (tolerance {tol:e})"
        );
    };
    // The CPU's tensor on the GPU.
    let same = |c: &<CpuBackend as Backend>::Tensor| {
        let (rows, cols) = cpu.shape(c);
        gpu.upload(&cpu.download(c), rows, cols)
    };

    let table = weight(spec.vocab_size, h, &mut rng);
    let (gt, ct) = (gpu.upload_weight(table.clone()), cpu.upload_weight(table));
    let (gm, cm) = (gpu.prepare_step(meta), cpu.prepare_step(meta));
    let (gx, cx) = (gpu.embedding(&gt, &gm), cpu.embedding(&ct, &cm));
    check("embedding", gpu.download(&gx), cpu.download(&cx), 0.0);

    let norm = random(h, &mut rng);
    let (gn, cn) = (gpu.upload(&norm, 1, h), cpu.upload(&norm, 1, h));
    let ch = cpu.rms_norm(&cx, &cn, spec.rms_norm_eps);
    let gh = gpu.rms_norm(&same(&cx), &gn, spec.rms_norm_eps);
    check("rms_norm", gpu.download(&gh), cpu.download(&ch), 1e-5);

    let wq = weight(q_size, h, &mut rng);
    let (gwq, cwq) = (gpu.upload_weight(wq.clone()), cpu.upload_weight(wq));
    let cq = cpu.matmul(&ch, &cwq);
    let gq = gpu.matmul(&same(&ch), &gwq);
    check("matmul", gpu.download(&gq), cpu.download(&cq), 1e-4);
    let [gq2] = gpu.matmul_n(&same(&ch), [&gwq]);
    check("matmul_n", gpu.download(&gq2), cpu.download(&cq), 1e-4);

    let half = spec.head_dim / 2;
    let cos = random(spec.max_model_len * half, &mut rng);
    let sin = random(spec.max_model_len * half, &mut rng);
    let (gcos, gsin) = (
        gpu.upload(&cos, spec.max_model_len, half),
        gpu.upload(&sin, spec.max_model_len, half),
    );
    let (ccos, csin) = (
        cpu.upload(&cos, spec.max_model_len, half),
        cpu.upload(&sin, spec.max_model_len, half),
    );
    let mut cq = cq;
    for style in [RopeStyle::Halves, RopeStyle::Pairs] {
        let (mut a, mut b) = (same(&cq), cpu.upload(&cpu.download(&cq), t, q_size));
        gpu.rope(&mut a, &gcos, &gsin, &gm, spec.num_heads, style);
        cpu.rope(&mut b, &ccos, &csin, &cm, spec.num_heads, style);
        check(
            &format!("rope {style:?}"),
            gpu.download(&a),
            cpu.download(&b),
            1e-5,
        );
    }
    cpu.rope(&mut cq, &ccos, &csin, &cm, spec.num_heads, spec.rope_style);

    // A cache holding random context for every sequence, then this step's K/V.
    let blocks = meta.block_tables.iter().max().map_or(1, |b| b + 1) as usize;
    let layout = KvLayout {
        num_layers: 1,
        num_blocks: blocks,
        block_size: BLOCK as usize,
        num_kv_heads: spec.num_kv_heads,
        head_dim: spec.head_dim,
        dtype: KvDtype::F32,
    };
    let (mut gc, mut cc) = (gpu.alloc_kv_cache(layout), cpu.alloc_kv_cache(layout));
    let mut fill = StepMetadata {
        block_size: BLOCK,
        ..StepMetadata::default()
    };
    fill.slot_mapping = (0..(blocks as u32 * BLOCK)).collect();
    let slots = fill.slot_mapping.len();
    let (gf, cf) = (gpu.prepare_step(&fill), cpu.prepare_step(&fill));
    let ctx_k = random(slots * kv_size, &mut rng);
    let ctx_v = random(slots * kv_size, &mut rng);
    gpu.write_kv(
        &mut gc,
        0,
        &gpu.upload(&ctx_k, slots, kv_size),
        &gpu.upload(&ctx_v, slots, kv_size),
        &gf,
    );
    cpu.write_kv(
        &mut cc,
        0,
        &cpu.upload(&ctx_k, slots, kv_size),
        &cpu.upload(&ctx_v, slots, kv_size),
        &cf,
    );
    let k = random(t * kv_size, &mut rng);
    let v = random(t * kv_size, &mut rng);
    gpu.write_kv(
        &mut gc,
        0,
        &gpu.upload(&k, t, kv_size),
        &gpu.upload(&v, t, kv_size),
        &gm,
    );
    cpu.write_kv(
        &mut cc,
        0,
        &cpu.upload(&k, t, kv_size),
        &cpu.upload(&v, t, kv_size),
        &cm,
    );
    let ca = cpu.paged_attention(&cq, &cc, 0, &cm, spec.num_heads);
    let ga = gpu.paged_attention(&same(&cq), &gc, 0, &gm, spec.num_heads);
    let kind = if meta.seqs.iter().all(|s| s.query_len == 1) {
        "decode"
    } else {
        "prefill"
    };
    check(
        &format!("paged_attention ({kind})"),
        gpu.download(&ga),
        cpu.download(&ca),
        2e-4,
    );

    let up = random(t * h, &mut rng);
    let (gu, cu) = (gpu.upload(&up, t, h), cpu.upload(&up, t, h));
    let cs = cpu.silu_mul(&ch, &cu);
    let gs = gpu.silu_mul(&same(&ch), &gu);
    check("silu_mul", gpu.download(&gs), cpu.download(&cs), 1e-5);
    let mut cx2 = cx;
    let mut gx2 = same(&cx2);
    cpu.add_assign(&mut cx2, &cs);
    gpu.add_assign(&mut gx2, &same(&cs));
    check("add_assign", gpu.download(&gx2), cpu.download(&cx2), 0.0);

    let cl = cpu.gather_logits_rows(&cx2, &cm);
    let gl = gpu.gather_logits_rows(&same(&cx2), &gm);
    check(
        "gather_logits_rows",
        gpu.download(&gl),
        cpu.download(&cl),
        0.0,
    );

    let mut slots: Vec<SamplingSlot> = (0..meta.logits_rows.len()).map(|_| greedy_slot()).collect();
    let gt = gpu.sample(&same(&cl), &mut slots.clone());
    let ct = cpu.sample(&cl, &mut slots);
    assert_eq!(gt, ct, "argmax of the gathered rows");
}

fn greedy_slot() -> SamplingSlot {
    SamplingSlot {
        spec: SampleSpec {
            temperature: 0.0,
            ..SampleSpec::default()
        },
        rng: SplitMix64::new(1),
        suppress: None,
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn every_op_matches_the_cpu_backend() {
    let mut rng = SplitMix64::new(3);
    for (name, dtype) in [("small", WeightDtype::F32), ("small", WeightDtype::Bf16)] {
        let spec = ModelSpec::synthetic(name).unwrap();
        let vocab = spec.vocab_size as u32;
        // A mixed step (prefill chunks on top of context, and a decode), then pure decode
        // steps, one with a context long enough for the split kernel.
        let steps = [
            vec![(0, 37), (100, 20), (5, 1)],
            vec![(40, 1), (900, 1), (3, 1)],
            vec![(2500, 1)],
        ];
        for seqs in steps {
            eprintln!("{name} {dtype:?}, sequences (context, new) {seqs:?}");
            let meta = step_meta(&seqs, &mut rng, vocab);
            compare_ops(&spec, &meta, dtype);
        }
    }
}

/// Greedy continuation of every prompt for `steps` tokens, the prompts prefilled together in
/// one step and then decoded together, each on its own blocks. With `forced`, each sequence is
/// fed those tokens instead of its own picks (teacher forcing). Returns the picked tokens and
/// each step's logits (`[prompts, vocab]`).
fn greedy<B: Backend>(
    model: &LlamaModel<B>,
    prompts: &[Vec<u32>],
    steps: usize,
    forced: Option<&[Vec<u32>]>,
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let longest = prompts.iter().map(Vec::len).max().unwrap() + steps;
    let per_seq = longest.div_ceil(BLOCK as usize) as u32;
    let mut cache = model
        .backend
        .alloc_kv_cache(model.kv_layout(per_seq as usize * prompts.len(), BLOCK as usize));
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut all_logits = Vec::new();
    let mut lens: Vec<u32> = vec![0; prompts.len()];
    for step in 0..steps {
        let mut meta = StepMetadata {
            block_size: BLOCK,
            ..StepMetadata::default()
        };
        for (i, prompt) in prompts.iter().enumerate() {
            let new: Vec<u32> = match (step, forced) {
                (0, _) => prompt.clone(),
                (_, Some(f)) => vec![f[i][step - 1]],
                (_, None) => vec![*out[i].last().unwrap()],
            };
            push_seq(&mut meta, i as u32 * per_seq, &new, lens[i]);
            lens[i] += new.len() as u32;
        }
        let logits = model.forward(&mut cache, &meta);
        all_logits.push(model.backend.download(&logits));
        let mut slots: Vec<SamplingSlot> = prompts.iter().map(|_| greedy_slot()).collect();
        for (seq, tok) in model
            .backend
            .sample(&logits, &mut slots)
            .into_iter()
            .enumerate()
        {
            out[seq].push(tok);
        }
    }
    (out, all_logits)
}

fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    let mut rng = SplitMix64::new(17);
    // Five prompts, one long enough that decode attention splits its context.
    [12usize, 1, 57, 300, 700]
        .iter()
        .map(|&n| (0..n).map(|_| rng.below(u64::from(vocab)) as u32).collect())
        .collect()
}

/// f32 weights: the same tokens, free-running, 5 prompts × 32 tokens (the only differences
/// are f32 summation orders). bf16 weights: a last-bit difference before a bf16 rounding
/// moves an activation by 2⁻⁸ of itself, so free-running runs may part at a near-tie; both
/// backends are fed the CPU's tokens instead, and each step's logits must agree closely, and
/// their argmax wherever the CPU's best two are more than 0.1 apart.
#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn greedy_tokens_are_identical_on_both_backends() {
    let gpu = gpu();
    for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
        let mut spec = ModelSpec::synthetic("small").unwrap();
        spec.weight_dtype = dtype;
        let prompts = prompts(spec.vocab_size as u32);
        let cpu_model = LlamaModel::synthetic(spec.clone(), CpuBackend, 5);
        let gpu_model = LlamaModel::synthetic(spec.clone(), gpu.clone(), 5);
        let (on_cpu, cpu_logits) = greedy(&cpu_model, &prompts, 32, None);
        let (on_gpu, _) = greedy(&gpu_model, &prompts, 32, None);
        let same = on_cpu.iter().zip(&on_gpu).filter(|(a, b)| a == b).count();
        eprintln!(
            "{dtype:?}: {same} of {} prompts identical for 32 free-running tokens",
            prompts.len()
        );
        if dtype == WeightDtype::F32 {
            for (i, (c, g)) in on_cpu.iter().zip(&on_gpu).enumerate() {
                assert_eq!(c, g, "{dtype:?} prompt {i}: CPU and GPU tokens differ");
            }
            continue;
        }
        let (forced, gpu_logits) = greedy(&gpu_model, &prompts, 32, Some(&on_cpu));
        let vocab = spec.vocab_size;
        let mut worst = 0.0f32;
        for (step, (c, g)) in cpu_logits.iter().zip(&gpu_logits).enumerate() {
            for (seq, (cr, gr)) in c.chunks(vocab).zip(g.chunks(vocab)).enumerate() {
                let d = cr
                    .iter()
                    .zip(gr)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                worst = worst.max(d);
                let mut sorted = cr.to_vec();
                sorted.sort_by(|a, b| b.total_cmp(a));
                if sorted[0] - sorted[1] > 0.1 {
                    assert_eq!(
                        forced[seq][step], on_cpu[seq][step],
                        "bf16 prompt {seq} step {step}: argmax differs with a clear winner"
                    );
                }
            }
        }
        eprintln!("bf16, teacher-forced: logits within {worst:.2e}");
        assert!(
            worst <= 0.05,
            "bf16 logits differ by {worst} (tolerance 0.05)"
        );
    }
}

/// Sequences joining and leaving a batch, as a scheduler would run them: each step lists
/// `(sequence, new tokens)`; a sequence's first entry is its prompt.
struct Schedule {
    prompts: Vec<Vec<u32>>,
    steps: Vec<Vec<usize>>,
}

/// Runs `schedule` through `executor` (greedy), returning each sequence's sampled tokens.
fn run_schedule(
    executor: &mut dyn Executor,
    schedule: &Schedule,
    blocks_per_seq: u32,
) -> Vec<Vec<u32>> {
    let n = schedule.prompts.len();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut lens = vec![0u32; n];
    for active in &schedule.steps {
        let mut meta = StepMetadata {
            block_size: BLOCK,
            ..StepMetadata::default()
        };
        for &i in active {
            let new = if lens[i] == 0 {
                schedule.prompts[i].clone()
            } else {
                vec![*out[i].last().unwrap()]
            };
            push_seq(&mut meta, i as u32 * blocks_per_seq, &new, lens[i]);
            lens[i] += new.len() as u32;
        }
        let mut slots: Vec<SamplingSlot> = active.iter().map(|_| greedy_slot()).collect();
        for (&i, tok) in active.iter().zip(executor.execute(&meta, &mut slots)) {
            out[i].push(tok);
        }
    }
    out
}

#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn graph_replay_decodes_like_op_by_op() {
    let gpu = gpu();
    let spec = ModelSpec::synthetic("small").unwrap();
    let mut rng = SplitMix64::new(23);
    let prompts: Vec<Vec<u32>> = [5usize, 40, 17, 9]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| rng.below(spec.vocab_size as u64) as u32)
                .collect()
        })
        .collect();
    let mut steps = vec![vec![0, 1, 2]];
    steps.extend(std::iter::repeat_n(vec![0, 1, 2], 6)); // padded to 4
    steps.push(vec![0, 1, 2, 3]); // a prefill joins: op by op
    steps.extend(std::iter::repeat_n(vec![0, 1, 2, 3], 5)); // exactly 4
    steps.extend(std::iter::repeat_n(vec![1], 4)); // 1
    steps.extend(std::iter::repeat_n(vec![3, 0], 4)); // 2, out of sequence order
    let schedule = Schedule { prompts, steps };
    let blocks_per_seq = (spec.max_model_len as u32).div_ceil(BLOCK);
    let num_blocks = blocks_per_seq as usize * schedule.prompts.len();
    let model = LlamaModel::synthetic(spec, gpu.clone(), 3);
    let mut eager = ModelExecutor::new(model.clone(), num_blocks, BLOCK as usize);
    let mut graphs = GraphExecutor::new(model, num_blocks, BLOCK as usize);
    let want = run_schedule(&mut eager, &schedule, blocks_per_seq);
    let got = run_schedule(&mut graphs, &schedule, blocks_per_seq);
    assert_eq!(
        graphs.captured(),
        vec![1, 2, 4],
        "decode steps of 1, 2, 3 and 4 sequences replay graphs of 1, 2 and 4"
    );
    assert_eq!(
        got, want,
        "graph replays and op-by-op steps pick different tokens"
    );
}

/// Seconds per call of `f`, after two warm-up calls, over enough calls to fill ~0.3 s.
fn time_per_call(gpu: &CudaBackend, mut f: impl FnMut()) -> f64 {
    f();
    f();
    gpu.synchronize();
    let mut calls = 1usize;
    loop {
        let started = std::time::Instant::now();
        for _ in 0..calls {
            f();
        }
        gpu.synchronize();
        let t = started.elapsed().as_secs_f64();
        if t >= 0.3 || calls >= 1 << 16 {
            return t / calls as f64;
        }
        calls *= 4;
    }
}

/// Device-to-device copy bandwidth in bytes per second (bytes read plus bytes written).
fn copy_bandwidth(gpu: &CudaBackend) -> f64 {
    let n = 512 << 20; // 2 GiB of f32 per buffer
    let src = gpu.stream().alloc_zeros::<f32>(n).expect("2 GiB source");
    let mut dst = gpu
        .stream()
        .alloc_zeros::<f32>(n)
        .expect("2 GiB destination");
    let t = time_per_call(gpu, || {
        gpu.stream().memcpy_dtod(&src, &mut dst).expect("copy");
    });
    2.0 * (n * 4) as f64 / t
}

/// The GPU figures of docs/benchmarks.md, printed as Markdown (and written to
/// `$BALLAST_BENCH_OUT` when set): copy bandwidth, paged decode attention at Llama-3-8B
/// shapes, and batch-1 decode of synthetic:llama-3-8b against its weight-read roofline.
#[test]
#[ignore = "needs an NVIDIA GPU (~140 GB for the largest shapes): run kernels/device-check.sh"]
fn device_benchmarks() {
    use std::fmt::Write;
    let gpu = gpu();
    let mut report = String::new();
    let copy = copy_bandwidth(&gpu);
    writeln!(
        report,
        "## {} ({})\n\nDevice-to-device copy: {:.0} GB/s (read + write)\n",
        gpu.device_name(),
        gpu.arch(),
        copy / 1e9
    )
    .unwrap();
    eprint!("{report}");

    // Paged decode attention, one layer of Llama-3-8B (32 query heads, 8 kv heads, d 128).
    let spec = ModelSpec::synthetic("llama-3-8b").unwrap();
    let (heads, kvh, d) = (spec.num_heads, spec.num_kv_heads, spec.head_dim);
    writeln!(
        report,
        "| batch | context | attention µs | KV read GB/s | of copy bandwidth |\n|---|---|---|---|---|"
    )
    .unwrap();
    let mut rng = SplitMix64::new(1);
    for batch in [1usize, 8, 32, 64] {
        for context in [1024u32, 4096, 16_384, 32_768] {
            let seqs: Vec<(u32, u32)> = vec![(context - 1, 1); batch];
            let meta = step_meta(&seqs, &mut rng, 2);
            let blocks = meta.block_tables.len();
            let cache = gpu.alloc_kv_cache(KvLayout {
                num_layers: 1,
                num_blocks: blocks,
                block_size: BLOCK as usize,
                num_kv_heads: kvh,
                head_dim: d,
                dtype: KvDtype::F32,
            });
            let q = gpu.upload(&random(batch * heads * d, &mut rng), batch, heads * d);
            let m = gpu.prepare_step(&meta);
            let t = time_per_call(&gpu, || {
                let _ = gpu.paged_attention(&q, &cache, 0, &m, heads);
            });
            let bytes = (batch * context as usize * kvh * d * 4 * 2) as f64;
            let line = format!(
                "| {batch} | {context} | {:.1} | {:.0} | {:.0} % |",
                t * 1e6,
                bytes / t / 1e9,
                100.0 * bytes / t / copy
            );
            eprintln!("{line}");
            writeln!(report, "{line}").unwrap();
        }
    }

    // Batch-1 decode of synthetic:llama-3-8b (bf16 weights).
    let started = std::time::Instant::now();
    let model = LlamaModel::synthetic(spec.clone(), gpu.clone(), 0);
    gpu.synchronize();
    eprintln!("synthetic:llama-3-8b built in {:.1?}", started.elapsed());
    let prompt: Vec<u32> = (0..128).map(|i| (i * 7919) % 128_000).collect();
    let steps = 128;
    let mut cache = model.backend.alloc_kv_cache(model.kv_layout(
        (prompt.len() + steps + 2).div_ceil(BLOCK as usize),
        BLOCK as usize,
    ));
    let n = prompt.len() as u32;
    let prefill = StepMetadata::single_sequence(&prompt, 0, BLOCK, vec![n - 1]);
    let logits = model.forward(&mut cache, &prefill);
    let mut token = model.backend.sample(&logits, &mut [greedy_slot()])[0];
    let started = std::time::Instant::now();
    for pos in n..n + steps as u32 {
        let meta = StepMetadata::single_sequence(&[token], pos, BLOCK, vec![0]);
        let logits = model.forward(&mut cache, &meta);
        token = model.backend.sample(&logits, &mut [greedy_slot()])[0];
    }
    let tok_s = steps as f64 / started.elapsed().as_secs_f64();
    // A decode step reads every weight matrix once (the embedding table only by row).
    let weight_bytes = 2 * (spec.num_params() - spec.vocab_size * spec.hidden_size);
    let roofline = copy / weight_bytes as f64;
    let line = format!(
        "\nsynthetic:llama-3-8b bf16, batch 1, 128-token prompt, {steps} decode steps: \
         {tok_s:.1} tok/s; weight-read roofline at the copy bandwidth {roofline:.0} tok/s \
         ({:.0} % of it)",
        100.0 * tok_s / roofline
    );
    eprintln!("{line}");
    writeln!(report, "{line}").unwrap();
    drop(cache);

    // The same decode through an executor that replays a captured graph per step.
    let num_blocks = (prompt.len() + steps + 2).div_ceil(BLOCK as usize);
    let mut graphs = GraphExecutor::new(model, num_blocks, BLOCK as usize);
    let schedule = Schedule {
        prompts: vec![prompt.clone()],
        steps: vec![vec![0]; 1 + 2],
    };
    // Prefill and two decode steps (the first captures the graph); then time the rest.
    let blocks_per_seq = num_blocks as u32;
    let warm = run_schedule(&mut graphs, &schedule, blocks_per_seq);
    let mut token = *warm[0].last().unwrap();
    let started = std::time::Instant::now();
    for pos in n + 2..n + steps as u32 - 1 {
        let meta = StepMetadata::single_sequence(&[token], pos, BLOCK, vec![0]);
        token = graphs.execute(&meta, &mut [greedy_slot()])[0];
    }
    let graph_tok_s = (steps - 3) as f64 / started.elapsed().as_secs_f64();
    let line = format!(
        "the same with CUDA graphs (--cuda-graphs; captured {:?}): {graph_tok_s:.1} tok/s \
         ({:.0} % of the roofline)",
        graphs.captured(),
        100.0 * graph_tok_s / roofline
    );
    eprintln!("{line}");
    writeln!(report, "{line}").unwrap();
    println!("{report}");
    if let Some(path) = std::env::var_os("BALLAST_BENCH_OUT") {
        std::fs::write(&path, &report).expect("write the report");
    }
}
