//! Helpers shared by the tests that run the `ballast` binary.

#![allow(dead_code)]

use std::process::Command;

pub mod engine;
pub mod local;

/// `GET url` with curl (5 s limit): the body of any HTTP answer, `None` when none came.
pub fn get(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "-m", "5", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
