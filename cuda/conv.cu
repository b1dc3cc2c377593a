/* conv.cu: 2-d convolution on the GPU (grouped shapes on cuDNN only). The kernels of
 * kernels.def first offer the call to cuDNN (conv_cudnn.cu); when it declines
 * (cuDNN off or unavailable, a shape it cannot do, no workspace to be had)
 * the convolution runs here as column matrices and cuBLAS GEMM, batched over
 * chunks of images.
 *
 * With CRS = C*R*S and P = OH*OW output pixels per image:
 *   forward     y_n(K, P)     = w(K, CRS)   col_n(CRS, P)     for each image n
 *   bwd_data    dcol_n(CRS,P) = w^T(CRS, K) dy_n(K, P),  then col2im into dx_n
 *   bwd_weight  dw(K, CRS)    = sum_n dy_n(K, P) col_n^T(P, CRS)
 * The forward and bwd_data products of a chunk are one strided-batched GEMM
 * (w shared with stride 0). For bwd_weight the chunk's columns are laid out
 * (CRS, nb*P) and dy is gathered to (K, nb*P), so the sum over the chunk's
 * images is the inner dimension of a single GEMM that accumulates into dw.
 *
 * Workspace comes from the ledger (FR_TAG_WORKSPACE) and is freed before
 * return. A chunk takes as many images as fit min(32 MiB, the workspace
 * budget), at least one; when even that cannot be had (a memory limit, a full
 * device) the chunk is halved down to one image before giving up. A 1x1,
 * stride-1, unpadded convolution needs no column matrix for forward and
 * bwd_data: each image's (C, H*W) block is one.
 *
 * Every index into x, dx, y, dy and the columns is computed in size_t. The
 * col2im here gathers (each dx element sums the column entries that read it,
 * in a fixed order), so no atomics and the result is deterministic. */
#include "internal.h"

/* Upper bound on im2col's workspace bytes per call, below the shared budget
 * (fr_cuda_workspace_budget): larger chunks stop paying off well before. */
#define CONV_WS_MAX ((size_t)32 << 20)

static bool is_pointwise(const fr_conv_shape *s) {
    return s->r == 1 && s->s == 1 && s->stride == 1 && s->pad == 0;
}

/* col[b * img_stride + row * row_stride + p] = x[n0 + b] unrolled, for
 * b < nb, row < CRS, p < P. img_stride/row_stride select the layout:
 * (nb, CRS, P) with (CRS*P, P), or (CRS, nb, P) with (P, nb*P). */
__global__ void im2col_kernel(float *col, const float *x, fr_conv_shape s, int n0, int nb,
                              size_t img_stride, size_t row_stride) {
    size_t p_count = (size_t)s.oh * s.ow, crs = (size_t)s.c * s.r * s.s;
    size_t total = (size_t)nb * crs * p_count;
    FR_CUDA_FOR(i, total) {
        size_t p = i % p_count, t = i / p_count;
        size_t row = t % crs, b = t / crs;
        int c = (int)(row / ((size_t)s.r * s.s)), rs = (int)(row % ((size_t)s.r * s.s));
        int ky = rs / s.s, kx = rs % s.s;
        int oh = (int)(p / (size_t)s.ow), ow = (int)(p % (size_t)s.ow);
        int d = fr_conv_dilation(&s);
        int ih = oh * s.stride - s.pad + ky * d, iw = ow * s.stride - s.pad + kx * d;
        float v = 0.0f;
        if (ih >= 0 && ih < s.h && iw >= 0 && iw < s.w)
            v = x[(((size_t)(n0 + (int)b) * s.c + c) * s.h + ih) * s.w + iw];
        col[b * img_stride + row * row_stride + p] = v;
    }
}

/* dx[n0 + b] (overwritten) from dcol laid out (nb, CRS, P). Input pixel
 * (ih, iw) is read by tap (ky, kx) of output pixel (oh, ow) exactly when
 * ih = oh*stride - pad + ky, i.e. oh = (ih + pad - ky) / stride when that
 * divides evenly and lands in [0, OH); likewise for columns. */
__global__ void col2im_kernel(float *dx, const float *dcol, fr_conv_shape s, int n0, int nb) {
    size_t hw = (size_t)s.h * s.w, p_count = (size_t)s.oh * s.ow;
    size_t crs = (size_t)s.c * s.r * s.s;
    size_t total = (size_t)nb * s.c * hw;
    FR_CUDA_FOR(i, total) {
        int iw = (int)(i % (size_t)s.w);
        int ih = (int)(i / (size_t)s.w % (size_t)s.h);
        size_t t = i / hw;
        int c = (int)(t % (size_t)s.c);
        size_t b = t / (size_t)s.c;
        const float *img = dcol + b * crs * p_count; // (CRS, P)
        float acc = 0.0f;
        int d = fr_conv_dilation(&s);
        for (int ky = 0; ky < s.r; ky++) {
            int dh = ih + s.pad - ky * d;
            if (dh < 0 || dh % s.stride != 0)
                continue;
            int oh = dh / s.stride;
            if (oh >= s.oh)
                continue;
            for (int kx = 0; kx < s.s; kx++) {
                int dw = iw + s.pad - kx * d;
                if (dw < 0 || dw % s.stride != 0)
                    continue;
                int ow = dw / s.stride;
                if (ow >= s.ow)
                    continue;
                size_t row = ((size_t)c * s.r + ky) * s.s + kx;
                acc += img[row * p_count + (size_t)oh * s.ow + ow];
            }
        }
        dx[(size_t)(n0 + (int)b) * s.c * hw + (size_t)c * hw + (size_t)ih * s.w + iw] = acc;
    }
}

/* dyt(K, nb, P) = dy[n0 + b](K, P) for b < nb. */
__global__ void gather_dy_kernel(float *dyt, const float *dy, fr_conv_shape s, int n0, int nb) {
    size_t p_count = (size_t)s.oh * s.ow;
    size_t total = (size_t)s.k * nb * p_count;
    FR_CUDA_FOR(i, total) {
        size_t p = i % p_count, t = i / p_count;
        size_t b = t % (size_t)nb, k = t / (size_t)nb;
        dyt[i] = dy[((size_t)(n0 + (int)b) * s.k + k) * p_count + p];
    }
}

/* ---- workspace ---- */

typedef struct {
    float *ptr;
    size_t bytes;
    int nb; /* images per chunk */
} conv_ws;

/* Takes per_image * nb bytes with nb as large as the budget allows, halving
 * nb while the allocation fails. */
static fr_status ws_alloc(conv_ws *ws, int n, size_t per_image) {
    size_t cap = fr_cuda_workspace_budget();
    if (cap > CONV_WS_MAX)
        cap = CONV_WS_MAX;
    size_t fit = per_image ? cap / per_image : (size_t)n;
    int nb = fit < 1 ? 1 : fit > (size_t)n ? n : (int)fit;
    for (;;) {
        ws->bytes = (size_t)nb * per_image;
        ws->ptr = (float *)fr_mem_alloc(FR_CUDA, ws->bytes, FR_TAG_WORKSPACE);
        if (ws->ptr) {
            ws->nb = nb;
            return FR_OK;
        }
        if (nb == 1)
            return fr_last_status();
        nb = (nb + 1) / 2;
    }
}

static void ws_free(conv_ws *ws) { fr_mem_free(FR_CUDA, ws->ptr, ws->bytes, FR_TAG_WORKSPACE); }

/* ---- forward ---- */

static fr_status fwd_chunks(float *y, const float *x, const float *w, const fr_conv_shape *s,
                            float *col, int chunk) {
    int crs = s->c * s->r * s->s, p = s->oh * s->ow;
    size_t y_img = (size_t)s->k * p, col_img = (size_t)crs * p;
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int nb = s->n - n0 < chunk ? s->n - n0 : chunk;
        size_t total = (size_t)nb * col_img;
        im2col_kernel<<<fr_cuda_grid(total), FR_CUDA_THREADS>>>(col, x, *s, n0, nb, col_img,
                                                                  (size_t)p);
        FR_CUDA_LAUNCH_CHECK();
        FR_TRY(fr_cuda_gemm_rm(y + (size_t)n0 * y_img, (long long)y_img, w, 0, col,
                               (long long)col_img, s->k, p, crs, false, false, 1.0f, 0.0f, nb));
    }
    return FR_OK;
}

static fr_status im2col_fwd(float *y, const float *x, const float *w, const fr_conv_shape *s) {
    int crs = s->c * s->r * s->s, p = s->oh * s->ow;
    if (s->n == 0 || p == 0 || s->k == 0)
        return FR_OK;
    if (crs == 0) /* no input channel: an empty sum */
        return fr_cuda_fill(y, 0.0f, (size_t)s->n * s->k * p);
    if (is_pointwise(s)) { /* y_n(K, HW) = w(K, C) x_n(C, HW), all images in one call */
        size_t x_img = (size_t)s->c * p, y_img = (size_t)s->k * p;
        return fr_cuda_gemm_rm(y, (long long)y_img, w, 0, x, (long long)x_img, s->k, p, s->c,
                               false, false, 1.0f, 0.0f, s->n);
    }
    conv_ws ws = {NULL, 0, 1};
    FR_TRY(ws_alloc(&ws, s->n, (size_t)crs * p * sizeof(float)));
    fr_status st = fwd_chunks(y, x, w, s, ws.ptr, ws.nb);
    ws_free(&ws);
    return st;
}

/* ---- backward, data ---- */

static fr_status bwd_data_chunks(float *dx, const float *dy, const float *w, const fr_conv_shape *s,
                                 float *dcol, int chunk) {
    int crs = s->c * s->r * s->s, p = s->oh * s->ow;
    size_t y_img = (size_t)s->k * p, col_img = (size_t)crs * p;
    size_t x_img = (size_t)s->c * s->h * s->w;
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int nb = s->n - n0 < chunk ? s->n - n0 : chunk;
        FR_TRY(fr_cuda_gemm_rm(dcol, (long long)col_img, w, 0, dy + (size_t)n0 * y_img,
                               (long long)y_img, crs, p, s->k, true, false, 1.0f, 0.0f, nb));
        size_t total = (size_t)nb * x_img;
        col2im_kernel<<<fr_cuda_grid(total), FR_CUDA_THREADS>>>(dx, dcol, *s, n0, nb);
        FR_CUDA_LAUNCH_CHECK();
    }
    return FR_OK;
}

static fr_status im2col_bwd_data(float *dx, const float *dy, const float *w,
                                 const fr_conv_shape *s) {
    int crs = s->c * s->r * s->s, p = s->oh * s->ow;
    size_t x_img = (size_t)s->c * s->h * s->w;
    if (s->n == 0 || x_img == 0)
        return FR_OK;
    if (p == 0) /* no output pixel reads any input: the gradient is zero */
        return fr_cuda_fill(dx, 0.0f, (size_t)s->n * x_img);
    if (is_pointwise(s)) { /* dx_n(C, HW) = w^T(C, K) dy_n(K, HW) */
        size_t y_img = (size_t)s->k * p;
        return fr_cuda_gemm_rm(dx, (long long)x_img, w, 0, dy, (long long)y_img, s->c, p, s->k,
                               true, false, 1.0f, 0.0f, s->n);
    }
    conv_ws ws = {NULL, 0, 1};
    FR_TRY(ws_alloc(&ws, s->n, (size_t)crs * p * sizeof(float)));
    fr_status st = bwd_data_chunks(dx, dy, w, s, ws.ptr, ws.nb);
    ws_free(&ws);
    return st;
}

/* ---- backward, weight ---- */

static fr_status bwd_weight_chunks(float *dw, const float *dy, const float *x,
                                   const fr_conv_shape *s, float *ws, int chunk) {
    int crs = s->c * s->r * s->s, p = s->oh * s->ow;
    for (int n0 = 0; n0 < s->n; n0 += chunk) {
        int nb = s->n - n0 < chunk ? s->n - n0 : chunk;
        size_t cols = (size_t)nb * p;
        if (cols > (size_t)INT32_MAX) /* cuBLAS takes int dimensions */
            return fr_error(FR_ERR_SHAPE, "conv2d backward: %zu columns in one chunk exceed cuBLAS",
                            cols);
        float *col = ws;                        // (CRS, nb * P)
        float *dyt = ws + (size_t)crs * cols;   // (K, nb * P)
        size_t col_total = (size_t)crs * cols, dy_total = (size_t)s->k * cols;
        im2col_kernel<<<fr_cuda_grid(col_total), FR_CUDA_THREADS>>>(col, x, *s, n0, nb, (size_t)p,
                                                                      cols);
        FR_CUDA_LAUNCH_CHECK();
        gather_dy_kernel<<<fr_cuda_grid(dy_total), FR_CUDA_THREADS>>>(dyt, dy, *s, n0, nb);
        FR_CUDA_LAUNCH_CHECK();
        FR_TRY(fr_cuda_gemm_rm(dw, 0, dyt, 0, col, 0, s->k, crs, (int)cols, false, true, 1.0f,
                               n0 == 0 ? 0.0f : 1.0f, 1));
    }
    return FR_OK;
}

static fr_status im2col_bwd_weight(float *dw, const float *dy, const float *x,
                                   const fr_conv_shape *s) {
    int crs = s->c * s->r * s->s, p = s->oh * s->ow;
    if ((size_t)s->k * crs == 0)
        return FR_OK;
    if (s->n == 0 || p == 0) /* an empty sum */
        return fr_cuda_fill(dw, 0.0f, (size_t)s->k * crs);
    conv_ws ws = {NULL, 0, 1};
    FR_TRY(ws_alloc(&ws, s->n, ((size_t)crs + s->k) * p * sizeof(float)));
    fr_status st = bwd_weight_chunks(dw, dy, x, s, ws.ptr, ws.nb);
    ws_free(&ws);
    return st;
}

/* ---- the kernels: cuDNN first ---- */

/* The column path here is ungrouped: a grouped shape cuDNN declined (cuDNN
 * off with FR_CUDNN=0, or no workspace) is refused rather than run wrong. */
static fr_status own_takes(const fr_conv_shape *s, const char *pass) {
    if (fr_conv_groups(s) == 1)
        return FR_OK;
    return fr_error(FR_ERR_ARG, "conv2d %s: groups %d (%d -> %d channels) run on cuDNN only, and "
                    "cuDNN did not take this shape (FR_CUDNN=0?)", pass, fr_conv_groups(s), s->c,
                    s->k);
}

extern "C" fr_status fr_cuda_conv2d_forward(float *y, const float *x, const float *w,
                                        const fr_conv_shape *s) {
    bool ran = false;
    FR_TRY(fr_cudnn_conv2d_forward(y, x, w, s, &ran));
    if (ran)
        return FR_OK;
    FR_TRY(own_takes(s, "forward"));
    return im2col_fwd(y, x, w, s);
}

extern "C" fr_status fr_cuda_conv2d_backward_data(float *dx, const float *dy, const float *w,
                                             const fr_conv_shape *s) {
    bool ran = false;
    FR_TRY(fr_cudnn_conv2d_backward_data(dx, dy, w, s, &ran));
    if (ran)
        return FR_OK;
    FR_TRY(own_takes(s, "backward (data)"));
    return im2col_bwd_data(dx, dy, w, s);
}

extern "C" fr_status fr_cuda_conv2d_backward_weight(float *dw, const float *dy, const float *x,
                                               const fr_conv_shape *s) {
    bool ran = false;
    FR_TRY(fr_cudnn_conv2d_backward_weight(dw, dy, x, s, &ran));
    if (ran)
        return FR_OK;
    FR_TRY(own_takes(s, "backward (weight)"));
    return im2col_bwd_weight(dw, dy, x, s);
}

/* kernels.def: half-precision compute on the GPU is not written yet; the
 * caller stages to f32 (cuDNN's f32 kernels). */
extern "C" fr_status fr_cuda_conv2d_half(void *out, const void *in0, const void *in1, fr_dtype dtype,
                                         int direction, const fr_conv_shape *s, bool *done) {
    (void)out, (void)in0, (void)in1, (void)dtype, (void)direction, (void)s;
    *done = false;
    return FR_OK;
}
