//! The arithmetic: the model and the devices it runs on.
//!
//! - [`model`]: GGUF and Hugging Face loading, the model's shape ([`model::ModelSpec`]) and
//!   the Llama-family forward pass.
//! - [`backend`]: the kernels behind a forward pass, CPU (with quantized formats) and CUDA.
//! - [`device`]: which device `--device` names, and opening it.
//! - [`executor`]: what runs a planned step: the model on a backend (with CUDA graphs on
//!   the GPU), or nothing, for measuring the scheduler alone.
//! - [`tokenizer`]: byte-level BPE and chat templates.
//! - [`sampling`]: sampling parameters and the sampler.
//!
//! May use [`crate::step`] only: it knows nothing of requests, ranks or metrics.

pub mod backend;
pub mod device;
pub mod executor;
pub mod model;
pub mod sampling;
pub mod tokenizer;
