//! `ballast engine` started on damaged copies of the real model file: each must stop before
//! its ports answer, with exit status 2 and a message that names the tensor at fault.
//!
//! The copies are made from the cached SmolLM2 Q4_1 file (`scripts/fetch-model.sh`; skipped
//! without it unless `BALLAST_REQUIRE_MODEL` is set), edited where this module's small GGUF
//! header walker finds the field: a truncated download, a tensor in a type Ballast has no
//! kernel for, a tensor in a type id no ggml knows, and metadata that disagrees with the
//! tensors' shapes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ballast_engine::compute::model::{KNOWN_MODELS, cached_model_or_skip};

/// Where the fields of interest lie in a GGUF file (version 3, little-endian).
struct Layout {
    /// Metadata key → byte offset of its value.
    values: Vec<(String, usize)>,
    /// Tensor name → byte offset of its ggml type id, and its dims.
    tensors: Vec<(String, usize, Vec<u64>)>,
}

/// A cursor over the header; panics on a malformed file (the input is the real model).
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(self.b[self.at..self.at + 4].try_into().unwrap());
        self.at += 4;
        v
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.b[self.at..self.at + 8].try_into().unwrap());
        self.at += 8;
        v
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        let s = String::from_utf8(self.b[self.at..self.at + n].to_vec()).unwrap();
        self.at += n;
        s
    }
    /// Skips one metadata value of type `t`.
    fn skip(&mut self, t: u32) {
        match t {
            0 | 1 | 7 => self.at += 1,
            2 | 3 => self.at += 2,
            4..=6 => self.at += 4,
            8 => {
                self.string();
            }
            9 => {
                let (et, n) = (self.u32(), self.u64());
                for _ in 0..n {
                    self.skip(et);
                }
            }
            10..=12 => self.at += 8,
            _ => panic!("value type {t}"),
        }
    }
}

fn layout(b: &[u8]) -> Layout {
    assert_eq!(&b[..4], b"GGUF");
    let mut r = Reader { b, at: 4 };
    assert_eq!(r.u32(), 3);
    let (n_tensors, n_kv) = (r.u64(), r.u64());
    let mut values = Vec::new();
    for _ in 0..n_kv {
        let key = r.string();
        let t = r.u32();
        values.push((key, r.at));
        r.skip(t);
    }
    let mut tensors = Vec::new();
    for _ in 0..n_tensors {
        let name = r.string();
        let n_dims = r.u32();
        let dims: Vec<u64> = (0..n_dims).map(|_| r.u64()).collect();
        tensors.push((name, r.at, dims));
        r.at += 4 + 8; // type, offset
    }
    Layout { values, tensors }
}

/// A copy of `src` in a fresh directory, changed by `edit`.
fn damaged(src: &Path, what: &str, edit: impl FnOnce(&mut Vec<u8>, &Layout)) -> PathBuf {
    let mut bytes = std::fs::read(src).unwrap();
    let l = layout(&bytes);
    edit(&mut bytes, &l);
    let dir = crate::common::local::temp_dir(&format!("bad-model-{what}"));
    let path = dir.join(format!("{what}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn set_tensor_type(bytes: &mut [u8], l: &Layout, tensor: &str, type_id: u32) {
    let (_, at, _) = l.tensors.iter().find(|(n, _, _)| n == tensor).unwrap();
    bytes[*at..*at + 4].copy_from_slice(&type_id.to_le_bytes());
}

/// Runs `ballast engine --model FILE` and returns its exit code and stderr; it must exit by
/// itself (a bad file never gets as far as listening).
fn start(path: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["engine", "--port", "0", "--cpu-threads", "1", "--model"])
        .arg(path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            let _ = std::fs::remove_dir_all(path.parent().unwrap());
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ballast engine --model {} did not exit", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn model() -> Option<PathBuf> {
    cached_model_or_skip(KNOWN_MODELS[0].name)
}

fn assert_refused(path: &Path, needles: &[&str]) {
    let (code, err) = start(path);
    assert_eq!(code, Some(2), "{}: {err}", path.display());
    for n in needles {
        assert!(err.contains(n), "{}: no {n:?} in: {err}", path.display());
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_truncated_file_names_the_tensor_that_runs_past_its_end() {
    let _group = crate::common::group(module_path!());
    let Some(src) = model() else { return };
    // A download that stopped at two thirds: the header is whole, the last tensors are not.
    let path = damaged(&src, "truncated", |b, _| b.truncate(b.len() * 2 / 3));
    assert_refused(&path, &["truncated", "tensor \"blk."]);
}

#[test]
fn a_tensor_in_a_type_without_a_kernel_is_named() {
    let _group = crate::common::group(module_path!());
    let Some(src) = model() else { return };
    // Q2_K (id 10) is a type Ballast reads but has no kernel for. Its 256-element
    // super-blocks of 84 bytes take fewer bytes than the Q4_1 tensor held, so the file stays
    // in bounds and only the type is wrong.
    // Message: tensor "blk.3.ffn_down.weight" is Q2_K; Ballast runs … weights.
    let path = damaged(&src, "q2k", |b, l| {
        set_tensor_type(b, l, "blk.3.ffn_down.weight", 10)
    });
    assert_refused(&path, &["\"blk.3.ffn_down.weight\"", "Q2_K", "Q4_1"]);
}

#[test]
fn a_tensor_in_an_unknown_type_is_named() {
    let _group = crate::common::group(module_path!());
    let Some(src) = model() else { return };
    // Type id 20 is IQ4_NL, a newer ggml type this reader does not know.
    let path = damaged(&src, "iq4nl", |b, l| {
        set_tensor_type(b, l, "blk.7.attn_q.weight", 20)
    });
    assert_refused(&path, &["\"blk.7.attn_q.weight\"", "unknown ggml type 20"]);
}

#[test]
fn metadata_that_disagrees_with_the_tensors_names_the_first_tensor_it_misfits() {
    let _group = crate::common::group(module_path!());
    let Some(src) = model() else { return };
    let key = "llama.feed_forward_length";
    let mut ffn = 0;
    let path = damaged(&src, "ffn", |b, l| {
        let (_, at) = l.values.iter().find(|(k, _)| k == key).unwrap();
        ffn = u32::from_le_bytes(b[*at..*at + 4].try_into().unwrap());
        b[*at..*at + 4].copy_from_slice(&(ffn / 2).to_le_bytes());
    });
    assert!(ffn > 0);
    assert_refused(
        &path,
        &[
            "tensor \"blk.0.ffn_",
            "the hyperparameters need",
            &ffn.to_string(),
        ],
    );
}
