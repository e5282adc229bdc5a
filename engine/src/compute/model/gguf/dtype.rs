//! ggml tensor types: block geometry of every type a GGUF file may name, and scalar reference
//! dequantization of the ones Ballast reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and
//! the k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).
//!
//! Quantized types store fixed-size blocks along a row (`dims[0]`). The 32-element types hold
//! an f16 scale (Q4_1, Q5_1: and an f16 minimum), for Q5 the 32 high bits, then packed
//! integers. The k-quants hold 256 elements per super-block, split into sub-blocks of 16 or
//! 32 that each have a small integer scale (and minimum) multiplying the super-block's f16
//! ones. These functions are the reference the quantized kernels are tested against, and are
//! themselves checked against ggml's own Python package (`gguf.quants`) on real and random
//! blocks, so they favour being obviously right over being fast.

use half::{bf16, f16};

use super::GgufError;

/// A ggml tensor type, by its id in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs, non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
}

/// Elements in one Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 block.
pub const QK: usize = 32;
/// Elements in one k-quant super-block.
pub const QK_K: usize = 256;

/// The types [`dequantize`] decodes, in the order error messages list them.
pub const DEQUANTIZABLE: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// `types` as an English list: `A, B and C`.
pub fn type_list(types: &[GgmlType]) -> String {
    match types {
        [] => String::new(),
        [one] => one.name().to_string(),
        [rest @ .., last] => format!(
            "{} and {last}",
            rest.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
        ),
    }
}

impl GgmlType {
    /// The type with file id `id`. Ids ggml retired (4, 5) and the i-quants are not listed:
    /// a file using them is refused with the id in the message.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => BF16,
            _ => return None,
        })
    }

    /// The file id of this type.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            BF16 => 30,
        }
    }

    /// Name as ggml prints it.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            BF16 => "BF16",
        }
    }

    /// Elements per block (1 for plain types).
    pub fn block_elems(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => QK as u64,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => QK_K as u64,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        use GgmlType::*;
        match self {
            I8 => 1,
            F16 | BF16 | I16 => 2,
            F32 | I32 => 4,
            F64 | I64 => 8,
            Q4_0 => 2 + 16,
            Q4_1 => 2 + 2 + 16,
            Q5_0 => 2 + 4 + 16,
            Q5_1 => 2 + 2 + 4 + 16,
            Q8_0 => 2 + 32,
            Q8_1 => 2 + 2 + 32,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 4 + 256 + 32,
        }
    }

    /// Bytes of `n` elements, or `None` when `n` is not a whole number of blocks or the size
    /// overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_elems()) {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Whether [`dequantize`] handles this type.
    pub fn can_dequantize(self) -> bool {
        DEQUANTIZABLE.contains(&self)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes `bytes` of type `dtype` into `out`, which must hold exactly the elements `bytes`
/// encodes.
///
/// ```
/// use ballast_engine::compute::model::gguf::{dequantize, GgmlType};
/// // F16 1.0 and -2.0.
/// let mut out = [0.0; 2];
/// dequantize(GgmlType::F16, &[0x00, 0x3c, 0x00, 0xc0], &mut out).unwrap();
/// assert_eq!(out, [1.0, -2.0]);
/// ```
pub fn dequantize(dtype: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgufError> {
    if !dtype.can_dequantize() {
        return Err(GgufError::DequantUnsupported(dtype));
    }
    let blocks = bytes.len() as u64 / dtype.block_bytes();
    let fits = (bytes.len() as u64).is_multiple_of(dtype.block_bytes())
        && blocks.checked_mul(dtype.block_elems()) == Some(out.len() as u64);
    if !fits {
        return Err(GgufError::DequantLength {
            dtype,
            bytes: bytes.len(),
            elements: out.len(),
        });
    }
    match dtype {
        GgmlType::F32 => each_scalar::<4>(bytes, out, f32::from_le_bytes),
        GgmlType::F16 => each_scalar::<2>(bytes, out, |b| f16::from_le_bytes(b).to_f32()),
        GgmlType::BF16 => each_scalar::<2>(bytes, out, |b| bf16::from_le_bytes(b).to_f32()),
        GgmlType::Q8_0 => each_block(dtype, bytes, out, q8_0_block),
        GgmlType::Q4_0 => each_block(dtype, bytes, out, q4_0_block),
        GgmlType::Q4_1 => each_block(dtype, bytes, out, q4_1_block),
        GgmlType::Q5_0 => each_block(dtype, bytes, out, q5_0_block),
        GgmlType::Q5_1 => each_block(dtype, bytes, out, q5_1_block),
        GgmlType::Q2_K => each_block(dtype, bytes, out, q2_k_block),
        GgmlType::Q3_K => each_block(dtype, bytes, out, q3_k_block),
        GgmlType::Q4_K => each_block(dtype, bytes, out, q4_k_block),
        GgmlType::Q5_K => each_block(dtype, bytes, out, q5_k_block),
        GgmlType::Q6_K => each_block(dtype, bytes, out, q6_k_block),
        _ => unreachable!("can_dequantize lists the types handled here"),
    }
    Ok(())
}

fn each_scalar<const N: usize>(bytes: &[u8], out: &mut [f32], decode: impl Fn([u8; N]) -> f32) {
    for (chunk, y) in bytes.chunks_exact(N).zip(out) {
        let mut b = [0u8; N];
        b.copy_from_slice(chunk);
        *y = decode(b);
    }
}

fn each_block(dtype: GgmlType, bytes: &[u8], out: &mut [f32], decode: fn(&[u8], &mut [f32])) {
    for (block, y) in bytes
        .chunks_exact(dtype.block_bytes() as usize)
        .zip(out.chunks_exact_mut(dtype.block_elems() as usize))
    {
        decode(block, y);
    }
}

fn f16_at(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// Q8_0: scale `d` (f16), then 32 signed bytes; `y = d · q`.
fn q8_0_block(block: &[u8], y: &mut [f32]) {
    let d = f16_at(block, 0);
    for (y, &q) in y.iter_mut().zip(&block[2..]) {
        *y = d * f32::from(q as i8);
    }
}

/// Q4_0: scale `d` (f16), then 16 bytes of nibbles. Byte `j` holds element `j` in its low
/// nibble and element `j + 16` in its high nibble; nibbles are offset by 8, `y = d · (q − 8)`.
fn q4_0_block(block: &[u8], y: &mut [f32]) {
    let d = f16_at(block, 0);
    let (lo, hi) = y.split_at_mut(QK / 2);
    for (j, &q) in block[2..].iter().enumerate() {
        lo[j] = d * f32::from((q & 0x0f) as i8 - 8);
        hi[j] = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// Q4_1: scale `d` and minimum `m` (f16), then nibbles laid out as in Q4_0 without the
/// offset; `y = d · q + m`.
fn q4_1_block(block: &[u8], y: &mut [f32]) {
    let d = f16_at(block, 0);
    let m = f16_at(block, 2);
    let (lo, hi) = y.split_at_mut(QK / 2);
    for (j, &q) in block[4..].iter().enumerate() {
        lo[j] = d * f32::from(q & 0x0f) + m;
        hi[j] = d * f32::from(q >> 4) + m;
    }
}

/// Q5_0: scale `d` (f16), the fifth bits of the 32 elements as a little-endian u32 (bit `i`
/// for element `i`), then nibbles laid out as in Q4_0; `y = d · (q − 16)`.
fn q5_0_block(block: &[u8], y: &mut [f32]) {
    let d = f16_at(block, 0);
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    for (i, y) in y.iter_mut().enumerate() {
        *y = d * (f32::from(q5_element(&block[6..], qh, i)) - 16.0);
    }
}

/// Q5_1: scale `d` and minimum `m` (f16), the fifth bits, then nibbles; `y = d · q + m`.
fn q5_1_block(block: &[u8], y: &mut [f32]) {
    let d = f16_at(block, 0);
    let m = f16_at(block, 2);
    let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    for (i, y) in y.iter_mut().enumerate() {
        *y = d * f32::from(q5_element(&block[8..], qh, i)) + m;
    }
}

/// Element `i` (0..32) of a Q5 block: its nibble (byte `i % 16`, low half for `i < 16`) and
/// bit `i` of `qh` as the fifth bit.
fn q5_element(qs: &[u8], qh: u32, i: usize) -> u8 {
    let nibble = if i < 16 {
        qs[i] & 0x0f
    } else {
        qs[i - 16] >> 4
    };
    nibble | (((qh >> i) & 1) as u8) << 4
}

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

/// Q4_K (144 bytes): f16 `d` and `dmin`, 12 bytes of 6-bit scales and minima for eight
/// sub-blocks of 32, then 128 bytes of nibbles. Each 32 bytes hold two sub-blocks: element `l`
/// of sub-block `2k` in the low nibble of byte `32k + l`, of sub-block `2k + 1` in its high
/// nibble. `y = d · sc · q − dmin · m`.
fn q4_k_block(block: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (scales, qs) = (&block[4..16], &block[16..144]);
    for (j, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k_scale_min(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        for (l, y) in y.iter_mut().enumerate() {
            let byte = qs[32 * (j / 2) + l];
            let q = if j.is_multiple_of(2) {
                byte & 0x0f
            } else {
                byte >> 4
            };
            *y = dl * f32::from(q) - ml;
        }
    }
}

/// Q5_K (176 bytes): Q4_K's header and scales, 32 bytes of fifth bits, then Q4_K's nibbles.
/// Bit `j` of byte `l` of the fifth bits belongs to element `l` of sub-block `j`.
fn q5_k_block(block: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (scales, qh, qs) = (&block[4..16], &block[16..48], &block[48..176]);
    for (j, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k_scale_min(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        for (l, y) in y.iter_mut().enumerate() {
            let byte = qs[32 * (j / 2) + l];
            let low = if j.is_multiple_of(2) {
                byte & 0x0f
            } else {
                byte >> 4
            };
            let q = low | ((qh[l] >> j) & 1) << 4;
            *y = dl * f32::from(q) - ml;
        }
    }
}

/// Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of high bit pairs, sixteen i8 scales
/// (one per 16 elements), f16 `d`. In each half of 128 elements (`n`), element `32t + l` (`t`
/// 0..4, `l` 0..32) has its low four bits in byte `64n + 32(t % 2) + l` of the nibbles (low
/// nibble for `t < 2`) and its top two in bits `2t, 2t + 1` of byte `32n + l` of the pairs;
/// `y = d · sc · (q − 32)`.
fn q6_k_block(block: &[u8], y: &mut [f32]) {
    let (ql, qh, sc) = (&block[..128], &block[128..192], &block[192..208]);
    let d = f16_at(block, 208);
    for (e, y) in y.iter_mut().enumerate() {
        let (n, t, l) = (e / 128, (e % 128) / 32, e % 32);
        let byte = ql[64 * n + 32 * (t % 2) + l];
        let low = if t < 2 { byte & 0x0f } else { byte >> 4 };
        let q = low | ((qh[32 * n + l] >> (2 * t)) & 3) << 4;
        *y = d * f32::from(sc[e / 16] as i8) * (f32::from(q) - 32.0);
    }
}

/// Q2_K (84 bytes): sixteen bytes of 4-bit scale (low) and minimum (high) per 16 elements,
/// 64 bytes of 2-bit quants, f16 `d` and `dmin`. In each half of 128 elements, element
/// `32s + l` has its quant in bits `2s, 2s + 1` of byte `32n + l`; `y = d · sc · q − dmin · m`.
fn q2_k_block(block: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&block[..16], &block[16..80]);
    let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
    for (e, y) in y.iter_mut().enumerate() {
        let (n, s, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = (qs[32 * n + l] >> (2 * s)) & 3;
        let sm = scales[e / 16];
        *y = d * f32::from(sm & 0x0f) * f32::from(q) - dmin * f32::from(sm >> 4);
    }
}

/// Q3_K (110 bytes): 32 bytes of high bits, 64 bytes of 2-bit quants, twelve bytes of 6-bit
/// scales offset by 32, f16 `d`. Element `e` = `128n + 32s + l` takes its low two bits as in
/// Q2_K and bit `4n + s` of byte `l` of the high bits; a clear high bit subtracts 4:
/// `y = d · (sc − 32) · (q − 4·(1 − h))`.
fn q3_k_block(block: &[u8], y: &mut [f32]) {
    let (hmask, qs, packed) = (&block[..32], &block[32..96], &block[96..108]);
    let d = f16_at(block, 108);
    // Scale i: low four bits in byte i (i < 8, low nibble) or i − 8 (high nibble), top two
    // bits in bits 2·(i / 4).. of byte 8 + i % 4.
    let scale = |i: usize| -> i32 {
        let low = if i < 8 {
            packed[i] & 0x0f
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        i32::from(low | high << 4) - 32
    };
    for (e, y) in y.iter_mut().enumerate() {
        let (n, s, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = i32::from((qs[32 * n + l] >> (2 * s)) & 3);
        let h = (hmask[l] >> (4 * n + s)) & 1;
        let q = q - if h == 0 { 4 } else { 0 };
        *y = d * scale(e / 16) as f32 * q as f32;
    }
}
