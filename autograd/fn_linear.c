/* fn_linear.c: differentiable matrix products: the fully connected layer
 * y = x w^T + b and the plain product a b.
 *
 * Each factor is saved only when the other factor wants a gradient (dw needs
 * x, dx needs w), and shapes live in the context so gradients are allocated
 * without the saved tensors. */
#include <stdlib.h>
#include <string.h>

#include "functions.h"
#include "node.h"

/* Inputs: linear (x, w, b); matmul (a, b) uses the first two slots. */
enum { MM_A = 0, MM_B, MM_BIAS };

typedef struct {
    bool linear;              /* y = a b^T (+ bias) rather than y = a b */
    int64_t a_shape[2], b_shape[2];
    fr_dtype a_dtype, b_dtype;
    fr_dtype compute;         /* linear under autocast: the dtype the weight is cast to */
    int a, b;                 /* saved slots, -1 when not saved */
} mm_ctx;

static fr_tensor *grad_of(const fr_tensor *dy, fr_dtype dtype, int ndim, const int64_t *shape) {
    return fr_empty(fr_device_of(dy), dtype, ndim, shape, FR_TAG_TRANSIENT);
}

/* Gradient of factor `want` (MM_A or MM_B) from the saved other factor.
 *   linear: dx = dy w;        dw = dy^T x
 *   matmul: da = dy b^T;      db = a^T dy */
static fr_status factor_grad(fr_node *node, const mm_ctx *c, fr_tensor *dy, int want,
                             fr_tensor **out) {
    int other = want == MM_A ? c->b : c->a;
    fr_tensor *o = fr_node_unpack(node, other);
    if (o && c->linear && want == MM_A) { /* the weight, cast as in forward */
        fr_tensor *wc = fr_autocast_weight(o, c->compute);
        fr_release(o);
        o = wc;
    }
    fr_tensor *g = o ? grad_of(dy, want == MM_A ? c->a_dtype : c->b_dtype, 2,
                               want == MM_A ? c->a_shape : c->b_shape)
                     : NULL;
    fr_status st = g ? FR_OK : fr_last_status();
    if (st == FR_OK && c->linear)
        st = want == MM_A ? fr_linear_backward(g, NULL, NULL, dy, NULL, o)
                          : fr_linear_backward(NULL, g, NULL, dy, o, NULL);
    else if (st == FR_OK)
        st = want == MM_A ? fr_gemm_out(g, dy, o, false, true, 1.0f, 0.0f)
                          : fr_gemm_out(g, o, dy, true, false, 1.0f, 0.0f);
    fr_release(o);
    if (st != FR_OK) {
        fr_release(g);
        return st;
    }
    *out = g;
    return FR_OK;
}

static fr_status mm_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const mm_ctx *c = node->ctx;
    for (int i = MM_A; i <= MM_B; i++)
        if (fr_node_needs_grad(node, i))
            FR_TRY(factor_grad(node, c, dout[0], i, &din[i]));
    if (c->linear && fr_node_needs_grad(node, MM_BIAS)) {
        fr_tensor *db = grad_of(dout[0], FR_F32, 1, FR_SHAPE(c->b_shape[0]));
        fr_status st = db ? fr_linear_backward(NULL, NULL, db, dout[0], NULL, NULL) : fr_last_status();
        if (st != FR_OK) {
            fr_release(db);
            return st;
        }
        din[MM_BIAS] = db;
    }
    return FR_OK;
}

static fr_status mm_record(const char *op, bool linear, int n_in, fr_tensor *const *in,
                           fr_dtype compute, fr_tensor *y) {
    mm_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return fr_error(FR_ERR_OOM, "%s: out of memory recording a node", op);
    fr_node *node = fr_node_new(op, mm_backward, n_in, in, 1);
    if (!node) {
        free(c);
        return fr_last_status();
    }
    c->linear = linear;
    memcpy(c->a_shape, in[MM_A]->shape, sizeof c->a_shape);
    memcpy(c->b_shape, in[MM_B]->shape, sizeof c->b_shape);
    c->a_dtype = in[MM_A]->dtype;
    c->b_dtype = in[MM_B]->dtype;
    c->compute = compute;
    c->a = c->b = -1;
    fr_node_set_ctx(node, c, NULL);
    if (fr_node_needs_grad(node, MM_B) && (c->a = fr_node_save(node, in[MM_A])) < 0)
        return fr_last_status();
    if (fr_node_needs_grad(node, MM_A) && (c->b = fr_node_save(node, in[MM_B])) < 0)
        return fr_last_status();
    fr_node_set_output(node, 0, y);
    return FR_OK;
}

/* Allocates y (rows of a, size b_dim of b) of `dtype` after checking that a
 * and b are 2-d. */
static fr_tensor *new_output(const char *op, const char *a_name, fr_tensor *a, const char *b_name,
                             fr_tensor *b, int b_dim, fr_dtype dtype) {
    if (fr_check_defined(op, a_name, a) != FR_OK || fr_check_defined(op, b_name, b) != FR_OK ||
        fr_check_ndim(op, a_name, a, 2) != FR_OK || fr_check_ndim(op, b_name, b, 2) != FR_OK)
        return NULL;
    return fr_empty(fr_device_of(a), dtype, 2, FR_SHAPE(a->shape[0], b->shape[b_dim]),
                    FR_TAG_TRANSIENT);
}

/* Under autocast y has the autocast dtype and w is cast to it for the call
 * (fr_autocast_weight); dx keeps x's dtype, dw and db are f32. */
fr_tensor *fr_linear(fr_tensor *x, fr_tensor *w, fr_tensor *b) {
    fr_dtype compute = x ? fr_autocast_out_dtype(x) : FR_F32;
    fr_tensor *y = new_output("linear", "x", x, "w", w, 0, compute);
    fr_tensor *wc = y ? fr_autocast_weight(w, compute) : NULL;
    if (!wc) {
        fr_release(y);
        return NULL;
    }
    fr_tensor *in[3] = {x, w, b};
    fr_status st = fr_linear_forward(y, x, wc, b);
    fr_release(wc);
    if (st == FR_OK && fr_should_record(3, in))
        st = mm_record("linear", true, 3, in, compute, y);
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}

fr_tensor *fr_matmul(fr_tensor *a, fr_tensor *b) {
    fr_tensor *y = new_output("matmul", "a", a, "b", b, 1, a ? a->dtype : FR_F32);
    if (!y)
        return NULL;
    if (a->shape[1] != b->shape[0]) {
        char sa[96], sb[96];
        fr_error(FR_ERR_SHAPE, "matmul: a %s and b %s do not chain (need a (M, K) and b (K, N))",
                 fr_shape_str(a, sa, sizeof sa), fr_shape_str(b, sb, sizeof sb));
        fr_release(y);
        return NULL;
    }
    fr_tensor *in[2] = {a, b};
    fr_status st = fr_gemm_out(y, a, b, false, false, 1.0f, 0.0f);
    if (st == FR_OK && fr_should_record(2, in))
        st = mm_record("matmul", false, 2, in, a->dtype, y);
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}
