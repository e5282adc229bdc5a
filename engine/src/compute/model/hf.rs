//! Hugging Face model directories: `config.json`, one or many `*.safetensors` files
//! (memory-mapped), `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` and
//! `generation_config.json`.
//!
//! Only the Llama architecture (`LlamaForCausalLM`) is read. Tensors in F32, F16 or BF16 are
//! expanded to f32 as they are read from the maps; Q/K rows keep Hugging Face's layout, so
//! RoPE rotates dimension `i` with `i + head_dim/2` ([`RopeStyle::Halves`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

pub use super::error::HfError;
use super::llama::{LayerTensors, ModelTensors};
use super::spec::ModelSpec;
use crate::compute::backend::{HostWeight, RopeStyle};
use crate::compute::tokenizer::{BpeTokenizer, TokenizerError};

/// A parsed `config.json`, `generation_config.json` and the maps of every safetensors file.
pub struct HfModel {
    /// Shapes from `config.json`.
    pub spec: ModelSpec,
    /// Whether the output head is the embedding table.
    pub tied_embeddings: bool,
    /// `generation_config.json`'s `eos_token_id` (one id or a list), if given.
    pub eos_token_ids: Vec<u32>,
    maps: Vec<(PathBuf, Mmap)>,
}

fn read(path: &Path) -> Result<String, HfError> {
    std::fs::read_to_string(path).map_err(|source| HfError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_json(file: &'static str, text: &str) -> Result<Value, HfError> {
    serde_json::from_str(text).map_err(|e| HfError::Config {
        file,
        reason: e.to_string(),
    })
}

/// Token ids given as one integer or a list of them.
fn id_list(v: &Value) -> Option<Vec<u32>> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(|n| vec![n]),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => None,
    }
}

impl HfModel {
    /// Reads the directory's configuration and maps its safetensors files (their data is not
    /// read).
    pub fn open(dir: &Path) -> Result<Self, HfError> {
        let config = parse_json("config.json", &read(&dir.join("config.json"))?)?;
        let (spec, tied_embeddings) = llama_spec(&config, dir)?;
        let generation = dir.join("generation_config.json");
        let eos_token_ids = if generation.is_file() {
            let g = parse_json("generation_config.json", &read(&generation)?)?;
            match g.get("eos_token_id") {
                None | Some(Value::Null) => Vec::new(),
                Some(v) => id_list(v).ok_or_else(|| HfError::Config {
                    file: "generation_config.json",
                    reason: format!("eos_token_id must be an id or a list of ids, not {v}"),
                })?,
            }
        } else {
            Vec::new()
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| HfError::Io {
                path: dir.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(HfError::Missing("*.safetensors".into()));
        }
        let maps = files
            .into_iter()
            .map(|path| {
                let file = std::fs::File::open(&path).map_err(|source| HfError::Io {
                    path: path.clone(),
                    source,
                })?;
                // SAFETY: read-only private map; like every mmap loader we rely on nobody
                // rewriting the file while it is open (see GgufFile::open).
                let map = unsafe { Mmap::map(&file) }.map_err(|source| HfError::Io {
                    path: path.clone(),
                    source,
                })?;
                Ok((path, map))
            })
            .collect::<Result<Vec<_>, HfError>>()?;
        Ok(Self {
            spec,
            tied_embeddings,
            eos_token_ids,
            maps,
        })
    }

    /// Every tensor the model needs, checked against the spec and expanded to f32.
    pub fn tensors(&self) -> Result<ModelTensors<'static>, HfError> {
        let mut parsed = Vec::with_capacity(self.maps.len());
        for (path, map) in &self.maps {
            let st = SafeTensors::deserialize(map).map_err(|e| HfError::Safetensors {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            parsed.push(st);
        }
        let mut owner: HashMap<String, usize> = HashMap::new();
        for (i, st) in parsed.iter().enumerate() {
            for name in st.names() {
                if owner.insert(name.to_string(), i).is_some() {
                    return Err(HfError::Duplicate(name.to_string()));
                }
            }
        }
        let s = &self.spec;
        let h = s.hidden_size;
        let values = |name: &str, shape: &[usize]| -> Result<Vec<f32>, HfError> {
            let &i = owner
                .get(name)
                .ok_or_else(|| HfError::Missing(name.to_string()))?;
            let t = parsed[i].tensor(name).map_err(|e| HfError::Tensor {
                tensor: name.to_string(),
                reason: e.to_string(),
            })?;
            if t.shape() != shape {
                return Err(HfError::Tensor {
                    tensor: name.to_string(),
                    reason: format!("shape {:?}; config.json needs {shape:?}", t.shape()),
                });
            }
            let data = t.data();
            Ok(match t.dtype() {
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                Dtype::F16 => data
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                other => {
                    return Err(HfError::Tensor {
                        tensor: name.to_string(),
                        reason: format!("type {other:?}; F32, F16 and BF16 are read"),
                    });
                }
            })
        };
        let matrix =
            |name: &str, rows: usize, cols: usize| -> Result<HostWeight<'static>, HfError> {
                Ok(HostWeight::F32 {
                    data: Cow::Owned(values(name, &[rows, cols])?),
                    rows,
                    cols,
                })
            };
        let vector = |name: &str| values(name, &[h]).map(Cow::Owned);
        let layers = (0..s.num_layers)
            .map(|i| {
                let n = |t: &str| format!("model.layers.{i}.{t}.weight");
                Ok(LayerTensors {
                    attn_norm: vector(&n("input_layernorm"))?,
                    wq: matrix(&n("self_attn.q_proj"), s.q_size(), h)?,
                    wk: matrix(&n("self_attn.k_proj"), s.kv_size(), h)?,
                    wv: matrix(&n("self_attn.v_proj"), s.kv_size(), h)?,
                    wo: matrix(&n("self_attn.o_proj"), h, s.q_size())?,
                    ffn_norm: vector(&n("post_attention_layernorm"))?,
                    w_gate: matrix(&n("mlp.gate_proj"), s.intermediate_size, h)?,
                    w_up: matrix(&n("mlp.up_proj"), s.intermediate_size, h)?,
                    w_down: matrix(&n("mlp.down_proj"), h, s.intermediate_size)?,
                })
            })
            .collect::<Result<Vec<_>, HfError>>()?;
        let lm_head = if self.tied_embeddings {
            None
        } else {
            Some(matrix("lm_head.weight", s.vocab_size, h)?)
        };
        Ok(ModelTensors {
            embed: matrix("model.embed_tokens.weight", s.vocab_size, h)?,
            layers,
            final_norm: vector("model.norm.weight")?,
            lm_head,
        })
    }

    /// The tokenizer from `tokenizer.json` and `tokenizer_config.json`, its chat template from
    /// `chat_template.jinja` when the directory has one (else `tokenizer_config.json`'s
    /// `chat_template`), with `generation_config.json`'s EOS ids added to the ones the
    /// tokenizer names.
    pub fn tokenizer(&self, dir: &Path) -> Result<BpeTokenizer, super::error::ModelError> {
        let err = |source| super::error::ModelError::Tokenizer {
            path: dir.to_path_buf(),
            source,
        };
        let json = read(&dir.join("tokenizer.json")).map_err(|e| super::error::ModelError::Hf {
            path: dir.to_path_buf(),
            source: e,
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            Some(
                read(&config_path).map_err(|e| super::error::ModelError::Hf {
                    path: dir.to_path_buf(),
                    source: e,
                })?,
            )
        } else {
            None
        };
        let template = chat_template_file(dir)?;
        let tok = BpeTokenizer::from_hf_files(
            &json,
            config.as_deref(),
            template.as_ref().map(|(_, text)| text.as_str()),
        )
        .map_err(|source| match (source, &template) {
            // Name the file the template came from, not just the directory.
            (source @ TokenizerError::ChatTemplate(_), Some((path, _))) => {
                super::error::ModelError::Tokenizer {
                    path: path.clone(),
                    source,
                }
            }
            (source, _) => err(source),
        })?;
        Ok(tok.with_extra_eos(&self.eos_token_ids))
    }
}

/// The file newer transformers versions save a model's chat template in, next to
/// `tokenizer_config.json`; it takes precedence over that file's `chat_template` field.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// The path and text of `dir/chat_template.jinja`, or `None` when there is no such file. A
/// file that exists but cannot be read (permissions, not UTF-8, a directory) or holds only
/// whitespace is an error: serving the model with another template than the one it ships
/// would quietly change every chat prompt.
fn chat_template_file(dir: &Path) -> Result<Option<(PathBuf, String)>, super::error::ModelError> {
    let path = dir.join(CHAT_TEMPLATE_FILE);
    let io = |source| super::error::ModelError::Hf {
        path: dir.to_path_buf(),
        source: HfError::Io {
            path: path.clone(),
            source,
        },
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if text.trim().is_empty() {
        return Err(super::error::ModelError::Tokenizer {
            path,
            source: TokenizerError::Invalid {
                key: CHAT_TEMPLATE_FILE.into(),
                reason: "the chat template is empty".into(),
            },
        });
    }
    Ok(Some((path, text)))
}

/// `ModelSpec` and tied-embeddings flag from a Llama `config.json`.
fn llama_spec(c: &Value, dir: &Path) -> Result<(ModelSpec, bool), HfError> {
    let arch = c["architectures"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .unwrap_or("");
    let model_type = c["model_type"].as_str().unwrap_or("");
    // Either may be missing from older configs, but what is there must say Llama.
    let llama = matches!(arch, "" | "LlamaForCausalLM")
        && matches!(model_type, "" | "llama")
        && !(arch.is_empty() && model_type.is_empty());
    if !llama {
        return Err(HfError::Unsupported(format!(
            "architecture {arch:?} (model_type {model_type:?}) is not supported; only LlamaForCausalLM is"
        )));
    }
    if !c["rope_scaling"].is_null() {
        return Err(HfError::Unsupported(
            "rope_scaling is not supported yet".into(),
        ));
    }
    let count = |key: &str| -> Result<usize, HfError> {
        c[key]
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| HfError::Config {
                file: "config.json",
                reason: format!("{key} must be a positive integer, got {}", c[key]),
            })
    };
    let hidden_size = count("hidden_size")?;
    let num_heads = count("num_attention_heads")?;
    let num_kv_heads = match c.get("num_key_value_heads") {
        None | Some(Value::Null) => num_heads,
        Some(_) => count("num_key_value_heads")?,
    };
    let head_dim = match c.get("head_dim") {
        None | Some(Value::Null) => hidden_size / num_heads,
        Some(_) => count("head_dim")?,
    };
    if !num_heads.is_multiple_of(num_kv_heads) || head_dim % 2 != 0 {
        return Err(HfError::Unsupported(format!(
            "{num_heads} heads, {num_kv_heads} KV heads of {head_dim}: KV heads must divide heads and the head size must be even"
        )));
    }
    let float = |key: &str, default: f64| c[key].as_f64().unwrap_or(default);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let spec = ModelSpec {
        name,
        vocab_size: count("vocab_size")?,
        hidden_size,
        num_layers: count("num_hidden_layers")?,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_size: count("intermediate_size")?,
        max_model_len: count("max_position_embeddings")?,
        rope_theta: float("rope_theta", 10_000.0) as f32,
        rms_norm_eps: float("rms_norm_eps", 1e-6) as f32,
        rope_style: RopeStyle::Halves,
        weight_dtype: super::spec::WeightDtype::F32,
        kv_dtype: crate::compute::backend::KvDtype::F32,
    };
    Ok((spec, c["tie_word_embeddings"].as_bool().unwrap_or(false)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use safetensors::tensor::TensorView;
    use serde_json::json;

    use super::*;
    use crate::compute::backend::cpu::CpuBackend;
    use crate::compute::model::{
        HostWeights, LlamaModel, LlamaWeights, ModelSource, ResolvedModel,
    };
    use crate::compute::tokenizer::{ByteTokenizer, ChatMessage, Tokenizer};

    /// GPT-2's byte-to-character table, which byte-level BPE vocabularies are written in.
    fn byte_chars() -> Vec<char> {
        let printable =
            |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        let mut next = 256u32;
        (0..=255u8)
            .map(|b| {
                if printable(b) {
                    char::from(b)
                } else {
                    next += 1;
                    char::from_u32(next - 1).unwrap()
                }
            })
            .collect()
    }

    /// A byte-level tokenizer.json with the synthetic models' ids: bytes 0–255, `<s>` 256,
    /// `</s>` 257, no merges.
    fn tokenizer_json() -> String {
        let mut vocab: serde_json::Map<String, Value> = byte_chars()
            .into_iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), json!(i)))
            .collect();
        vocab.insert("<s>".into(), json!(256));
        vocab.insert("</s>".into(), json!(257));
        let special = |id: u32, content: &str| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        };
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [special(256, "<s>"), special(257, "</s>")],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": []}
        })
        .to_string()
    }

    enum Precision {
        F32,
        Bf16,
    }

    /// Writes the synthetic tiny model (seed 7) as a Hugging Face Llama directory, its
    /// tensors split over two safetensors files.
    fn write_dir(name: &str, precision: Precision, edit: impl FnOnce(&mut Value)) -> PathBuf {
        let spec = ModelSpec::synthetic("tiny").unwrap();
        let host = HostWeights::synthetic(&spec, 7);
        let dir = std::env::temp_dir().join(format!("ballast-hf-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
            "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
            "num_hidden_layers": spec.num_layers, "vocab_size": spec.vocab_size,
            "max_position_embeddings": spec.max_model_len, "rope_theta": spec.rope_theta,
            "rms_norm_eps": spec.rms_norm_eps, "rope_scaling": null, "tie_word_embeddings": false,
            "torch_dtype": "float32"
        });
        edit(&mut config);
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            json!({"bos_token": "<s>", "eos_token": "</s>"}).to_string(),
        )
        .unwrap();
        std::fs::write(
            dir.join("generation_config.json"),
            json!({"eos_token_id": [257, 10]}).to_string(),
        )
        .unwrap();
        let mut tensors: Vec<(String, Vec<usize>, &[f32])> = vec![
            (
                "model.embed_tokens.weight".into(),
                vec![spec.vocab_size, spec.hidden_size],
                &host.embed,
            ),
            (
                "model.norm.weight".into(),
                vec![spec.hidden_size],
                &host.final_norm,
            ),
            (
                "lm_head.weight".into(),
                vec![spec.vocab_size, spec.hidden_size],
                &host.lm_head,
            ),
        ];
        let (h, q, kv, f) = (
            spec.hidden_size,
            spec.q_size(),
            spec.kv_size(),
            spec.intermediate_size,
        );
        for (i, l) in host.layers.iter().enumerate() {
            let n = |t: &str| format!("model.layers.{i}.{t}.weight");
            tensors.extend([
                (n("input_layernorm"), vec![h], &l.attn_norm[..]),
                (n("self_attn.q_proj"), vec![q, h], &l.wq[..]),
                (n("self_attn.k_proj"), vec![kv, h], &l.wk[..]),
                (n("self_attn.v_proj"), vec![kv, h], &l.wv[..]),
                (n("self_attn.o_proj"), vec![h, q], &l.wo[..]),
                (n("post_attention_layernorm"), vec![h], &l.ffn_norm[..]),
                (n("mlp.gate_proj"), vec![f, h], &l.w_gate[..]),
                (n("mlp.up_proj"), vec![f, h], &l.w_up[..]),
                (n("mlp.down_proj"), vec![h, f], &l.w_down[..]),
            ]);
        }
        let encoded: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = tensors
            .into_iter()
            .map(|(name, shape, data)| {
                let (dtype, bytes) = match precision {
                    Precision::F32 => (
                        Dtype::F32,
                        data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    ),
                    Precision::Bf16 => (
                        Dtype::BF16,
                        data.iter()
                            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                            .collect(),
                    ),
                };
                (name, shape, dtype, bytes)
            })
            .collect();
        let (first, second): (Vec<_>, Vec<_>) = encoded
            .iter()
            .partition(|(name, ..)| !name.starts_with("model.layers.1."));
        for (file, part) in [
            ("model-00001-of-00002", first),
            ("model-00002-of-00002", second),
        ] {
            let views = part.iter().map(|(name, shape, dtype, bytes)| {
                (
                    name.clone(),
                    TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
                )
            });
            let bytes = safetensors::serialize(views, None).unwrap();
            std::fs::write(dir.join(format!("{file}.safetensors")), bytes).unwrap();
        }
        dir
    }

    fn logits(model: &LlamaModel<CpuBackend>, tokens: &[u32]) -> Vec<f32> {
        crate::compute::model::sequence::prefill_logits(model, tokens).data
    }

    fn load(dir: &Path) -> (LlamaModel<CpuBackend>, Arc<dyn Tokenizer>) {
        let resolved = ResolvedModel::resolve(dir.to_str().unwrap()).unwrap();
        let ModelSource::Safetensors {
            tensors, tokenizer, ..
        } = resolved.source
        else {
            panic!("a directory with config.json is a Hugging Face source");
        };
        let weights = LlamaWeights::upload(&CpuBackend, &resolved.spec, (*tensors).clone());
        (
            LlamaModel::new(resolved.spec, CpuBackend, Arc::new(weights)),
            tokenizer,
        )
    }

    #[test]
    fn a_safetensors_directory_reproduces_the_synthetic_logits() {
        let dir = write_dir("f32", Precision::F32, |_| {});
        let (model, tokenizer) = load(&dir);
        // The directory's tokenizer gives the byte tokenizer's ids for text.
        let text = "Hello, wörld";
        let ids = tokenizer.encode(text, false);
        assert_eq!(ids, ByteTokenizer.encode(text, false));
        // EOS from tokenizer_config.json, then generation_config.json's extra id.
        assert_eq!(tokenizer.eos_token_ids(), [257, 10]);
        let spec = ModelSpec::synthetic("tiny").unwrap();
        let reference = logits(&LlamaModel::synthetic(spec, CpuBackend, 7), &ids);
        let got = logits(&model, &ids);
        for (a, b) in reference.iter().zip(&got) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn bf16_weights_stay_close() {
        let dir = write_dir("bf16", Precision::Bf16, |_| {});
        let (model, tokenizer) = load(&dir);
        let ids = tokenizer.encode("The quick brown fox", false);
        let spec = ModelSpec::synthetic("tiny").unwrap();
        let reference = logits(&LlamaModel::synthetic(spec, CpuBackend, 7), &ids);
        let got = logits(&model, &ids);
        let spread = reference.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let err = reference
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            err < 0.05 * spread,
            "bf16 error {err} against logits up to {spread}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A template whose output shows which one rendered it.
    fn tagged_template(tag: &str) -> String {
        format!(
            "{tag}:{{% for m in messages %}}[{{{{ m.role }}}}]{{{{ m.content }}}}{{% endfor %}}\
             {{% if add_generation_prompt %}}[assistant]{{% endif %}}"
        )
    }

    fn render_hi(tokenizer: &dyn Tokenizer) -> String {
        let hi = ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        };
        tokenizer.try_apply_chat_template(&[hi]).unwrap()
    }

    fn write_tokenizer_config(dir: &Path, chat_template: Value) {
        std::fs::write(
            dir.join("tokenizer_config.json"),
            json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": chat_template})
                .to_string(),
        )
        .unwrap();
    }

    #[test]
    fn chat_template_jinja_is_used_and_wins_over_tokenizer_config() {
        let dir = write_dir("jinja", Precision::F32, |_| {});
        // No template anywhere: ChatML.
        assert!(render_hi(&*load(&dir).1).starts_with("<|im_start|>user\nhi<|im_end|>"));

        // The file alone.
        std::fs::write(dir.join(CHAT_TEMPLATE_FILE), tagged_template("file")).unwrap();
        assert_eq!(render_hi(&*load(&dir).1), "file:[user]hi[assistant]");

        // The file and a config string: the file wins.
        write_tokenizer_config(&dir, json!(tagged_template("config")));
        assert_eq!(render_hi(&*load(&dir).1), "file:[user]hi[assistant]");

        // The file and a config field that would not even parse: the field is not read.
        write_tokenizer_config(&dir, json!(42));
        assert_eq!(render_hi(&*load(&dir).1), "file:[user]hi[assistant]");

        // Without the file, the config's string, then its list's "default" entry.
        std::fs::remove_file(dir.join(CHAT_TEMPLATE_FILE)).unwrap();
        write_tokenizer_config(&dir, json!(tagged_template("config")));
        assert_eq!(render_hi(&*load(&dir).1), "config:[user]hi[assistant]");
        write_tokenizer_config(
            &dir,
            json!([
                {"name": "tool_use", "template": tagged_template("tools")},
                {"name": "default", "template": tagged_template("default")}
            ]),
        );
        assert_eq!(render_hi(&*load(&dir).1), "default:[user]hi[assistant]");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_bad_chat_template_jinja_is_an_error_naming_it() {
        let file = |dir: &Path| dir.join(CHAT_TEMPLATE_FILE);
        type Write = fn(&Path);
        let cases: [(&str, Write, &str); 4] = [
            (
                "syntax",
                |p| std::fs::write(p, "{% for m in messages %}unclosed").unwrap(),
                "does not compile",
            ),
            (
                "utf8",
                |p| std::fs::write(p, b"{{ bos_token }}\xff\xfe").unwrap(),
                "cannot read",
            ),
            (
                "empty",
                |p| std::fs::write(p, " \n").unwrap(),
                "the chat template is empty",
            ),
            (
                "directory",
                |p| std::fs::create_dir(p).unwrap(),
                "cannot read",
            ),
        ];
        for (name, write, want) in cases {
            let dir = write_dir(&format!("bad-jinja-{name}"), Precision::F32, |_| {});
            // A good template in the config must not paper over a bad file.
            write_tokenizer_config(&dir, json!(tagged_template("config")));
            write(&file(&dir));
            let err = ResolvedModel::resolve(dir.to_str().unwrap())
                .err()
                .unwrap_or_else(|| panic!("{name}: a bad {CHAT_TEMPLATE_FILE} was accepted"));
            let msg = err.to_string();
            assert!(msg.contains(file(&dir).to_str().unwrap()), "{name}: {msg}");
            assert!(msg.contains(want), "{name}: {msg}");
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn bad_directories_say_what_is_wrong() {
        type Edit = Box<dyn FnOnce(&mut Value)>;
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "arch",
                Box::new(|c: &mut Value| c["architectures"] = json!(["MistralForCausalLM"]))
                    as Edit,
                "only LlamaForCausalLM",
            ),
            (
                "scaling",
                Box::new(|c: &mut Value| {
                    c["rope_scaling"] = json!({"type": "linear", "factor": 2.0})
                }),
                "rope_scaling",
            ),
            (
                "ffn",
                Box::new(|c: &mut Value| c["intermediate_size"] = json!(200)),
                "model.layers.0.mlp.gate_proj.weight",
            ),
            (
                "heads",
                Box::new(|c: &mut Value| c["num_key_value_heads"] = json!(3)),
                "KV heads must divide",
            ),
            (
                "tied",
                Box::new(|c: &mut Value| c["tie_word_embeddings"] = json!(true)),
                "",
            ),
        ];
        for (name, edit, want) in cases {
            let dir = write_dir(name, Precision::F32, edit);
            let result = ResolvedModel::resolve(dir.to_str().unwrap());
            match (want, result) {
                // Tied embeddings simply ignore lm_head.weight.
                ("", Ok(r)) => assert!(
                    matches!(&r.source, ModelSource::Safetensors { tensors, .. } if tensors.lm_head.is_none())
                ),
                ("", Err(e)) => panic!("{name}: {e}"),
                (want, Ok(_)) => panic!("{name}: accepted, expected an error with {want:?}"),
                (want, Err(e)) => assert!(e.to_string().contains(want), "{name}: {e}"),
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
