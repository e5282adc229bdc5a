//! Each reference against the engine's CPU backend op it stands for, on random input.

use super::*;
use ballast_engine::compute::backend::cpu::{CpuBackend, CpuTensor, CpuWeight};
use ballast_engine::compute::backend::{Backend, HostWeight, KvDtype, KvLayout, RopeStyle};
use ballast_engine::compute::sampling::{SampleSpec, sample_row as engine_sample_row};
use ballast_engine::step::{SeqSlice, StepMetadata};
use ballast_rng::SplitMix64;

fn random(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
    (0..n).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
}

fn tensor(data: Vec<f32>, rows: usize, cols: usize) -> CpuTensor {
    CpuTensor { data, rows, cols }
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}[{i}]: {a} vs {b}"
        );
    }
}

fn flat_seqs(seqs: &[SeqSlice]) -> Vec<u32> {
    seqs.iter()
        .flat_map(|s| {
            [
                s.query_start,
                s.query_len,
                s.context_len,
                s.block_table_start,
                s.block_table_len,
            ]
        })
        .collect()
}

#[test]
fn elementwise_references_equal_the_engine() {
    let mut rng = SplitMix64::new(7);
    for (rows, cols) in [(1, 8), (5, 33), (17, 256)] {
        let x = random(rows * cols, &mut rng);
        let y = random(rows * cols, &mut rng);
        let w = random(cols, &mut rng);
        let (xt, yt) = (tensor(x.clone(), rows, cols), tensor(y.clone(), rows, cols));

        let mut out = vec![0.0; rows * cols];
        rms_norm_f32(&x, &w, &mut out, cols, 1e-5);
        let want = CpuBackend.rms_norm(&xt, &tensor(w.clone(), 1, cols), 1e-5);
        assert_close(&out, &want.data, 1e-5, "rms_norm");

        silu_mul_f32(&x, &y, &mut out);
        assert_close(&out, &CpuBackend.silu_mul(&xt, &yt).data, 1e-6, "silu_mul");

        let mut sum = x.clone();
        add_assign_f32(&mut sum, &y);
        let mut want = xt.clone();
        CpuBackend.add_assign(&mut want, &yt);
        assert_eq!(sum, want.data, "add_assign");

        // Embedding and gather through step metadata, as the model calls them.
        let ids: Vec<u32> = (0..rows + 3)
            .map(|_| rng.below(rows as u64) as u32)
            .collect();
        let mut meta = StepMetadata::single_sequence(&ids, 0, 4, vec![]);
        meta.logits_rows = (0..ids.len() as u32).rev().step_by(2).collect();
        let prepared = CpuBackend.prepare_step(&meta);
        let table = CpuBackend.upload_weight(HostWeight::F32 {
            data: x.clone().into(),
            rows,
            cols,
        });
        let mut emb = vec![0.0; ids.len() * cols];
        embedding_f32(&x, &ids, &mut emb, cols);
        let want = CpuBackend.embedding(&table, &prepared);
        assert_eq!(emb, want.data, "embedding");

        let mut gathered = vec![0.0; meta.logits_rows.len() * cols];
        gather_rows_f32(&emb, &meta.logits_rows, &mut gathered, cols);
        let want = CpuBackend.gather_logits_rows(&tensor(emb.clone(), ids.len(), cols), &prepared);
        assert_eq!(gathered, want.data, "gather_rows");
        assert!(matches!(table, CpuWeight::Dense(_)));
    }
}

#[test]
fn bf16_embedding_widens_exactly() {
    // 1.0, -2.0, the smallest normal, +inf; two rows of two.
    let table = [0x3f80u16, 0xc000, 0x0080, 0x7f80];
    let mut out = [0.0; 4];
    embedding_bf16(&table, &[1, 0], &mut out, 2);
    assert_eq!(out, [f32::MIN_POSITIVE, f32::INFINITY, 1.0, -2.0]);
}

#[test]
fn rope_reference_equals_the_engine_in_both_styles() {
    let mut rng = SplitMix64::new(3);
    let (num_heads, head_dim, max_pos) = (3, 8, 40);
    let half = head_dim / 2;
    let cos = random(max_pos * half, &mut rng);
    let sin = random(max_pos * half, &mut rng);
    let positions: Vec<u32> = (0..6).map(|_| rng.below(max_pos as u64) as u32).collect();
    let x = random(positions.len() * num_heads * head_dim, &mut rng);
    let meta = StepMetadata {
        token_ids: vec![0; positions.len()],
        positions: positions.clone(),
        ..StepMetadata::default()
    };
    let prepared = CpuBackend.prepare_step(&meta);
    for (style, engine_style) in [
        (ROPE_HALVES, RopeStyle::Halves),
        (ROPE_PAIRS, RopeStyle::Pairs),
    ] {
        let mut got = x.clone();
        rope_f32(&mut got, &cos, &sin, &positions, num_heads, head_dim, style);
        let mut want = tensor(x.clone(), positions.len(), num_heads * head_dim);
        CpuBackend.rope(
            &mut want,
            &tensor(cos.clone(), max_pos, half),
            &tensor(sin.clone(), max_pos, half),
            &prepared,
            num_heads,
            engine_style,
        );
        assert_close(&got, &want.data, 1e-6, "rope");
        assert_ne!(got, x, "rope changed nothing");
    }
}

/// A random batched step: sequences with cached context and new tokens on shuffled blocks,
/// written through `write_kv` into both the engine's cache and the reference's arrays.
struct AttnCase {
    shape: AttentionShape,
    meta: StepMetadata,
    q: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
    engine_out: Vec<f32>,
}

fn attention_case(rng: &mut SplitMix64, decode: bool) -> AttnCase {
    let num_kv_heads = 1 + rng.below(3) as usize;
    let num_heads = num_kv_heads * (1 + rng.below(4) as usize);
    let head_dim = 4 * (1 + rng.below(4) as usize);
    let block_size = 1 + rng.below(8) as usize;
    let num_blocks = 320;
    let layout = KvLayout {
        num_layers: 1,
        num_blocks,
        block_size,
        num_kv_heads,
        head_dim,
        dtype: KvDtype::F32,
    };
    let stride = layout.token_stride();
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut meta = StepMetadata {
        block_size: block_size as u32,
        ..Default::default()
    };
    // Every token of every sequence is written in this step (the context as if by earlier
    // steps): one write_kv call covers them all.
    let mut all_slots = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let context = rng.below(if decode { 90 } else { 20 }) as usize;
        let q_len = if decode { 1 } else { 1 + rng.below(6) as usize };
        let total = context + q_len;
        let blocks: Vec<u32> = (0..total.div_ceil(block_size))
            .map(|_| free.pop().unwrap())
            .collect();
        let slot = |j: usize| blocks[j / block_size] * block_size as u32 + (j % block_size) as u32;
        meta.seqs.push(SeqSlice {
            query_start: meta.token_ids.len() as u32,
            query_len: q_len as u32,
            context_len: context as u32,
            block_table_start: meta.block_tables.len() as u32,
            block_table_len: blocks.len() as u32,
        });
        all_slots.extend((0..total).map(slot));
        for j in context..total {
            meta.token_ids.push(0);
            meta.positions.push(j as u32);
            meta.slot_mapping.push(slot(j));
        }
        meta.block_tables.extend(&blocks);
    }
    let k = random(all_slots.len() * stride, rng);
    let v = random(all_slots.len() * stride, rng);
    let mut cache = CpuBackend.alloc_kv_cache(layout);
    let write_meta = StepMetadata {
        token_ids: vec![0; all_slots.len()],
        positions: vec![0; all_slots.len()],
        slot_mapping: all_slots.clone(),
        block_size: block_size as u32,
        ..Default::default()
    };
    let rows = all_slots.len();
    CpuBackend.write_kv(
        &mut cache,
        0,
        &tensor(k.clone(), rows, stride),
        &tensor(v.clone(), rows, stride),
        &CpuBackend.prepare_step(&write_meta),
    );
    let mut k_cache = vec![0.0; layout.layer_len()];
    let mut v_cache = vec![0.0; layout.layer_len()];
    write_kv_f32(&k, &v, &mut k_cache, &mut v_cache, &all_slots, stride);
    for slot in 0..num_blocks * block_size {
        for g in 0..num_kv_heads {
            let at = slot * stride + g * head_dim;
            assert_eq!(
                cache.key(0, slot, g),
                &k_cache[at..at + head_dim],
                "write_kv K"
            );
            assert_eq!(
                cache.value(0, slot, g),
                &v_cache[at..at + head_dim],
                "write_kv V"
            );
        }
    }
    let tokens = meta.num_tokens();
    let q = random(tokens * num_heads * head_dim, rng);
    let prepared = CpuBackend.prepare_step(&meta);
    let engine_out = CpuBackend
        .paged_attention(
            &tensor(q.clone(), tokens, num_heads * head_dim),
            &cache,
            0,
            &prepared,
            num_heads,
        )
        .data;
    AttnCase {
        shape: AttentionShape {
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            scale: 1.0 / (head_dim as f32).sqrt(),
        },
        meta,
        q,
        k_cache,
        v_cache,
        engine_out,
    }
}

#[test]
fn prefill_attention_reference_equals_the_engine() {
    let mut rng = SplitMix64::new(21);
    for case in 0..20 {
        let c = attention_case(&mut rng, false);
        let mut out = vec![f32::NAN; c.q.len()];
        paged_attention_prefill_f32(
            &c.q,
            &c.k_cache,
            &c.v_cache,
            &flat_seqs(&c.meta.seqs),
            &c.meta.block_tables,
            &mut out,
            c.shape,
        );
        assert_close(&out, &c.engine_out, 1e-5, &format!("prefill case {case}"));
    }
}

#[test]
fn decode_attention_direct_and_split_equal_the_engine() {
    let mut rng = SplitMix64::new(22);
    for case in 0..20 {
        let c = attention_case(&mut rng, true);
        let s = c.shape;
        let seqs = flat_seqs(&c.meta.seqs);
        let num_seqs = c.meta.seqs.len();
        let mut direct = vec![f32::NAN; c.q.len()];
        paged_attention_decode_f32(
            &c.q,
            &c.k_cache,
            &c.v_cache,
            &seqs,
            &c.meta.block_tables,
            &mut direct,
            &mut [],
            &mut [],
            s,
            0,
            1,
        );
        assert_close(&direct, &c.engine_out, 1e-5, &format!("decode case {case}"));

        // Splits smaller than some sequences and larger than others: some end empty.
        let partition = 1 + rng.below(40) as usize;
        let longest = c.meta.seqs.iter().map(|q| q.total_len()).max().unwrap() as usize;
        let splits = longest.div_ceil(partition) + 1;
        let n = num_seqs * s.num_heads * splits;
        let (mut part_out, mut part_lse) = (vec![f32::NAN; n * s.head_dim], vec![f32::NAN; n]);
        paged_attention_decode_f32(
            &c.q,
            &c.k_cache,
            &c.v_cache,
            &seqs,
            &c.meta.block_tables,
            &mut [],
            &mut part_out,
            &mut part_lse,
            s,
            partition,
            splits,
        );
        assert!(part_lse.contains(&f32::NEG_INFINITY), "an empty split");
        let mut merged = vec![f32::NAN; c.q.len()];
        paged_attention_merge_f32(
            &part_out,
            &part_lse,
            &seqs,
            &mut merged,
            s.num_heads,
            s.head_dim,
            splits,
        );
        assert_close(&merged, &c.engine_out, 1e-5, &format!("split case {case}"));
    }
}

#[test]
fn argmax_reference_equals_the_engine() {
    let nan = f32::NAN;
    let ninf = f32::NEG_INFINITY;
    let rows: [&[f32]; 6] = [
        &[0.1, 3.0, 3.0, -1.0],
        &[ninf, ninf, ninf],
        &[nan, 1.0, nan, 2.0],
        &[nan, nan],
        &[-0.0, 0.0],
        &[1.0, f32::INFINITY, f32::INFINITY],
    ];
    for row in rows {
        let mut out = [u32::MAX];
        argmax_f32(row, &mut out, row.len());
        assert_eq!(
            out[0],
            ballast_engine::compute::sampling::argmax(row),
            "{row:?}"
        );
    }
}

#[test]
fn order_key_sorts_as_the_engine_orders_candidates() {
    let mut rng = SplitMix64::new(4);
    let mut v: Vec<(u32, f32)> = (0..200)
        .map(|i| (i, (rng.below(20) as f32 - 10.0) * 0.5))
        .chain([(200, -0.0), (201, 0.0), (202, f32::MAX), (203, -f32::MAX)])
        .collect();
    let mut by_key = v.clone();
    by_key.sort_by_key(|&(i, x)| std::cmp::Reverse(order_key(x, i)));
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    assert_eq!(by_key, v);
}

#[test]
fn sampling_reference_draws_what_the_engine_draws() {
    let mut rng = SplitMix64::new(9);
    let mut draws = 0;
    let mut distinct = std::collections::HashSet::new();
    for case in 0..400 {
        let cols = 1 + rng.below(300) as usize;
        let mut logits: Vec<f32> = (0..cols).map(|_| (rng.next_f32() - 0.5) * 8.0).collect();
        // Some ties, some masked tokens.
        for _ in 0..rng.below(4) {
            let (a, b) = (
                rng.below(cols as u64) as usize,
                rng.below(cols as u64) as usize,
            );
            logits[a] = logits[b];
        }
        if rng.below(4) == 0 {
            logits[rng.below(cols as u64) as usize] = f32::NEG_INFINITY;
        }
        let spec = SampleSpec {
            temperature: [0.0, 0.3, 1.0, 1.7][rng.below(4) as usize],
            top_p: [1.0, 0.9, 0.5, 0.05][rng.below(4) as usize],
            top_k: [0, 1, 5, 50][rng.below(4) as usize],
        };
        let seed = rng.next_u64();
        let mut engine_rng = SplitMix64::new(seed);
        let want = engine_sample_row(&mut logits.clone(), &spec, &[], &mut engine_rng);
        let u = SplitMix64::new(seed).next_f64();
        let mut got = [u32::MAX];
        sample_f32(
            &logits,
            &[spec.temperature],
            &[spec.top_p],
            &[spec.top_k],
            &[u],
            &mut got,
            cols,
        );
        assert_eq!(got[0], want, "case {case}: {spec:?}, u {u}, {cols} columns");
        if !spec.is_greedy() {
            draws += 1;
            distinct.insert(got[0]);
        }
    }
    assert!(
        draws > 200 && distinct.len() > 20,
        "the draws were not random: {distinct:?}"
    );
}

#[test]
fn bf16_rounding_equals_the_engines() {
    let mut rng = SplitMix64::new(11);
    let mut values = vec![
        0.0,
        -0.0,
        1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        f32::MAX,
        // Exact ties between two bf16 values, rounding down (even) and up (odd).
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        // Just above a tie, and a subnormal.
        f32::from_bits(0x3f80_8001),
        f32::from_bits(0x0000_8000),
    ];
    values.extend((0..100_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
    for v in values {
        assert_eq!(
            f32_to_bf16(v),
            ballast_engine::compute::backend::bf16_round(v),
            "{v:e} ({:#010x})",
            v.to_bits()
        );
    }
}
