/* model.h: what every model offers a training program, whatever its
 * architecture: a forward to logits, a parameter registry, a configuration
 * (the memory strategy) and a free. Models are written with the building
 * API (nn/build.h), which applies every strategy; the built-in ones
 * (models/resnet.h, models/densenet.h) are written with it too.
 *
 *     fr_model *m = fr_resnet_create("resnet20", 3, 10, 42);
 *     fr_strategy_parse("recompute+checkpoint", &m->cfg.strategy); // may change between steps
 *     fr_tensor *logits = fr_model_forward(m, x, true);
 *     ...
 *     fr_model_free(m);
 *
 * The strategy is read at every forward, so one set of weights can be run
 * under several strategies (tests compare them). */
#ifndef FR_MODEL_H
#define FR_MODEL_H

#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How activations are kept for backward: a set of switches that combine.
 * Every combination computes the same function and the same gradients as
 * plain (abn excepted: see below); they differ in memory and time. The
 * engine applies them to any model built with nn/build.h: the norm layers
 * and residual adds in nn/norm.c, checkpoint segments in nn/segments.c.
 *   recompute  fused BN+ReLU keeping only its input and batch statistics; its
 *              output is recomputed in backward for the next conv; activation
 *              layers and residual adds outside it write over a tensor nobody
 *              else holds (what the retired "inplace" strategy did alone: it
 *              saved 0 bytes on every built-in model, docs/MODELS.md). For DenseNet
 *              this is the memory-efficient form (Pleiss et al. 2017): the
 *              concatenation and BN+ReLU before each 1x1 conv are recipes
 *              ("efficient" is accepted as another name for it)
 *   abn        InPlace-ABN: BN + leaky ReLU (slope 0.01) written over the conv
 *              output, inverted in backward. It changes the model's function
 *              (leaky ReLU, scale |gamma| + eps), so compare it with
 *              abn_reference, the same function computed the plain way
 *   checkpoint keep only the inputs of segments of blocks and recompute each
 *              segment in backward: k blocks per segment for "checkpoint:k";
 *              for "checkpoint" (-1) segments chosen from the bytes each
 *              block was measured to keep (nn/seg_split.h), so the large early
 *              blocks get short segments
 *   compress   keep what backward reads as B-bit codes per group of 256
 *              with stochastic rounding, ReLU masks as bits ("compress:B",
 *              B = 8, 4 or 2; "compress" is 8; autograd/compressed.c). It
 *              changes the gradients (unbiased, with variance), like abn
 *              it is a choice the user makes */
typedef struct {
    bool recompute;
    bool abn;
    bool abn_reference; /* the abn function without its memory trick (tests) */
    int checkpoint;     /* 0 off, -1 automatic, k > 0 blocks per segment */
    int compress;       /* 0 off, else bits per saved element: 8, 4 or 2 */
} fr_strategy;

#define FR_STRATEGY_PLAIN ((fr_strategy){0})

/* "plain", or names joined by '+': "recompute", "abn",
 * "checkpoint" or "checkpoint:K", "compress" or "compress:B" (e.g.
 * "abn+checkpoint:4+compress:4"). FR_ERR_ARG naming
 * the choices otherwise; "inplace" is an error saying it was folded into
 * recompute. */
fr_status fr_strategy_parse(const char *text, fr_strategy *out);
/* The canonical text of a strategy ("recompute+checkpoint:6"); returns buf. */
const char *fr_strategy_format(fr_strategy s, char *buf, size_t len);
bool fr_strategy_equal(fr_strategy a, fr_strategy b);

/* The layout of activations between a model's convolutions and norms
 * (docs/ARCHITECTURE.md, layout between ops). Channels last is a mode of
 * the model, not of the public ops: the first convolution takes the NCHW
 * input, convolutions and batch norms (with their activation and residual
 * sum) keep channels last between them, and every other layer (pooling,
 * linear, user layers) gets an NCHW copy, so the model's output, the loss
 * and user code see NCHW only. It covers f32 on the CPU under every
 * strategy (plain, recompute, checkpoint, compress, abn, abn_reference and
 * their combinations) for a model
 * that says it can take it (the built-in ResNets); anything else runs NCHW, with the
 * same results within round-off. AUTO: on where fr_model_channels_last's
 * rule says it measured faster (the avx512 class with oneDNN). */
typedef enum {
    FR_LAYOUT_AUTO = 0,
    FR_LAYOUT_NCHW,          /* off */
    FR_LAYOUT_CHANNELS_LAST, /* on wherever covered, whatever the CPU (tests) */
} fr_layout_mode;

typedef struct {
    fr_strategy strategy;
    /* Precision policy: FR_F32 (the default, 0), FR_F16 or FR_BF16. Under a
     * half dtype the forward runs in autocast (autograd.h): activations and
     * saved tensors are half, weights stay f32 and are cast on the fly,
     * reductions accumulate in f32. Train f16 with a loss scaler (amp.h). */
    fr_dtype precision;
    fr_layout_mode layout;
} fr_model_cfg;

/* "f32", "f16" or "bf16" (also "fp32", "fp16", "float16", "bfloat16");
 * FR_ERR_ARG naming the choices otherwise. */
fr_status fr_precision_parse(const char *text, fr_dtype *out);

/* How a training step shares its gradients with other processes (data
 * parallelism: dist/dist.h installs one with fr_dist_attach). fr_train_step
 * calls begin before each micro-batch (`micro` of `parts`), finish after the
 * last backward (the gradients are then the average over processes) and,
 * with a loss scaler, any to OR its found-inf flag over processes, so every
 * process skips the same steps. */
typedef struct fr_grad_sync {
    void *ctx;
    fr_status (*begin)(void *ctx, int micro, int parts);
    fr_status (*finish)(void *ctx);
    fr_status (*any)(void *ctx, bool *flag);
} fr_grad_sync;

/* Phase hooks of fr_train_step (train/train.h), for a caller that marks
 * where a step is (memreport's per-phase peaks and SVG marks, the bench's
 * bytes held at the end of the forward) without re-implementing its
 * micro-batch loop. `phase` is called, in this order, with FR_STEP_FORWARD
 * and FR_STEP_BACKWARD for each micro-batch `micro` in [0, parts), then
 * FR_STEP_OPTIMIZER and FR_STEP_END with micro = parts. A hook that returns
 * an error (set with fr_error) stops the step: fr_train_step returns it,
 * prefixed with the phase and micro-batch, and calls no further hook. */
typedef enum {
    FR_STEP_FORWARD,   /* micro-batch `micro` is about to run its forward */
    FR_STEP_BACKWARD,  /* its loss is built (logits released); backward is next */
    FR_STEP_OPTIMIZER, /* every backward (and gradient sync) is done; the optimizer step is next */
    FR_STEP_END,       /* the optimizer stepped and the gradients are zeroed */
} fr_step_phase;

typedef struct fr_step_hooks {
    void *ctx;
    fr_status (*phase)(void *ctx, fr_step_phase phase, int micro, int parts);
} fr_step_hooks;

typedef struct fr_model fr_model;
/* The loss a training step minimises, for a model whose output is not
 * class logits (an autoencoder, a regressor): out is the forward's output
 * (f32), x the input batch and y its labels (borrowed); a new one-element
 * loss (mean over the batch) or NULL with an error. */
typedef fr_tensor *(*fr_model_loss_fn)(fr_model *m, fr_tensor *out, fr_tensor *x, fr_tensor *y);
struct fr_model {
    char name[32];         /* "resnet20" */
    int in_channels, num_classes;
    fr_model_cfg cfg;
    fr_params *params;     /* owned */
    struct fr_model_build *build; /* the module tree (nn/build.h); owned */
    const fr_grad_sync *grad_sync; /* borrowed; NULL when training alone */
    const fr_step_hooks *step_hooks; /* borrowed; NULL: fr_train_step calls none */
    /* NULL: cross-entropy of the output as class logits, and top-1 accuracy.
     * Set (in the model's create function, so every program gets it): the
     * training step, evaluation and memreport minimise this instead and
     * report no accuracy (NaN; the programs print "n/a"). */
    fr_model_loss_fn loss;
    /* Set by a create function whose model's convolutions and norms all
     * take channels last (models/resnet.c): fr_model_cfg.layout applies. */
    bool channels_last_capable;
};

/* Whether a forward of m on an input on device `dev` would run channels
 * last under m->cfg (see fr_layout_mode; synchronised batch norm, which this
 * thread may have switched on for data parallelism, runs NCHW), and a short
 * reason either way for a log line ("channels last", "NCHW (precision)"),
 * when why is given. */
bool fr_model_channels_last(const fr_model *m, fr_device dev, const char **why);

/* The model's forward (its module tree run by the engine under m->cfg) under the model's precision policy; the logits come
 * back f32 whatever the policy (a differentiable cast of the few logits), so
 * losses, accuracy and user code never see a half tensor. x borrowed, a new
 * reference out; NULL with an error (FR_ERR_ARG naming the model and the
 * strategy for one it cannot honour). After a failure the nodes recorded
 * before it stay on the tape: fr_tape_clear() drops them. */
fr_tensor *fr_model_forward(fr_model *m, fr_tensor *x, bool training);

/* Frees the modules, the registry and every tensor in it. NULL-safe. */
void fr_model_free(fr_model *m);

#ifdef __cplusplus
}
#endif
#endif
