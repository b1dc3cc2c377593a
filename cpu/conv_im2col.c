/* cpu/conv_im2col.c: the reference 2-d convolution (any dilation; groups
 * through per-group copies, at the end) on the host,
 * forward and both backward passes, as column matrices and GEMM. It runs
 * when frugal is built without oneDNN, for shapes oneDNN has no kernel for,
 * and under fr_cpu_conv_set_backend(FR_CPU_CONV_IM2COL); tests/test_conv.c
 * checks the oneDNN path (cpu/conv_dnnl.c) against it.
 *
 * A column matrix unrolls every receptive field of a band of output rows of
 * one image into a column: col (C*R*S, P), P = rows * OW. Then
 *   forward     y(K, P)        = w(K, CRS)     col(CRS, P)
 *   bwd_data    dcol(CRS, P)   = w^T(CRS, K)   dy(K, P),  then col2im into dx
 *   bwd_weight  dw^T(CRS, K)  += col(CRS, P)   dy^T(P, K)
 * where y / dy are the image's (K, OH*OW) block read or written in place
 * (row stride OH*OW), so nothing is gathered or scattered.
 *
 * Parallelism is over images and bands (bwd_weight: over fixed groups of
 * them, FR_CONV_WEIGHT_GROUPS): each OpenMP thread unrolls its own band into its
 * own column buffer and runs a single-threaded GEMM on it (fr_cpu_gemm_serial). The
 * buffer is written and read back by the same core while it sits in that
 * core's cache (a CIFAR image's columns are at most 576 KiB), there is no
 * barrier between unrolling and multiplying, and no second thread pool
 * competes for the cores. No result depends on the scheduling or the team
 * size, and fwd / bwd_data results of an image not on the batch size.
 *
 * A 1x1 stride-1 unpadded convolution needs no column matrix: an image's
 * (C, H*W) block already is one. A size-keeping stride-1 convolution (3x3
 * pad 1) computes bwd_data as a forward pass instead (bwd_data_as_forward). */
#include <omp.h>
#include <string.h>

#include "../tensor/kernels.h"
#include "../tensor/memory.h"
#include "conv.h"
#include "threads.h"

typedef float fr_v8 __attribute__((vector_size(32)));

/* Column-matrix bytes per thread. Bands are cut so one band's columns stay
 * within this, which keeps them in L2 / L3 between unrolling and GEMM while
 * leaving the GEMM hundreds of columns wide. All threads together stay
 * within CONV_WS_TOTAL (many-core machines get narrower bands). */
#define CONV_COL_BUDGET ((size_t)2 << 20)
#define CONV_WS_TOTAL ((size_t)32 << 20)

/* At most this many columns (output pixels) per band of fwd / bwd_data
 * (bwd_weight's col * dy^T, depth = columns, does not mind wide bands). OpenBLAS's
 * single-threaded sgemm with the few rows of a CIFAR conv (K = 16..64) drops
 * from ~105 to ~50 GFLOP/s once N passes ~400 (measured here, 16 x N x 144:
 * 107 at N = 256, 65 at 512, 50 at 1024), so a 32x32 image is cut into
 * bands of 8 rows rather than multiplied whole. */
#define CONV_MAX_COLS ((size_t)256)

typedef struct {
    int rows;      /* output rows per band (the last band may have fewer) */
    int bands;     /* bands per image */
    size_t cols;   /* P of a full band: rows * OW */
    int threads;   /* upper bound on the team size */
} conv_plan;

/* An image is cut into the same bands whatever the batch size and, up to
 * CONV_WS_TOTAL / CONV_COL_BUDGET = 16 threads, whatever the team size, so
 * its results do not depend on either (docs/ARCHITECTURE.md, "CPU
 * convolution and GEMM"); with fewer images than threads some threads wait. */
static conv_plan plan_bands(const fr_conv_shape *s, size_t max_cols) {
    conv_plan p;
    p.threads = fr_cpu_threads();
    size_t per_row = (size_t)s->c * s->r * s->s * s->ow * sizeof(float);
    size_t budget = CONV_WS_TOTAL / (size_t)p.threads;
    if (budget > CONV_COL_BUDGET)
        budget = CONV_COL_BUDGET;
    size_t rows = per_row ? budget / per_row : (size_t)s->oh;
    if (s->ow > 0 && rows > max_cols / (size_t)s->ow)
        rows = max_cols / (size_t)s->ow;
    if (rows < 1)
        rows = 1;
    if (rows > (size_t)s->oh)
        rows = (size_t)(s->oh > 0 ? s->oh : 1);
    int bands = s->oh > 0 ? (s->oh + (int)rows - 1) / (int)rows : 1;
    p.rows = (int)rows;
    p.bands = bands;
    p.cols = rows * (size_t)s->ow;
    return p;
}

/* Output column ow reads input column ow * stride - pad + kx; the range
 * [lo, hi) of ow for which that lies inside [0, W). Likewise for rows. */
static void valid_range(int size, int out, int stride, int pad, int k, int *lo, int *hi) {
    int first = pad - k, last = size - 1 + pad - k; /* ow * stride must lie in [first, last] */
    int a = first <= 0 ? 0 : (first + stride - 1) / stride;
    int b = last < 0 ? 0 : last / stride + 1;
    *lo = a > out ? out : a;
    *hi = b > out ? out : b < *lo ? *lo : b;
}

/* d += s over n floats, eight at a time (the compiler does not vectorise
 * this at -O2 on its own). */
static void add_into(float *restrict d, const float *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        fr_v8 a, b;
        memcpy(&a, d + i, sizeof a);
        memcpy(&b, s + i, sizeof b);
        a += b;
        memcpy(d + i, &a, sizeof a);
    }
    for (; i < n; i++)
        d[i] += s[i];
}

/* A stride-1 convolution that keeps the width (OW == W, i.e. 2 * pad ==
 * S - 1, the usual 3x3 pad 1) maps a run of output rows onto a run of input
 * rows shifted by kx - pad elements: one contiguous copy per kernel tap,
 * with only the few wrapped-around edge columns to fix. This is what makes
 * im2col and col2im cheap on 8-pixel-wide CIFAR layers, where per-row copies
 * would be dominated by call overhead. */
static bool same_width(const fr_conv_shape *s) { return s->stride == 1 && s->ow == s->w; }

/* Sets columns [0, lo) and [hi, OW) of a (rows, OW) block to zero. Column
 * by column, because there are only `pad` of them. */
static void zero_edges(float *d, int rows, int ow, int lo, int hi) {
    for (int j = 0; j < lo; j++)
        for (int r = 0; r < rows; r++)
            d[(size_t)r * ow + j] = 0.0f;
    for (int j = hi; j < ow; j++)
        for (int r = 0; r < rows; r++)
            d[(size_t)r * ow + j] = 0.0f;
}

/* Stride-2 rows, which GCC leaves scalar at -O2 and which then took longer
 * than the GEMM around them. Both work on whole output rows, padding lanes
 * included, eight outputs (sixteen inputs) at a time; `avail` is how many
 * floats of the image lie at and after the input pointer, and no access goes
 * beyond them (a lane outside the image is a padding lane: read as zero,
 * never written). */
typedef int fr_v8i __attribute__((vector_size(32)));
#if defined(__clang__)
#define FR_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define FR_SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (fr_v8i){__VA_ARGS__})
#endif

/* d[j] = sp[2 j] for j < n. */
static void copy_even(float *restrict d, const float *restrict sp, int n, ptrdiff_t avail) {
    int j = 0;
    for (; j + 8 <= n && 2 * j + 16 <= avail; j += 8) {
        fr_v8 a, b;
        memcpy(&a, sp + 2 * j, sizeof a);
        memcpy(&b, sp + 2 * j + 8, sizeof b);
        fr_v8 e = FR_SHUFFLE(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
        memcpy(d + j, &e, sizeof e);
    }
    for (; j < n; j++)
        d[j] = 2 * j < avail ? sp[2 * j] : 0.0f;
}

/* dp[2 j] += s[j] for j < n; the odd lanes between get + 0. */
static void add_even(float *restrict dp, const float *restrict s, int n, ptrdiff_t avail) {
    int j = 0;
    const fr_v8 zero = {0};
    for (; j + 8 <= n && 2 * j + 16 <= avail; j += 8) {
        fr_v8 a, b, v;
        memcpy(&a, dp + 2 * j, sizeof a);
        memcpy(&b, dp + 2 * j + 8, sizeof b);
        memcpy(&v, s + j, sizeof v);
        a += FR_SHUFFLE(v, zero, 0, 8, 1, 8, 2, 8, 3, 8);
        b += FR_SHUFFLE(v, zero, 4, 8, 5, 8, 6, 8, 7, 8);
        memcpy(dp + 2 * j, &a, sizeof a);
        memcpy(dp + 2 * j + 8, &b, sizeof b);
    }
    for (; j < n && 2 * j < avail; j++)
        dp[2 * j] += s[j];
}

/* col (CRS, rows*OW) from output rows [oh0, oh0+rows) of image x (C, H, W). */
static void im2col(float *col, const float *x, const fr_conv_shape *s, int oh0, int rows) {
    size_t cols = (size_t)rows * s->ow;
    int dil = fr_conv_dilation(s);
    ptrdiff_t x_len = (ptrdiff_t)s->c * s->h * s->w;
    for (int c = 0; c < s->c; c++)
        for (int ky = 0; ky < s->r; ky++) {
            const float *plane = x + (size_t)c * s->h * s->w; // (H, W)
            int ra, rb;
            valid_range(s->h, s->oh, s->stride, s->pad, ky * dil, &ra, &rb);
            ra = ra < oh0 ? oh0 : ra > oh0 + rows ? oh0 + rows : ra;
            rb = rb > oh0 + rows ? oh0 + rows : rb < ra ? ra : rb;
            for (int kx = 0; kx < s->s; kx++) {
                float *dst = col + ((size_t)(c * s->r + ky) * s->s + kx) * cols; // (rows, OW)
                int lo, hi;
                valid_range(s->w, s->ow, s->stride, s->pad, kx * dil, &lo, &hi);
                /* rows whose input row is padding */
                memset(dst, 0, (size_t)(ra - oh0) * s->ow * sizeof *dst);
                memset(dst + (size_t)(rb - oh0) * s->ow, 0,
                       (size_t)(oh0 + rows - rb) * s->ow * sizeof *dst);
                if (rb == ra)
                    continue;
                float *d = dst + (size_t)(ra - oh0) * s->ow;
                const float *src = plane + (size_t)(ra * s->stride - s->pad + ky * dil) * s->w;
                if (same_width(s)) {
                    ptrdiff_t shift = kx * dil - s->pad;
                    size_t len = (size_t)(rb - ra) * s->ow;
                    size_t j0 = shift < 0 ? (size_t)-shift : 0, j1 = shift > 0 ? len - shift : len;
                    memcpy(d + j0, src + j0 + shift, (j1 - j0) * sizeof *d);
                    zero_edges(d, rb - ra, s->ow, lo, hi);
                    continue;
                }
                for (int oh = ra; oh < rb; oh++, d += s->ow, src += (size_t)s->stride * s->w) {
                    /* Stride 2: the whole row, padding columns included, when
                     * their reads stay inside the image (all but the first
                     * row and column of the image): the padding lanes hold
                     * neighbouring pixels and are zeroed after. */
                    ptrdiff_t off = (src - x) - s->pad + kx * dil;
                    if (s->stride == 2 && off >= 0) {
                        copy_even(d, x + off, s->ow, x_len - off);
                        zero_edges(d, 1, s->ow, lo, hi);
                        continue;
                    }
                    for (int ow = 0; ow < lo; ow++)
                        d[ow] = 0.0f;
                    const float *sp = src + lo * s->stride - s->pad + kx * dil;
                    for (int ow = lo; ow < hi; ow++)
                        d[ow] = sp[(size_t)(ow - lo) * s->stride];
                    for (int ow = hi; ow < s->ow; ow++)
                        d[ow] = 0.0f;
                }
            }
        }
}

/* Adds col (CRS, rows*OW) back onto image dx (C, H, W). Entries that belong
 * to padding are discarded; the same-width path zeroes them in col first
 * (col is scratch) so each tap can be added as one contiguous run. */
static void col2im(float *dx, float *col, const fr_conv_shape *s, int oh0, int rows) {
    size_t cols = (size_t)rows * s->ow;
    int dil = fr_conv_dilation(s);
    ptrdiff_t dx_len = (ptrdiff_t)s->c * s->h * s->w;
    for (int c = 0; c < s->c; c++)
        for (int ky = 0; ky < s->r; ky++) {
            float *plane = dx + (size_t)c * s->h * s->w; // (H, W)
            int ra, rb;
            valid_range(s->h, s->oh, s->stride, s->pad, ky * dil, &ra, &rb);
            ra = ra < oh0 ? oh0 : ra > oh0 + rows ? oh0 + rows : ra;
            rb = rb > oh0 + rows ? oh0 + rows : rb < ra ? ra : rb;
            if (rb == ra)
                continue;
            for (int kx = 0; kx < s->s; kx++) {
                float *src = col + ((size_t)(c * s->r + ky) * s->s + kx) * cols +
                             (size_t)(ra - oh0) * s->ow; // (rb - ra, OW)
                float *d = plane + (size_t)(ra * s->stride - s->pad + ky * dil) * s->w;
                int lo, hi;
                valid_range(s->w, s->ow, s->stride, s->pad, kx * dil, &lo, &hi);
                if (same_width(s)) {
                    ptrdiff_t shift = kx * dil - s->pad;
                    size_t len = (size_t)(rb - ra) * s->ow;
                    size_t j0 = shift < 0 ? (size_t)-shift : 0, j1 = shift > 0 ? len - shift : len;
                    zero_edges(src, rb - ra, s->ow, lo, hi);
                    add_into(d + j0 + shift, src + j0, j1 - j0);
                    continue;
                }
                for (int oh = ra; oh < rb; oh++, src += s->ow, d += (size_t)s->stride * s->w) {
                    ptrdiff_t off = (d - dx) - s->pad + kx * dil; /* as in im2col */
                    if (s->stride == 2 && off >= 0) {
                        zero_edges(src, 1, s->ow, lo, hi);
                        add_even(dx + off, src, s->ow, dx_len - off);
                        continue;
                    }
                    float *dp = d + lo * s->stride - s->pad + kx * dil;
                    for (int ow = lo; ow < hi; ow++)
                        dp[(size_t)(ow - lo) * s->stride] += src[ow];
                }
            }
        }
}

static bool is_pointwise(const fr_conv_shape *s) {
    return s->r == 1 && s->s == 1 && s->stride == 1 && s->pad == 0;
}

/* Workspace for `threads` column buffers of plan->cols columns, plus
 * `extra` floats per thread. */
static float *ws_alloc(const fr_conv_shape *s, const conv_plan *p, size_t extra, size_t *bytes) {
    size_t per_thread = (size_t)s->c * s->r * s->s * p->cols + extra;
    *bytes = per_thread * (size_t)p->threads * sizeof(float);
    return fr_mem_alloc(FR_CPU, *bytes, FR_TAG_WORKSPACE);
}

/* A worker thread's failure: its message is in that thread's error slot, so
 * the calling thread reports it again in its own. */
static fr_status worker_failed(fr_status st, const char *what, const fr_conv_shape *s) {
    return fr_error(st, "conv2d %s: a worker thread failed (%s) for input (%d, %d, %d, %d), "
                        "weight (%d, %d, %d, %d)",
                    what, fr_status_name(st), s->n, s->c, s->h, s->w, s->k, s->c, s->r, s->s);
}

static fr_status dense_forward(float *y, const float *x, const float *w, const fr_conv_shape *s) {
    int crs = s->c * s->r * s->s, ohw = s->oh * s->ow;
    size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)s->k * ohw;
    fr_status failed = FR_OK;
    if (is_pointwise(s)) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < s->n; n++) {
            fr_status st = fr_cpu_gemm_serial(y + n * y_img, ohw, w, s->c, x + n * x_img, ohw, s->k,
                                              ohw, s->c, false, false, 1.0f, 0.0f);
            if (st != FR_OK) {
#pragma omp atomic write
                failed = st;
            }
        }
        return failed == FR_OK ? FR_OK : worker_failed(failed, "forward", s);
    }
    conv_plan p = plan_bands(s, CONV_MAX_COLS);
    size_t ws_bytes;
    float *ws = ws_alloc(s, &p, 0, &ws_bytes);
    if (!ws)
        return fr_last_status();
    int units = s->n * p.bands;
#pragma omp parallel num_threads(p.threads)
    {
        float *col = ws + (size_t)omp_get_thread_num() * crs * p.cols; // (CRS, P)
#pragma omp for schedule(static)
        for (int u = 0; u < units; u++) {
            int n = u / p.bands, oh0 = u % p.bands * p.rows;
            int rows = s->oh - oh0 < p.rows ? s->oh - oh0 : p.rows;
            im2col(col, x + n * x_img, s, oh0, rows);
            fr_status st = fr_cpu_gemm_serial(y + n * y_img + (size_t)oh0 * s->ow, ohw, w, crs, col,
                                              rows * s->ow, s->k, rows * s->ow, crs, false, false,
                                              1.0f, 0.0f);
            if (st != FR_OK) {
#pragma omp atomic write
                failed = st;
            }
        }
    }
    fr_mem_free(FR_CPU, ws, ws_bytes, FR_TAG_WORKSPACE);
    return failed == FR_OK ? FR_OK : worker_failed(failed, "forward", s);
}

/* A stride-1 convolution whose output keeps the input's size (pad =
 * (R-1)/2 = (S-1)/2) has a gradient of the same kind: dx is the forward
 * convolution of dy with the weights swapped (K <-> C) and rotated by 180
 * degrees, padded by R-1-pad = pad. Running it as a forward pass replaces
 * the depth-K GEMM and the col2im scatter-add of the general path with the
 * forward's im2col and a GEMM of depth K*R*S (16->16 channels at 32x32,
 * batch 64, one core: 5.3 -> 4.0 ms). */
static bool is_flippable(const fr_conv_shape *s) {
    return s->stride == 1 && s->r == s->s && s->r == 2 * s->pad + 1 && s->oh == s->h &&
           s->ow == s->w && fr_conv_dilation(s) == 1;
}

static fr_status bwd_data_as_forward(float *dx, const float *dy, const float *w,
                                     const fr_conv_shape *s) {
    size_t len = (size_t)s->k * s->c * s->r * s->s, rs = (size_t)s->r * s->s;
    size_t bytes = len * sizeof(float);
    float *wt = fr_mem_alloc(FR_CPU, bytes, FR_TAG_WORKSPACE); // (C, K, R, S)
    if (!wt)
        return fr_last_status();
    for (int k = 0; k < s->k; k++)
        for (int c = 0; c < s->c; c++) {
            const float *src = w + ((size_t)k * s->c + c) * rs;
            float *dst = wt + ((size_t)c * s->k + k) * rs;
            for (size_t i = 0; i < rs; i++)
                dst[i] = src[rs - 1 - i];
        }
    fr_conv_shape t = *s;
    t.c = s->k;
    t.k = s->c;
    fr_status st = dense_forward(dx, dy, wt, &t);
    fr_mem_free(FR_CPU, wt, bytes, FR_TAG_WORKSPACE);
    return st;
}

static fr_status dense_backward_data(float *dx, const float *dy, const float *w,
                                     const fr_conv_shape *s) {
    int crs = s->c * s->r * s->s, ohw = s->oh * s->ow;
    size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)s->k * ohw;
    fr_status failed = FR_OK;
    if (is_pointwise(s)) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < s->n; n++) {
            fr_status st = fr_cpu_gemm_serial(dx + n * x_img, ohw, w, s->c, dy + n * y_img, ohw,
                                              s->c, ohw, s->k, true, false, 1.0f, 0.0f);
            if (st != FR_OK) {
#pragma omp atomic write
                failed = st;
            }
        }
        return failed == FR_OK ? FR_OK : worker_failed(failed, "backward (data)", s);
    }
    if (is_flippable(s))
        return bwd_data_as_forward(dx, dy, w, s);
    conv_plan p = plan_bands(s, CONV_MAX_COLS);
    size_t ws_bytes;
    float *ws = ws_alloc(s, &p, 0, &ws_bytes);
    if (!ws)
        return fr_last_status();
#pragma omp parallel num_threads(p.threads)
    {
        float *col = ws + (size_t)omp_get_thread_num() * crs * p.cols; // (CRS, P)
#pragma omp for schedule(static)
        for (int n = 0; n < s->n; n++) {
            float *dxn = dx + n * x_img; // (C, H, W)
            /* Every input pixel is written, even one no window reaches. */
            memset(dxn, 0, x_img * sizeof *dxn);
            for (int oh0 = 0; oh0 < s->oh; oh0 += p.rows) {
                int rows = s->oh - oh0 < p.rows ? s->oh - oh0 : p.rows;
                fr_status st = fr_cpu_gemm_serial(col, rows * s->ow, w, crs,
                                                  dy + n * y_img + (size_t)oh0 * s->ow, ohw, crs,
                                                  rows * s->ow, s->k, true, false, 1.0f, 0.0f);
                if (st != FR_OK) {
#pragma omp atomic write
                    failed = st;
                    break;
                }
                col2im(dxn, col, s, oh0, rows);
            }
        }
    }
    fr_mem_free(FR_CPU, ws, ws_bytes, FR_TAG_WORKSPACE);
    return failed == FR_OK ? FR_OK : worker_failed(failed, "backward (data)", s);
}

/* The batch's (image, band) units are summed in FR_CONV_WEIGHT_GROUPS
 * groups (cpu/conv.h), whatever the team size. */

/* Each group accumulates dw^T (CRS, K) = col (CRS, P) dy^T (P, K) over its
 * units: OpenBLAS runs this tall-and-narrow product about twice as fast as
 * dw = dy col^T when K is 16, and no slower otherwise. The partials are
 * summed and transposed into dw at the end. */
static fr_status dense_backward_weight(float *dw, const float *dy, const float *x,
                                       const fr_conv_shape *s) {
    int crs = s->c * s->r * s->s, ohw = s->oh * s->ow;
    size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)s->k * ohw;
    size_t dw_len = (size_t)s->k * crs;
    bool pointwise = is_pointwise(s);
    conv_plan p = plan_bands(s, SIZE_MAX);
    if (pointwise) { /* no columns: the image is used in place, one band */
        p.cols = 0;
        p.bands = 1;
        p.rows = s->oh;
    }
    int units = s->n * p.bands;
    int groups = units < FR_CONV_WEIGHT_GROUPS ? units : FR_CONV_WEIGHT_GROUPS;
    /* Per thread its columns, then per group its partial dw^T (CRS, K). */
    size_t col_len = (size_t)crs * p.cols;
    size_t ws_bytes = (col_len * (size_t)p.threads + dw_len * (size_t)groups) * sizeof(float);
    float *ws = fr_mem_alloc(FR_CPU, ws_bytes, FR_TAG_WORKSPACE);
    if (!ws)
        return fr_last_status();
    float *parts = ws + col_len * (size_t)p.threads; // (groups, CRS, K)
    fr_status failed = FR_OK;
#pragma omp parallel num_threads(p.threads)
    {
        float *col = ws + (size_t)omp_get_thread_num() * col_len; // (CRS, P)
#pragma omp for schedule(static)
        for (int g = 0; g < groups; g++) {
            float *part = parts + (size_t)g * dw_len; // (CRS, K)
            memset(part, 0, dw_len * sizeof *part);
            int u_end = (int)((long long)units * (g + 1) / groups);
            for (int u = (int)((long long)units * g / groups); u < u_end; u++) {
                int n = u / p.bands, oh0 = u % p.bands * p.rows;
                int rows = s->oh - oh0 < p.rows ? s->oh - oh0 : p.rows;
                const float *cols = x + n * x_img; // (C, H*W) for a pointwise conv
                if (!pointwise) {
                    im2col(col, x + n * x_img, s, oh0, rows);
                    cols = col;
                }
                fr_status st = fr_cpu_gemm_serial(part, s->k, cols, pointwise ? ohw : rows * s->ow,
                                                  dy + n * y_img + (size_t)oh0 * s->ow, ohw, crs,
                                                  s->k, rows * s->ow, false, true, 1.0f, 1.0f);
                if (st != FR_OK) {
#pragma omp atomic write
                    failed = st;
                }
            }
        }
        /* The implicit barrier above: every partial is complete. */
#pragma omp for schedule(static)
        for (int k = 0; k < s->k; k++)
            for (int i = 0; i < crs; i++) {
                float total = 0.0f;
                for (int g = 0; g < groups; g++)
                    total += parts[(size_t)g * dw_len + (size_t)i * s->k + k];
                dw[(size_t)k * crs + i] = total;
            }
    }
    fr_mem_free(FR_CPU, ws, ws_bytes, FR_TAG_WORKSPACE);
    return failed == FR_OK ? FR_OK : worker_failed(failed, "backward (weight)", s);
}

/* ---- groups: each group is an ungrouped convolution of C/groups input
 * and K/groups output channels on its own channel slices and its own
 * contiguous block of w (K/groups, C/groups, R, S). The reference gathers a
 * group's slices of the batch into contiguous buffers, runs the ungrouped
 * kernel on them and scatters the result back: simple rather than fast
 * (oneDNN runs grouped shapes; cpu/conv_rules.c). ---- */

typedef enum { PASS_FWD = 0, PASS_BWD_DATA, PASS_BWD_WEIGHT } pass;

static fr_status grouped(const fr_conv_shape *s, pass what, float *out, const float *a,
                         const float *b) {
    int g = fr_conv_groups(s), cg = s->c / g, kg = s->k / g;
    fr_conv_shape sg = *s;
    sg.c = cg;
    sg.k = kg;
    sg.groups = 1;
    size_t x_len = (size_t)s->n * cg * s->h * s->w, y_len = (size_t)s->n * kg * s->oh * s->ow;
    size_t w_len = (size_t)kg * cg * s->r * s->s, bytes = (x_len + y_len) * sizeof(float);
    float *xg = fr_mem_alloc(FR_CPU, bytes, FR_TAG_WORKSPACE); // (N, C/g, H, W)
    if (!xg)
        return fr_last_status();
    float *yg = xg + x_len; // (N, K/g, OH, OW)
    int hw = s->h * s->w, ohw = s->oh * s->ow;
    fr_status st = FR_OK;
    for (int i = 0; i < g && st == FR_OK; i++) {
        if (what == PASS_FWD) { /* out y, a x, b w */
            fr_cpu_copy_channels(xg, cg, 0, a, s->c, i * cg, cg, s->n, hw, sizeof(float));
            st = dense_forward(yg, xg, b + i * w_len, &sg);
            if (st == FR_OK)
                fr_cpu_copy_channels(out, s->k, i * kg, yg, kg, 0, kg, s->n, ohw, sizeof(float));
        } else if (what == PASS_BWD_DATA) { /* out dx, a dy, b w */
            fr_cpu_copy_channels(yg, kg, 0, a, s->k, i * kg, kg, s->n, ohw, sizeof(float));
            st = dense_backward_data(xg, yg, b + i * w_len, &sg);
            if (st == FR_OK)
                fr_cpu_copy_channels(out, s->c, i * cg, xg, cg, 0, cg, s->n, hw, sizeof(float));
        } else { /* out dw, a dy, b x */
            fr_cpu_copy_channels(yg, kg, 0, a, s->k, i * kg, kg, s->n, ohw, sizeof(float));
            fr_cpu_copy_channels(xg, cg, 0, b, s->c, i * cg, cg, s->n, hw, sizeof(float));
            st = dense_backward_weight(out + i * w_len, yg, xg, &sg);
        }
    }
    fr_mem_free(FR_CPU, xg, bytes, FR_TAG_WORKSPACE);
    return st;
}

fr_status fr_cpu_conv2d_forward_im2col(float *y, const float *x, const float *w, const fr_conv_shape *s) {
    return fr_conv_groups(s) == 1 ? dense_forward(y, x, w, s) : grouped(s, PASS_FWD, y, x, w);
}

fr_status fr_cpu_conv2d_backward_data_im2col(float *dx, const float *dy, const float *w,
                                             const fr_conv_shape *s) {
    return fr_conv_groups(s) == 1 ? dense_backward_data(dx, dy, w, s)
                                  : grouped(s, PASS_BWD_DATA, dx, dy, w);
}

fr_status fr_cpu_conv2d_backward_weight_im2col(float *dw, const float *dy, const float *x,
                                               const fr_conv_shape *s) {
    return fr_conv_groups(s) == 1 ? dense_backward_weight(dw, dy, x, s)
                                  : grouped(s, PASS_BWD_WEIGHT, dw, dy, x);
}
