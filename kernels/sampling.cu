// Token selection over rows of logits `[rows, cols]`, matching the engine's sampler
// (engine/src/sampling.rs) without sorting the vocabulary.
//
// The engine orders candidates by logit (descending), ties by index (ascending). Here every
// finite logit gets a 64-bit key with that order: the logit's bits mapped to an unsigned
// integer that sorts like the float (total order, -0 < +0) in the high half, the complement
// of its index in the low half. "The first n tokens of the sorted row" is then "the tokens
// whose key is at least x" for some x, found by binary search on x with one pass over the row
// per step: no sort and no per-row scratch memory.

#define GREEDY_EPSILON 1e-5f

__device__ __forceinline__ u64 order_key(float v, u32 index) {
    u32 b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)b << 32) | (u64)(0xffffffffu - index);
}

__device__ __forceinline__ u32 key_index(u64 key) {
    return 0xffffffffu - (u32)(key & 0xffffffffu);
}

__device__ __forceinline__ bool is_finite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
}

struct Best {
    float v;
    u32 i;
};

// Index of the largest value, the lowest index among equals, 0 when no value exceeds -inf
// (all -inf or NaN): the engine's `argmax`. Every thread of the block must call it and gets
// the answer. blockDim.x a multiple of 32, at most 1024.
__device__ u32 block_argmax(const float* __restrict__ row, int cols) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    Best b;
    b.v = NEG_INF;
    b.i = 0xffffffffu;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = row[i];
        if (v > b.v) { // NaN never wins; a thread sees increasing indexes
            b.v = v;
            b.i = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, b.v, o);
        const u32 oi = __shfl_xor_sync(FULL_MASK, b.i, o);
        if (ov > b.v || (ov == b.v && oi < b.i)) {
            b.v = ov;
            b.i = oi;
        }
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) {
        sv[warp] = b.v;
        si[warp] = b.i;
    }
    __syncthreads();
    b.v = lane < (int)(blockDim.x >> 5) ? sv[lane] : NEG_INF;
    b.i = lane < (int)(blockDim.x >> 5) ? si[lane] : 0xffffffffu;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, b.v, o);
        const u32 oi = __shfl_xor_sync(FULL_MASK, b.i, o);
        if (ov > b.v || (ov == b.v && oi < b.i)) {
            b.v = ov;
            b.i = oi;
        }
    }
    return b.i == 0xffffffffu ? 0 : b.i;
}

// out[r] = argmax of logits row r. Grid (rows); block a multiple of 32, at most 1024 (1024).
extern "C" __global__ void argmax_f32(const float* __restrict__ logits, u32* __restrict__ out,
                                      int cols) {
    const size_t r = blockIdx.x;
    const u32 best = block_argmax(logits + r * cols, cols);
    if (threadIdx.x == 0) {
        out[r] = best;
    }
}

// Tokens with key >= x among the finite logits of the row: how many (count) and their mass
// Σ e^(v * inv_t - max) in f64, as the engine sums probabilities.
struct Tally {
    u64 count;
    double mass;
};

__device__ Tally tally_from(const float* __restrict__ row, int cols, float inv_t, float max,
                            u64 x, u64* scratch_u, double* scratch_d) {
    u64 count = 0;
    double mass = 0.0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = row[i];
        if (!is_finite(v)) {
            continue;
        }
        // Rounded product and difference (no FMA contraction), as the CPU computes them, so
        // the masses and the token drawn match the engine's bit for bit.
        const float s = __fmul_rn(v, inv_t);
        if (order_key(s, i) >= x) {
            count += 1;
            mass += exp((double)__fsub_rn(s, max));
        }
    }
    Tally t;
    t.count = block_reduce(count, OpSum(), (u64)0, scratch_u);
    t.mass = block_reduce(mass, OpSum(), 0.0, scratch_d);
    return t;
}

// What a binary search over keys looks for: the largest x whose tally from x has
// at least k tokens (TOP_K), at least `bound` mass (TOP_P), or more than `bound` mass (DRAW).
enum Search { TOP_K, TOP_P, DRAW };

// The largest x in [lo, hi] for which `search` holds; it must hold at lo. One pass over the
// row per step, at most 64 steps. Every thread of the block must call it and gets the answer.
__device__ u64 search_keys(const float* __restrict__ row, int cols, float inv_t, float max,
                           u64 lo, u64 hi, Search search, u64 k, double bound, u64* scratch_u,
                           double* scratch_d) {
    while (lo < hi) {
        const u64 mid = lo + (hi - lo + 1) / 2;
        const Tally t = tally_from(row, cols, inv_t, max, mid, scratch_u, scratch_d);
        const bool holds = search == TOP_K   ? t.count >= k
                           : search == TOP_P ? t.mass >= bound
                                             : t.mass > bound;
        if (holds) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// One token per row drawn as the engine's `sample_row` draws it (without suppression: the
// caller sets suppressed logits to -inf first): greedy (argmax) when temperature <= 1e-5;
// otherwise logits * (1 / temperature) over the finite logits, the top_k best (0: all),
// then the shortest prefix whose probability mass reaches top_p (1: all), then the token at
// which the running mass first exceeds uniform * (kept mass). uniform in [0, 1), one per row
// (the engine's `rng.next_f64()`).
//
// temperature, top_p: [rows] f32; top_k: [rows] u32; uniform: [rows] f64; out: [rows] u32.
// Grid (rows); block a multiple of 32, at most 1024 (1024). Up to three binary searches of at
// most 64 passes over the row each.
extern "C" __global__ void sample_f32(const float* __restrict__ logits,
                                      const float* __restrict__ temperature,
                                      const float* __restrict__ top_p,
                                      const u32* __restrict__ top_k,
                                      const double* __restrict__ uniform, u32* __restrict__ out,
                                      int cols) {
    __shared__ u64 scratch_u[32];
    __shared__ double scratch_d[32];
    __shared__ float scratch_f[32];
    const size_t r = blockIdx.x;
    const float* row = logits + r * cols;
    const float t = temperature[r];
    if (t <= GREEDY_EPSILON) {
        const u32 best = block_argmax(row, cols);
        if (threadIdx.x == 0) {
            out[r] = best;
        }
        return;
    }
    const float inv_t = 1.0f / t;
    // Candidates: how many, their largest scaled logit, smallest and largest key.
    u64 count = 0;
    float max = NEG_INF;
    u64 lo = ~(u64)0;
    u64 hi = 0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = row[i];
        if (!is_finite(v)) {
            continue;
        }
        const float s = __fmul_rn(v, inv_t);
        const u64 key = order_key(s, i);
        count += 1;
        max = fmaxf(max, s);
        lo = key < lo ? key : lo;
        hi = key > hi ? key : hi;
    }
    count = block_reduce(count, OpSum(), (u64)0, scratch_u);
    if (count == 0) {
        const u32 best = block_argmax(row, cols);
        if (threadIdx.x == 0) {
            out[r] = best;
        }
        return;
    }
    max = block_reduce(max, OpMax(), NEG_INF, scratch_f);
    lo = block_reduce(lo, OpMin(), ~(u64)0, scratch_u);
    hi = block_reduce(hi, OpMax(), (u64)0, scratch_u);

    // top-k: at least k candidates have key >= x; that x is the k-th best key.
    const u64 k = top_k[r];
    if (k > 0 && k < count) {
        lo = search_keys(row, cols, inv_t, max, lo, hi, TOP_K, k, 0.0, scratch_u, scratch_d);
    }
    double total = tally_from(row, cols, inv_t, max, lo, scratch_u, scratch_d).mass;
    // top-p: the shortest prefix with mass >= top_p * total ends at the largest such x.
    const float p = top_p[r];
    if (p < 1.0f) {
        lo = search_keys(row, cols, inv_t, max, lo, hi, TOP_P, 0, (double)p * total, scratch_u,
                         scratch_d);
        total = tally_from(row, cols, inv_t, max, lo, scratch_u, scratch_d).mass;
    }
    // The draw: the first token (in key order) whose running mass exceeds u * total; the last
    // kept token (lo) when rounding leaves none.
    const u64 a = search_keys(row, cols, inv_t, max, lo, hi, DRAW, 0, uniform[r] * total,
                              scratch_u, scratch_d);
    if (threadIdx.x == 0) {
        out[r] = key_index(a);
    }
}
