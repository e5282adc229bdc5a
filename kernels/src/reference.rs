//! Plain-Rust CPU references of the kernels, argument for argument: the same slices in the
//! same layouts, with device pointers as slices and the launch geometry left out.
//!
//! Each restates one kernel's contract simply (no tiling, no online softmax), so a device
//! test can launch the kernel on random input and compare with these. The tests below hold
//! every reference equal to the engine's CPU backend op it stands for, which is the real
//! specification.

/// Attention shape shared by the attention kernels' arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads; divides `num_heads`.
    pub num_kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Score scale (the engine uses `1 / sqrt(head_dim)`).
    pub scale: f32,
}

/// `(query_start, query_len, context_len, block_table_start, block_table_len)` of sequence
/// `i` in the kernels' flat `seqs` array (five u32 per sequence, the engine's `SeqSlice`).
pub fn seq(seqs: &[u32], i: usize) -> [usize; 5] {
    std::array::from_fn(|f| seqs[5 * i + f] as usize)
}

/// `embedding_f32`: `out[t] = table[ids[t]]`, rows of `hidden` values.
pub fn embedding_f32(table: &[f32], ids: &[u32], out: &mut [f32], hidden: usize) {
    for (o, &id) in out.chunks_mut(hidden).zip(ids) {
        let at = id as usize * hidden;
        o.copy_from_slice(&table[at..at + hidden]);
    }
}

/// `bf16` bits widened to f32 (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `f32_to_bf16` (the device helper and the kernel of that name): round to nearest even; a
/// NaN stays a quiet NaN.
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if x & 0x7fff_ffff > 0x7f80_0000 {
        return ((x >> 16) | 0x40) as u16;
    }
    (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16
}

/// `embedding_bf16`: [`embedding_f32`] over a bf16 table (raw bits).
pub fn embedding_bf16(table: &[u16], ids: &[u32], out: &mut [f32], hidden: usize) {
    for (o, &id) in out.chunks_mut(hidden).zip(ids) {
        let at = id as usize * hidden;
        for (o, &b) in o.iter_mut().zip(&table[at..at + hidden]) {
            *o = bf16_to_f32(b);
        }
    }
}

/// `rms_norm_f32`: each row of `cols` values times `1 / sqrt(mean(x²) + eps)` times `weight`.
pub fn rms_norm_f32(x: &[f32], weight: &[f32], out: &mut [f32], cols: usize, eps: f32) {
    for (o, xr) in out.chunks_mut(cols).zip(x.chunks(cols)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let scale = 1.0 / (ss / cols as f32 + eps).sqrt();
        for ((o, &v), &w) in o.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// `rope_f32` `style`: dimension `i` rotates with `i + head_dim / 2`.
pub const ROPE_HALVES: i32 = 0;
/// `rope_f32` `style`: dimension `2i` rotates with `2i + 1`.
pub const ROPE_PAIRS: i32 = 1;

/// `rope_f32`: rotary embedding in place on `x: [tokens, num_heads * head_dim]`, with
/// `cos`/`sin` tables `[max_positions, head_dim / 2]` read at each token's position.
pub fn rope_f32(
    x: &mut [f32],
    cos: &[f32],
    sin: &[f32],
    positions: &[u32],
    num_heads: usize,
    head_dim: usize,
    style: i32,
) {
    let half = head_dim / 2;
    for (row, &pos) in x.chunks_mut(num_heads * head_dim).zip(positions) {
        let at = pos as usize * half;
        let (c, s) = (&cos[at..at + half], &sin[at..at + half]);
        for h in row.chunks_mut(head_dim) {
            for i in 0..half {
                let (ia, ib) = if style == ROPE_HALVES {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (a, b) = (h[ia], h[ib]);
                h[ia] = a * c[i] - b * s[i];
                h[ib] = b * c[i] + a * s[i];
            }
        }
    }
}

/// `silu_mul_f32`: `out = gate / (1 + e^-gate) * up`.
pub fn silu_mul_f32(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// `add_assign_f32`: `x += y`.
pub fn add_assign_f32(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `gather_rows_f32`: `out[i] = x[rows[i]]`, rows of `cols` values.
pub fn gather_rows_f32(x: &[f32], rows: &[u32], out: &mut [f32], cols: usize) {
    for (o, &r) in out.chunks_mut(cols).zip(rows) {
        let at = r as usize * cols;
        o.copy_from_slice(&x[at..at + cols]);
    }
}

/// `write_kv_f32`: row `t` of `k`/`v` to slot `slot_mapping[t]` of one layer's cache arrays.
pub fn write_kv_f32(
    k: &[f32],
    v: &[f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    slot_mapping: &[u32],
    token_stride: usize,
) {
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let (src, dst) = (t * token_stride, slot as usize * token_stride);
        k_cache[dst..dst + token_stride].copy_from_slice(&k[src..src + token_stride]);
        v_cache[dst..dst + token_stride].copy_from_slice(&v[src..src + token_stride]);
    }
}

/// Softmax attention of query row `qrow`, head `h`, over the sequence's tokens
/// `range`: the normalised output and `max + ln(sum of exponentials)` (−∞ and zeros when the
/// range is empty).
#[allow(clippy::too_many_arguments)]
fn attend(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    table: &[u32],
    s: AttentionShape,
    qrow: usize,
    h: usize,
    range: std::ops::Range<usize>,
) -> (Vec<f32>, f32) {
    let d = s.head_dim;
    let group = s.num_heads / s.num_kv_heads;
    let kv_off = (h / group) * d;
    let stride = s.num_kv_heads * d;
    let at = |j: usize| {
        let slot = table[j / s.block_size] as usize * s.block_size + j % s.block_size;
        slot * stride + kv_off
    };
    let qh = &q[qrow * s.num_heads * d + h * d..][..d];
    let scores: Vec<f32> = range
        .clone()
        .map(|j| {
            let kj = &k_cache[at(j)..at(j) + d];
            qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * s.scale
        })
        .collect();
    let mut out = vec![0.0; d];
    if scores.is_empty() {
        return (out, f32::NEG_INFINITY);
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = scores.iter().map(|x| (x - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    for (j, e) in range.zip(&exps) {
        for (o, v) in out.iter_mut().zip(&v_cache[at(j)..at(j) + d]) {
            *o += e / sum * v;
        }
    }
    (out, max + sum.ln())
}

/// `paged_attention_decode_f32`: for the last query row of each sequence, attention over
/// all its `context_len + query_len` tokens. With `num_splits == 1` writes `out`; otherwise
/// split `z` covers tokens `[z * partition_size, (z + 1) * partition_size)` and writes
/// `part_out[i * head_dim ..]` and `part_lse[i]` for `i = (seq * num_heads + h) * num_splits + z`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_decode_f32(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[u32],
    block_tables: &[u32],
    out: &mut [f32],
    part_out: &mut [f32],
    part_lse: &mut [f32],
    shape: AttentionShape,
    partition_size: usize,
    num_splits: usize,
) {
    let d = shape.head_dim;
    for si in 0..seqs.len() / 5 {
        let [q_start, q_len, context, bt_start, bt_len] = seq(seqs, si);
        let table = &block_tables[bt_start..bt_start + bt_len];
        let total = context + q_len;
        let qrow = q_start + q_len - 1;
        for h in 0..shape.num_heads {
            if num_splits == 1 {
                let (o, _) = attend(q, k_cache, v_cache, table, shape, qrow, h, 0..total);
                out[qrow * shape.num_heads * d + h * d..][..d].copy_from_slice(&o);
                continue;
            }
            for z in 0..num_splits {
                let begin = (z * partition_size).min(total);
                let end = (begin + partition_size).min(total);
                let (o, lse) = attend(q, k_cache, v_cache, table, shape, qrow, h, begin..end);
                let i = (si * shape.num_heads + h) * num_splits + z;
                part_out[i * d..(i + 1) * d].copy_from_slice(&o);
                part_lse[i] = lse;
            }
        }
    }
}

/// `paged_attention_merge_f32`: `out = Σ w_z o_z / Σ w_z` with `w_z = e^(lse_z − max lse)`,
/// into each sequence's last query row.
pub fn paged_attention_merge_f32(
    part_out: &[f32],
    part_lse: &[f32],
    seqs: &[u32],
    out: &mut [f32],
    num_heads: usize,
    head_dim: usize,
    num_splits: usize,
) {
    for si in 0..seqs.len() / 5 {
        let [q_start, q_len, ..] = seq(seqs, si);
        let qrow = q_start + q_len - 1;
        for h in 0..num_heads {
            let base = (si * num_heads + h) * num_splits;
            let lse = &part_lse[base..base + num_splits];
            let max = lse.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = lse.iter().map(|&l| (l - max).exp()).collect();
            let wsum: f32 = w.iter().sum();
            let o = &mut out[qrow * num_heads * head_dim + h * head_dim..][..head_dim];
            for (x, o) in o.iter_mut().enumerate() {
                let a: f32 = (0..num_splits)
                    .map(|z| w[z] * part_out[(base + z) * head_dim + x])
                    .sum();
                *o = if wsum > 0.0 { a / wsum } else { 0.0 };
            }
        }
    }
}

/// `paged_attention_prefill_f32`: query `i` of each sequence attends to its tokens
/// `0 ..= context_len + i`. (`queries_per_tile` only shapes the launch.)
pub fn paged_attention_prefill_f32(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[u32],
    block_tables: &[u32],
    out: &mut [f32],
    shape: AttentionShape,
) {
    let d = shape.head_dim;
    for si in 0..seqs.len() / 5 {
        let [q_start, q_len, context, bt_start, bt_len] = seq(seqs, si);
        let table = &block_tables[bt_start..bt_start + bt_len];
        for i in 0..q_len {
            let qrow = q_start + i;
            for h in 0..shape.num_heads {
                let (o, _) = attend(
                    q,
                    k_cache,
                    v_cache,
                    table,
                    shape,
                    qrow,
                    h,
                    0..context + i + 1,
                );
                out[qrow * shape.num_heads * d + h * d..][..d].copy_from_slice(&o);
            }
        }
    }
}

/// `argmax_f32`: index of each row's largest value, the lowest among equals, 0 when none
/// exceeds −∞.
pub fn argmax_f32(logits: &[f32], out: &mut [u32], cols: usize) {
    for (o, row) in out.iter_mut().zip(logits.chunks(cols)) {
        *o = argmax(row);
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0);
    for (i, &v) in row.iter().enumerate() {
        if v > best.0 {
            best = (v, i as u32);
        }
    }
    best.1
}

/// Temperatures at or below this are greedy (the engine's `GREEDY_EPSILON`).
pub const GREEDY_EPSILON: f32 = 1e-5;

/// The sampler's order as one integer: larger key, earlier token (higher value, then
/// lower index), with f32's total order on values.
pub fn order_key(v: f32, index: u32) -> u64 {
    let b = v.to_bits();
    let b = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    (u64::from(b) << 32) | u64::from(u32::MAX - index)
}

/// `sample_f32`: one token per row, as the kernel draws it (see `sampling.cu`):
/// greedy below [`GREEDY_EPSILON`], else temperature, top-k, top-p and one draw with
/// `uniform[r]`, each step a search over [`order_key`] rather than a sort.
#[allow(clippy::too_many_arguments)]
pub fn sample_f32(
    logits: &[f32],
    temperature: &[f32],
    top_p: &[f32],
    top_k: &[u32],
    uniform: &[f64],
    out: &mut [u32],
    cols: usize,
) {
    for (r, (o, row)) in out.iter_mut().zip(logits.chunks(cols)).enumerate() {
        *o = sample_row(row, temperature[r], top_p[r], top_k[r], uniform[r]);
    }
}

fn sample_row(row: &[f32], t: f32, top_p: f32, top_k: u32, u: f64) -> u32 {
    if t <= GREEDY_EPSILON {
        return argmax(row);
    }
    let inv_t = 1.0 / t;
    let cand: Vec<(u64, f32)> = row
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (order_key(v * inv_t, i as u32), v * inv_t))
        .collect();
    if cand.is_empty() {
        return argmax(row);
    }
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let count = |x: u64| cand.iter().filter(|c| c.0 >= x).count() as u64;
    let mass = |x: u64| -> f64 {
        cand.iter()
            .filter(|c| c.0 >= x)
            .map(|c| f64::from(c.1 - max).exp())
            .sum()
    };
    // Largest x in [lo, hi] with pred(x), given pred(lo).
    let search = |mut lo: u64, mut hi: u64, pred: &dyn Fn(u64) -> bool| {
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if pred(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    };
    let mut lo = cand.iter().map(|c| c.0).min().unwrap_or(0);
    let hi = cand.iter().map(|c| c.0).max().unwrap_or(0);
    let k = u64::from(top_k);
    if k > 0 && k < cand.len() as u64 {
        lo = search(lo, hi, &|x| count(x) >= k);
    }
    let mut total = mass(lo);
    if top_p < 1.0 {
        let threshold = f64::from(top_p) * total;
        lo = search(lo, hi, &|x| mass(x) >= threshold);
        total = mass(lo);
    }
    let target = u * total;
    let pick = search(lo, hi, &|x| mass(x) > target);
    u32::MAX - (pick & 0xffff_ffff) as u32
}

#[cfg(test)]
mod tests;
