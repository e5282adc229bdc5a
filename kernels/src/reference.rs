//! Plain-Rust CPU references of the kernels, argument for argument.
