use proptest::prelude::*;

use super::test_writer::{GgufWriter, put_str, tiny_llama};
use super::*;
use crate::compute::model::{KNOWN_MODELS, ModelSpec, cached_model_or_skip};

fn parse(bytes: &[u8]) -> Result<GgufFile<&[u8]>, GgufError> {
    GgufFile::from_bytes(bytes)
}

fn err_label(bytes: &[u8]) -> &'static str {
    match parse(bytes) {
        Ok(_) => "ok",
        Err(e) => e.label(),
    }
}

fn f16_bits(bits: u16) -> [u8; 2] {
    bits.to_le_bytes()
}

fn file_with_tensor(dtype: GgmlType, dims: &[u64], data: Vec<u8>) -> Vec<u8> {
    GgufWriter::default()
        .tensor("t", dims, dtype, data)
        .to_bytes()
}

// ---- metadata ----

#[test]
fn every_value_type_round_trips() {
    let values = vec![
        ("u8", MetaValue::U8(200)),
        ("i8", MetaValue::I8(-100)),
        ("u16", MetaValue::U16(60_000)),
        ("i16", MetaValue::I16(-30_000)),
        ("u32", MetaValue::U32(4_000_000_000)),
        ("i32", MetaValue::I32(-2_000_000_000)),
        ("f32", MetaValue::F32(1.5)),
        ("bool.t", MetaValue::Bool(true)),
        ("bool.f", MetaValue::Bool(false)),
        ("string", MetaValue::String("héllo ✓".into())),
        ("empty_string", MetaValue::String(String::new())),
        ("u64", MetaValue::U64(u64::MAX)),
        ("i64", MetaValue::I64(i64::MIN)),
        ("f64", MetaValue::F64(-0.125)),
        ("a.u8", MetaValue::Array(MetaArray::U8(vec![1, 2, 255]))),
        ("a.i8", MetaValue::Array(MetaArray::I8(vec![-1, 127]))),
        ("a.u16", MetaValue::Array(MetaArray::U16(vec![1, 65535]))),
        ("a.i16", MetaValue::Array(MetaArray::I16(vec![-2, 3]))),
        ("a.u32", MetaValue::Array(MetaArray::U32(vec![7]))),
        ("a.i32", MetaValue::Array(MetaArray::I32(vec![-7, 3, 3]))),
        ("a.f32", MetaValue::Array(MetaArray::F32(vec![0.5, -1.0]))),
        (
            "a.bool",
            MetaValue::Array(MetaArray::Bool(vec![true, false])),
        ),
        (
            "a.string",
            MetaValue::Array(MetaArray::String(vec!["x".into(), "".into(), "yz".into()])),
        ),
        ("a.u64", MetaValue::Array(MetaArray::U64(vec![u64::MAX, 0]))),
        ("a.i64", MetaValue::Array(MetaArray::I64(vec![-1]))),
        ("a.f64", MetaValue::Array(MetaArray::F64(vec![2.25]))),
        ("a.empty", MetaValue::Array(MetaArray::U32(vec![]))),
        (
            "a.nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::I32(vec![1, 2]),
                MetaArray::String(vec!["deep".into()]),
                MetaArray::Array(vec![MetaArray::F32(vec![]), MetaArray::U8(vec![9])]),
            ])),
        ),
    ];
    let mut w = GgufWriter::default();
    for (k, v) in &values {
        w = w.kv(k, v.clone());
    }
    let bytes = w.to_bytes();
    let file = parse(&bytes).unwrap();
    assert_eq!(file.metadata().len(), values.len());
    for ((k, v), (got_k, got_v)) in values.iter().zip(file.metadata().iter()) {
        assert_eq!(*k, got_k, "file order kept");
        assert_eq!(v, got_v, "{k}");
        assert_eq!(file.metadata().get(k), Some(v));
    }
    let tags: std::collections::HashSet<_> =
        values.iter().map(|(_, v)| v.value_type().id()).collect();
    assert_eq!(tags.len(), 13, "all thirteen value types covered");
    assert!(file.tensors().is_empty());
}

#[test]
fn typed_getters_accept_any_integer_width_and_report_wrong_types() {
    let bytes = GgufWriter::default()
        .kv("a", MetaValue::I32(5))
        .kv("b", MetaValue::U64(6))
        .kv("neg", MetaValue::I64(-1))
        .kv("s", MetaValue::String("x".into()))
        .to_bytes();
    let file = parse(&bytes).unwrap();
    let md = file.metadata();
    assert_eq!(md.u64("a").unwrap(), Some(5));
    assert_eq!(md.u64("b").unwrap(), Some(6));
    assert_eq!(md.u64("missing").unwrap(), None);
    assert_eq!(md.u64("neg").unwrap_err().label(), "wrong_type");
    let err = md.u64("s").unwrap_err();
    assert_eq!(
        err.to_string(),
        "metadata \"s\" is string, expected a non-negative integer"
    );
    assert_eq!(md.str("s").unwrap(), Some("x"));
}

#[test]
fn display_summarises_long_values() {
    let tokens = MetaValue::Array(MetaArray::String(
        (0..1000).map(|i| format!("t{i}")).collect(),
    ));
    assert_eq!(
        tokens.to_string(),
        "[string; 1000] \"t0\", \"t1\", \"t2\", \"t3\", …"
    );
    let long = MetaValue::String("x".repeat(100));
    assert!(long.to_string().ends_with("… (100 bytes)"));
}

// ---- tensors and alignment ----

#[test]
fn tensors_land_on_the_default_alignment() {
    let bytes = GgufWriter::default()
        .kv("k", MetaValue::U8(1)) // an odd-sized header, so padding is needed
        .tensor("a", &[3], GgmlType::F32, vec![1; 12])
        .tensor("b", &[2, 2], GgmlType::F16, vec![2; 8])
        .to_bytes();
    let file = parse(&bytes).unwrap();
    let h = file.header();
    assert_eq!(h.alignment, 32);
    assert_eq!(h.data_offset % 32, 0);
    assert_eq!(h.tensors[1].offset, 32, "12 bytes of `a` padded to 32");
    assert_eq!(file.tensor("a").unwrap().bytes, &[1; 12]);
    assert_eq!(file.tensor("b").unwrap().bytes, &[2; 8]);
    assert_eq!(file.tensor("b").unwrap().info.rows(), 2);
    assert_eq!(file.tensor("nope").unwrap_err().label(), "tensor_not_found");
}

#[test]
fn custom_alignment_is_honoured() {
    for alignment in [1u64, 8, 64, 4096] {
        let mut w = GgufWriter::default()
            .tensor("a", &[1], GgmlType::F32, 7f32.to_le_bytes().to_vec())
            .tensor("b", &[1], GgmlType::F32, 9f32.to_le_bytes().to_vec());
        w.alignment = alignment;
        let bytes = w.to_bytes();
        let file = parse(&bytes).unwrap();
        assert_eq!(file.header().alignment, alignment);
        assert_eq!(file.header().data_offset % alignment, 0);
        assert_eq!(file.tensors()[1].offset, 4u64.next_multiple_of(alignment));
        assert_eq!(file.tensor("b").unwrap().dequantize().unwrap(), vec![9.0]);
    }
}

#[test]
fn alignment_must_be_a_power_of_two_integer() {
    for bad in [MetaValue::U32(0), MetaValue::U32(24), MetaValue::F32(32.0)] {
        let bytes = GgufWriter::default()
            .kv("general.alignment", bad.clone())
            .to_bytes();
        assert_eq!(err_label(&bytes), "bad_alignment", "{bad:?}");
    }
}

#[test]
fn misaligned_tensor_offset_is_refused() {
    let mut bytes = GgufWriter::default()
        .tensor("a", &[8], GgmlType::F32, vec![0; 32])
        .tensor("b", &[8], GgmlType::F32, vec![0; 32])
        .to_bytes();
    // `b`'s offset (32) is the last field of the tensor infos.
    let at = info_end_of(&bytes);
    assert_eq!(bytes[at - 8..at], 32u64.to_le_bytes());
    bytes[at - 8..at].copy_from_slice(&33u64.to_le_bytes());
    let err = parse(&bytes).unwrap_err();
    assert_eq!(err.label(), "misaligned_tensor", "{err}");
}

/// End of the tensor-info records of a writer file with one-dimensional tensors named by one
/// character and no metadata.
fn info_end_of(bytes: &[u8]) -> usize {
    let n = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    24 + n * (8 + 1 + 4 + 8 + 4 + 8)
}

// ---- dequantization against hand-computed values ----

fn dq(dtype: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let file = file_with_tensor(dtype, &[n as u64], bytes.to_vec());
    let parsed = parse(&file).unwrap();
    let view = parsed.tensor("t").unwrap();
    let whole = view.dequantize().unwrap();
    let mut row = vec![0.0; n];
    view.dequantize_row(0, &mut row).unwrap();
    assert_eq!(whole, row);
    whole
}

#[test]
fn dequantizes_f32() {
    let bytes: Vec<u8> = [1.5f32, -2.0, 0.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(dq(GgmlType::F32, &bytes, 3), vec![1.5, -2.0, 0.0]);
}

#[test]
fn dequantizes_f16() {
    let bytes = [0x3c00u16, 0xc000, 0x3555, 0x7bff, 0x0001]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect::<Vec<_>>();
    // 0x3555 is 1 + 341/1024 times 2^-2; 0x0001 the smallest subnormal, 2^-24.
    assert_eq!(
        dq(GgmlType::F16, &bytes, 5),
        vec![1.0, -2.0, 0.333_251_95, 65504.0, 5.960_464_5e-8]
    );
}

#[test]
fn dequantizes_bf16() {
    // bf16 is the top half of an f32: 0x3f80 → 1.0, 0xc040 → -3.0, 0x3e20 → 0.15625.
    let bytes = [0x3f80u16, 0xc040, 0x3e20]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect::<Vec<_>>();
    assert_eq!(dq(GgmlType::BF16, &bytes, 3), vec![1.0, -3.0, 0.15625]);
}

#[test]
fn dequantizes_q8_0() {
    // d = 0.5; q = [-128, -1, 0, 1, 127, 2, 2, …].
    let mut block = f16_bits(0x3800).to_vec();
    let qs: Vec<i8> = [-128, -1, 0, 1, 127].into_iter().chain([2; 27]).collect();
    block.extend(qs.iter().map(|&q| q as u8));
    let out = dq(GgmlType::Q8_0, &block, 32);
    assert_eq!(&out[..6], &[-64.0, -0.5, 0.0, 0.5, 63.5, 1.0]);
    assert!(out[5..].iter().all(|&v| v == 1.0));
}

#[test]
fn dequantizes_q4_0() {
    // d = 2; byte 0 = 0x1f: element 0 is (15 − 8)·2 = 14, element 16 is (1 − 8)·2 = −14.
    // byte 1 = 0x80: element 1 is (0 − 8)·2 = −16, element 17 is (8 − 8)·2 = 0.
    // Remaining bytes 0x88 decode to 0.
    let mut block = f16_bits(0x4000).to_vec();
    block.extend([0x1f, 0x80]);
    block.extend([0x88; 14]);
    let out = dq(GgmlType::Q4_0, &block, 32);
    let mut want = vec![0.0; 32];
    want[0] = 14.0;
    want[16] = -14.0;
    want[1] = -16.0;
    want[17] = 0.0;
    assert_eq!(out, want);
}

#[test]
fn dequantizes_q4_1() {
    // d = 0.5, m = −1; byte 0 = 0x3a: element 0 is 10·0.5 − 1 = 4, element 16 is 3·0.5 − 1 = 0.5.
    // Remaining bytes 0x00 decode to m = −1.
    let mut block = f16_bits(0x3800).to_vec();
    block.extend(f16_bits(0xbc00));
    block.push(0x3a);
    block.extend([0x00; 15]);
    let out = dq(GgmlType::Q4_1, &block, 32);
    let mut want = vec![-1.0; 32];
    want[0] = 4.0;
    want[16] = 0.5;
    assert_eq!(out, want);
}

#[test]
fn dequantizes_rows_of_a_multi_block_matrix() {
    // Two rows of 64 Q8_0 elements: row r, block b has d = 1 and every q = 10·r + b.
    let mut data = Vec::new();
    for r in 0..2u8 {
        for b in 0..2u8 {
            data.extend(f16_bits(0x3c00));
            data.extend([10 * r + b; 32]);
        }
    }
    let bytes = file_with_tensor(GgmlType::Q8_0, &[64, 2], data);
    let file = parse(&bytes).unwrap();
    let view = file.tensor("t").unwrap();
    assert_eq!(view.info.n_bytes, 4 * 34);
    let mut row = vec![0.0; 64];
    view.dequantize_row(1, &mut row).unwrap();
    assert_eq!(&row[..32], &[10.0; 32]);
    assert_eq!(&row[32..], &[11.0; 32]);
    assert_eq!(view.dequantize().unwrap()[32..64], [1.0; 32]);
    assert_eq!(
        view.dequantize_row(2, &mut row).unwrap_err().label(),
        "row_out_of_range"
    );
}

#[test]
fn dequantize_checks_lengths_and_support() {
    let mut out = [0.0; 3];
    let err = dequantize(GgmlType::F32, &[0; 8], &mut out).unwrap_err();
    assert_eq!(err.label(), "dequant_length");
    let err = dequantize(GgmlType::Q4_0, &[0; 17], &mut [0.0; 32]).unwrap_err();
    assert_eq!(err.label(), "dequant_length");
    let err = dequantize(GgmlType::Q8_K, &[0; 292], &mut [0.0; 256]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "dequantizing Q8_K is not supported yet; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, \
         Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K"
    );
    // A file may hold a type that cannot be dequantized yet; it parses, and says so on use.
    let bytes = file_with_tensor(GgmlType::Q8_K, &[256], vec![0; 292]);
    let file = parse(&bytes).unwrap();
    assert_eq!(
        file.tensor("t").unwrap().dequantize().unwrap_err().label(),
        "dequant_unsupported"
    );
}

#[test]
fn ggml_type_ids_round_trip() {
    for id in 0..64 {
        if let Some(t) = GgmlType::from_id(id) {
            assert_eq!(t.id(), id);
            assert!(t.block_bytes() > 0 && t.block_elems() > 0);
        }
    }
    assert_eq!(GgmlType::from_id(4), None, "retired Q4_2");
    assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
    assert_eq!(GgmlType::Q4_1.bytes_for(33), None);
}

// ---- malformed files ----

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let bytes = tiny_llama().to_bytes();
    assert!(parse(&bytes).is_ok());
    for len in 0..bytes.len() {
        let label = err_label(&bytes[..len]);
        assert!(
            // A count read before the cut may no longer fit in what is left.
            matches!(
                label,
                "truncated" | "count_too_large" | "tensor_out_of_bounds"
            ),
            "prefix of {len} bytes: {label}"
        );
    }
    assert_eq!(err_label(&bytes[..10]), "truncated", "inside the header");
}

#[test]
fn bad_magic_and_versions_are_refused() {
    let good = GgufWriter::default().to_bytes();
    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"GGML");
    let err = parse(&bad).unwrap_err();
    assert_eq!(err.label(), "bad_magic");
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
    for version in [1u32, 2, 4, u32::MAX] {
        let w = GgufWriter {
            version,
            ..GgufWriter::default()
        };
        let err = parse(&w.to_bytes()).unwrap_err();
        assert_eq!(err.label(), "unsupported_version", "{version}");
        assert!(err.to_string().contains(&format!("version {version}")));
    }
    let mut be = good.clone();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert_eq!(err_label(&be), "big_endian");
}

#[test]
fn tensor_past_the_end_is_refused() {
    let mut bytes = file_with_tensor(GgmlType::F32, &[8], vec![0; 32]);
    bytes.truncate(bytes.len() - 1);
    let err = parse(&bytes).unwrap_err();
    assert_eq!(err.label(), "tensor_out_of_bounds");
    assert!(err.to_string().contains("\"t\""), "{err}");

    // An offset near u64::MAX (aligned) must not wrap around.
    let mut bytes = file_with_tensor(GgmlType::F32, &[8], vec![0; 32]);
    let at = info_end_of(&bytes);
    bytes[at - 8..at].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert_eq!(err_label(&bytes), "tensor_out_of_bounds");
}

#[test]
fn absurd_lengths_are_refused_before_allocating() {
    // A metadata key whose length claims the whole address space.
    let mut bytes = GgufWriter::default().to_bytes();
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(b"key and enough bytes for one pair");
    let err = parse(&bytes).unwrap_err();
    assert_eq!(err.label(), "truncated");
    assert!(err.to_string().contains("metadata key"), "{err}");

    // A string value one byte longer than what is left.
    let mut bytes = GgufWriter::default().to_bytes();
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
    put_str(&mut bytes, "k");
    bytes.extend_from_slice(&ValueType::String.id().to_le_bytes());
    bytes.extend_from_slice(&4u64.to_le_bytes());
    bytes.extend_from_slice(b"abc");
    assert_eq!(err_label(&bytes), "truncated");

    // An array of 2^60 u32s.
    let mut bytes = GgufWriter::default().to_bytes();
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
    put_str(&mut bytes, "k");
    bytes.extend_from_slice(&ValueType::Array.id().to_le_bytes());
    bytes.extend_from_slice(&ValueType::U32.id().to_le_bytes());
    bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert_eq!(err_label(&bytes), "count_too_large");

    // Counts of metadata pairs and tensors that the file cannot hold.
    let mut bytes = GgufWriter::default().to_bytes();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(err_label(&bytes), "count_too_large");
    let mut bytes = GgufWriter::default().to_bytes();
    bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert_eq!(err_label(&bytes), "count_too_large");
}

#[test]
fn malformed_records_are_refused() {
    let kv = |value_type: u32, payload: &[u8]| {
        let mut bytes = GgufWriter::default().to_bytes();
        bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
        put_str(&mut bytes, "k");
        bytes.extend_from_slice(&value_type.to_le_bytes());
        bytes.extend_from_slice(payload);
        bytes
    };
    assert_eq!(err_label(&kv(13, &[0; 8])), "unknown_value_type");
    assert_eq!(err_label(&kv(7, &[2])), "invalid_bool");
    assert_eq!(
        err_label(&kv(8, &[2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe])),
        "invalid_utf8"
    );
    // Arrays of arrays nested past the limit, each one element long.
    let mut nested = Vec::new();
    for _ in 0..20 {
        nested.extend_from_slice(&ValueType::Array.id().to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&ValueType::U8.id().to_le_bytes());
    nested.extend_from_slice(&0u64.to_le_bytes());
    assert_eq!(err_label(&kv(9, &nested)), "array_too_deep");

    let dup = GgufWriter::default()
        .kv("k", MetaValue::U8(1))
        .kv("k", MetaValue::U8(2))
        .to_bytes();
    assert_eq!(err_label(&dup), "duplicate_key");
    let dup = GgufWriter::default()
        .tensor("t", &[1], GgmlType::F32, vec![0; 4])
        .tensor("t", &[1], GgmlType::F32, vec![0; 4])
        .to_bytes();
    assert_eq!(err_label(&dup), "duplicate_tensor");

    let five_dims = file_with_tensor(GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4]);
    assert_eq!(err_label(&five_dims), "bad_dim_count");
    let no_dims = file_with_tensor(GgmlType::F32, &[], vec![]);
    assert_eq!(err_label(&no_dims), "bad_dim_count");
    let partial_block = file_with_tensor(GgmlType::Q4_0, &[16, 2], vec![0; 18]);
    assert_eq!(err_label(&partial_block), "bad_shape");
    let overflow = file_with_tensor(GgmlType::F32, &[1 << 32, 1 << 32], vec![]);
    assert_eq!(err_label(&overflow), "bad_shape");
    let rows_overflow = file_with_tensor(GgmlType::F32, &[0, 1 << 40, 1 << 40], vec![]);
    assert_eq!(err_label(&rows_overflow), "bad_shape");
    let bytes_overflow = file_with_tensor(GgmlType::F64, &[1 << 62], vec![]);
    assert_eq!(err_label(&bytes_overflow), "bad_shape");

    let mut unknown_type = file_with_tensor(GgmlType::F32, &[1], vec![0; 4]);
    let at = info_end_of(&unknown_type) - 12;
    unknown_type[at..at + 4].copy_from_slice(&4u32.to_le_bytes());
    let err = parse(&unknown_type).unwrap_err();
    assert_eq!(err.label(), "unknown_ggml_type");
    assert_eq!(err.to_string(), "tensor \"t\" has unknown ggml type 4");
}

#[test]
fn open_maps_a_real_file_and_reports_io_errors() {
    let dir = std::env::temp_dir().join(format!("ballast-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, tiny_llama().to_bytes()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.llama_spec().unwrap().hidden_size, 8);
    let embd = file
        .tensor("token_embd.weight")
        .unwrap()
        .dequantize()
        .unwrap();
    assert_eq!(embd, (0..48).map(|i| i as f32).collect::<Vec<_>>());
    std::fs::remove_dir_all(&dir).unwrap();

    let err = GgufFile::open(&dir.join("missing.gguf")).err().unwrap();
    assert_eq!(err.label(), "io");
    assert!(err.to_string().contains("missing.gguf"), "{err}");
}

// ---- hyperparameters and tokenizer metadata ----

#[test]
fn llama_spec_reads_every_hyperparameter() {
    let bytes = tiny_llama().to_bytes();
    let spec = parse(&bytes).unwrap().llama_spec().unwrap();
    assert_eq!(
        spec,
        ModelSpec {
            name: "Tiny Llama".into(),
            vocab_size: 6,
            hidden_size: 8,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 2,
            intermediate_size: 24,
            max_model_len: 2048,
            rope_theta: 100_000.0,
            rms_norm_eps: 1e-5,
            rope_style: crate::compute::backend::RopeStyle::Pairs,
            weight_dtype: crate::compute::model::WeightDtype::F32,
            kv_dtype: crate::compute::backend::KvDtype::F32,
        }
    );
}

fn without(key: &str) -> GgufWriter {
    let mut w = tiny_llama();
    w.metadata.retain(|(k, _)| k != key);
    w
}

fn with(key: &str, value: MetaValue) -> GgufWriter {
    let mut w = without(key);
    w.metadata.push((key.to_string(), value));
    w
}

fn spec_err(w: GgufWriter) -> GgufError {
    parse(&w.to_bytes()).unwrap().llama_spec().unwrap_err()
}

#[test]
fn llama_spec_defaults_the_optional_keys() {
    let w = without("llama.attention.head_count_kv");
    let spec = parse(&without("llama.rope.freq_base").to_bytes())
        .unwrap()
        .llama_spec()
        .unwrap();
    assert_eq!(spec.rope_theta, 10_000.0);
    let spec = parse(&w.to_bytes()).unwrap().llama_spec().unwrap();
    assert_eq!(spec.num_kv_heads, spec.num_heads);
}

#[test]
fn llama_spec_errors_name_the_key() {
    for key in [
        "general.architecture",
        "llama.context_length",
        "llama.embedding_length",
        "llama.block_count",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.layer_norm_rms_epsilon",
        "tokenizer.ggml.tokens",
    ] {
        let err = spec_err(without(key));
        assert_eq!(err.label(), "missing_key", "{key}");
        assert!(err.to_string().contains(key), "{err}");
    }
    let err = spec_err(with(
        "general.architecture",
        MetaValue::String("gpt2".into()),
    ));
    assert_eq!(
        err.to_string(),
        "model architecture \"gpt2\" is not supported; supported: llama"
    );
    let err = spec_err(with("llama.block_count", MetaValue::String("2".into())));
    assert_eq!(err.label(), "wrong_type");
    assert!(err.to_string().contains("llama.block_count"), "{err}");
    for (key, value) in [
        ("llama.attention.head_count_kv", MetaValue::U32(3)),
        ("llama.attention.head_count", MetaValue::U32(3)),
        ("llama.block_count", MetaValue::U32(0)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(-1.0),
        ),
        ("llama.rope.freq_base", MetaValue::F32(f32::NAN)),
        ("llama.rope.dimension_count", MetaValue::U32(1)),
        ("llama.attention.value_length", MetaValue::U32(4)),
        ("llama.rope.scaling.type", MetaValue::String("yarn".into())),
        ("llama.embedding_length", MetaValue::U32(16)),
        ("llama.vocab_size", MetaValue::U32(7)),
    ] {
        let err = spec_err(with(key, value));
        assert_eq!(err.label(), "invalid_hyperparameter", "{key}: {err}");
    }
    // Changing the hidden size breaks the `token_embd.weight` shape check.
    let err = spec_err(with("llama.embedding_length", MetaValue::U32(16)));
    assert!(err.to_string().contains("token_embd.weight"), "{err}");
}

#[test]
fn tokenizer_metadata_is_exposed_raw() {
    let bytes = tiny_llama().to_bytes();
    let file = parse(&bytes).unwrap();
    let tok = file.tokenizer_metadata().unwrap();
    assert_eq!(tok.model, "gpt2");
    assert_eq!(tok.pre, Some("smollm"));
    assert_eq!(tok.tokens[4], "Ġa");
    assert_eq!(tok.token_types, Some(&[3, 3, 1, 1, 1, 1][..]));
    assert_eq!(tok.merges.unwrap(), ["a b", "Ġ a"]);
    assert_eq!((tok.bos_token_id, tok.eos_token_id), (Some(0), Some(1)));
    assert_eq!(tok.scores, None);
    assert!(
        tok.chat_template
            .unwrap()
            .starts_with("{% for m in messages %}")
    );
}

#[test]
fn tokenizer_metadata_is_checked() {
    let tok_err = |w: GgufWriter| {
        parse(&w.to_bytes())
            .unwrap()
            .tokenizer_metadata()
            .unwrap_err()
    };
    assert_eq!(
        tok_err(without("tokenizer.ggml.model")).label(),
        "missing_key"
    );
    let err = tok_err(with("tokenizer.ggml.eos_token_id", MetaValue::U32(6)));
    assert_eq!(err.label(), "invalid_hyperparameter");
    let err = tok_err(with(
        "tokenizer.ggml.token_type",
        MetaValue::Array(MetaArray::I32(vec![1])),
    ));
    assert!(err.to_string().contains("1 entries for 6 tokens"), "{err}");
    let err = tok_err(with(
        "tokenizer.ggml.tokens",
        MetaValue::Array(MetaArray::U32(vec![1; 6])),
    ));
    assert_eq!(
        err.to_string(),
        "metadata \"tokenizer.ggml.tokens\" is array of u32, expected array of string"
    );
}

#[test]
fn error_labels_are_distinct() {
    // Labels feed metrics; two variants sharing one would merge their series.
    let labels = [
        "io",
        "truncated",
        "bad_magic",
        "unsupported_version",
        "big_endian",
        "count_too_large",
        "unknown_value_type",
        "invalid_utf8",
        "invalid_bool",
        "array_too_deep",
        "duplicate_key",
        "duplicate_tensor",
        "bad_alignment",
        "bad_dim_count",
        "unknown_ggml_type",
        "bad_shape",
        "misaligned_tensor",
        "tensor_out_of_bounds",
        "row_out_of_range",
        "tensor_not_found",
        "dequant_unsupported",
        "dequant_length",
        "missing_key",
        "wrong_type",
        "unsupported_architecture",
        "invalid_hyperparameter",
    ];
    let unique: std::collections::HashSet<_> = labels.iter().collect();
    assert_eq!(unique.len(), labels.len());
}

// ---- hostile input never panics ----

/// Parses `bytes` and, when that succeeds, reads everything a loader would.
fn exercise(bytes: &[u8]) {
    if let Ok(file) = parse(bytes) {
        let _ = file.llama_spec();
        let _ = file.tokenizer_metadata();
        for view in file.tensor_views() {
            let _ = view.dequantize();
        }
        for (_, v) in file.metadata().iter() {
            let _ = v.to_string();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        exercise(&bytes);
        let mut prefixed = b"GGUF\x03\0\0\0".to_vec();
        prefixed.extend_from_slice(&bytes);
        exercise(&prefixed);
    }

    #[test]
    fn corrupted_valid_files_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = tiny_llama()
            .tensor("q", &[32, 2], GgmlType::Q4_1, vec![0x11; 40])
            .to_bytes();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        exercise(&bytes);
        bytes.truncate(cut.index(bytes.len()));
        exercise(&bytes);
    }
}

// ---- the default real model, when scripts/fetch-model.sh has cached it ----

/// The cached SmolLM2-135M file, or `None` (skip); see [`cached_model_or_skip`].
fn cached_smollm2() -> Option<std::path::PathBuf> {
    cached_model_or_skip(KNOWN_MODELS[0].name)
}

#[test]
fn smollm2_metadata_and_dequantization_when_cached() {
    let Some(path) = cached_smollm2() else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let spec = file.llama_spec().unwrap();
    assert_eq!(
        (
            spec.hidden_size,
            spec.num_layers,
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim
        ),
        (576, 30, 9, 3, 64)
    );
    assert_eq!(
        (spec.intermediate_size, spec.vocab_size, spec.max_model_len),
        (1536, 49_152, 8192)
    );
    assert_eq!(spec.rope_theta, 100_000.0);

    let count = |dtype| file.tensors().iter().filter(|t| t.dtype == dtype).count();
    assert_eq!(
        (
            count(GgmlType::Q4_1),
            count(GgmlType::F32),
            count(GgmlType::Q8_0)
        ),
        (210, 61, 1)
    );
    assert!(
        file.header().tensor_info("output.weight").is_none(),
        "tied embeddings"
    );

    let tok = file.tokenizer_metadata().unwrap();
    assert_eq!((tok.model, tok.pre), ("gpt2", Some("smollm")));
    assert_eq!(tok.tokens[tok.eos_token_id.unwrap() as usize], "<|im_end|>");
    assert!(tok.chat_template.unwrap().contains("<|im_start|>"));

    // Sums of the dequantized values as llama.cpp's own reader (gguf-py 0.19.0,
    // `gguf.quants.dequantize`) computes them, one tensor of each type.
    for (name, sum, abs_sum) in [
        ("token_embd.weight", -1.535304e4, 2.802154e6),
        ("blk.0.ffn_down.weight", 1.506358e2, 1.284581e5),
        ("blk.0.attn_norm.weight", 6.129436e-1, 1.581536e1),
    ] {
        let values = file.tensor(name).unwrap().dequantize().unwrap();
        let got: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let got_abs: f64 = values.iter().map(|&v| f64::from(v.abs())).sum();
        assert!(
            ((got - sum) / sum).abs() < 1e-6,
            "{name}: sum {got} vs {sum}"
        );
        assert!(
            ((got_abs - abs_sum) / abs_sum).abs() < 1e-6,
            "{name}: abs sum {got_abs} vs {abs_sum}"
        );
    }
}
