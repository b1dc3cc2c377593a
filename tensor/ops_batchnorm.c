/* ops_batchnorm.c: checked batch norm (see ops.h). x is (N, C, H, W) or
 * (N, C); the kernels see it as (N, C, HW) with HW = 1 for the 2-d form.
 *
 * x, y, dy and dx may be f32, f16 or bf16; gamma, beta, the statistics and
 * the parameter gradients are f32, and all arithmetic is f32 (statistics
 * accumulate in double on the CPU). Half operands are staged a block of
 * samples at a time (staging.h), so no full-size f32 copy is made: the
 * statistics of the blocks are combined with the pairwise update of Chan,
 * Golub and LeVeque (stable when |mean| >> std), and backward sums the
 * blocks' dgamma / dbeta before computing dx block by block (batch_norm_backward_data).
 * With f32 operands everything is one kernel call, as before. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "staging.h"
#include "../cpu/layout.h"
#include "../cuda/fr_cuda.h"

typedef struct {
    int n, c, hw;
} bn_dims;

static _Thread_local fr_bn_sum_fn sync_fn;

/* A channels-last x (a model's channels-last mode, docs/ARCHITECTURE.md,
 * layout between ops) runs cpu/layout.c's kernels; every tensor of x's shape
 * must then be channels last too (check_like_x). */
static bool nhwc(const fr_tensor *x) { return fr_is_channels_last(x); }

static fr_status check_x(const char *op, const char *arg, const fr_tensor *x, bn_dims *d) {
    char buf[96];
    if (nhwc(x) && fr_device_of(x) != FR_CPU)
        return fr_error(FR_ERR_ARG, "%s: a channels-last %s is taken on the CPU only", op, arg);
    if (nhwc(x) && sync_fn)
        return fr_error(FR_ERR_ARG, "%s: a channels-last %s cannot take synchronised statistics "
                        "(a model turns its channels-last mode off under data parallelism)", op, arg);
    if (!nhwc(x))
        FR_TRY(fr_check_floatc(op, arg, x));
    if (x->ndim != 2 && x->ndim != 4)
        return fr_error(FR_ERR_SHAPE, "%s: %s has shape %s, expected (N, C, H, W) or (N, C)", op,
                        arg, fr_shape_str(x, buf, sizeof buf));
    int64_t hw = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1;
    if (x->shape[0] * x->shape[1] > INT_MAX || hw > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "%s: %s %s is too large for the batch-norm kernels", op, arg,
                        fr_shape_str(x, buf, sizeof buf));
    d->n = (int)x->shape[0];
    d->c = (int)x->shape[1];
    d->hw = (int)hw;
    return FR_OK;
}

/* A per-channel tensor: f32, contiguous, shape (C), on x's device. */
static fr_status check_channel(const char *op, const char *arg, const fr_tensor *t,
                               const fr_tensor *x, int c) {
    FR_TRY(fr_check_f32c(op, arg, t));
    FR_TRY(fr_check_shape(op, arg, t, 1, FR_SHAPE(c)));
    return fr_check_same_device(op, arg, t, "x", x);
}

/* Another tensor with x's shape and device (y, dy, dx). */
static fr_status check_like_x(const char *op, const char *arg, const fr_tensor *t,
                              const fr_tensor *x) {
    if (nhwc(t) != nhwc(x))
        return fr_error(FR_ERR_SHAPE, "%s: %s is %s but x is %s", op, arg,
                        nhwc(t) ? "channels last" : "not channels last",
                        nhwc(x) ? "channels last" : "not");
    if (!nhwc(t))
        FR_TRY(fr_check_floatc(op, arg, t));
    FR_TRY(fr_check_same_shape(op, arg, t, "x", x));
    return fr_check_same_device(op, arg, t, "x", x);
}

/* The per-channel tensors every normalising op reads: mean, invstd, gamma. */
static fr_status check_affine(const char *op, const fr_tensor *x, int c, const fr_tensor *mean,
                              const fr_tensor *invstd, const fr_tensor *gamma) {
    FR_TRY(check_channel(op, "mean", mean, x, c));
    FR_TRY(check_channel(op, "invstd", invstd, x, c));
    return check_channel(op, "gamma", gamma, x, c);
}

static fr_status check_eps(const char *op, float eps) {
    if (!(eps >= 0.0f) || isinf(eps))
        return fr_error(FR_ERR_ARG, "%s: eps must be finite and >= 0, got %g", op, (double)eps);
    return FR_OK;
}

fr_status fr_batch_norm_invstd(fr_tensor *invstd, const fr_tensor *var, float eps) {
    FR_TRY(check_eps("batch_norm_invstd", eps));
    FR_TRY(fr_check_f32c("batch_norm_invstd", "invstd", invstd));
    FR_TRY(fr_check_f32c("batch_norm_invstd", "var", var));
    FR_TRY(fr_check_ndim("batch_norm_invstd", "var", var, 1));
    FR_TRY(fr_check_same_shape("batch_norm_invstd", "invstd", invstd, "var", var));
    FR_TRY(fr_check_same_device("batch_norm_invstd", "invstd", invstd, "var", var));
    return FR_CALL_KERNEL(fr_device_of(var), batch_norm_invstd, fr_data_f32(invstd), fr_data_f32(var), eps,
                          (int)var->shape[0]);
}

/* Samples per staged block: all of them (one kernel call) unless an operand
 * is half. */
static size_t images_per_block(const fr_tensor *a, const fr_tensor *b, const bn_dims *d) {
    return fr_stage_block_units((const fr_tensor *[]){a, b}, 2, (size_t)d->c * (size_t)d->hw,
                                (size_t)d->n);
}

/* mean and biased var (C) of x over the batch, `per` samples at a time.
 * Block b (count nb, mean mb, var vb) joins the running (na, m, v) as
 *   delta = mb - m,  m += delta nb / n,
 *   v = (na v + nb vb) / n + delta^2 na nb / n^2,      n = na + nb,
 * through the elementwise kernels, so it stays on the device. */
static fr_status batch_stats(float *mean, float *var, const fr_tensor *x, const bn_dims *d,
                             size_t per) {
    fr_device dev = fr_device_of(x);
    size_t img = (size_t)d->c * (size_t)d->hw, c = (size_t)d->c;
    /* a block's statistics and delta; none when the batch is one block */
    size_t bytes = per < (size_t)d->n ? 3 * c * sizeof(float) : 0;
    float *bmean = bytes ? fr_mem_alloc(dev, bytes, FR_TAG_WORKSPACE) : NULL;
    if (bytes && !bmean)
        return fr_last_status();
    float *bvar = bmean ? bmean + c : NULL, *delta = bmean ? bvar + c : NULL;
    fr_status st = FR_OK;
    double na = 0;
    for (size_t n0 = 0; n0 < (size_t)d->n && st == FR_OK; n0 += per) {
        int nb = (int)((size_t)d->n - n0 < per ? (size_t)d->n - n0 : per);
        fr_stage sx;
        st = fr_stage_in(&sx, x, n0 * img, (size_t)nb * img);
        if (st != FR_OK)
            break;
        bool first = n0 == 0;
        st = FR_CALL_KERNEL(dev, batch_norm_stats, first ? mean : bmean, first ? var : bvar, sx.p, nb, d->c,
                            d->hw);
        fr_stage_free(&sx);
        double cb = (double)nb * d->hw, n = na + cb;
        if (st == FR_OK && !first) {
            st = FR_CALL_KERNEL(dev, scale, delta, bmean, 1.0f, c);
            if (st == FR_OK)
                st = FR_CALL_KERNEL(dev, axpy, delta, -1.0f, mean, c);
            if (st == FR_OK)
                st = FR_CALL_KERNEL(dev, axpy, mean, (float)(cb / n), delta, c);
            if (st == FR_OK)
                st = FR_CALL_KERNEL(dev, scale, var, var, (float)(na / n), c);
            if (st == FR_OK)
                st = FR_CALL_KERNEL(dev, axpy, var, (float)(cb / n), bvar, c);
            if (st == FR_OK)
                st = FR_CALL_KERNEL(dev, mul, delta, delta, delta, c);
            if (st == FR_OK)
                st = FR_CALL_KERNEL(dev, axpy, var, (float)(na * cb / (n * n)), delta, c);
        }
        na = n;
    }
    if (bmean)
        fr_mem_free(dev, bmean, bytes, FR_TAG_WORKSPACE);
    return st;
}

typedef struct {
    const float *mean, *invstd, *gamma, *beta, *dgamma, *dbeta;
    double count;
    int c, hw;
    bool residual;   /* apply_block: in[1] is the residual */
    fr_act act;
    float slope;
} bn_block_args;

static fr_status apply_block(fr_device dev, float *y, const float *const *in, size_t count,
                             size_t first, const void *args) {
    (void)first;
    const bn_block_args *a = args;
    return FR_CALL_KERNEL(dev, bn_act_forward, y, in[0], a->residual ? in[1] : NULL, a->mean,
                          a->invstd, a->gamma, a->beta, a->act, a->slope, (int)count, a->c, a->hw);
}

/* y = act((x - mean) * invstd * gamma + beta + residual) through staged
 * blocks (y may be x; residual may be NULL). */
static fr_status apply_act_staged(fr_tensor *y, const fr_tensor *x, const fr_tensor *residual,
                                  const float *mean, const float *invstd, const fr_tensor *gamma,
                                  const fr_tensor *beta, fr_act act, float slope,
                                  const bn_dims *d) {
    bn_block_args a = {.mean = mean, .invstd = invstd, .gamma = fr_data_f32(gamma),
                       .beta = fr_data_f32(beta), .c = d->c, .hw = d->hw,
                       .residual = residual != NULL, .act = act, .slope = slope};
    return fr_stage_run_units(y, (size_t)d->c * (size_t)d->hw, false,
                              (const fr_tensor *[]){x, residual}, NULL, residual ? 2 : 1,
                              (size_t)d->n, apply_block, &a);
}

/* y = (x - mean) * invstd * gamma + beta (y may be x). */
static fr_status apply_staged(fr_tensor *y, const fr_tensor *x, const float *mean,
                              const float *invstd, const fr_tensor *gamma, const fr_tensor *beta,
                              const bn_dims *d) {
    return apply_act_staged(y, x, NULL, mean, invstd, gamma, beta, FR_ACT_IDENTITY, 0.0f, d);
}

/* Either layout: channels last through cpu/layout.c (f32), else staged. */
static fr_status apply_any(fr_tensor *y, const fr_tensor *x, const fr_tensor *residual,
                           const float *mean, const float *invstd, const fr_tensor *gamma,
                           const fr_tensor *beta, const bn_dims *d, fr_act act, float slope) {
    if (!nhwc(x))
        return apply_act_staged(y, x, residual, mean, invstd, gamma, beta, act, slope, d);
    return fr_cpu_bn_act_forward_nhwc(fr_data_f32(y), fr_data_f32(x),
                                      residual ? fr_data_f32(residual) : NULL, mean, invstd,
                                      fr_data_f32(gamma), fr_data_f32(beta), act, slope,
                                      (size_t)d->n * d->hw, d->c);
}

static fr_status bwd_data_block(fr_device dev, float *dx, const float *const *in, size_t count,
                                size_t first, const void *args) {
    (void)first;
    const bn_block_args *a = args;
    return FR_CALL_KERNEL(dev, batch_norm_backward_data, dx, in[0], in[1], a->mean, a->invstd, a->gamma,
                          a->dgamma, a->dbeta, a->count, (int)count, a->c, a->hw);
}

/* Backward over blocks of `per` samples: dgamma and dbeta summed over the
 * blocks first (batch_norm_backward without dx), then dx block by block from them. */
static fr_status backward_blocks(fr_tensor *dx, float *dgamma, float *dbeta, const fr_tensor *dy,
                                 const fr_tensor *x, const float *mean, const float *invstd,
                                 const float *gamma, const bn_dims *d, size_t per) {
    fr_device dev = fr_device_of(x);
    size_t img = (size_t)d->c * (size_t)d->hw, c = (size_t)d->c, bytes = 2 * c * sizeof(float);
    float *pg = fr_mem_alloc(dev, bytes, FR_TAG_WORKSPACE), *pb = pg + c;
    if (!pg)
        return fr_last_status();
    fr_status st = FR_OK;
    for (size_t n0 = 0; n0 < (size_t)d->n && st == FR_OK; n0 += per) {
        int nb = (int)((size_t)d->n - n0 < per ? (size_t)d->n - n0 : per);
        bool first = n0 == 0;
        fr_stage sdy, sx = {0};
        st = fr_stage_in(&sdy, dy, n0 * img, (size_t)nb * img);
        if (st == FR_OK)
            st = fr_stage_in(&sx, x, n0 * img, (size_t)nb * img);
        if (st == FR_OK)
            st = FR_CALL_KERNEL(dev, batch_norm_backward, NULL, fr_stage_partial_dst(dgamma, pg, first),
                                fr_stage_partial_dst(dbeta, pb, first), sdy.p, sx.p, mean, invstd,
                                gamma, nb, d->c, d->hw);
        st = fr_stage_add_partial(dev, dgamma, pg, c, first, st);
        st = fr_stage_add_partial(dev, dbeta, pb, c, first, st);
        fr_stage_free(&sx);
        fr_stage_free(&sdy);
    }
    fr_mem_free(dev, pg, bytes, FR_TAG_WORKSPACE);
    if (st != FR_OK || !dx)
        return st;
    bn_block_args a = {.mean = mean, .invstd = invstd, .gamma = gamma, .dgamma = dgamma,
                       .dbeta = dbeta, .count = (double)d->n * d->hw, .c = d->c, .hw = d->hw};
    return fr_stage_run_units(dx, img, false, (const fr_tensor *[]){dy, x}, NULL, 2, (size_t)d->n,
                              bwd_data_block, &a);
}

/* ---- synchronised batch norm (ops.h: fr_batch_norm_set_sync) ---- */
static _Thread_local void *sync_ctx;

void fr_batch_norm_set_sync(fr_bn_sum_fn fn, void *ctx) {
    sync_fn = fn;
    sync_ctx = ctx;
}

bool fr_batch_norm_synced(void) { return sync_fn != NULL; }

static fr_status channels_copy(fr_device dev, void *dst, const void *src, size_t bytes,
                               fr_copy_kind kind) {
    if (dev == FR_CPU) {
        memcpy(dst, src, bytes);
        return FR_OK;
    }
    return fr_cuda_memcpy(dst, src, bytes, kind);
}

/* Two per-channel vectors a, b (C each, on dev) into host f (2C), and back. */
static fr_status pair_to_host(fr_device dev, float *f, const float *a, const float *b, int c) {
    fr_status st = channels_copy(dev, f, a, (size_t)c * sizeof *f, FR_COPY_D2H);
    return st == FR_OK ? channels_copy(dev, f + c, b, (size_t)c * sizeof *f, FR_COPY_D2H) : st;
}

static fr_status pair_from_host(fr_device dev, float *a, float *b, const float *f, int c) {
    fr_status st = channels_copy(dev, a, f, (size_t)c * sizeof *f, FR_COPY_H2D);
    return st == FR_OK ? channels_copy(dev, b, f + c, (size_t)c * sizeof *f, FR_COPY_H2D) : st;
}

/* mean and biased var (C, on dev) of `count` local values per channel
 * become those of all processes' values; *count their number. The global
 * mean comes first, then sum n_r (var_r + (mean_r - mean)^2): no difference
 * of large sums. */
static fr_status sync_stats(fr_device dev, float *mean, float *var, int c, double *count) {
    double *h = malloc((size_t)(3 * c + 1) * sizeof *h);
    float *f = malloc((size_t)(2 * c) * sizeof *f);
    fr_status st = h && f ? FR_OK : fr_error(FR_ERR_OOM, "batch_norm (synchronised): out of memory");
    if (st == FR_OK)
        st = pair_to_host(dev, f, mean, var, c);
    double n = *count, *m = h + 2 * c + 1;
    for (int i = 0; st == FR_OK && i < c; i++)
        h[i] = n * f[i];
    h[c] = n;
    if (st == FR_OK)
        st = sync_fn(h, c + 1, sync_ctx);
    double total = h[c];
    for (int i = 0; st == FR_OK && i < c; i++) {
        m[i] = h[i] / total;
        double dm = (double)f[i] - m[i];
        h[i] = n * ((double)f[c + i] + dm * dm);
    }
    if (st == FR_OK)
        st = sync_fn(h, c, sync_ctx);
    for (int i = 0; st == FR_OK && i < c; i++) {
        f[i] = (float)m[i];
        f[c + i] = (float)(h[i] / total);
    }
    if (st == FR_OK)
        st = pair_from_host(dev, mean, var, f, c);
    if (st == FR_OK)
        *count = total;
    free(h);
    free(f);
    return st;
}

/* dgamma and dbeta (C, on dev) are this process's sums; sums (2C, on dev)
 * gets both summed over processes, *count the values behind them. */
static fr_status sync_sums(fr_device dev, float *sums, const float *dgamma, const float *dbeta, int c,
                           double *count) {
    double *h = malloc((size_t)(2 * c + 1) * sizeof *h);
    float *f = malloc((size_t)(2 * c) * sizeof *f);
    fr_status st = h && f ? FR_OK : fr_error(FR_ERR_OOM, "batch_norm_backward (synchronised): out of memory");
    if (st == FR_OK)
        st = pair_to_host(dev, f, dgamma, dbeta, c);
    for (int i = 0; st == FR_OK && i < 2 * c; i++)
        h[i] = f[i];
    h[2 * c] = *count;
    if (st == FR_OK)
        st = sync_fn(h, 2 * c + 1, sync_ctx);
    for (int i = 0; st == FR_OK && i < 2 * c; i++)
        f[i] = (float)h[i];
    if (st == FR_OK)
        st = pair_from_host(dev, sums, sums + c, f, c);
    if (st == FR_OK)
        *count = h[2 * c];
    free(h);
    free(f);
    return st;
}

/* Backward with dx from the global sums (synchronised batch norm). */
static fr_status backward_synced(fr_tensor *dx, fr_tensor *dgamma, fr_tensor *dbeta, const fr_tensor *dy,
                                 const fr_tensor *x, const fr_tensor *mean, const fr_tensor *invstd,
                                 const fr_tensor *gamma, const bn_dims *d, size_t per) {
    fr_device dev = fr_device_of(x);
    FR_TRY(backward_blocks(NULL, fr_data_f32(dgamma), fr_data_f32(dbeta), dy, x, fr_data_f32(mean),
                           fr_data_f32(invstd), fr_data_f32(gamma), d, per));
    size_t bytes = 2 * (size_t)d->c * sizeof(float);
    float *sums = fr_mem_alloc(dev, bytes, FR_TAG_WORKSPACE); // (2, C)
    if (!sums)
        return fr_last_status();
    double count = (double)d->n * d->hw;
    fr_status st = sync_sums(dev, sums, fr_data_f32(dgamma), fr_data_f32(dbeta), d->c, &count);
    bn_block_args a = {.mean = fr_data_f32(mean), .invstd = fr_data_f32(invstd), .gamma = fr_data_f32(gamma),
                       .dgamma = sums, .dbeta = sums + d->c, .count = count, .c = d->c, .hw = d->hw};
    if (st == FR_OK)
        st = fr_stage_run_units(dx, (size_t)d->c * (size_t)d->hw, false, (const fr_tensor *[]){dy, x}, NULL,
                                2, (size_t)d->n, bwd_data_block, &a);
    fr_mem_free(dev, sums, bytes, FR_TAG_WORKSPACE);
    return st;
}

/* The batch statistics of x into mean / invstd, synchronised across
 * processes when a sum function is set, and the running statistics
 * updated; per = samples per staged block. Arguments checked by the caller
 * except those named here. */
static fr_status train_stats(const char *op, fr_tensor *mean, fr_tensor *invstd, const fr_tensor *x,
                             fr_tensor *running_mean, fr_tensor *running_var, float momentum,
                             float eps, const bn_dims *dims, size_t per) {
    bn_dims d = *dims;
    FR_TRY(check_eps(op, eps));
    if ((running_mean == NULL) != (running_var == NULL))
        return fr_error(FR_ERR_ARG, "%s: give both running_mean and running_var, or neither", op);
    if (running_mean) {
        FR_TRY(check_channel(op, "running_mean", running_mean, x, d.c));
        FR_TRY(check_channel(op, "running_var", running_var, x, d.c));
        if (!(momentum >= 0.0f && momentum <= 1.0f))
            return fr_error(FR_ERR_ARG, "%s: momentum must be in [0, 1], got %g", op,
                            (double)momentum);
    }
    int64_t count = (int64_t)d.n * d.hw;
    if (count < 2) {
        char buf[96];
        return fr_error(FR_ERR_SHAPE,
                        "%s: training needs more than one value per channel, x has shape %s",
                        op, fr_shape_str(x, buf, sizeof buf));
    }
    fr_device dev = fr_device_of(x);
    size_t var_bytes = (size_t)d.c * sizeof(float);
    float *var = fr_mem_alloc(dev, var_bytes, FR_TAG_WORKSPACE); // (C)
    if (!var)
        return fr_last_status();
    fr_status st = nhwc(x) ? fr_cpu_batch_norm_stats_nhwc(fr_data_f32(mean), var, fr_data_f32(x), (size_t)d.n * d.hw, d.c)
                           : batch_stats(fr_data_f32(mean), var, x, &d, per);
    double values = (double)count;
    if (st == FR_OK && sync_fn)
        st = sync_stats(dev, fr_data_f32(mean), var, d.c, &values);
    if (st == FR_OK)
        st = FR_CALL_KERNEL(dev, batch_norm_invstd, fr_data_f32(invstd), var, eps, d.c);
    if (st == FR_OK && running_mean) {
        st = FR_CALL_KERNEL(dev, batch_norm_update_running, fr_data_f32(running_mean),
                            fr_data_f32(running_var), fr_data_f32(mean), var, momentum,
                            values > INT_MAX ? INT_MAX : (int)values, d.c);
        if (st == FR_OK) {
            fr_bump_version(running_mean, "batch_norm (running stats)");
            fr_bump_version(running_var, "batch_norm (running stats)");
        }
    }
    fr_mem_free(dev, var, var_bytes, FR_TAG_WORKSPACE);
    return st;
}

fr_status fr_batch_norm_train_stats(fr_tensor *mean, fr_tensor *invstd, const fr_tensor *x,
                                    fr_tensor *running_mean, fr_tensor *running_var,
                                    float momentum, float eps) {
    const char *op = "batch_norm";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_channel(op, "mean", mean, x, d.c));
    FR_TRY(check_channel(op, "invstd", invstd, x, d.c));
    return train_stats(op, mean, invstd, x, running_mean, running_var, momentum, eps, &d,
                       images_per_block(x, x, &d));
}

fr_status fr_batch_norm_train_forward(fr_tensor *y, fr_tensor *mean, fr_tensor *invstd,
                                     const fr_tensor *x, const fr_tensor *gamma, const fr_tensor *beta,
                                     fr_tensor *running_mean, fr_tensor *running_var,
                                     float momentum, float eps) {
    const char *op = "batch_norm";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "y", y, x));
    FR_TRY(check_affine(op, x, d.c, mean, invstd, gamma));
    FR_TRY(check_channel(op, "beta", beta, x, d.c));
    FR_TRY(train_stats(op, mean, invstd, x, running_mean, running_var, momentum, eps, &d,
                       images_per_block(x, y, &d)));
    /* Statistics come first, so y may be x. */
    return apply_any(y, x, NULL, fr_data_f32(mean), fr_data_f32(invstd), gamma, beta, &d,
                     FR_ACT_IDENTITY, 0.0f);
}

fr_status fr_batch_norm_eval_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *gamma,
                                    const fr_tensor *beta, const fr_tensor *running_mean,
                                    const fr_tensor *running_var, float eps) {
    const char *op = "batch_norm (eval)";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "y", y, x));
    FR_TRY(check_channel(op, "gamma", gamma, x, d.c));
    FR_TRY(check_channel(op, "beta", beta, x, d.c));
    FR_TRY(check_channel(op, "running_mean", running_mean, x, d.c));
    FR_TRY(check_channel(op, "running_var", running_var, x, d.c));
    FR_TRY(check_eps(op, eps));
    fr_device dev = fr_device_of(x);
    size_t bytes = (size_t)d.c * sizeof(float);
    float *invstd = fr_mem_alloc(dev, bytes, FR_TAG_WORKSPACE); // (C)
    if (!invstd)
        return fr_last_status();
    fr_status st = FR_CALL_KERNEL(dev, batch_norm_invstd, invstd, fr_data_f32(running_var), eps, d.c);
    if (st == FR_OK)
        st = apply_any(y, x, NULL, fr_data_f32(running_mean), invstd, gamma, beta, &d,
                       FR_ACT_IDENTITY, 0.0f);
    fr_mem_free(dev, invstd, bytes, FR_TAG_WORKSPACE);
    return st;
}

fr_status fr_batch_norm_apply(fr_tensor *y, const fr_tensor *x, const fr_tensor *mean,
                             const fr_tensor *invstd, const fr_tensor *gamma, const fr_tensor *beta) {
    const char *op = "batch_norm_apply";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "y", y, x));
    FR_TRY(check_affine(op, x, d.c, mean, invstd, gamma));
    FR_TRY(check_channel(op, "beta", beta, x, d.c));
    return apply_any(y, x, NULL, fr_data_f32(mean), fr_data_f32(invstd), gamma, beta, &d,
                     FR_ACT_IDENTITY, 0.0f);
}

fr_status fr_batch_norm_backward(fr_tensor *dx, fr_tensor *dgamma, fr_tensor *dbeta,
                                const fr_tensor *dy, const fr_tensor *x, const fr_tensor *mean,
                                const fr_tensor *invstd, const fr_tensor *gamma) {
    const char *op = "batch_norm_backward";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "dy", dy, x));
    if (dx)
        FR_TRY(check_like_x(op, "dx", dx, x));
    FR_TRY(check_channel(op, "dgamma", dgamma, x, d.c));
    FR_TRY(check_channel(op, "dbeta", dbeta, x, d.c));
    FR_TRY(check_affine(op, x, d.c, mean, invstd, gamma));
    if (nhwc(x))
        return fr_cpu_bn_act_backward_nhwc(dx ? fr_data_f32(dx) : NULL, NULL, fr_data_f32(dgamma),
                                           fr_data_f32(dbeta), fr_data_f32(dy), NULL, fr_data_f32(x),
                                           fr_data_f32(mean), fr_data_f32(invstd),
                                           fr_data_f32(gamma), NULL, FR_ACT_IDENTITY, 0.0f, (size_t)d.n * d.hw, d.c);
    size_t per = images_per_block(dy, x, &d);
    if (dx && sync_fn)
        return backward_synced(dx, dgamma, dbeta, dy, x, mean, invstd, gamma, &d, per);
    if (per < (size_t)d.n)
        return backward_blocks(dx, fr_data_f32(dgamma), fr_data_f32(dbeta), dy, x,
                               fr_data_f32(mean), fr_data_f32(invstd), fr_data_f32(gamma), &d, per);
    size_t n = (size_t)fr_numel(x);
    fr_stage sdy, sx, sdx = {0};
    FR_TRY(fr_stage_in(&sdy, dy, 0, n));
    fr_status st = fr_stage_in(&sx, x, 0, n);
    if (st == FR_OK && dx)
        st = fr_stage_out(&sdx, dx, 0, n, false, NULL, NULL);
    if (st == FR_OK) {
        st = FR_CALL_KERNEL(fr_device_of(x), batch_norm_backward, dx ? sdx.p : NULL, fr_data_f32(dgamma),
                            fr_data_f32(dbeta), sdy.p, sx.p, fr_data_f32(mean),
                            fr_data_f32(invstd), fr_data_f32(gamma), d.n, d.c, d.hw);
        if (dx)
            st = fr_stage_commit(&sdx, dx, 0, n, st);
    }
    fr_stage_free(&sx);
    fr_stage_free(&sdy);
    return st;
}

/* ---- batch norm + residual + activation fused (ops.h) ---- */

fr_status fr_bn_act_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *residual,
                            const fr_tensor *mean, const fr_tensor *invstd, const fr_tensor *gamma,
                            const fr_tensor *beta, fr_act act, float slope) {
    const char *op = "bn_act_forward";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "y", y, x));
    if (residual)
        FR_TRY(check_like_x(op, "residual", residual, x));
    FR_TRY(check_affine(op, x, d.c, mean, invstd, gamma));
    FR_TRY(check_channel(op, "beta", beta, x, d.c));
    FR_TRY(fr_act_check(op, act, slope));
    if (nhwc(x))
        return apply_any(y, x, residual, fr_data_f32(mean), fr_data_f32(invstd), gamma, beta, &d,
                         act, slope);
    if (y->dtype == FR_F32 && x->dtype == FR_F32 && (!residual || residual->dtype == FR_F32))
        return apply_act_staged(y, x, residual, fr_data_f32(mean), fr_data_f32(invstd), gamma,
                                beta, act, slope, &d);
    /* Half operands: the chain, each step rounded to the storage type as
     * the separate ops round it, so that a strategy built on this op gives
     * plain's bits under autocast too. */
    /* y over the residual: normalise into a scratch tensor first */
    bool over_residual = residual && fr_data(y) == fr_data(residual);
    fr_tensor *bn = over_residual ? fr_empty_like(y, FR_TAG_TRANSIENT) : y;
    fr_status st = bn ? apply_staged(bn, x, fr_data_f32(mean), fr_data_f32(invstd), gamma, beta, &d)
                      : fr_last_status();
    if (st == FR_OK && residual)
        st = fr_add_out(y, bn, residual);
    if (over_residual)
        fr_release(bn);
    if (st == FR_OK && act != FR_ACT_IDENTITY)
        st = fr_act_forward(y, y, act, slope);
    return st;
}

/* The chained form of fr_bn_act_backward, for what the one-pass kernel does
 * not cover (half operands, which go through batch_norm_backward's staged
 * blocks, and synchronised batch norm): the activation's gradient
 * materialised (into dz when wanted), then fr_batch_norm_backward. */
static fr_status bn_act_backward_chained(fr_tensor *dx, fr_tensor *dz, fr_tensor *dgamma,
                                         fr_tensor *dbeta, const fr_tensor *dy,
                                         const fr_tensor *act_out, const fr_tensor *x,
                                         const fr_tensor *mean, const fr_tensor *invstd,
                                         const fr_tensor *gamma, const fr_tensor *beta, fr_act act,
                                         float slope) {
    if (act == FR_ACT_IDENTITY) {
        fr_status st = dz ? fr_copy_(dz, dy) : FR_OK;
        return st == FR_OK ? fr_batch_norm_backward(dx, dgamma, dbeta, dy, x, mean, invstd, gamma)
                           : st;
    }
    fr_tensor *pre = NULL, *g = dz ? fr_retain(dz) : fr_empty_like(dy, FR_TAG_TRANSIENT);
    fr_status st = g ? FR_OK : fr_last_status();
    /* what the activation's backward reads: its kept output, or else the
     * pre-activation rebuilt (and activated when the output is what it
     * reads); an input-needing activation always rebuilds (ops.h) */
    bool needs_input = fr_act_needs_input(act);
    const fr_tensor *s = needs_input ? NULL : act_out;
    if (st == FR_OK && !s) {
        pre = fr_empty_like(x, FR_TAG_TRANSIENT);
        st = pre ? fr_batch_norm_apply(pre, x, mean, invstd, gamma, beta) : fr_last_status();
        if (st == FR_OK && !needs_input)
            st = fr_act_forward(pre, pre, act, slope);
        s = pre;
    }
    if (st == FR_OK)
        st = fr_act_backward(g, dy, s, act, slope);
    fr_release(pre);
    if (st == FR_OK)
        st = fr_batch_norm_backward(dx, dgamma, dbeta, g, x, mean, invstd, gamma);
    fr_release(g);
    return st;
}

fr_status fr_bn_act_backward(fr_tensor *dx, fr_tensor *dz, fr_tensor *dgamma, fr_tensor *dbeta,
                             const fr_tensor *dy, const fr_tensor *act_out, const fr_tensor *x,
                             const fr_tensor *mean, const fr_tensor *invstd,
                             const fr_tensor *gamma, const fr_tensor *beta, fr_act act,
                             float slope) {
    const char *op = "bn_act_backward";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "dy", dy, x));
    if (dx)
        FR_TRY(check_like_x(op, "dx", dx, x));
    if (dz)
        FR_TRY(check_like_x(op, "dz", dz, x));
    if (act_out)
        FR_TRY(check_like_x(op, "act_out", act_out, x));
    FR_TRY(check_channel(op, "dgamma", dgamma, x, d.c));
    FR_TRY(check_channel(op, "dbeta", dbeta, x, d.c));
    FR_TRY(check_affine(op, x, d.c, mean, invstd, gamma));
    if (act != FR_ACT_IDENTITY && (!act_out || fr_act_needs_input(act)))
        FR_TRY(check_channel(op, "beta", beta, x, d.c));
    FR_TRY(fr_act_check(op, act, slope));
    const fr_tensor *all[] = {dx, dz, dy, act_out, x};
    bool f32 = true;
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        f32 = f32 && (!all[i] || all[i]->dtype == FR_F32);
    if (nhwc(x))
        return fr_cpu_bn_act_backward_nhwc(dx ? fr_data_f32(dx) : NULL, dz ? fr_data_f32(dz) : NULL,
                                           fr_data_f32(dgamma), fr_data_f32(dbeta), fr_data_f32(dy),
                                           act_out ? fr_data_f32(act_out) : NULL, fr_data_f32(x),
                                           fr_data_f32(mean), fr_data_f32(invstd),
                                           fr_data_f32(gamma), beta ? fr_data_f32(beta) : NULL, act,
                                           slope, (size_t)d.n * d.hw, d.c);
    if (!f32 || (dx && sync_fn))
        return bn_act_backward_chained(dx, dz, dgamma, dbeta, dy, act_out, x, mean, invstd, gamma,
                                       beta, act, slope);
    return FR_CALL_KERNEL(fr_device_of(x), bn_act_backward, dx ? fr_data_f32(dx) : NULL,
                          dz ? fr_data_f32(dz) : NULL, fr_data_f32(dgamma), fr_data_f32(dbeta),
                          fr_data_f32(dy), act_out ? fr_data_f32(act_out) : NULL, fr_data_f32(x),
                          fr_data_f32(mean), fr_data_f32(invstd), fr_data_f32(gamma),
                          beta ? fr_data_f32(beta) : NULL, act, slope, d.n, d.c, d.hw);
}
