//! The reference backend: f32 on the CPU, rayon for parallelism, `matrixmultiply` for large
//! GEMMs and hand-vectorised dot products for the skinny ones of decode steps.

use rayon::prelude::*;

pub use super::tensor::CpuTensor;

use super::attention::attention;
use super::quant::{self, QuantKernel, QuantMatrix};
use super::simd::{dot, dot4};
use super::{Backend, HostWeight, KvDtype, KvLayout, RopeStyle};
use crate::step::StepMetadata;

/// A weight matrix of the CPU backend: dense f32, or quantized blocks read in place.
#[derive(Debug, Clone)]
pub enum CpuWeight {
    /// Dense f32.
    Dense(CpuTensor),
    /// bf16 values widened to f32 (exactly). A product rounds its activations to bf16 first,
    /// so it is the reference of the CUDA backend's bf16 GEMM (f32 accumulation).
    Bf16(CpuTensor),
    /// Quantized blocks.
    Quant(QuantMatrix),
}

impl CpuWeight {
    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            CpuWeight::Dense(t) | CpuWeight::Bf16(t) => (t.rows, t.cols),
            CpuWeight::Quant(q) => (q.rows, q.cols),
        }
    }
}

/// K and V arrays of every layer, `[num_blocks, block_size, num_kv_heads, head_dim]` each.
#[derive(Debug)]
pub struct CpuKvCache {
    /// Shape of the cache.
    pub layout: KvLayout,
    k: Vec<KvArray>,
    v: Vec<KvArray>,
}

/// One layer's K or V array, in the cache's element type.
///
/// f16 values are kept as their bits (`u16`): a zeroed `Vec<u16>` comes from the allocator's
/// zeroed pages, which become resident only as blocks fill, where `vec![f16::ZERO; n]`
/// would write (and make resident) the whole pool at start.
#[derive(Debug)]
enum KvArray {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl KvArray {
    fn zeros(dtype: KvDtype, len: usize) -> Self {
        match dtype {
            KvDtype::F32 => KvArray::F32(vec![0.0; len]),
            KvDtype::F16 => KvArray::F16(vec![0; len]),
        }
    }

    /// Stores `src` at `at` (rounding to nearest even for f16).
    fn write(&mut self, at: usize, src: &[f32]) {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        match self {
            KvArray::F32(a) => a[at..at + src.len()].copy_from_slice(src),
            KvArray::F16(a) => a[at..at + src.len()]
                .reinterpret_cast_mut::<half::f16>()
                .convert_from_f32_slice(src),
        }
    }

    /// `len` elements from `at`, as f32.
    fn read(&self, at: usize, len: usize) -> Vec<f32> {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        match self {
            KvArray::F32(a) => a[at..at + len].to_vec(),
            KvArray::F16(a) => a[at..at + len].reinterpret_cast::<half::f16>().to_f32_vec(),
        }
    }
}

impl CpuKvCache {
    /// Key vector of `kv_head` at `slot` in `layer` (widened to f32 from an f16 cache).
    pub fn key(&self, layer: usize, slot: usize, kv_head: usize) -> Vec<f32> {
        let d = self.layout.head_dim;
        self.k[layer].read(slot * self.layout.token_stride() + kv_head * d, d)
    }

    /// Value vector of `kv_head` at `slot` in `layer` (widened to f32 from an f16 cache).
    pub fn value(&self, layer: usize, slot: usize, kv_head: usize) -> Vec<f32> {
        let d = self.layout.head_dim;
        self.v[layer].read(slot * self.layout.token_stride() + kv_head * d, d)
    }
}

/// Step metadata plus the per-row indexes the CPU kernels need.
#[derive(Debug)]
pub struct CpuStepMeta {
    /// The host metadata.
    pub meta: StepMetadata,
    /// For every token row, the index of its sequence in `meta.seqs`.
    row_seq: Vec<u32>,
}

/// The CPU reference backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

/// Below this many rows a matmul streams each weight row once against the (cache-resident)
/// input rows; a GEMM would first pack the whole weight matrix, which costs as much as the
/// product itself at decode batch sizes. Measured crossover on a 2-core AVX2 machine.
const SKINNY_ROWS: usize = 16;

/// Which matmul kernel to use; [`MatmulKernel::Auto`] picks by row count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    /// Skinny below 16 rows (`SKINNY_ROWS`), GEMM above.
    Auto,
    /// Stream weight rows against groups of four input rows.
    Skinny,
    /// Packed GEMM (`matrixmultiply`) over column slabs.
    Gemm,
}

/// Output columns per parallel task, so rayon has work to balance without tiny tasks.
const COLS_PER_TASK: usize = 64;

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a disjoint set of elements (its own column range).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl CpuBackend {
    /// `x · wᵀ` with a chosen kernel (benchmarks compare them; the trait uses `Auto`).
    pub fn matmul_with(&self, x: &CpuTensor, w: &CpuTensor, kernel: MatmulKernel) -> CpuTensor {
        let mut out = CpuTensor::zeros(x.rows, w.rows);
        self.matmul_into(x, w, &mut out.data, kernel);
        out
    }

    fn matmul_into(&self, x: &CpuTensor, w: &CpuTensor, out: &mut [f32], kernel: MatmulKernel) {
        let (m, k, n) = (x.rows, x.cols, w.rows);
        assert_eq!(w.cols, k, "matmul: x has {k} columns, w has {}", w.cols);
        assert_eq!(out.len(), m * n);
        if m == 0 || n == 0 {
            return;
        }
        let ptr = OutPtr(out.as_mut_ptr());
        let tasks = n.div_ceil(COLS_PER_TASK);
        let skinny = match kernel {
            MatmulKernel::Auto => m < SKINNY_ROWS,
            MatmulKernel::Skinny => true,
            MatmulKernel::Gemm => false,
        };
        if skinny {
            let xr = |i: usize| &x.data[i * k..(i + 1) * k];
            (0..tasks).into_par_iter().for_each(|t| {
                let p = ptr;
                for j in t * COLS_PER_TASK..((t + 1) * COLS_PER_TASK).min(n) {
                    let wj = &w.data[j * k..(j + 1) * k];
                    let mut i = 0;
                    // SAFETY (all writes): (i, j) is written by this task only, in bounds.
                    while i + 4 <= m {
                        let v = dot4([xr(i), xr(i + 1), xr(i + 2), xr(i + 3)], wj);
                        for (r, v) in v.into_iter().enumerate() {
                            unsafe { *p.0.add((i + r) * n + j) = v };
                        }
                        i += 4;
                    }
                    for i in i..m {
                        unsafe { *p.0.add(i * n + j) = dot(xr(i), wj) };
                    }
                }
            });
        } else {
            // Larger column slabs amortise the GEMM's packing of x.
            let per = n
                .div_ceil(rayon::current_num_threads().max(1) * 2)
                .max(COLS_PER_TASK);
            let slabs = n.div_ceil(per);
            (0..slabs).into_par_iter().for_each(|s| {
                let p = ptr;
                let j0 = s * per;
                let cols = per.min(n - j0);
                // SAFETY: x is [m,k] row-major; wᵀ is read with strides (1, k) starting at row
                // j0 of w; the output slab is columns j0..j0+cols of [m,n], disjoint per task.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        k,
                        cols,
                        1.0,
                        x.data.as_ptr(),
                        k as isize,
                        1,
                        w.data.as_ptr().add(j0 * k),
                        1,
                        k as isize,
                        0.0,
                        p.0.add(j0),
                        n as isize,
                        1,
                    );
                }
            });
        }
    }
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type KvCache = CpuKvCache;
    type StepMeta = CpuStepMeta;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> CpuTensor {
        assert_eq!(data.len(), rows * cols, "upload: data does not match shape");
        CpuTensor {
            data: data.to_vec(),
            rows,
            cols,
        }
    }

    fn download(&self, t: &CpuTensor) -> Vec<f32> {
        t.data.clone()
    }

    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn upload_weight(&self, w: HostWeight<'_>) -> CpuWeight {
        match w {
            HostWeight::F32 { data, rows, cols } => {
                assert_eq!(
                    data.len(),
                    rows * cols,
                    "upload_weight: data does not match shape"
                );
                CpuWeight::Dense(CpuTensor {
                    data: data.into_owned(),
                    rows,
                    cols,
                })
            }
            HostWeight::Bf16 { data, rows, cols } => {
                assert_eq!(
                    data.len(),
                    rows * cols,
                    "upload_weight: data does not match shape"
                );
                CpuWeight::Bf16(CpuTensor {
                    data: data.iter().map(|&b| super::bf16_to_f32(b)).collect(),
                    rows,
                    cols,
                })
            }
            // Repacked into panels where the AVX-512 kernel runs (a copy the size of the
            // file's blocks; the memory map is then no longer read).
            HostWeight::Quant(q) => CpuWeight::Quant(q.for_this_cpu()),
        }
    }

    fn weight_shape(&self, w: &CpuWeight) -> (usize, usize) {
        w.shape()
    }

    fn alloc_kv_cache(&self, layout: KvLayout) -> CpuKvCache {
        let layer = || KvArray::zeros(layout.dtype, layout.layer_len());
        CpuKvCache {
            layout,
            k: (0..layout.num_layers).map(|_| layer()).collect(),
            v: (0..layout.num_layers).map(|_| layer()).collect(),
        }
    }

    fn prepare_step(&self, meta: &StepMetadata) -> CpuStepMeta {
        let mut row_seq = vec![0u32; meta.num_tokens()];
        for (i, s) in meta.seqs.iter().enumerate() {
            let start = s.query_start as usize;
            row_seq[start..start + s.query_len as usize].fill(i as u32);
        }
        CpuStepMeta {
            meta: meta.clone(),
            row_seq,
        }
    }

    /// Runs the step on a thread of rayon's pool: every parallel op inside it then shares
    /// out work from a pool thread, where the calling thread (a rank's loop) would have to
    /// post each op to the pool and sleep until it finished, a thread switch per matmul.
    fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R {
        rayon::scope(|_| step())
    }

    fn embedding(&self, table: &CpuWeight, meta: &CpuStepMeta) -> CpuTensor {
        let ids = &meta.meta.token_ids;
        let cols = table.shape().1;
        let mut out = CpuTensor::zeros(ids.len(), cols);
        for (row, &id) in out.data.chunks_mut(cols).zip(ids) {
            match table {
                CpuWeight::Dense(t) | CpuWeight::Bf16(t) => row.copy_from_slice(t.row(id as usize)),
                CpuWeight::Quant(q) => q.dequantize_row(id as usize, row),
            }
        }
        out
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuWeight) -> CpuTensor {
        match w {
            CpuWeight::Dense(w) => self.matmul_with(x, w, MatmulKernel::Auto),
            CpuWeight::Bf16(w) => {
                let rounded = CpuTensor {
                    data: x
                        .data
                        .iter()
                        .map(|&v| super::bf16_to_f32(super::bf16_round(v)))
                        .collect(),
                    rows: x.rows,
                    cols: x.cols,
                };
                self.matmul_with(&rounded, w, MatmulKernel::Auto)
            }
            CpuWeight::Quant(w) => quant::matmul(x, w, QuantKernel::Auto),
        }
    }

    fn matmul_n<const N: usize>(&self, x: &CpuTensor, ws: [&CpuWeight; N]) -> [CpuTensor; N] {
        let quant: Vec<&QuantMatrix> = ws
            .iter()
            .filter_map(|w| match w {
                CpuWeight::Quant(q) => Some(q),
                CpuWeight::Dense(_) | CpuWeight::Bf16(_) => None,
            })
            .collect();
        if quant.len() < N {
            return ws.map(|w| self.matmul(x, w));
        }
        let outs = quant::matmul_many(x, &quant, QuantKernel::Auto);
        outs.try_into()
            .unwrap_or_else(|_| unreachable!("one output per weight"))
    }

    fn rms_norm(&self, x: &CpuTensor, weight: &CpuTensor, eps: f32) -> CpuTensor {
        let mut out = CpuTensor::zeros(x.rows, x.cols);
        let cols = x.cols;
        out.data
            .par_chunks_mut(cols)
            .with_min_len(16)
            .zip(x.data.par_chunks(cols))
            .for_each(|(o, xr)| {
                let ms = dot(xr, xr) / cols as f32;
                let scale = 1.0 / (ms + eps).sqrt();
                for ((o, &v), &w) in o.iter_mut().zip(xr).zip(&weight.data) {
                    *o = v * scale * w;
                }
            });
        out
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        cos: &CpuTensor,
        sin: &CpuTensor,
        meta: &CpuStepMeta,
        num_heads: usize,
        style: RopeStyle,
    ) {
        let head_dim = x.cols / num_heads;
        let half = head_dim / 2;
        let cols = x.cols;
        x.data
            .par_chunks_mut(cols)
            .with_min_len(16)
            .zip(meta.meta.positions.par_iter())
            .for_each(|(row, &pos)| {
                let (c, s) = (cos.row(pos as usize), sin.row(pos as usize));
                // Dimension pairs (i, i + half) or (2i, 2i + 1).
                let (pair, step) = match style {
                    RopeStyle::Halves => (half, 1),
                    RopeStyle::Pairs => (1, 2),
                };
                for head in row.chunks_mut(head_dim) {
                    for i in 0..half {
                        let (ia, ib) = (i * step, i * step + pair);
                        let (a, b) = (head[ia], head[ib]);
                        head[ia] = a * c[i] - b * s[i];
                        head[ib] = b * c[i] + a * s[i];
                    }
                }
            });
    }

    fn write_kv(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        meta: &CpuStepMeta,
    ) {
        let stride = cache.layout.token_stride();
        assert_eq!(
            k.cols, stride,
            "write_kv: K row is not num_kv_heads * head_dim"
        );
        for (t, &slot) in meta.meta.slot_mapping.iter().enumerate() {
            let at = slot as usize * stride;
            cache.k[layer].write(at, k.row(t));
            cache.v[layer].write(at, v.row(t));
        }
    }

    fn paged_attention(
        &self,
        q: &CpuTensor,
        cache: &CpuKvCache,
        layer: usize,
        meta: &CpuStepMeta,
        num_heads: usize,
    ) -> CpuTensor {
        match (&cache.k[layer], &cache.v[layer]) {
            (KvArray::F32(k), KvArray::F32(v)) => attention(
                q,
                k,
                v,
                cache.layout,
                (&meta.meta, &meta.row_seq),
                num_heads,
            ),
            (KvArray::F16(k), KvArray::F16(v)) => {
                use half::slice::HalfBitsSliceExt;
                let (k, v) = (k.reinterpret_cast::<half::f16>(), v.reinterpret_cast());
                attention(
                    q,
                    k,
                    v,
                    cache.layout,
                    (&meta.meta, &meta.row_seq),
                    num_heads,
                )
            }
            _ => unreachable!("K and V of a layer share the cache's element type"),
        }
    }

    fn silu_mul(&self, gate: &CpuTensor, up: &CpuTensor) -> CpuTensor {
        let mut out = CpuTensor::zeros(gate.rows, gate.cols);
        out.data
            .par_chunks_mut(4096)
            .zip(gate.data.par_chunks(4096).zip(up.data.par_chunks(4096)))
            .for_each(|(o, (g, u))| {
                for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                    *o = g / (1.0 + (-g).exp()) * u;
                }
            });
        out
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) {
        assert_eq!(x.data.len(), y.data.len(), "add_assign: shapes differ");
        for (a, b) in x.data.iter_mut().zip(&y.data) {
            *a += b;
        }
    }

    fn gather_logits_rows(&self, x: &CpuTensor, meta: &CpuStepMeta) -> CpuTensor {
        let rows = &meta.meta.logits_rows;
        let mut out = CpuTensor::zeros(rows.len(), x.cols);
        for (o, &r) in out.data.chunks_mut(x.cols).zip(rows) {
            o.copy_from_slice(x.row(r as usize));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::SeqSlice;
    use ballast_rng::SplitMix64;

    fn random(rows: usize, cols: usize, rng: &mut SplitMix64) -> CpuTensor {
        let data = (0..rows * cols)
            .map(|_| rng.next_f32() * 2.0 - 1.0)
            .collect();
        CpuTensor { data, rows, cols }
    }

    #[test]
    fn a_bf16_weight_multiplies_bf16_rounded_activations() {
        use crate::compute::backend::{bf16_round, bf16_to_f32};
        let mut rng = SplitMix64::new(21);
        let (x, w) = (random(3, 96, &mut rng), random(5, 96, &mut rng));
        let host = HostWeight::F32 {
            data: w.data.clone().into(),
            rows: 5,
            cols: 96,
        };
        let bf16 = CpuBackend.upload_weight(host.to_bf16());
        assert!(matches!(bf16, CpuWeight::Bf16(_)));
        let got = CpuBackend.matmul(&x, &bf16);
        // By hand: both operands rounded to bf16, products summed in f64.
        let round = |v: f32| bf16_to_f32(bf16_round(v));
        for r in 0..3 {
            for c in 0..5 {
                let want: f64 = (0..96)
                    .map(|k| round(x.row(r)[k]) as f64 * round(w.row(c)[k]) as f64)
                    .sum();
                let g = got.row(r)[c] as f64;
                assert!((g - want).abs() < 1e-4, "[{r}, {c}]: {g} vs {want}");
            }
        }
        // Rounding the activations is visible: the unrounded product differs.
        let dense = CpuBackend.matmul(&x, &CpuBackend.upload_weight(host));
        assert_ne!(dense.data, got.data);
    }

    fn naive_matmul(x: &CpuTensor, w: &CpuTensor) -> Vec<f32> {
        let mut out = vec![0.0; x.rows * w.rows];
        for i in 0..x.rows {
            for j in 0..w.rows {
                out[i * w.rows + j] = (0..x.cols).map(|p| x.row(i)[p] * w.row(j)[p]).sum();
            }
        }
        out
    }

    #[test]
    fn matmul_matches_naive_for_skinny_and_tall_inputs() {
        let mut rng = SplitMix64::new(11);
        for (m, k, n) in [
            (1, 64, 130),
            (3, 17, 5),
            (8, 33, 200),
            (40, 64, 64),
            (9, 1, 1),
        ] {
            let x = random(m, k, &mut rng);
            let w = random(n, k, &mut rng);
            let want = naive_matmul(&x, &w);
            for kernel in [MatmulKernel::Auto, MatmulKernel::Skinny, MatmulKernel::Gemm] {
                let got = CpuBackend.matmul_with(&x, &w, kernel);
                for (a, b) in got.data.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-4, "{kernel:?} ({m},{k},{n}): {a} vs {b}");
                }
            }
        }
    }

    /// One sequence of a random attention case: its queries, all its keys and values, and
    /// how many of them were cached before the step.
    struct SeqCase {
        q: CpuTensor,
        k: CpuTensor,
        v: CpuTensor,
        context: usize,
    }

    #[derive(Clone, Copy)]
    struct Heads {
        num_heads: usize,
        num_kv_heads: usize,
        d: usize,
    }

    /// Dense causal attention over contiguous K/V: the reference paged attention must equal.
    fn dense_attention(c: &SeqCase, h: Heads) -> Vec<f32> {
        let Heads {
            num_heads,
            num_kv_heads,
            d,
        } = h;
        let group = num_heads / num_kv_heads;
        let mut out = vec![0.0; c.q.data.len()];
        for t in 0..c.q.rows {
            let pos = c.context + t;
            for head in 0..num_heads {
                let g = head / group;
                let qh = &c.q.row(t)[head * d..(head + 1) * d];
                let scores: Vec<f32> = (0..=pos)
                    .map(|j| {
                        let kj = &c.k.row(j)[g * d..(g + 1) * d];
                        qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() / (d as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                for (j, e) in exps.iter().enumerate() {
                    let vj = &c.v.row(j)[g * d..(g + 1) * d];
                    for x in 0..d {
                        out[(t * num_heads + head) * d + x] += e / sum * vj[x];
                    }
                }
            }
        }
        out
    }

    fn stack(rows: impl Iterator<Item = Vec<f32>>, cols: usize) -> CpuTensor {
        let data: Vec<f32> = rows.flatten().collect();
        CpuTensor {
            rows: data.len() / cols,
            data,
            cols,
        }
    }

    #[test]
    fn an_f16_cache_stores_rounded_to_nearest_even() {
        let layout = KvLayout {
            num_layers: 2,
            num_blocks: 2,
            block_size: 2,
            num_kv_heads: 1,
            head_dim: 4,
            dtype: KvDtype::F16,
        };
        assert_eq!(layout.bytes(), 2 * 2 * (2 * 2 * 4) * 2);
        let mut cache = CpuBackend.alloc_kv_cache(layout);
        // 1 + 2⁻¹¹ is halfway between two f16 values: it rounds to the even one, 1.0;
        // 1 + 3·2⁻¹¹ rounds up to 1 + 2⁻⁹; 1e-8 is below f16's range and becomes 0.
        let k = CpuTensor {
            data: vec![
                1.0 + 2f32.powi(-11),
                1.0 + 3.0 * 2f32.powi(-11),
                1e-8,
                -65504.0,
            ],
            rows: 1,
            cols: 4,
        };
        let v = CpuTensor {
            data: vec![0.1, 0.2, 0.3, 0.4],
            rows: 1,
            cols: 4,
        };
        let meta = StepMetadata {
            token_ids: vec![0],
            positions: vec![0],
            slot_mapping: vec![3],
            block_size: 2,
            ..Default::default()
        };
        CpuBackend.write_kv(&mut cache, 1, &k, &v, &CpuBackend.prepare_step(&meta));
        assert_eq!(
            cache.key(1, 3, 0),
            vec![1.0, 1.0 + 2f32.powi(-9), 0.0, -65504.0]
        );
        let want: Vec<f32> = v
            .data
            .iter()
            .map(|&x| half::f16::from_f32(x).to_f32())
            .collect();
        assert_eq!(cache.value(1, 3, 0), want);
        assert_eq!(cache.key(0, 3, 0), vec![0.0; 4], "layer 0 untouched");
    }

    #[test]
    fn paged_attention_equals_dense_on_random_shapes() {
        let mut rng = SplitMix64::new(42);
        for case in 0..24 {
            // Every other case an f16 cache, its keys and values drawn as f16 values so that
            // storing them is exact and the dense reference sees the same numbers.
            let dtype = [KvDtype::F32, KvDtype::F16][case % 2];
            let kv = |t: CpuTensor| match dtype {
                KvDtype::F32 => t,
                KvDtype::F16 => CpuTensor {
                    data: t
                        .data
                        .iter()
                        .map(|&v| half::f16::from_f32(v).to_f32())
                        .collect(),
                    ..t
                },
            };
            let num_kv_heads = 1 + rng.below(3) as usize;
            let h = Heads {
                num_kv_heads,
                num_heads: num_kv_heads * (1 + rng.below(3) as usize),
                d: 4 * (1 + rng.below(4) as usize),
            };
            let block_size = 1 + rng.below(8) as usize;
            let num_blocks = 2048;
            let layout = KvLayout {
                num_layers: 1,
                num_blocks,
                block_size,
                num_kv_heads,
                head_dim: h.d,
                dtype,
            };
            let stride = layout.token_stride();
            let mut cache = CpuBackend.alloc_kv_cache(layout);
            // Hand out blocks in a shuffled order so tables are non-contiguous.
            let mut free: Vec<u32> = (0..num_blocks as u32).collect();
            for i in (1..free.len()).rev() {
                free.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut meta = StepMetadata {
                block_size: block_size as u32,
                ..Default::default()
            };
            let mut seqs = Vec::new();
            for _ in 0..1 + rng.below(3) {
                // Short and long contexts (past the tiled path's spans of keys), decode rows
                // and short chunks (a token at a time) beside prefill chunks (tiles).
                let context = rng.below(if case % 3 == 0 { 600 } else { 12 }) as usize;
                let longest = if rng.below(2) == 0 { 6 } else { 40 };
                let q_len = 1 + rng.below(longest) as usize;
                let total = context + q_len;
                let blocks: Vec<u32> = (0..total.div_ceil(block_size))
                    .map(|_| free.pop().unwrap())
                    .collect();
                let slot =
                    |j: usize| blocks[j / block_size] * block_size as u32 + (j % block_size) as u32;
                let c = SeqCase {
                    q: random(q_len, h.num_heads * h.d, &mut rng),
                    k: kv(random(total, stride, &mut rng)),
                    v: kv(random(total, stride, &mut rng)),
                    context,
                };
                // The context was written by earlier steps; put it straight into the cache.
                for j in 0..context {
                    let at = slot(j) as usize * stride;
                    cache.k[0].write(at, c.k.row(j));
                    cache.v[0].write(at, c.v.row(j));
                }
                meta.seqs.push(SeqSlice {
                    query_start: meta.token_ids.len() as u32,
                    query_len: q_len as u32,
                    context_len: context as u32,
                    block_table_start: meta.block_tables.len() as u32,
                    block_table_len: blocks.len() as u32,
                });
                for j in context..total {
                    meta.token_ids.push(0);
                    meta.positions.push(j as u32);
                    meta.slot_mapping.push(slot(j));
                }
                meta.block_tables.extend(&blocks);
                seqs.push(c);
            }
            let prepared = CpuBackend.prepare_step(&meta);
            // This step's K/V go through write_kv, as the model does.
            let new_k = stack(
                seqs.iter().map(|c| c.k.data[c.context * stride..].to_vec()),
                stride,
            );
            let new_v = stack(
                seqs.iter().map(|c| c.v.data[c.context * stride..].to_vec()),
                stride,
            );
            CpuBackend.write_kv(&mut cache, 0, &new_k, &new_v, &prepared);
            let q_all = stack(seqs.iter().map(|c| c.q.data.clone()), h.num_heads * h.d);
            let want: Vec<f32> = seqs.iter().flat_map(|c| dense_attention(c, h)).collect();
            // One thread: tasks take whole query-head groups; 64: one query head each.
            for threads in [1, 64] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let got = pool.install(|| {
                    CpuBackend.paged_attention(&q_all, &cache, 0, &prepared, h.num_heads)
                });
                assert_eq!(got.data.len(), want.len());
                for (a, b) in got.data.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 1e-4,
                        "case {case} ({dtype:?}), {threads} threads: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn rms_norm_and_silu_mul_match_formulas() {
        let x = CpuTensor {
            data: vec![1.0, 2.0, 3.0, 4.0],
            rows: 2,
            cols: 2,
        };
        let w = CpuTensor {
            data: vec![1.0, 0.5],
            rows: 1,
            cols: 2,
        };
        let y = CpuBackend.rms_norm(&x, &w, 0.0);
        let r0 = (2.5f32).sqrt();
        assert!((y.data[0] - 1.0 / r0).abs() < 1e-6 && (y.data[1] - 1.0 / r0).abs() < 1e-6);
        let s = CpuBackend.silu_mul(&x, &w_like(&x));
        assert!((s.data[0] - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
    }

    fn w_like(x: &CpuTensor) -> CpuTensor {
        CpuTensor {
            data: vec![1.0; x.data.len()],
            rows: x.rows,
            cols: x.cols,
        }
    }
}
