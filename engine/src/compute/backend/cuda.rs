//! The CUDA backend: the model's ops on an NVIDIA GPU, through cudarc with the CUDA libraries
//! loaded at run time, so this code builds and links on machines without CUDA.
//!
//! - **Kernels** are `kernels/*.cu` (crate `ballast-kernels`), compiled by NVRTC at start-up
//!   for the device's architecture and cached on disk.
//! - **GEMMs** go through cuBLAS with f32 accumulation: an f32 GEMM for f32 weights (the
//!   synthetic models' default, so tokens match the CPU backend), and a bf16 GEMM for bf16
//!   weights and for quantized files (expanded to bf16 on upload). Activations are rounded to
//!   bf16 by a kernel before a bf16 GEMM; the CPU backend rounds the same way for bf16
//!   weights, so it stays the reference.
//! - **Tensors** are f32 on the device; the KV cache is f32, laid out like the CPU backend's.
//! - **One stream** carries every op; a step's ops queue without waiting, and only reading
//!   results back (logits or sampled tokens) waits for the device. Ranks sharing one GPU take
//!   turns by step ([`Backend::run_step`] holds a lock).
//! - **CUDA graphs** (`--cuda-graphs`, run by
//!   [`crate::compute::executor::cuda_graphs::GraphExecutor`] with what this module offers:
//!   `StepGraph`, [`GRAPH_BATCHES`]) replay pure decode steps captured at fixed batch
//!   sizes, one launch per step instead of several hundred.
//!
//! Nothing here has run on a GPU yet: `engine/tests/it/cuda.rs` holds the GPU tests and
//! benchmarks, run by `kernels/device-check.sh`.
//!
//! A driver error in the middle of a step (a lost device, an out-of-memory) has no sensible
//! recovery inside an op, so ops panic with the error; creating the backend returns errors.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, result as blas, sys as blas_sys};
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::{Backend, HostWeight, KvLayout, RopeStyle};
use crate::compute::sampling::SamplingSlot;
use crate::step::StepMetadata;

/// Why the CUDA backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver library.
    #[error(
        "no CUDA driver library (libcuda.so.1) on this machine: CUDA needs an NVIDIA GPU and \
         its driver; use --device cpu"
    )]
    NoDriver,
    /// No cuBLAS library.
    #[error(
        "no cuBLAS library (libcublas.so) on this machine: install the CUDA runtime libraries \
         (Debian: libcublas12) or use --device cpu"
    )]
    NoCublas,
    /// A driver call failed (no device, out of memory, …).
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// cuBLAS could not be initialised.
    #[error("cuBLAS: {0}")]
    Blas(#[from] blas::CublasError),
    /// The kernels could not be compiled.
    #[error(transparent)]
    Kernels(#[from] ballast_kernels::KernelError),
    /// The driver refused NVRTC's PTX, typically because the NVRTC is newer than the driver.
    #[error(
        "the CUDA driver could not load the kernels' PTX for {arch} ({source}); an NVRTC newer \
         than the driver emits PTX it cannot read: put an NVRTC no newer than the driver first \
         on LD_LIBRARY_PATH (kernels/device-check.sh carries CUDA 11.8's)"
    )]
    LoadPtx {
        /// The architecture compiled for.
        arch: String,
        /// The driver's error.
        source: DriverError,
    },
}

/// Whether the driver and cuBLAS libraries can be loaded (looked up by name; no context is
/// created). NVRTC is checked by `ballast_kernels::nvrtc_available`.
pub fn libraries_present() -> (bool, bool) {
    // SAFETY: both only try to open the libraries by their usual names.
    unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            blas_sys::is_culib_present(),
        )
    }
}

/// Threads per block of the row kernels (RMSNorm, embedding, gathers).
const ROW_THREADS: u32 = 256;
/// Threads per block of the attention kernels.
const ATTENTION_THREADS: u32 = 128;
/// Threads per block of the sampling kernels.
const SAMPLING_THREADS: u32 = 1024;
/// Keys per decode-attention split in a captured graph, which cannot size its splits per step:
/// a graph splits for the model's longest sequence, and splits past a shorter one end at once.
const GRAPH_PARTITION: usize = 512;
/// Bytes of cuBLAS workspace (what cuBLAS asks for on Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;
/// Keys below which a decode split is not worth its merge.
const MIN_SPLIT_TOKENS: usize = 256;

/// The loaded kernels.
struct Functions {
    embedding_f32: CudaFunction,
    embedding_bf16: CudaFunction,
    rms_norm: CudaFunction,
    rope: CudaFunction,
    silu_mul: CudaFunction,
    add_assign: CudaFunction,
    gather_rows: CudaFunction,
    write_kv: CudaFunction,
    to_bf16: CudaFunction,
    decode: CudaFunction,
    merge: CudaFunction,
    prefill: CudaFunction,
    argmax: CudaFunction,
}

struct Inner {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// cuBLAS's workspace, set explicitly so that a captured GEMM allocates nothing.
    _blas_workspace: CudaSlice<u8>,
    f: Functions,
    device_name: String,
    arch: String,
    sms: usize,
    smem_limit: usize,
    step: Mutex<()>,
}

/// The CUDA backend on one GPU. Cheap to clone (one context, stream and cuBLAS handle).
#[derive(Clone)]
pub struct CudaBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.inner.device_name)
            .field("arch", &self.inner.arch)
            .finish()
    }
}

/// A device tensor `[rows, cols]` of f32.
pub struct CudaTensor {
    buf: CudaSlice<f32>,
    rows: usize,
    cols: usize,
}

/// A weight matrix on the device, `[rows, cols]`.
pub enum CudaWeight {
    /// f32, multiplied by an f32 GEMM.
    F32 {
        /// Values.
        buf: CudaSlice<f32>,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// bf16 bits, multiplied by a bf16 GEMM with f32 accumulation.
    Bf16 {
        /// Values.
        buf: CudaSlice<u16>,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
}

impl CudaWeight {
    fn shape(&self) -> (usize, usize) {
        match self {
            CudaWeight::F32 { rows, cols, .. } | CudaWeight::Bf16 { rows, cols, .. } => {
                (*rows, *cols)
            }
        }
    }
}

/// K and V arrays of every layer on the device, laid out as the CPU backend's.
pub struct CudaKvCache {
    /// Shape of the cache.
    pub layout: KvLayout,
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
}

/// A step's metadata on the device: every index array in one buffer, plus what the
/// launchers need to know on the host.
pub struct CudaStepMeta {
    buf: CudaSlice<u32>,
    token_ids: Range<usize>,
    positions: Range<usize>,
    slot_mapping: Range<usize>,
    seqs: Range<usize>,
    block_tables: Range<usize>,
    logits_rows: Range<usize>,
    num_tokens: usize,
    num_seqs: usize,
    /// Every sequence computes one token (a pure decode step).
    decode_only: bool,
    /// Keys per decode-attention split, fixed for a graph (else chosen per step).
    fixed_partition: Option<usize>,
    /// Most tokens any sequence attends to.
    longest: usize,
    /// Most new tokens of any sequence.
    max_query: usize,
    block_size: usize,
}

impl CudaStepMeta {
    fn view(&self, r: &Range<usize>) -> CudaView<'_, u32> {
        self.buf.slice(r.clone())
    }
}

fn grid(x: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check<T>(what: &str, r: Result<T, DriverError>) -> T {
    r.unwrap_or_else(|e| panic!("CUDA {what}: {e}"))
}

impl CudaBackend {
    /// Opens GPU `ordinal`, compiles the kernels for its architecture (or takes them from the
    /// on-disk cache) and creates the cuBLAS handle.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        let (driver, cublas) = libraries_present();
        if !driver {
            return Err(CudaError::NoDriver);
        }
        if !cublas {
            return Err(CudaError::NoCublas);
        }
        let ctx = CudaContext::new(ordinal)?;
        // One stream carries every op, so cudarc's per-buffer events (which order buffers
        // shared between streams) are pure overhead.
        // SAFETY: no buffer of this context is used on another stream.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability()?;
        let arch = format!("compute_{major}{minor}");
        let mut modules = HashMap::new();
        for m in ballast_kernels::compile_ptx(&arch)? {
            let module =
                ctx.load_module(Ptx::from_src(m.ptx))
                    .map_err(|source| CudaError::LoadPtx {
                        arch: arch.clone(),
                        source,
                    })?;
            modules.insert(m.file, module);
        }
        let load = |name: &str| -> Result<CudaFunction, CudaError> {
            let kernel = ballast_kernels::KERNELS
                .iter()
                .find(|k| k.name == name)
                .unwrap_or_else(|| unreachable!("{name} is listed in ballast_kernels::KERNELS"));
            Ok(modules[kernel.file].load_function(name)?)
        };
        let f = Functions {
            embedding_f32: load("embedding_f32")?,
            embedding_bf16: load("embedding_bf16")?,
            rms_norm: load("rms_norm_f32")?,
            rope: load("rope_f32")?,
            silu_mul: load("silu_mul_f32")?,
            add_assign: load("add_assign_f32")?,
            gather_rows: load("gather_rows_f32")?,
            write_kv: load("write_kv_f32")?,
            to_bf16: load("f32_to_bf16")?,
            decode: load("paged_attention_decode_f32")?,
            merge: load("paged_attention_merge_f32")?,
            prefill: load("paged_attention_prefill_f32")?,
            argmax: load("argmax_f32")?,
        };
        let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let smem_limit = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        for func in [&f.decode, &f.prefill] {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_limit,
            )?;
        }
        let stream = ctx.new_stream()?;
        let blas = CudaBlas::new(stream.clone())?;
        let workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE)?;
        {
            let (ptr, _record) = workspace.device_ptr(&stream);
            // SAFETY: the workspace lives as long as the handle (both in Inner).
            unsafe {
                blas_sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut c_void, BLAS_WORKSPACE)
            }
            .result()?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                device_name: ctx.name()?,
                stream,
                blas,
                _blas_workspace: workspace,
                f,
                arch,
                sms: sms.max(1) as usize,
                smem_limit: smem_limit.max(0) as usize,
                step: Mutex::new(()),
            }),
        })
    }

    /// The GPU's name, e.g. `NVIDIA H200`.
    pub fn device_name(&self) -> &str {
        &self.inner.device_name
    }

    /// The architecture the kernels were compiled for, e.g. `compute_90`.
    pub fn arch(&self) -> &str {
        &self.inner.arch
    }

    /// The stream every op is queued on (for benchmarks that time device work).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// Waits until every queued op has finished.
    pub fn synchronize(&self) {
        check("synchronize", self.inner.stream.synchronize());
    }

    fn alloc<T: cudarc::driver::DeviceRepr>(&self, n: usize) -> CudaSlice<T> {
        // SAFETY: every caller writes all `n` values before anything reads them.
        check("alloc", unsafe { self.inner.stream.alloc::<T>(n.max(1)) })
    }

    pub(crate) fn tensor(&self, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor {
            buf: self.alloc(rows * cols),
            rows,
            cols,
        }
    }

    /// Grid for a grid-stride element-wise kernel over `n` values.
    fn elementwise(&self, n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(ROW_THREADS as usize).min(self.inner.sms * 16);
        grid(blocks.max(1))
    }

    fn upload_bf16(&self, data: &[u16], rows: usize, cols: usize) -> CudaWeight {
        assert_eq!(
            data.len(),
            rows * cols,
            "upload_weight: data does not match shape"
        );
        CudaWeight::Bf16 {
            buf: check("upload_weight", self.inner.stream.clone_htod(data)),
            rows,
            cols,
        }
    }

    /// `x` rounded to bf16 (the activation operand of a bf16 GEMM).
    fn round_bf16(&self, x: &CudaTensor) -> CudaSlice<u16> {
        let n = x.rows * x.cols;
        let mut out = self.alloc::<u16>(n);
        let mut b = self.inner.stream.launch_builder(&self.inner.f.to_bf16);
        b.arg(&x.buf).arg(&mut out).arg(&n);
        check("f32_to_bf16", unsafe { b.launch(self.elementwise(n)) });
        out
    }

    /// A step metadata buffer for graph replays: the layout `meta` packs into, kept at one
    /// address so a captured graph can read each step's values from it. `longest` is what
    /// the decode attention sizes its splits for (the graph's sequences may not exceed it).
    pub(crate) fn fixed_meta(&self, meta: &StepMetadata, longest: usize) -> CudaStepMeta {
        let mut m = self.prepare_step(meta);
        m.longest = longest;
        m.fixed_partition = Some(GRAPH_PARTITION);
        m
    }

    /// Copies `meta` into a buffer made by [`CudaBackend::fixed_meta`] from a metadata of the
    /// same shape.
    pub(crate) fn refill_meta(&self, fixed: &mut CudaStepMeta, meta: &StepMetadata) {
        let (host, _) = pack(meta);
        assert_eq!(host.len(), fixed.buf.len(), "graph metadata changed shape");
        check(
            "step metadata",
            self.inner.stream.memcpy_htod(&host, &mut fixed.buf),
        );
    }

    /// Records the ops `step` queues (nothing runs) and copies its result into `out`, as one
    /// graph. Everything `step` allocates is freed inside the graph, so it can be replayed.
    pub(crate) fn capture(
        &self,
        step: impl FnOnce() -> CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<StepGraph, String> {
        let stream = &self.inner.stream;
        // An error recorded earlier (e.g. by a free) would fail begin/end_capture's own checks.
        let _ = stream.context().check_err();
        stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(|e| format!("begin capture: {e}"))?;
        let recorded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let result = step();
            check("copy logits", stream.memcpy_dtod(&result.buf, &mut out.buf));
        }));
        // A failed op invalidates the capture, and the frees after it record errors that would
        // keep end_capture from ending it: clear them, end it, and if that still fails end it
        // directly, so the stream can run the step op by op.
        let _ = stream.context().check_err();
        let graph = stream.end_capture(
            cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        );
        if graph.is_err() {
            // SAFETY: ends this stream's capture (if any); a returned graph is destroyed unused.
            unsafe {
                if let Ok(g) = cudarc::driver::result::stream::end_capture(stream.cu_stream())
                    && !g.is_null()
                {
                    let _ = cudarc::driver::result::graph::destroy(g);
                }
            }
            let _ = stream.context().check_err();
        }
        let capturing = stream
            .capture_status()
            .map_err(|e| format!("capture status: {e}"))?;
        if capturing != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            panic!("the CUDA stream is still capturing after a failed capture ({capturing:?})");
        }
        if let Err(panic) = recorded {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Err(format!("capturing a step failed: {why}"));
        }
        match graph {
            Ok(Some(graph)) => Ok(StepGraph(graph)),
            Ok(None) => Err("capture recorded no graph".into()),
            Err(e) => Err(format!("end capture: {e}")),
        }
    }

    /// Runs a captured step.
    pub(crate) fn replay(&self, graph: &StepGraph) {
        check("graph launch", graph.0.launch());
    }

    /// The first `rows` rows of `t`, copied.
    pub(crate) fn first_rows(&self, t: &CudaTensor, rows: usize) -> CudaTensor {
        let mut out = self.tensor(rows, t.cols);
        if rows > 0 {
            let n = rows * t.cols;
            check(
                "copy rows",
                self.inner
                    .stream
                    .memcpy_dtod(&t.buf.slice(..n), &mut out.buf.slice_mut(..n)),
            );
        }
        out
    }

    /// `x · wᵀ`; a bf16 weight multiplies `x_bf16` when given (x already rounded, shared by
    /// several products of the same x), else rounds x itself.
    fn gemm(&self, x: &CudaTensor, x_bf16: Option<&CudaSlice<u16>>, w: &CudaWeight) -> CudaTensor {
        let (m, k) = (x.rows, x.cols);
        let (n, wk) = w.shape();
        assert_eq!(k, wk, "matmul: x has {k} columns, the weight {wk}");
        let mut out = self.tensor(m, n);
        if m == 0 || n == 0 {
            return out;
        }
        // Row-major out[m, n] = x[m, k] · w[n, k]ᵀ is column-major outᵀ[n, m] = wᵀᵀ · xᵀ:
        // cuBLAS sees w as a column-major [k, n] matrix (transposed) and x as [k, m].
        check("bind context", self.inner.stream.context().bind_to_thread());
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let op_t = blas_sys::cublasOperation_t::CUBLAS_OP_T;
        let op_n = blas_sys::cublasOperation_t::CUBLAS_OP_N;
        let done = match w {
            CudaWeight::F32 { buf, .. } => {
                let cfg = GemmConfig {
                    transa: op_t,
                    transb: op_n,
                    m: ni,
                    n: mi,
                    k: ki,
                    alpha: 1.0f32,
                    lda: ki,
                    ldb: ki,
                    beta: 0.0f32,
                    ldc: ni,
                };
                // SAFETY: shapes checked above; every buffer holds what cfg says.
                unsafe { self.inner.blas.gemm(cfg, buf, &x.buf, &mut out.buf) }
            }
            CudaWeight::Bf16 { buf, .. } => {
                let rounded;
                let xb = match x_bf16 {
                    Some(xb) => xb,
                    None => {
                        rounded = self.round_bf16(x);
                        &rounded
                    }
                };
                let s = &self.inner.stream;
                let (alpha, beta) = (1.0f32, 0.0f32);
                let (a, _ra) = buf.device_ptr(s);
                let (b, _rb) = xb.device_ptr(s);
                let (c, _rc) = out.buf.device_ptr_mut(s);
                // SAFETY: as above; bf16 inputs, f32 output and accumulation.
                unsafe {
                    blas::gemm_ex(
                        *self.inner.blas.handle(),
                        op_t,
                        op_n,
                        ni,
                        mi,
                        ki,
                        (&alpha) as *const f32 as *const c_void,
                        a as *const c_void,
                        blas_sys::cudaDataType_t::CUDA_R_16BF,
                        ki,
                        b as *const c_void,
                        blas_sys::cudaDataType_t::CUDA_R_16BF,
                        ki,
                        (&beta) as *const f32 as *const c_void,
                        c as *mut c_void,
                        blas_sys::cudaDataType_t::CUDA_R_32F,
                        ni,
                        blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
            }
        };
        done.unwrap_or_else(|e| panic!("cuBLAS GEMM [{m}, {k}] x [{n}, {k}]: {e}"));
        out
    }

    /// Paged decode attention: one block per (kv head, sequence, split).
    fn decode_attention(
        &self,
        q: &CudaTensor,
        cache: &CudaKvCache,
        layer: usize,
        meta: &CudaStepMeta,
        num_heads: usize,
    ) -> CudaTensor {
        let l = cache.layout;
        let group = num_heads / l.num_kv_heads;
        let mut out = self.tensor(q.rows, q.cols);
        let (splits, partition) = match meta.fixed_partition {
            Some(p) => (meta.longest.div_ceil(p).max(1), p),
            None => {
                let splits =
                    decode_splits(l.num_kv_heads * meta.num_seqs, self.inner.sms, meta.longest);
                let partition = meta
                    .longest
                    .div_ceil(splits)
                    .next_multiple_of(ballast_kernels::ATTENTION_KV_TILE);
                (splits, if splits > 1 { partition } else { 0 })
            }
        };
        // Recompute so no split is empty after rounding the partition up.
        let splits = if splits > 1 {
            meta.longest.div_ceil(partition)
        } else {
            1
        };
        let parts = meta.num_seqs * num_heads * splits;
        let mut part_out = self.alloc::<f32>(if splits > 1 { parts * l.head_dim } else { 1 });
        let mut part_lse = self.alloc::<f32>(if splits > 1 { parts } else { 1 });
        let smem = ballast_kernels::attention_smem_bytes(group, l.head_dim);
        assert!(
            smem <= self.inner.smem_limit,
            "decode attention needs {smem} bytes of shared memory; the device allows {}",
            self.inner.smem_limit
        );
        let ints = [
            num_heads,
            l.num_kv_heads,
            l.head_dim,
            l.block_size,
            partition,
        ]
        .map(|v| v as i32);
        let scale = 1.0 / (l.head_dim as f32).sqrt();
        let (seqs, tables) = (meta.view(&meta.seqs), meta.view(&meta.block_tables));
        let f = &self.inner.f;
        let mut b = self.inner.stream.launch_builder(&f.decode);
        b.arg(&q.buf)
            .arg(&cache.k[layer])
            .arg(&cache.v[layer])
            .arg(&seqs)
            .arg(&tables)
            .arg(&mut out.buf)
            .arg(&mut part_out)
            .arg(&mut part_lse);
        for v in &ints {
            b.arg(v);
        }
        b.arg(&scale);
        let cfg = LaunchConfig {
            grid_dim: (l.num_kv_heads as u32, meta.num_seqs as u32, splits as u32),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        check("paged_attention_decode_f32", unsafe { b.launch(cfg) });
        if splits > 1 {
            let (h, d, z) = (num_heads as i32, l.head_dim as i32, splits as i32);
            let mut b = self.inner.stream.launch_builder(&f.merge);
            b.arg(&part_out)
                .arg(&part_lse)
                .arg(&seqs)
                .arg(&mut out.buf)
                .arg(&h)
                .arg(&d)
                .arg(&z);
            let cfg = LaunchConfig {
                grid_dim: (num_heads as u32, meta.num_seqs as u32, 1),
                block_dim: (l.head_dim.next_multiple_of(32).min(1024) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            check("paged_attention_merge_f32", unsafe { b.launch(cfg) });
        }
        out
    }

    /// Paged causal attention for steps with several queries per sequence.
    fn prefill_attention(
        &self,
        q: &CudaTensor,
        cache: &CudaKvCache,
        layer: usize,
        meta: &CudaStepMeta,
        num_heads: usize,
    ) -> CudaTensor {
        let l = cache.layout;
        let group = num_heads / l.num_kv_heads;
        let mut out = self.tensor(q.rows, q.cols);
        // About 32 (query, head) rows per block, fewer if shared memory runs short.
        let mut per_tile = (32 / group).clamp(1, meta.max_query.max(1));
        while per_tile > 1
            && ballast_kernels::attention_smem_bytes(per_tile * group, l.head_dim)
                > self.inner.smem_limit
        {
            per_tile /= 2;
        }
        let smem = ballast_kernels::attention_smem_bytes(per_tile * group, l.head_dim);
        assert!(
            smem <= self.inner.smem_limit,
            "prefill attention needs {smem} bytes of shared memory; the device allows {}",
            self.inner.smem_limit
        );
        let ints = [
            num_heads,
            l.num_kv_heads,
            l.head_dim,
            l.block_size,
            per_tile,
        ]
        .map(|v| v as i32);
        let scale = 1.0 / (l.head_dim as f32).sqrt();
        let (seqs, tables) = (meta.view(&meta.seqs), meta.view(&meta.block_tables));
        let mut b = self.inner.stream.launch_builder(&self.inner.f.prefill);
        b.arg(&q.buf)
            .arg(&cache.k[layer])
            .arg(&cache.v[layer])
            .arg(&seqs)
            .arg(&tables)
            .arg(&mut out.buf);
        for v in &ints {
            b.arg(v);
        }
        b.arg(&scale);
        let cfg = LaunchConfig {
            grid_dim: (
                l.num_kv_heads as u32,
                meta.max_query.div_ceil(per_tile) as u32,
                meta.num_seqs as u32,
            ),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        check("paged_attention_prefill_f32", unsafe { b.launch(cfg) });
        out
    }
}

/// How many splits a decode step's attention uses: enough blocks to give every SM about
/// two, but no split shorter than 256 keys. `blocks` is kv heads ×
/// sequences, the grid without splitting.
pub fn decode_splits(blocks: usize, sms: usize, longest: usize) -> usize {
    if blocks == 0 || blocks >= sms {
        return 1;
    }
    let wanted = (2 * sms).div_ceil(blocks);
    let most = longest / MIN_SPLIT_TOKENS;
    wanted.min(most).max(1)
}

/// The step's index arrays packed into one u32 array (token ids, positions, slot mapping,
/// sequences as five u32 each, block tables, logits rows) and the metadata describing it, with
/// given the buffer.
fn pack(meta: &StepMetadata) -> (Vec<u32>, impl FnOnce(CudaSlice<u32>) -> CudaStepMeta) {
    let mut host: Vec<u32> = Vec::with_capacity(
        3 * meta.num_tokens()
            + 5 * meta.seqs.len()
            + meta.block_tables.len()
            + meta.logits_rows.len(),
    );
    let mut push = |values: &mut dyn Iterator<Item = u32>| {
        let start = host.len();
        host.extend(values);
        start..host.len()
    };
    let token_ids = push(&mut meta.token_ids.iter().copied());
    let positions = push(&mut meta.positions.iter().copied());
    let slot_mapping = push(&mut meta.slot_mapping.iter().copied());
    let seqs = push(&mut meta.seqs.iter().flat_map(|s| {
        [
            s.query_start,
            s.query_len,
            s.context_len,
            s.block_table_start,
            s.block_table_len,
        ]
    }));
    let block_tables = push(&mut meta.block_tables.iter().copied());
    let logits_rows = push(&mut meta.logits_rows.iter().copied());
    if host.is_empty() {
        host.push(0);
    }
    let num_tokens = meta.num_tokens();
    let num_seqs = meta.seqs.len();
    let decode_only = meta.seqs.iter().all(|s| s.query_len == 1);
    let longest = meta
        .seqs
        .iter()
        .map(|s| s.total_len() as usize)
        .max()
        .unwrap_or(0);
    let max_query = meta
        .seqs
        .iter()
        .map(|s| s.query_len as usize)
        .max()
        .unwrap_or(0);
    let block_size = meta.block_size as usize;
    let packed = move |buf| CudaStepMeta {
        buf,
        token_ids,
        positions,
        slot_mapping,
        seqs,
        block_tables,
        logits_rows,
        num_tokens,
        num_seqs,
        decode_only,
        fixed_partition: None,
        longest,
        max_query,
        block_size,
    };
    (host, packed)
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvCache = CudaKvCache;
    type StepMeta = CudaStepMeta;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> CudaTensor {
        assert_eq!(data.len(), rows * cols, "upload: data does not match shape");
        let buf = if data.is_empty() {
            self.alloc(1)
        } else {
            check("upload", self.inner.stream.clone_htod(data))
        };
        CudaTensor { buf, rows, cols }
    }

    fn download(&self, t: &CudaTensor) -> Vec<f32> {
        let n = t.rows * t.cols;
        let mut host = check("download", self.inner.stream.clone_dtoh(&t.buf));
        host.truncate(n);
        host
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn upload_weight(&self, w: HostWeight<'_>) -> CudaWeight {
        let (rows, cols) = w.shape();
        match w {
            HostWeight::F32 { data, .. } => {
                assert_eq!(
                    data.len(),
                    rows * cols,
                    "upload_weight: data does not match shape"
                );
                CudaWeight::F32 {
                    buf: check("upload_weight", self.inner.stream.clone_htod(&data[..])),
                    rows,
                    cols,
                }
            }
            HostWeight::Bf16 { data, .. } => self.upload_bf16(&data, rows, cols),
            HostWeight::Quant(_) => {
                let HostWeight::Bf16 { data, .. } = w.to_bf16() else {
                    unreachable!("to_bf16 returns bf16")
                };
                self.upload_bf16(&data, rows, cols)
            }
        }
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        w.shape()
    }

    fn alloc_kv_cache(&self, layout: KvLayout) -> CudaKvCache {
        let layer = || {
            check(
                "KV cache",
                self.inner
                    .stream
                    .alloc_zeros::<f32>(layout.layer_len().max(1)),
            )
        };
        CudaKvCache {
            layout,
            k: (0..layout.num_layers).map(|_| layer()).collect(),
            v: (0..layout.num_layers).map(|_| layer()).collect(),
        }
    }

    fn prepare_step(&self, meta: &StepMetadata) -> CudaStepMeta {
        let (host, with_buf) = pack(meta);
        with_buf(check("step metadata", self.inner.stream.clone_htod(&host)))
    }

    fn run_step<R: Send>(&self, step: impl FnOnce() -> R + Send) -> R {
        // A poisoned lock only means another rank's step panicked; the stream is still usable
        // for this one or will report its own error.
        let _turn = self.inner.step.lock().unwrap_or_else(|e| e.into_inner());
        // cuBLAS calls do not make the context current themselves; rank threads enter here.
        check("bind context", self.inner.stream.context().bind_to_thread());
        step()
    }

    fn embedding(&self, table: &CudaWeight, meta: &CudaStepMeta) -> CudaTensor {
        let (_, hidden) = table.shape();
        let mut out = self.tensor(meta.num_tokens, hidden);
        if meta.num_tokens == 0 {
            return out;
        }
        let ids = meta.view(&meta.token_ids);
        let h = hidden as i32;
        let f = &self.inner.f;
        let launch = match table {
            CudaWeight::F32 { buf, .. } => {
                let mut b = self.inner.stream.launch_builder(&f.embedding_f32);
                b.arg(buf).arg(&ids).arg(&mut out.buf).arg(&h);
                unsafe { b.launch(grid(meta.num_tokens)) }
            }
            CudaWeight::Bf16 { buf, .. } => {
                let mut b = self.inner.stream.launch_builder(&f.embedding_bf16);
                b.arg(buf).arg(&ids).arg(&mut out.buf).arg(&h);
                unsafe { b.launch(grid(meta.num_tokens)) }
            }
        };
        check("embedding", launch);
        out
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaWeight) -> CudaTensor {
        self.gemm(x, None, w)
    }

    fn matmul_n<const N: usize>(&self, x: &CudaTensor, ws: [&CudaWeight; N]) -> [CudaTensor; N] {
        // Round x to bf16 once for all the bf16 products (Q/K/V, gate/up).
        let any_bf16 = ws.iter().any(|w| matches!(w, CudaWeight::Bf16 { .. }));
        let xb = (any_bf16 && x.rows > 0).then(|| self.round_bf16(x));
        ws.map(|w| self.gemm(x, xb.as_ref(), w))
    }

    fn rms_norm(&self, x: &CudaTensor, weight: &CudaTensor, eps: f32) -> CudaTensor {
        let mut out = self.tensor(x.rows, x.cols);
        if x.rows == 0 {
            return out;
        }
        let cols = x.cols as i32;
        let mut b = self.inner.stream.launch_builder(&self.inner.f.rms_norm);
        b.arg(&x.buf)
            .arg(&weight.buf)
            .arg(&mut out.buf)
            .arg(&cols)
            .arg(&eps);
        check("rms_norm_f32", unsafe { b.launch(grid(x.rows)) });
        out
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        cos: &CudaTensor,
        sin: &CudaTensor,
        meta: &CudaStepMeta,
        num_heads: usize,
        style: RopeStyle,
    ) {
        if x.rows == 0 {
            return;
        }
        let positions = meta.view(&meta.positions);
        let head_dim = x.cols / num_heads;
        assert_eq!(
            cos.cols,
            head_dim / 2,
            "rope: the tables have {} frequencies, heads of {head_dim} need {}",
            cos.cols,
            head_dim / 2
        );
        let (h, d) = (num_heads as i32, head_dim as i32);
        let style: i32 = match style {
            RopeStyle::Halves => 0,
            RopeStyle::Pairs => 1,
        };
        let mut b = self.inner.stream.launch_builder(&self.inner.f.rope);
        b.arg(&mut x.buf)
            .arg(&cos.buf)
            .arg(&sin.buf)
            .arg(&positions)
            .arg(&h)
            .arg(&d)
            .arg(&style);
        let mut cfg = grid(x.rows);
        cfg.block_dim = (128, 1, 1);
        check("rope_f32", unsafe { b.launch(cfg) });
    }

    fn write_kv(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaTensor,
        v: &CudaTensor,
        meta: &CudaStepMeta,
    ) {
        if k.rows == 0 {
            return;
        }
        assert_eq!(
            k.cols,
            cache.layout.token_stride(),
            "write_kv: K row is not num_kv_heads * head_dim"
        );
        let slots = meta.view(&meta.slot_mapping);
        let stride = cache.layout.token_stride() as i32;
        let (kc, vc) = (&mut cache.k[layer], &mut cache.v[layer]);
        let mut b = self.inner.stream.launch_builder(&self.inner.f.write_kv);
        b.arg(&k.buf)
            .arg(&v.buf)
            .arg(kc)
            .arg(vc)
            .arg(&slots)
            .arg(&stride);
        let mut cfg = grid(k.rows);
        cfg.block_dim = (128, 1, 1);
        check("write_kv_f32", unsafe { b.launch(cfg) });
    }

    fn paged_attention(
        &self,
        q: &CudaTensor,
        cache: &CudaKvCache,
        layer: usize,
        meta: &CudaStepMeta,
        num_heads: usize,
    ) -> CudaTensor {
        assert_eq!(
            meta.block_size, cache.layout.block_size,
            "step and cache disagree on the block size"
        );
        if meta.num_seqs == 0 {
            return CudaTensor {
                buf: check("alloc", self.inner.stream.alloc_zeros(q.rows * q.cols + 1)),
                rows: q.rows,
                cols: q.cols,
            };
        }
        // The decode kernel computes each sequence's last query only.
        if meta.decode_only {
            self.decode_attention(q, cache, layer, meta, num_heads)
        } else {
            self.prefill_attention(q, cache, layer, meta, num_heads)
        }
    }

    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> CudaTensor {
        let n = gate.rows * gate.cols;
        let mut out = self.tensor(gate.rows, gate.cols);
        if n == 0 {
            return out;
        }
        let mut b = self.inner.stream.launch_builder(&self.inner.f.silu_mul);
        b.arg(&gate.buf).arg(&up.buf).arg(&mut out.buf).arg(&n);
        check("silu_mul_f32", unsafe { b.launch(self.elementwise(n)) });
        out
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) {
        let n = x.rows * x.cols;
        if n == 0 {
            return;
        }
        let mut b = self.inner.stream.launch_builder(&self.inner.f.add_assign);
        b.arg(&mut x.buf).arg(&y.buf).arg(&n);
        check("add_assign_f32", unsafe { b.launch(self.elementwise(n)) });
    }

    fn gather_logits_rows(&self, x: &CudaTensor, meta: &CudaStepMeta) -> CudaTensor {
        let rows = meta.logits_rows.len();
        let mut out = self.tensor(rows, x.cols);
        if rows == 0 {
            return out;
        }
        let picks = meta.view(&meta.logits_rows);
        let cols = x.cols as i32;
        let mut b = self.inner.stream.launch_builder(&self.inner.f.gather_rows);
        b.arg(&x.buf).arg(&picks).arg(&mut out.buf).arg(&cols);
        check("gather_rows_f32", unsafe { b.launch(grid(rows)) });
        out
    }

    fn sample(&self, logits: &CudaTensor, slots: &mut [SamplingSlot]) -> Vec<u32> {
        let (rows, cols) = (logits.rows, logits.cols);
        assert_eq!(rows, slots.len(), "one sampling slot per logits row");
        // Greedy rows without suppressed tokens need only their argmax: read back one id per
        // row instead of the whole vocabulary. Anything else samples on the host, exactly as
        // the CPU backend does (the same generator draws).
        let argmax_only = slots
            .iter()
            .all(|s| s.spec.is_greedy() && s.suppress.as_ref().is_none_or(|x| x.is_empty()));
        if !argmax_only || rows == 0 {
            return super::sample_on_host(&mut self.download(logits), cols, slots);
        }
        let mut out = self.alloc::<u32>(rows);
        let c = cols as i32;
        let mut b = self.inner.stream.launch_builder(&self.inner.f.argmax);
        b.arg(&logits.buf).arg(&mut out).arg(&c);
        let mut cfg = grid(rows);
        cfg.block_dim = (SAMPLING_THREADS, 1, 1);
        check("argmax_f32", unsafe { b.launch(cfg) });
        let mut ids = check("download tokens", self.inner.stream.clone_dtoh(&out));
        ids.truncate(rows);
        ids
    }
}

/// A captured step. cudarc's graph is not `Send` because CUDA graphs must not be used from
/// two threads at once; a graph executor
/// ([`crate::compute::executor::cuda_graphs::GraphExecutor`]) owns its graphs and uses them
/// only inside [`Backend::run_step`], one step at a time.
pub(crate) struct StepGraph(cudarc::driver::CudaGraph);

// SAFETY: see above; the executor moves to its rank thread once and never shares the graph.
unsafe impl Send for StepGraph {}

/// Batch sizes decode steps are captured at; a step is padded up to the next one.
pub const GRAPH_BATCHES: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_splits_fill_the_device_without_tiny_splits() {
        // Enough blocks already: no split.
        assert_eq!(decode_splits(132, 132, 32_768), 1);
        assert_eq!(decode_splits(512, 132, 32_768), 1);
        // Batch 1 of Llama-3-8B (8 kv heads) on 132 SMs at 32k keys: 33 splits of ~1k keys.
        assert_eq!(decode_splits(8, 132, 32_768), 33);
        // The same at 1k keys: no split shorter than 256 keys.
        assert_eq!(decode_splits(8, 132, 1024), 4);
        // Short contexts never split.
        assert_eq!(decode_splits(8, 132, 255), 1);
        assert_eq!(decode_splits(0, 132, 4096), 1);
    }

    #[test]
    fn a_machine_without_cuda_gets_an_error_not_a_panic() {
        let (driver, cublas) = libraries_present();
        if driver && cublas {
            eprintln!("this machine has CUDA libraries; the refusal path is not exercised");
            return;
        }
        let e = CudaBackend::new(0).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("--device cpu"), "{text}");
    }
}
