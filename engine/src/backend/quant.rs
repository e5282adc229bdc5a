//! Quantized weight matrices and the CPU kernels that multiply by them without expanding
//! them to f32.
//!
//! Weights stay in the blocks the model file stores (Q8_0, Q4_0, Q4_1: 32 elements per
//! block, an f16 scale, for Q4_1 an f16 minimum) and are read in place from the memory map.
//! Activations are quantized per call to 8-bit blocks of the same length, each with an f32
//! scale `d` and the scaled sum `s = d · Σq`, so every block product is an integer dot:
//!
//! - Q8_0: `Σ (dw·w)(dx·x) = dw·dx · Σ w·x`
//! - Q4_1: `Σ (dw·w + m)(dx·x) = dw·dx · Σ w·x + m·s`
//! - Q4_0: Q4_1 with `m = −8·dw` (its nibbles are stored offset by 8)
//!
//! A decode step therefore streams 4.5 (Q4_1: 5) bits per weight instead of 32. The AVX2
//! kernels are chosen at run time; the portable ones are the reference tests compare them to.

use std::sync::Arc;

use rayon::prelude::*;

use super::cpu::CpuTensor;

/// Elements per quantization block.
pub const BLOCK: usize = 32;

/// A block format the kernels multiply directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantFormat {
    /// f16 scale + 32 × i8.
    Q8_0,
    /// f16 scale + 32 × 4-bit, offset by 8.
    Q4_0,
    /// f16 scale + f16 minimum + 32 × 4-bit.
    Q4_1,
}

impl QuantFormat {
    /// Bytes of one block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
        }
    }

    /// Bits stored per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / BLOCK as f64
    }
}

/// Bytes that live inside a larger shared buffer (a memory-mapped model file), kept alive by
/// a reference to it.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl SharedBytes {
    /// `owner`'s bytes `start..start + len`.
    ///
    /// # Panics
    /// If the range is not inside the owner's bytes.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize) -> Self {
        let total = (*owner).as_ref().len();
        assert!(
            start.checked_add(len).is_some_and(|end| end <= total),
            "SharedBytes: {start}+{len} is outside {total} bytes"
        );
        Self { owner, start, len }
    }

    /// A buffer of its own.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        Self::new(Arc::new(bytes), 0, len)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes at {})", self.len, self.start)
    }
}

/// A `[rows, cols]` weight matrix of quantized blocks, each row `cols / 32` blocks.
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    /// Block format.
    pub format: QuantFormat,
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of [`BLOCK`]).
    pub cols: usize,
    bytes: SharedBytes,
}

/// Why bytes cannot be a quantized matrix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantShapeError {
    /// Rows must be whole blocks.
    #[error("a {format:?} row must be a multiple of {BLOCK} elements, not {cols}")]
    PartialBlock {
        /// Format.
        format: QuantFormat,
        /// Row length.
        cols: usize,
    },
    /// Byte count does not match the shape.
    #[error("{format:?} [{rows}, {cols}] needs {want} bytes, got {got}")]
    Length {
        /// Format.
        format: QuantFormat,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Bytes the shape needs.
        want: usize,
        /// Bytes given.
        got: usize,
    },
}

impl QuantMatrix {
    /// Wraps `bytes` as a `[rows, cols]` matrix of `format` blocks.
    pub fn new(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        bytes: SharedBytes,
    ) -> Result<Self, QuantShapeError> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(QuantShapeError::PartialBlock { format, cols });
        }
        let want = rows * (cols / BLOCK) * format.block_bytes();
        if bytes.len != want {
            return Err(QuantShapeError::Length {
                format,
                rows,
                cols,
                want,
                got: bytes.len,
            });
        }
        Ok(Self {
            format,
            rows,
            cols,
            bytes,
        })
    }

    /// Quantizes a row-major `[rows, cols]` f32 matrix the way ggml's reference quantizers
    /// do (for tests and benchmarks; model files arrive quantized).
    ///
    /// # Panics
    /// If `cols` is not a multiple of [`BLOCK`] or `data` is not `rows * cols` long.
    pub fn quantize(format: QuantFormat, rows: usize, cols: usize, data: &[f32]) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "quantize: data does not match shape"
        );
        let mut bytes = Vec::with_capacity(rows * cols / BLOCK * format.block_bytes());
        let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
        for block in data.chunks_exact(BLOCK) {
            match format {
                QuantFormat::Q8_0 => {
                    let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                    bytes.extend_from_slice(&f16(d));
                    bytes.extend(block.iter().map(|v| (v * inv).round() as i8 as u8));
                }
                QuantFormat::Q4_0 => {
                    // The value of largest magnitude maps to -8, keeping its sign.
                    let max = block
                        .iter()
                        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                    let d = max / -8.0;
                    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                    let q = |v: f32| ((v * inv + 8.5) as i32).clamp(0, 15) as u8;
                    bytes.extend_from_slice(&f16(d));
                    bytes
                        .extend((0..BLOCK / 2).map(|j| q(block[j]) | q(block[j + BLOCK / 2]) << 4));
                }
                QuantFormat::Q4_1 => {
                    let min = block.iter().copied().fold(f32::INFINITY, f32::min);
                    let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let d = (max - min) / 15.0;
                    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                    let q = |v: f32| (((v - min) * inv + 0.5) as i32).clamp(0, 15) as u8;
                    bytes.extend_from_slice(&f16(d));
                    bytes.extend_from_slice(&f16(min));
                    bytes
                        .extend((0..BLOCK / 2).map(|j| q(block[j]) | q(block[j + BLOCK / 2]) << 4));
                }
            }
        }
        Self::new(format, rows, cols, SharedBytes::from_vec(bytes)).expect("quantize: shape")
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / BLOCK * self.format.block_bytes()
    }

    /// The stored bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Row `r` as f32 (the reference dequantization).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let row = &self.bytes()[r * rb..(r + 1) * rb];
        for (block, y) in row
            .chunks_exact(self.format.block_bytes())
            .zip(out.chunks_exact_mut(BLOCK))
        {
            dequantize_block(self.format, block, y);
        }
    }
}

fn f16_at(block: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

fn dequantize_block(format: QuantFormat, block: &[u8], y: &mut [f32]) {
    let d = f16_at(block, 0);
    match format {
        QuantFormat::Q8_0 => {
            for (y, &q) in y.iter_mut().zip(&block[2..]) {
                *y = d * f32::from(q as i8);
            }
        }
        QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
            let (qs, m) = match format {
                QuantFormat::Q4_1 => (&block[4..], f16_at(block, 2)),
                _ => (&block[2..], -8.0 * d),
            };
            for (j, &q) in qs.iter().enumerate() {
                y[j] = d * f32::from(q & 0x0f) + m;
                y[j + BLOCK / 2] = d * f32::from(q >> 4) + m;
            }
        }
    }
}

/// Activation rows quantized to 8-bit blocks.
#[derive(Debug, Default)]
pub struct Q8Rows {
    /// Elements per row.
    pub cols: usize,
    /// `rows * cols` quantized values.
    pub qs: Vec<i8>,
    /// Scale of each block, `rows * cols / 32`.
    pub d: Vec<f32>,
    /// `d · Σq` of each block.
    pub s: Vec<f32>,
}

impl Q8Rows {
    /// Quantizes every row of `x` (whose width is a multiple of [`BLOCK`]).
    pub fn quantize(x: &CpuTensor) -> Self {
        assert_eq!(x.cols % BLOCK, 0, "quantize: width not a multiple of 32");
        let nb = x.data.len() / BLOCK;
        let mut out = Self {
            cols: x.cols,
            qs: vec![0; x.data.len()],
            d: vec![0.0; nb],
            s: vec![0.0; nb],
        };
        let work = |(b, (qs, (d, s))): (usize, (&mut [i8], (&mut f32, &mut f32)))| {
            quantize_block(&x.data[b * BLOCK..(b + 1) * BLOCK], qs, d, s)
        };
        let blocks = out
            .qs
            .chunks_exact_mut(BLOCK)
            .zip(out.d.iter_mut().zip(out.s.iter_mut()))
            .enumerate();
        // Prefill chunks quantize hundreds of thousands of values; a decode row is 18 blocks.
        if nb >= 4096 {
            let blocks: Vec<_> = blocks.collect();
            blocks.into_par_iter().with_min_len(256).for_each(work);
        } else {
            blocks.for_each(work);
        }
        out
    }

    fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }
}

fn quantize_block(src: &[f32], qs: &mut [i8], d: &mut f32, s: &mut f32) {
    let amax = src.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(src) {
        let r = (v * inv).round() as i32;
        *q = r as i8;
        sum += r;
    }
    *d = scale;
    *s = scale * sum as f32;
}

/// Dot products of weight row `w` (its bytes) with activation rows `rows` of `x`, into `out`
/// (one per row). Portable reference.
fn dots_generic(
    format: QuantFormat,
    w: &[u8],
    x: &Q8Rows,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let nb = x.blocks_per_row();
    let bb = format.block_bytes();
    for (o, r) in out.iter_mut().zip(rows) {
        let mut acc = 0.0f32;
        for b in 0..nb {
            let block = &w[b * bb..(b + 1) * bb];
            let xi = r * nb + b;
            let xq = &x.qs[xi * BLOCK..(xi + 1) * BLOCK];
            let dw = f16_at(block, 0);
            acc += match format {
                QuantFormat::Q8_0 => {
                    let dot: i32 = block[2..]
                        .iter()
                        .zip(xq)
                        .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
                        .sum();
                    dw * x.d[xi] * dot as f32
                }
                QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                    let (qs, m) = match format {
                        QuantFormat::Q4_1 => (&block[4..], f16_at(block, 2)),
                        _ => (&block[2..], -8.0 * dw),
                    };
                    let mut dot = 0i32;
                    for (j, &q) in qs.iter().enumerate() {
                        dot += i32::from(q & 0x0f) * i32::from(xq[j]);
                        dot += i32::from(q >> 4) * i32::from(xq[j + BLOCK / 2]);
                    }
                    dw * x.d[xi] * dot as f32 + m * x.s[xi]
                }
            };
        }
        *o = acc;
    }
}

/// `Σ u8·i8` over each group of four bytes of two 256-bit vectors, as eight i32: `maddubs`
/// (pairs into i16, which cannot overflow for these ranges: 15·127·2 and 128·127·2 fit) then
/// `madd` with ones.
#[cfg(target_arch = "x86_64")]
macro_rules! udot_avx2 {
    ($w:expr, $x:expr) => {
        _mm256_madd_epi16(_mm256_maddubs_epi16($w, $x), _mm256_set1_epi16(1))
    };
}

/// The same sum in one AVX-VNNI instruction.
#[cfg(target_arch = "x86_64")]
macro_rules! udot_vnni {
    ($w:expr, $x:expr) => {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), $w, $x)
    };
}

/// Block-dot kernels for one x86 feature set: `$features` for `#[target_feature]`, `$udot`
/// for the unsigned-by-signed byte dot.
#[cfg(target_arch = "x86_64")]
macro_rules! int8_kernels {
    ($module:ident, $features:literal, $udot:ident, $doc:literal) => {
        #[doc = $doc]
        #[allow(clippy::needless_range_loop)] // row indexes address several arrays and pointers
        mod $module {
            use super::{BLOCK, Q8Rows, QuantFormat};
            use std::arch::x86_64::*;

            #[inline(always)]
            unsafe fn hsum(v: __m256) -> f32 {
                unsafe {
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
                }
            }

            /// The two f16 values at `p` (scale and, for Q4_1, minimum) as f32.
            #[inline(always)]
            unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
                unsafe {
                    let v =
                        _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
                    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)))
                }
            }

            /// Like `dots_generic` for up to four consecutive rows starting at `r0`.
            ///
            /// # Safety
            /// The CPU must support the module's features; `w` must hold a whole row of
            /// `format` blocks for `x.cols` elements, and rows `r0..r0 + n` must exist in `x`.
            #[target_feature(enable = $features)]
            pub unsafe fn dots(
                format: QuantFormat,
                w: &[u8],
                x: &Q8Rows,
                r0: usize,
                n: usize,
                out: &mut [f32],
            ) {
                debug_assert!((1..=4).contains(&n));
                debug_assert!(w.len() >= x.cols / BLOCK * format.block_bytes());
                debug_assert!((r0 + n) * x.cols <= x.qs.len());
                // SAFETY: forwarded from the caller; each instance reads rows r0..r0 + R.
                unsafe {
                    match (format, n) {
                        (QuantFormat::Q8_0, 1) => q8::<1>(w, x, r0, out),
                        (QuantFormat::Q8_0, 2) => q8::<2>(w, x, r0, out),
                        (QuantFormat::Q8_0, 3) => q8::<3>(w, x, r0, out),
                        (QuantFormat::Q8_0, _) => q8::<4>(w, x, r0, out),
                        (QuantFormat::Q4_1, 1) => q4::<1, true>(w, x, r0, out),
                        (QuantFormat::Q4_1, 2) => q4::<2, true>(w, x, r0, out),
                        (QuantFormat::Q4_1, 3) => q4::<3, true>(w, x, r0, out),
                        (QuantFormat::Q4_1, _) => q4::<4, true>(w, x, r0, out),
                        (QuantFormat::Q4_0, 1) => q4::<1, false>(w, x, r0, out),
                        (QuantFormat::Q4_0, 2) => q4::<2, false>(w, x, r0, out),
                        (QuantFormat::Q4_0, 3) => q4::<3, false>(w, x, r0, out),
                        (QuantFormat::Q4_0, _) => q4::<4, false>(w, x, r0, out),
                    }
                }
            }

            /// Sums two accumulator sets per row into `out`.
            #[inline(always)]
            unsafe fn finish<const R: usize>(
                acc: [[__m256; R]; 2],
                mins: [[f32; R]; 2],
                out: &mut [f32],
            ) {
                unsafe {
                    for r in 0..R {
                        out[r] =
                            hsum(_mm256_add_ps(acc[0][r], acc[1][r])) + (mins[0][r] + mins[1][r]);
                    }
                }
            }

            /// Q4_1 (`MIN`) or Q4_0 weights against `R` activation rows.
            ///
            /// Blocks alternate between two accumulator sets, written out as two calls per
            /// iteration so every accumulator stays in a register (an index computed at run
            /// time would keep them in memory and chain each block on a store and a reload).
            #[target_feature(enable = $features)]
            unsafe fn q4<const R: usize, const MIN: bool>(
                w: &[u8],
                x: &Q8Rows,
                r0: usize,
                out: &mut [f32],
            ) {
                unsafe {
                    let nb = x.cols / BLOCK;
                    let bb = if MIN { 20 } else { 18 };
                    let low4 = _mm_set1_epi8(0x0f);
                    let wp = w.as_ptr();
                    let xq = x.qs.as_ptr().add(r0 * x.cols);
                    let xd = x.d.as_ptr().add(r0 * nb);
                    let xs = x.s.as_ptr().add(r0 * nb);
                    let block = |b: usize, acc: &mut [__m256; R], mins: &mut [f32; R]| {
                        let block = wp.add(b * bb);
                        let (dw, m) = f16_pair(block);
                        let m = if MIN { m } else { -8.0 * dw };
                        let raw =
                            _mm_loadu_si128(block.add(if MIN { 4 } else { 2 }) as *const __m128i);
                        let lo = _mm_and_si128(raw, low4);
                        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
                        let wv = _mm256_set_m128i(hi, lo);
                        for r in 0..R {
                            let xv = _mm256_loadu_si256(
                                xq.add(r * x.cols + b * BLOCK) as *const __m256i
                            );
                            let p = $udot!(wv, xv);
                            let scale = _mm256_set1_ps(dw * *xd.add(r * nb + b));
                            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r]);
                            mins[r] += m * *xs.add(r * nb + b);
                        }
                    };
                    let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
                    let (mut min0, mut min1) = ([0.0f32; R], [0.0f32; R]);
                    let mut b = 0;
                    while b + 2 <= nb {
                        block(b, &mut acc0, &mut min0);
                        block(b + 1, &mut acc1, &mut min1);
                        b += 2;
                    }
                    if b < nb {
                        block(b, &mut acc0, &mut min0);
                    }
                    finish([acc0, acc1], [min0, min1], out);
                }
            }

            /// Q8_0 weights against `R` activation rows: `|w|` times `x` with `w`'s sign.
            #[target_feature(enable = $features)]
            unsafe fn q8<const R: usize>(w: &[u8], x: &Q8Rows, r0: usize, out: &mut [f32]) {
                unsafe {
                    let nb = x.cols / BLOCK;
                    let wp = w.as_ptr();
                    let xq = x.qs.as_ptr().add(r0 * x.cols);
                    let xd = x.d.as_ptr().add(r0 * nb);
                    let block = |b: usize, acc: &mut [__m256; R]| {
                        let block = wp.add(b * 34);
                        let (dw, _) = f16_pair(block);
                        let wv = _mm256_loadu_si256(block.add(2) as *const __m256i);
                        let aw = _mm256_sign_epi8(wv, wv);
                        for r in 0..R {
                            let xv = _mm256_loadu_si256(
                                xq.add(r * x.cols + b * BLOCK) as *const __m256i
                            );
                            let p = _mm256_cvtepi32_ps($udot!(aw, _mm256_sign_epi8(xv, wv)));
                            let scale = _mm256_set1_ps(dw * *xd.add(r * nb + b));
                            acc[r] = _mm256_fmadd_ps(p, scale, acc[r]);
                        }
                    };
                    let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
                    let mut b = 0;
                    while b + 2 <= nb {
                        block(b, &mut acc0);
                        block(b + 1, &mut acc1);
                        b += 2;
                    }
                    if b < nb {
                        block(b, &mut acc0);
                    }
                    finish([acc0, acc1], [[0.0; R]; 2], out);
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
int8_kernels!(
    avx2,
    "avx2,fma,f16c",
    udot_avx2,
    "Block dots with AVX2: `maddubs` + `madd` per byte product."
);
#[cfg(target_arch = "x86_64")]
int8_kernels!(
    vnni,
    "avx2,fma,f16c,avxvnni",
    udot_vnni,
    "Block dots with AVX-VNNI: one `vpdpbusd` per byte product."
);

/// The fastest integer kernel this CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Simd {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

fn detect_simd() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            if std::env::var_os("BALLAST_NO_VNNI").is_none() && has!("avxvnni") {
                return Simd::Vnni;
            }
            return Simd::Avx2;
        }
    }
    Simd::Portable
}

/// Which dot kernel a matmul uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantKernel {
    /// Integer block dots below [`GEMM_ROWS`] rows, [`QuantKernel::Gemm`] from there on.
    Auto,
    /// Integer block dots with the CPU's SIMD, whatever the row count.
    Int8,
    /// Integer block dots in portable code: the reference.
    Portable,
    /// Dequantize slabs of weight rows and run the f32 GEMM.
    Gemm,
}

fn use_simd(kernel: QuantKernel) -> Simd {
    use std::sync::OnceLock;
    static SIMD: OnceLock<Simd> = OnceLock::new();
    match kernel {
        QuantKernel::Portable => Simd::Portable,
        _ => *SIMD.get_or_init(detect_simd),
    }
}

/// Name of the integer kernel [`QuantKernel::Auto`] uses on this CPU (for logs and
/// benchmarks): `avx-vnni`, `avx2` or `portable`.
pub fn int8_kernel_name() -> &'static str {
    match use_simd(QuantKernel::Auto) {
        Simd::Portable => "portable",
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => "avx2",
        #[cfg(target_arch = "x86_64")]
        Simd::Vnni => "avx-vnni",
    }
}

/// Activation rows per pass over a block of weight rows.
const ROW_TILE: usize = 4;

/// A raw output pointer shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a disjoint set of output columns.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// From this many activation rows on (prefill chunks), a matmul expands each slab of weight
/// rows to f32 once and runs a packed f32 GEMM over it: on AVX2 without VNNI an int8 block
/// product costs about as many instructions as the f32 FMAs it replaces, and the GEMM's
/// register blocking reuses each loaded value far more. Measured with
/// `cargo bench -p ballast-engine --bench quant_matmul`.
pub const GEMM_ROWS: usize = 24;

/// `x · wᵀ` with `x: [m, k]` f32 and `w: [n, k]` quantized → `[m, n]`.
///
/// Output columns are split across threads, each thread taking a slab of weight rows. Below
/// [`GEMM_ROWS`] rows, `x` is quantized once and every group of four activation rows passes
/// over the slab's blocks, so each weight row is read from memory once per call whatever the
/// batch size. From [`GEMM_ROWS`] on, the slab is dequantized and multiplied by a GEMM.
pub fn matmul(x: &CpuTensor, w: &QuantMatrix, kernel: QuantKernel) -> CpuTensor {
    assert_eq!(
        x.cols, w.cols,
        "quantized matmul: x has {} columns, w has {}",
        x.cols, w.cols
    );
    let (m, n) = (x.rows, w.rows);
    let mut out = CpuTensor::zeros(m, n);
    if m == 0 || n == 0 {
        return out;
    }
    let ptr = OutPtr(out.data.as_mut_ptr());
    let gemm = match kernel {
        QuantKernel::Auto => m >= GEMM_ROWS,
        QuantKernel::Gemm => true,
        QuantKernel::Int8 | QuantKernel::Portable => false,
    };
    if gemm {
        // Slabs big enough to amortise packing x, small enough to stay in L2 as f32.
        let per = n
            .div_ceil(rayon::current_num_threads().max(1) * 4)
            .clamp(16, (256 * 1024 / (4 * w.cols)).max(16));
        (0..n.div_ceil(per))
            .into_par_iter()
            .for_each_init(Vec::new, |slab: &mut Vec<f32>, s| {
                let p = ptr;
                let j0 = s * per;
                let cols = per.min(n - j0);
                slab.resize(cols * w.cols, 0.0);
                for (r, row) in slab.chunks_exact_mut(w.cols).enumerate() {
                    w.dequantize_row(j0 + r, row);
                }
                // SAFETY: x is [m, k] row-major; the slab is [cols, k] row-major, read
                // transposed with strides (1, k); the output block is columns j0..j0+cols of
                // [m, n], written by this task only.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        w.cols,
                        cols,
                        1.0,
                        x.data.as_ptr(),
                        w.cols as isize,
                        1,
                        slab.as_ptr(),
                        1,
                        w.cols as isize,
                        0.0,
                        p.0.add(j0),
                        n as isize,
                        1,
                    );
                }
            });
        return out;
    }
    let act = Q8Rows::quantize(x);
    int8_matmuls(&act, &[(w, ptr)], use_simd(kernel));
    out
}

/// Several products of the same `x` (Q, K and V; gate and up): `x` is quantized once and
/// all of them share one parallel pass. Same results as calling [`matmul`] on each.
pub fn matmul_many(x: &CpuTensor, ws: &[&QuantMatrix], kernel: QuantKernel) -> Vec<CpuTensor> {
    let int8 = match kernel {
        QuantKernel::Auto => x.rows < GEMM_ROWS,
        QuantKernel::Gemm => false,
        QuantKernel::Int8 | QuantKernel::Portable => true,
    };
    if !int8 || x.rows == 0 {
        return ws.iter().map(|w| matmul(x, w, kernel)).collect();
    }
    let mut outs: Vec<CpuTensor> = ws
        .iter()
        .map(|w| {
            assert_eq!(
                x.cols, w.cols,
                "quantized matmul: x has {} columns, w has {}",
                x.cols, w.cols
            );
            CpuTensor::zeros(x.rows, w.rows)
        })
        .collect();
    let act = Q8Rows::quantize(x);
    let jobs: Vec<(&QuantMatrix, OutPtr)> = ws
        .iter()
        .zip(outs.iter_mut())
        .map(|(w, o)| (*w, OutPtr(o.data.as_mut_ptr())))
        .collect();
    int8_matmuls(&act, &jobs, use_simd(kernel));
    outs
}

/// Integer block products of `act` with each weight, into each output (`[m, w.rows]`, whose
/// pointer comes with it), as one parallel pass over slabs of weight rows.
fn int8_matmuls(act: &Q8Rows, jobs: &[(&QuantMatrix, OutPtr)], simd: Simd) {
    let m = act.qs.len() / act.cols.max(1);
    let total: usize = jobs.iter().map(|(w, _)| w.rows).sum();
    // Enough slabs to balance the threads, but slabs of at least 16 rows.
    let per = total
        .div_ceil(rayon::current_num_threads().max(1) * 4)
        .clamp(16, 256);
    let slabs: Vec<(usize, std::ops::Range<usize>)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, (w, _))| {
            (0..w.rows.div_ceil(per)).map(move |s| (i, s * per..((s + 1) * per).min(w.rows)))
        })
        .collect();
    slabs.into_par_iter().for_each(|(i, cols)| {
        let (w, p) = jobs[i];
        let n = w.rows;
        let rb = w.row_bytes();
        let bytes = w.bytes();
        let mut tile = [0.0f32; ROW_TILE];
        let mut r0 = 0;
        while r0 < m {
            let rows = ROW_TILE.min(m - r0);
            for j in cols.clone() {
                let wr = &bytes[j * rb..(j + 1) * rb];
                match simd {
                    // SAFETY (both): detect_simd picked the kernel only if the CPU has its
                    // features; `wr` is a whole row; rows r0..r0+rows exist.
                    #[cfg(target_arch = "x86_64")]
                    Simd::Vnni => unsafe { vnni::dots(w.format, wr, act, r0, rows, &mut tile) },
                    #[cfg(target_arch = "x86_64")]
                    Simd::Avx2 => unsafe { avx2::dots(w.format, wr, act, r0, rows, &mut tile) },
                    Simd::Portable => dots_generic(w.format, wr, act, r0..r0 + rows, &mut tile),
                }
                for (r, &v) in tile[..rows].iter().enumerate() {
                    // SAFETY: (r0 + r, j) is in bounds of this job's [m, n] output and column
                    // j of it belongs to this slab only.
                    unsafe { *p.0.add((r0 + r) * n + j) = v };
                }
            }
            r0 += rows;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_rng::SplitMix64;

    /// A random `[rows, cols]` matrix in `format`, built block by block from random scales
    /// and integers (so every bit pattern the format allows can occur).
    pub(crate) fn random_matrix(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        rng: &mut SplitMix64,
    ) -> QuantMatrix {
        let blocks = rows * cols / BLOCK;
        let mut bytes = Vec::with_capacity(blocks * format.block_bytes());
        for _ in 0..blocks {
            let d = half::f16::from_f32(rng.next_f32() * 0.02 + 0.001);
            bytes.extend_from_slice(&d.to_le_bytes());
            match format {
                QuantFormat::Q8_0 => {
                    bytes.extend((0..32).map(|_| (rng.next_u64() & 0xff) as u8));
                }
                QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                    if format == QuantFormat::Q4_1 {
                        let m = half::f16::from_f32(rng.next_f32() * 0.2 - 0.1);
                        bytes.extend_from_slice(&m.to_le_bytes());
                    }
                    bytes.extend((0..16).map(|_| (rng.next_u64() & 0xff) as u8));
                }
            }
        }
        QuantMatrix::new(format, rows, cols, SharedBytes::from_vec(bytes)).unwrap()
    }

    fn random_x(rows: usize, cols: usize, rng: &mut SplitMix64) -> CpuTensor {
        CpuTensor {
            data: (0..rows * cols)
                .map(|_| rng.next_f32() * 4.0 - 2.0)
                .collect(),
            rows,
            cols,
        }
    }

    /// f32 product of `x` with the dequantized weights, the exact answer the kernels
    /// approximate, and for each output the most that rounding the activations (by at most
    /// half a step, `d / 2`, each) can move it.
    fn dequantized_product(x: &CpuTensor, w: &QuantMatrix) -> (Vec<f32>, Vec<f32>) {
        let act = Q8Rows::quantize(x);
        let mut row = vec![0.0; w.cols];
        let mut out = vec![0.0; x.rows * w.rows];
        let mut bound = vec![0.0; x.rows * w.rows];
        for j in 0..w.rows {
            w.dequantize_row(j, &mut row);
            for i in 0..x.rows {
                let at = i * w.rows + j;
                out[at] = x.row(i).iter().zip(&row).map(|(a, b)| a * b).sum();
                bound[at] = row
                    .iter()
                    .enumerate()
                    .map(|(c, v)| v.abs() * act.d[(i * w.cols + c) / BLOCK] / 2.0)
                    .sum::<f32>()
                    + 1e-3;
            }
        }
        (out, bound)
    }

    const FORMATS: [QuantFormat; 3] = [QuantFormat::Q8_0, QuantFormat::Q4_0, QuantFormat::Q4_1];

    #[test]
    fn kernels_agree_with_each_other_and_with_dequantized_f32() {
        let mut rng = SplitMix64::new(11);
        for format in FORMATS {
            // Batch sizes below, at and across the row tile, and a non-multiple of the slab.
            for m in [1, 3, 4, 7, GEMM_ROWS, 33] {
                let w = random_matrix(format, 70, 96, &mut rng);
                let x = random_x(m, 96, &mut rng);
                let (exact, bound) = dequantized_product(&x, &w);
                let portable = matmul(&x, &w, QuantKernel::Portable);
                let auto = matmul(&x, &w, QuantKernel::Auto);
                let outputs = exact.iter().zip(&bound).zip(&portable.data).zip(&auto.data);
                for (((e, bound), p), a) in outputs {
                    if m >= GEMM_ROWS {
                        // The GEMM path multiplies the dequantized weights by x itself.
                        assert!(
                            (e - a).abs() <= 1e-3 * (1.0 + e.abs()),
                            "{format:?} m={m}: {e} vs {a}"
                        );
                    } else {
                        // Both kernels do the same integer sums; only f32 order differs.
                        assert!(
                            (p - a).abs() <= 1e-4 * (1.0 + p.abs()),
                            "{format:?} m={m}: {p} vs {a}"
                        );
                    }
                    assert!(
                        (e - p).abs() <= *bound,
                        "{format:?} m={m}: exact {e}, kernel {p}"
                    );
                }
            }
        }
    }

    /// Every x86 kernel this CPU can run, not just the one `Auto` picks.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn each_simd_kernel_matches_the_portable_one() {
        use std::is_x86_feature_detected as has;
        let mut rng = SplitMix64::new(21);
        let x = random_x(4, 128, &mut rng);
        let act = Q8Rows::quantize(&x);
        let mut checked = 0;
        for format in FORMATS {
            let w = random_matrix(format, 3, 128, &mut rng);
            let row = &w.bytes()[..w.row_bytes()];
            for n in 1..=4 {
                let mut want = [0.0f32; 4];
                dots_generic(format, row, &act, 0..n, &mut want);
                let base = has!("avx2") && has!("fma") && has!("f16c");
                let kernels: [(bool, &str); 2] =
                    [(base, "avx2"), (base && has!("avxvnni"), "vnni")];
                for (available, name) in kernels {
                    if !available {
                        continue;
                    }
                    let mut got = [0.0f32; 4];
                    // SAFETY: the CPU has the kernel's features (checked above).
                    unsafe {
                        match name {
                            "avx2" => avx2::dots(format, row, &act, 0, n, &mut got),
                            _ => vnni::dots(format, row, &act, 0, n, &mut got),
                        }
                    }
                    for (g, w) in got[..n].iter().zip(&want[..n]) {
                        assert!(
                            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                            "{name} {format:?} n={n}: {g} vs {w}"
                        );
                    }
                    checked += 1;
                }
            }
        }
        eprintln!("checked {checked} kernel/format/row-count cases");
    }

    #[test]
    fn many_products_of_one_input_equal_separate_ones() {
        let mut rng = SplitMix64::new(3);
        let ws = [
            random_matrix(QuantFormat::Q4_1, 40, 64, &mut rng),
            random_matrix(QuantFormat::Q8_0, 17, 64, &mut rng),
            random_matrix(QuantFormat::Q4_0, 300, 64, &mut rng),
        ];
        for m in [1, 5, GEMM_ROWS + 1] {
            let x = random_x(m, 64, &mut rng);
            for kernel in [QuantKernel::Auto, QuantKernel::Portable] {
                let many = matmul_many(&x, &[&ws[0], &ws[1], &ws[2]], kernel);
                for (w, got) in ws.iter().zip(&many) {
                    assert_eq!(
                        got,
                        &matmul(&x, w, kernel),
                        "m={m} {kernel:?} {:?}",
                        w.format
                    );
                }
            }
        }
    }

    #[test]
    fn activation_quantization_round_trips_within_half_a_step() {
        let mut rng = SplitMix64::new(5);
        let x = random_x(3, 64, &mut rng);
        let q = Q8Rows::quantize(&x);
        for (b, block) in x.data.chunks(BLOCK).enumerate() {
            let mut sum = 0.0;
            for (i, &v) in block.iter().enumerate() {
                let back = q.d[b] * f32::from(q.qs[b * BLOCK + i]);
                assert!((back - v).abs() <= q.d[b] * 0.5 + 1e-6, "{v} -> {back}");
                sum += f32::from(q.qs[b * BLOCK + i]);
            }
            assert!((q.s[b] - q.d[b] * sum).abs() < 1e-4);
        }
        // An all-zero block has scale 0 and quantizes to zeros, not NaN.
        let z = Q8Rows::quantize(&CpuTensor::zeros(1, 32));
        assert_eq!((z.d[0], z.qs.iter().all(|&q| q == 0)), (0.0, true));
    }

    #[test]
    fn extreme_bytes_do_not_overflow_the_simd_sums() {
        // Every weight at its most negative (-128) against activations at ±127: the largest
        // magnitudes `maddubs` sees.
        let mut bytes = half::f16::from_f32(1.0).to_le_bytes().to_vec();
        bytes.extend([0x80u8; 32]);
        let w = QuantMatrix::new(QuantFormat::Q8_0, 1, 32, SharedBytes::from_vec(bytes)).unwrap();
        let x = CpuTensor {
            data: vec![-1.0; 32],
            rows: 1,
            cols: 32,
        };
        // Σ (−128)·(−1) = 4096, exactly representable through every step.
        let want = 4096.0;
        for kernel in [QuantKernel::Portable, QuantKernel::Auto] {
            let got = matmul(&x, &w, kernel).data[0];
            assert!((got - want).abs() < 1e-3, "{kernel:?}: {got} vs {want}");
        }
    }

    #[test]
    fn reference_quantizers_round_trip_within_a_step() {
        let mut rng = SplitMix64::new(9);
        let x = random_x(3, 64, &mut rng);
        for format in FORMATS {
            let q = QuantMatrix::quantize(format, 3, 64, &x.data);
            let mut row = vec![0.0; 64];
            for r in 0..3 {
                q.dequantize_row(r, &mut row);
                for (block, back) in x.row(r).chunks(BLOCK).zip(row.chunks(BLOCK)) {
                    let (lo, hi) = block
                        .iter()
                        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
                    let step = match format {
                        QuantFormat::Q8_0 => hi.abs().max(lo.abs()) / 127.0,
                        QuantFormat::Q4_0 => hi.abs().max(lo.abs()) / 8.0,
                        QuantFormat::Q4_1 => (hi - lo) / 15.0,
                    };
                    // Half a step of rounding plus the f16 rounding of the scales; Q4_0's grid
                    // ends at +7 steps against -8, so the far end may clamp by a whole step.
                    let allowed = match format {
                        QuantFormat::Q4_0 => step + 0.01,
                        _ => step * 0.5 + 0.01,
                    };
                    for (v, b) in block.iter().zip(back) {
                        assert!((v - b).abs() <= allowed, "{format:?}: {v} -> {b}");
                    }
                }
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        let b = SharedBytes::from_vec(vec![0; 40]);
        assert!(matches!(
            QuantMatrix::new(QuantFormat::Q4_1, 2, 48, b.clone()),
            Err(QuantShapeError::PartialBlock { .. })
        ));
        assert!(matches!(
            QuantMatrix::new(QuantFormat::Q4_1, 3, 32, b.clone()),
            Err(QuantShapeError::Length {
                want: 60,
                got: 40,
                ..
            })
        ));
        assert!(QuantMatrix::new(QuantFormat::Q4_1, 2, 32, b).is_ok());
    }
}
