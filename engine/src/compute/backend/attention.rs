//! Paged causal attention on the CPU, over one layer's keys and values in the KV cache
//! (f32 or f16), for every query row of a step.
//!
//! Two ways through, chosen per sequence:
//!
//! - **A token at a time** (decode rows, and prefill chunks shorter than [`TILED_FROM`]):
//!   a task takes one query token and one or all query heads of a KV head's group, and reads
//!   that token's keys and values straight from the cache. Each key is read once per task,
//!   which is all a decode step can reuse it.
//! - **Tiles** (prefill chunks): a task takes [`QUERY_TILE`] consecutive query tokens of one
//!   sequence and every query head of one KV head, widens the keys and values it attends to
//!   into f32 [`KEY_SPAN`] positions at a time, and multiplies with a packed GEMM: the
//!   scores of the whole tile against a span, then the tile's weights against the span's
//!   values. A token at a time, a 2,048-token prompt read every key and value once per
//!   query token, widening each from f16 again; that was 60–70 % of its prefill
//!   (`PROFILES=prefill2048 scripts/profile-engine.sh`, docs/benchmarks.md).
//!
//! Both take the same softmax ([`softmax`], with a vectorised e^x) over all of a query's
//! scores: the tiled path keeps a tile's scores (group × tile × context floats) rather than
//! rescaling a running sum, so the two paths differ only in the order of the dot products'
//! additions.

use rayon::prelude::*;

use super::KvLayout;
use super::simd::{KvElement, axpy_strided, dots_strided, softmax};
use super::tensor::CpuTensor;
use crate::step::StepMetadata;

/// From this many new tokens of one sequence in a step on, its queries go through tiles.
pub const TILED_FROM: usize = 4;

/// Query tokens of one sequence per tiled task.
const QUERY_TILE: usize = 32;

/// Key (and value) positions a tiled task widens to f32 at a time.
const KEY_SPAN: usize = 256;

/// Attention of every query row of `q` (`[tokens, num_heads · head_dim]`) over the keys
/// and values the step's block tables point at, causal within each sequence.
pub(super) fn attention<T: KvElement>(
    q: &CpuTensor,
    keys: &[T],
    values: &[T],
    layout: KvLayout,
    (meta, row_seq): (&StepMetadata, &[u32]),
    num_heads: usize,
) -> CpuTensor
where
    f32: From<T>,
{
    let mut out = CpuTensor::zeros(q.rows, q.cols);
    let tiled = |seq: usize| meta.seqs[seq].query_len as usize >= TILED_FROM;
    let rows_by_token = row_seq.iter().filter(|&&s| !tiled(s as usize)).count();
    if rows_by_token > 0 {
        by_token(
            q,
            (keys, values),
            layout,
            (meta, row_seq),
            num_heads,
            rows_by_token,
            &mut out,
        );
    }
    if rows_by_token < q.rows {
        by_tile(q, (keys, values), layout, meta, num_heads, &mut out);
    }
    out
}

/// The rows of sequences with fewer than [`TILED_FROM`] new tokens, a token at a time;
/// `rows` of them.
fn by_token<T: KvElement>(
    q: &CpuTensor,
    (keys, values): (&[T], &[T]),
    layout: KvLayout,
    (meta, row_seq): (&StepMetadata, &[u32]),
    num_heads: usize,
    rows: usize,
    out: &mut CpuTensor,
) where
    f32: From<T>,
{
    let d = layout.head_dim;
    let group = num_heads / layout.num_kv_heads;
    let bs = meta.block_size as usize;
    let scale = 1.0 / (d as f32).sqrt();
    // A task serves one token and `per` query heads of one KV head's group (their outputs
    // are adjacent). With the whole group, each block of keys and values is read from
    // memory once and from L1 for the group's other heads; that is the choice when there
    // are enough (token, KV head) pairs to keep every thread busy (decode batches). A single
    // sequence's decode step has as few tasks as KV heads, so there a task takes one query
    // head and the threads share the work evenly.
    let per = if rows * layout.num_kv_heads >= 4 * rayon::current_num_threads() {
        group
    } else {
        1
    };
    let chunks_per_token = num_heads / per;
    out.data
        .par_chunks_mut(per * d)
        .with_min_len(2)
        .enumerate()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (i, o)| {
            let (t, h0) = (i / chunks_per_token, i % chunks_per_token * per);
            let seq = &meta.seqs[row_seq[t] as usize];
            if seq.query_len as usize >= TILED_FROM {
                return;
            }
            let kv_head = h0 / group;
            let table = meta.block_table(seq);
            let pos = seq.context_len as usize + (t - seq.query_start as usize);
            let len = pos + 1;
            let q_at = t * q.cols + h0 * d;
            let qs = &q.data[q_at..q_at + per * d];
            let stride = layout.token_stride();
            // Positions 0..=pos, one KV block at a time: the keys of a block are `stride`
            // apart in the layer's array, starting at the block's first slot.
            let runs = || {
                (0..=pos).step_by(bs).map(move |j0| {
                    let n = bs.min(pos + 1 - j0);
                    let at = table[j0 / bs] as usize * bs * stride + kv_head * d;
                    (j0, n, at..at + (n - 1) * stride + d)
                })
            };
            // Scores of the task's head j at [j * len, (j + 1) * len).
            scores.clear();
            scores.resize(per * len, 0.0);
            for (j0, n, rows) in runs() {
                let keys = &keys[rows];
                for (qh, s) in qs.chunks_exact(d).zip(scores.chunks_exact_mut(len)) {
                    dots_strided(qh, keys, stride, scale, &mut s[j0..j0 + n]);
                }
            }
            for s in scores.chunks_exact_mut(len) {
                softmax(s);
            }
            for (j0, n, rows) in runs() {
                let values = &values[rows];
                for (oh, s) in o.chunks_exact_mut(d).zip(scores.chunks_exact(len)) {
                    axpy_strided(&s[j0..j0 + n], values, stride, oh);
                }
            }
        });
}

/// The output pointer tiled tasks share.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a disjoint set of (row, head) outputs.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// One tiled task's buffers, kept across the tasks a thread runs. Row `g · tile + i` of each
/// is query head `g` of the group at token `i` of the tile, so that one GEMM serves the
/// whole group and each span of keys and values is packed once.
#[derive(Default)]
struct Scratch {
    /// The tile's queries, `head_dim` per row.
    queries: Vec<f32>,
    /// The tile's scores, then weights: one per key position of the tile's last token.
    scores: Vec<f32>,
    /// The tile's outputs, `head_dim` per row.
    outputs: Vec<f32>,
    /// [`KEY_SPAN`] keys or values, widened to f32, one row per position.
    span: Vec<f32>,
}

/// The rows of sequences with at least [`TILED_FROM`] new tokens, [`QUERY_TILE`] tokens and
/// one KV head's query heads per task.
fn by_tile<T: KvElement>(
    q: &CpuTensor,
    (keys, values): (&[T], &[T]),
    layout: KvLayout,
    meta: &StepMetadata,
    num_heads: usize,
    out: &mut CpuTensor,
) where
    f32: From<T>,
{
    let d = layout.head_dim;
    let kv_heads = layout.num_kv_heads;
    let group = num_heads / kv_heads;
    let bs = meta.block_size as usize;
    let stride = layout.token_stride();
    let scale = 1.0 / (d as f32).sqrt();
    let cols = q.cols;
    // (sequence, first row, rows, KV head); the tiles with the most keys first, so that the
    // longest tasks do not start last.
    let mut tasks: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (i, s) in meta.seqs.iter().enumerate() {
        let (start, len) = (s.query_start as usize, s.query_len as usize);
        if len < TILED_FROM {
            continue;
        }
        for i0 in (0..len).step_by(QUERY_TILE) {
            for kv in 0..kv_heads {
                tasks.push((i, start + i0, QUERY_TILE.min(len - i0), kv));
            }
        }
    }
    let keys_of = |&(i, t0, n, _): &(usize, usize, usize, usize)| {
        let s = &meta.seqs[i];
        s.context_len as usize + (t0 - s.query_start as usize) + n
    };
    tasks.sort_by_key(|t| std::cmp::Reverse(keys_of(t)));
    let ptr = OutPtr(out.data.as_mut_ptr());
    tasks
        .par_iter()
        .with_max_len(1)
        .for_each_init(Scratch::default, |scratch, task| {
            let (i, t0, nq, kv) = *task;
            let seq = &meta.seqs[i];
            let table = meta.block_table(seq);
            // Token `r` of the tile is at position `first + r` and attends to 0..=first + r.
            let first = seq.context_len as usize + (t0 - seq.query_start as usize);
            let len = keys_of(task);
            let Scratch {
                queries,
                scores,
                outputs,
                span,
            } = scratch;
            let rows = group * nq;
            let head = |g: usize| (kv * group + g) * d;
            queries.clear();
            for g in 0..group {
                for t in t0..t0 + nq {
                    queries.extend_from_slice(&q.data[t * cols + head(g)..][..d]);
                }
            }
            scores.clear();
            scores.resize(rows * len, 0.0);
            outputs.clear();
            outputs.resize(rows * d, 0.0);
            span.resize(KEY_SPAN.min(len) * d, 0.0);
            // Positions j0..j0 + n of the cache array `src`, this KV head's part, into `span`.
            let widen = |src: &[T], j0: usize, n: usize, span: &mut [f32]| {
                for (j, dst) in (j0..j0 + n).zip(span.chunks_exact_mut(d)) {
                    let at = (table[j / bs] as usize * bs + j % bs) * stride + kv * d;
                    T::widen(&src[at..at + d], dst);
                }
            };
            for j0 in (0..len).step_by(KEY_SPAN) {
                let n = KEY_SPAN.min(len - j0);
                widen(keys, j0, n, span);
                // SAFETY: A is the `rows` queries of d; B the span's n rows of d, read
                // transposed; C columns j0..j0 + n of the scores (row stride `len`).
                unsafe {
                    matrixmultiply::sgemm(
                        rows,
                        d,
                        n,
                        scale,
                        queries.as_ptr(),
                        d as isize,
                        1,
                        span.as_ptr(),
                        1,
                        d as isize,
                        0.0,
                        scores.as_mut_ptr().add(j0),
                        len as isize,
                        1,
                    );
                }
            }
            for (r, row) in scores.chunks_exact_mut(len).enumerate() {
                let (live, future) = row.split_at_mut(first + r % nq + 1);
                softmax(live);
                future.fill(0.0);
            }
            for j0 in (0..len).step_by(KEY_SPAN) {
                let n = KEY_SPAN.min(len - j0);
                widen(values, j0, n, span);
                // SAFETY: A is columns j0..j0 + n of the weights (row stride `len`); B the
                // span's n rows of d; C the `rows` outputs of d.
                unsafe {
                    matrixmultiply::sgemm(
                        rows,
                        n,
                        d,
                        1.0,
                        scores.as_ptr().add(j0),
                        len as isize,
                        1,
                        span.as_ptr(),
                        d as isize,
                        1,
                        1.0,
                        outputs.as_mut_ptr(),
                        d as isize,
                        1,
                    );
                }
            }
            let dst = ptr;
            for (r, o) in outputs.chunks_exact(d).enumerate() {
                let (g, i) = (r / nq, r % nq);
                // SAFETY: row t0 + i, head `head(g)` of the output: this task's alone.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        o.as_ptr(),
                        dst.0.add((t0 + i) * cols + head(g)),
                        d,
                    );
                }
            }
        });
}
