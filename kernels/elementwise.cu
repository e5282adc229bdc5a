// Row-wise and element-wise kernels: embedding, RMSNorm, RoPE, SiLU·mul, residual add,
// row gather, the KV-cache write and the bf16 rounding of GEMM inputs. Tensors are row-major f32 `[rows, cols]`, as in the
// engine's CPU backend, whose ops these match (see ballast_kernels::reference).

// out[t, :] = table[ids[t], :].
// table: [vocab, hidden]; ids: [tokens]; out: [tokens, hidden].
// Grid (tokens); any block size (256): threads stride over the hidden dimension.
extern "C" __global__ void embedding_f32(const float* __restrict__ table,
                                         const u32* __restrict__ ids,
                                         float* __restrict__ out, int hidden) {
    const size_t t = blockIdx.x;
    const float* src = table + (size_t)ids[t] * hidden;
    float* dst = out + t * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        dst[i] = src[i];
    }
}

// embedding_f32 with a bf16 table (raw u16 bits), widened to f32.
// Grid (tokens); any block size (256).
extern "C" __global__ void embedding_bf16(const u16* __restrict__ table,
                                          const u32* __restrict__ ids,
                                          float* __restrict__ out, int hidden) {
    const size_t t = blockIdx.x;
    const u16* src = table + (size_t)ids[t] * hidden;
    float* dst = out + t * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        dst[i] = bf16_to_f32(src[i]);
    }
}

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight.
// x, out: [rows, cols]; weight: [cols].
// Grid (rows); block a multiple of 32, at most 1024 (256).
extern "C" __global__ void rms_norm_f32(const float* __restrict__ x,
                                        const float* __restrict__ weight,
                                        float* __restrict__ out, int cols, float eps) {
    __shared__ float scratch[32];
    const size_t r = blockIdx.x;
    const float* xr = x + r * cols;
    float* o = out + r * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        ss += xr[i] * xr[i];
    }
    ss = block_reduce(ss, OpSum(), 0.0f, scratch);
    const float scale = 1.0f / sqrtf(ss / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        o[i] = xr[i] * scale * weight[i];
    }
}

// Rotary embedding in place. x: [tokens, num_heads * head_dim]; positions: [tokens];
// cos, sin: [max_positions, head_dim / 2]. style 0 (Halves) rotates dimension i with
// i + head_dim/2, style 1 (Pairs) rotates 2i with 2i + 1; frequency i rotates pair i.
// Grid (tokens); any block size (128): threads stride over (head, pair).
extern "C" __global__ void rope_f32(float* __restrict__ x, const float* __restrict__ cos_table,
                                    const float* __restrict__ sin_table,
                                    const u32* __restrict__ positions, int num_heads,
                                    int head_dim, int style) {
    const size_t t = blockIdx.x;
    const int half = head_dim / 2;
    const size_t pos = positions[t];
    const float* c = cos_table + pos * half;
    const float* s = sin_table + pos * half;
    float* row = x + t * num_heads * head_dim;
    for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
        const int head = idx / half;
        const int i = idx - head * half;
        float* h = row + head * head_dim;
        const int ia = style == 0 ? i : 2 * i;
        const int ib = style == 0 ? i + half : 2 * i + 1;
        const float a = h[ia];
        const float b = h[ib];
        h[ia] = a * c[i] - b * s[i];
        h[ib] = b * c[i] + a * s[i];
    }
}

// out = silu(gate) * up = gate / (1 + e^-gate) * up, element-wise over n values.
// Any grid and block (grid-stride loop); e.g. block 256, grid min(ceil(n/256), 65535).
extern "C" __global__ void silu_mul_f32(const float* __restrict__ gate,
                                        const float* __restrict__ up, float* __restrict__ out,
                                        size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// x += y, element-wise over n values. Any grid and block (grid-stride loop).
extern "C" __global__ void add_assign_f32(float* __restrict__ x, const float* __restrict__ y,
                                          size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] += y[i];
    }
}

// out[i, :] = x[rows[i], :] (the step's logits rows).
// x: [_, cols]; rows: [n]; out: [n, cols]. Grid (n); any block size (256).
extern "C" __global__ void gather_rows_f32(const float* __restrict__ x,
                                           const u32* __restrict__ rows,
                                           float* __restrict__ out, int cols) {
    const size_t i = blockIdx.x;
    const float* src = x + (size_t)rows[i] * cols;
    float* dst = out + i * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        dst[c] = src[c];
    }
}

// Writes each token's K and V row into its slot of one layer's cache.
// k, v: [tokens, token_stride] with token_stride = num_kv_heads * head_dim;
// k_cache, v_cache: that layer's [num_blocks * block_size, token_stride] arrays (slot =
// block * block_size + offset); slot_mapping: [tokens].
// Grid (tokens); any block size (128).
extern "C" __global__ void write_kv_f32(const float* __restrict__ k, const float* __restrict__ v,
                                        float* __restrict__ k_cache,
                                        float* __restrict__ v_cache,
                                        const u32* __restrict__ slot_mapping,
                                        int token_stride) {
    const size_t t = blockIdx.x;
    const size_t dst = (size_t)slot_mapping[t] * token_stride;
    const size_t src = t * token_stride;
    for (int i = threadIdx.x; i < token_stride; i += blockDim.x) {
        k_cache[dst + i] = k[src + i];
        v_cache[dst + i] = v[src + i];
    }
}

// out[i] = x[i] rounded to bf16 (nearest even), element-wise over n values: the activation
// operand of a bf16 GEMM. Any grid and block (grid-stride loop).
extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, u16* __restrict__ out,
                                       size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = f32_to_bf16(x[i]);
    }
}
