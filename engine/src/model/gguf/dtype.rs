//! ggml tensor types: block geometry of every type a GGUF file may name, and scalar reference
//! dequantization of the ones Ballast reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1).
//!
//! Quantized types store fixed-size blocks along a row (`dims[0]`): each block holds its scale
//! (and for Q4_1 a minimum) as f16 followed by packed integers. These functions are the
//! reference the quantized kernels of a later step are tested against, so they favour being
//! obviously right over being fast.

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

/// Elements in one Q4_0/Q4_1/Q8_0 block.
pub const QK: usize = 32;
/// Elements in one k-quant super-block.
const QK_K: u64 = 256;

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
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => QK_K,
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
        use GgmlType::*;
        matches!(self, F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1)
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
/// use ballast_engine::model::gguf::{dequantize, GgmlType};
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
        .zip(out.chunks_exact_mut(QK))
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
