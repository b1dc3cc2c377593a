/* ops.h: tensor-level compute, without the tape.
 *
 * Each function checks its tensors (defined, f32 unless said, contiguous,
 * shapes that fit, one device) and returns an error naming the op, the
 * argument and the fault, then runs the kernel for the tensors' device
 * (tensor/kernels.def). Outputs come first and are allocated by the caller;
 * every op overwrites its outputs unless it says it accumulates. Forward and
 * backward of a family sit side by side in one file, tensor/ops_<family>.c.
 * autograd/ builds the differentiable ops on top of these. Suffixes:
 * _forward/_backward (a differentiable op's halves), _out (no backward of
 * its own), _ (first argument read and written), _shape: the rule is in
 * docs/ARCHITECTURE.md ("One naming rule for the two op APIs"). */
#ifndef FR_OPS_H
#define FR_OPS_H

#include "shapes.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise (ops_elementwise.c); same shapes; out may alias inputs ---- */
fr_status fr_add_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b);
fr_status fr_mul_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b);
fr_status fr_scale_out(fr_tensor *out, const fr_tensor *x, float alpha);
/* y += alpha * x (accumulates) */
fr_status fr_axpy_(fr_tensor *y, float alpha, const fr_tensor *x);
/* out (1 element) = sum of x */
fr_status fr_sum_out(fr_tensor *out, const fr_tensor *x);
/* y[i] = scale * src[0] */
fr_status fr_fill_from_out(fr_tensor *y, const fr_tensor *src, float scale);

/* ---- activations (ops_activation.c; shapes.h lists them). y may be x.
 * p is leaky ReLU's slope (> 0) or ELU's alpha (> 0); the others ignore
 * it. Backward reads s: the output y when the activation's gradient needs
 * only the output, else the input x (fr_act_needs_input). ---- */
fr_status fr_act_forward(fr_tensor *y, const fr_tensor *x, fr_act act, float p);
fr_status fr_act_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *s, fr_act act,
                          float p);
/* "relu", "gelu_tanh", ...: PyTorch's functional names */
const char *fr_act_name(fr_act act);
/* FR_ACT_NEEDS_INPUT in FR_ACT_LIST: backward needs x, not just y */
bool fr_act_needs_input(fr_act act);
/* x recoverable from y in f32 (identity, leaky ReLU): what InPlace-ABN needs */
bool fr_act_is_invertible(fr_act act);
/* FR_ERR_ARG naming op when act is unknown or its parameter out of range */
fr_status fr_act_check(const char *op, fr_act act, float p);
/* the same for ReLU and leaky ReLU (slope > 0) */
fr_status fr_relu_forward(fr_tensor *y, const fr_tensor *x);
fr_status fr_relu_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y);
fr_status fr_leaky_relu_forward(fr_tensor *y, const fr_tensor *x, float slope);
fr_status fr_leaky_relu_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y, float slope);

/* ---- broadcasting (ops_broadcast.c; shapes.h); f32, f16 or bf16
 * operands, each its own, staged to f32 in blocks (staging.h) ---- */
/* The broadcast of a's and b's shapes (NumPy's rule), or FR_ERR_SHAPE
 * naming op and both shapes. */
fr_status fr_broadcast_shape(const char *op, const fr_tensor *a, const fr_tensor *b, int *ndim,
                             int64_t *shape);
/* out (the broadcast shape) = op(a, b); FR_BINARY_FIRST expands a to out's
 * shape and ignores b (may be NULL); FR_BINARY_EQ gives 1 or 0 */
fr_status fr_bcast_binary_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b,
                              fr_binary_op op);
/* out = scale * x summed down to out's shape: out right-aligned against x,
 * each of its dims x's size or 1 (the gradient of a broadcast operand) */
fr_status fr_reduce_sum_out(fr_tensor *out, const fr_tensor *x, float scale);
/* out = scale * (x * w) summed down to out's shape, w of x's shape: in
 * f32 the same bits as multiplying into a tensor and summing that, in one
 * pass (with half operands the product is not rounded to half) */
fr_status fr_reduce_sum_prod_out(fr_tensor *out, const fr_tensor *x, const fr_tensor *w,
                                 float scale);
/* out = the maximum of x over the same dims (a NaN wins) */
fr_status fr_reduce_max_out(fr_tensor *out, const fr_tensor *x);

/* ---- softmax over dim (ops_softmax.c), y shaped like x; f32, f16 or
 * bf16, each its own, staged per outer index (staging.h); log_out for
 * log-softmax. Backward reads the output y only. ---- */
fr_status fr_softmax_forward(fr_tensor *y, const fr_tensor *x, int dim, bool log_out);
fr_status fr_softmax_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y, int dim,
                              bool log_out);

/* ---- padding of the last two dims and clamp (ops_pad.c); f32, f16 or
 * bf16, each its own, staged per plane / run of elements. pad is
 * (left, right, top, bottom), F.pad's order; reflect needs each < the size
 * it pads. ---- */
fr_status fr_pad2d_shape(const fr_tensor *x, const int pad[4], fr_pad_mode mode, fr_pad_shape *s);
fr_status fr_pad2d_forward(fr_tensor *y, const fr_tensor *x, const int pad[4], fr_pad_mode mode);
fr_status fr_pad2d_backward(fr_tensor *dx, const fr_tensor *dy, const int pad[4], fr_pad_mode mode);
/* y = min(max(x, lo), hi), lo <= hi; dx = dy where lo <= x <= hi */
fr_status fr_clamp_forward(fr_tensor *y, const fr_tensor *x, float lo, float hi);
fr_status fr_clamp_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *x, float lo,
                            float hi);

/* ---- matrix products (ops_linear.c) ---- */
/* c(M,N) = alpha * op(a) op(b) + beta * c; 2-d tensors */
fr_status fr_gemm_out(fr_tensor *c, const fr_tensor *a, const fr_tensor *b, bool trans_a,
                      bool trans_b, float alpha, float beta);
/* y(N,OUT) = x(N,IN) w(OUT,IN)^T + b(OUT); b may be NULL */
fr_status fr_linear_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *w, const fr_tensor *b);
/* any of dx, dw, db may be NULL (not wanted) */
fr_status fr_linear_backward(fr_tensor *dx, fr_tensor *dw, fr_tensor *db, const fr_tensor *dy,
                             const fr_tensor *x, const fr_tensor *w);

/* ---- convolution (ops_conv.c); fr_conv_params in shapes.h ---- */
/* The output shape for x (N,C,H,W) and w (K,C/groups,R,S), or an error:
 * OH = (H + 2 pad - dilation (R - 1) - 1) / stride + 1, as PyTorch. */
fr_status fr_conv2d_shape(const fr_tensor *x, const fr_tensor *w, fr_conv_params p, fr_conv_shape *s);
/* y (N,K,OH,OW) = conv(x, w) + b; b (K) may be NULL */
fr_status fr_conv2d_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *w, const fr_tensor *b,
                            fr_conv_params p);
/* any of dx, dw, db may be NULL (not wanted); x is needed only for dw */
fr_status fr_conv2d_backward(fr_tensor *dx, fr_tensor *dw, fr_tensor *db, const fr_tensor *dy,
                             const fr_tensor *x, const fr_tensor *w, fr_conv_params p);

/* ---- transposed convolution (ops_conv.c), PyTorch's ConvTranspose2d:
 * x (N, Cin, H, W), w (Cin, Cout/groups, R, S), b (Cout), y (N, Cout, OH, OW)
 * with OH = (H - 1) stride - 2 pad + dilation (R - 1) + output_pad + 1. It
 * is the data gradient of the convolution with that weight, and is run as
 * one (cuDNN and oneDNN's backward-data kernels). ---- */
/* fr_conv_transpose_params in shapes.h */
/* The convolution it transposes: s's input is y's shape, s's output x's. */
fr_status fr_conv_transpose2d_shape(const fr_tensor *x, const fr_tensor *w,
                                    fr_conv_transpose_params p, fr_conv_shape *s);
fr_status fr_conv_transpose2d_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *w,
                                      const fr_tensor *b, fr_conv_transpose_params p);
/* any of dx, dw, db may be NULL (not wanted); x is needed only for dw */
fr_status fr_conv_transpose2d_backward(fr_tensor *dx, fr_tensor *dw, fr_tensor *db,
                                       const fr_tensor *dy, const fr_tensor *x, const fr_tensor *w,
                                       fr_conv_transpose_params p);

/* ---- batch norm (ops_batchnorm.c). x (N,C,H,W) or (N,C); per-channel
 * tensors (C). ---- */
/* Training: batch statistics into mean/invstd (saved for backward), then
 * normalise; running stats updated when given (may be NULL). */
fr_status fr_batch_norm_train_forward(fr_tensor *y, fr_tensor *mean, fr_tensor *invstd,
                                     const fr_tensor *x, const fr_tensor *gamma, const fr_tensor *beta,
                                     fr_tensor *running_mean, fr_tensor *running_var,
                                     float momentum, float eps);
/* Eval: normalise with the running statistics. */
fr_status fr_batch_norm_eval_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *gamma,
                                    const fr_tensor *beta, const fr_tensor *running_mean,
                                    const fr_tensor *running_var, float eps);
/* invstd (C) = 1 / sqrt(var (C) + eps): the eval-mode scale, kept by an
 * eval-mode node for its backward. */
fr_status fr_batch_norm_invstd(fr_tensor *invstd, const fr_tensor *var, float eps);
/* Normalise with given statistics (what recompute-on-backward replays). */
fr_status fr_batch_norm_apply(fr_tensor *y, const fr_tensor *x, const fr_tensor *mean,
                             const fr_tensor *invstd, const fr_tensor *gamma, const fr_tensor *beta);
/* Training-mode backward; dx may be NULL. */
fr_status fr_batch_norm_backward(fr_tensor *dx, fr_tensor *dgamma, fr_tensor *dbeta,
                                const fr_tensor *dy, const fr_tensor *x, const fr_tensor *mean,
                                const fr_tensor *invstd, const fr_tensor *gamma);
/* Training: the batch statistics alone (fr_batch_norm_train_forward without
 * the normalising pass, for ops that fuse it with what follows). */
fr_status fr_batch_norm_train_stats(fr_tensor *mean, fr_tensor *invstd, const fr_tensor *x,
                                    fr_tensor *running_mean, fr_tensor *running_var,
                                    float momentum, float eps);

/* ---- batch norm + residual + activation in one pass (ops_batchnorm.c),
 * the kernels of autograd's fused op (fr_bn_act). ---- */
/* y = act((x - mean) * invstd * gamma + beta + residual), rounded as
 * fr_batch_norm_apply, fr_add_out and the activation would in turn (the
 * same bits); residual may be NULL; y may be x or residual; slope is
 * the activation's parameter (fr_act_forward). */
fr_status fr_bn_act_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *residual,
                            const fr_tensor *mean, const fr_tensor *invstd, const fr_tensor *gamma,
                            const fr_tensor *beta, fr_act act, float slope);
/* Training-mode backward of fr_bn_act_forward from dy: dz = dy * act'
 * (the gradient at the activation's input, which is also the residual's),
 * then batch norm's backward over dz, with the bits of fr_act_backward
 * followed by fr_batch_norm_backward. An activation whose gradient needs
 * only its output reads act_out, or when act_out is NULL the activation
 * of (x - mean) * invstd * gamma + beta recomputed on the fly; one that
 * needs its input (fr_act_needs_input) always recomputes that
 * pre-activation and ignores act_out. Recomputing needs a forward without
 * residual. dx and dz may be NULL (not wanted). */
fr_status fr_bn_act_backward(fr_tensor *dx, fr_tensor *dz, fr_tensor *dgamma, fr_tensor *dbeta,
                             const fr_tensor *dy, const fr_tensor *act_out, const fr_tensor *x,
                             const fr_tensor *mean, const fr_tensor *invstd,
                             const fr_tensor *gamma, const fr_tensor *beta, fr_act act,
                             float slope);

/* Synchronised batch norm (data parallelism: dist/). While a sum function
 * is set (per thread; NULL turns it off), fr_batch_norm_train_forward
 * combines its batch statistics with every other process's (counts, means
 * and variances, Chan's pairwise form) and normalises and updates the
 * running statistics with the global ones; fr_batch_norm_backward, when it
 * computes dx, does so from the per-channel sums of dy and dy * xhat over
 * all processes (dgamma and dbeta stay this process's: the gradient
 * all-reduce adds them). fn replaces n doubles by their sum over processes;
 * every process must make the same calls in the same order. */
typedef fr_status (*fr_bn_sum_fn)(double *values, int n, void *ctx);
void fr_batch_norm_set_sync(fr_bn_sum_fn fn, void *ctx);
/* Whether a sum function is set on this thread: fr_bn_act_backward then
 * takes the chain of separate ops, and a channels-last model runs NCHW
 * (nn/model.h). */
bool fr_batch_norm_synced(void);

/* ---- group normalisation + activation (ops_groupnorm.c), f32. x (N, C,
 * ...) in `groups` groups (dividing C); mean, invstd (N, groups); gamma
 * (weight), beta (bias) (C). ---- */
fr_status fr_group_norm_stats(fr_tensor *mean, fr_tensor *invstd, const fr_tensor *x, int groups,
                              float eps);
/* y = act(GN(x)); y may be x */
fr_status fr_group_norm_act_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *mean,
                                    const fr_tensor *invstd, const fr_tensor *gamma,
                                    const fr_tensor *beta, int groups, fr_act act, float slope);
/* from x (the pre-activation is recomputed, no output kept); dx may be
 * NULL; dgamma, dbeta overwritten */
fr_status fr_group_norm_act_backward(fr_tensor *dx, fr_tensor *dgamma, fr_tensor *dbeta,
                                     const fr_tensor *dy, const fr_tensor *x, const fr_tensor *mean,
                                     const fr_tensor *invstd, const fr_tensor *gamma,
                                     const fr_tensor *beta, int groups, fr_act act, float slope);

/* ---- pooling (ops_pool.c); fr_pool_params in shapes.h ---- */
fr_status fr_pool2d_shape(const fr_tensor *x, fr_pool_params p, fr_pool_shape *s);
fr_status fr_max_pool2d_forward(fr_tensor *y, const fr_tensor *x, fr_pool_params p);
fr_status fr_max_pool2d_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *x, fr_pool_params p);
fr_status fr_avg_pool2d_forward(fr_tensor *y, const fr_tensor *x, fr_pool_params p);
fr_status fr_avg_pool2d_backward(fr_tensor *dx, const fr_tensor *dy, fr_pool_params p);
/* Adaptive average pooling (PyTorch's AdaptiveAvgPool2d): y's shape (N, C,
 * OH, OW) gives the output size; in backward dx carries the input's. */
fr_status fr_adaptive_avg_pool2d_forward(fr_tensor *y, const fr_tensor *x);
fr_status fr_adaptive_avg_pool2d_backward(fr_tensor *dx, const fr_tensor *dy);

/* ---- upsampling (ops_upsample.c): x (N, C, H, W) -> y (N, C, H * scale,
 * W * scale), PyTorch's nn.Upsample(scale_factor = scale, mode,
 * align_corners) for an integer scale ---- */
/* fr_upsample_opts in shapes.h */
/* FR_ERR_ARG naming op and `name` (a layer) for a bad scale, mode, or
 * align_corners with nearest (PyTorch refuses that too). */
fr_status fr_upsample_check(const char *op, const char *name, fr_upsample_opts o);
fr_status fr_upsample_shape_of(const fr_tensor *x, fr_upsample_opts o, fr_upsample_shape *s);
fr_status fr_upsample_forward(fr_tensor *y, const fr_tensor *x, fr_upsample_opts o);
/* dx carries the input's shape */
fr_status fr_upsample_backward(fr_tensor *dx, const fr_tensor *dy, fr_upsample_opts o);
/* y (N,C) = mean over H,W of x (N,C,H,W) */
fr_status fr_global_avg_pool_forward(fr_tensor *y, const fr_tensor *x);
fr_status fr_global_avg_pool_backward(fr_tensor *dx, const fr_tensor *dy);

/* ---- concat along channels (ops_concat.c). Inputs (N,Ci,H,W) -> out
 * (N,sum Ci,H,W); backward writes the slices of dout into each dx[i] that is
 * not NULL. The dx shapes give the channel offsets, so at most one dx may be
 * NULL (its width is what is left). Inputs may be channel-slice views. ---- */
fr_status fr_concat_forward(fr_tensor *out, fr_tensor *const *inputs, int count);
fr_status fr_concat_backward(fr_tensor *const *dx, int count, const fr_tensor *dout);
/* dx += src, both f32 (N,C,H,W) of one shape, each contiguous or a channel
 * slice: the concat backward adds its slice of dout straight into a gradient
 * already accumulated for that input, with no slice copy in between. */
fr_status fr_concat_backward_add(fr_tensor *dx, const fr_tensor *src);

/* ---- loss (ops_loss.c): fused log-softmax + NLL, mean over the batch.
 * logits (N,K) f32, labels (N) i32 in [0,K), loss (1) ---- */
fr_status fr_cross_entropy_forward(fr_tensor *loss, const fr_tensor *logits, const fr_tensor *labels);
fr_status fr_cross_entropy_backward(fr_tensor *dlogits, const fr_tensor *dloss, const fr_tensor *logits,
                                    const fr_tensor *labels);
/* Pointwise losses (tensor/loss_math.h has the formulas), mean over every
 * element: pred and target f32, contiguous, the same shape and device;
 * loss one element; beta is smooth L1's (>= 0). Backward: dpred =
 * dloss * loss'(pred) / n. */
fr_status fr_pointwise_loss_forward(fr_tensor *loss, const fr_tensor *pred, const fr_tensor *target,
                                    fr_pointwise_loss kind, float beta);
fr_status fr_pointwise_loss_backward(fr_tensor *dpred, const fr_tensor *dloss, const fr_tensor *pred,
                                     const fr_tensor *target, fr_pointwise_loss kind, float beta);

/* ---- InPlace-ABN helpers (ops_abn.c); per-channel tensors (C), x-shaped
 * tensors (N,C,H,W) or (N,C) ---- */
fr_status fr_abn_gamma_forward(fr_tensor *gamma_eff, const fr_tensor *gamma, float eps);
fr_status fr_abn_gamma_backward(fr_tensor *dgamma, const fr_tensor *dgamma_eff, const fr_tensor *gamma);
/* residual may be NULL; slope 1 means the identity activation */
fr_status fr_abn_invert_out(fr_tensor *xhat, const fr_tensor *y, const fr_tensor *gamma_eff,
                            const fr_tensor *beta, const fr_tensor *residual, float slope);

/* ---- optimizer updates (ops_optim.c): in place on a parameter w and its
 * state; w, the state and the gradient g are f32, contiguous, one shape, one
 * device. Scalars are doubles as in PyTorch's Python code and are rounded to
 * f32 where PyTorch's kernels round them. Both bump w's version. ---- */
/* SGD with momentum, dampening, Nesterov and (L2) weight decay. buf is the
 * momentum buffer (NULL when momentum == 0); first_step fills it from the
 * gradient instead of decaying it. */
fr_status fr_sgd_update_(fr_tensor *w, fr_tensor *buf, const fr_tensor *g, double lr, double momentum,
                         double dampening, double weight_decay, bool nesterov, bool first_step);
/* Adam (decoupled false: weight decay added to the gradient) or AdamW
 * (decoupled true: w *= 1 - lr * weight_decay), step t >= 1 counted per
 * parameter, m and v the moments. */
fr_status fr_adam_update_(fr_tensor *w, fr_tensor *m, fr_tensor *v, const fr_tensor *g, double lr,
                          double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                          int64_t t);

/* ---- mixed precision (ops_amp.c): the gradient checks of dynamic loss
 * scaling (train/amp.h). f32, contiguous tensors on one device. ---- */
/* count (one f32 element) += the number of inf / NaN elements of x
 * (accumulates: zero count once, then pass every gradient; read it once). */
fr_status fr_nonfinite_count_(fr_tensor *count, const fr_tensor *x);
/* x *= inv_scale in place; bumps x's version. */
fr_status fr_unscale_(fr_tensor *x, float inv_scale);

/* ---- dropout (ops_dropout.c): p in [0, 1); the mask comes from the seed
 * (kernels.def), so backward needs only p and the seed ---- */
fr_status fr_dropout_forward(fr_tensor *y, const fr_tensor *x, float p, uint64_t seed);
fr_status fr_dropout_backward(fr_tensor *dx, const fr_tensor *dy, float p, uint64_t seed);

/* ---- compressed saved activations (ops_compress.c; kernels.def says the
 * format). x f32, contiguous or channels last (codes follow its storage
 * order: unpack into the layout packed); packed / mask u8, contiguous, one
 * dimension of fr_compress_nbytes(bits, numel(x)) / fr_sign_nbytes(numel(x))
 * elements, on x's device; bits 8, 4 or 2. ---- */
fr_status fr_compress_pack_out(fr_tensor *packed, const fr_tensor *x, int bits, uint64_t seed);
fr_status fr_compress_unpack_out(fr_tensor *x, const fr_tensor *packed, int bits);
/* mask bit = x > 0; unpack writes 1 or 0 */
fr_status fr_sign_pack_out(fr_tensor *mask, const fr_tensor *x);
fr_status fr_sign_unpack_out(fr_tensor *y, const fr_tensor *mask);
/* dx = ReLU's (act FR_ACT_RELU) or leaky ReLU's gradient of dy read from the
 * mask's bits, without an f32 mask (kernels.def: sign_act_backward); dx and
 * dy f32, of one shape and one layout (contiguous or channels last); dx may
 * be dy */
fr_status fr_sign_act_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *mask,
                               fr_act act, float slope);

#ifdef __cplusplus
}
#endif
#endif
