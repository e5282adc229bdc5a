//! Vector kernels for the CPU backend with a runtime choice of AVX2+FMA.
//!
//! Release binaries target baseline x86-64 so they run on any node; the hot dot products and
//! axpy also exist as AVX2/FMA kernels, picked at run time when the CPU has them. The
//! portable versions are the reference the tests compare against.

/// Σ a[i]·b[i], `b` f32 or f16 (widened exactly).
#[inline(always)]
fn dot_generic<T: Copy>(a: &[f32], b: &[T]) -> f32
where
    f32: From<T>,
{
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // Eight independent accumulators let the compiler keep a full vector register busy.
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for i in 0..8 {
            acc[i] += x[i] * f32::from(y[i]);
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..n {
        s += a[i] * f32::from(b[i]);
    }
    s
}

/// Dot products of four rows with one shared row, reading the shared row once: the inner
/// kernel of skinny matmuls, where the weight row is the expensive operand.
#[inline(always)]
fn dot4_generic(x: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
    let n = w.len();
    let mut acc = [[0.0f32; 8]; 4];
    let chunks = n / 8;
    for c in 0..chunks {
        let wc = &w[c * 8..c * 8 + 8];
        for r in 0..4 {
            let xc = &x[r][c * 8..c * 8 + 8];
            for i in 0..8 {
                acc[r][i] += xc[i] * wc[i];
            }
        }
    }
    let mut out = [0.0f32; 4];
    for r in 0..4 {
        let a = &acc[r];
        let mut s = (a[0] + a[4]) + (a[1] + a[5]) + ((a[2] + a[6]) + (a[3] + a[7]));
        for i in chunks * 8..n {
            s += x[r][i] * w[i];
        }
        out[r] = s;
    }
    out
}

#[inline(always)]
fn axpy_generic<T: Copy>(alpha: f32, x: &[T], y: &mut [f32])
where
    f32: From<T>,
{
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += alpha * f32::from(xi);
    }
}

/// `out[i] = scale · q·rows[i]`, where row `i` starts at `i * stride` in `base`.
#[inline(always)]
fn dots_strided_generic<T: Copy>(q: &[f32], base: &[T], stride: usize, scale: f32, out: &mut [f32])
where
    f32: From<T>,
{
    for (i, o) in out.iter_mut().enumerate() {
        *o = scale * dot_generic(q, &base[i * stride..i * stride + q.len()]);
    }
}

/// `y += Σ p[i] · rows[i]`, where row `i` starts at `i * stride` in `base`.
#[inline(always)]
fn axpy_strided_generic<T: Copy>(p: &[f32], base: &[T], stride: usize, y: &mut [f32])
where
    f32: From<T>,
{
    for (i, &a) in p.iter().enumerate() {
        axpy_generic(a, &base[i * stride..i * stride + y.len()], y);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! Hand-written AVX2/FMA kernels: the generic code does not reliably vectorise into
    //! FMAs with several accumulators, and these loops are most of a decode step.
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps(v, 1);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            _mm_cvtss_f32(s)
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        unsafe {
            let n = a.len().min(b.len());
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for (u, acc) in acc.iter_mut().enumerate() {
                    let o = i + 8 * u;
                    *acc = _mm256_fmadd_ps(
                        _mm256_loadu_ps(pa.add(o)),
                        _mm256_loadu_ps(pb.add(o)),
                        *acc,
                    );
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i)),
                    _mm256_loadu_ps(pb.add(i)),
                    acc[0],
                );
                i += 8;
            }
            let mut s = hsum(_mm256_add_ps(
                _mm256_add_ps(acc[0], acc[1]),
                _mm256_add_ps(acc[2], acc[3]),
            ));
            while i < n {
                s += *pa.add(i) * *pb.add(i);
                i += 1;
            }
            s
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot4(x: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
        unsafe {
            let n = w.len();
            let pw = w.as_ptr();
            let px = [x[0].as_ptr(), x[1].as_ptr(), x[2].as_ptr(), x[3].as_ptr()];
            // Two accumulators per row hide FMA latency; w is loaded once per 8 FMAs.
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            let mut i = 0;
            while i + 16 <= n {
                let w0 = _mm256_loadu_ps(pw.add(i));
                let w1 = _mm256_loadu_ps(pw.add(i + 8));
                for r in 0..4 {
                    acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(px[r].add(i)), w0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(px[r].add(i + 8)), w1, acc[r][1]);
                }
                i += 16;
            }
            let mut out = [0.0f32; 4];
            for r in 0..4 {
                let mut s = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
                for j in i..n {
                    s += *px[r].add(j) * *pw.add(j);
                }
                out[r] = s;
            }
            out
        }
    }

    /// Eight keys or values at `p` as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load_f32(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }

    /// Eight f16 keys or values at `p`, widened to f32 (exactly).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load_f16(p: *const half::f16) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }

    /// The strided attention kernels for one element type of the KV cache.
    macro_rules! strided_kernels {
        ($dots:ident, $axpy:ident, $t:ty, $load:ident) => {
            /// Scores of one query against `out.len()` keys spaced `stride` apart: the inner loop
            /// of paged attention, one call per KV block instead of one per key.
            ///
            /// Four keys at a time, two accumulators each: one key alone is a chain of dependent
            /// FMAs (about 25 cycles for a 64-wide head), four give the FMA units eight independent
            /// chains. Each key's sums and their final reduction happen in the same order as
            /// [`hsum`] of one key, so every score is bit-identical to scoring the keys one by one.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn $dots(
                q: &[f32],
                base: &[$t],
                stride: usize,
                scale: f32,
                out: &mut [f32],
            ) {
                unsafe {
                    let d = q.len();
                    if !d.is_multiple_of(16) || d > 256 {
                        return super::dots_strided_generic(q, base, stride, scale, out);
                    }
                    let pq = q.as_ptr();
                    let pb = base.as_ptr();
                    // The two-accumulator sum of one key, before the horizontal reduction.
                    let key = |row: *const $t| {
                        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                        let mut j = 0;
                        while j < d {
                            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pq.add(j)), $load(row.add(j)), a0);
                            a1 = _mm256_fmadd_ps(
                                _mm256_loadu_ps(pq.add(j + 8)),
                                $load(row.add(j + 8)),
                                a1,
                            );
                            j += 16;
                        }
                        _mm256_add_ps(a0, a1)
                    };
                    let n = out.len();
                    let mut i = 0;
                    while i + 4 <= n {
                        let row = |k: usize| pb.add((i + k) * stride);
                        let (mut a0, mut a1, mut a2, mut a3) = (
                            _mm256_setzero_ps(),
                            _mm256_setzero_ps(),
                            _mm256_setzero_ps(),
                            _mm256_setzero_ps(),
                        );
                        let (mut b0, mut b1, mut b2, mut b3) = (a0, a1, a2, a3);
                        let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
                        let mut j = 0;
                        while j < d {
                            let (qa, qb) =
                                (_mm256_loadu_ps(pq.add(j)), _mm256_loadu_ps(pq.add(j + 8)));
                            a0 = _mm256_fmadd_ps(qa, $load(r0.add(j)), a0);
                            b0 = _mm256_fmadd_ps(qb, $load(r0.add(j + 8)), b0);
                            a1 = _mm256_fmadd_ps(qa, $load(r1.add(j)), a1);
                            b1 = _mm256_fmadd_ps(qb, $load(r1.add(j + 8)), b1);
                            a2 = _mm256_fmadd_ps(qa, $load(r2.add(j)), a2);
                            b2 = _mm256_fmadd_ps(qb, $load(r2.add(j + 8)), b2);
                            a3 = _mm256_fmadd_ps(qa, $load(r3.add(j)), a3);
                            b3 = _mm256_fmadd_ps(qb, $load(r3.add(j + 8)), b3);
                            j += 16;
                        }
                        let [s0, s1, s2, s3] = hsum4([
                            _mm256_add_ps(a0, b0),
                            _mm256_add_ps(a1, b1),
                            _mm256_add_ps(a2, b2),
                            _mm256_add_ps(a3, b3),
                        ]);
                        *out.get_unchecked_mut(i) = scale * s0;
                        *out.get_unchecked_mut(i + 1) = scale * s1;
                        *out.get_unchecked_mut(i + 2) = scale * s2;
                        *out.get_unchecked_mut(i + 3) = scale * s3;
                        i += 4;
                    }
                    while i < n {
                        *out.get_unchecked_mut(i) = scale * hsum(key(pb.add(i * stride)));
                        i += 1;
                    }
                }
            }

            /// `y += Σ p[i] · rows[i]` with `y` held in registers across the rows (head sizes up to
            /// 128 in multiples of 8; others take the portable loop).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn $axpy(p: &[f32], base: &[$t], stride: usize, y: &mut [f32]) {
                unsafe {
                    let d = y.len();
                    if !d.is_multiple_of(8) || d > 128 {
                        return super::axpy_strided_generic(p, base, stride, y);
                    }
                    let lanes = d / 8;
                    let py = y.as_mut_ptr();
                    let mut acc = [_mm256_setzero_ps(); 16];
                    for (l, a) in acc.iter_mut().enumerate().take(lanes) {
                        *a = _mm256_loadu_ps(py.add(l * 8));
                    }
                    let pb = base.as_ptr();
                    for (i, &w) in p.iter().enumerate() {
                        let row = pb.add(i * stride);
                        let wv = _mm256_set1_ps(w);
                        for (l, a) in acc.iter_mut().enumerate().take(lanes) {
                            *a = _mm256_fmadd_ps($load(row.add(l * 8)), wv, *a);
                        }
                    }
                    for (l, a) in acc.iter().enumerate().take(lanes) {
                        _mm256_storeu_ps(py.add(l * 8), *a);
                    }
                }
            }
        };
    }

    strided_kernels!(dots_strided, axpy_strided, f32, load_f32);
    strided_kernels!(dots_strided_f16, axpy_strided_f16, half::f16, load_f16);

    /// [`hsum`] of four vectors at once, with the same additions in the same order for each:
    /// high half onto low half, then lanes 2 and 3 onto 0 and 1, then lane 1 onto lane 0.
    #[inline(always)]
    unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
        unsafe {
            // [A.lo + A.hi, B.lo + B.hi] and [C.lo + C.hi, D.lo + D.hi].
            let x = _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(v[0], v[1]),
                _mm256_permute2f128_ps::<0x31>(v[0], v[1]),
            );
            let y = _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(v[2], v[3]),
                _mm256_permute2f128_ps::<0x31>(v[2], v[3]),
            );
            // Per 128-bit half: [s0 + s2, s1 + s3] of x's key, then of y's key.
            let t = _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
                _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
            );
            // (s0 + s2) + (s1 + s3): lanes 0, 1, 4, 5 hold keys A, C, B, D.
            let u = _mm256_add_ps(
                _mm256_shuffle_ps::<0b10_00_10_00>(t, t),
                _mm256_shuffle_ps::<0b11_01_11_01>(t, t),
            );
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), u);
            [lanes[0], lanes[4], lanes[1], lanes[5]]
        }
    }

    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        unsafe {
            let n = x.len().min(y.len());
            let (px, py) = (x.as_ptr(), y.as_mut_ptr());
            let a = _mm256_set1_ps(alpha);
            let mut i = 0;
            while i + 8 <= n {
                let v = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i)), a, _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), v);
                i += 8;
            }
            while i < n {
                *py.add(i) += alpha * *px.add(i);
                i += 1;
            }
        }
    }

    /// e^x in each lane by [`super::exp`]'s steps, with FMAs.
    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        use super::exp_consts as c;
        unsafe {
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::LN2_HI), x);
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::LN2_LO), r);
            let mut p = _mm256_set1_ps(c::P[0]);
            for &k in &c::P[1..] {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k));
            }
            let e = _mm256_fmadd_ps(
                _mm256_mul_ps(p, r),
                r,
                _mm256_add_ps(r, _mm256_set1_ps(1.0)),
            );
            // 2ⁿ, built in the exponent field; lanes below the smallest normal result are 0.
            let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            )));
            let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(c::LOWEST));
            _mm256_and_ps(_mm256_mul_ps(e, two_n), keep)
        }
    }

    /// [`super::softmax`] with eight lanes: the maximum, e^(s − max) and their sum, then
    /// the scaling.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax(s: &mut [f32]) {
        unsafe {
            let n = s.len();
            let p = s.as_mut_ptr();
            let full = n / 8 * 8;
            // The tail padded with −∞: its lanes add nothing to the maximum or the sum.
            let mut tail = [f32::NEG_INFINITY; 8];
            tail[..n - full].copy_from_slice(&s[full..]);
            let mut m = _mm256_loadu_ps(tail.as_ptr());
            let mut i = 0;
            while i < full {
                m = _mm256_max_ps(m, _mm256_loadu_ps(p.add(i)));
                i += 8;
            }
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
            let max = _mm256_set1_ps(_mm_cvtss_f32(m));
            let mut sum = _mm256_setzero_ps();
            i = 0;
            while i < full {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), max));
                _mm256_storeu_ps(p.add(i), e);
                sum = _mm256_add_ps(sum, e);
                i += 8;
            }
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), max));
            _mm256_storeu_ps(tail.as_mut_ptr(), e);
            sum = _mm256_add_ps(sum, e);
            let inv = _mm256_set1_ps(1.0 / hsum(sum));
            i = 0;
            while i < full {
                _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv));
                i += 8;
            }
            let inv = _mm256_cvtss_f32(inv);
            for (d, e) in s[full..].iter_mut().zip(tail) {
                *d = e * inv;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// The strided kernels also widen f16 with F16C (every AVX2 CPU has it; checked anyway).
#[cfg(target_arch = "x86_64")]
fn has_strided_simd() -> bool {
    has_avx2_fma() && std::is_x86_feature_detected!("f16c")
}

/// Σ a[i]·b[i] over the shorter length.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { avx2::dot(a, b) };
    }
    dot_generic(a, b)
}

/// `[dot(x[0], w), …, dot(x[3], w)]`; every `x[r]` must be at least as long as `w`.
#[inline]
pub fn dot4(x: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
    assert!(x.iter().all(|r| r.len() >= w.len()));
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { avx2::dot4(x, w) };
    }
    dot4_generic(x, w)
}

/// The constants of [`exp`]: ln 2 split in two so that `x − n·ln 2` is exact to f32's
/// precision, and the coefficients (highest degree first) of a polynomial `P` with
/// `e^r ≈ 1 + r + r²·P(r)` on |r| ≤ ln 2 / 2 (Cephes' `expf` minimax fit).
mod exp_consts {
    pub const LN2_HI: f32 = 355.0 / 512.0;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    #[allow(clippy::excessive_precision)] // the fit's digits, as published
    pub const P: [f32; 6] = [
        1.987_569_150_0e-4,
        1.398_199_950_7e-3,
        8.333_451_907_3e-3,
        4.166_579_589_4e-2,
        1.666_666_545_9e-1,
        5.000_000_120_1e-1,
    ];
    /// Below this, e^x is under f32's smallest normal number and taken as 0.
    pub const LOWEST: f32 = -87.33;
}

/// e^x for x ≤ 0 (what [`softmax`] passes), to within about 2 ulp for normal results and 0
/// below [`exp_consts::LOWEST`] (and for −∞): `x = n·ln 2 + r`, `e^x = 2ⁿ·e^r`, e^r by a
/// polynomial. Attention's softmax calls it once per score; a libm call per element was
/// a fifth of a 2,048-token prefill.
#[inline(always)]
fn exp(x: f32) -> f32 {
    use exp_consts as c;
    if x.is_nan() {
        return x;
    }
    if x < c::LOWEST {
        return 0.0;
    }
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - n * c::LN2_HI - n * c::LN2_LO;
    let p = c::P[1..].iter().fold(c::P[0], |p, &k| p * r + k);
    let e = p * r * r + (r + 1.0);
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `s` ← softmax(`s`) in place: e^(sᵢ − max) / Σ. The exponential is [`exp`]'s.
#[inline]
pub fn softmax(s: &mut [f32]) {
    if s.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { avx2::softmax(s) };
    }
    softmax_generic(s)
}

fn softmax_generic(s: &mut [f32]) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in s.iter_mut() {
        *v = exp(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in s.iter_mut() {
        *v *= inv;
    }
}

/// An element type of the KV cache the strided attention kernels read: f32 or f16.
pub trait KvElement: Copy + Send + Sync + 'static
where
    f32: From<Self>,
{
    /// The AVX2 kernels for this type.
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn dots_avx2(q: &[f32], base: &[Self], stride: usize, scale: f32, out: &mut [f32]);
    /// See [`KvElement::dots_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn axpy_avx2(p: &[f32], base: &[Self], stride: usize, y: &mut [f32]);
    /// `dst` ← `src` as f32 (exact); the two are as long.
    fn widen(src: &[Self], dst: &mut [f32]);
}

impl KvElement for f32 {
    #[cfg(target_arch = "x86_64")]
    unsafe fn dots_avx2(q: &[f32], base: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
        // SAFETY: forwarded from the caller.
        unsafe { avx2::dots_strided(q, base, stride, scale, out) }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn axpy_avx2(p: &[f32], base: &[f32], stride: usize, y: &mut [f32]) {
        // SAFETY: forwarded from the caller.
        unsafe { avx2::axpy_strided(p, base, stride, y) }
    }
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl KvElement for half::f16 {
    #[cfg(target_arch = "x86_64")]
    unsafe fn dots_avx2(q: &[f32], base: &[half::f16], stride: usize, scale: f32, out: &mut [f32]) {
        // SAFETY: forwarded from the caller.
        unsafe { avx2::dots_strided_f16(q, base, stride, scale, out) }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn axpy_avx2(p: &[f32], base: &[half::f16], stride: usize, y: &mut [f32]) {
        // SAFETY: forwarded from the caller.
        unsafe { avx2::axpy_strided_f16(p, base, stride, y) }
    }
    fn widen(src: &[half::f16], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
}

/// `out[i] = scale · dot(q, base[i·stride ..][..q.len()])` for every `i < out.len()`, the
/// keys f32 or f16.
///
/// # Panics
/// If `base` is shorter than the last row needs.
#[inline]
pub fn dots_strided<T: KvElement>(q: &[f32], base: &[T], stride: usize, scale: f32, out: &mut [f32])
where
    f32: From<T>,
{
    if out.is_empty() {
        return;
    }
    assert!(
        base.len() >= (out.len() - 1) * stride + q.len(),
        "dots_strided: base too short"
    );
    #[cfg(target_arch = "x86_64")]
    if has_strided_simd() {
        // SAFETY: the CPU supports the features; every row read is inside `base` (checked).
        return unsafe { T::dots_avx2(q, base, stride, scale, out) };
    }
    dots_strided_generic(q, base, stride, scale, out)
}

/// `y += Σᵢ p[i] · base[i·stride ..][..y.len()]`, the values f32 or f16.
///
/// # Panics
/// If `base` is shorter than the last row needs.
#[inline]
pub fn axpy_strided<T: KvElement>(p: &[f32], base: &[T], stride: usize, y: &mut [f32])
where
    f32: From<T>,
{
    if p.is_empty() {
        return;
    }
    assert!(
        base.len() >= (p.len() - 1) * stride + y.len(),
        "axpy_strided: base too short"
    );
    #[cfg(target_arch = "x86_64")]
    if has_strided_simd() {
        // SAFETY: the CPU supports the features; every row read is inside `base` (checked).
        return unsafe { T::axpy_avx2(p, base, stride, y) };
    }
    axpy_strided_generic(p, base, stride, y)
}

/// y[i] += alpha · x[i] (the strided form is what attention uses).
#[cfg(test)]
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports the features the function was compiled for.
        return unsafe { avx2::axpy(alpha, x, y) };
    }
    axpy_generic(alpha, x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within `ulps` units in the last place of f32 of `want` (computed in f64).
    fn close(got: f32, want: f64, ulps: f64) -> bool {
        let ulp = (want.abs() as f32).max(f32::MIN_POSITIVE);
        let ulp = f64::from(f32::from_bits(ulp.to_bits() + 1) - ulp);
        (f64::from(got) - want).abs() <= ulps * ulp
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value() {
        let mut worst = 0.0f64;
        for i in 0..=87_000 {
            let x = -(i as f32) * 1e-3 - (i % 7) as f32 * 1.3e-4;
            let want = f64::from(x).exp();
            let got = exp(x);
            assert!(close(got, want, 2.0), "e^{x}: {got} vs {want}");
            worst = worst.max((f64::from(got) - want).abs() / want);
        }
        assert!(worst > 0.0, "the test compares something");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn softmax_matches_the_exact_one_on_every_path() {
        for n in [1usize, 2, 7, 8, 9, 16, 31, 100, 1000] {
            let s: Vec<f32> = (0..n)
                .map(|i| (i as f32 * 0.917).sin() * 40.0 - (i % 5) as f32 * 9.0)
                .collect();
            // sᵢ − max rounded to f32 as every f32 softmax rounds it; the rest exact.
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f64> = s.iter().map(|&v| f64::from(v - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            let mut generic = s.clone();
            softmax_generic(&mut generic);
            let mut auto = s.clone();
            softmax(&mut auto);
            for (i, w) in e.iter().enumerate() {
                let want = w / sum;
                for (path, got) in [("portable", generic[i]), ("auto", auto[i])] {
                    assert!(
                        (f64::from(got) - want).abs() <= 6e-7 * want + 1e-30,
                        "{path}, n={n}, element {i}: {got} vs {want}"
                    );
                }
            }
        }
        let mut empty: [f32; 0] = [];
        softmax(&mut empty);
    }

    #[test]
    fn dot_and_axpy_match_scalar_loops() {
        for n in [0usize, 1, 7, 8, 9, 33, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).cos()).collect();
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - want).abs() < 1e-4, "n={n}");
            let c: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
            let d4 = dot4([&a, &b, &c, &a], &b);
            let want4 = [want, dot(&b, &b), dot(&c, &b), want];
            for (g, w) in d4.iter().zip(want4) {
                assert!((g - w).abs() < 1e-4, "n={n}");
            }
            let mut y = b.clone();
            axpy(0.5, &a, &mut y);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
    }

    /// Four keys at a time must score exactly as one key at a time (bit for bit), for every
    /// count of keys around the group of four.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn grouped_scores_equal_one_by_one_scores() {
        if !has_avx2_fma() {
            eprintln!("no AVX2/FMA: nothing to compare");
            return;
        }
        for d in [16usize, 64, 128] {
            let stride = 3 * d + 5;
            let rows = 11;
            let base: Vec<f32> = (0..rows * stride)
                .map(|i| (i as f32 * 0.731).sin() * 3.0)
                .collect();
            let q: Vec<f32> = (0..d).map(|i| (i as f32 * 0.173).cos()).collect();
            for n in 1..=rows {
                let mut grouped = vec![0.0; n];
                dots_strided(&q, &base, stride, 0.125, &mut grouped);
                for (i, g) in grouped.iter().enumerate() {
                    let mut one = [0.0];
                    dots_strided(&q, &base[i * stride..], stride, 0.125, &mut one);
                    assert_eq!(g.to_bits(), one[0].to_bits(), "d={d} n={n} key {i}");
                }
            }
        }
    }

    #[test]
    fn strided_kernels_match_their_portable_versions() {
        // Head sizes the fast paths take (64, 128) and ones they hand back (24, 100).
        for d in [24usize, 64, 100, 128] {
            let stride = 3 * d + 5;
            let rows = 7;
            let base: Vec<f32> = (0..rows * stride)
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let q: Vec<f32> = (0..d).map(|i| (i as f32 * 0.11).cos()).collect();
            let (mut got, mut want) = (vec![0.0; rows], vec![0.0; rows]);
            dots_strided(&q, &base, stride, 0.5, &mut got);
            dots_strided_generic(&q, &base, stride, 0.5, &mut want);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-4, "d={d}: {g} vs {w}");
            }
            let p: Vec<f32> = (0..rows).map(|i| 0.1 * i as f32 - 0.2).collect();
            let (mut y, mut y_ref) = (q.clone(), q.clone());
            axpy_strided(&p, &base, stride, &mut y);
            axpy_strided_generic(&p, &base, stride, &mut y_ref);
            for (g, w) in y.iter().zip(&y_ref) {
                assert!((g - w).abs() < 1e-5, "d={d}: {g} vs {w}");
            }
            // The same through an f16 copy of the rows, against the portable loop over it
            // and against the f32 kernel over the widened values.
            let half: Vec<half::f16> = base.iter().map(|&v| half::f16::from_f32(v)).collect();
            let wide: Vec<f32> = half.iter().map(|v| v.to_f32()).collect();
            let (mut got, mut want, mut f32s) = (vec![0.0; rows], vec![0.0; rows], vec![0.0; rows]);
            dots_strided(&q, &half, stride, 0.5, &mut got);
            dots_strided_generic(&q, &half, stride, 0.5, &mut want);
            dots_strided(&q, &wide, stride, 0.5, &mut f32s);
            for ((g, w), f) in got.iter().zip(&want).zip(&f32s) {
                assert!((g - w).abs() < 1e-4, "f16 d={d}: {g} vs {w}");
                assert_eq!(g.to_bits(), f.to_bits(), "f16 d={d}: widening is exact");
            }
            let (mut y, mut y_ref) = (q.clone(), q.clone());
            axpy_strided(&p, &half, stride, &mut y);
            axpy_strided_generic(&p, &half, stride, &mut y_ref);
            for (g, w) in y.iter().zip(&y_ref) {
                assert!((g - w).abs() < 1e-5, "f16 d={d}: {g} vs {w}");
            }
        }
    }
}
