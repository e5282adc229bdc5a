//! ballast-kernels's integration tests, one binary: a module per subject.

mod device;
mod ptx;
