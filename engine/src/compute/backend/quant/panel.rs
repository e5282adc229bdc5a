//! Quantized weights repacked sixteen rows at a time ("panels") for an AVX-512 VNNI kernel
//! whose integer dot products fill all sixteen lanes with useful sums.
//!
//! The row layout of the model file makes the kernels in the parent module compute one block
//! product per vector instruction and then pay for the block's scale with a convert, a lane
//! permute and an FMA: about as many instructions again as the product, and the same again
//! for every activation row. In a panel, the four bytes each of sixteen weight rows that meet
//! the same four activation bytes sit side by side in one 64-byte vector, so one `vpdpbusd`
//! against those four activation bytes, broadcast, adds four products to each of sixteen
//! output sums. Eight of them finish a block for sixteen outputs; its scales then cost one
//! convert, one multiply and one FMA per sixteen outputs instead of per output.
//!
//! A panel holds, for its sixteen rows (the last panel padded with zero scales):
//!
//! - the quants of every block, block after block. Q4: four 64-byte vectors per block; byte
//!   `4c + t` of vector `h` is byte `4h + t` of row `c`'s nibbles, so its low nibble is
//!   element `4h + t` and its high nibble element `16 + 4h + t`: unpacking is a mask and a
//!   shift. Q8: eight vectors per block; byte `4c + t` of vector `g` is element `4g + t` of
//!   row `c` plus 128 (`vpdpbusd` multiplies unsigned weight bytes by signed activations).
//! - the sixteen f16 scales of every block, then (Q4_1) the sixteen f16 minima.
//!
//! Bits per weight are the file's (Q8_0 8.5, Q4_0 4.5, Q4_1 5): a decode step streams no more
//! than before. The offsets the unsigned bytes carry (8 for Q4_0, 128 for Q8_0) are taken out
//! exactly, in integers, by starting each block's sum at `−offset · Σx`.

use std::ops::Range;

use super::{BLOCK, OutPtr, Q8Rows, QuantFormat, QuantMatrix, f16_at};

/// Weight rows per panel: one per i32 lane of a 512-bit vector.
pub const LANES: usize = 16;

/// Activation rows one pass of the kernel keeps in registers at most.
const MAX_TILE_ROWS: usize = 8;

/// Activation rows whose tiles run against one slab of panels before the next rows come, so
/// the slab's weights are read from L2, not memory, by all of them.
const ROW_CHUNK: usize = 64;

/// One cache line, so that every quant vector load is aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The panels of one matrix.
pub struct Panels {
    lines: Vec<Line>,
    /// Bytes of one panel.
    panel_bytes: usize,
    /// Blocks per row.
    nb: usize,
}

impl std::fmt::Debug for Panels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Panels({} × {} bytes)",
            self.lines.len() * 64 / self.panel_bytes.max(1),
            self.panel_bytes
        )
    }
}

/// Bytes of one block's quants for sixteen rows.
const fn quant_bytes(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q8_0 => 8 * 64,
        QuantFormat::Q4_0 | QuantFormat::Q4_1 => 4 * 64,
        _ => panic!("not a format of this panel layout"),
    }
}

/// Sixteen-value f16 sets per block: scales, and for Q4_1 minima.
const fn scale_sets(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q4_1 => 2,
        _ => 1,
    }
}

/// What the stored unsigned bytes are offset by: the integer `vpdpbusd` sums are corrected by
/// `offset · Σx` (Q4_1's offset is its minimum, applied in f32).
const fn offset(format: QuantFormat) -> i32 {
    match format {
        QuantFormat::Q8_0 => 128,
        QuantFormat::Q4_0 => 8,
        _ => 0,
    }
}

impl Panels {
    /// Repacks a row-layout matrix (portable; a few milliseconds per hundred MB, in
    /// parallel over panels).
    pub fn pack(w: &QuantMatrix, rows_layout: &[u8]) -> Self {
        use rayon::prelude::*;
        let format = w.format;
        let nb = w.cols / BLOCK;
        let qb = quant_bytes(format);
        // Whole cache lines, so that every panel starts on one.
        let panel_bytes = (nb * (qb + 32 * scale_sets(format))).next_multiple_of(64);
        let count = w.rows.div_ceil(LANES);
        let mut lines = vec![Line([0; 64]); count * panel_bytes / 64];
        let bb = format.block_bytes();
        let rb = w.row_bytes();
        lines
            .par_chunks_mut(panel_bytes / 64)
            .enumerate()
            .for_each(|(p, panel)| {
                // SAFETY: `Line` is 64 plain bytes; the slice covers exactly these lines.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(panel.as_mut_ptr() as *mut u8, panel_bytes)
                };
                for c in 0..LANES.min(w.rows - p * LANES) {
                    let row = &rows_layout[(p * LANES + c) * rb..(p * LANES + c + 1) * rb];
                    for (b, block) in row.chunks_exact(bb).enumerate() {
                        let scales = nb * qb + b * 32 + 2 * c;
                        dst[scales..scales + 2].copy_from_slice(&block[..2]);
                        let at = match format {
                            QuantFormat::Q4_1 => {
                                let minima = scales + nb * 32;
                                dst[minima..minima + 2].copy_from_slice(&block[2..4]);
                                4
                            }
                            _ => 2,
                        };
                        let flip = if format == QuantFormat::Q8_0 { 0x80 } else { 0 };
                        let q = &mut dst[b * qb..(b + 1) * qb];
                        for (i, &v) in block[at..].iter().enumerate() {
                            q[(i / 4) * 64 + 4 * c + i % 4] = v ^ flip;
                        }
                    }
                }
            });
        Self {
            lines,
            panel_bytes,
            nb,
        }
    }

    /// All panels' bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes with no padding.
        unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.lines.len() * 64)
        }
    }

    /// Row `j`'s block `b`: its 32 stored (unsigned) values in element order, scale and
    /// minimum (Q4_1; otherwise 0).
    fn block(&self, format: QuantFormat, j: usize, b: usize) -> ([u8; BLOCK], f32, f32) {
        let (p, c) = (j / LANES, j % LANES);
        let panel = &self.bytes()[p * self.panel_bytes..(p + 1) * self.panel_bytes];
        let qb = quant_bytes(format);
        let q = &panel[b * qb..(b + 1) * qb];
        let mut v = [0u8; BLOCK];
        for (i, v) in v.iter_mut().enumerate() {
            *v = match format {
                QuantFormat::Q8_0 => q[(i / 4) * 64 + 4 * c + i % 4],
                _ => {
                    let e = i % 16;
                    let byte = q[(e / 4) * 64 + 4 * c + e % 4];
                    if i < 16 { byte & 0x0f } else { byte >> 4 }
                }
            };
        }
        let scales = self.nb * qb + b * 32 + 2 * c;
        let m = if format == QuantFormat::Q4_1 {
            f16_at(panel, scales + self.nb * 32)
        } else {
            0.0
        };
        (v, f16_at(panel, scales), m)
    }

    /// Row `j` as f32, exactly as the row layout dequantizes it.
    pub fn dequantize_row(&self, format: QuantFormat, j: usize, out: &mut [f32]) {
        for (b, y) in out.chunks_exact_mut(BLOCK).enumerate() {
            let (v, d, m) = self.block(format, j, b);
            for (y, &v) in y.iter_mut().zip(&v) {
                *y = match format {
                    QuantFormat::Q8_0 => d * f32::from((v ^ 0x80) as i8),
                    QuantFormat::Q4_0 => d * f32::from(v) + -8.0 * d,
                    _ => d * f32::from(v) + m,
                };
            }
        }
    }
}

/// Whether this CPU runs the AVX-512 kernel (and `BALLAST_NO_AVX512` is unset or empty).
pub fn hardware() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            !super::env_flag("BALLAST_NO_AVX512")
                && has!("avx512f")
                && has!("avx512bw")
                && has!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the engine repacks its weights into panels: where the AVX-512 kernel runs, or where
/// `BALLAST_CPU_KERNEL` asks for panels multiplied by other means (the reference loops, or the
/// AVX-512 kernel on emulated operations).
pub fn available() -> bool {
    use super::CpuKernel;
    match super::cpu_kernel() {
        CpuKernel::Auto | CpuKernel::Avx512Panels => hardware(),
        CpuKernel::PortablePanels | CpuKernel::EmulatedPanels => true,
        CpuKernel::AvxVnni | CpuKernel::Avx2 | CpuKernel::Portable => false,
    }
}

/// Whether panel products run the AVX-512 instructions (rather than a reference loop).
pub(super) fn simd() -> bool {
    use super::CpuKernel;
    matches!(
        super::cpu_kernel(),
        CpuKernel::Auto | CpuKernel::Avx512Panels
    ) && hardware()
}

/// Products of `act` with each panel matrix of `jobs`, into each job's `[m, w.rows]` output,
/// as one parallel pass over slabs of panels. `portable` forces the reference loops.
pub(super) fn matmuls(act: &Q8Rows, jobs: &[(&QuantMatrix, &Panels, OutPtr)], portable: bool) {
    use rayon::prelude::*;
    let m = act.qs.len() / act.cols.max(1);
    let total: usize = jobs.iter().map(|(w, _, _)| w.rows.div_ceil(LANES)).sum();
    let per = total
        .div_ceil(rayon::current_num_threads().max(1) * 4)
        .clamp(1, 16);
    let slabs: Vec<(usize, Range<usize>)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, (w, _, _))| {
            let count = w.rows.div_ceil(LANES);
            (0..count.div_ceil(per)).map(move |s| (i, s * per..((s + 1) * per).min(count)))
        })
        .collect();
    let simd = !portable && simd();
    slabs.into_par_iter().for_each(|(i, panels)| {
        let (w, p, out) = jobs[i];
        for r0 in (0..m).step_by(ROW_CHUNK) {
            let rows = r0..(r0 + ROW_CHUNK).min(m);
            if simd {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `available` checked the CPU's features; `p` was packed from `w`,
                // whose width is `act`'s; the rows exist in `act`; the output is `[m, w.rows]`
                // and these panels' columns belong to this task only.
                unsafe {
                    avx512::dots(w, p, panels.clone(), act, rows, out);
                }
            } else {
                dots_portable(w, p, panels.clone(), act, rows, out);
            }
        }
    });
}

/// The reference: the kernel's arithmetic (integer block sums with the offset taken out, then
/// `d · dx · Σ + m · s`) one output at a time.
fn dots_portable(
    w: &QuantMatrix,
    p: &Panels,
    panels: Range<usize>,
    x: &Q8Rows,
    rows: Range<usize>,
    out: OutPtr,
) {
    let nb = x.cols / BLOCK;
    let off = offset(w.format);
    for j in panels.start * LANES..(panels.end * LANES).min(w.rows) {
        for r in rows.clone() {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let (v, d, m) = p.block(w.format, j, b);
                let xi = r * nb + b;
                let xq = &x.qs[xi * BLOCK..(xi + 1) * BLOCK];
                let dot: i32 = v
                    .iter()
                    .zip(xq)
                    .map(|(&v, &x)| i32::from(v) * i32::from(x))
                    .sum::<i32>()
                    - off * x.sums[xi];
                acc += d * x.d[xi] * dot as f32 + m * x.s[xi];
            }
            // SAFETY: (r, j) is inside the [m, w.rows] output; column j is this task's.
            unsafe { *out.0.add(r * w.rows + j) = acc };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // tile indexes address several arrays and pointers
mod avx512 {
    use super::{BLOCK, LANES, MAX_TILE_ROWS, OutPtr, Panels, Q8Rows, QuantFormat, QuantMatrix};
    use super::{offset, quant_bytes};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Format tags for [`Ctx::tile`].
    const Q8: u8 = 0;
    const Q4_0: u8 = 1;
    const Q4_1: u8 = 2;

    /// Everything a tile reads and writes.
    struct Ctx<'a> {
        w: *const u8,
        panel_bytes: usize,
        nb: usize,
        qb: usize,
        x: &'a Q8Rows,
        out: *mut f32,
        n: usize,
    }

    /// Output columns `panels` (in panels of sixteen) for activation rows `rows`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW and VNNI; `p` packed from `w`; `w.cols == x.cols`;
    /// `rows` inside `x`; `out` a `[x rows, w.rows]` output.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dots(
        w: &QuantMatrix,
        p: &Panels,
        panels: Range<usize>,
        x: &Q8Rows,
        rows: Range<usize>,
        out: OutPtr,
    ) {
        debug_assert_eq!(w.cols, x.cols);
        debug_assert!(rows.end * x.cols <= x.qs.len());
        let k = Ctx {
            w: p.bytes().as_ptr(),
            panel_bytes: p.panel_bytes,
            nb: p.nb,
            qb: quant_bytes(w.format),
            x,
            out: out.0,
            n: w.rows,
        };
        // SAFETY: forwarded from the caller; every tile stays inside `panels` and `rows`.
        unsafe {
            match w.format {
                QuantFormat::Q8_0 => k.sweep::<Q8>(panels, rows),
                QuantFormat::Q4_0 => k.sweep::<Q4_0>(panels, rows),
                QuantFormat::Q4_1 => k.sweep::<Q4_1>(panels, rows),
                _ => unreachable!("not a format of this panel layout"),
            }
        }
    }

    impl Ctx<'_> {
        /// Row tiles of up to eight; fewer rows take more panels at once, so that a tile
        /// always has at least four independent chains of `vpdpbusd`.
        #[inline(always)]
        unsafe fn sweep<const F: u8>(&self, panels: Range<usize>, rows: Range<usize>) {
            unsafe {
                let mut r0 = rows.start;
                while r0 < rows.end {
                    let rem = (rows.end - r0).min(MAX_TILE_ROWS);
                    match rem {
                        8 => self.each::<1, 8, F>(panels.clone(), r0),
                        7 => self.each::<1, 7, F>(panels.clone(), r0),
                        6 => self.each::<1, 6, F>(panels.clone(), r0),
                        5 => self.each::<1, 5, F>(panels.clone(), r0),
                        4 => self.each::<1, 4, F>(panels.clone(), r0),
                        3 => self.each::<2, 3, F>(panels.clone(), r0),
                        2 => self.each::<2, 2, F>(panels.clone(), r0),
                        _ => self.each::<4, 1, F>(panels.clone(), r0),
                    }
                    r0 += rem;
                }
            }
        }

        /// `R` rows against every panel, `P` panels at a time, the rest one at a time.
        #[inline(always)]
        unsafe fn each<const P: usize, const R: usize, const F: u8>(
            &self,
            panels: Range<usize>,
            r0: usize,
        ) {
            unsafe {
                let mut p = panels.start;
                while p + P <= panels.end {
                    self.tile::<P, R, F>(p, r0);
                    p += P;
                }
                while p < panels.end {
                    self.tile::<1, R, F>(p, r0);
                    p += 1;
                }
            }
        }

        /// Panels `p0..p0 + P` against activation rows `r0..r0 + R`.
        #[inline(always)]
        unsafe fn tile<const P: usize, const R: usize, const F: u8>(&self, p0: usize, r0: usize) {
            unsafe {
                let x = self.x;
                let (nb, cols) = (self.nb, x.cols);
                let format = match F {
                    Q8 => QuantFormat::Q8_0,
                    Q4_0 => QuantFormat::Q4_0,
                    _ => QuantFormat::Q4_1,
                };
                let off = offset(format);
                let low4 = _mm512_set1_epi8(0x0f);
                let panel = |p: usize| self.w.add((p0 + p) * self.panel_bytes);
                // Four activation bytes at element `e` of block `b` of row `r`, in every lane.
                let xb = |r: usize, b: usize, e: usize| {
                    let at = x.qs.as_ptr().add((r0 + r) * cols + b * BLOCK + e);
                    _mm512_set1_epi32(std::ptr::read_unaligned(at as *const i32))
                };
                let mut acc = [[_mm512_setzero_ps(); R]; P];
                // Each load asks for the same byte of the next `P` panels: the tile after this
                // one. Panels are contiguous, so this runs one tile ahead of the stream; the
                // hardware prefetcher alone left single-row decode 10–25 % slower (alternating
                // runs of `cargo bench --bench real_model`). Past a slab's end it fetches for
                // another task, and a prefetch never faults.
                let ahead = P * self.panel_bytes;
                // The 64 quant bytes at `at` of panel `p`, asking for the next tile's.
                let quants = |p: usize, at: usize| {
                    _mm_prefetch::<_MM_HINT_T0>(panel(p).wrapping_add(ahead + at) as *const i8);
                    _mm512_load_si512(panel(p).add(at) as *const __m512i)
                };
                for b in 0..nb {
                    let mut sum = [[_mm512_setzero_si512(); R]; P];
                    if off != 0 {
                        for r in 0..R {
                            let bias = _mm512_set1_epi32(-off * x.sums[(r0 + r) * nb + b]);
                            for p in 0..P {
                                sum[p][r] = bias;
                            }
                        }
                    }
                    if F == Q8 {
                        for g in 0..8 {
                            for p in 0..P {
                                let v = quants(p, b * self.qb + g * 64);
                                for r in 0..R {
                                    sum[p][r] = _mm512_dpbusd_epi32(sum[p][r], v, xb(r, b, 4 * g));
                                }
                            }
                        }
                    } else {
                        for h in 0..4 {
                            for p in 0..P {
                                let v = quants(p, b * self.qb + h * 64);
                                let lo = _mm512_and_si512(v, low4);
                                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
                                for r in 0..R {
                                    sum[p][r] = _mm512_dpbusd_epi32(sum[p][r], lo, xb(r, b, 4 * h));
                                    sum[p][r] =
                                        _mm512_dpbusd_epi32(sum[p][r], hi, xb(r, b, 16 + 4 * h));
                                }
                            }
                        }
                    }
                    for p in 0..P {
                        let scales = panel(p).add(nb * self.qb + b * 32);
                        _mm_prefetch::<_MM_HINT_T0>(scales.wrapping_add(ahead) as *const i8);
                        if F == Q4_1 {
                            _mm_prefetch::<_MM_HINT_T0>(
                                scales.wrapping_add(ahead + nb * 32) as *const i8
                            );
                        }
                        let d = _mm512_cvtph_ps(_mm256_load_si256(scales as *const __m256i));
                        for r in 0..R {
                            let at = (r0 + r) * nb + b;
                            let dx = _mm512_set1_ps(*x.d.get_unchecked(at));
                            acc[p][r] = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(sum[p][r]),
                                _mm512_mul_ps(d, dx),
                                acc[p][r],
                            );
                        }
                        if F == Q4_1 {
                            let minima = scales.add(nb * 32);
                            let m = _mm512_cvtph_ps(_mm256_load_si256(minima as *const __m256i));
                            for r in 0..R {
                                let s = _mm512_set1_ps(*x.s.get_unchecked((r0 + r) * nb + b));
                                acc[p][r] = _mm512_fmadd_ps(m, s, acc[p][r]);
                            }
                        }
                    }
                }
                for p in 0..P {
                    let col = (p0 + p) * LANES;
                    let valid = LANES.min(self.n - col);
                    for r in 0..R {
                        let dst = self.out.add((r0 + r) * self.n + col);
                        if valid == LANES {
                            _mm512_storeu_ps(dst, acc[p][r]);
                        } else {
                            _mm512_mask_storeu_ps(dst, (1u16 << valid) - 1, acc[p][r]);
                        }
                    }
                }
            }
        }
    }
}
