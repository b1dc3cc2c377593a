/* ops_linear.c: checked matrix products (see ops.h): a general GEMM on 2-d
 * tensors, and the fully connected layer y = x w^T + b with its backward. */
#include <limits.h>

#include "ops.h"

/* f32, contiguous, 2-d, on `ref`'s device (ref may be t itself). */
static fr_status check_matrix(const char *op, const char *arg, const fr_tensor *t,
                              const char *ref_name, const fr_tensor *ref) {
    char buf[96];
    FR_TRY(fr_check_f32c(op, arg, t));
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
    return FR_CALL_KERNEL(fr_device_of(c), gemm, fr_data_f32(c), fr_data_f32(a), fr_data_f32(b),
                          (int)m, (int)n, (int)ka, trans_a, trans_b, alpha, beta);
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

fr_status fr_linear_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *w, const fr_tensor *b) {
    const char *op = "linear";
    FR_TRY(check_x_w(op, x, w));
    int64_t n = x->shape[0], out = w->shape[0];
    FR_TRY(check_matrix(op, "y", y, "x", x));
    FR_TRY(fr_check_shape(op, "y", y, 2, FR_SHAPE(n, out)));
    if (b)
        FR_TRY(check_bias(op, "b", b, out, "x", x));
    fr_device dev = fr_device_of(x);
    // y (N, OUT) = x (N, IN) w^T (IN, OUT)
    FR_TRY(FR_CALL_KERNEL(dev, gemm, fr_data_f32(y), fr_data_f32(x), fr_data_f32(w), (int)n,
                          (int)out, (int)x->shape[1], false, true, 1.0f, 0.0f));
    if (b)
        FR_TRY(FR_CALL_KERNEL(dev, bias_add, fr_data_f32(y), fr_data_f32(b), (int)n, (int)out, 1));
    return FR_OK;
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
        FR_TRY(check_matrix(op, "dw", dw, "dy", dy));
        FR_TRY(fr_check_shape(op, "dw", dw, 2, FR_SHAPE(out, x->shape[1])));
    }
    if (db)
        FR_TRY(check_bias(op, "db", db, out, "dy", dy));
    fr_device dev = fr_device_of(dy);
    if (dx) // dx (N, IN) = dy (N, OUT) w (OUT, IN)
        FR_TRY(FR_CALL_KERNEL(dev, gemm, fr_data_f32(dx), fr_data_f32(dy), fr_data_f32(w), (int)n,
                              (int)w->shape[1], (int)out, false, false, 1.0f, 0.0f));
    if (dw) // dw (OUT, IN) = dy^T (OUT, N) x (N, IN)
        FR_TRY(FR_CALL_KERNEL(dev, gemm, fr_data_f32(dw), fr_data_f32(dy), fr_data_f32(x), (int)out,
                              (int)x->shape[1], (int)n, true, false, 1.0f, 0.0f));
    if (db)
        FR_TRY(FR_CALL_KERNEL(dev, bias_grad, fr_data_f32(db), fr_data_f32(dy), (int)n, (int)out, 1));
    return FR_OK;
}
