//! CUDA kernels of the CUDA backend (work in progress).
