/* build.h: writing a model in C. A model is a tree of named modules; the
 * engine runs it and applies every memory strategy (model.h) to any model
 * written with it, so a model holds no strategy code of its own.
 *
 *     fr_model *m = fr_model_new("tiny", 1, 10, 42);          // in channels, classes, seed
 *     fr_module *net = fr_model_root(m);                      // a chain: children run in order
 *     fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = 1, .out = 16});
 *     fr_norm_new(net, "bn1", (fr_norm_opts){.channels = 16, .act = FR_ACT_RELU});
 *     fr_max_pool2d_new(net, "pool", (fr_pool_params){.kernel = 2, .stride = 2});
 *     fr_global_avg_pool_new(net, "gap");
 *     fr_linear_new(net, "fc", (fr_linear_opts){.in = 16, .out = 10});
 *     m = fr_model_finish(m);        // NULL with the first construction error
 *
 * Parameter names are the dotted path of module names, as PyTorch's
 * state_dict spells them: "conv1.weight", "layer1.0.bn2.running_mean". An
 * empty name ("") adds no component (the root's is empty).
 *
 * Modules:
 *  - layers: conv2d, conv_transpose2d, norm (BatchNorm2d + activation),
 *    linear, pools, upsample, flatten, dropout. Each reads its input and returns a new tensor.
 *  - chain: its children run one after another (nested chains are run as
 *    their children, so "layer1.0" in "layer1" in the root is one step of
 *    the root's sequence).
 *  - dense: child i reads the concatenation (channels) of the dense module's
 *    input and the outputs of children 0..i-1; the dense module returns the
 *    concatenation of its input and every child's output (DenseNet).
 *  - block: a forward function you write over layers you create inside it
 *    (a residual block). Its layers are named under the block; the engine
 *    does not run them on its own.
 *
 * How each strategy reaches a model built this way (docs/MODELS.md):
 *  - recompute, abn, abn_reference: applied by the norm layers
 *    (BN + activation, with an optional residual: fr_norm_add) and by
 *    fr_residual_add; nothing else changes.
 *  - recompute also makes a dense module's concatenations recipes
 *    (memory-efficient DenseNet).
 *  - checkpoint: the engine cuts the root's sequence (and each dense
 *    module's children) into segments, each kept only as its input and
 *    replayed in backward. "checkpoint:k" puts k steps in a segment;
 *    "checkpoint" chooses segments from the bytes each step was measured to
 *    keep, under the current strategy and precision (a trial forward on the
 *    first step of each input shape; nn/seg_split.h). A step is a block, a dense
 *    module, a nested chain of layers only, or a conv2d (or conv_transpose2d)
 *    layer with the layers after it up to the next conv (so a flat chain of layers is cut
 *    between convs); dense modules are never inside a segment of the
 *    sequence around them (they checkpoint their own children instead).
 * A strategy the model cannot honour is refused with FR_ERR_ARG naming the
 * model and the strategy: abn where a norm layer's input is still read
 * elsewhere (the input of a block, which the engine holds for the block's
 * whole forward, a tensor another layer keeps, or one passed borrowed, as
 * fr_forward and fr_norm_add pass it), checkpoint on a model
 * with nothing to cut (one step at the root, no dense module of two), any
 * strategy on a model without norm layers (checkpoint excepted). A forward
 * written by hand is a block (the root's only child, if it is the whole
 * model): it runs under every strategy, its norm layers applying them.
 *
 * Conventions. Constructors return the new module, BORROWED (the model owns
 * it and frees it with the model). They return NULL, leaving the error
 * alone, when `parent` is NULL or an earlier construction in the model
 * failed; the first failure is kept and fr_model_finish returns it. Forwards
 * take their input borrowed and return a NEW reference; a NULL input gives
 * NULL under the one NULL convention of every function (fr_error_null in
 * tensor/fr_base.h: the pending first error is kept, so
 * `y = fr_forward_take(l, y, run)` reports what failed first); any
 * other failure returns NULL with fr_last_error() set. Module pointers stay valid until the model is freed, which must not
 * happen between a forward and its backward. */
#ifndef FR_BUILD_H
#define FR_BUILD_H

#include "../autograd/functions.h"
#include "init.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- chaining ---- */
/* Releases prev and returns next: `x = fr_chain(x, fr_relu(x))`. */
static inline fr_tensor *fr_chain(fr_tensor *prev, fr_tensor *next) {
    fr_release(prev);
    return next;
}

/* What a forward reads besides its input; made by fr_model_forward and
 * passed down unchanged (a checkpoint keeps a copy for its replay). */
typedef struct fr_run {
    char model[32];        /* the model's name, for errors */
    fr_strategy strategy;
    bool training;         /* batch statistics (and dropout) on */
    bool in_segment;       /* inside a checkpointed segment: no nested segments */
    bool channels_last;    /* the model's channels-last mode (model.h: fr_layout_mode) */
} fr_run;

typedef enum {
    FR_MODULE_LAYER = 0,
    FR_MODULE_BLOCK,
    FR_MODULE_CHAIN,
    FR_MODULE_DENSE,
    FR_MODULE_KIND_COUNT
} fr_module_kind;

typedef struct fr_module fr_module;
/* A block's forward: x borrowed, a new reference out (see Conventions). */
typedef fr_tensor *(*fr_block_fn)(fr_module *self, fr_tensor *x, const fr_run *run);

/* ---- model and containers ---- */
/* A model whose root is an empty chain named ""; weights are initialised
 * from `seed` in construction order (nn/init.h). NULL with an error. */
fr_model *fr_model_new(const char *name, int in_channels, int num_classes, uint64_t seed);
fr_module *fr_model_root(fr_model *m);
/* Ends construction: returns m, or frees it and returns NULL with the first
 * construction error. NULL-safe. */
fr_model *fr_model_finish(fr_model *m);

fr_module *fr_chain_new(fr_module *parent, const char *name);
fr_module *fr_dense_new(fr_module *parent, const char *name);
/* A block with `state_size` zeroed bytes of state for your struct (layer
 * pointers, flags): fr_block_state. */
fr_module *fr_block_new(fr_module *parent, const char *name, fr_block_fn forward, size_t state_size);
void *fr_block_state(const fr_module *block);

/* ---- layers (defaults in brackets; zero fields take them) ---- */
typedef struct {
    int in, out;       /* channels (required) */
    int kernel;        /* square [3] */
    int stride;        /* [1] */
    int pad;           /* [dilation * (kernel / 2)]; FR_NO_PAD for none */
    bool bias;         /* [false: a norm layer usually follows] */
    int groups;        /* [1]; in and out multiples of it; depthwise: groups == in */
    int dilation;      /* [1] */
} fr_conv2d_opts;
#define FR_NO_PAD (-1)
fr_module *fr_conv2d_new(fr_module *parent, const char *name, fr_conv2d_opts o);

/* nn.ConvTranspose2d(in, out, kernel, stride, pad, output_pad, groups,
 * bias): weight (in, out/groups, kernel, kernel); output size (H - 1) *
 * stride - 2 pad + kernel + output_pad. Bias on unless no_bias, as PyTorch. */
typedef struct {
    int in, out;       /* channels (required) */
    int kernel;        /* square (required) */
    int stride;        /* [1] */
    int pad;           /* [0] */
    int output_pad;    /* [0]; smaller than stride */
    int groups;        /* [1] */
    bool no_bias;      /* [bias on, as PyTorch] */
} fr_conv_transpose2d_opts;
fr_module *fr_conv_transpose2d_new(fr_module *parent, const char *name, fr_conv_transpose2d_opts o);

/* nn.Upsample(scale_factor = scale, mode, align_corners) with an integer
 * scale (fr_upsample_opts: tensor/ops.h) */
fr_module *fr_upsample_new(fr_module *parent, const char *name, fr_upsample_opts o);
/* nn.AdaptiveAvgPool2d((out_h, out_w)) */
fr_module *fr_adaptive_avg_pool2d_new(fr_module *parent, const char *name, int out_h, int out_w);

/* BatchNorm2d (momentum 0.1, eps 1e-5) then `act` [identity], fused. The
 * one layer where recompute and abn change how things run. Any fr_act
 * (tensor/shapes.h); abn takes only the invertible ones (identity,
 * leaky ReLU) and ReLU, which it turns into LeakyReLU 0.01; the others are
 * refused under abn.
 * Other kinds (eps 1e-5, weight 1 and bias 0, PyTorch's names "weight" and
 * "bias", no running statistics, the same in training and eval):
 * FR_NORM_GROUP is nn.GroupNorm(groups, channels), FR_NORM_LAYER
 * nn.GroupNorm(1, channels) (layer norm over C, H, W of each sample), and
 * FR_NORM_INSTANCE nn.InstanceNorm2d(channels, affine=True) (=
 * nn.GroupNorm(channels, channels)). Each is fused with its activation
 * (frugal's own kernels: oneDNN 2.6 has no group normalisation); recompute
 * makes its output a recipe as for BN; abn is refused (InPlace-ABN inverts
 * batch norm only). */
typedef enum {
    FR_NORM_BATCH = 0,
    FR_NORM_GROUP,
    FR_NORM_LAYER,
    FR_NORM_INSTANCE,
    FR_NORM_KIND_COUNT
} fr_norm_kind;
typedef struct {
    int channels;      /* required */
    fr_act act;        /* [FR_ACT_IDENTITY] */
    float slope;       /* leaky ReLU's slope [0.01], ELU's alpha [1] */
    fr_norm_kind kind; /* [FR_NORM_BATCH] */
    int groups;        /* FR_NORM_GROUP only: dividing channels (required) */
} fr_norm_opts;
fr_module *fr_norm_new(fr_module *parent, const char *name, fr_norm_opts o);

/* An activation as a layer (nn.ReLU, nn.GELU, ...: docs/MODELS.md). Runs
 * in place under the recompute strategy when its gradient needs only its
 * output and nothing else holds its input. */
typedef struct {
    fr_act act;        /* required */
    float slope;       /* leaky ReLU's slope [0.01], ELU's alpha [1] */
} fr_act_opts;
fr_module *fr_act_new(fr_module *parent, const char *name, fr_act_opts o);

typedef struct {
    int in, out;       /* features (required) */
    bool no_bias;      /* [bias on, as PyTorch] */
} fr_linear_opts;
fr_module *fr_linear_new(fr_module *parent, const char *name, fr_linear_opts o);

fr_module *fr_max_pool2d_new(fr_module *parent, const char *name, fr_pool_params p);
fr_module *fr_avg_pool2d_new(fr_module *parent, const char *name, fr_pool_params p);
/* (N, C, H, W) -> (N, C) */
fr_module *fr_global_avg_pool_new(fr_module *parent, const char *name);
/* (N, ...) -> (N, rest) */
fr_module *fr_flatten_new(fr_module *parent, const char *name);
fr_module *fr_dropout_new(fr_module *parent, const char *name, float p);

/* ---- running modules (in a block's forward) ----
 * Each comes in two forms. The plain one borrows its input: the caller may
 * read it again, so nothing writes over it. The _take form takes the
 * caller's reference (released even on failure), so a strategy may write
 * the output over the input where nothing else holds it: the in-place
 * activation and residual add of recompute, and abn, which refuses a
 * borrowed norm input. `y = fr_forward_take(l, y, run)` is
 * `y = fr_chain(y, fr_forward(l, y, run))` with that permission; a block
 * that reads a tensor again after a layer must pass it borrowed. */
fr_tensor *fr_forward(fr_module *m, fr_tensor *x, const fr_run *run);
fr_tensor *fr_forward_take(fr_module *m, fr_tensor *x, const fr_run *run);
/* A norm layer with a residual: act(bn(x) + residual), fused where the
 * strategy asks (x borrowed or taken as above; residual borrowed). */
fr_tensor *fr_norm_add(fr_module *norm, fr_tensor *x, fr_tensor *residual, const fr_run *run);
fr_tensor *fr_norm_add_take(fr_module *norm, fr_tensor *x, fr_tensor *residual, const fr_run *run);
/* y + shortcut; the _take form writes it into y under recompute when
 * nothing else holds y. */
fr_tensor *fr_residual_add(fr_tensor *y, fr_tensor *shortcut, const fr_run *run);
fr_tensor *fr_residual_add_take(fr_tensor *y, fr_tensor *shortcut, const fr_run *run);

/* ---- introspection ---- */
fr_module_kind fr_module_kind_of(const fr_module *m);
const char *fr_module_name(const fr_module *m);
int fr_module_children(const fr_module *m);
fr_module *fr_module_child(const fr_module *m, int i);

#ifdef __cplusplus
}
#endif
#endif
