//! The `ballast` binary's integration tests, one binary: a module per subject, helpers in
//! `common`. Tests of one module run together and modules one after another
//! (`common::group`), as when each was a binary of its own: the cluster e2e and the local
//! fleet never share the machine's two cores with another module's processes.

mod architecture;
mod bad_model;
mod cluster;
mod common;
mod control_auth;
mod engine_auth;
mod engine_process;
mod engine_shutdown;
mod gateway;
mod gateway_pods;
mod gitops;
mod help_docs;
mod image;
mod local;
mod metrics_api;
mod observability;
mod signals;
