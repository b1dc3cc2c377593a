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

/* fn_activation.c: any activation of FR_ACT_LIST (tensor/shapes.h) as an
 * op; p is leaky ReLU's slope (> 0) or ELU's alpha (> 0), ignored by the
 * others. A node keeps the output, or the input for the activations whose
 * gradient needs it (fr_act_needs_input). The inplace forms write over x
 * and keep nothing more; they refuse an activation that needs its input. */
fr_tensor *fr_activation(fr_tensor *x, fr_act act, float p);
fr_tensor *fr_activation_(fr_tensor *x, fr_act act, float p);
fr_tensor *fr_sigmoid(fr_tensor *x);
fr_tensor *fr_tanh(fr_tensor *x);
fr_tensor *fr_relu(fr_tensor *x);
fr_tensor *fr_relu_(fr_tensor *x);
fr_tensor *fr_leaky_relu(fr_tensor *x, float slope);
fr_tensor *fr_leaky_relu_(fr_tensor *x, float slope);

/* fn_broadcast.c: add, sub, mul, div with NumPy broadcasting (the
 * output has the broadcast shape; shapes that do not broadcast are refused
 * naming both); the gradient of a broadcast operand is summed back to its
 * shape. fr_add and fr_mul take this path when their shapes differ; sub
 * and div always do. Operands f32, f16 or bf16; the output's dtype is
 * fr_binary_dtype's (PyTorch's promotion: half with f32 gives f32), each
 * gradient the dtype of its operand. */
fr_tensor *fr_broadcast_op(fr_binary_op op, fr_tensor *a, fr_tensor *b);
/* The dtype of a binary op's output: the operands' when they agree, else
 * f32 (f16 with bf16 too, as torch.promote_types). */
fr_dtype fr_binary_dtype(const fr_tensor *a, const fr_tensor *b);
fr_tensor *fr_sub(fr_tensor *a, fr_tensor *b);
fr_tensor *fr_div(fr_tensor *a, fr_tensor *b);
/* Sum or mean over dims (negative counts from the end, as PyTorch's),
 * keeping them as size 1 when keepdim: x.sum(dim=(2, 3), keepdim=True) is
 * fr_sum_dims(x, 2, (int[]){2, 3}, true). The output has x's dtype (f32,
 * f16 or bf16); the sums are f32 or wider. */
fr_tensor *fr_sum_dims(fr_tensor *x, int ndims, const int *dims, bool keepdim);
fr_tensor *fr_mean_dims(fr_tensor *x, int ndims, const int *dims, bool keepdim);
/* torch.amax(x, dims, keepdim): the maximum over dims; the gradient is
 * split evenly among the elements equal to it (keeps x) */
fr_tensor *fr_amax_dims(fr_tensor *x, int ndims, const int *dims, bool keepdim);

/* fn_softmax.c: over dim (negative from the end); keeps the output. The
 * output has x's dtype (f32, f16 or bf16), computed in f32. */
fr_tensor *fr_softmax(fr_tensor *x, int dim);
fr_tensor *fr_log_softmax(fr_tensor *x, int dim);

/* fn_clamp.c: min(max(x, lo), hi), lo <= hi; the gradient passes where lo
 * <= x <= hi (PyTorch's). Output in x's dtype (f32, f16 or bf16). */
fr_tensor *fr_clamp(fr_tensor *x, float lo, float hi);

/* fn_pad.c: F.pad(x, (left, right, top, bottom), mode) over the last two
 * dims; FR_PAD_ZERO or FR_PAD_REFLECT (each padding < the size it pads).
 * Output in x's dtype (f32, f16 or bf16). */
fr_tensor *fr_pad(fr_tensor *x, const int pad[4], fr_pad_mode mode);

/* fn_linear.c */
fr_tensor *fr_linear(fr_tensor *x, fr_tensor *w, fr_tensor *b);   /* b may be NULL */
fr_tensor *fr_matmul(fr_tensor *a, fr_tensor *b);                 /* (M,K)(K,N) */

/* fn_conv.c */
fr_tensor *fr_conv2d(fr_tensor *x, fr_tensor *w, fr_tensor *b, fr_conv_params p);
/* PyTorch's conv_transpose2d: x (N, Cin, H, W), w (Cin, Cout/groups, R, S),
 * b (Cout) or NULL (tensor/ops.h has the output shape). */
fr_tensor *fr_conv_transpose2d(fr_tensor *x, fr_tensor *w, fr_tensor *b, fr_conv_transpose_params p);

/* Channels last as an internal layout of a model (nn/model.h: its
 * channels-last mode; docs/ARCHITECTURE.md, layout between ops).
 * fn_conv.c: conv2d with channels-last output, on the CPU in f32 without
 * bias (x of either layout; dx comes back in x's layout); anything else
 * runs fr_conv2d on an NCHW x. fn_layout.c: fr_to_nchw, x itself when it
 * is not channels last, else a differentiable NCHW copy; fr_layout_copy, a
 * plain copy in the layout asked for (t itself, retained, when it has it). */
fr_tensor *fr_conv2d_channels_last(fr_tensor *x, fr_tensor *w, fr_tensor *b, fr_conv_params p);
fr_tensor *fr_to_nchw(fr_tensor *x);
fr_tensor *fr_to_channels_last(fr_tensor *x); /* the reverse: x when it is, else a copy */
fr_tensor *fr_layout_copy(const fr_tensor *t, bool channels_last);

/* fn_batchnorm.c: training uses batch statistics and updates the running
 * ones (when given); eval uses the running ones. */
fr_tensor *fr_batch_norm(fr_tensor *x, fr_tensor *gamma, fr_tensor *beta, fr_tensor *running_mean,
                         fr_tensor *running_var, bool training, float momentum, float eps);

/* fn_norm.c: F.group_norm(x, groups, weight, bias, eps) then `act` (p as
 * fr_activation's), in one pass each way; x (N, C, ...) f32, groups
 * dividing C. Layer norm over (C, H, W) is groups = 1, instance norm
 * groups = C. Keeps x and the statistics, never the output; `recompute`
 * gives the output a recipe, so an op that saves it keeps the recipe. */
fr_tensor *fr_group_norm_act(fr_tensor *x, fr_tensor *gamma, fr_tensor *beta, int groups, float eps,
                             fr_act act, float p, bool recompute);
fr_tensor *fr_group_norm(fr_tensor *x, fr_tensor *gamma, fr_tensor *beta, int groups, float eps);

/* fn_pool.c */
fr_tensor *fr_max_pool2d(fr_tensor *x, fr_pool_params p);
fr_tensor *fr_avg_pool2d(fr_tensor *x, fr_pool_params p);
fr_tensor *fr_global_avg_pool(fr_tensor *x);           /* (N,C,H,W) -> (N,C) */
/* (N, C, H, W) -> (N, C, out_h, out_w), PyTorch's adaptive_avg_pool2d */
fr_tensor *fr_adaptive_avg_pool2d(fr_tensor *x, int out_h, int out_w);

/* fn_upsample.c: PyTorch's interpolate(scale_factor = o.scale, mode,
 * align_corners) for an integer scale (tensor/ops.h) */
fr_tensor *fr_upsample(fr_tensor *x, fr_upsample_opts o);

/* fn_concat.c: along channels (dim 1) */
fr_tensor *fr_concat(fr_tensor *const *inputs, int count);
/* fr_concat whose output, when recorded, carries a recipe that concatenates
 * the inputs again (memory-efficient DenseNet, Pleiss et al. 2017): an op
 * that saves the output keeps the recipe, i.e. references to the inputs,
 * instead of the bytes. While the recipe lives the inputs count as saved in
 * the ledger; an input written inplace before backward makes the recompute
 * fail with FR_ERR_VERSION. */
fr_tensor *fr_concat_recomputable(fr_tensor *const *inputs, int count);
/* x's range [start, start + length) of dim 0 or 1, as a new tensor, with a
 * gradient (a block's channel split): the differentiable fr_narrow. */
fr_tensor *fr_slice(fr_tensor *x, int dim, int64_t start, int64_t length);

/* fn_dropout.c: in training zeroes each element with probability p and
 * scales the rest by 1 / (1 - p); in eval returns x itself (a new
 * reference). Keeps no mask: backward redraws it from the op's seed. */
fr_tensor *fr_dropout(fr_tensor *x, float p, bool training);

/* fn_cast.c: x converted to dtype (f32, f16, bf16; x itself, a new
 * reference, when it already has it); the gradient is converted back. */
fr_tensor *fr_cast(fr_tensor *x, fr_dtype dtype);

/* For ops that make activations from weights (conv2d, linear): the dtype
 * they compute in and output — autocast's when it is on, else x's — and a
 * weight cast to it on the fly (w itself, a new reference, when it already
 * has it; the cast is workspace and is dropped after the op). The f32
 * weight stays the one the optimizer updates and the one backward saves
 * (a parameter costs nothing to hold); backward casts it again. */
fr_dtype fr_autocast_out_dtype(const fr_tensor *x);
fr_tensor *fr_autocast_weight(fr_tensor *w, fr_dtype compute);

/* fn_loss.c: fused log-softmax + NLL, mean over the batch; labels i32 */
fr_tensor *fr_cross_entropy(fr_tensor *logits, fr_tensor *labels);
/* ... with label smoothing eps in [0, 1] (F.cross_entropy(...,
 * label_smoothing=eps)); eps 0 is fr_cross_entropy. */
fr_tensor *fr_cross_entropy_smooth(fr_tensor *logits, fr_tensor *labels, float eps);
/* Pointwise losses, mean over every element, PyTorch's formulas
 * (tensor/loss_math.h): pred and target f32 of one shape; the target
 * takes no gradient (refused if it requires one). smooth L1's beta >= 0
 * (0: L1); BCE takes logits and targets in [0, 1]. */
fr_tensor *fr_mse_loss(fr_tensor *pred, fr_tensor *target);
fr_tensor *fr_l1_loss(fr_tensor *pred, fr_tensor *target);
fr_tensor *fr_smooth_l1_loss(fr_tensor *pred, fr_tensor *target, float beta);
fr_tensor *fr_bce_with_logits_loss(fr_tensor *logits, fr_tensor *target);

/* fn_bn_act.c: fused batch norm (training statistics) + optional residual
 * add + activation: y = act(BN(x) + residual). The building block of the
 * memory strategies:
 *  - FR_BNACT_RECOMPUTE keeps only x and the batch mean/invstd; without a
 *    residual the output carries a recipe, so an op that saves it (the next
 *    conv) keeps the recipe instead of the bytes and backward recomputes it;
 *    with a residual the output (a block output, held anyway by the next
 *    block) is kept for the activation's mask.
 *  - FR_BNACT_INPLACE_ABN (Rota Bulo et al. 2018) writes y over x and keeps
 *    only y: backward inverts the activation (leaky ReLU or identity; plain
 *    ReLU is rejected) and the affine map, whose scale is |gamma| + eps.
 *  - FR_BNACT_RECOMPUTE_X is RECOMPUTE where x itself carries a recipe (a
 *    fr_concat_recomputable output): x is saved as that recipe, and y's
 *    recipe is built from it, so neither x nor y stays alive (memory-
 *    efficient DenseNet). Backward rebuilds x once for BN's gradient, and
 *    once more for the op that saved y (BN is applied in place over the
 *    rebuilt x); each is freed right after use. An x without a recipe is
 *    kept as in RECOMPUTE.
 *  - FR_BNACT_KEEP keeps x and y, what the chain of separate ops keeps
 *    under the inplace strategy (BN its input, the activation its output),
 *    in one pass forward and one backward instead of three and two.
 * Training mode only when recording; under no_grad eval mode is fine. */
/* fr_act is in tensor/shapes.h. */
typedef enum {
    FR_BNACT_RECOMPUTE = 0,
    FR_BNACT_INPLACE_ABN,
    FR_BNACT_RECOMPUTE_X,
    FR_BNACT_KEEP,
    FR_BNACT_COUNT
} fr_bnact_mode;
typedef struct {
    fr_tensor *gamma, *beta, *running_mean, *running_var;
    float momentum, eps;
    bool training;
} fr_bn_state;
fr_tensor *fr_bn_act(fr_tensor *x, fr_tensor *residual, const fr_bn_state *bn, fr_act act,
                     float slope, fr_bnact_mode mode);
/* |gamma| + eps, differentiable: InPlace-ABN's scale computed the plain way. */
fr_tensor *fr_abn_scale(fr_tensor *gamma, float eps);
/* The slope InPlace-ABN uses with leaky ReLU. */
#define FR_ABN_SLOPE 0.01f

/* fn_checkpoint.c: runs fn(ctx, x) keeping none of its activations (only x);
 * backward runs the segment again with grad on and backpropagates through
 * it. The node owns what the replay reads: a copy of the ctx_size bytes at
 * fn_ctx (taken before the forward; fn gets the copy both times), the random
 * state and the autocast dtype. So put in ctx everything the segment reads
 * that may change before backward (training flag, strategy, which blocks);
 * pointers in it (layers, parameters) must stay valid until backward. BN
 * running statistics are updated once (the replay runs in recompute mode).
 * A parameter, buffer or constant fn read and did not make that is written
 * inplace before backward is FR_ERR_VERSION there; fn may return x itself
 * (the gradient passes through); a tensor fn made, other than its output,
 * that a recorded op reads later is FR_ERR_GRAPH (its gradient would be
 * lost; checkpoint_log.h). */
typedef fr_tensor *(*fr_segment_fn)(void *ctx, fr_tensor *x);
fr_tensor *fr_checkpoint(fr_segment_fn fn, const void *fn_ctx, size_t ctx_size, fr_tensor *x);

#ifdef __cplusplus
}
#endif
#endif
