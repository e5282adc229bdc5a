//! Compiles every kernel source to PTX for compute_90 with the NVRTC installed here, and
//! checks the on-disk cache. Without NVRTC the tests skip with a message, unless
//! `BALLAST_REQUIRE_NVRTC` is set (CI sets it after `kernels/install-nvrtc.sh`): then they fail.

use std::path::PathBuf;
use std::time::Instant;

use ballast_kernels::{KERNELS, SOURCES, compile_ptx_cached, nvrtc_available, nvrtc_version};

const ARCH: &str = "compute_90";

/// False (after saying why) when NVRTC is absent and not required; panics when required.
fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc_available() {
        return true;
    }
    if std::env::var_os("BALLAST_REQUIRE_NVRTC").is_some() {
        panic!("{test}: BALLAST_REQUIRE_NVRTC is set but NVRTC cannot be loaded");
    }
    eprintln!("{test}: skipped, NVRTC not found (run kernels/install-nvrtc.sh)");
    false
}

/// A fresh directory under the target's temporary folder, unique to this test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kernel-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn every_kernel_compiles_to_ptx_for_compute_90() {
    if !nvrtc_or_skip("every_kernel_compiles_to_ptx_for_compute_90") {
        return;
    }
    let version = nvrtc_version().expect("NVRTC version");
    let started = Instant::now();
    let modules = compile_ptx_cached(ARCH, None).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "NVRTC {}.{}: compiled {} sources for {ARCH} in {:.2?}",
        version.0,
        version.1,
        modules.len(),
        started.elapsed()
    );
    assert_eq!(modules.len(), SOURCES.len());
    for m in &modules {
        assert!(!m.from_cache, "no cache was given");
        assert!(
            m.ptx.contains(".target sm_90"),
            "{}: PTX is not for sm_90",
            m.file
        );
    }
    for k in KERNELS {
        let m = modules.iter().find(|m| m.file == k.file).expect("module");
        assert!(m.has_entry(k.name), "{} has no .entry {}", k.file, k.name);
    }
}

#[test]
fn second_compile_is_served_from_the_cache() {
    if !nvrtc_or_skip("second_compile_is_served_from_the_cache") {
        return;
    }
    let dir = temp_dir("hit");
    let first = compile_ptx_cached(ARCH, Some(&dir)).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        first.iter().all(|m| !m.from_cache),
        "the cache started empty"
    );
    let entries = std::fs::read_dir(&dir).expect("cache dir").count();
    assert_eq!(entries, SOURCES.len(), "one file per source");
    let started = Instant::now();
    let second = compile_ptx_cached(ARCH, Some(&dir)).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "cached load of {} sources: {:.2?}",
        second.len(),
        started.elapsed()
    );
    assert!(
        second.iter().all(|m| m.from_cache),
        "second call recompiled"
    );
    assert_eq!(
        first,
        second
            .iter()
            .map(|m| ballast_kernels::CompiledModule {
                from_cache: false,
                ..m.clone()
            })
            .collect::<Vec<_>>()
    );
    // Another architecture is another key.
    let other = compile_ptx_cached("compute_80", Some(&dir)).unwrap_or_else(|e| panic!("{e}"));
    assert!(other.iter().all(|m| !m.from_cache));
    let _ = std::fs::remove_dir_all(&dir);
}
