//! ballast-crds's integration tests, one binary: a module per subject.

mod action;
mod behavior_defaults;
mod examples;
mod generated;
mod parse;
