//! Panels of sixteen rows (see the `panel` module) for Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, and
//! the AVX-512 VNNI kernel that multiplies them.
//!
//! The layout follows the `panel` module's: every 32-element sub-block of sixteen rows is a
//! run of 64-byte vectors in which byte `4c + t` belongs to row `c`, so that one `vpdpbusd`
//! against four activation bytes broadcast to every lane adds four products to each of the
//! sixteen outputs. Per sub-block:
//!
//! - four nibble vectors, exactly as Q4's: byte `4c + t` of vector `h` holds the low four
//!   bits of element `4h + t` (low nibble) and of element `16 + 4h + t` (high nibble);
//! - for five-bit quants one more vector: bit `g` of byte `4c + t` is the fifth bit of the
//!   element that group `g` (0–3: the low nibbles of vector `g`, 4–7: the high nibbles of
//!   vector `g − 4`) puts in byte `t`; one 16-bit shift and a mask move it to bit 4;
//! - for Q6_K two more, the top two bits of the low groups' and of the high groups' elements,
//!   bits `2g, 2g + 1` for group `g` of four: one shift and a mask each.
//!
//! After all quants come the scales, sixteen rows at a time: f16 `d` per block (Q5_0, Q5_1)
//! or per super-block (k-quants), Q5_1's f16 minima, Q4_K/Q5_K's f16 `dmin` per super-block
//! and their 6-bit scales and minima per sub-block unpacked to bytes, Q6_K's two i8 scales per
//! sub-block. Bits per weight are the file's, except that Q4_K and Q5_K's packed 6-bit scales
//! and minima take a byte each: 4.625 and 5.625 where the file has 4.5 and 5.5.
//!
//! Per sub-block the kernel forms integer sums (Q5_0 and Q6_K's offsets taken out exactly by
//! starting them at `−offset · Σx`, Q6_K's two halves summed apart and weighted by their
//! scales with `vpmulld`), converts them once and applies `d · dx` with one FMA per sixteen
//! outputs, the minimum term `min · s` with another.
//!
//! The kernel is written once against the [`Isa`] trait: the AVX-512 implementation maps each
//! operation to one intrinsic, and a portable implementation of the same operations (lanes as
//! arrays) runs the very same tile logic in the tests on any CPU, against the plain reference
//! loop over panels. That is how this kernel is checked where the CPU lacks AVX-512.

use std::ops::Range;

use super::panel::LANES;
use super::{BLOCK, OutPtr, Q8Rows, QuantFormat, QuantMatrix, SUPER_BLOCK, SubBlock, sub_block};

/// Activation rows one pass of the kernel keeps in registers at most.
const MAX_TILE_ROWS: usize = 8;

/// Activation rows whose tiles run against one slab of panels before the next rows come.
const ROW_CHUNK: usize = 64;

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Where each part of a panel lies, in bytes from the panel's start.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// 64-byte vectors per sub-block: 4 nibble vectors and 0–2 of high bits.
    vectors: usize,
    /// f16 `d` × 16 per unit (block or super-block).
    d: usize,
    /// Q5_1's f16 minima × 16 per block, or Q4_K/Q5_K's f16 `dmin` × 16 per super-block.
    d2: usize,
    /// Q4_K/Q5_K's u8 scales × 16 per sub-block, or Q6_K's i8 scales × 32 per sub-block.
    sc: usize,
    /// Q4_K/Q5_K's u8 minima × 16 per sub-block.
    mn: usize,
    /// Whole panel, rounded up to cache lines.
    bytes: usize,
}

impl Layout {
    fn of(format: QuantFormat, nsub: usize) -> Self {
        let vectors = match format {
            QuantFormat::Q4_K => 4,
            QuantFormat::Q6_K => 6,
            _ => 5,
        };
        let units = if format.is_k() { nsub / 8 } else { nsub };
        let d = nsub * vectors * 64;
        let d2 = d + units * 32;
        let (d2_len, sc_len, mn_len) = match format {
            QuantFormat::Q5_0 => (0, 0, 0),
            QuantFormat::Q5_1 => (nsub * 32, 0, 0),
            QuantFormat::Q4_K | QuantFormat::Q5_K => (units * 32, nsub * 16, nsub * 16),
            _ => (0, nsub * 32, 0),
        };
        let sc = d2 + d2_len;
        let mn = sc + sc_len;
        Self {
            vectors,
            d,
            d2,
            sc,
            mn,
            bytes: (mn + mn_len).next_multiple_of(64),
        }
    }
}

/// The panels of one matrix in one of this module's formats.
pub struct KPanels {
    lines: Vec<Line>,
    layout: Layout,
    /// Sub-blocks (of 32) per row.
    nsub: usize,
}

impl std::fmt::Debug for KPanels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KPanels({} × {} bytes)",
            self.lines.len() * 64 / self.layout.bytes.max(1),
            self.layout.bytes
        )
    }
}

/// Whether this module packs `format`.
pub fn handles(format: QuantFormat) -> bool {
    matches!(
        format,
        QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::Q4_K
            | QuantFormat::Q5_K
            | QuantFormat::Q6_K
    )
}

/// Element `e(g, t)` that group `g` (0–7) puts in byte `t` of a lane.
const fn element(g: usize, t: usize) -> usize {
    if g < 4 {
        4 * g + t
    } else {
        16 + 4 * (g - 4) + t
    }
}

impl KPanels {
    /// Repacks a row-layout matrix of a format this module [`handles`].
    pub fn pack(w: &QuantMatrix, rows_layout: &[u8]) -> Self {
        use rayon::prelude::*;
        let format = w.format;
        let nsub = w.cols / BLOCK;
        let layout = Layout::of(format, nsub);
        let count = w.rows.div_ceil(LANES);
        let mut lines = vec![Line([0; 64]); count * layout.bytes / 64];
        let rb = w.row_bytes();
        let bb = format.block_bytes();
        lines
            .par_chunks_mut(layout.bytes / 64)
            .enumerate()
            .for_each(|(p, panel)| {
                // SAFETY: `Line` is 64 plain bytes; the slice covers exactly these lines.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(panel.as_mut_ptr() as *mut u8, layout.bytes)
                };
                for c in 0..LANES.min(w.rows - p * LANES) {
                    let row = &rows_layout[(p * LANES + c) * rb..(p * LANES + c + 1) * rb];
                    for k in 0..nsub {
                        let q = sub_block(format, row, k).q;
                        let v = &mut dst[k * layout.vectors * 64..(k + 1) * layout.vectors * 64];
                        for h in 0..4 {
                            for t in 0..4 {
                                v[h * 64 + 4 * c + t] =
                                    (q[4 * h + t] & 0x0f) | (q[16 + 4 * h + t] & 0x0f) << 4;
                            }
                        }
                        for t in 0..4 {
                            if layout.vectors == 5 {
                                v[4 * 64 + 4 * c + t] =
                                    (0..8).map(|g| ((q[element(g, t)] >> 4) & 1) << g).sum();
                            } else if layout.vectors == 6 {
                                for half in 0..2 {
                                    v[(4 + half) * 64 + 4 * c + t] = (0..4)
                                        .map(|g| {
                                            ((q[element(4 * half + g, t)] >> 4) & 3) << (2 * g)
                                        })
                                        .sum();
                                }
                            }
                        }
                    }
                    // Scales, by the file's bytes (exact: no value is recomputed).
                    let put = |dst: &mut [u8], at: usize, bytes: &[u8]| {
                        dst[at..at + bytes.len()].copy_from_slice(bytes)
                    };
                    for unit in 0..rb / bb {
                        let b = &row[unit * bb..(unit + 1) * bb];
                        match format {
                            QuantFormat::Q5_0 => put(dst, layout.d + unit * 32 + 2 * c, &b[..2]),
                            QuantFormat::Q5_1 => {
                                put(dst, layout.d + unit * 32 + 2 * c, &b[..2]);
                                put(dst, layout.d2 + unit * 32 + 2 * c, &b[2..4]);
                            }
                            QuantFormat::Q4_K | QuantFormat::Q5_K => {
                                put(dst, layout.d + unit * 32 + 2 * c, &b[..2]);
                                put(dst, layout.d2 + unit * 32 + 2 * c, &b[2..4]);
                                for j in 0..8 {
                                    let (s, m) =
                                        crate::compute::backend::quant::k_scale_min(&b[4..16], j);
                                    let k = unit * 8 + j;
                                    dst[layout.sc + k * 16 + c] = s;
                                    dst[layout.mn + k * 16 + c] = m;
                                }
                            }
                            _ => {
                                put(dst, layout.d + unit * 32 + 2 * c, &b[208..210]);
                                for j in 0..8 {
                                    let k = unit * 8 + j;
                                    dst[layout.sc + k * 32 + c] = b[192 + 2 * j];
                                    dst[layout.sc + k * 32 + 16 + c] = b[192 + 2 * j + 1];
                                }
                            }
                        }
                    }
                }
            });
        Self {
            lines,
            layout,
            nsub,
        }
    }

    /// All panels' bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes with no padding.
        unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.lines.len() * 64)
        }
    }

    /// Sub-block `k` of row `j`, read back from the panel: the reference loop's input, and
    /// equal to [`sub_block`] of the file's row.
    pub fn sub_block(&self, format: QuantFormat, j: usize, k: usize) -> SubBlock {
        let (p, c) = (j / LANES, j % LANES);
        let l = self.layout;
        let panel = &self.bytes()[p * l.bytes..(p + 1) * l.bytes];
        let v = &panel[k * l.vectors * 64..(k + 1) * l.vectors * 64];
        let q = std::array::from_fn(|i| {
            let (g, t) = if i < 16 {
                (i / 4, i % 4)
            } else {
                (4 + (i - 16) / 4, i % 4)
            };
            let byte = v[(g % 4) * 64 + 4 * c + t];
            let low = if g < 4 { byte & 0x0f } else { byte >> 4 };
            let high = match l.vectors {
                5 => (v[4 * 64 + 4 * c + t] >> g) & 1,
                6 => (v[(4 + g / 4) * 64 + 4 * c + t] >> (2 * (g % 4))) & 3,
                _ => 0,
            };
            low | high << 4
        });
        let f16 = |at: usize| half::f16::from_le_bytes([panel[at], panel[at + 1]]).to_f32();
        let unit = if format.is_k() { k / 8 } else { k };
        let d = f16(l.d + unit * 32 + 2 * c);
        let (sc, offset, min) = match format {
            QuantFormat::Q5_0 => ([1, 1], 16, super::NO_MIN),
            QuantFormat::Q5_1 => ([1, 1], 0, f16(l.d2 + k * 32 + 2 * c)),
            QuantFormat::Q4_K | QuantFormat::Q5_K => {
                let s = i32::from(panel[l.sc + k * 16 + c]);
                let m = f32::from(panel[l.mn + k * 16 + c]);
                ([s, s], 0, -(f16(l.d2 + unit * 32 + 2 * c) * m))
            }
            _ => {
                let lo = i32::from(panel[l.sc + k * 32 + c] as i8);
                let hi = i32::from(panel[l.sc + k * 32 + 16 + c] as i8);
                ([lo, hi], 32, super::NO_MIN)
            }
        };
        SubBlock {
            q,
            d,
            sc,
            offset,
            min,
        }
    }

    /// Row `j` as f32, exactly as the row layout dequantizes it.
    pub fn dequantize_row(&self, format: QuantFormat, j: usize, out: &mut [f32]) {
        for (k, y) in out[..self.nsub * BLOCK].chunks_exact_mut(BLOCK).enumerate() {
            let sub = self.sub_block(format, j, k);
            for (i, y) in y.iter_mut().enumerate() {
                *y = sub.value(i);
            }
        }
    }
}

/// Products of `act` with each panel matrix of `jobs`, into each job's `[m, w.rows]` output,
/// as one parallel pass over slabs of panels. `portable` forces the reference loop.
pub(super) fn matmuls(act: &Q8Rows, jobs: &[(&QuantMatrix, &KPanels, OutPtr)], portable: bool) {
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
    let simd = !portable && super::panel::simd();
    let emulated = !portable && super::cpu_kernel() == super::CpuKernel::EmulatedPanels;
    slabs.into_par_iter().for_each(|(i, panels)| {
        let (w, p, out) = jobs[i];
        for r0 in (0..m).step_by(ROW_CHUNK) {
            let rows = r0..(r0 + ROW_CHUNK).min(m);
            if emulated {
                emulated_dots(w, p, panels.clone(), act, rows, out);
            } else if simd {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `available` checked the CPU's features; `p` was packed from `w`,
                // whose width is `act`'s; the rows exist in `act`; the output is `[m, w.rows]`
                // and these panels' columns belong to this task only.
                unsafe {
                    avx512_dots(w, p, panels.clone(), act, rows, out);
                }
            } else {
                dots_portable(w, p, panels.clone(), act, rows, out);
            }
        }
    });
}

/// The reference: each output as the portable row kernel computes it, from sub-blocks read
/// back out of the panels.
fn dots_portable(
    w: &QuantMatrix,
    p: &KPanels,
    panels: Range<usize>,
    x: &Q8Rows,
    rows: Range<usize>,
    out: OutPtr,
) {
    let nb = x.cols / BLOCK;
    for j in panels.start * LANES..(panels.end * LANES).min(w.rows) {
        let subs: Vec<SubBlock> = (0..nb).map(|k| p.sub_block(w.format, j, k)).collect();
        for r in rows.clone() {
            let mut acc = 0.0f32;
            for (b, sub) in subs.iter().enumerate() {
                let xi = r * nb + b;
                let xq = &x.qs[xi * BLOCK..(xi + 1) * BLOCK];
                let half = |h: usize| -> i32 {
                    let (q, xs) = (&sub.q[16 * h..16 * h + 16], &xq[16 * h..16 * h + 16]);
                    let dot: i32 = q
                        .iter()
                        .zip(xs)
                        .map(|(&q, &x)| i32::from(q) * i32::from(x))
                        .sum();
                    dot - sub.offset * xs.iter().map(|&x| i32::from(x)).sum::<i32>()
                };
                let dot = sub.sc[0] * half(0) + sub.sc[1] * half(1);
                acc += sub.d * x.d[xi] * dot as f32 + sub.min * x.s[xi];
            }
            // SAFETY: (r, j) is inside the [m, w.rows] output; column j is this task's.
            unsafe { *out.0.add(r * w.rows + j) = acc };
        }
    }
}

/// The vector operations the kernel is written in: sixteen i32 (or 64 byte) lanes `I`,
/// sixteen f32 lanes `F`. Each is one AVX-512 instruction in [`Avx512`]; [`Emulated`] does
/// the same on arrays.
///
/// # Safety
/// Every method may require CPU features (see the implementation) and reads or writes raw
/// pointers: 64 bytes for [`Isa::load`], 4 for [`Isa::broadcast4`], 16 for the widening loads,
/// 32 for [`Isa::f16s`], the `valid` first floats for [`Isa::store`].
pub(super) trait Isa {
    type I: Copy;
    type F: Copy;
    unsafe fn load(p: *const u8) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    /// Each 16-bit lane shifted left by `n` (< 16).
    unsafe fn sll16(a: Self::I, n: u32) -> Self::I;
    /// Each 16-bit lane shifted right (logically) by `n` (< 16).
    unsafe fn srl16(a: Self::I, n: u32) -> Self::I;
    unsafe fn splat8(v: u8) -> Self::I;
    unsafe fn splat32(v: i32) -> Self::I;
    /// The four bytes at `p` in every 32-bit lane.
    unsafe fn broadcast4(p: *const u8) -> Self::I;
    /// Per 32-bit lane: `acc + Σ u8(u) · i8(s)` over its four bytes (`vpdpbusd`).
    unsafe fn dpbusd(acc: Self::I, u: Self::I, s: Self::I) -> Self::I;
    unsafe fn mullo32(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I;
    /// Sixteen i8 at `p` as i32 lanes.
    unsafe fn widen_i8(p: *const u8) -> Self::I;
    /// Sixteen u8 at `p` as i32 lanes.
    unsafe fn widen_u8(p: *const u8) -> Self::I;
    /// Sixteen f16 at `p` as f32 lanes.
    unsafe fn f16s(p: *const u8) -> Self::F;
    unsafe fn to_f32(a: Self::I) -> Self::F;
    unsafe fn splatf(v: f32) -> Self::F;
    unsafe fn zerof() -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`, rounded once.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// The first `valid` (≤ 16) lanes to `p`.
    unsafe fn store(p: *mut f32, v: Self::F, valid: usize);
    unsafe fn prefetch(p: *const u8);
}

/// Format tags for [`tile`].
const Q5_0: u8 = 0;
const Q5_1: u8 = 1;
const Q4_K: u8 = 2;
const Q5_K: u8 = 3;
const Q6_K: u8 = 4;

/// Everything a tile reads and writes.
struct Ctx<'a> {
    w: *const u8,
    layout: Layout,
    nb: usize,
    x: &'a Q8Rows,
    out: *mut f32,
    n: usize,
}

/// Output columns `panels` for activation rows `rows` with the operations of `V`.
///
/// # Safety
/// `V`'s operations must run on this CPU; `p` packed from `w`; `w.cols == x.cols`; `rows`
/// inside `x`; `out` a `[x rows, w.rows]` output.
#[inline(always)]
unsafe fn dots_with<V: Isa>(
    w: &QuantMatrix,
    p: &KPanels,
    panels: Range<usize>,
    x: &Q8Rows,
    rows: Range<usize>,
    out: OutPtr,
) {
    debug_assert_eq!(w.cols, x.cols);
    debug_assert!(rows.end * x.cols <= x.qs.len());
    let k = Ctx {
        w: p.bytes().as_ptr(),
        layout: p.layout,
        nb: p.nsub,
        x,
        out: out.0,
        n: w.rows,
    };
    // SAFETY: forwarded from the caller; every tile stays inside `panels` and `rows`.
    unsafe {
        match w.format {
            QuantFormat::Q5_0 => sweep::<V, Q5_0>(&k, panels, rows),
            QuantFormat::Q5_1 => sweep::<V, Q5_1>(&k, panels, rows),
            QuantFormat::Q4_K => sweep::<V, Q4_K>(&k, panels, rows),
            QuantFormat::Q5_K => sweep::<V, Q5_K>(&k, panels, rows),
            QuantFormat::Q6_K => sweep::<V, Q6_K>(&k, panels, rows),
            _ => unreachable!("not a format of this panel layout"),
        }
    }
}

/// Row tiles of up to eight; fewer rows take more panels at once, so that a tile always has
/// at least four independent chains of `vpdpbusd`.
#[inline(always)]
unsafe fn sweep<V: Isa, const F: u8>(k: &Ctx<'_>, panels: Range<usize>, rows: Range<usize>) {
    unsafe {
        let mut r0 = rows.start;
        while r0 < rows.end {
            let rem = (rows.end - r0).min(MAX_TILE_ROWS);
            match rem {
                8 => each::<V, 1, 8, F>(k, panels.clone(), r0),
                7 => each::<V, 1, 7, F>(k, panels.clone(), r0),
                6 => each::<V, 1, 6, F>(k, panels.clone(), r0),
                5 => each::<V, 1, 5, F>(k, panels.clone(), r0),
                4 => each::<V, 1, 4, F>(k, panels.clone(), r0),
                3 => each::<V, 2, 3, F>(k, panels.clone(), r0),
                2 => each::<V, 2, 2, F>(k, panels.clone(), r0),
                _ => each::<V, 4, 1, F>(k, panels.clone(), r0),
            }
            r0 += rem;
        }
    }
}

/// `R` rows against every panel, `P` panels at a time, the rest one at a time.
#[inline(always)]
unsafe fn each<V: Isa, const P: usize, const R: usize, const F: u8>(
    k: &Ctx<'_>,
    panels: Range<usize>,
    r0: usize,
) {
    unsafe {
        let mut p = panels.start;
        while p + P <= panels.end {
            tile::<V, P, R, F>(k, p, r0);
            p += P;
        }
        while p < panels.end {
            tile::<V, 1, R, F>(k, p, r0);
            p += 1;
        }
    }
}

/// Panels `p0..p0 + P` against activation rows `r0..r0 + R`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // tile indexes address several arrays and pointers
unsafe fn tile<V: Isa, const P: usize, const R: usize, const F: u8>(
    k: &Ctx<'_>,
    p0: usize,
    r0: usize,
) {
    unsafe {
        let x = k.x;
        let (nb, cols, l) = (k.nb, x.cols, k.layout);
        let vb = l.vectors * 64;
        let low4 = V::splat8(0x0f);
        let (bit4, bits45) = (V::splat8(0x10), V::splat8(0x30));
        let panel = |p: usize| k.w.add((p0 + p) * l.bytes);
        let xb = |r: usize, b: usize, e: usize| {
            V::broadcast4(x.qs.as_ptr().add((r0 + r) * cols + b * BLOCK + e).cast())
        };
        // The same byte of the next `P` panels: the tile after this one (see `panel`).
        let ahead = P * l.bytes;
        let quants = |p: usize, at: usize| {
            V::prefetch(panel(p).wrapping_add(ahead + at));
            V::load(panel(p).add(at))
        };
        let mut acc = [[V::zerof(); R]; P];
        for b in 0..nb {
            // Integer sums: one set, or (Q6_K) the low and the high halves apart, each
            // starting at −offset · Σx of its elements.
            let mut lo = [[V::splat32(0); R]; P];
            let mut hi = [[V::splat32(0); R]; P];
            for r in 0..R {
                let at = (r0 + r) * nb + b;
                let (all, first) = (x.sums[at], x.sums_lo[at]);
                let (bl, bh) = match F {
                    Q5_0 => (-16 * all, 0),
                    Q6_K => (-32 * first, -32 * (all - first)),
                    _ => (0, 0),
                };
                for p in 0..P {
                    lo[p][r] = V::splat32(bl);
                    hi[p][r] = V::splat32(bh);
                }
            }
            for h in 0..4 {
                for p in 0..P {
                    let base = b * vb;
                    let v = quants(p, base + h * 64);
                    let mut a = V::and(v, low4);
                    let mut c = V::and(V::srl16(v, 4), low4);
                    if l.vectors == 5 {
                        let hv = quants(p, base + 4 * 64);
                        a = V::or(a, V::and(V::sll16(hv, 4 - h as u32), bit4));
                        c = V::or(c, V::and(V::srl16(hv, h as u32), bit4));
                    } else if l.vectors == 6 {
                        let two = |v: V::I| {
                            let v = if h <= 2 {
                                V::sll16(v, 4 - 2 * h as u32)
                            } else {
                                V::srl16(v, 2)
                            };
                            V::and(v, bits45)
                        };
                        a = V::or(a, two(quants(p, base + 4 * 64)));
                        c = V::or(c, two(quants(p, base + 5 * 64)));
                    }
                    for r in 0..R {
                        lo[p][r] = V::dpbusd(lo[p][r], a, xb(r, b, 4 * h));
                        if F == Q6_K {
                            hi[p][r] = V::dpbusd(hi[p][r], c, xb(r, b, 16 + 4 * h));
                        } else {
                            lo[p][r] = V::dpbusd(lo[p][r], c, xb(r, b, 16 + 4 * h));
                        }
                    }
                }
            }
            for p in 0..P {
                let pp = panel(p);
                let unit = if F == Q5_0 || F == Q5_1 { b } else { b / 8 };
                let mut d = V::f16s(pp.add(l.d + unit * 32));
                let mut min = None;
                match F {
                    Q5_1 => min = Some(V::f16s(pp.add(l.d2 + b * 32))),
                    Q4_K | Q5_K => {
                        d = V::mul(d, V::to_f32(V::widen_u8(pp.add(l.sc + b * 16))));
                        let dmin = V::mul(V::f16s(pp.add(l.d2 + unit * 32)), V::splatf(-1.0));
                        min = Some(V::mul(dmin, V::to_f32(V::widen_u8(pp.add(l.mn + b * 16)))));
                    }
                    Q6_K => {
                        let (sl, sh) = (
                            V::widen_i8(pp.add(l.sc + b * 32)),
                            V::widen_i8(pp.add(l.sc + b * 32 + 16)),
                        );
                        for r in 0..R {
                            lo[p][r] = V::add32(V::mullo32(lo[p][r], sl), V::mullo32(hi[p][r], sh));
                        }
                    }
                    _ => {}
                }
                for r in 0..R {
                    let at = (r0 + r) * nb + b;
                    let dx = V::splatf(*x.d.get_unchecked(at));
                    acc[p][r] = V::fmadd(V::to_f32(lo[p][r]), V::mul(d, dx), acc[p][r]);
                    if let Some(m) = min {
                        acc[p][r] = V::fmadd(m, V::splatf(*x.s.get_unchecked(at)), acc[p][r]);
                    }
                }
            }
        }
        for p in 0..P {
            let col = (p0 + p) * LANES;
            let valid = LANES.min(k.n - col);
            for r in 0..R {
                V::store(k.out.add((r0 + r) * k.n + col), acc[p][r], valid);
            }
        }
    }
}

/// [`dots_with`] on AVX-512.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI; the rest as [`dots_with`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn avx512_dots(
    w: &QuantMatrix,
    p: &KPanels,
    panels: Range<usize>,
    x: &Q8Rows,
    rows: Range<usize>,
    out: OutPtr,
) {
    // SAFETY: forwarded.
    unsafe { dots_with::<Avx512>(w, p, panels, x, rows, out) }
}

/// The kernel's operations as AVX-512 F/BW/VNNI instructions.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Isa for Avx512 {
    type I = std::arch::x86_64::__m512i;
    type F = std::arch::x86_64::__m512;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn load(p: *const u8) -> Self::I {
        unsafe { std::arch::x86_64::_mm512_loadu_si512(p.cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I {
        std::arch::x86_64::_mm512_and_si512(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I {
        std::arch::x86_64::_mm512_or_si512(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn sll16(a: Self::I, n: u32) -> Self::I {
        use std::arch::x86_64::*;
        _mm512_sll_epi16(a, _mm_cvtsi32_si128(n as i32))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn srl16(a: Self::I, n: u32) -> Self::I {
        use std::arch::x86_64::*;
        _mm512_srl_epi16(a, _mm_cvtsi32_si128(n as i32))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn splat8(v: u8) -> Self::I {
        std::arch::x86_64::_mm512_set1_epi8(v as i8)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn splat32(v: i32) -> Self::I {
        std::arch::x86_64::_mm512_set1_epi32(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn broadcast4(p: *const u8) -> Self::I {
        unsafe { std::arch::x86_64::_mm512_set1_epi32(std::ptr::read_unaligned(p.cast())) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dpbusd(acc: Self::I, u: Self::I, s: Self::I) -> Self::I {
        std::arch::x86_64::_mm512_dpbusd_epi32(acc, u, s)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn mullo32(a: Self::I, b: Self::I) -> Self::I {
        std::arch::x86_64::_mm512_mullo_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I {
        std::arch::x86_64::_mm512_add_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn widen_i8(p: *const u8) -> Self::I {
        use std::arch::x86_64::*;
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn widen_u8(p: *const u8) -> Self::I {
        use std::arch::x86_64::*;
        unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn f16s(p: *const u8) -> Self::F {
        use std::arch::x86_64::*;
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn to_f32(a: Self::I) -> Self::F {
        std::arch::x86_64::_mm512_cvtepi32_ps(a)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn splatf(v: f32) -> Self::F {
        std::arch::x86_64::_mm512_set1_ps(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn zerof() -> Self::F {
        std::arch::x86_64::_mm512_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F {
        std::arch::x86_64::_mm512_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        std::arch::x86_64::_mm512_fmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn store(p: *mut f32, v: Self::F, valid: usize) {
        use std::arch::x86_64::*;
        unsafe {
            if valid == LANES {
                _mm512_storeu_ps(p, v);
            } else {
                _mm512_mask_storeu_ps(p, (1u16 << valid) - 1, v);
            }
        }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn prefetch(p: *const u8) {
        use std::arch::x86_64::*;
        // A hint only: it never faults, even past the end.
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
}

// A super-block is eight blocks of 32: the sub-block walk relies on it.
const _: () = assert!(SUPER_BLOCK == 8 * BLOCK);

/// [`dots_with`] on [`Emulated`]: the AVX-512 kernel's logic on any CPU (the tests, and
/// `BALLAST_CPU_KERNEL=emulated-panels`).
pub(super) fn emulated_dots(
    w: &QuantMatrix,
    p: &KPanels,
    panels: Range<usize>,
    x: &Q8Rows,
    rows: Range<usize>,
    out: OutPtr,
) {
    // SAFETY: the emulated operations need no CPU features; the rest as the caller's.
    unsafe { dots_with::<Emulated>(w, p, panels, x, rows, out) }
}

/// The kernel's operations on arrays, lane for lane as the AVX-512 instructions define them,
/// so the tests run the AVX-512 kernel's logic on any CPU.
pub(super) struct Emulated;

mod emulated {
    use super::{Emulated, Isa, LANES};

    /// 64 bytes.
    #[derive(Clone, Copy)]
    pub struct V([u8; 64]);

    impl V {
        fn i32s(self) -> [i32; 16] {
            std::array::from_fn(|i| {
                i32::from_le_bytes(self.0[4 * i..4 * i + 4].try_into().unwrap())
            })
        }
        fn from_i32s(v: [i32; 16]) -> Self {
            let mut out = [0u8; 64];
            for (i, v) in v.iter().enumerate() {
                out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
            }
            V(out)
        }
        fn map16(self, f: impl Fn(u16) -> u16) -> Self {
            let mut out = [0u8; 64];
            for i in 0..32 {
                let w = f(u16::from_le_bytes([self.0[2 * i], self.0[2 * i + 1]]));
                out[2 * i..2 * i + 2].copy_from_slice(&w.to_le_bytes());
            }
            V(out)
        }
    }

    impl Isa for Emulated {
        type I = V;
        type F = [f32; 16];
        unsafe fn load(p: *const u8) -> V {
            V(unsafe { std::ptr::read_unaligned(p.cast()) })
        }
        unsafe fn and(a: V, b: V) -> V {
            V(std::array::from_fn(|i| a.0[i] & b.0[i]))
        }
        unsafe fn or(a: V, b: V) -> V {
            V(std::array::from_fn(|i| a.0[i] | b.0[i]))
        }
        unsafe fn sll16(a: V, n: u32) -> V {
            a.map16(|w| if n > 15 { 0 } else { w << n })
        }
        unsafe fn srl16(a: V, n: u32) -> V {
            a.map16(|w| if n > 15 { 0 } else { w >> n })
        }
        unsafe fn splat8(v: u8) -> V {
            V([v; 64])
        }
        unsafe fn splat32(v: i32) -> V {
            V::from_i32s([v; 16])
        }
        unsafe fn broadcast4(p: *const u8) -> V {
            V::from_i32s([unsafe { std::ptr::read_unaligned(p.cast::<i32>()) }; 16])
        }
        unsafe fn dpbusd(acc: V, u: V, s: V) -> V {
            let a = acc.i32s();
            V::from_i32s(std::array::from_fn(|i| {
                (0..4).fold(a[i], |sum, t| {
                    sum.wrapping_add(i32::from(u.0[4 * i + t]) * i32::from(s.0[4 * i + t] as i8))
                })
            }))
        }
        unsafe fn mullo32(a: V, b: V) -> V {
            let (a, b) = (a.i32s(), b.i32s());
            V::from_i32s(std::array::from_fn(|i| a[i].wrapping_mul(b[i])))
        }
        unsafe fn add32(a: V, b: V) -> V {
            let (a, b) = (a.i32s(), b.i32s());
            V::from_i32s(std::array::from_fn(|i| a[i].wrapping_add(b[i])))
        }
        unsafe fn widen_i8(p: *const u8) -> V {
            V::from_i32s(std::array::from_fn(|i| {
                i32::from(unsafe { *p.add(i) } as i8)
            }))
        }
        unsafe fn widen_u8(p: *const u8) -> V {
            V::from_i32s(std::array::from_fn(|i| i32::from(unsafe { *p.add(i) })))
        }
        unsafe fn f16s(p: *const u8) -> [f32; 16] {
            std::array::from_fn(|i| unsafe {
                half::f16::from_le_bytes([*p.add(2 * i), *p.add(2 * i + 1)]).to_f32()
            })
        }
        unsafe fn to_f32(a: V) -> [f32; 16] {
            a.i32s().map(|v| v as f32)
        }
        unsafe fn splatf(v: f32) -> [f32; 16] {
            [v; 16]
        }
        unsafe fn zerof() -> [f32; 16] {
            [0.0; 16]
        }
        unsafe fn mul(a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
            std::array::from_fn(|i| a[i] * b[i])
        }
        unsafe fn fmadd(a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
            std::array::from_fn(|i| a[i].mul_add(b[i], c[i]))
        }
        unsafe fn store(p: *mut f32, v: [f32; 16], valid: usize) {
            debug_assert!(valid <= LANES);
            for (i, v) in v.iter().take(valid).enumerate() {
                unsafe { *p.add(i) = *v };
            }
        }
        unsafe fn prefetch(_: *const u8) {}
    }
}
