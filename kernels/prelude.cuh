// Helpers shared by every kernel source. ballast-kernels prepends this file to each source
// before handing it to NVRTC (cudarc passes NVRTC no headers, and NVRTC ships none of ours),
// followed by a `#line` directive so compiler messages name the right file and line.
//
// Nothing here may include a header: NVRTC is used without the CUDA toolkit installed.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define NEG_INF (__int_as_float(0xff800000))
#define FULL_MASK 0xffffffffu

// bf16 is the top half of an f32: widening is exact.
__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (u16)(x >> 16);
}

struct OpSum {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct OpMax {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct OpMin {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? a : b; }
};

template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T v, Op op) {
    for (int o = 16; o > 0; o >>= 1) {
        v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
    }
    return v;
}

// Reduces one value per thread over the whole block and returns the result to every thread.
// blockDim.x must be a multiple of 32 (at most 1024); `scratch` holds 32 values. Every thread
// of the block must call it (it synchronises).
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    v = warp_reduce(v, op);
    __syncthreads(); // `scratch` may still be read by an earlier call
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    T r = lane < warps ? scratch[lane] : identity;
    return warp_reduce(r, op);
}

// The engine's `SeqSlice`: five u32 per sequence, in its field order.
struct SeqSlice {
    u32 query_start;
    u32 query_len;
    u32 context_len;
    u32 block_table_start;
    u32 block_table_len;
};

__device__ __forceinline__ SeqSlice load_seq(const u32* seqs, int i) {
    const u32* p = seqs + 5 * (size_t)i;
    SeqSlice s;
    s.query_start = p[0];
    s.query_len = p[1];
    s.context_len = p[2];
    s.block_table_start = p[3];
    s.block_table_len = p[4];
    return s;
}
