//! Scalar reference dequantization of the types in [`super::DEQUANTIZABLE`]: the reference
//! the quantized kernels are tested against, checked itself against ggml's own Python package
//! (`gguf.quants`), so it favours being obviously right over being fast.

use half::{bf16, f16};

use super::dtype::{GgmlType, QK};
use super::error::GgufError;
use crate::compute::backend::quant::k_scale_min;

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
