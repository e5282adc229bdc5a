//! CUDA kernels of Ballast's CUDA backend, compiled at run time with NVRTC.
//!
//! The kernel sources (`kernels/*.cu`) are embedded in the crate. [`compile_ptx`] turns each
//! into PTX for one GPU architecture with NVRTC, loaded at run time by cudarc, so this crate
//! builds on every machine and only compiling needs NVRTC (Debian: `libnvrtc11.2`, see
//! `kernels/install-nvrtc.sh`); running the PTX needs a GPU and its driver. Compiled PTX is
//! cached on disk, keyed by source, architecture, options and NVRTC version.
//!
//! Every kernel matches an op of the engine's CPU backend, on the same memory layouts; the
//! plain-Rust [`reference`](mod@reference) module restates each kernel with its argument layout, and its
//! tests hold it equal to the engine's op.
//!
//! ```no_run
//! let modules = ballast_kernels::compile_ptx("compute_90")?;
//! for m in &modules {
//!     println!("{}: {} bytes of PTX, cached: {}", m.file, m.ptx.len(), m.from_cache);
//! }
//! # Ok::<(), ballast_kernels::KernelError>(())
//! ```
//!
//! What has been run where: on machines without a GPU, the tests compile every source for
//! `compute_90` with NVRTC 11.8 and check each entry point is in the PTX, and check the CPU
//! references against the engine. The `#[ignore]`d tests in `tests/it/device.rs` launch every
//! kernel on a GPU and compare it with its reference; `kernels/device-check.sh` runs them.

#![warn(missing_docs)]

pub mod reference;

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::nvrtc::{result, sys};

/// Helpers prepended to every source (NVRTC is given no headers).
pub const PRELUDE: &str = include_str!("../prelude.cuh");

/// One CUDA source file of the crate, compiled as one NVRTC program (one CUDA module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// File name under `kernels/`, e.g. `attention.cu`.
    pub file: &'static str,
    /// The file's text (without [`PRELUDE`]).
    pub code: &'static str,
}

/// Every kernel source.
pub const SOURCES: &[Source] = &[
    Source {
        file: "elementwise.cu",
        code: include_str!("../elementwise.cu"),
    },
    Source {
        file: "attention.cu",
        code: include_str!("../attention.cu"),
    },
    Source {
        file: "sampling.cu",
        code: include_str!("../sampling.cu"),
    },
];

/// A kernel entry point (`extern "C" __global__`) and the source that defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kernel {
    /// Symbol name, as `CudaModule::load_function` takes it.
    pub name: &'static str,
    /// File name of its [`Source`].
    pub file: &'static str,
}

const fn k(name: &'static str, file: &'static str) -> Kernel {
    Kernel { name, file }
}

/// Every kernel entry point. Launch geometry and layouts are commented in the sources.
pub const KERNELS: &[Kernel] = &[
    k("embedding_f32", "elementwise.cu"),
    k("embedding_bf16", "elementwise.cu"),
    k("rms_norm_f32", "elementwise.cu"),
    k("rope_f32", "elementwise.cu"),
    k("silu_mul_f32", "elementwise.cu"),
    k("add_assign_f32", "elementwise.cu"),
    k("gather_rows_f32", "elementwise.cu"),
    k("write_kv_f32", "elementwise.cu"),
    k("f32_to_bf16", "elementwise.cu"),
    k("paged_attention_decode_f32", "attention.cu"),
    k("paged_attention_merge_f32", "attention.cu"),
    k("paged_attention_prefill_f32", "attention.cu"),
    k("argmax_f32", "sampling.cu"),
    k("sample_f32", "sampling.cu"),
];

/// Keys per tile in the attention kernels (`KV_TILE` in `attention.cu`).
pub const ATTENTION_KV_TILE: usize = 32;

/// Bytes of dynamic shared memory an attention block with `rows` (query, head) rows of size
/// `head_dim` needs: `group` rows for decode, `queries_per_tile * group` for prefill. Above
/// 48 KiB the launcher must raise the function's maximum dynamic shared memory first.
pub fn attention_smem_bytes(rows: usize, head_dim: usize) -> usize {
    let t = ATTENTION_KV_TILE;
    // K tile rows are padded by one float (no bank conflicts in the score loop).
    4 * (2 * rows * head_dim + t * (head_dim + 1) + t * head_dim + rows * t + 4 * rows)
}

/// Why kernels could not be compiled. [`KernelError::label`] gives a stable short name.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No NVRTC library could be loaded.
    #[error(
        "NVRTC (libnvrtc.so) could not be loaded: install the CUDA runtime compiler (Debian 12: \
         kernels/install-nvrtc.sh) or put its directory on LD_LIBRARY_PATH"
    )]
    NvrtcMissing,
    /// An NVRTC call failed outside compilation itself.
    #[error("NVRTC call {call} failed: {error}")]
    Nvrtc {
        /// The call, e.g. `nvrtcVersion`.
        call: &'static str,
        /// NVRTC's status.
        error: result::NvrtcError,
    },
    /// NVRTC rejected a source.
    #[error("NVRTC could not compile {file} for {arch}: {error}\n{log}")]
    Compile {
        /// The source file.
        file: &'static str,
        /// The target architecture.
        arch: String,
        /// NVRTC's status.
        error: result::NvrtcError,
        /// The compiler's log.
        log: String,
    },
    /// The architecture name cannot be passed to NVRTC.
    #[error("invalid GPU architecture name {0:?} (expected e.g. compute_90)")]
    BadArch(String),
}

impl KernelError {
    /// A stable short name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            KernelError::NvrtcMissing => "nvrtc_missing",
            KernelError::Nvrtc { .. } => "nvrtc_call",
            KernelError::Compile { .. } => "compile",
            KernelError::BadArch(_) => "bad_arch",
        }
    }
}

/// PTX of one [`Source`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledModule {
    /// File name of the source.
    pub file: &'static str,
    /// The PTX text.
    pub ptx: String,
    /// True when the PTX came from the on-disk cache rather than from NVRTC.
    pub from_cache: bool,
}

impl CompiledModule {
    /// True when the PTX defines entry point `name`.
    pub fn has_entry(&self, name: &str) -> bool {
        self.ptx.lines().any(|l| {
            let l = l.trim_start();
            let rest = l
                .strip_prefix(".visible .entry ")
                .or_else(|| l.strip_prefix(".entry "));
            rest.is_some_and(|r| {
                r.strip_prefix(name)
                    .is_some_and(|t| t.starts_with('(') || t.trim().is_empty())
            })
        })
    }
}

/// True when an NVRTC library can be loaded (cudarc would panic on first use otherwise).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the library under its known names.
    unsafe { sys::is_culib_present() }
}

/// `(major, minor)` of the NVRTC library, e.g. `(11, 8)`.
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    if !nvrtc_available() {
        return Err(KernelError::NvrtcMissing);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for writes; the library is present (checked above).
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|error| KernelError::Nvrtc {
            call: "nvrtcVersion",
            error,
        })?;
    Ok((major, minor))
}

/// The NVRTC options for `arch`. `--std=c++17` and `-default-device` are accepted by NVRTC
/// 11.8 and later; `--fmad=true` (the default) lets the compiler fuse multiply-adds, so
/// results differ from the CPU reference in the last bits, within the tests' tolerances.
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-default-device".into(),
        "--std=c++17".into(),
    ]
}

/// The program text NVRTC compiles for `src`: [`PRELUDE`], then the file, with a `#line`
/// directive so that messages name the file's own lines.
pub fn program_source(src: &Source) -> String {
    format!("{PRELUDE}\n#line 1 \"{}\"\n{}", src.file, src.code)
}

/// The cache directory: `$BALLAST_KERNEL_CACHE`, else `~/.cache/ballast/kernels`, else none.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("BALLAST_KERNEL_CACHE").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/ballast/kernels"))
}

/// Compiles every [`SOURCES`] entry for `arch` (e.g. `compute_90`), using the cache in
/// [`default_cache_dir`].
pub fn compile_ptx(arch: &str) -> Result<Vec<CompiledModule>, KernelError> {
    compile_ptx_cached(arch, default_cache_dir().as_deref())
}

/// Compiles every [`SOURCES`] entry for `arch`, reading and writing PTX in `cache` when
/// given. The cache is an optimisation only: an unreadable entry is recompiled and a failed
/// write is ignored (the PTX is still returned).
pub fn compile_ptx_cached(
    arch: &str,
    cache: Option<&Path>,
) -> Result<Vec<CompiledModule>, KernelError> {
    if arch.is_empty() || !arch.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(KernelError::BadArch(arch.to_string()));
    }
    let version = nvrtc_version()?;
    SOURCES
        .iter()
        .map(|src| compile_source(src, arch, version, cache))
        .collect()
}

fn compile_source(
    src: &Source,
    arch: &str,
    version: (i32, i32),
    cache: Option<&Path>,
) -> Result<CompiledModule, KernelError> {
    let text = program_source(src);
    let opts = options(arch);
    let key = cache_key(&text, arch, &opts, version);
    let stem = src.file.trim_end_matches(".cu");
    let path = cache.map(|dir| dir.join(format!("{stem}-{arch}-{key:016x}.ptx")));
    if let Some(ptx) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(CompiledModule {
            file: src.file,
            ptx,
            from_cache: true,
        });
    }
    let ptx = nvrtc_compile(src.file, &text, arch, &opts)?;
    if let Some(path) = &path {
        let _ = write_atomically(path, &ptx);
    }
    Ok(CompiledModule {
        file: src.file,
        ptx,
        from_cache: false,
    })
}

/// FNV-1a over everything that changes the PTX. Stable across Rust versions and runs, which
/// `std`'s hasher does not promise.
fn cache_key(text: &str, arch: &str, opts: &[String], version: (i32, i32)) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes.iter().chain([0xffu8].iter()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(text.as_bytes());
    eat(arch.as_bytes());
    for o in opts {
        eat(o.as_bytes());
    }
    eat(&version.0.to_le_bytes());
    eat(&version.1.to_le_bytes());
    h
}

/// Writes through a unique temporary file and a rename, so concurrent compilers (parallel
/// tests, several engine ranks) never read a half-written entry.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Destroys an NVRTC program when dropped, whatever path compilation takes.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn nvrtc_compile(
    file: &'static str,
    text: &str,
    arch: &str,
    opts: &[String],
) -> Result<String, KernelError> {
    let nvrtc = |call| move |error| KernelError::Nvrtc { call, error };
    // Sources are crate constants without NUL bytes; the name is a file name.
    let src = CString::new(text).expect("kernel source has no NUL byte");
    let name = CString::new(file).expect("file name has no NUL byte");
    let prog =
        Program(result::create_program(&src, Some(&name)).map_err(nvrtc("nvrtcCreateProgram"))?);
    // SAFETY: `prog` is a live program; the options are plain strings.
    if let Err(error) = unsafe { result::compile_program(prog.0, opts) } {
        // SAFETY: as above; the log is NUL-terminated by NVRTC.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|raw| c_chars_to_string(&raw))
            .unwrap_or_default();
        return Err(KernelError::Compile {
            file,
            arch: arch.to_string(),
            error,
            log,
        });
    }
    // SAFETY: `prog` compiled successfully.
    let raw = unsafe { result::get_ptx(prog.0) }.map_err(nvrtc("nvrtcGetPTX"))?;
    Ok(c_chars_to_string(&raw))
}

fn c_chars_to_string(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_names_a_source_that_defines_it() {
        for k in KERNELS {
            let src = SOURCES.iter().find(|s| s.file == k.file);
            let src = src.unwrap_or_else(|| panic!("{}: no source {}", k.name, k.file));
            let decl = format!("__global__ void {}(", k.name);
            assert!(src.code.contains(&decl), "{} not in {}", k.name, k.file);
        }
    }

    #[test]
    fn every_entry_point_in_the_sources_is_listed() {
        for src in SOURCES {
            for (i, _) in src.code.match_indices("__global__ void ") {
                let rest = &src.code[i + "__global__ void ".len()..];
                let name = &rest[..rest.find('(').unwrap()];
                assert!(
                    KERNELS.iter().any(|k| k.name == name && k.file == src.file),
                    "{name} in {} is not in KERNELS",
                    src.file
                );
            }
        }
    }

    #[test]
    fn sources_include_no_headers() {
        for text in SOURCES.iter().map(|s| s.code).chain([PRELUDE]) {
            assert!(!text.contains("#include"), "NVRTC has none of our headers");
        }
    }

    #[test]
    fn cache_key_changes_with_each_input() {
        let o = options("compute_90");
        let base = cache_key("src", "compute_90", &o, (11, 8));
        assert_eq!(base, cache_key("src", "compute_90", &o, (11, 8)));
        assert_ne!(base, cache_key("src2", "compute_90", &o, (11, 8)));
        assert_ne!(base, cache_key("src", "compute_80", &o, (11, 8)));
        assert_ne!(base, cache_key("src", "compute_90", &o, (12, 8)));
        assert_ne!(base, cache_key("src", "compute_90", &o[1..], (11, 8)));
    }

    #[test]
    fn has_entry_matches_whole_names_only() {
        let m = CompiledModule {
            file: "x.cu",
            ptx: ".visible .entry rope_f32(\n\t.param .u64 a\n)".into(),
            from_cache: false,
        };
        assert!(m.has_entry("rope_f32"));
        assert!(!m.has_entry("rope"));
        assert!(!m.has_entry("rope_f32x"));
    }

    #[test]
    fn bad_arch_is_an_error_not_a_panic() {
        let err = compile_ptx_cached("compute 90; rm", None).unwrap_err();
        assert_eq!(err.label(), "bad_arch");
    }

    #[test]
    fn attention_shared_memory_fits_decode_of_common_shapes() {
        // Llama-style group 8, head_dim 128: under the 48 KiB default.
        assert!(attention_smem_bytes(8, 128) <= 48 * 1024);
        // A prefill tile of 32 rows with head_dim 128 needs the opt-in.
        assert!(attention_smem_bytes(32, 128) > 48 * 1024);
    }
}
