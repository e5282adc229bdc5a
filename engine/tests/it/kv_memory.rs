//! A KV cache pool costs address space, not memory, until blocks fill: a 256 MiB default
//! pool must not be resident at start (its own process, so no other test allocates).

use ballast_engine::compute::backend::cpu::CpuBackend;
use ballast_engine::compute::backend::{Backend, KvDtype, KvLayout};

/// This process's anonymous resident memory, in bytes.
fn rss_anon() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn an_unfilled_cache_is_not_resident() {
    let Some(before) = rss_anon() else {
        eprintln!("no /proc/self/status here: nothing to measure");
        return;
    };
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let layout = KvLayout {
            num_layers: 4,
            num_blocks: 4096,
            block_size: 16,
            num_kv_heads: 4,
            head_dim: 128,
            dtype,
        };
        let cache = CpuBackend.alloc_kv_cache(layout);
        let grown = rss_anon().unwrap().saturating_sub(before);
        assert!(
            grown < layout.bytes() / 8,
            "{dtype:?}: a {} MB pool made {} MB resident",
            layout.bytes() >> 20,
            grown >> 20
        );
        drop(cache);
    }
}
