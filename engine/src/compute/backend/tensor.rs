//! The CPU backend's tensor: a row-major 2-D array of f32 in host memory, shared by its
//! dense and quantized kernels.

/// A row-major 2-D array of f32 in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    /// `rows * cols` elements.
    pub data: Vec<f32>,
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
}

impl CpuTensor {
    /// A zero tensor.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            data: vec![0.0; rows * cols],
            rows,
            cols,
        }
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}
