//! Quantized matmul kernels against f32 on SmolLM2-135M's matrix shapes, side by side in one
//! run: the integer (AVX2 / AVX-VNNI) kernel on the file's row layout, the portable one,
//! dequantize-then-GEMM (what prefill uses on the row layout), the AVX-512 VNNI kernel on
//! weights repacked into panels (what the engine uses where the CPU has it), and the f32 GEMM
//! over weights dequantized beforehand. Reports microseconds per call, weight bytes streamed
//! per second and, for one thread, nanoseconds per 32-weight block.
//!
//! `cargo bench -p ballast-engine --bench quant_matmul` (set `RAYON_NUM_THREADS=1` for the
//! single-core figures).

use std::time::Instant;

use ballast_engine::compute::backend::cpu::{CpuBackend, CpuTensor, MatmulKernel};
use ballast_engine::compute::backend::quant::{self, BLOCK, QuantFormat, QuantKernel, QuantMatrix};
use ballast_rng::SplitMix64;

fn random(rows: usize, cols: usize, rng: &mut SplitMix64) -> CpuTensor {
    CpuTensor {
        data: (0..rows * cols).map(|_| rng.next_f32() - 0.5).collect(),
        rows,
        cols,
    }
}

fn time(f: impl Fn()) -> f64 {
    f();
    let t0 = Instant::now();
    let mut reps = 0;
    while t0.elapsed().as_secs_f64() < 0.3 || reps < 3 {
        f();
        reps += 1;
    }
    t0.elapsed().as_secs_f64() / reps as f64
}

fn main() {
    // Inside the pool, as the engine runs its steps (`Backend::run_step`): called from outside,
    // every matmul would also pay a hand-off to the pool's threads and back.
    rayon::scope(|_| run());
}

fn run() {
    let mut rng = SplitMix64::new(1);
    println!(
        "threads: {}; µs per call, GB/s of weight bytes, ns per block-row product",
        rayon::current_num_threads()
    );
    let panels = quant::panel_kernel_available();
    println!(
        "AVX-512 panel kernel: {}",
        if panels {
            "yes"
        } else {
            "no (its column is the portable panel loop)"
        }
    );
    println!(
        "{:<16} {:>4} {:>10} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10}",
        "matrix",
        "m",
        "int8 µs",
        "GB/s",
        "ns/blk",
        "portable",
        "deq+gemm",
        "f32 only",
        "panel µs",
        "GB/s",
        "ns/blk",
        "int8/panel"
    );
    let shapes = [
        ("ffn_up Q4_1", QuantFormat::Q4_1, 1536, 576),
        ("ffn_down Q4_1", QuantFormat::Q4_1, 576, 1536),
        ("attn_q Q4_0", QuantFormat::Q4_0, 576, 576),
        ("head Q8_0", QuantFormat::Q8_0, 49_152, 576),
    ];
    for (name, format, n, k) in shapes {
        let dense = random(n, k, &mut rng);
        let w = QuantMatrix::quantize(format, n, k, &dense.data);
        let wp = w.to_panels();
        let mut deq = CpuTensor::zeros(n, k);
        for r in 0..n {
            w.dequantize_row(r, &mut deq.data[r * k..(r + 1) * k]);
        }
        for m in [1, 4, 16, 32, 64, 128] {
            let x = random(m, k, &mut rng);
            let simd = time(|| {
                std::hint::black_box(quant::matmul(&x, &w, QuantKernel::Int8));
            });
            let gemm = time(|| {
                std::hint::black_box(quant::matmul(&x, &w, QuantKernel::Gemm));
            });
            let portable = time(|| {
                std::hint::black_box(quant::matmul(&x, &w, QuantKernel::Portable));
            });
            let f32_path = time(|| {
                std::hint::black_box(CpuBackend.matmul_with(&x, &deq, MatmulKernel::Auto));
            });
            let panel = time(|| {
                std::hint::black_box(quant::matmul(&x, &wp, QuantKernel::Auto));
            });
            let blocks = (n * k / BLOCK * m) as f64;
            let threads = rayon::current_num_threads() as f64;
            println!(
                "{name:<16} {m:>4} {:>10.1} {:>8.2} {:>8.2} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>8.2} {:>9.2} {:>10.2}",
                simd * 1e6,
                w.bytes().len() as f64 / simd / 1e9,
                simd * 1e9 * threads / blocks,
                portable * 1e6,
                gemm * 1e6,
                f32_path * 1e6,
                panel * 1e6,
                wp.bytes().len() as f64 / panel / 1e9,
                panel * 1e9 * threads / blocks,
                simd / panel,
            );
        }
    }
}
