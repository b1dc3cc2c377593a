/* cpu/conv_shift.c: the weight gradient of a 3x3, stride-1, pad-1
 * convolution without im2col, for CPUs with AVX2 and FMA (see conv.h).
 *
 * Why: the im2col reference writes nine shifted copies of every input
 * image, and OpenBLAS then copies them once more into its packed panels,
 * so on ResNet's 16-64 channel layers the weight gradient ran at about
 * 55 GFLOP/s against 95 for oneDNN's forward (bench_ops, 2 threads), and
 * was a third of a training step.
 *
 * How: pad each image once, to (H+2) x (W+2) per channel, and pad each
 * row of its output gradient dy with two zero columns, to H x (W+2). Then
 * for a filter tap (r, s) the input pixels that meet dy[k][oh][ow] sit at
 * one fixed offset, r * (W+2) + s, from dy's own position in the padded
 * row-major order, and
 *     dw[k][c][r][s] = sum over p of dy_pad[k][p] * x_pad[c][p + r*(W+2) + s]
 * is a dot product of two contiguous vectors (the zero columns of dy_pad
 * cancel the products that would wrap around a row). The kernel computes
 * these dot products for 4 output channels x the 3 taps of a filter row at
 * a time, eight lanes each, straight from the padded planes, which stay in
 * L1/L2.
 *
 * Determinism: as in the reference (cpu/conv_im2col.c), the images are cut
 * into at most FR_CONV_WEIGHT_GROUPS groups, each summed in image order
 * into its own partial, and the partials are added in group order; each
 * dot product's eight lanes are added in one fixed order. So the result
 * does not depend on the number of threads. It is not the reference's
 * bits (another summation order); tests/test_cpu_backends.c holds it to
 * the reference within float round-off. */
#include <stdint.h>
#include <string.h>

#include <omp.h>

#include "../tensor/memory.h"
#include "conv.h"
#include "isa.h"
#include "threads.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86_KERNEL 1
#include <immintrin.h>
#endif

enum { K_BLOCK = 4, LANES = 8 };

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/* c0..c2 += m * b0..b2: one row of a 4 x 3 register block (the kernels
 * below unroll their blocks by hand: GCC keeps an accumulator array in
 * memory) */
#define FMA_ROW3(c0, c1, c2, m, b0, b1, b2)  \
    do {                                     \
        __m256 m_ = (m);                     \
        c0 = _mm256_fmadd_ps(m_, b0, c0);    \
        c1 = _mm256_fmadd_ps(m_, b1, c1);    \
        c2 = _mm256_fmadd_ps(m_, b2, c2);    \
    } while (0)

bool fr_cpu_conv_shift_applies(const fr_conv_shape *s) {
#ifdef HAVE_X86_KERNEL
    fr_cpu_isa isa;
    bool cpu_ok = fr_cpu_isa_get(&isa) == FR_OK && isa >= FR_ISA_AVX2;
    return cpu_ok && s->r == 3 && s->s == 3 && s->stride == 1 && s->pad == 1 && s->oh == s->h &&
           s->ow == s->w && s->n > 0 && s->c > 0 && s->k > 0 && s->h > 0 && s->w > 0 &&
           fr_conv_groups(s) == 1 && fr_conv_dilation(s) == 1;
#else
    (void)s;
    return false;
#endif
}

#ifdef HAVE_X86_KERNEL

/* The geometry of one image's padded planes. */
typedef struct {
    int wp;       /* W + 2: a padded row */
    size_t len;   /* H * (W+2) rounded up to LANES: dot-product length */
    size_t x_ch;  /* floats per padded input channel (>= every read) */
    int kp;       /* output channels rounded up to K_BLOCK (the extra ones zero) */
} geometry;

static geometry geometry_of(const fr_conv_shape *s) {
    geometry g;
    g.wp = s->w + 2;
    g.len = round_up((size_t)s->h * (size_t)g.wp, LANES);
    /* the largest read is at offset 2*(W+2)+2 plus len; it also covers the
     * (H+2) x (W+2) plane itself */
    g.x_ch = round_up(g.len + 2 * (size_t)g.wp + 2, LANES);
    g.kp = (int)round_up((size_t)s->k, K_BLOCK);
    return g;
}

/* in (ins, H, W) -> inp (ins, x_ch): row i of channel c at (i+1)*(W+2) + 1,
 * everything else zero */
static void pad_input(float *inp, const float *in, int ins, const fr_conv_shape *s, const geometry *g) {
    memset(inp, 0, (size_t)ins * g->x_ch * sizeof *inp);
    for (int c = 0; c < ins; c++)
        for (int i = 0; i < s->h; i++)
            memcpy(inp + (size_t)c * g->x_ch + (size_t)(i + 1) * g->wp + 1,
                   in + ((size_t)c * s->h + i) * s->w, (size_t)s->w * sizeof(float));
}

/* x (C,H,W) -> xp (C, x_ch) as pad_input; dy (K,H,W) -> dyp (Kp, len): row
 * i of channel k at i*(W+2), everything else zero. */
static void pad_image(float *xp, float *dyp, const float *x, const float *dy, const fr_conv_shape *s,
                      const geometry *g) {
    pad_input(xp, x, s->c, s, g);
    memset(dyp, 0, (size_t)g->kp * g->len * sizeof *dyp);
    for (int k = 0; k < s->k; k++)
        for (int i = 0; i < s->h; i++)
            memcpy(dyp + (size_t)k * g->len + (size_t)i * g->wp, dy + ((size_t)k * s->h + i) * s->w,
                   (size_t)s->w * sizeof(float));
}

__attribute__((target("avx2,fma"))) static float lane_sum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 q = _mm_add_ps(lo, hi);                  /* 4 */
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));         /* 2 */
    q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 0x55)); /* 1 */
    return _mm_cvtss_f32(q);
}

/* part (K, C, 3, 3) += the weight gradient of `images` padded images (xp:
 * each C x x_ch floats, dyp: each Kp x len). Each dot product runs over all
 * of them before its lanes are added, so small planes (8x8: ten vectors an
 * image) do not pay a horizontal sum per image. */
__attribute__((target("avx2,fma"))) static void images_weight_grad(float *part, const float *xp,
                                                                  const float *dyp, int images,
                                                                  const fr_conv_shape *s,
                                                                  const geometry *g) {
    size_t x_img = (size_t)s->c * g->x_ch, dy_img = (size_t)g->kp * g->len;
    /* 4 output channels x the 3 taps of one filter row: the taps read the
     * same input row at offsets 0, 1, 2, so each step loads 4 dy and 3 x
     * vectors for 12 multiply-adds */
    for (int k0 = 0; k0 < g->kp; k0 += K_BLOCK)
        for (int c = 0; c < s->c; c++)
            for (int r = 0; r < 3; r++) {
                __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00,
                       a12 = a00, a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
                for (int im = 0; im < images; im++) {
                    const float *xr = xp + im * x_img + (size_t)c * g->x_ch + (size_t)r * g->wp;
                    const float *d0 = dyp + im * dy_img + (size_t)k0 * g->len, *d1 = d0 + g->len,
                                *d2 = d1 + g->len, *d3 = d2 + g->len;
                    for (size_t p = 0; p < g->len; p += LANES) {
                        __m256 v0 = _mm256_loadu_ps(xr + p), v1 = _mm256_loadu_ps(xr + p + 1),
                               v2 = _mm256_loadu_ps(xr + p + 2);
                        FMA_ROW3(a00, a01, a02, _mm256_loadu_ps(d0 + p), v0, v1, v2);
                        FMA_ROW3(a10, a11, a12, _mm256_loadu_ps(d1 + p), v0, v1, v2);
                        FMA_ROW3(a20, a21, a22, _mm256_loadu_ps(d2 + p), v0, v1, v2);
                        FMA_ROW3(a30, a31, a32, _mm256_loadu_ps(d3 + p), v0, v1, v2);
                    }
                }
                __m256 acc[K_BLOCK][3] = {
                    {a00, a01, a02}, {a10, a11, a12}, {a20, a21, a22}, {a30, a31, a32}};
                for (int i = 0; i < K_BLOCK && k0 + i < s->k; i++)
                    for (int t = 0; t < 3; t++)
                        part[(((size_t)(k0 + i) * s->c + c) * 3 + r) * 3 + t] += lane_sum(acc[i][t]);
            }
}

/* Images per chunk: as many as keep one block's rows (one input and K_BLOCK
 * output channels of every image in the chunk) within about 24 KiB, so that
 * the three filter rows reread them from L1. Depends on the shape only. */
static int chunk_images(const geometry *g) {
    size_t rows = (size_t)(1 + K_BLOCK) * g->x_ch * sizeof(float);
    size_t b = rows ? (24u << 10) / rows : 1;
    return b < 1 ? 1 : b > 16 ? 16 : (int)b;
}

fr_status fr_cpu_conv2d_backward_weight_shift(float *dw, const float *dy, const float *x,
                                              const fr_conv_shape *s) {
    if (!fr_cpu_conv_shift_applies(s))
        return fr_error(FR_ERR_ARG, "conv2d backward (weight): the shifted-plane kernel takes 3x3 "
                        "stride-1 pad-1 convolutions on AVX2+FMA CPUs only");
    geometry g = geometry_of(s);
    int groups = s->n < FR_CONV_WEIGHT_GROUPS ? s->n : FR_CONV_WEIGHT_GROUPS;
    int chunk = chunk_images(&g);
    int threads = fr_cpu_threads();
    if (threads > groups)
        threads = groups;
    size_t dw_len = (size_t)s->k * s->c * 9;
    size_t x_pad = (size_t)s->c * g.x_ch, dy_pad = (size_t)g.kp * g.len; /* one image */
    size_t scratch = (x_pad + dy_pad) * (size_t)chunk;                    /* per thread */
    size_t ws_bytes = (scratch * (size_t)threads + dw_len * (size_t)groups) * sizeof(float);
    float *ws = fr_mem_alloc(FR_CPU, ws_bytes, FR_TAG_WORKSPACE);
    if (!ws)
        return fr_last_status();
    float *parts = ws + scratch * (size_t)threads; /* (groups, K, C, 3, 3) */
    size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)s->k * s->h * s->w;
#pragma omp parallel num_threads(threads)
    {
        float *xp = ws + (size_t)omp_get_thread_num() * scratch;
        float *dyp = xp + x_pad * (size_t)chunk;
#pragma omp for schedule(static)
        for (int grp = 0; grp < groups; grp++) {
            float *part = parts + (size_t)grp * dw_len;
            memset(part, 0, dw_len * sizeof *part);
            int first = (int)((long long)s->n * grp / groups);
            int end = (int)((long long)s->n * (grp + 1) / groups);
            for (int n0 = first; n0 < end; n0 += chunk) {
                int images = end - n0 < chunk ? end - n0 : chunk;
                for (int i = 0; i < images; i++)
                    pad_image(xp + i * x_pad, dyp + i * dy_pad, x + (n0 + i) * x_img,
                              dy + (n0 + i) * y_img, s, &g);
                images_weight_grad(part, xp, dyp, images, s, &g);
            }
        }
        /* the implicit barrier above: every partial is complete */
#pragma omp for schedule(static)
        for (size_t i = 0; i < dw_len; i++) {
            float total = 0.0f;
            for (int grp = 0; grp < groups; grp++)
                total += parts[(size_t)grp * dw_len + i];
            dw[i] = total;
        }
    }
    fr_mem_free(FR_CPU, ws, ws_bytes, FR_TAG_WORKSPACE);
    return FR_OK;
}


/* ---- forward and backward (data): a direct 3x3 convolution ----
 *
 * out[o][p] = sum over i, r, t of wt[o][i][r][t] * in_pad[i][p + r*(W+2) + t]
 * over the same padded planes: 4 output channels x 3 vectors (24
 * positions of a padded row-major plane) a step, each tap's weight
 * broadcast, so 7 loads feed 12 multiply-adds. The backward (data) pass is
 * the same convolution of dy with the filter turned by 180 degrees and its
 * channel axes swapped. Each image is computed whole by one thread in one
 * fixed order (input channel, then tap), so an image's result depends
 * neither on its batch nor on the team size. */

/* wpk[o / 4][i][tap][o % 4]: the filter of `outs` x `ins` channels, from w
 * (K, C, 3, 3) as it is (forward: outs = K) or turned (backward data: outs
 * = C, wt[c][k][tap] = w[k][c][8 - tap]); zero for the padded outputs. */
static void pack_filter(float *wpk, const float *w, int outs, int ins, bool turned) {
    int outs_p = (int)round_up((size_t)outs, K_BLOCK);
    for (int o = 0; o < outs_p; o++)
        for (int i = 0; i < ins; i++)
            for (int tap = 0; tap < 9; tap++) {
                float v = 0.0f;
                if (o < outs)
                    v = turned ? w[((size_t)i * outs + o) * 9 + (8 - tap)] : w[((size_t)o * ins + i) * 9 + tap];
                wpk[(((size_t)(o / K_BLOCK) * ins + i) * 9 + tap) * K_BLOCK + o % K_BLOCK] = v;
            }
}

__attribute__((target("avx2,fma"))) static inline void store_row3(float *o, __m256 a, __m256 b,
                                                                 __m256 c) {
    _mm256_storeu_ps(o, a);
    _mm256_storeu_ps(o + 8, b);
    _mm256_storeu_ps(o + 16, c);
}

/* Three vectors of positions from p0 (24 positions), output channels
 * o0..o0+3. */
__attribute__((target("avx2,fma"))) static void direct_step_3(float *outp, const float *inp,
                                                             const float *wk, int ins, size_t p0,
                                                             const geometry *g) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00,
           a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    for (int i = 0; i < ins; i++) {
        const float *row = inp + (size_t)i * g->x_ch + p0, *wi = wk + (size_t)i * 9 * K_BLOCK;
        for (int r = 0; r < 3; r++)
            for (int t = 0; t < 3; t++) {
                const float *src = row + (size_t)r * g->wp + t, *wt = wi + (r * 3 + t) * K_BLOCK;
                __m256 x0 = _mm256_loadu_ps(src), x1 = _mm256_loadu_ps(src + 8),
                       x2 = _mm256_loadu_ps(src + 16);
                FMA_ROW3(a00, a01, a02, _mm256_broadcast_ss(wt), x0, x1, x2);
                FMA_ROW3(a10, a11, a12, _mm256_broadcast_ss(wt + 1), x0, x1, x2);
                FMA_ROW3(a20, a21, a22, _mm256_broadcast_ss(wt + 2), x0, x1, x2);
                FMA_ROW3(a30, a31, a32, _mm256_broadcast_ss(wt + 3), x0, x1, x2);
            }
    }
    float *o = outp + p0;
    store_row3(o, a00, a01, a02);
    store_row3(o + g->len, a10, a11, a12);
    store_row3(o + 2 * g->len, a20, a21, a22);
    store_row3(o + 3 * g->len, a30, a31, a32);
}

/* The same for one vector (the plane's last one or two). */
__attribute__((target("avx2,fma"))) static void direct_step_1(float *outp, const float *inp,
                                                             const float *wk, int ins, size_t p0,
                                                             const geometry *g) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < ins; i++) {
        const float *row = inp + (size_t)i * g->x_ch + p0, *wi = wk + (size_t)i * 9 * K_BLOCK;
        for (int r = 0; r < 3; r++)
            for (int t = 0; t < 3; t++) {
                const float *wt = wi + (r * 3 + t) * K_BLOCK;
                __m256 x = _mm256_loadu_ps(row + (size_t)r * g->wp + t);
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(wt), x, a0);
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(wt + 1), x, a1);
                a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(wt + 2), x, a2);
                a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(wt + 3), x, a3);
            }
    }
    _mm256_storeu_ps(outp + p0, a0);
    _mm256_storeu_ps(outp + g->len + p0, a1);
    _mm256_storeu_ps(outp + 2 * g->len + p0, a2);
    _mm256_storeu_ps(outp + 3 * g->len + p0, a3);
}

/* out (outs, H, W) of one image from its padded input */
static void direct_image(float *out, float *outp, const float *inp, const float *wpk, int outs,
                         int ins, const fr_conv_shape *s, const geometry *g) {
    int outs_p = (int)round_up((size_t)outs, K_BLOCK);
    size_t full = g->len / (3 * LANES) * (3 * LANES);
    for (int o0 = 0; o0 < outs_p; o0 += K_BLOCK) {
        const float *wk = wpk + (size_t)(o0 / K_BLOCK) * ins * 9 * K_BLOCK;
        float *op = outp + (size_t)o0 * g->len;
        for (size_t p0 = 0; p0 < full; p0 += 3 * LANES)
            direct_step_3(op, inp, wk, ins, p0, g);
        for (size_t p0 = full; p0 < g->len; p0 += LANES)
            direct_step_1(op, inp, wk, ins, p0, g);
    }
    for (int o = 0; o < outs; o++)
        for (int i = 0; i < s->h; i++)
            memcpy(out + ((size_t)o * s->h + i) * s->w, outp + (size_t)o * g->len + (size_t)i * g->wp,
                   (size_t)s->w * sizeof(float));
}

static fr_status direct(float *out, const float *in, const float *w, int outs, int ins, bool turned,
                        const fr_conv_shape *s, const char *what) {
    if (!fr_cpu_conv_shift_applies(s))
        return fr_error(FR_ERR_ARG, "conv2d %s: the shifted-plane kernel takes 3x3 stride-1 pad-1 "
                        "convolutions on AVX2+FMA CPUs only", what);
    geometry g = geometry_of(s);
    int outs_p = (int)round_up((size_t)outs, K_BLOCK);
    int threads = fr_cpu_threads();
    if (threads > s->n)
        threads = s->n;
    size_t wpk_len = (size_t)outs_p * ins * 9;
    size_t scratch = (size_t)ins * g.x_ch + (size_t)outs_p * g.len; /* per thread */
    size_t ws_bytes = (wpk_len + scratch * (size_t)threads) * sizeof(float);
    float *ws = fr_mem_alloc(FR_CPU, ws_bytes, FR_TAG_WORKSPACE);
    if (!ws)
        return fr_last_status();
    pack_filter(ws, w, outs, ins, turned);
    size_t in_img = (size_t)ins * s->h * s->w, out_img = (size_t)outs * s->h * s->w;
#pragma omp parallel num_threads(threads)
    {
        float *inp = ws + wpk_len + (size_t)omp_get_thread_num() * scratch;
        float *outp = inp + (size_t)ins * g.x_ch;
#pragma omp for schedule(static)
        for (int n = 0; n < s->n; n++) {
            pad_input(inp, in + n * in_img, ins, s, &g);
            direct_image(out + n * out_img, outp, inp, ws, outs, ins, s, &g);
        }
    }
    fr_mem_free(FR_CPU, ws, ws_bytes, FR_TAG_WORKSPACE);
    return FR_OK;
}

fr_status fr_cpu_conv2d_forward_shift(float *y, const float *x, const float *w, const fr_conv_shape *s) {
    return direct(y, x, w, s->k, s->c, false, s, "forward");
}

fr_status fr_cpu_conv2d_backward_data_shift(float *dx, const float *dy, const float *w,
                                            const fr_conv_shape *s) {
    return direct(dx, dy, w, s->c, s->k, true, s, "backward (data)");
}

#else /* no x86 kernel: never applies */

fr_status fr_cpu_conv2d_backward_weight_shift(float *dw, const float *dy, const float *x,
                                              const fr_conv_shape *s) {
    (void)dw;
    (void)dy;
    (void)x;
    (void)s;
    return fr_error(FR_ERR_ARG, "conv2d backward (weight): no shifted-plane kernel in this build");
}

fr_status fr_cpu_conv2d_forward_shift(float *y, const float *x, const float *w, const fr_conv_shape *s) {
    (void)y;
    (void)x;
    (void)w;
    (void)s;
    return fr_error(FR_ERR_ARG, "conv2d forward: no shifted-plane kernel in this build");
}

fr_status fr_cpu_conv2d_backward_data_shift(float *dx, const float *dy, const float *w,
                                            const fr_conv_shape *s) {
    (void)dx;
    (void)dy;
    (void)w;
    (void)s;
    return fr_error(FR_ERR_ARG, "conv2d backward (data): no shifted-plane kernel in this build");
}

#endif
