//! Weights as the model hands them to a backend: dense f32, bf16, or quantized blocks read
//! in place; and the bf16 rounding every backend applies.

use super::quant::QuantMatrix;

/// A weight matrix on the host, `[rows, cols]` = `[out_features, in_features]`, in the form
/// the model stores it. A backend may keep quantized blocks as they are and multiply by them
/// directly.
#[derive(Debug, Clone)]
pub enum HostWeight<'a> {
    /// Dense f32, row-major.
    F32 {
        /// `rows * cols` values.
        data: std::borrow::Cow<'a, [f32]>,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// bf16 values (raw bits), row-major. A backend multiplies them with activations
    /// rounded to bf16 and accumulates in f32 (a bf16 GEMM), on every backend alike.
    Bf16 {
        /// `rows * cols` values.
        data: std::borrow::Cow<'a, [u16]>,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// Quantized blocks, typically in a memory-mapped model file.
    Quant(QuantMatrix),
}

impl HostWeight<'_> {
    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            HostWeight::F32 { rows, cols, .. } | HostWeight::Bf16 { rows, cols, .. } => {
                (*rows, *cols)
            }
            HostWeight::Quant(q) => (q.rows, q.cols),
        }
    }

    /// This weight rounded to bf16 (quantized blocks are expanded first); bf16 stays as is.
    pub fn to_bf16(&self) -> HostWeight<'static> {
        let (rows, cols) = self.shape();
        let data: Vec<u16> = match self {
            HostWeight::Bf16 { data, .. } => data.to_vec(),
            HostWeight::F32 { data, .. } => {
                use rayon::prelude::*;
                data.par_iter().map(|&v| bf16_round(v)).collect()
            }
            HostWeight::Quant(q) => {
                let mut row = vec![0.0f32; cols];
                let mut out = Vec::with_capacity(rows * cols);
                for r in 0..rows {
                    q.dequantize_row(r, &mut row);
                    out.extend(row.iter().map(|&v| bf16_round(v)));
                }
                out
            }
        };
        HostWeight::Bf16 {
            data: std::borrow::Cow::Owned(data),
            rows,
            cols,
        }
    }
}

/// `x` rounded to the nearest bf16 (ties to even), as raw bits; a NaN stays a quiet NaN.
/// The rounding every backend applies to a bf16 GEMM's activations.
pub fn bf16_round(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// The f32 value of bf16 bits (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}
