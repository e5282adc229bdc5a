//! The format's constants and limits, and what this reader supports: architectures and the
//! tensor types of a model's matrices.

use super::dtype::GgmlType;

/// The only version read: v3 is what every current converter writes. v1 used 32-bit counts
/// and v2 differs from v3 only in lacking big-endian files, but neither is worth a code path
/// that nothing exercises.
pub const GGUF_VERSION: u32 = 3;
/// `GGUF` in file order.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's limit).
pub const MAX_DIMS: usize = 4;

/// Values of `general.architecture` that [`super::GgufFile::llama_spec`] accepts. Other Llama-shaped
/// architectures (mistral, qwen2) differ in details such as attention biases, so each needs its
/// own look before it is listed.
pub const SUPPORTED_ARCHITECTURES: [&str; 1] = ["llama"];

/// The tensor types a model's matrices may have, in the order error messages list them:
/// F32, F16 and BF16 are expanded to f32, the quantized ones multiplied in place.
pub const WEIGHT_TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];
