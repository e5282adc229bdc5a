//! Quantized weight matrices and the CPU kernels that multiply by them without expanding
//! them to f32.
//!
//! Weights stay in the blocks the model file stores and are read in place from the memory
//! map: Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 (32 elements per block, an f16 scale, for Q4_1/Q5_1
//! an f16 minimum) and the k-quants Q4_K, Q5_K and Q6_K (256 elements per super-block, whose
//! sub-blocks of 32 or 16 carry small integer scales and minima under f16 super-block ones).
//! Activations are quantized per call to 8-bit blocks of 32, each with an f32 scale `d` and
//! the scaled sum `s = d · Σq`, so every block product is an integer dot:
//!
//! - Q8_0: `Σ (dw·w)(dx·x) = dw·dx · Σ w·x`
//! - Q4_1, Q5_1: `Σ (dw·w + m)(dx·x) = dw·dx · Σ w·x + m·s`
//! - Q4_0, Q5_0: Q4_1 with `m = −8·dw` (`−16·dw`: their quants are stored offset by 8, 16)
//! - Q4_K, Q5_K: sub-block `j` of 32 is `(d·scⱼ)·q − dmin·mⱼ`, so the same with
//!   `dw = d·scⱼ` and `m = −dmin·mⱼ`: one activation block meets one sub-block
//! - Q6_K: `d·sc·(q − 32)` with a scale per 16; the integer sums of the two halves of an
//!   activation block are weighted by their scales before the block's one f32 multiply
//!
//! A decode step therefore streams the file's 4.5–6.6 bits per weight instead of 32. The SIMD
//! kernels are chosen at run time; the portable ones are the reference tests compare them to,
//! and [`sub_block`] (checked against the GGUF reader's dequantization) defines what every
//! kernel computes.

use std::sync::Arc;

use rayon::prelude::*;

use super::tensor::CpuTensor;

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K/Q5_K super-block, packed in
/// 12 bytes: sub-blocks 0–3 keep theirs in the low six bits of bytes `j` (scale) and `j + 4`
/// (minimum); sub-blocks 4–7 keep their low four bits in the nibbles of byte `j + 4` and
/// their top two bits in the top bits of bytes `j − 4` (scale) and `j` (minimum).
pub fn k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0f) | (scales[j - 4] >> 6) << 4,
            (scales[j + 4] >> 4) | (scales[j] >> 6) << 4,
        )
    }
}

mod kpanel;
mod panel;
use kpanel::KPanels;
use panel::Panels;
pub use panel::available as panel_kernel_available;

/// Elements per activation block, and per block of the 32-element weight formats.
pub const BLOCK: usize = 32;

/// Elements per k-quant super-block.
pub const SUPER_BLOCK: usize = 256;

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
    /// f16 scale + 32 × 5-bit (fifth bits in one u32), offset by 16.
    Q5_0,
    /// f16 scale + f16 minimum + 32 × 5-bit.
    Q5_1,
    /// 256 × 4-bit: f16 scale and minimum, 6-bit scale and minimum per 32.
    Q4_K,
    /// 256 × 5-bit: as Q4_K, with 32 bytes of fifth bits.
    Q5_K,
    /// 256 × 6-bit, offset by 32: f16 scale, i8 scale per 16.
    Q6_K,
}

impl QuantFormat {
    /// Every format, in the order messages list them.
    pub const ALL: [QuantFormat; 8] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ];

    /// Bytes of one block (a super-block for the k-quants).
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q5_1 => 24,
            QuantFormat::Q4_K => 144,
            QuantFormat::Q5_K => 176,
            QuantFormat::Q6_K => 210,
        }
    }

    /// Elements of one block: [`BLOCK`], or [`SUPER_BLOCK`] for the k-quants.
    pub const fn block_elems(self) -> usize {
        if self.is_k() { SUPER_BLOCK } else { BLOCK }
    }

    /// Whether this is a k-quant (256-element super-blocks).
    pub const fn is_k(self) -> bool {
        matches!(
            self,
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K
        )
    }

    /// Bits stored per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / self.block_elems() as f64
    }

    /// ggml's name of the format.
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q5_0 => "Q5_0",
            QuantFormat::Q5_1 => "Q5_1",
            QuantFormat::Q4_K => "Q4_K",
            QuantFormat::Q5_K => "Q5_K",
            QuantFormat::Q6_K => "Q6_K",
        }
    }

    /// Whether the row-layout SIMD kernels of the parent module's first generation (one
    /// 32-element block with its f16 scale at its start) serve it.
    const fn is_legacy(self) -> bool {
        matches!(
            self,
            QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q4_1
        )
    }
}

/// One 32-element sub-block of a weight row, in the form every kernel computes with: element
/// `i` is `d · sc[i / 16] · (q[i] − offset) + min`, with `q` unsigned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubBlock {
    /// The unsigned quants, in element order.
    pub q: [u8; BLOCK],
    /// f32 scale (the block's, or the super-block's f16 `d`).
    pub d: f32,
    /// Integer scale of each half of 16 (1 for the 32-element formats; the 6-bit sub-block
    /// scale twice for Q4_K/Q5_K; Q6_K's two i8 scales).
    pub sc: [i32; 2],
    /// What the stored quants are offset by (Q8_0 128, Q4_0 8, Q5_0 16, Q6_K 32, else 0).
    pub offset: i32,
    /// Added to every element (Q4_1/Q5_1's minimum, `−dmin · m` for Q4_K/Q5_K, else −0).
    pub min: f32,
}

impl SubBlock {
    /// Element `i` as f32, rounded exactly as the GGUF reader's dequantization rounds it.
    pub fn value(&self, i: usize) -> f32 {
        // `d · 1` is exact, so the 32-element formats round as `d · q + m`.
        let q = (i32::from(self.q[i]) - self.offset) as f32;
        self.d * self.sc[i / 16] as f32 * q + self.min
    }
}

/// The `min` of formats without one: adding −0 changes no value, not even the sign of a zero.
const NO_MIN: f32 = -0.0;

/// Sub-block `k` (elements `32k..32k + 32`) of a row of `format` blocks: the reference of what
/// every kernel computes, checked against the GGUF reader's dequantization.
pub fn sub_block(format: QuantFormat, row: &[u8], k: usize) -> SubBlock {
    let f16 = |b: &[u8], at: usize| f16_at(b, at);
    let nibbles = |qs: &[u8]| -> [u8; BLOCK] {
        std::array::from_fn(|i| {
            if i < 16 {
                qs[i] & 0x0f
            } else {
                qs[i - 16] >> 4
            }
        })
    };
    let with_high = |mut q: [u8; BLOCK], qh: u32| {
        for (i, q) in q.iter_mut().enumerate() {
            *q |= (((qh >> i) & 1) as u8) << 4;
        }
        q
    };
    let plain = |q, d, offset, min| SubBlock {
        q,
        d,
        sc: [1, 1],
        offset,
        min,
    };
    if !format.is_k() {
        let b = &row[k * format.block_bytes()..(k + 1) * format.block_bytes()];
        let d = f16(b, 0);
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        return match format {
            QuantFormat::Q8_0 => plain(std::array::from_fn(|i| b[2 + i] ^ 0x80), d, 128, NO_MIN),
            QuantFormat::Q4_0 => plain(nibbles(&b[2..]), d, 8, NO_MIN),
            QuantFormat::Q4_1 => plain(nibbles(&b[4..]), d, 0, f16(b, 2)),
            QuantFormat::Q5_0 => plain(with_high(nibbles(&b[6..]), u32_at(2)), d, 16, NO_MIN),
            QuantFormat::Q5_1 => plain(with_high(nibbles(&b[8..]), u32_at(4)), d, 0, f16(b, 2)),
            _ => unreachable!("k-quants below"),
        };
    }
    let sb = &row[(k / 8) * format.block_bytes()..(k / 8 + 1) * format.block_bytes()];
    let j = k % 8;
    match format {
        QuantFormat::Q4_K | QuantFormat::Q5_K => {
            let (d, dmin) = (f16(sb, 0), f16(sb, 2));
            let (sc, m) = k_scale_min(&sb[4..16], j);
            let (qh, qs) = match format {
                QuantFormat::Q5_K => (Some(&sb[16..48]), &sb[48..176]),
                _ => (None, &sb[16..144]),
            };
            let q = std::array::from_fn(|l| {
                let byte = qs[32 * (j / 2) + l];
                let low = if j.is_multiple_of(2) {
                    byte & 0x0f
                } else {
                    byte >> 4
                };
                low | qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4)
            });
            SubBlock {
                q,
                d,
                sc: [i32::from(sc); 2],
                offset: 0,
                min: -(dmin * f32::from(m)),
            }
        }
        QuantFormat::Q6_K => {
            let (ql, qh, sc) = (&sb[..128], &sb[128..192], &sb[192..208]);
            let (n, t) = (j / 4, j % 4);
            let q = std::array::from_fn(|l| {
                let byte = ql[64 * n + 32 * (t % 2) + l];
                let low = if t < 2 { byte & 0x0f } else { byte >> 4 };
                low | ((qh[32 * n + l] >> (2 * t)) & 3) << 4
            });
            SubBlock {
                q,
                d: f16(sb, 208),
                sc: [i32::from(sc[2 * j] as i8), i32::from(sc[2 * j + 1] as i8)],
                offset: 32,
                min: NO_MIN,
            }
        }
        _ => unreachable!("32-element formats above"),
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
    storage: Storage,
}

/// Where a matrix's blocks are and in which order.
#[derive(Debug, Clone)]
enum Storage {
    /// The file's layout, row after row (usually inside the memory map).
    Rows(SharedBytes),
    /// Sixteen rows interleaved per panel for the AVX-512 kernel ([`QuantMatrix::to_panels`]).
    Panels(Arc<Panels>),
    /// The same for Q5_0, Q5_1 and the k-quants (the `kpanel` module).
    KPanels(Arc<KPanels>),
}

/// Why bytes cannot be a quantized matrix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantShapeError {
    /// Rows must be whole blocks.
    #[error("a {format:?} row must be a multiple of {} elements, not {cols}", format.block_elems())]
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
        if !cols.is_multiple_of(format.block_elems()) {
            return Err(QuantShapeError::PartialBlock { format, cols });
        }
        let want = rows * (cols / format.block_elems()) * format.block_bytes();
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
            storage: Storage::Rows(bytes),
        })
    }

    /// The same matrix repacked into panels of sixteen interleaved rows, which the AVX-512
    /// VNNI kernel multiplies (see the `panel` module); a copy, the same size as the file's
    /// blocks. A panel matrix is returned as it is.
    pub fn to_panels(&self) -> Self {
        match &self.storage {
            Storage::Rows(bytes) if kpanel::handles(self.format) => Self {
                storage: Storage::KPanels(Arc::new(KPanels::pack(self, bytes.as_slice()))),
                ..self.clone()
            },
            Storage::Rows(bytes) => Self {
                storage: Storage::Panels(Arc::new(Panels::pack(self, bytes.as_slice()))),
                ..self.clone()
            },
            Storage::Panels(_) | Storage::KPanels(_) => self.clone(),
        }
    }

    /// The layout this CPU multiplies fastest: panels where the AVX-512 kernel runs
    /// ([`panel_kernel_available`]), otherwise the file's rows, left in place.
    pub fn for_this_cpu(self) -> Self {
        if panel::available() {
            self.to_panels()
        } else {
            self
        }
    }

    /// Whether the blocks are repacked into panels.
    pub fn is_panels(&self) -> bool {
        matches!(self.storage, Storage::Panels(_) | Storage::KPanels(_))
    }

    /// Quantizes a row-major `[rows, cols]` f32 matrix (for tests and benchmarks; model files
    /// arrive quantized): Q8_0, Q4_0 and Q4_1 the way ggml's reference quantizers do, the other
    /// formats by a plain min/max rule (ggml searches for better scales; a valid block either
    /// way).
    ///
    /// # Panics
    /// If `cols` is not a multiple of the format's block or `data` is not `rows * cols` long.
    pub fn quantize(format: QuantFormat, rows: usize, cols: usize, data: &[f32]) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "quantize: data does not match shape"
        );
        assert!(
            cols.is_multiple_of(format.block_elems()),
            "quantize: partial block"
        );
        let mut bytes =
            Vec::with_capacity(rows * cols / format.block_elems() * format.block_bytes());
        if !format.is_legacy() {
            for block in data.chunks_exact(format.block_elems()) {
                quantize_block_plain(format, block, &mut bytes);
            }
            return Self::new(format, rows, cols, SharedBytes::from_vec(bytes))
                .expect("quantize: shape");
        }
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
                _ => {
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
        self.cols / self.format.block_elems() * self.format.block_bytes()
    }

    /// The stored bytes, in whichever layout they are.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Rows(bytes) => bytes.as_slice(),
            Storage::Panels(p) => p.bytes(),
            Storage::KPanels(p) => p.bytes(),
        }
    }

    /// Row `r` as f32 (the reference dequantization; both layouts give the same values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rows = match &self.storage {
            Storage::Rows(bytes) => bytes.as_slice(),
            Storage::Panels(p) => return p.dequantize_row(self.format, r, out),
            Storage::KPanels(p) => return p.dequantize_row(self.format, r, out),
        };
        let rb = self.row_bytes();
        let row = &rows[r * rb..(r + 1) * rb];
        if !self.format.is_legacy() {
            for (k, y) in out[..self.cols].chunks_exact_mut(BLOCK).enumerate() {
                let sub = sub_block(self.format, row, k);
                for (i, y) in y.iter_mut().enumerate() {
                    *y = sub.value(i);
                }
            }
            return;
        }
        for (block, y) in row
            .chunks_exact(self.format.block_bytes())
            .zip(out.chunks_exact_mut(BLOCK))
        {
            dequantize_block(self.format, block, y);
        }
    }
}

/// One block of a format other than Q8_0/Q4_0/Q4_1 by min/max rules, appended to `out`.
fn quantize_block_plain(format: QuantFormat, v: &[f32], out: &mut Vec<u8>) {
    let f16 = |x: f32| half::f16::from_f32(x);
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    let min_max = |v: &[f32]| {
        v.iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            })
    };
    // The value of largest magnitude, keeping its sign.
    let extreme = |v: &[f32]| {
        v.iter()
            .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m })
    };
    let pack5 = |q: &[u8; BLOCK], out: &mut Vec<u8>| {
        let qh = q
            .iter()
            .enumerate()
            .fold(0u32, |h, (i, &q)| h | u32::from(q >> 4) << i);
        out.extend(qh.to_le_bytes());
        out.extend((0..16).map(|i| (q[i] & 0x0f) | (q[i + 16] & 0x0f) << 4));
    };
    match format {
        QuantFormat::Q5_0 => {
            let d = f16(extreme(v) / -16.0);
            let id = inv(d.to_f32());
            let q = std::array::from_fn(|i| ((v[i] * id + 16.5) as i32).clamp(0, 31) as u8);
            out.extend(d.to_le_bytes());
            pack5(&q, out);
        }
        QuantFormat::Q5_1 => {
            let (lo, hi) = min_max(v);
            let (d, m) = (f16((hi - lo) / 31.0), f16(lo));
            let id = inv(d.to_f32());
            let q = std::array::from_fn(|i| {
                (((v[i] - m.to_f32()) * id + 0.5) as i32).clamp(0, 31) as u8
            });
            out.extend(d.to_le_bytes());
            out.extend(m.to_le_bytes());
            pack5(&q, out);
        }
        QuantFormat::Q4_K | QuantFormat::Q5_K => {
            let top = if format == QuantFormat::Q4_K {
                15.0
            } else {
                31.0
            };
            // Per sub-block: a scale over [min(0, lo), hi] and the minimum's magnitude.
            let (scales, mins): (Vec<f32>, Vec<f32>) = v
                .chunks_exact(BLOCK)
                .map(|s| {
                    let (lo, hi) = min_max(s);
                    let lo = lo.min(0.0);
                    ((hi - lo) / top, -lo)
                })
                .unzip();
            let d = f16(scales.iter().fold(0.0f32, |a, &b| a.max(b)) / 63.0);
            let dmin = f16(mins.iter().fold(0.0f32, |a, &b| a.max(b)) / 63.0);
            let q6 = |x: f32, d: f32| ((x * inv(d)).round() as i32).clamp(0, 63) as u8;
            let sc: Vec<u8> = scales.iter().map(|&s| q6(s, d.to_f32())).collect();
            let m: Vec<u8> = mins.iter().map(|&x| q6(x, dmin.to_f32())).collect();
            out.extend(d.to_le_bytes());
            out.extend(dmin.to_le_bytes());
            for i in 0..4 {
                out.push((sc[i] & 63) | (sc[i + 4] >> 4) << 6);
            }
            for i in 0..4 {
                out.push((m[i] & 63) | (m[i + 4] >> 4) << 6);
            }
            for i in 0..4 {
                out.push((sc[i + 4] & 15) | (m[i + 4] & 15) << 4);
            }
            let q: Vec<u8> = v
                .iter()
                .enumerate()
                .map(|(e, &x)| {
                    let j = e / BLOCK;
                    let step = d.to_f32() * f32::from(sc[j]);
                    let x = x + dmin.to_f32() * f32::from(m[j]);
                    ((x * inv(step)).round() as i32).clamp(0, top as i32) as u8
                })
                .collect();
            if format == QuantFormat::Q5_K {
                out.extend((0..32).map(|l| (0..8).fold(0u8, |h, j| h | (q[32 * j + l] >> 4) << j)));
            }
            for pair in 0..4 {
                out.extend(
                    (0..32)
                        .map(|l| (q[64 * pair + l] & 0x0f) | (q[64 * pair + 32 + l] & 0x0f) << 4),
                );
            }
        }
        QuantFormat::Q6_K => {
            let scales: Vec<f32> = v.chunks_exact(16).map(|s| extreme(s) / -32.0).collect();
            let d = f16(scales.iter().fold(0.0f32, |a, &b| a.max(b.abs())) / 127.0);
            let sc: Vec<i8> = scales
                .iter()
                .map(|&s| ((s * inv(d.to_f32())).round() as i32).clamp(-128, 127) as i8)
                .collect();
            let q: Vec<u8> = v
                .iter()
                .enumerate()
                .map(|(e, &x)| {
                    let step = d.to_f32() * f32::from(sc[e / 16]);
                    ((x * inv(step)).round() as i32 + 32).clamp(0, 63) as u8
                })
                .collect();
            let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
            for (e, &q) in q.iter().enumerate() {
                let (n, t, l) = (e / 128, (e % 128) / 32, e % 32);
                ql[64 * n + 32 * (t % 2) + l] |= (q & 0x0f) << (4 * (t / 2));
                qh[32 * n + l] |= (q >> 4) << (2 * t);
            }
            out.extend(ql);
            out.extend(qh);
            out.extend(sc.iter().map(|&s| s as u8));
            out.extend(d.to_le_bytes());
        }
        QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
            unreachable!("quantized by QuantMatrix::quantize")
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
        _ => unreachable!("the other formats dequantize through sub_block"),
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
    /// `Σq` of each block.
    pub sums: Vec<i32>,
    /// `Σq` of the first 16 values of each block (for weights with a scale per 16).
    pub sums_lo: Vec<i32>,
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
            sums: vec![0; nb],
            sums_lo: vec![0; nb],
        };
        let simd = use_simd(QuantKernel::Auto);
        type Block<'a> = (&'a mut [i8], ((&'a mut f32, &'a mut f32), &'a mut i32));
        let work = |(b, (qs, ((d, s), sum))): (usize, Block<'_>)| {
            let src = &x.data[b * BLOCK..(b + 1) * BLOCK];
            match simd {
                // SAFETY: detect_simd picked the kernel only if the CPU has its features;
                // `src` and `qs` are one block each.
                #[cfg(target_arch = "x86_64")]
                Simd::Vnni | Simd::Avx2 => unsafe { quantize_block_avx2(src, qs, d, s, sum) },
                Simd::Portable => quantize_block(src, qs, d, s, sum),
            }
        };
        let blocks = out
            .qs
            .chunks_exact_mut(BLOCK)
            .zip(
                out.d
                    .iter_mut()
                    .zip(out.s.iter_mut())
                    .zip(out.sums.iter_mut()),
            )
            .enumerate();
        // Prefill chunks quantize hundreds of thousands of values; a decode row is 18 blocks.
        if nb >= 4096 {
            let blocks: Vec<_> = blocks.collect();
            blocks.into_par_iter().with_min_len(256).for_each(work);
        } else {
            blocks.for_each(work);
        }
        for (lo, qs) in out.sums_lo.iter_mut().zip(out.qs.chunks_exact(BLOCK)) {
            *lo = qs[..BLOCK / 2].iter().map(|&q| i32::from(q)).sum();
        }
        out
    }

    fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }
}

/// One block of 32 values to 8 bits with scale `d = max|v| / 127`, rounding half to even (as
/// the SIMD quantizers do), `d · Σq` and `Σq`: the portable reference. Both scales stay f32 (ggml
/// rounds them to f16; that bought no closer agreement with llama.cpp, see docs/models.md).
fn quantize_block(src: &[f32], qs: &mut [i8], d: &mut f32, s: &mut f32, total: &mut i32) {
    let amax = src.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(src) {
        let r = (v * inv).round_ties_even() as i32;
        *q = r as i8;
        sum += r;
    }
    *d = scale;
    *s = scale * sum as f32;
    *total = sum;
}

/// [`quantize_block`] with AVX2: one block of 32 values to 8 bits (rounding half to
/// even, as `cvtps2dq` does), its scale, `d · Σq` and `Σq`.
///
/// # Safety
/// The CPU must support the module's features; `src` and `qs` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block_avx2(
    src: &[f32],
    qs: &mut [i8],
    d: &mut f32,
    s: &mut f32,
    isum: &mut i32,
) {
    debug_assert!(src.len() >= BLOCK && qs.len() >= BLOCK);
    use std::arch::x86_64::*;
    unsafe {
        let p = src.as_ptr();
        let v = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(p.add(i)));
        let sign = _mm256_set1_ps(-0.0);
        let a = v.map(|v| _mm256_andnot_ps(sign, v));
        let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
        let scale = amax / 127.0;
        let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
        let q = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, inv)));
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let t = _mm_add_epi32(
            _mm256_castsi256_si128(total),
            _mm256_extracti128_si256::<1>(total),
        );
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01_00_11_10>(t));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t)));
        // Packing works within 128-bit halves; the permute restores element order.
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, bytes);
        *d = scale;
        *s = scale * sum as f32;
        *isum = sum;
    }
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
    if !format.is_legacy() {
        return dots_sub_blocks(format, w, x, rows, out);
    }
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
                _ => {
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

/// [`dots_generic`] for any format through [`sub_block`]: per activation block, the integer
/// sums of each half of 16 with the offset taken out, weighted by the halves' integer scales,
/// then one multiply by `d · dx` and the minimum term `min · s`.
fn dots_sub_blocks(
    format: QuantFormat,
    w: &[u8],
    x: &Q8Rows,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let nb = x.blocks_per_row();
    let n = rows.len();
    out[..n].fill(0.0);
    for b in 0..nb {
        let sub = sub_block(format, w, b);
        for (o, r) in out[..n].iter_mut().zip(rows.clone()) {
            let xi = r * nb + b;
            let xq = &x.qs[xi * BLOCK..(xi + 1) * BLOCK];
            let half = |h: usize| -> i32 {
                let (q, xs) = (&sub.q[16 * h..16 * h + 16], &xq[16 * h..16 * h + 16]);
                let dot: i32 = q
                    .iter()
                    .zip(xs)
                    .map(|(&q, &x)| i32::from(q) * i32::from(x))
                    .sum();
                let sum: i32 = xs.iter().map(|&x| i32::from(x)).sum();
                dot - sub.offset * sum
            };
            let dot = sub.sc[0] * half(0) + sub.sc[1] * half(1);
            *o += sub.d * x.d[xi] * dot as f32 + sub.min * x.s[xi];
        }
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
            use super::{BLOCK, Q8Rows, QuantFormat, QuantMatrix};
            use std::arch::x86_64::*;
            use std::ops::Range;

            #[inline(always)]
            unsafe fn hsum(v: __m256) -> f32 {
                unsafe {
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
                }
            }

            /// Like `dots_generic` for weight rows `rows` of `w` and up to four activation
            /// rows from `r0`: `out[r * rows.len() + i]` is row `r0 + r` of `x` dotted with
            /// weight row `rows.start + i`.
            ///
            /// # Safety
            /// The CPU must support the module's features; `w` must have `x.cols` columns and
            /// rows `rows`; rows `r0..r0 + n` must exist in `x`.
            #[target_feature(enable = $features)]
            pub unsafe fn dots(
                w: &QuantMatrix,
                rows: Range<usize>,
                x: &Q8Rows,
                r0: usize,
                n: usize,
                out: &mut [f32],
            ) {
                let (format, rb) = (w.format, w.row_bytes());
                let w = w.bytes();
                debug_assert!((1..=4).contains(&n));
                debug_assert!(rb >= x.cols / BLOCK * format.block_bytes());
                debug_assert!(w.len() >= rows.end * rb);
                debug_assert!((r0 + n) * x.cols <= x.qs.len());
                debug_assert!(out.len() >= n * rows.len());
                // SAFETY: forwarded from the caller. Each instance reads rows r0..r0 + R of x;
                // weight rows come `W` at a time (more for fewer activation rows, so that at
                // least four accumulators are independent), then one at a time.
                unsafe {
                    let k = Kernel {
                        w: w.as_ptr(),
                        rb,
                        x,
                        r0,
                    };
                    let (rows, out) = (rows, &mut *out);
                    match (format, n) {
                        (QuantFormat::Q8_0, 1) => k.sweep::<4, 1, Q8>(rows, out),
                        (QuantFormat::Q8_0, 2) => k.sweep::<2, 2, Q8>(rows, out),
                        (QuantFormat::Q8_0, 3) => k.sweep::<2, 3, Q8>(rows, out),
                        (QuantFormat::Q8_0, _) => k.sweep::<1, 4, Q8>(rows, out),
                        (QuantFormat::Q4_1, 1) => k.sweep::<4, 1, Q4_1>(rows, out),
                        (QuantFormat::Q4_1, 2) => k.sweep::<2, 2, Q4_1>(rows, out),
                        (QuantFormat::Q4_1, 3) => k.sweep::<2, 3, Q4_1>(rows, out),
                        (QuantFormat::Q4_1, _) => k.sweep::<1, 4, Q4_1>(rows, out),
                        (QuantFormat::Q4_0, 1) => k.sweep::<4, 1, Q4_0>(rows, out),
                        (QuantFormat::Q4_0, 2) => k.sweep::<2, 2, Q4_0>(rows, out),
                        (QuantFormat::Q4_0, 3) => k.sweep::<2, 3, Q4_0>(rows, out),
                        (QuantFormat::Q4_0, _) => k.sweep::<1, 4, Q4_0>(rows, out),
                        _ => unreachable!("the other formats have kernels of their own"),
                    }
                }
            }

            /// Format tags for [`Kernel::tile`].
            const Q8: u8 = 0;
            const Q4_0: u8 = 1;
            const Q4_1: u8 = 2;

            /// One weight matrix and one set of quantized activations.
            struct Kernel<'a> {
                w: *const u8,
                rb: usize,
                x: &'a Q8Rows,
                r0: usize,
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
                            let done = if j + W <= rows.end {
                                let t = self.tile::<W, R, F>(j);
                                for (i, t) in t.iter().enumerate() {
                                    for (r, v) in t.iter().enumerate() {
                                        out[r * len + j - rows.start + i] = *v;
                                    }
                                }
                                W
                            } else {
                                let [t] = self.tile::<1, R, F>(j);
                                for (r, v) in t.iter().enumerate() {
                                    out[r * len + j - rows.start] = *v;
                                }
                                1
                            };
                            j += done;
                        }
                    }
                }

                /// Weight rows `j..j + W` against `R` activation rows: `[weight row][act row]`.
                ///
                /// Blocks go eight at a time. Their scales (and Q4_1 minima) are converted together
                /// and multiplied by the activation scales as vectors kept in registers, so the
                /// Q4_1 minimum term is one FMA per eight blocks; each block's scale is then moved
                /// into place with one lane permute. Each Q4 block's nibbles unpack with one
                /// broadcast load, a per-lane shift and a mask, and each block of activations is
                /// used by all `W` weight rows while in L1.
                #[inline(always)]
                unsafe fn tile<const W: usize, const R: usize, const F: u8>(
                    &self,
                    j: usize,
                ) -> [[f32; R]; W] {
                    unsafe {
                        let x = self.x;
                        let nb = x.cols / BLOCK;
                        let (bb, qs_at) = match F {
                            Q8 => (34, 2),
                            Q4_0 => (18, 2),
                            _ => (20, 4),
                        };
                        let wp = self.w.add(j * self.rb);
                        let xq = x.qs.as_ptr().add(self.r0 * x.cols);
                        let xd = x.d.as_ptr().add(self.r0 * nb);
                        let xs = x.s.as_ptr().add(self.r0 * nb);
                        // Low nibbles to the lower 128 bits, high nibbles to the upper.
                        let shifts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
                        let low4 = _mm256_set1_epi8(0x0f);
                        let mut acc = [[_mm256_setzero_ps(); R]; W];
                        let mut scale = [[_mm256_setzero_ps(); R]; W];
                        let mut b = 0;
                        while b < nb {
                            let n = (nb - b).min(8);
                            let lanes = first_lanes(n);
                            for wi in 0..W {
                                let (d, m) = scales8(wp.add(wi * self.rb + b * bb), bb, n);
                                for r in 0..R {
                                    let at = r * nb + b;
                                    let dx = _mm256_maskload_ps(xd.add(at), lanes);
                                    scale[wi][r] = _mm256_mul_ps(d, dx);
                                    if F != Q8 {
                                        // The minimum term, Σ m·s, for eight blocks at once
                                        // (Q4_0's minimum is -8 times its scale).
                                        let m = if F == Q4_1 {
                                            m
                                        } else {
                                            _mm256_mul_ps(d, _mm256_set1_ps(-8.0))
                                        };
                                        let sx = _mm256_maskload_ps(xs.add(at), lanes);
                                        acc[wi][r] = _mm256_fmadd_ps(m, sx, acc[wi][r]);
                                    }
                                }
                            }
                            for i in 0..n {
                                let blk = b + i;
                                let lane = _mm256_set1_epi32(i as i32);
                                for wi in 0..W {
                                    let p = wp.add(wi * self.rb + blk * bb + qs_at);
                                    // A hint only: it never faults, even past the end.
                                    _mm_prefetch::<_MM_HINT_T0>(
                                        p.wrapping_add(super::PREFETCH_BYTES) as *const i8,
                                    );
                                    let wv = if F == Q8 {
                                        _mm256_loadu_si256(p as *const __m256i)
                                    } else {
                                        let raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                            p as *const __m128i,
                                        ));
                                        _mm256_and_si256(_mm256_srlv_epi32(raw, shifts), low4)
                                    };
                                    for r in 0..R {
                                        let xv = _mm256_loadu_si256(
                                            xq.add(r * x.cols + blk * BLOCK) as *const __m256i,
                                        );
                                        let prod = if F == Q8 {
                                            // |w| times x with w's sign: unsigned by signed.
                                            $udot!(
                                                _mm256_sign_epi8(wv, wv),
                                                _mm256_sign_epi8(xv, wv)
                                            )
                                        } else {
                                            $udot!(wv, xv)
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

            /// The f16 scales (and, for Q4_1, minima) of the first `n` (≤ 8) of eight blocks
            /// `stride` bytes apart from `p`, as f32; lanes from `n` on are zero and read nothing.
            ///
            /// Each block's leading four bytes are read as one integer (measured a little faster
            /// than `vpgatherdd` here); a byte shuffle and a quad-word permute put the eight
            /// scales in one half and the eight minima in the other, each converted by one
            /// `vcvtph2ps`.
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
        }
    };
}

mod rows_k;

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

/// How far ahead of the weight byte it is reading an integer kernel asks for the cache line,
/// in bytes. A decode step streams about 100 MB of weights through each core; without the hint
/// the kernels ran at about half the read bandwidth the same process measured, with it (at
/// 2–16 KiB) noticeably closer, on `cargo bench -p ballast-engine --bench real_model`.
const PREFETCH_BYTES: usize = 4096;

/// Whether environment variable `name` is set to something other than the empty string.
fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// The fastest integer kernel this CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Simd {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

/// The CPU kernel family `BALLAST_CPU_KERNEL` pins, for checking each path a CPU can take on
/// one machine (the agreement tests run the model on every one) and for measuring them side
/// by side. Unset or `auto`: the fastest this CPU runs.
///
/// | value | weights | products |
/// | --- | --- | --- |
/// | `avx512-panels` | panels | the AVX-512 VNNI kernel (where the CPU has it) |
/// | `emulated-panels` | panels | the AVX-512 kernel's own logic on emulated operations (k-quants and Q5; Q4/Q8 panels: the reference loop) |
/// | `portable-panels` | panels | the reference loop over panels |
/// | `avx-vnni` | the file's rows | AVX-VNNI (where the CPU has it, else AVX2) |
/// | `avx2` | the file's rows | AVX2 |
/// | `portable` | the file's rows | portable code |
///
/// `BALLAST_NO_AVX512=1` and `BALLAST_NO_VNNI=1` (older switches) still take effect under
/// `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuKernel {
    /// The fastest this CPU runs.
    Auto,
    /// Panels and the AVX-512 VNNI kernel.
    Avx512Panels,
    /// Panels and the AVX-512 kernel on emulated operations.
    EmulatedPanels,
    /// Panels and the reference loops.
    PortablePanels,
    /// The file's rows and AVX-VNNI.
    AvxVnni,
    /// The file's rows and AVX2.
    Avx2,
    /// The file's rows and portable code.
    Portable,
}

impl CpuKernel {
    /// Every value, in the order of the table above (after `Auto`).
    pub const ALL: [CpuKernel; 6] = [
        CpuKernel::Avx512Panels,
        CpuKernel::EmulatedPanels,
        CpuKernel::PortablePanels,
        CpuKernel::AvxVnni,
        CpuKernel::Avx2,
        CpuKernel::Portable,
    ];

    /// The value `BALLAST_CPU_KERNEL` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            CpuKernel::Auto => "auto",
            CpuKernel::Avx512Panels => "avx512-panels",
            CpuKernel::EmulatedPanels => "emulated-panels",
            CpuKernel::PortablePanels => "portable-panels",
            CpuKernel::AvxVnni => "avx-vnni",
            CpuKernel::Avx2 => "avx2",
            CpuKernel::Portable => "portable",
        }
    }

    /// Parses a `BALLAST_CPU_KERNEL` value.
    pub fn parse(s: &str) -> Option<CpuKernel> {
        if s.is_empty() || s == "auto" {
            return Some(CpuKernel::Auto);
        }
        CpuKernel::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether this CPU can run it: the hardware kernels need their instructions.
    pub fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match self {
                CpuKernel::Avx512Panels => {
                    has!("avx512f") && has!("avx512bw") && has!("avx512vnni")
                }
                CpuKernel::AvxVnni => avx2 && has!("avxvnni"),
                CpuKernel::Avx2 => avx2,
                _ => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        !matches!(
            self,
            CpuKernel::Avx512Panels | CpuKernel::AvxVnni | CpuKernel::Avx2
        )
    }
}

/// The kernel family this process uses (`BALLAST_CPU_KERNEL`, read once). An unknown value,
/// or one this CPU cannot run, is reported on stderr and `auto` is used.
pub fn cpu_kernel() -> CpuKernel {
    use std::sync::OnceLock;
    static KERNEL: OnceLock<CpuKernel> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        let Some(v) = std::env::var_os("BALLAST_CPU_KERNEL") else {
            return CpuKernel::Auto;
        };
        let v = v.to_string_lossy();
        match CpuKernel::parse(&v) {
            Some(k) if k.runs_here() => k,
            Some(_) => {
                eprintln!("BALLAST_CPU_KERNEL={v}: this CPU cannot run it; using auto");
                CpuKernel::Auto
            }
            None => {
                let names: Vec<_> = CpuKernel::ALL.iter().map(|k| k.name()).collect();
                eprintln!(
                    "BALLAST_CPU_KERNEL={v} is not one of auto, {}; using auto",
                    names.join(", ")
                );
                CpuKernel::Auto
            }
        }
    })
}

fn detect_simd() -> Simd {
    match cpu_kernel() {
        CpuKernel::Portable | CpuKernel::PortablePanels | CpuKernel::EmulatedPanels => {
            return Simd::Portable;
        }
        _ => {}
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            let vnni_off = env_flag("BALLAST_NO_VNNI") || cpu_kernel() == CpuKernel::Avx2;
            if !vnni_off && has!("avxvnni") {
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

/// Name of the integer kernel the engine's weights use on this CPU (for logs and benchmarks):
/// `avx512-vnni panels` where weights are repacked ([`QuantMatrix::for_this_cpu`]), otherwise
/// the row-layout kernel [`QuantKernel::Auto`] picks: `avx-vnni`, `avx2` or `portable`.
pub fn int8_kernel_name() -> &'static str {
    match cpu_kernel() {
        CpuKernel::EmulatedPanels => return "emulated avx512-vnni panels",
        CpuKernel::PortablePanels => return "portable panels",
        _ if panel::available() => return "avx512-vnni panels",
        _ => {}
    }
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

/// Most weight rows one task of an integer matmul takes.
const MAX_SLAB: usize = 256;

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
    match &w.storage {
        Storage::Panels(p) => {
            let act = Q8Rows::quantize(x);
            panel::matmuls(&act, &[(w, p, ptr)], kernel == QuantKernel::Portable);
            return out;
        }
        Storage::KPanels(p) => {
            let act = Q8Rows::quantize(x);
            kpanel::matmuls(&act, &[(w, p, ptr)], kernel == QuantKernel::Portable);
            return out;
        }
        Storage::Rows(_) => {}
    }
    let gemm = match kernel {
        QuantKernel::Auto => m >= GEMM_ROWS,
        QuantKernel::Gemm => true,
        QuantKernel::Int8 | QuantKernel::Portable => false,
    };
    if gemm && m >= GEMM_BY_ROWS {
        gemm_by_rows(x, w, &mut out);
        return out;
    }
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

/// From this many activation rows on, the GEMM path splits the rows of `x` between tasks
/// rather than the weight rows ([`gemm_by_rows`]).
const GEMM_BY_ROWS: usize = 256;

/// Weight values [`gemm_by_rows`] expands to f32 at a time, at most (8 MiB).
const GEMM_BLOCK_VALUES: usize = 2 << 20;

/// The GEMM path for long prefill chunks. Split by weight rows, every task's GEMM packs all
/// of `x` again (2,048 rows × 576 are 4.7 MB); at 2,048-token prompts that packing was 27 %
/// of an AVX2 prefill (`PROFILES=prefill2048 BALLAST_CPU_KERNEL=avx2
/// scripts/profile-engine.sh`). Here blocks of weight rows (all of them for the matrices of a
/// small model) are expanded to f32 once, in parallel, and each task multiplies a chunk of
/// `x`'s rows by the whole block: `x` is packed once, the block once per chunk. Every output
/// is the same GEMM's sum as in the slab path, so the results do not change.
fn gemm_by_rows(x: &CpuTensor, w: &QuantMatrix, out: &mut CpuTensor) {
    gemm_by_rows_in(x, w, out, GEMM_BLOCK_VALUES)
}

/// [`gemm_by_rows`], expanding at most `block_values` weight values at a time.
fn gemm_by_rows_in(x: &CpuTensor, w: &QuantMatrix, out: &mut CpuTensor, block_values: usize) {
    let (m, n, k) = (x.rows, w.rows, w.cols);
    let per_block = (block_values / k).clamp(LANES_MIN, n.max(LANES_MIN));
    let chunk = m.div_ceil(2 * rayon::current_num_threads().max(1)).max(64);
    let mut block = Vec::new();
    for j0 in (0..n).step_by(per_block) {
        let cols = per_block.min(n - j0);
        block.resize(cols * k, 0.0f32);
        block
            .par_chunks_mut(k)
            .enumerate()
            .for_each(|(r, row)| w.dequantize_row(j0 + r, row));
        let block = &block;
        out.data
            .par_chunks_mut(chunk * n)
            .enumerate()
            .for_each(|(c, o)| {
                let rows = o.len() / n;
                // SAFETY: x is [m, k] row-major and rows c·chunk.. of it exist; the block is
                // [cols, k] row-major, read transposed with strides (1, k); the output is this
                // task's `rows` rows of [m, n], columns j0..j0 + cols.
                unsafe {
                    matrixmultiply::sgemm(
                        rows,
                        k,
                        cols,
                        1.0,
                        x.data.as_ptr().add(c * chunk * k),
                        k as isize,
                        1,
                        block.as_ptr(),
                        1,
                        k as isize,
                        0.0,
                        o.as_mut_ptr().add(j0),
                        n as isize,
                        1,
                    );
                }
            });
    }
}

/// Fewest weight rows [`gemm_by_rows`] expands at a time, however wide the matrix.
const LANES_MIN: usize = 16;

/// Several products of the same `x` (Q, K and V; gate and up): `x` is quantized once and
/// all of them share one parallel pass. Same results as calling [`matmul`] on each.
pub fn matmul_many(x: &CpuTensor, ws: &[&QuantMatrix], kernel: QuantKernel) -> Vec<CpuTensor> {
    let panels = ws.iter().filter(|w| w.is_panels()).count();
    let together = if panels == 0 {
        match kernel {
            QuantKernel::Auto => x.rows < GEMM_ROWS,
            QuantKernel::Gemm => false,
            QuantKernel::Int8 | QuantKernel::Portable => true,
        }
    } else {
        panels == ws.len()
    };
    if !together || x.rows == 0 {
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
    if panels > 0 {
        // Matrices of both panel layouts (a Q4_K_M file mixes Q8_0, Q5_0 and Q6_K in Q, K
        // and V): one pass per layout over the same quantized activations.
        let (mut old, mut new) = (Vec::new(), Vec::new());
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            let out = OutPtr(o.data.as_mut_ptr());
            match &w.storage {
                Storage::Panels(p) => old.push((*w, &**p, out)),
                Storage::KPanels(p) => new.push((*w, &**p, out)),
                Storage::Rows(_) => unreachable!("all are panels"),
            }
        }
        let portable = kernel == QuantKernel::Portable;
        if !old.is_empty() {
            panel::matmuls(&act, &old, portable);
        }
        if !new.is_empty() {
            kpanel::matmuls(&act, &new, portable);
        }
        return outs;
    }
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
        .clamp(16, MAX_SLAB);
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
        let mut tile = [0.0f32; ROW_TILE * MAX_SLAB];
        let len = cols.len();
        let mut r0 = 0;
        while r0 < m {
            let rows = ROW_TILE.min(m - r0);
            let tile = &mut tile[..rows * len];
            let legacy = w.format.is_legacy();
            match simd {
                // SAFETY (all four): detect_simd picked the kernel only if the CPU has its
                // features; `bytes` holds whole rows of `rb` bytes; rows r0..r0+rows exist;
                // each format goes to the kernels written for it.
                #[cfg(target_arch = "x86_64")]
                Simd::Vnni if legacy => unsafe { vnni::dots(w, cols.clone(), act, r0, rows, tile) },
                #[cfg(target_arch = "x86_64")]
                Simd::Avx2 if legacy => unsafe { avx2::dots(w, cols.clone(), act, r0, rows, tile) },
                #[cfg(target_arch = "x86_64")]
                Simd::Vnni => unsafe { rows_k::vnni::dots(w, cols.clone(), act, r0, rows, tile) },
                #[cfg(target_arch = "x86_64")]
                Simd::Avx2 => unsafe { rows_k::avx2::dots(w, cols.clone(), act, r0, rows, tile) },
                Simd::Portable => {
                    let mut one = [0.0f32; ROW_TILE];
                    for (c, j) in cols.clone().enumerate() {
                        let wr = &bytes[j * rb..(j + 1) * rb];
                        dots_generic(w.format, wr, act, r0..r0 + rows, &mut one);
                        for r in 0..rows {
                            tile[r * len + c] = one[r];
                        }
                    }
                }
            }
            for (r, vals) in tile.chunks_exact(len).enumerate() {
                // SAFETY: row r0 + r, columns `cols` are in bounds of this job's [m, n] output
                // and those columns belong to this slab only.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        vals.as_ptr(),
                        p.0.add((r0 + r) * n + cols.start),
                        len,
                    )
                };
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
        if !format.is_legacy() {
            return random_blocks_matrix(format, rows, cols, rng);
        }
        let blocks = rows * cols / BLOCK;
        let mut bytes = Vec::with_capacity(blocks * format.block_bytes());
        for _ in 0..blocks {
            let d = half::f16::from_f32(rng.next_f32() * 0.02 + 0.001);
            bytes.extend_from_slice(&d.to_le_bytes());
            match format {
                QuantFormat::Q8_0 => {
                    bytes.extend((0..32).map(|_| (rng.next_u64() & 0xff) as u8));
                }
                _ => {
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

    /// Random bytes as `format` blocks, with small positive f16 scales (and minima of either
    /// sign) where the format keeps them, so every quant and sub-block scale pattern occurs.
    fn random_blocks_matrix(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        rng: &mut SplitMix64,
    ) -> QuantMatrix {
        let blocks = rows * cols / format.block_elems();
        let bb = format.block_bytes();
        let mut bytes: Vec<u8> = (0..blocks * bb).map(|_| rng.next_u64() as u8).collect();
        let f16s: &[(usize, bool)] = match format {
            QuantFormat::Q5_0 => &[(0, false)],
            QuantFormat::Q5_1 => &[(0, false), (2, true)],
            QuantFormat::Q4_K | QuantFormat::Q5_K => &[(0, false), (2, false)],
            QuantFormat::Q6_K => &[(208, false)],
            _ => &[(0, false)],
        };
        for b in bytes.chunks_exact_mut(bb) {
            for &(at, signed) in f16s {
                let mut v = rng.next_f32() * 0.02 + 0.0005;
                if format.is_k() {
                    v /= 16.0; // times sub-block scales up to 63 (Q6_K: ±128)
                }
                if signed {
                    v = (rng.next_f32() - 0.5) * 0.2;
                }
                b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
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

    /// Formats added with the k-quants, whose kernels read them through other code paths.
    const NEW_FORMATS: [QuantFormat; 5] = [
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ];

    /// Every kernel for the formats added with the k-quants (portable rows, SIMD rows, panels
    /// portable and SIMD), against the f32 product with their dequantized values (within what
    /// rounding the activations allows) and against each other (the same integer sums, summed
    /// in another order): widths from one super-block to SmolLM2's 1,536, row counts through
    /// every tile shape, 37 weight rows (panels and a padded one).
    #[test]
    fn new_formats_every_kernel_matches_the_dequantized_product() {
        let mut rng = SplitMix64::new(77);
        for format in NEW_FORMATS {
            for k in [256, 512, 1536] {
                let w = random_matrix(format, 37, k, &mut rng);
                let p = w.to_panels();
                for m in [1, 2, 3, 4, 5, 7, 8, 9, 17, 30] {
                    let x = random_x(m, k, &mut rng);
                    let (exact, bound) = dequantized_product(&x, &w);
                    let portable = matmul(&x, &w, QuantKernel::Portable);
                    let others = [
                        ("int8 rows", matmul(&x, &w, QuantKernel::Int8)),
                        ("auto rows", matmul(&x, &w, QuantKernel::Auto)),
                        ("portable panels", matmul(&x, &p, QuantKernel::Portable)),
                        ("auto panels", matmul(&x, &p, QuantKernel::Auto)),
                    ];
                    for (i, (e, b)) in exact.iter().zip(&bound).enumerate() {
                        let pv = portable.data[i];
                        assert!(
                            (e - pv).abs() <= *b,
                            "{format:?} k={k} m={m} [{i}]: portable {pv} vs exact {e}"
                        );
                        for (name, o) in &others {
                            let ov = o.data[i];
                            // The GEMM path multiplies the dequantized weights by x itself.
                            let gemm = m >= GEMM_ROWS
                                && (*name == "auto rows"
                                    || (*name == "auto panels" && !p.is_panels()));
                            let tol = if gemm {
                                1e-3 * (1.0 + e.abs())
                            } else {
                                1e-4 * (1.0 + pv.abs())
                            };
                            let want = if gemm { *e } else { pv };
                            assert!(
                                (ov - want).abs() <= tol,
                                "{format:?} k={k} m={m} [{i}]: {name} {ov} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The AVX-512 panel kernel's tile logic, run on the emulated operations (any CPU), against
    /// the reference loop over the same panels: every tile shape (1–8 activation rows, one,
    /// two or four panels at a time, a padded last panel), every new format.
    #[test]
    fn emulated_avx512_panel_kernel_matches_the_reference_loop() {
        let mut rng = SplitMix64::new(99);
        for format in NEW_FORMATS {
            for (n, k) in [(37, 256), (80, 512), (16, 1536)] {
                let w = random_matrix(format, n, k, &mut rng);
                let p = w.to_panels();
                let Storage::KPanels(kp) = &p.storage else {
                    panic!("{format:?} packs into k-panels");
                };
                for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17] {
                    let x = random_x(m, k, &mut rng);
                    let act = Q8Rows::quantize(&x);
                    let want = matmul(&x, &p, QuantKernel::Portable);
                    let mut got = CpuTensor::zeros(m, n);
                    let out = OutPtr(got.data.as_mut_ptr());
                    kpanel::emulated_dots(&p, kp, 0..n.div_ceil(16), &act, 0..m, out);
                    for (i, (w, g)) in want.data.iter().zip(&got.data).enumerate() {
                        assert!(
                            (w - g).abs() <= 1e-4 * (1.0 + w.abs()),
                            "{format:?} n={n} k={k} m={m} [{}, {}]: emulated {g} vs {w}",
                            i / n,
                            i % n
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn new_format_panels_dequantize_to_the_same_values_as_rows() {
        let mut rng = SplitMix64::new(32);
        for format in NEW_FORMATS {
            let w = random_matrix(format, 37, 512, &mut rng);
            let p = w.to_panels();
            assert!(p.is_panels(), "{format:?}");
            let (mut want, mut got) = (vec![0.0; 512], vec![0.0; 512]);
            for r in 0..37 {
                w.dequantize_row(r, &mut want);
                p.dequantize_row(r, &mut got);
                assert_eq!(
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{format:?} row {r}"
                );
            }
            let bits = p.bytes().len() as f64 * 8.0 / (48.0 * 512.0);
            let extra = match format {
                QuantFormat::Q4_K | QuantFormat::Q5_K => 0.125, // 6-bit scales as bytes
                _ => 0.0,
            };
            assert!(
                (bits - format.bits_per_weight() - extra).abs() < 0.01,
                "{format:?}: {bits} bits per weight in panels"
            );
        }
    }

    #[test]
    fn sub_blocks_dequantize_as_the_gguf_reader_does() {
        use crate::compute::model::gguf::{GgmlType, dequantize};
        let mut rng = SplitMix64::new(8);
        for format in QuantFormat::ALL {
            let dtype = crate::compute::model::gguf::quant_format_type(format);
            assert_eq!(dtype.name(), format.name());
            let w = random_matrix(format, 3, 512, &mut rng);
            let mut want = vec![0.0; 3 * 512];
            dequantize(dtype, w.bytes(), &mut want).unwrap();
            let mut row = vec![0.0; 512];
            for r in 0..3 {
                let rb = w.row_bytes();
                for k in 0..512 / BLOCK {
                    let sub = sub_block(format, &w.bytes()[r * rb..(r + 1) * rb], k);
                    for i in 0..BLOCK {
                        let (a, b) = (sub.value(i), want[r * 512 + k * BLOCK + i]);
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{format:?} row {r} [{k}·32+{i}]: {a} vs {b}, {sub:?}"
                        );
                    }
                }
                if !format.is_legacy() {
                    w.dequantize_row(r, &mut row);
                    assert_eq!(row, want[r * 512..(r + 1) * 512], "{format:?} row {r}");
                }
            }
            let _ = GgmlType::F32;
        }
    }

    #[test]
    fn plain_quantizers_round_trip_within_a_step() {
        let mut rng = SplitMix64::new(19);
        for format in NEW_FORMATS {
            let x = random_x(2, 512, &mut rng);
            let q = QuantMatrix::quantize(format, 2, 512, &x.data);
            let mut row = vec![0.0; 512];
            for r in 0..2 {
                q.dequantize_row(r, &mut row);
                let span = x.row(r).iter().fold(0.0f32, |m, v| m.max(v.abs()));
                // Values in ±2: a 4-bit grid over a sub-block's range (4 wide) steps 0.27;
                // sub-block scales rounded to 6 bits add a little.
                let allowed = match format {
                    QuantFormat::Q4_K => 0.3,
                    QuantFormat::Q5_0 | QuantFormat::Q5_1 | QuantFormat::Q5_K => 0.15,
                    _ => 0.1,
                } * span
                    / 2.0;
                for (v, b) in x.row(r).iter().zip(&row) {
                    assert!((v - b).abs() <= allowed, "{format:?}: {v} -> {b}");
                }
            }
        }
    }

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

    #[test]
    fn long_chunks_split_by_rows_give_the_dequantized_product() {
        let mut rng = SplitMix64::new(12);
        for format in [QuantFormat::Q4_1, QuantFormat::Q8_0] {
            let w = random_matrix(format, 70, 96, &mut rng);
            for m in [GEMM_BY_ROWS, 300, 701] {
                let x = random_x(m, 96, &mut rng);
                let (exact, _) = dequantized_product(&x, &w);
                let whole = matmul(&x, &w, QuantKernel::Auto);
                // Blocks of 16 weight rows: five blocks, the last one short.
                let mut blocks = CpuTensor::zeros(m, 70);
                gemm_by_rows_in(&x, &w, &mut blocks, 16 * 96);
                for ((e, a), b) in exact.iter().zip(&whole.data).zip(&blocks.data) {
                    assert!(
                        (e - a).abs() <= 1e-3 * (1.0 + e.abs()),
                        "{format:?} m={m}: {e} vs {a}"
                    );
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                        "{format:?} m={m}, by blocks: {a} vs {b}"
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
        let mut checked = 0;
        // Widths below, at and across whole groups of eight blocks, with partial tails.
        for (cols, format) in [32, 128, 256, 576, 1536]
            .into_iter()
            .flat_map(|c| FORMATS.map(|f| (c, f)))
        {
            let x = random_x(4, cols, &mut rng);
            let act = Q8Rows::quantize(&x);
            // Seven weight rows: whole tiles of four, two and one, then remainders.
            const WR: usize = 7;
            let w = random_matrix(format, WR, cols, &mut rng);
            let rb = w.row_bytes();
            for n in 1..=4 {
                let mut want = [0.0f32; 4 * WR];
                for j in 0..WR {
                    let mut one = [0.0f32; 4];
                    dots_generic(format, &w.bytes()[j * rb..][..rb], &act, 0..n, &mut one);
                    for r in 0..n {
                        want[r * WR + j] = one[r];
                    }
                }
                let base = has!("avx2") && has!("fma") && has!("f16c");
                let kernels: [(bool, &str); 2] =
                    [(base, "avx2"), (base && has!("avxvnni"), "vnni")];
                for (available, name) in kernels {
                    if !available {
                        continue;
                    }
                    let mut got = [0.0f32; 4 * WR];
                    // SAFETY: the CPU has the kernel's features (checked above).
                    unsafe {
                        match name {
                            "avx2" => avx2::dots(&w, 0..WR, &act, 0, n, &mut got),
                            _ => vnni::dots(&w, 0..WR, &act, 0, n, &mut got),
                        }
                    }
                    for (i, (g, w)) in got[..n * WR].iter().zip(&want[..n * WR]).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                            "{name} {format:?} cols={cols} n={n} [{}, {}]: {g} vs {w}",
                            i / WR,
                            i % WR
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
        let panels = ws.each_ref().map(QuantMatrix::to_panels);
        for m in [1, 5, GEMM_ROWS + 1] {
            let x = random_x(m, 64, &mut rng);
            for (kernel, ws) in [QuantKernel::Auto, QuantKernel::Portable]
                .into_iter()
                .flat_map(|k| [(k, &ws), (k, &panels)])
            {
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
    fn simd_activation_quantizer_equals_the_portable_one() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            eprintln!("no AVX2: nothing to compare");
            return;
        }
        let mut rng = SplitMix64::new(5);
        let mut blocks: Vec<[f32; BLOCK]> = (0..200)
            .map(|_| std::array::from_fn(|_| (rng.next_f32() - 0.5) * 10.0))
            .collect();
        // Exact halves after scaling (max 127 → scale 1): ties must round to even in both.
        blocks.push(std::array::from_fn(|i| match i {
            0 => 127.0,
            _ => i as f32 - 15.5,
        }));
        blocks.push([0.0; BLOCK]);
        for (n, src) in blocks.iter().enumerate() {
            let (mut want, mut got) = ([0i8; BLOCK], [0i8; BLOCK]);
            let (mut wd, mut ws, mut gd, mut gs) = (0.0, 0.0, 0.0, 0.0);
            let (mut wsum, mut gsum) = (0, 0);
            quantize_block(src, &mut want, &mut wd, &mut ws, &mut wsum);
            // SAFETY: AVX2, FMA and F16C are present (checked above).
            unsafe { quantize_block_avx2(src, &mut got, &mut gd, &mut gs, &mut gsum) };
            assert_eq!(got, want, "block {n}");
            assert_eq!((gd, gs, gsum), (wd, ws, wsum), "block {n}");
            let total: i32 = want.iter().map(|&q| i32::from(q)).sum();
            assert_eq!(wsum, total, "block {n}");
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
        let panels = w.to_panels();
        for kernel in [QuantKernel::Portable, QuantKernel::Auto] {
            for w in [&w, &panels] {
                let got = matmul(&x, w, kernel).data[0];
                assert!(
                    (got - want).abs() < 1e-3,
                    "{kernel:?} panels={}: {got} vs {want}",
                    w.is_panels()
                );
            }
        }
        // Nibbles of 15 against +127 in every position: the largest Q4 sums (and, in a
        // panel, the offset of 8 taken out of them).
        for format in [QuantFormat::Q4_0, QuantFormat::Q4_1] {
            let mut bytes = half::f16::from_f32(1.0).to_le_bytes().to_vec();
            if format == QuantFormat::Q4_1 {
                bytes.extend(half::f16::from_f32(0.0).to_le_bytes());
            }
            bytes.extend([0xffu8; 16]);
            let w = QuantMatrix::new(format, 1, 32, SharedBytes::from_vec(bytes)).unwrap();
            let x = CpuTensor {
                data: vec![1.0; 32],
                rows: 1,
                cols: 32,
            };
            let want = match format {
                QuantFormat::Q4_0 => 7.0 * 32.0,
                _ => 15.0 * 32.0,
            };
            for w in [w.clone(), w.to_panels()] {
                for kernel in [QuantKernel::Portable, QuantKernel::Auto] {
                    let got = matmul(&x, &w, kernel).data[0];
                    assert!(
                        (got - want).abs() < 1e-3,
                        "{format:?} {kernel:?} panels={}: {got} vs {want}",
                        w.is_panels()
                    );
                }
            }
        }
    }

    #[test]
    fn panels_dequantize_to_the_same_values_as_rows() {
        let mut rng = SplitMix64::new(31);
        for format in FORMATS {
            // 37 rows: two whole panels and a padded third.
            let w = random_matrix(format, 37, 96, &mut rng);
            let p = w.to_panels();
            assert!(p.is_panels() && !w.is_panels());
            // The file's bytes per block, each panel rounded up to whole cache lines.
            let panel = (96 / BLOCK * 16 * format.block_bytes()).next_multiple_of(64);
            assert_eq!(p.bytes().len(), 3 * panel);
            let (mut want, mut got) = (vec![0.0; 96], vec![0.0; 96]);
            for r in 0..37 {
                w.dequantize_row(r, &mut want);
                p.dequantize_row(r, &mut got);
                assert_eq!(
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{format:?} row {r}"
                );
            }
        }
    }

    /// The panel kernels (portable and, where the CPU has it, AVX-512) against the row
    /// layout's portable kernel: row counts through every tile shape and past a row chunk,
    /// widths through padded panels.
    #[test]
    fn panel_products_match_the_row_kernels() {
        let mut rng = SplitMix64::new(41);
        let simd = panel_kernel_available();
        if !simd {
            eprintln!("no AVX-512 VNNI here: only the portable panel kernel is checked");
        }
        for format in FORMATS {
            for (n, k) in [(37, 96), (80, 256), (16, 32), (200, 576), (40, 1536)] {
                let w = random_matrix(format, n, k, &mut rng);
                let p = w.to_panels();
                for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17, 70] {
                    let x = random_x(m, k, &mut rng);
                    let want = matmul(&x, &w, QuantKernel::Portable);
                    let portable = matmul(&x, &p, QuantKernel::Portable);
                    let auto = matmul(&x, &p, QuantKernel::Auto);
                    for (i, ((w, a), b)) in want
                        .data
                        .iter()
                        .zip(&portable.data)
                        .zip(&auto.data)
                        .enumerate()
                    {
                        let (r, c) = (i / n, i % n);
                        let tol = 1e-4 * (1.0 + w.abs());
                        assert!(
                            (w - a).abs() <= tol,
                            "{format:?} n={n} k={k} m={m} [{r},{c}]: portable panel {a} vs {w}"
                        );
                        assert!(
                            (w - b).abs() <= tol,
                            "{format:?} n={n} k={k} m={m} [{r},{c}]: panel kernel {b} vs {w}"
                        );
                    }
                }
            }
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
                        _ => (hi - lo) / 15.0,
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
