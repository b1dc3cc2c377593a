/* compress.cu: the GPU twin of cpu/compress.c (kernels.def: compress_pack,
 * compress_unpack, sign_pack, sign_unpack, sign_act_backward). One block of FR_COMPRESS_GROUP
 * threads per group; the same float steps as the CPU, spelt with _rn
 * intrinsics so nvcc contracts nothing into an FMA, and the same
 * counter-based uniform (kernels.h), so CPU and GPU write the same codes. */
#include "internal.h"

#define GROUP FR_COMPRESS_GROUP
static_assert(GROUP == FR_CUDA_THREADS, "one thread per element of a group");

__global__ void compress_pack_kernel(uint8_t *packed, const float *x, int bits, uint64_t seed,
                                     size_t n, size_t groups) {
    __shared__ float sh[GROUP];
    __shared__ uint8_t c[GROUP];
    float *hdr = (float *)(void *)packed;
    uint8_t *codes = packed + groups * 2 * sizeof(float);
    size_t code_bytes = (size_t)GROUP * (size_t)bits / 8;
    unsigned top = (1u << bits) - 1;
    unsigned t = threadIdx.x;
    for (size_t g = blockIdx.x; g < groups; g += gridDim.x) {
        size_t base = g * GROUP, i = base + t;
        bool in = i < n;
        float v = in ? x[i] : x[base];
        float bad = fr_block_max<GROUP>(isfinite(v) ? 0.0f : 1.0f, sh);
        float hi = fr_block_max<GROUP>(v, sh);
        float lo = -fr_block_max<GROUP>(-v, sh);
        float range = __fsub_rn(hi, lo);
        uint8_t *out = codes + g * code_bytes;
        if (bad > 0.0f || !isfinite(range)) {
            if (t == 0)
                hdr[2 * g] = hdr[2 * g + 1] = nanf("");
            if (t < code_bytes)
                out[t] = 0;
            continue;
        }
        float inv = range > 0.0f ? __fdiv_rn((float)top, range) : 0.0f;
        if (t == 0) {
            hdr[2 * g] = lo;
            hdr[2 * g + 1] = __fdiv_rn(range, (float)top);
        }
        unsigned k = 0;
        if (in) {
            float q = __fadd_rn(__fmul_rn(__fsub_rn(v, lo), inv),
                                fr_compress_uniform(fr_compress_key(seed, g), t));
            k = (unsigned)(int)q;
            k = k > top ? top : k;
        }
        c[t] = (uint8_t)k;
        __syncthreads();
        if (bits == 8)
            out[t] = c[t];
        else if (bits == 4 && t < GROUP / 2)
            out[t] = (uint8_t)(c[2 * t] | c[2 * t + 1] << 4);
        else if (bits == 2 && t < GROUP / 4)
            out[t] = (uint8_t)(c[4 * t] | c[4 * t + 1] << 2 | c[4 * t + 2] << 4 | c[4 * t + 3] << 6);
        __syncthreads(); /* c is rewritten by the next group */
    }
}

__global__ void compress_unpack_kernel(float *x, const uint8_t *packed, int bits, size_t n,
                                       size_t groups) {
    const float *hdr = (const float *)(const void *)packed;
    const uint8_t *codes = packed + groups * 2 * sizeof(float);
    size_t code_bytes = (size_t)GROUP * (size_t)bits / 8;
    FR_CUDA_FOR(i, n) {
        size_t g = i / GROUP, j = i % GROUP;
        const uint8_t *in = codes + g * code_bytes;
        unsigned k = bits == 8   ? in[j]
                     : bits == 4 ? (in[j >> 1] >> ((j & 1) * 4)) & 15u
                                 : (in[j >> 2] >> ((j & 3) * 2)) & 3u;
        x[i] = __fadd_rn(hdr[2 * g], __fmul_rn((float)k, hdr[2 * g + 1]));
    }
}

extern "C" fr_status fr_cuda_compress_pack(uint8_t *packed, const float *x, int bits,
                                           uint64_t seed, size_t n) {
    size_t groups = (n + GROUP - 1) / GROUP;
    if (groups == 0)
        return FR_OK;
    unsigned grid = groups > FR_CUDA_MAX_BLOCKS ? FR_CUDA_MAX_BLOCKS : (unsigned)groups;
    compress_pack_kernel<<<grid, GROUP>>>(packed, x, bits, seed, n, groups);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

extern "C" fr_status fr_cuda_compress_unpack(float *x, const uint8_t *packed, int bits, size_t n) {
    FR_CUDA_RUN_1D(compress_unpack_kernel, n, x, packed, bits, n, (n + GROUP - 1) / GROUP);
}

__global__ void sign_pack_kernel(uint8_t *mask, const float *x, size_t n, size_t bytes) {
    FR_CUDA_FOR(j, bytes) {
        unsigned b = 0;
        for (size_t k = 0; k < 8 && j * 8 + k < n; k++)
            b |= (unsigned)(x[j * 8 + k] > 0.0f) << k;
        mask[j] = (uint8_t)b;
    }
}

__global__ void sign_unpack_kernel(float *y, const uint8_t *mask, size_t n) {
    FR_CUDA_FOR(i, n) y[i] = (float)((mask[i >> 3] >> (i & 7)) & 1u);
}

extern "C" fr_status fr_cuda_sign_pack(uint8_t *mask, const float *x, size_t n) {
    size_t bytes = fr_sign_nbytes(n);
    FR_CUDA_RUN_1D(sign_pack_kernel, bytes, mask, x, n, bytes);
}

extern "C" fr_status fr_cuda_sign_unpack(float *y, const uint8_t *mask, size_t n) {
    FR_CUDA_RUN_1D(sign_unpack_kernel, n, y, mask, n);
}

/* sign_act_backward: the bits of fr_act_grad_RELU / fr_act_grad_LEAKY_RELU
 * over the unpacked mask (the product with __fmul_rn, as the CPU rounds it),
 * read from the bits; dx may be dy (each thread reads its element first). */
__global__ void sign_act_backward_kernel(float *dx, const float *dy, const uint8_t *mask,
                                         bool leaky, float slope, size_t n) {
    FR_CUDA_FOR(i, n) {
        float g = dy[i];
        dx[i] = (mask[i >> 3] >> (i & 7)) & 1u ? g : leaky ? __fmul_rn(g, slope) : 0.0f;
    }
}

extern "C" fr_status fr_cuda_sign_act_backward(float *dx, const float *dy, const uint8_t *mask,
                                               fr_act act, float slope, size_t n) {
    FR_CUDA_RUN_1D(sign_act_backward_kernel, n, dx, dy, mask, act == FR_ACT_LEAKY_RELU, slope, n);
}
