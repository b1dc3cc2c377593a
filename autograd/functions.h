/* functions.h: the differentiable ops users call.
 *
 * Each returns a NEW reference (or NULL with fr_last_error() set). When grad
 * is enabled and an input requires grad, the op records a node (autograd.h)
 * saving only what its backward needs. Ops ending in `_` write into their
 * first argument, bump its version, and return a new reference to it; they
 * refuse a leaf that requires grad. One file per family: autograd/fn_*.c. */
#ifndef FR_FUNCTIONS_H
#define FR_FUNCTIONS_H

#include "autograd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fn_elementwise.c */
fr_tensor *fr_add(fr_tensor *a, fr_tensor *b);
fr_tensor *fr_add_(fr_tensor *a, fr_tensor *b);        /* a += b */
fr_tensor *fr_mul(fr_tensor *a, fr_tensor *b);
fr_tensor *fr_scale(fr_tensor *x, float alpha);
fr_tensor *fr_scale_(fr_tensor *x, float alpha);       /* x *= alpha */
fr_tensor *fr_sum(fr_tensor *x);                       /* one element */
fr_tensor *fr_mean(fr_tensor *x);                      /* one element */
/* A differentiable view with another shape (numel kept; one -1 allowed). */
fr_tensor *fr_reshape(fr_tensor *x, int ndim, const int64_t *shape);
/* (N, ...) -> (N, rest) */
fr_tensor *fr_flatten(fr_tensor *x);

/* fn_activation.c: backward keeps only the output, so the inplace forms
 * need no extra memory. */
fr_tensor *fr_relu(fr_tensor *x);
fr_tensor *fr_relu_(fr_tensor *x);
fr_tensor *fr_leaky_relu(fr_tensor *x, float slope);
fr_tensor *fr_leaky_relu_(fr_tensor *x, float slope);

/* fn_linear.c */
fr_tensor *fr_linear(fr_tensor *x, fr_tensor *w, fr_tensor *b);   /* b may be NULL */
fr_tensor *fr_matmul(fr_tensor *a, fr_tensor *b);                 /* (M,K)(K,N) */

/* fn_conv.c */
fr_tensor *fr_conv2d(fr_tensor *x, fr_tensor *w, fr_tensor *b, fr_conv_params p);

/* fn_batchnorm.c: training uses batch statistics and updates the running
 * ones (when given); eval uses the running ones. */
fr_tensor *fr_batch_norm(fr_tensor *x, fr_tensor *gamma, fr_tensor *beta, fr_tensor *running_mean,
                         fr_tensor *running_var, bool training, float momentum, float eps);

/* fn_pool.c */
fr_tensor *fr_max_pool2d(fr_tensor *x, fr_pool_params p);
fr_tensor *fr_avg_pool2d(fr_tensor *x, fr_pool_params p);
fr_tensor *fr_global_avg_pool(fr_tensor *x);           /* (N,C,H,W) -> (N,C) */

/* fn_concat.c: along channels (dim 1) */
fr_tensor *fr_concat(fr_tensor *const *inputs, int count);

/* fn_loss.c: fused log-softmax + NLL, mean over the batch; labels i32 */
fr_tensor *fr_cross_entropy(fr_tensor *logits, fr_tensor *labels);

#ifdef __cplusplus
}
#endif
#endif
