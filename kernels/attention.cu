// Paged attention over the engine's KV cache, f32.
//
// Cache layout (one layer): K and V are each [num_blocks, block_size, num_kv_heads, head_dim],
// so token j of a sequence lives at slot = table[j / block_size] * block_size + j % block_size
// and its vector for kv head g at (slot * num_kv_heads + g) * head_dim. `seqs` is the step's
// SeqSlice array (five u32 per sequence), `block_tables` the concatenated block tables.
// q and out are [tokens, num_heads * head_dim]; query head h reads kv head h / group, with
// group = num_heads / num_kv_heads. Scores are q·k * scale (scale = 1/sqrt(head_dim) in the
// engine); query i of a sequence attends to tokens 0 ..= context_len + i.
//
// Every block of these kernels works on R "rows" (query, head) that share one kv head, so
// each K/V tile is read from global memory once for the whole query-head group. Keys are
// taken KV_TILE at a time with an online softmax (running max m, running sum l).
//
// Dynamic shared memory, in floats (see ballast_kernels::attention_smem_bytes):
//   q R*D | k KV_TILE*(D+1) | v KV_TILE*D | p R*KV_TILE | acc R*D | m R | l R | alpha R | lim R
// K rows are padded by one float: in the score loop the 32 lanes of a warp read 32 different
// keys at the same x, and a stride of D (a multiple of 32) would put them all in one bank.
// Above 48 KiB the launcher must raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
// Blocks are a multiple of 32 threads (128 is a good default).

#define KV_TILE 32 // one key per lane in the softmax step

struct AttnShared {
    float* q;
    float* k;
    float* v;
    float* p;
    float* acc;
    float* m;
    float* l;
    float* alpha;
    int* lim;
};

__device__ __forceinline__ AttnShared carve(float* smem, int rows, int d) {
    AttnShared s;
    s.q = smem;
    s.k = s.q + rows * d;
    s.v = s.k + KV_TILE * (d + 1);
    s.p = s.v + KV_TILE * d;
    s.acc = s.p + rows * KV_TILE;
    s.m = s.acc + rows * d;
    s.l = s.m + rows;
    s.alpha = s.l + rows;
    s.lim = (int*)(s.alpha + rows);
    return s;
}

// Attends the block's `rows` rows (queries in sh.q, last visible token per row in sh.lim,
// sh.acc/m/l initialised) to tokens [t_begin, t_end) of kv head `kv_head`. Leaves the
// un-normalised output in sh.acc, the running max in sh.m and the sum of exponentials in
// sh.l. t_begin and t_end must be the same for the whole block.
__device__ void attend(const AttnShared& sh, int rows, int d, const float* __restrict__ k_cache,
                       const float* __restrict__ v_cache, const u32* __restrict__ table,
                       int block_size, int num_kv_heads, int kv_head, int t_begin, int t_end,
                       float scale) {
    const int tid = threadIdx.x;
    const int nt = blockDim.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int warps = nt >> 5;
    const size_t token_stride = (size_t)num_kv_heads * d;
    for (int t0 = t_begin; t0 < t_end; t0 += KV_TILE) {
        const int n = min(KV_TILE, t_end - t0);
        for (int idx = tid; idx < n * d; idx += nt) {
            const int j = idx / d;
            const int x = idx - j * d;
            const int tok = t0 + j;
            const size_t slot = (size_t)table[tok / block_size] * block_size + tok % block_size;
            const size_t at = slot * token_stride + (size_t)kv_head * d + x;
            sh.k[j * (d + 1) + x] = k_cache[at];
            sh.v[idx] = v_cache[at];
        }
        __syncthreads();
        for (int idx = tid; idx < rows * KV_TILE; idx += nt) {
            const int r = idx / KV_TILE;
            const int j = idx - r * KV_TILE;
            float s = NEG_INF;
            if (j < n && t0 + j <= sh.lim[r]) {
                const float* qr = sh.q + r * d;
                const float* kj = sh.k + j * (d + 1);
                float dot = 0.0f;
                for (int x = 0; x < d; ++x) {
                    dot += qr[x] * kj[x];
                }
                s = dot * scale;
            }
            sh.p[idx] = s;
        }
        __syncthreads();
        for (int r = warp; r < rows; r += warps) {
            const float s = sh.p[r * KV_TILE + lane];
            const float m_old = sh.m[r];
            const float m_new = fmaxf(m_old, warp_reduce(s, OpMax()));
            // Rows with nothing visible yet keep m = -inf and contribute nothing.
            const float p = m_new == NEG_INF ? 0.0f : expf(s - m_new);
            const float alpha = m_new == NEG_INF ? 1.0f : expf(m_old - m_new);
            const float psum = warp_reduce(p, OpSum());
            sh.p[r * KV_TILE + lane] = p;
            if (lane == 0) {
                sh.m[r] = m_new;
                sh.l[r] = sh.l[r] * alpha + psum;
                sh.alpha[r] = alpha;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < rows * d; idx += nt) {
            const int r = idx / d;
            const int x = idx - r * d;
            const float* pr = sh.p + r * KV_TILE;
            float a = sh.acc[idx] * sh.alpha[r];
            for (int j = 0; j < n; ++j) {
                a += pr[j] * sh.v[j * d + x];
            }
            sh.acc[idx] = a;
        }
        __syncthreads();
    }
}

__device__ __forceinline__ void init_rows(const AttnShared& sh, int rows, int d) {
    for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
        sh.acc[idx] = 0.0f;
    }
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        sh.m[r] = NEG_INF;
        sh.l[r] = 0.0f;
    }
}

// Decode: the last query of each sequence (query_len is 1 in a decode step) attends to all
// context_len + query_len tokens. Rows = the `group` query heads of one kv head.
//
// Grid (num_kv_heads, num_seqs, num_splits); block a multiple of 32 (128); shared memory
// attention_smem_bytes(group, head_dim).
// num_splits == 1: writes out directly. num_splits > 1: split z covers tokens
// [z * partition_size, (z + 1) * partition_size) and writes, for s = seq, h = head,
// i = (s * num_heads + h) * num_splits + z, its normalised output to part_out[i * head_dim ..]
// and log(sum of exponentials) + max to part_lse[i] (-inf when the split saw no token);
// paged_attention_merge_f32 then combines the splits. partition_size is ignored without splits.
extern "C" __global__ void paged_attention_decode_f32(
    const float* __restrict__ q, const float* __restrict__ k_cache,
    const float* __restrict__ v_cache, const u32* __restrict__ seqs,
    const u32* __restrict__ block_tables, float* __restrict__ out, float* __restrict__ part_out,
    float* __restrict__ part_lse, int num_heads, int num_kv_heads, int head_dim, int block_size,
    int partition_size, float scale) {
    extern __shared__ float smem[];
    const int kv_head = blockIdx.x;
    const int si = blockIdx.y;
    const int split = blockIdx.z;
    const int splits = gridDim.z;
    const int d = head_dim;
    const int group = num_heads / num_kv_heads;
    const int rows = group;
    const SeqSlice s = load_seq(seqs, si);
    const int total = (int)(s.context_len + s.query_len);
    const size_t qrow = s.query_start + s.query_len - 1;
    int t_begin = 0;
    int t_end = total;
    if (splits > 1) {
        t_begin = min(total, split * partition_size);
        t_end = min(total, t_begin + partition_size);
    }
    const AttnShared sh = carve(smem, rows, d);
    // The group's heads are adjacent in the row: kv_head * group .. + group.
    const float* qsrc = q + qrow * num_heads * d + (size_t)kv_head * group * d;
    for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
        sh.q[idx] = qsrc[idx];
    }
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        sh.lim[r] = total - 1;
    }
    init_rows(sh, rows, d);
    __syncthreads();
    attend(sh, rows, d, k_cache, v_cache, block_tables + s.block_table_start, block_size,
           num_kv_heads, kv_head, t_begin, t_end, scale);
    if (splits == 1) {
        float* o = out + qrow * num_heads * d + (size_t)kv_head * group * d;
        for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
            const float l = sh.l[idx / d];
            o[idx] = l > 0.0f ? sh.acc[idx] / l : 0.0f;
        }
    } else {
        for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
            const int r = idx / d;
            const int x = idx - r * d;
            const size_t i = ((size_t)si * num_heads + (size_t)kv_head * group + r) * splits + split;
            const float l = sh.l[r];
            part_out[i * d + x] = l > 0.0f ? sh.acc[idx] / l : 0.0f;
            if (x == 0) {
                part_lse[i] = l > 0.0f ? sh.m[r] + logf(l) : NEG_INF;
            }
        }
    }
}

// Combines the splits of paged_attention_decode_f32: with M = max lse and w_z = e^(lse_z - M),
// out = Σ w_z o_z / Σ w_z, written to the sequence's last query row.
// Grid (num_heads, num_seqs); any block size (head_dim rounded up to 32 is enough).
extern "C" __global__ void paged_attention_merge_f32(const float* __restrict__ part_out,
                                                     const float* __restrict__ part_lse,
                                                     const u32* __restrict__ seqs,
                                                     float* __restrict__ out, int num_heads,
                                                     int head_dim, int num_splits) {
    const int h = blockIdx.x;
    const int si = blockIdx.y;
    const SeqSlice s = load_seq(seqs, si);
    const size_t qrow = s.query_start + s.query_len - 1;
    const size_t base = ((size_t)si * num_heads + h) * num_splits;
    float m = NEG_INF;
    for (int z = 0; z < num_splits; ++z) {
        m = fmaxf(m, part_lse[base + z]);
    }
    float wsum = 0.0f;
    for (int z = 0; z < num_splits; ++z) {
        const float lse = part_lse[base + z];
        wsum += lse == NEG_INF ? 0.0f : expf(lse - m);
    }
    float* o = out + qrow * num_heads * head_dim + (size_t)h * head_dim;
    for (int x = threadIdx.x; x < head_dim; x += blockDim.x) {
        float a = 0.0f;
        for (int z = 0; z < num_splits; ++z) {
            const float lse = part_lse[base + z];
            if (lse != NEG_INF) {
                a += expf(lse - m) * part_out[(base + z) * head_dim + x];
            }
        }
        o[x] = wsum > 0.0f ? a / wsum : 0.0f;
    }
}

// Prefill (and any step with several queries per sequence): causal attention of every query
// of each sequence over the paged cache, which already holds this step's keys.
// A block takes queries_per_tile consecutive queries of one sequence times the `group` query
// heads of one kv head: rows = queries_per_tile * group, row r is query r / group, head
// kv_head * group + r % group.
//
// Grid (num_kv_heads, ceil(max query_len / queries_per_tile), num_seqs); blocks past the end of
// a shorter sequence return at once. Block a multiple of 32 (128); shared memory
// attention_smem_bytes(queries_per_tile * group, head_dim).
extern "C" __global__ void paged_attention_prefill_f32(
    const float* __restrict__ q, const float* __restrict__ k_cache,
    const float* __restrict__ v_cache, const u32* __restrict__ seqs,
    const u32* __restrict__ block_tables, float* __restrict__ out, int num_heads,
    int num_kv_heads, int head_dim, int block_size, int queries_per_tile, float scale) {
    extern __shared__ float smem[];
    const int kv_head = blockIdx.x;
    const int tile = blockIdx.y;
    const int si = blockIdx.z;
    const int d = head_dim;
    const int group = num_heads / num_kv_heads;
    const SeqSlice s = load_seq(seqs, si);
    const int i0 = tile * queries_per_tile;
    if (i0 >= (int)s.query_len) {
        return; // the whole block leaves before any barrier
    }
    const int nq = min(queries_per_tile, (int)s.query_len - i0);
    const int rows = nq * group;
    const AttnShared sh = carve(smem, rows, d);
    const size_t row_len = (size_t)num_heads * d;
    for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
        const int r = idx / d;
        const int x = idx - r * d;
        const int qi = i0 + r / group;
        const int h = kv_head * group + r % group;
        sh.q[idx] = q[(s.query_start + qi) * row_len + (size_t)h * d + x];
    }
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        sh.lim[r] = (int)s.context_len + i0 + r / group;
    }
    init_rows(sh, rows, d);
    __syncthreads();
    attend(sh, rows, d, k_cache, v_cache, block_tables + s.block_table_start, block_size,
           num_kv_heads, kv_head, 0, (int)s.context_len + i0 + nq, scale);
    for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
        const int r = idx / d;
        const int x = idx - r * d;
        const int qi = i0 + r / group;
        const int h = kv_head * group + r % group;
        out[(s.query_start + qi) * row_len + (size_t)h * d + x] = sh.acc[idx] / sh.l[r];
    }
}
