//! The GGUF reader's dequantization and the quantized kernels against ggml's own Python
//! package (`gguf` 0.19.0, `gguf.quants.dequantize`), through `scripts/reference/dequantize.py`:
//!
//! - random blocks of every quantized type, dequantized by gguf-py at test time (needs
//!   `BALLAST_GGUF_PYTHON`, a Python with `gguf`; skipped without it unless
//!   `BALLAST_REQUIRE_GGUF_PYTHON` is set);
//! - real blocks of SmolLM2-135M quantized by llama.cpp's `llama-quantize` to Q4_K_M, Q5_K_M
//!   and Q6_K, with gguf-py's values (`tests/fixtures/kquant_blocks.json`, always);
//! - every tensor of those files when they are cached (`scripts/quantize-model.sh`) and the
//!   Python is there.
//!
//! The kernels are then checked against that dequantization: every kernel a CPU runs (portable,
//! AVX2 / AVX-VNNI rows, panels) on matrices made of those real blocks.

use std::path::{Path, PathBuf};
use std::process::Command;

use ballast_engine::compute::backend::cpu::CpuTensor;
use ballast_engine::compute::backend::quant::{
    self, QuantFormat, QuantKernel, QuantMatrix, SharedBytes,
};
use ballast_engine::compute::model::gguf::{GgmlType, GgufFile, dequantize};
use ballast_engine::compute::model::model_cache_dir;
use ballast_rng::SplitMix64;
use serde_json::Value;

/// The quantized types checked, with the byte offsets of their f16 fields (scales, minima).
const TYPES: [(GgmlType, &[usize]); 10] = [
    (GgmlType::Q8_0, &[0]),
    (GgmlType::Q4_0, &[0]),
    (GgmlType::Q4_1, &[0, 2]),
    (GgmlType::Q5_0, &[0]),
    (GgmlType::Q5_1, &[0, 2]),
    (GgmlType::Q2_K, &[80, 82]),
    (GgmlType::Q3_K, &[108]),
    (GgmlType::Q4_K, &[0, 2]),
    (GgmlType::Q5_K, &[0, 2]),
    (GgmlType::Q6_K, &[208]),
];

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/dequantize.py")
}

/// The Python named by `BALLAST_GGUF_PYTHON`, or `None` (a "skipped" line) when unset;
/// with `BALLAST_REQUIRE_GGUF_PYTHON` set a missing one fails instead.
fn gguf_python(test: &str) -> Option<PathBuf> {
    match std::env::var_os("BALLAST_GGUF_PYTHON").filter(|p| !p.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var_os("BALLAST_REQUIRE_GGUF_PYTHON").is_none(),
                "BALLAST_REQUIRE_GGUF_PYTHON is set but BALLAST_GGUF_PYTHON is not"
            );
            eprintln!(
                "skipped {test}: set BALLAST_GGUF_PYTHON to a Python with gguf==0.19.0 \
                 (python3 -m venv V && V/bin/pip install gguf==0.19.0)"
            );
            None
        }
    }
}

/// `count` random blocks of `dtype`: random bytes, with finite f16 scales of either sign
/// from 2⁻²⁰ (subnormal) to 4 where the format keeps them.
fn random_blocks(dtype: GgmlType, f16s: &[usize], count: usize, rng: &mut SplitMix64) -> Vec<u8> {
    let bb = dtype.block_bytes() as usize;
    let mut out = vec![0u8; count * bb];
    for b in out.chunks_exact_mut(bb) {
        for v in b.iter_mut() {
            *v = rng.next_u64() as u8;
        }
        for &at in f16s {
            let mag = 2f32.powi(rng.below(23) as i32 - 20) * (1.0 + rng.next_f32());
            let v = if rng.below(4) == 0 { -mag } else { mag };
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    out
}

fn ours(dtype: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / dtype.block_bytes() as usize * dtype.block_elems() as usize;
    let mut out = vec![0.0; n];
    dequantize(dtype, bytes, &mut out).unwrap();
    out
}

/// The first element whose bits differ, as `(index, ours, theirs)`.
fn first_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x.to_bits() != y.to_bits() && !(**x == 0.0 && **y == 0.0))
        .map(|(i, (x, y))| (i, *x, *y))
}

#[test]
fn dequantization_matches_gguf_py_on_random_blocks() {
    let Some(python) = gguf_python("dequantization_matches_gguf_py_on_random_blocks") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("ballast-dequant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = SplitMix64::new(22);
    for (dtype, f16s) in TYPES {
        let bytes = random_blocks(dtype, f16s, 512, &mut rng);
        let (src, dst) = (
            dir.join(format!("{dtype}.in")),
            dir.join(format!("{dtype}.out")),
        );
        std::fs::write(&src, &bytes).unwrap();
        let status = Command::new(&python)
            .arg(script())
            .args(["blocks", dtype.name()])
            .args([&src, &dst])
            .status()
            .expect("runs the Python that BALLAST_GGUF_PYTHON names");
        assert!(status.success(), "dequantize.py blocks {dtype} failed");
        let theirs: Vec<f32> = std::fs::read(&dst)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mine = ours(dtype, &bytes);
        if let Some((i, a, b)) = first_difference(&mine, &theirs) {
            let block = i / dtype.block_elems() as usize;
            panic!(
                "{dtype} element {i} (block {block}): Ballast {a:e}, gguf-py {b:e}; block bytes {:02x?}",
                &bytes[block * dtype.block_bytes() as usize..][..dtype.block_bytes() as usize]
            );
        }
        eprintln!("{dtype}: 512 random blocks equal gguf-py's bit for bit");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One real block of the fixture.
struct RealBlock {
    dtype: GgmlType,
    /// File and tensor it comes from.
    tensor: String,
    bytes: Vec<u8>,
    /// gguf-py's values.
    values: Vec<f32>,
}

/// The real blocks of the fixture.
fn real_blocks() -> Vec<RealBlock> {
    let fixture: Value =
        serde_json::from_str(include_str!("../fixtures/kquant_blocks.json")).unwrap();
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    fixture["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let name = b["type"].as_str().unwrap();
            let dtype = TYPES
                .iter()
                .map(|t| t.0)
                .find(|t| t.name() == name)
                .unwrap_or_else(|| panic!("fixture type {name}"));
            let values = hex(b["values_f32le"].as_str().unwrap())
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let file = b["file"].as_str().unwrap();
            RealBlock {
                dtype,
                tensor: format!("{file} {}", b["tensor"].as_str().unwrap()),
                bytes: hex(b["bytes"].as_str().unwrap()),
                values,
            }
        })
        .collect()
}

fn format_of(dtype: GgmlType) -> Option<QuantFormat> {
    QuantFormat::ALL
        .into_iter()
        .find(|f| f.name() == dtype.name())
}

#[test]
fn real_blocks_dequantize_as_gguf_py_does() {
    let blocks = real_blocks();
    let mut seen = std::collections::BTreeMap::new();
    for RealBlock {
        dtype,
        tensor,
        bytes,
        values,
    } in &blocks
    {
        let mine = ours(*dtype, bytes);
        if let Some((i, a, b)) = first_difference(&mine, values) {
            panic!("{tensor} ({dtype}) element {i}: Ballast {a:e}, gguf-py {b:e}");
        }
        // The kernels' own reading of the block (`sub_block`, what every kernel computes).
        if let Some(format) = format_of(*dtype) {
            let cols = format.block_elems();
            let m =
                QuantMatrix::new(format, 1, cols, SharedBytes::from_vec(bytes.clone())).unwrap();
            let mut row = vec![0.0; cols];
            m.dequantize_row(0, &mut row);
            if let Some((i, a, b)) = first_difference(&row, values) {
                panic!("{tensor} ({dtype}) element {i}: kernel reading {a:e}, gguf-py {b:e}");
            }
        }
        *seen.entry(dtype.name()).or_insert(0) += 1;
    }
    eprintln!("real blocks equal to gguf-py's values: {seen:?}");
    // The fixture must hold every type a llama-quantize'd K-quant file of the model has.
    for name in ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q8_0"] {
        assert!(seen.contains_key(name), "the fixture has no {name} block");
    }
}

/// Random activations against a matrix whose rows are the fixture's real blocks of `format`
/// (repeated to fill the width), through every kernel: each must land within the bound that
/// rounding the activations to 8 bits allows of the f32 product with gguf-py's values.
#[test]
fn kernels_match_the_reference_on_real_blocks() {
    let blocks = real_blocks();
    let mut rng = SplitMix64::new(5);
    for format in QuantFormat::ALL {
        let mine: Vec<&RealBlock> = blocks
            .iter()
            .filter(|b| format_of(b.dtype) == Some(format))
            .collect();
        if mine.is_empty() {
            continue;
        }
        // Rows of 1,536 elements (SmolLM2's ffn_down width), 37 rows: two panels and a part.
        let (rows, cols) = (37, 1536);
        let per_row = cols / format.block_elems();
        let (mut bytes, mut dense) = (Vec::new(), Vec::new());
        for r in 0..rows {
            for b in 0..per_row {
                let block = mine[(r * per_row + b) % mine.len()];
                bytes.extend_from_slice(&block.bytes);
                dense.extend_from_slice(&block.values);
            }
        }
        let w = QuantMatrix::new(format, rows, cols, SharedBytes::from_vec(bytes)).unwrap();
        let panels = w.to_panels();
        for m in [1, 3, 8, 30] {
            let x = CpuTensor {
                data: (0..m * cols).map(|_| rng.next_f32() * 2.0 - 1.0).collect(),
                rows: m,
                cols,
            };
            // Each activation block rounds by at most half its step, d/2 = max|x|/254.
            let mut bound = vec![0.0f32; m * rows];
            let mut exact = vec![0.0f32; m * rows];
            for i in 0..m {
                let xr = x.row(i);
                for j in 0..rows {
                    let wr = &dense[j * cols..(j + 1) * cols];
                    exact[i * rows + j] = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                    bound[i * rows + j] = xr
                        .chunks(32)
                        .zip(wr.chunks(32))
                        .map(|(xb, wb)| {
                            let step = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
                            wb.iter().map(|v| v.abs()).sum::<f32>() * step / 2.0
                        })
                        .sum::<f32>()
                        * 1.01
                        + 1e-3;
                }
            }
            let variants = [
                (
                    "portable rows",
                    quant::matmul(&x, &w, QuantKernel::Portable),
                ),
                ("int8 rows", quant::matmul(&x, &w, QuantKernel::Int8)),
                ("auto rows", quant::matmul(&x, &w, QuantKernel::Auto)),
                (
                    "portable panels",
                    quant::matmul(&x, &panels, QuantKernel::Portable),
                ),
                ("auto panels", quant::matmul(&x, &panels, QuantKernel::Auto)),
            ];
            for (name, got) in variants {
                for (k, ((g, e), b)) in got.data.iter().zip(&exact).zip(&bound).enumerate() {
                    assert!(
                        (g - e).abs() <= *b,
                        "{format:?} m={m} {name} [{}, {}]: {g} vs exact {e} (bound {b})",
                        k / rows,
                        k % rows
                    );
                }
            }
        }
    }
}

/// The K-quant files `scripts/quantize-model.sh Q4_K_M Q5_K_M Q6_K` makes, where cached.
fn kquant_files() -> Vec<PathBuf> {
    ["Q4_K_M", "Q5_K_M", "Q6_K"]
        .iter()
        .map(|t| model_cache_dir().join(format!("SmolLM2-135M-Instruct.{t}.from-Q4_1.gguf")))
        .filter(|p| p.is_file())
        .collect()
}

#[test]
fn whole_files_dequantize_as_gguf_py_does() {
    let files = kquant_files();
    if files.is_empty() {
        eprintln!("skipped: no K-quant file cached (scripts/quantize-model.sh Q4_K_M Q5_K_M Q6_K)");
        return;
    }
    let Some(python) = gguf_python("whole_files_dequantize_as_gguf_py_does") else {
        return;
    };
    for path in files {
        let out = Command::new(&python)
            .arg(script())
            .arg("sums")
            .arg(&path)
            .output()
            .expect("runs the Python that BALLAST_GGUF_PYTHON names");
        assert!(out.status.success(), "dequantize.py sums failed");
        let sums: Value = serde_json::from_slice(&out.stdout).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let mut types = std::collections::BTreeMap::new();
        for view in file.tensor_views() {
            let want = &sums["tensors"][&view.info.name];
            let values = view.dequantize().unwrap();
            let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
            let abs: f64 = values.iter().map(|&v| f64::from(v).abs()).sum();
            let (ws, wa) = (
                want["sum"].as_f64().unwrap(),
                want["abs_sum"].as_f64().unwrap(),
            );
            // Both are float64 sums of the same f32 values, in another order.
            assert!(
                (sum - ws).abs() <= 1e-9 * wa.max(1.0) && (abs - wa).abs() <= 1e-9 * wa.max(1.0),
                "{} {}: sum {sum} / {abs}, gguf-py {ws} / {wa}",
                path.display(),
                view.info.name
            );
            *types.entry(view.info.dtype.name()).or_insert(0) += 1;
        }
        eprintln!("{}: every tensor as gguf-py: {types:?}", path.display());
    }
}
