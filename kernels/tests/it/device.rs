//! Launches every kernel on a GPU with random input and compares it with its CPU reference
//! (`ballast_kernels::reference`, itself tested against the engine's CPU backend).
//!
//! All `#[ignore]`d: they need an NVIDIA GPU, its driver and NVRTC. Run them with
//! `kernels/device-check.sh` (`cargo test -p ballast-kernels --release -- --include-ignored`).
//! They ran once, on an H200 (2026-12-04): every kernel matched its reference.

use std::collections::HashMap;
use std::sync::Arc;

use ballast_kernels::reference::{self as r, AttentionShape};
use ballast_kernels::{attention_smem_bytes, compile_ptx};
use ballast_rng::SplitMix64;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

struct Gpu {
    stream: Arc<CudaStream>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
}

impl Gpu {
    /// The first GPU with every source compiled for its architecture; panics with the reason
    /// otherwise (these tests only run where a GPU is expected).
    fn new() -> Gpu {
        // SAFETY: only tries to open the driver library.
        assert!(
            unsafe { cudarc::driver::sys::is_culib_present() },
            "no CUDA driver (libcuda.so) on this machine"
        );
        let ctx = CudaContext::new(0).expect("CUDA context on GPU 0");
        let (major, minor) = ctx.compute_capability().expect("compute capability");
        let arch = format!("compute_{major}{minor}");
        let modules = compile_ptx(&arch)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|m| {
                let module = ctx.load_module(Ptx::from_src(m.ptx)).expect("load PTX");
                (m.file, module)
            })
            .collect();
        Gpu {
            stream: ctx.default_stream(),
            modules,
        }
    }

    fn function(&self, name: &str) -> CudaFunction {
        let kernel = ballast_kernels::KERNELS
            .iter()
            .find(|k| k.name == name)
            .unwrap_or_else(|| panic!("{name} is not a listed kernel"));
        self.modules[kernel.file]
            .load_function(name)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn up<T: DeviceRepr>(&self, data: &[T]) -> CudaSlice<T> {
        self.stream.clone_htod(data).expect("copy to device")
    }

    fn down<T: DeviceRepr + Default + Clone>(&self, data: &CudaSlice<T>) -> Vec<T> {
        self.stream.clone_dtoh(data).expect("copy to host")
    }
}

fn random(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
    (0..n).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
}

fn cfg(grid: (u32, u32, u32), block: u32, smem: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: smem as u32,
    }
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}[{i}]: {a} vs {b}"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn elementwise_kernels_match_their_references() {
    let gpu = Gpu::new();
    let mut rng = SplitMix64::new(1);
    for (rows, cols) in [(1usize, 8usize), (7, 100), (33, 4096)] {
        let n = rows * cols;
        let x = random(n, &mut rng);
        let y = random(n, &mut rng);
        let w = random(cols, &mut rng);
        let (dx, dy, dw) = (gpu.up(&x), gpu.up(&y), gpu.up(&w));
        let c = cols as i32;

        let mut dout = gpu.stream.alloc_zeros::<f32>(n).unwrap();
        let f = gpu.function("rms_norm_f32");
        let eps = 1e-5f32;
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&dx).arg(&dw).arg(&mut dout).arg(&c).arg(&eps);
        unsafe { b.launch(cfg((rows as u32, 1, 1), 256, 0)) }.unwrap();
        let mut want = vec![0.0; n];
        r::rms_norm_f32(&x, &w, &mut want, cols, eps);
        assert_close(&gpu.down(&dout), &want, 1e-5, "rms_norm");

        let f = gpu.function("silu_mul_f32");
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&dx).arg(&dy).arg(&mut dout).arg(&n);
        unsafe { b.launch(cfg((n.div_ceil(256) as u32, 1, 1), 256, 0)) }.unwrap();
        r::silu_mul_f32(&x, &y, &mut want);
        assert_close(&gpu.down(&dout), &want, 1e-5, "silu_mul");

        let mut dsum = gpu.up(&x);
        let f = gpu.function("add_assign_f32");
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&mut dsum).arg(&dy).arg(&n);
        unsafe { b.launch(cfg((3, 1, 1), 128, 0)) }.unwrap(); // grid-stride with a small grid
        let mut want = x.clone();
        r::add_assign_f32(&mut want, &y);
        assert_eq!(gpu.down(&dsum), want, "add_assign");

        let ids: Vec<u32> = (0..rows + 2)
            .map(|_| rng.below(rows as u64) as u32)
            .collect();
        let dids = gpu.up(&ids);
        let mut demb = gpu.stream.alloc_zeros::<f32>(ids.len() * cols).unwrap();
        let f = gpu.function("embedding_f32");
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&dx).arg(&dids).arg(&mut demb).arg(&c);
        unsafe { b.launch(cfg((ids.len() as u32, 1, 1), 256, 0)) }.unwrap();
        let mut want = vec![0.0; ids.len() * cols];
        r::embedding_f32(&x, &ids, &mut want, cols);
        assert_eq!(gpu.down(&demb), want, "embedding_f32");

        let table: Vec<u16> = (0..n).map(|_| rng.next_u64() as u16 & 0x7f7f).collect();
        let dtable = gpu.up(&table);
        let f = gpu.function("embedding_bf16");
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&dtable).arg(&dids).arg(&mut demb).arg(&c);
        unsafe { b.launch(cfg((ids.len() as u32, 1, 1), 256, 0)) }.unwrap();
        r::embedding_bf16(&table, &ids, &mut want, cols);
        assert_eq!(gpu.down(&demb), want, "embedding_bf16");

        let picks: Vec<u32> = vec![ids.len() as u32 - 1, 0];
        let dpicks = gpu.up(&picks);
        let mut dg = gpu.stream.alloc_zeros::<f32>(2 * cols).unwrap();
        let f = gpu.function("gather_rows_f32");
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&demb).arg(&dpicks).arg(&mut dg).arg(&c);
        unsafe { b.launch(cfg((2, 1, 1), 256, 0)) }.unwrap();
        let mut gathered = vec![0.0; 2 * cols];
        r::gather_rows_f32(&want, &picks, &mut gathered, cols);
        assert_eq!(gpu.down(&dg), gathered, "gather_rows");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn rope_matches_its_reference_in_both_styles() {
    let gpu = Gpu::new();
    let mut rng = SplitMix64::new(2);
    let (tokens, num_heads, head_dim, max_pos) = (9usize, 4usize, 64usize, 100usize);
    let half = head_dim / 2;
    let cos = random(max_pos * half, &mut rng);
    let sin = random(max_pos * half, &mut rng);
    let pos: Vec<u32> = (0..tokens)
        .map(|_| rng.below(max_pos as u64) as u32)
        .collect();
    let x = random(tokens * num_heads * head_dim, &mut rng);
    let (dcos, dsin, dpos) = (gpu.up(&cos), gpu.up(&sin), gpu.up(&pos));
    let f = gpu.function("rope_f32");
    for style in [r::ROPE_HALVES, r::ROPE_PAIRS] {
        let mut dx = gpu.up(&x);
        let (h, d) = (num_heads as i32, head_dim as i32);
        let mut b = gpu.stream.launch_builder(&f);
        b.arg(&mut dx)
            .arg(&dcos)
            .arg(&dsin)
            .arg(&dpos)
            .arg(&h)
            .arg(&d)
            .arg(&style);
        unsafe { b.launch(cfg((tokens as u32, 1, 1), 128, 0)) }.unwrap();
        let mut want = x.clone();
        r::rope_f32(&mut want, &cos, &sin, &pos, num_heads, head_dim, style);
        assert_close(&gpu.down(&dx), &want, 1e-5, &format!("rope style {style}"));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn write_kv_matches_its_reference() {
    let gpu = Gpu::new();
    let mut rng = SplitMix64::new(3);
    let (tokens, stride, slots) = (10usize, 96usize, 64usize);
    let k = random(tokens * stride, &mut rng);
    let v = random(tokens * stride, &mut rng);
    let mut all: Vec<u32> = (0..slots as u32).collect();
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let map = &all[..tokens];
    let (mut dkc, mut dvc) = (
        gpu.stream.alloc_zeros::<f32>(slots * stride).unwrap(),
        gpu.stream.alloc_zeros::<f32>(slots * stride).unwrap(),
    );
    let (dk, dv, dmap) = (gpu.up(&k), gpu.up(&v), gpu.up(map));
    let f = gpu.function("write_kv_f32");
    let s = stride as i32;
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&dk)
        .arg(&dv)
        .arg(&mut dkc)
        .arg(&mut dvc)
        .arg(&dmap)
        .arg(&s);
    unsafe { b.launch(cfg((tokens as u32, 1, 1), 128, 0)) }.unwrap();
    let (mut kc, mut vc) = (vec![0.0; slots * stride], vec![0.0; slots * stride]);
    r::write_kv_f32(&k, &v, &mut kc, &mut vc, map, stride);
    assert_eq!(gpu.down(&dkc), kc);
    assert_eq!(gpu.down(&dvc), vc);
}

/// A random paged cache and a batch of sequences on shuffled blocks.
struct Case {
    shape: AttentionShape,
    seqs: Vec<u32>,
    tables: Vec<u32>,
    q: Vec<f32>,
    kc: Vec<f32>,
    vc: Vec<f32>,
    tokens: usize,
    longest: usize,
    max_query: usize,
}

fn case(
    rng: &mut SplitMix64,
    decode: bool,
    num_kv_heads: usize,
    group: usize,
    head_dim: usize,
) -> Case {
    let block_size = [1, 7, 16][rng.below(3) as usize];
    let num_seqs = 1 + rng.below(4) as usize;
    let mut seqs = Vec::new();
    let mut tables = Vec::new();
    let (mut tokens, mut longest, mut max_query) = (0, 0, 0);
    let mut lens = Vec::new();
    for _ in 0..num_seqs {
        let context = rng.below(if decode { 3000 } else { 200 }) as usize;
        let q_len = if decode {
            1
        } else {
            1 + rng.below(70) as usize
        };
        lens.push((context, q_len));
    }
    let blocks: usize = lens.iter().map(|(c, q)| (c + q).div_ceil(block_size)).sum();
    let mut free: Vec<u32> = (0..blocks as u32 + 8).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for (context, q_len) in lens {
        let n = (context + q_len).div_ceil(block_size);
        seqs.extend([
            tokens as u32,
            q_len as u32,
            context as u32,
            tables.len() as u32,
            n as u32,
        ]);
        tables.extend((0..n).map(|_| free.pop().unwrap()));
        tokens += q_len;
        longest = longest.max(context + q_len);
        max_query = max_query.max(q_len);
    }
    let num_heads = num_kv_heads * group;
    let cache = (blocks + 8) * block_size * num_kv_heads * head_dim;
    Case {
        shape: AttentionShape {
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            scale: 1.0 / (head_dim as f32).sqrt(),
        },
        seqs,
        tables,
        q: random(tokens * num_heads * head_dim, rng),
        kc: random(cache, rng),
        vc: random(cache, rng),
        tokens,
        longest,
        max_query,
    }
}

fn allow_smem(f: &CudaFunction, bytes: usize) {
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .expect("raise the dynamic shared memory limit");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn decode_attention_direct_and_split_match_the_reference() {
    let gpu = Gpu::new();
    let mut rng = SplitMix64::new(4);
    let decode = gpu.function("paged_attention_decode_f32");
    let merge = gpu.function("paged_attention_merge_f32");
    for (kvh, group, d) in [
        (1, 1, 64),
        (2, 4, 128),
        (8, 8, 128),
        (3, 2, 80),
        (2, 3, 256),
    ] {
        let c = case(&mut rng, true, kvh, group, d);
        let s = c.shape;
        let num_seqs = c.seqs.len() / 5;
        let smem = attention_smem_bytes(group, d);
        allow_smem(&decode, smem);
        let (dq, dk, dv) = (gpu.up(&c.q), gpu.up(&c.kc), gpu.up(&c.vc));
        let (dseqs, dtables) = (gpu.up(&c.seqs), gpu.up(&c.tables));
        let args = [s.num_heads, s.num_kv_heads, d, s.block_size].map(|x| x as i32);
        let mut want = vec![0.0; c.q.len()];
        r::paged_attention_decode_f32(
            &c.q,
            &c.kc,
            &c.vc,
            &c.seqs,
            &c.tables,
            &mut want,
            &mut [],
            &mut [],
            s,
            0,
            1,
        );
        // No split; splits of 512, 100 and 33 tokens (odd, just over a 32-key tile) and of
        // 16 (under a tile).
        for partition in [0usize, 512, 100, 33, 16] {
            let splits = if partition == 0 {
                1
            } else {
                c.longest.div_ceil(partition)
            };
            let n = num_seqs * s.num_heads * splits;
            let mut dout = gpu.stream.alloc_zeros::<f32>(c.q.len()).unwrap();
            let mut dpo = gpu.stream.alloc_zeros::<f32>(n * d).unwrap();
            let mut dpl = gpu.stream.alloc_zeros::<f32>(n).unwrap();
            let p = partition as i32;
            let mut b = gpu.stream.launch_builder(&decode);
            b.arg(&dq)
                .arg(&dk)
                .arg(&dv)
                .arg(&dseqs)
                .arg(&dtables)
                .arg(&mut dout);
            b.arg(&mut dpo).arg(&mut dpl);
            b.arg(&args[0])
                .arg(&args[1])
                .arg(&args[2])
                .arg(&args[3])
                .arg(&p)
                .arg(&s.scale);
            let grid = (kvh as u32, num_seqs as u32, splits as u32);
            unsafe { b.launch(cfg(grid, 128, smem)) }.unwrap();
            if splits > 1 {
                let (h, dd, z) = (s.num_heads as i32, d as i32, splits as i32);
                let mut b = gpu.stream.launch_builder(&merge);
                b.arg(&dpo)
                    .arg(&dpl)
                    .arg(&dseqs)
                    .arg(&mut dout)
                    .arg(&h)
                    .arg(&dd)
                    .arg(&z);
                unsafe { b.launch(cfg((h as u32, num_seqs as u32, 1), 128, 0)) }.unwrap();
            }
            let what = format!("decode kv {kvh} group {group} d {d} splits {splits}");
            assert_close(&gpu.down(&dout), &want, 2e-4, &what);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn prefill_attention_matches_the_reference() {
    let gpu = Gpu::new();
    let mut rng = SplitMix64::new(5);
    let prefill = gpu.function("paged_attention_prefill_f32");
    for (kvh, group, d, qpt) in [
        (1, 1, 64, 16),
        (2, 4, 128, 8),
        (8, 8, 128, 1),
        (3, 2, 80, 5),
    ] {
        let c = case(&mut rng, false, kvh, group, d);
        let s = c.shape;
        let num_seqs = c.seqs.len() / 5;
        let smem = attention_smem_bytes(qpt * group, d);
        allow_smem(&prefill, smem);
        let (dq, dk, dv) = (gpu.up(&c.q), gpu.up(&c.kc), gpu.up(&c.vc));
        let (dseqs, dtables) = (gpu.up(&c.seqs), gpu.up(&c.tables));
        let args = [s.num_heads, s.num_kv_heads, d, s.block_size, qpt].map(|x| x as i32);
        let mut dout = gpu.stream.alloc_zeros::<f32>(c.q.len()).unwrap();
        let mut b = gpu.stream.launch_builder(&prefill);
        b.arg(&dq)
            .arg(&dk)
            .arg(&dv)
            .arg(&dseqs)
            .arg(&dtables)
            .arg(&mut dout);
        b.arg(&args[0])
            .arg(&args[1])
            .arg(&args[2])
            .arg(&args[3])
            .arg(&args[4])
            .arg(&s.scale);
        let grid = (
            kvh as u32,
            c.max_query.div_ceil(qpt) as u32,
            num_seqs as u32,
        );
        unsafe { b.launch(cfg(grid, 128, smem)) }.unwrap();
        let mut want = vec![0.0; c.q.len()];
        r::paged_attention_prefill_f32(&c.q, &c.kc, &c.vc, &c.seqs, &c.tables, &mut want, s);
        let what = format!(
            "prefill kv {kvh} group {group} d {d} tile {qpt}, {} tokens",
            c.tokens
        );
        assert_close(&gpu.down(&dout), &want, 2e-4, &what);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run kernels/device-check.sh"]
fn argmax_and_sampling_pick_the_reference_tokens() {
    let gpu = Gpu::new();
    let mut rng = SplitMix64::new(6);
    let (rows, cols) = (64usize, 32_000usize);
    let mut logits: Vec<f32> = (0..rows * cols)
        .map(|_| (rng.next_f32() - 0.5) * 10.0)
        .collect();
    // Ties with the maximum, masked tokens and a fully masked row.
    for row in logits.chunks_mut(cols).step_by(3) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let at = rng.below(cols as u64) as usize;
        row[at] = m;
        row[rng.below(cols as u64) as usize] = f32::NEG_INFINITY;
    }
    logits[5 * cols..6 * cols].fill(f32::NEG_INFINITY);
    let dl = gpu.up(&logits);
    let c = cols as i32;

    let mut dout = gpu.stream.alloc_zeros::<u32>(rows).unwrap();
    let f = gpu.function("argmax_f32");
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&dl).arg(&mut dout).arg(&c);
    unsafe { b.launch(cfg((rows as u32, 1, 1), 1024, 0)) }.unwrap();
    let mut want = vec![0u32; rows];
    r::argmax_f32(&logits, &mut want, cols);
    assert_eq!(gpu.down(&dout), want, "argmax");

    let temperature: Vec<f32> = (0..rows).map(|i| [0.0, 0.5, 1.0, 1.3][i % 4]).collect();
    let top_p: Vec<f32> = (0..rows).map(|i| [1.0, 0.9, 0.3][i % 3]).collect();
    let top_k: Vec<u32> = (0..rows).map(|i| [0, 40, 1, 1000, 0][i % 5]).collect();
    let uniform: Vec<f64> = (0..rows).map(|_| rng.next_f64()).collect();
    let (dt, dp, dk, du) = (
        gpu.up(&temperature),
        gpu.up(&top_p),
        gpu.up(&top_k),
        gpu.up(&uniform),
    );
    let f = gpu.function("sample_f32");
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&dl)
        .arg(&dt)
        .arg(&dp)
        .arg(&dk)
        .arg(&du)
        .arg(&mut dout)
        .arg(&c);
    unsafe { b.launch(cfg((rows as u32, 1, 1), 1024, 0)) }.unwrap();
    r::sample_f32(
        &logits,
        &temperature,
        &top_p,
        &top_k,
        &uniform,
        &mut want,
        cols,
    );
    assert_eq!(gpu.down(&dout), want, "sample");
}
