/* ops_linear.c: checked matrix products (see ops.h): a general GEMM on 2-d
 * tensors, and the fully connected layer y = x w^T + b with its backward.
 * Matrices may be f32, f16 or bf16 (biases and dw, db f32); GEMMs accumulate
 * in f32. The linear layer stages half x / y / dy / dx a block of rows at a
 * time; the general GEMM stages its operands whole. */
#include <limits.h>

#include "ops.h"
#include "staging.h"

/* f32 / f16 / bf16, contiguous, 2-d, on `ref`'s device (ref may be t itself). */
static fr_status check_matrix(const char *op, const char *arg, const fr_tensor *t,
                              const char *ref_name, const fr_tensor *ref) {
    char buf[96];
    FR_TRY(fr_check_floatc(op, arg, t));
    FR_TRY(fr_check_ndim(op, arg, t, 2));
    if (t->shape[0] > INT_MAX || t->shape[1] > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "%s: %s %s is too large for the GEMM kernels", op, arg,
                        fr_shape_str(t, buf, sizeof buf));
    return fr_check_same_device(op, arg, t, ref_name, ref);
}

fr_status fr_gemm_out(fr_tensor *c, const fr_tensor *a, const fr_tensor *b, bool trans_a,
                      bool trans_b, float alpha, float beta) {
    const char *op = "gemm";
    char sa[96], sb[96], sc[96];
    FR_TRY(check_matrix(op, "c", c, "c", c));
    FR_TRY(check_matrix(op, "a", a, "c", c));
    FR_TRY(check_matrix(op, "b", b, "c", c));
    int64_t m = trans_a ? a->shape[1] : a->shape[0], ka = trans_a ? a->shape[0] : a->shape[1];
    int64_t kb = trans_b ? b->shape[1] : b->shape[0], n = trans_b ? b->shape[0] : b->shape[1];
    if (ka != kb || c->shape[0] != m || c->shape[1] != n)
        return fr_error(FR_ERR_SHAPE,
                        "gemm: op(a) is (%lld, %lld) from a %s%s, op(b) is (%lld, %lld) from b %s%s, "
                        "c is %s; need op(a) (M, K), op(b) (K, N), c (M, N)",
                        (long long)m, (long long)ka, fr_shape_str(a, sa, sizeof sa),
                        trans_a ? " transposed" : "", (long long)kb, (long long)n,
                        fr_shape_str(b, sb, sizeof sb), trans_b ? " transposed" : "",
                        fr_shape_str(c, sc, sizeof sc));
    fr_stage sa_, sb_, sc_;
    FR_TRY(fr_stage_in(&sa_, a, 0, (size_t)fr_numel(a)));
    fr_status st = fr_stage_in(&sb_, b, 0, (size_t)fr_numel(b));
    if (st == FR_OK) {
        size_t nc = (size_t)fr_numel(c);
        st = fr_stage_out(&sc_, c, 0, nc, beta != 0.0f, NULL, NULL);
        if (st == FR_OK)
            st = fr_stage_commit(&sc_, c, 0, nc,
                                 FR_CALL_KERNEL(fr_device_of(c), gemm, sc_.p, sa_.p, sb_.p, (int)m,
                                                (int)n, (int)ka, trans_a, trans_b, alpha, beta));
        fr_stage_free(&sb_);
    }
    fr_stage_free(&sa_);
    return st;
}

/* x (N, IN) and w (OUT, IN): checks both and that IN agrees. */
static fr_status check_x_w(const char *op, const fr_tensor *x, const fr_tensor *w) {
    char sx[96], sw[96];
    FR_TRY(check_matrix(op, "x", x, "x", x));
    FR_TRY(check_matrix(op, "w", w, "x", x));
    if (x->shape[1] != w->shape[1])
        return fr_error(FR_ERR_SHAPE,
                        "%s: x %s has %lld input features but w %s expects %lld (w is (OUT, IN))", op,
                        fr_shape_str(x, sx, sizeof sx), (long long)x->shape[1],
                        fr_shape_str(w, sw, sizeof sw), (long long)w->shape[1]);
    return FR_OK;
}

static fr_status check_bias(const char *op, const char *arg, const fr_tensor *b, int64_t out,
                            const char *ref_name, const fr_tensor *ref) {
    FR_TRY(fr_check_f32c(op, arg, b));
    FR_TRY(fr_check_shape(op, arg, b, 1, FR_SHAPE(out)));
    return fr_check_same_device(op, arg, b, ref_name, ref);
}

typedef struct {
    const float *w, *b; /* staged weight (OUT, IN), bias (OUT) or NULL */
    int in, out;
} linear_args;

// y (rows, OUT) = x (rows, IN) w^T (IN, OUT) + b
static fr_status forward_rows(fr_device dev, float *y, const float *const *x, size_t rows,
                              size_t first, const void *args) {
    (void)first;
    const linear_args *a = args;
    FR_TRY(FR_CALL_KERNEL(dev, gemm, y, x[0], a->w, (int)rows, a->out, a->in, false, true, 1.0f,
                          0.0f));
    return a->b ? FR_CALL_KERNEL(dev, bias_add, y, a->b, (int)rows, a->out, 1) : FR_OK;
}

// dx (rows, IN) = dy (rows, OUT) w (OUT, IN)
static fr_status backward_data_rows(fr_device dev, float *dx, const float *const *dy, size_t rows,
                                    size_t first, const void *args) {
    (void)first;
    const linear_args *a = args;
    return FR_CALL_KERNEL(dev, gemm, dx, dy[0], a->w, (int)rows, a->in, a->out, false, false, 1.0f,
                          0.0f);
}

fr_status fr_linear_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *w, const fr_tensor *b) {
    const char *op = "linear";
    FR_TRY(check_x_w(op, x, w));
    int64_t n = x->shape[0], out = w->shape[0];
    FR_TRY(check_matrix(op, "y", y, "x", x));
    FR_TRY(fr_check_shape(op, "y", y, 2, FR_SHAPE(n, out)));
    if (b)
        FR_TRY(check_bias(op, "b", b, out, "x", x));
    fr_stage sw;
    FR_TRY(fr_stage_in(&sw, w, 0, (size_t)fr_numel(w)));
    linear_args a = {sw.p, b ? fr_data_f32(b) : NULL, (int)x->shape[1], (int)out};
    fr_status st = fr_stage_run_units(y, (size_t)out, false, &x, (size_t[]){(size_t)x->shape[1]}, 1,
                                      (size_t)n, forward_rows, &a);
    fr_stage_free(&sw);
    return st;
}

/* dw (OUT, IN) = dy^T x and db = column sums of dy, summed over row blocks
 * (GEMM's beta accumulates dw; db's blocks go through a scratch). */
static fr_status backward_params(fr_tensor *dw, fr_tensor *db, const fr_tensor *dy,
                                 const fr_tensor *x) {
    fr_device dev = fr_device_of(dy);
    int64_t n = dy->shape[0], out = dy->shape[1], in = dw ? x->shape[1] : 0;
    size_t unit = (size_t)(out > in ? out : in);
    size_t per = fr_stage_block_units((const fr_tensor *[]){dy, dw ? x : NULL}, 2, unit, (size_t)n);
    float *db_part = NULL;
    if (db && per < (size_t)n && !(db_part = fr_mem_alloc(dev, (size_t)out * sizeof(float),
                                                            FR_TAG_WORKSPACE)))
        return fr_last_status();
    fr_status st = FR_OK;
    if (n == 0) { /* an empty batch: no block runs, the gradients are 0 */
        if (dw)
            st = FR_CALL_KERNEL(dev, fill, fr_data_f32(dw), 0.0f, (size_t)(out * dw->shape[1]));
        if (st == FR_OK && db)
            st = FR_CALL_KERNEL(dev, fill, fr_data_f32(db), 0.0f, (size_t)out);
    }
    for (size_t r0 = 0; r0 < (size_t)n && st == FR_OK; r0 += per) {
        size_t rows = (size_t)n - r0 < per ? (size_t)n - r0 : per;
        fr_stage sdy, sx = {0};
        st = fr_stage_in(&sdy, dy, r0 * (size_t)out, rows * (size_t)out);
        if (st == FR_OK && dw)
            st = fr_stage_in(&sx, x, r0 * (size_t)in, rows * (size_t)in);
        if (st == FR_OK && dw) // dw (OUT, IN) (+)= dy^T (OUT, rows) x (rows, IN)
            st = FR_CALL_KERNEL(dev, gemm, fr_data_f32(dw), sdy.p, sx.p, (int)out, (int)in,
                                (int)rows, true, false, 1.0f, r0 ? 1.0f : 0.0f);
        if (st == FR_OK && db) {
            float *dst = fr_stage_partial_dst(fr_data_f32(db), db_part, r0 == 0);
            st = fr_stage_add_partial(dev, fr_data_f32(db), dst, (size_t)out, r0 == 0,
                                      FR_CALL_KERNEL(dev, bias_grad, dst, sdy.p, (int)rows, (int)out, 1));
        }
        fr_stage_free(&sx);
        fr_stage_free(&sdy);
    }
    if (db_part)
        fr_mem_free(dev, db_part, (size_t)out * sizeof(float), FR_TAG_WORKSPACE);
    return st;
}

/* Everything is checked before anything is computed, so a bad argument never
 * leaves some gradients written and others not. */
fr_status fr_linear_backward(fr_tensor *dx, fr_tensor *dw, fr_tensor *db, const fr_tensor *dy,
                             const fr_tensor *x, const fr_tensor *w) {
    const char *op = "linear_backward";
    FR_TRY(check_matrix(op, "dy", dy, "dy", dy));
    int64_t n = dy->shape[0], out = dy->shape[1];
    if (dx) {
        FR_TRY(check_matrix(op, "w", w, "dy", dy));
        FR_TRY(fr_check_shape(op, "w", w, 2, FR_SHAPE(out, -1)));
        FR_TRY(check_matrix(op, "dx", dx, "dy", dy));
        FR_TRY(fr_check_shape(op, "dx", dx, 2, FR_SHAPE(n, w->shape[1])));
    }
    if (dw) {
        FR_TRY(check_matrix(op, "x", x, "dy", dy));
        FR_TRY(fr_check_shape(op, "x", x, 2, FR_SHAPE(n, -1)));
        FR_TRY(fr_check_f32c(op, "dw", dw));
        FR_TRY(check_matrix(op, "dw", dw, "dy", dy));
        FR_TRY(fr_check_shape(op, "dw", dw, 2, FR_SHAPE(out, x->shape[1])));
    }
    if (db)
        FR_TRY(check_bias(op, "db", db, out, "dy", dy));
    if (dx) {
        fr_stage sw;
        FR_TRY(fr_stage_in(&sw, w, 0, (size_t)fr_numel(w)));
        linear_args a = {sw.p, NULL, (int)w->shape[1], (int)out};
        fr_status st = fr_stage_run_units(dx, (size_t)w->shape[1], false, &dy, (size_t[]){(size_t)out},
                                          1, (size_t)n, backward_data_rows, &a);
        fr_stage_free(&sw);
        FR_TRY(st);
    }
    return dw || db ? backward_params(dw, db, dy, x) : FR_OK;
}
