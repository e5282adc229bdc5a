//! ballast-bench's integration tests, one binary: a module per subject. Two stay binaries of
//! their own: `env_vars.rs` changes the process environment, which no other thread may
//! read meanwhile, and `no_tls_provider.rs` needs a process where no test has installed a
//! TLS crypto provider.

mod keep_alive;
mod openai_mock;
