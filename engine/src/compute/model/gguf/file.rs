//! A mapped GGUF file: its parsed header and the tensor views callers read.

use super::{GgufError, GgufHeader, Metadata, TensorInfo, dequantize};

use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

/// A parsed GGUF file over its bytes: a memory map ([`GgufFile::open`]) or, in tests, any
/// byte buffer ([`GgufFile::from_bytes`]).
pub struct GgufFile<D = Mmap> {
    pub(super) data: D,
    header: GgufHeader,
}

/// Shows the header and length, not the (possibly gigabytes of) bytes.
impl<D: Deref<Target = [u8]>> std::fmt::Debug for GgufFile<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("len", &self.data.len())
            .field("header", &self.header)
            .finish()
    }
}

impl GgufFile<Mmap> {
    /// Maps and parses the file at `path`. Tensor data is not read.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Like every mmap-based model
        // loader, we rely on nobody truncating or rewriting the model file while it is served;
        // if someone does, reads may fault, but no Rust reference outlives the map.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_bytes(map)
    }

    /// Drops this process's resident pages of the map (`MADV_DONTNEED`): for once the weights
    /// were copied out (repacked for the AVX-512 kernel) and the map is no longer read, so that
    /// resident memory does not count the model twice. A later read faults the pages back in
    /// from the page cache or the file, unchanged.
    pub fn release_resident_pages(&self) {
        #[cfg(unix)]
        // SAFETY: the map is shared and read-only, so a dropped page reads back exactly as it
        // was; no reference into it is invalidated.
        if let Err(e) = unsafe {
            self.data
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        } {
            tracing::debug!("madvise(DONTNEED) on the model map: {e}");
        }
    }
}

/// The whole file, so tensors can borrow from a shared file ([`crate::compute::backend::quant::SharedBytes`]).
impl<D: Deref<Target = [u8]>> AsRef<[u8]> for GgufFile<D> {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl<D: Deref<Target = [u8]>> GgufFile<D> {
    /// Parses a GGUF file held in `data`.
    pub fn from_bytes(data: D) -> Result<Self, GgufError> {
        let header = GgufHeader::parse(&data)?;
        Ok(Self { data, header })
    }

    /// The parsed header.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// Metadata pairs.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Tensor directory in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// File length in bytes.
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Whether the file is empty (never true for a parsed file).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// A view of tensor `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self
            .header
            .tensor_info(name)
            .ok_or_else(|| GgufError::TensorNotFound(name.to_string()))?;
        Ok(self.view(info))
    }

    /// Views of every tensor in file order.
    pub fn tensor_views(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.header.tensors.iter().map(|info| self.view(info))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // Parsing checked start + n_bytes <= file length for every tensor.
        let start = (self.header.data_offset + info.offset) as usize;
        TensorView {
            info,
            bytes: &self.data[start..start + info.n_bytes as usize],
        }
    }
}

/// One tensor's info and its bytes in the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// Name, shape, type.
    pub info: &'a TensorInfo,
    /// Exactly `info.n_bytes` bytes, in the mapped file.
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    /// The whole tensor as f32, in row-major order (rows of `dims[0]` elements).
    pub fn dequantize(&self) -> Result<Vec<f32>, GgufError> {
        if !self.info.dtype.can_dequantize() {
            return Err(GgufError::DequantUnsupported(self.info.dtype));
        }
        // Bounded by the file: no supported type packs more than two elements in a byte.
        let mut out = vec![0.0; self.info.n_elements as usize];
        dequantize(self.info.dtype, self.bytes, &mut out)?;
        Ok(out)
    }

    /// Row `row` (of `dims[0]` elements) as f32, into `out`.
    pub fn dequantize_row(&self, row: u64, out: &mut [f32]) -> Result<(), GgufError> {
        let row_bytes = self.info.dtype.bytes_for(self.info.row_len()).unwrap_or(0);
        if row >= self.info.rows() {
            return Err(GgufError::RowOutOfRange {
                tensor: self.info.name.clone(),
                row,
                rows: self.info.rows(),
            });
        }
        let start = (row * row_bytes) as usize;
        dequantize(
            self.info.dtype,
            &self.bytes[start..start + row_bytes as usize],
            out,
        )
    }
}
