//! Row-layout SIMD kernels (AVX2, AVX-VNNI) for Q5_0, Q5_1, Q4_K, Q5_K and Q6_K: the file's
//! blocks read in place, as the parent module's kernels read Q8_0/Q4_0/Q4_1.
//!
//! The structure is theirs: a tile of up to four weight rows against up to four activation
//! rows, activation blocks eight at a time with their scales multiplied as vectors kept in
//! registers, one unsigned-by-signed byte dot per 32 elements, one FMA per block and
//! activation row, and a prefetch 4 KiB ahead. What differs is how a block's 32 quants
//! unpack, and where its scales come from:
//!
//! - Q5_0, Q5_1: the nibbles as Q4's (a broadcast load, a per-lane shift, a mask), and the
//!   fifth bits spread from their u32 to bit 4 of each byte (a byte shuffle, a mask, a
//!   compare). Scales and minima of eight blocks come as Q4_1's do; Q5_0's minimum term is
//!   `−16·d`.
//! - Q4_K, Q5_K: eight activation blocks are exactly one super-block. Its f16 `d` and `dmin`
//!   times the eight 6-bit scales and minima make the eight block scales and the minimum term
//!   (one FMA per super-block); a sub-block's 32 nibbles are one load, a mask (and a shift for
//!   the odd sub-block of a pair); Q5_K's fifth bits are one shift and a mask of a vector
//!   loaded once per super-block.
//! - Q6_K: the quants are offset by 32 and each half of a sub-block has its own i8 scale, so
//!   the quants are made signed (`q − 32`), multiplied as Q8_0's are (the magnitude times the
//!   activation with the weight's sign), and the eight sums of four products are multiplied
//!   by their halves' scales in integers before the block's one f32 FMA.

use super::QuantFormat;

/// Format tags for the kernels' `tile`.
const Q5_0: u8 = 0;
const Q5_1: u8 = 1;
const Q4_K: u8 = 2;
const Q5_K: u8 = 3;
const Q6_K: u8 = 4;

/// Whether this module has kernels for `format`.
#[allow(dead_code)] // not on targets without these kernels
pub(super) fn handles(format: QuantFormat) -> bool {
    tag(format).is_some()
}

fn tag(format: QuantFormat) -> Option<u8> {
    Some(match format {
        QuantFormat::Q5_0 => Q5_0,
        QuantFormat::Q5_1 => Q5_1,
        QuantFormat::Q4_K => Q4_K,
        QuantFormat::Q5_K => Q5_K,
        QuantFormat::Q6_K => Q6_K,
        _ => return None,
    })
}

/// Kernels for one x86 feature set: `$features` for `#[target_feature]`, `$udot` for the
/// unsigned-by-signed byte dot (the parent module's macros).
#[cfg(target_arch = "x86_64")]
macro_rules! rows_k_kernels {
    ($module:ident, $features:literal, $udot:ident, $doc:literal) => {
        #[doc = $doc]
        #[allow(clippy::needless_range_loop)] // row indexes address several arrays and pointers
        pub(super) mod $module {
            use super::super::{BLOCK, PREFETCH_BYTES, Q8Rows, QuantMatrix};
            use super::{Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, tag};
            use crate::compute::backend::quant::k_scale_min;
            use std::arch::x86_64::*;
            use std::ops::Range;

            /// Like the parent module's `dots`: weight rows `rows` of `w` against activation
            /// rows `r0..r0 + n` (n ≤ 4) of `x`; `out[r * rows.len() + i]` is activation row
            /// `r0 + r` with weight row `rows.start + i`.
            ///
            /// # Safety
            /// The CPU must support the module's features; `w` is in a format this module
            /// handles, with `x.cols` columns and rows `rows`; rows `r0..r0 + n` exist in `x`.
            #[target_feature(enable = $features)]
            pub unsafe fn dots(
                w: &QuantMatrix,
                rows: Range<usize>,
                x: &Q8Rows,
                r0: usize,
                n: usize,
                out: &mut [f32],
            ) {
                let f = tag(w.format).expect("a format of this module");
                let rb = w.row_bytes();
                debug_assert!((1..=4).contains(&n));
                debug_assert_eq!(w.cols, x.cols);
                debug_assert!(w.bytes().len() >= rows.end * rb);
                debug_assert!((r0 + n) * x.cols <= x.qs.len());
                debug_assert!(out.len() >= n * rows.len());
                let k = Kernel {
                    w: w.bytes().as_ptr(),
                    rb,
                    bb: w.format.block_bytes(),
                    x,
                    r0,
                };
                // SAFETY: forwarded from the caller.
                unsafe {
                    macro_rules! by_rows {
                        ($f:ident) => {
                            match n {
                                1 => k.sweep::<4, 1, $f>(rows, out),
                                2 => k.sweep::<2, 2, $f>(rows, out),
                                3 => k.sweep::<2, 3, $f>(rows, out),
                                _ => k.sweep::<1, 4, $f>(rows, out),
                            }
                        };
                    }
                    match f {
                        Q5_0 => by_rows!(Q5_0),
                        Q5_1 => by_rows!(Q5_1),
                        Q4_K => by_rows!(Q4_K),
                        Q5_K => by_rows!(Q5_K),
                        _ => by_rows!(Q6_K),
                    }
                }
            }

            /// One weight matrix and one set of quantized activations.
            struct Kernel<'a> {
                w: *const u8,
                rb: usize,
                bb: usize,
                x: &'a Q8Rows,
                r0: usize,
            }

            #[inline(always)]
            unsafe fn hsum(v: __m256) -> f32 {
                unsafe {
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
                }
            }

            /// The f16 at `p` as f32.
            #[inline(always)]
            unsafe fn f16_at(p: *const u8) -> f32 {
                unsafe {
                    let bits = std::ptr::read_unaligned(p as *const u16);
                    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
                }
            }

            /// Lane mask for the first `n` (≤ 8) of eight lanes.
            #[inline(always)]
            unsafe fn first_lanes(n: usize) -> __m256i {
                unsafe {
                    _mm256_cmpgt_epi32(
                        _mm256_set1_epi32(n as i32),
                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                    )
                }
            }

            /// Bit `i` of `bits` as bit 4 of byte `i`, for 32 bytes.
            #[inline(always)]
            unsafe fn fifth_bits(bits: u32) -> __m256i {
                unsafe {
                    let spread = _mm256_shuffle_epi8(
                        _mm256_set1_epi32(bits as i32),
                        _mm256_setr_epi8(
                            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                            3, 3, 3, 3, 3, 3, 3, 3,
                        ),
                    );
                    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                }
            }

            /// The 16 nibbles at `p` as 32 bytes: low nibbles (elements 0–15), then high.
            #[inline(always)]
            unsafe fn nibbles16(p: *const u8) -> __m256i {
                unsafe {
                    let raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
                    let shifts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
                    _mm256_and_si256(_mm256_srlv_epi32(raw, shifts), _mm256_set1_epi8(0x0f))
                }
            }

            /// The low (`high == false`) or high nibbles of the 32 bytes at `p`.
            #[inline(always)]
            unsafe fn nibbles32(p: *const u8, high: bool) -> __m256i {
                unsafe {
                    let v = _mm256_loadu_si256(p as *const __m256i);
                    let v = if high { _mm256_srli_epi16::<4>(v) } else { v };
                    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
                }
            }

            /// Bits `at, at + 1, …` (`width` of them, at most 4 from `at ≤ 6`) of each byte of
            /// `v`, moved to bit 4 on, masked by `mask`.
            #[inline(always)]
            unsafe fn bits_to_4(v: __m256i, at: i32, mask: i8) -> __m256i {
                unsafe {
                    let v = if at <= 4 {
                        _mm256_sll_epi16(v, _mm_cvtsi32_si128(4 - at))
                    } else {
                        _mm256_srl_epi16(v, _mm_cvtsi32_si128(at - 4))
                    };
                    _mm256_and_si256(v, _mm256_set1_epi8(mask))
                }
            }

            impl Kernel<'_> {
                /// Every weight row of `rows` against `R` activation rows, `W` weight rows per
                /// tile, the remainder one by one.
                #[inline(always)]
                unsafe fn sweep<const W: usize, const R: usize, const F: u8>(
                    &self,
                    rows: Range<usize>,
                    out: &mut [f32],
                ) {
                    unsafe {
                        let len = rows.len();
                        let mut j = rows.start;
                        while j < rows.end {
                            if j + W <= rows.end {
                                let t = self.tile::<W, R, F>(j);
                                for (i, t) in t.iter().enumerate() {
                                    for (r, v) in t.iter().enumerate() {
                                        out[r * len + j - rows.start + i] = *v;
                                    }
                                }
                                j += W;
                            } else {
                                let [t] = self.tile::<1, R, F>(j);
                                for (r, v) in t.iter().enumerate() {
                                    out[r * len + j - rows.start] = *v;
                                }
                                j += 1;
                            }
                        }
                    }
                }

                /// Weight rows `j..j + W` against `R` activation rows: `[weight row][act row]`.
                #[inline(always)]
                unsafe fn tile<const W: usize, const R: usize, const F: u8>(
                    &self,
                    j: usize,
                ) -> [[f32; R]; W] {
                    unsafe {
                        let x = self.x;
                        let nb = x.cols / BLOCK;
                        let k_quant = F == Q4_K || F == Q5_K || F == Q6_K;
                        let wp = self.w.add(j * self.rb);
                        let xq = x.qs.as_ptr().add(self.r0 * x.cols);
                        let xd = x.d.as_ptr().add(self.r0 * nb);
                        let xs = x.s.as_ptr().add(self.r0 * nb);
                        let mut acc = [[_mm256_setzero_ps(); R]; W];
                        let mut scale = [[_mm256_setzero_ps(); R]; W];
                        // Q5_K's fifth bits of the super-block, per weight row.
                        let mut qh5 = [_mm256_setzero_si256(); W];
                        let mut b = 0;
                        while b < nb {
                            // A k-quant row is whole super-blocks: always eight blocks here.
                            let n = (nb - b).min(8);
                            let lanes = first_lanes(n);
                            for wi in 0..W {
                                // Per-block f32 scales `d` (without the activations') and
                                // minima `m` (the term m·s), eight lanes.
                                let (d, m) = if k_quant {
                                    let sb = wp.add(wi * self.rb + (b / 8) * self.bb);
                                    if F == Q6_K {
                                        (_mm256_set1_ps(f16_at(sb.add(208))), None)
                                    } else {
                                        let (mut sc, mut mn) = ([0f32; 8], [0f32; 8]);
                                        let packed = std::slice::from_raw_parts(sb.add(4), 12);
                                        for i in 0..8 {
                                            let (s, m) = k_scale_min(packed, i);
                                            sc[i] = f32::from(s);
                                            mn[i] = f32::from(m);
                                        }
                                        if F == Q5_K {
                                            qh5[wi] =
                                                _mm256_loadu_si256(sb.add(16) as *const __m256i);
                                        }
                                        let d = _mm256_set1_ps(f16_at(sb));
                                        let dmin = _mm256_set1_ps(-f16_at(sb.add(2)));
                                        (
                                            _mm256_mul_ps(d, _mm256_loadu_ps(sc.as_ptr())),
                                            Some(_mm256_mul_ps(dmin, _mm256_loadu_ps(mn.as_ptr()))),
                                        )
                                    }
                                } else {
                                    let p = wp.add(wi * self.rb + b * self.bb);
                                    let (d, m) = scales8(p, self.bb, n);
                                    let m = if F == Q5_1 {
                                        m
                                    } else {
                                        _mm256_mul_ps(d, _mm256_set1_ps(-16.0))
                                    };
                                    (d, Some(m))
                                };
                                for r in 0..R {
                                    let at = r * nb + b;
                                    let dx = _mm256_maskload_ps(xd.add(at), lanes);
                                    scale[wi][r] = _mm256_mul_ps(d, dx);
                                    if let Some(m) = m {
                                        let sx = _mm256_maskload_ps(xs.add(at), lanes);
                                        acc[wi][r] = _mm256_fmadd_ps(m, sx, acc[wi][r]);
                                    }
                                }
                            }
                            for i in 0..n {
                                let blk = b + i;
                                let lane = _mm256_set1_epi32(i as i32);
                                for wi in 0..W {
                                    let row = wp.add(wi * self.rb);
                                    let (wv, isc) = match F {
                                        Q5_0 | Q5_1 => {
                                            let p = row.add(blk * self.bb);
                                            let (qh, qs) = if F == Q5_0 { (2, 6) } else { (4, 8) };
                                            _mm_prefetch::<_MM_HINT_T0>(
                                                p.wrapping_add(PREFETCH_BYTES) as *const i8,
                                            );
                                            let bits =
                                                std::ptr::read_unaligned(p.add(qh) as *const u32);
                                            let v = _mm256_or_si256(
                                                nibbles16(p.add(qs)),
                                                fifth_bits(bits),
                                            );
                                            (v, None)
                                        }
                                        Q4_K | Q5_K => {
                                            let sb = row.add((blk / 8) * self.bb);
                                            let qs = if F == Q4_K { 16 } else { 48 };
                                            let p = sb.add(qs + 32 * (i / 2));
                                            _mm_prefetch::<_MM_HINT_T0>(
                                                p.wrapping_add(PREFETCH_BYTES) as *const i8,
                                            );
                                            let mut v = nibbles32(p, i % 2 == 1);
                                            if F == Q5_K {
                                                v = _mm256_or_si256(
                                                    v,
                                                    bits_to_4(qh5[wi], i as i32, 0x10),
                                                );
                                            }
                                            (v, None)
                                        }
                                        _ => {
                                            let sb = row.add((blk / 8) * self.bb);
                                            let (h, t) = (i / 4, i % 4);
                                            let p = sb.add(64 * h + 32 * (t % 2));
                                            _mm_prefetch::<_MM_HINT_T0>(
                                                p.wrapping_add(PREFETCH_BYTES) as *const i8,
                                            );
                                            let low = nibbles32(p, t >= 2);
                                            let qh = _mm256_loadu_si256(
                                                sb.add(128 + 32 * h) as *const __m256i
                                            );
                                            let q = _mm256_or_si256(
                                                low,
                                                bits_to_4(qh, 2 * t as i32, 0x30),
                                            );
                                            let v = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
                                            // The halves' i8 scales, each over four lanes.
                                            let sc = sb.add(192 + 2 * i);
                                            let (lo, hi) = (*sc as i8, *sc.add(1) as i8);
                                            let isc = _mm256_setr_epi32(
                                                lo.into(),
                                                lo.into(),
                                                lo.into(),
                                                lo.into(),
                                                hi.into(),
                                                hi.into(),
                                                hi.into(),
                                                hi.into(),
                                            );
                                            (v, Some(isc))
                                        }
                                    };
                                    for r in 0..R {
                                        let xv = _mm256_loadu_si256(
                                            xq.add(r * x.cols + blk * BLOCK) as *const __m256i,
                                        );
                                        let prod = match isc {
                                            // Signed quants: |w| times x with w's sign.
                                            Some(isc) => _mm256_mullo_epi32(
                                                $udot!(
                                                    _mm256_sign_epi8(wv, wv),
                                                    _mm256_sign_epi8(xv, wv)
                                                ),
                                                isc,
                                            ),
                                            None => $udot!(wv, xv),
                                        };
                                        let s = _mm256_permutevar8x32_ps(scale[wi][r], lane);
                                        acc[wi][r] = _mm256_fmadd_ps(
                                            _mm256_cvtepi32_ps(prod),
                                            s,
                                            acc[wi][r],
                                        );
                                    }
                                }
                            }
                            b += n;
                        }
                        let mut res = [[0.0f32; R]; W];
                        for wi in 0..W {
                            for r in 0..R {
                                res[wi][r] = hsum(acc[wi][r]);
                            }
                        }
                        res
                    }
                }
            }

            /// The f16 scales (and, for Q5_1, minima) of the first `n` (≤ 8) of eight blocks
            /// `stride` bytes apart from `p`, as f32; lanes from `n` on are zero.
            #[inline(always)]
            unsafe fn scales8(p: *const u8, stride: usize, n: usize) -> (__m256, __m256) {
                unsafe {
                    let at = |i: usize| {
                        if i < n {
                            std::ptr::read_unaligned(p.add(i * stride) as *const i32)
                        } else {
                            0
                        }
                    };
                    let g =
                        _mm256_setr_epi32(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7));
                    let split = _mm256_setr_epi8(
                        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                        13, 2, 3, 6, 7, 10, 11, 14, 15,
                    );
                    let halves =
                        _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(g, split));
                    (
                        _mm256_cvtph_ps(_mm256_castsi256_si128(halves)),
                        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(halves)),
                    )
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
rows_k_kernels!(
    avx2,
    "avx2,fma,f16c",
    udot_avx2,
    "Q5 and k-quant block dots with AVX2: `maddubs` + `madd` per byte product."
);
#[cfg(target_arch = "x86_64")]
rows_k_kernels!(
    vnni,
    "avx2,fma,f16c,avxvnni",
    udot_vnni,
    "Q5 and k-quant block dots with AVX-VNNI: one `vpdpbusd` per byte product."
);
