//! The compute backend seen by the model: a small set of tensor operations over device
//! buffers, driven one batched step ([`crate::step::StepMetadata`], from [`crate::step`]) at a time.
//!
//! The scheduler never sees a backend. It hands the model runner a [`crate::step::StepMetadata`] (host
//! arrays describing which tokens of which sequences to compute and where their KV lives),
//! and the runner drives a [`Backend`]. The CPU backend is the reference; the CUDA backend
//! implements the same trait and must produce the same greedy tokens for the same weight
//! types (f32, and bf16 through a bf16 GEMM on both). Quantized files are the exception: the
//! CPU multiplies their blocks directly, the GPU expands them to bf16.

mod attention;
mod contract;
pub mod cpu;
pub mod cuda;
pub mod quant;
mod simd;
mod tensor;
mod weight;

pub use contract::{Backend, KvDtype, KvLayout, RopeStyle, sample_on_host};
pub use weight::{HostWeight, bf16_round, bf16_to_f32};
