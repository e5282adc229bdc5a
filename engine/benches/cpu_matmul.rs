//! Skinny (weight-streaming) versus packed-GEMM matmul at decode-like row counts, on the
//! shapes of `synthetic:small`, measured side by side. Picks the crossover the CPU backend
//! uses. `cargo bench -p ballast-engine --bench cpu_matmul`.

use std::time::Instant;

use ballast_engine::compute::backend::cpu::{CpuBackend, CpuTensor, MatmulKernel};
use ballast_rng::SplitMix64;

fn random(rows: usize, cols: usize, rng: &mut SplitMix64) -> CpuTensor {
    CpuTensor {
        data: (0..rows * cols).map(|_| rng.next_f32() - 0.5).collect(),
        rows,
        cols,
    }
}

fn time(x: &CpuTensor, w: &CpuTensor, kernel: MatmulKernel) -> f64 {
    let reps = (2_000_000_000 / (x.rows * x.cols * w.rows * 2)).clamp(3, 500);
    CpuBackend.matmul_with(x, w, kernel);
    let t0 = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(CpuBackend.matmul_with(x, w, kernel));
    }
    t0.elapsed().as_secs_f64() / reps as f64
}

fn main() {
    let mut rng = SplitMix64::new(1);
    println!(
        "{:>5} {:>6} {:>6} {:>12} {:>12} {:>8}",
        "rows", "k", "n", "skinny µs", "gemm µs", "gemm/sk"
    );
    for (k, n) in [(512, 1408), (1408, 512)] {
        let w = random(n, k, &mut rng);
        for m in [1, 4, 8, 16, 32, 64, 128, 256] {
            let x = random(m, k, &mut rng);
            let (s, g) = (
                time(&x, &w, MatmulKernel::Skinny),
                time(&x, &w, MatmulKernel::Gemm),
            );
            println!(
                "{m:>5} {k:>6} {n:>6} {:>12.1} {:>12.1} {:>8.2}",
                s * 1e6,
                g * 1e6,
                g / s
            );
        }
    }
}
