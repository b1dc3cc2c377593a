/* module_impl.h: the module record behind build.h, shared by the files of
 * the engine (nn/build.c: construction and layers; nn/norm.c: the norm
 * layer under each strategy; nn/segments.c: sequences and checkpointing).
 * Not a public header. */
#ifndef FR_MODULE_IMPL_H
#define FR_MODULE_IMPL_H

#include "../autograd/node.h"
#include "build.h"
#include "layers.h"

typedef enum {
    FR_LAYER_CONV2D = 0,
    FR_LAYER_NORM,
    FR_LAYER_LINEAR,
    FR_LAYER_MAX_POOL2D,
    FR_LAYER_AVG_POOL2D,
    FR_LAYER_GLOBAL_POOL,
    FR_LAYER_FLATTEN,
    FR_LAYER_DROPOUT,
    FR_LAYER_ACT,
    FR_LAYER_CONV_TRANSPOSE2D,
    FR_LAYER_UPSAMPLE,
    FR_LAYER_ADAPTIVE_AVG_POOL2D,
    FR_LAYER_KIND_COUNT
} fr_layer_kind;

typedef struct {
    fr_layer_kind kind;
    fr_conv2d_layer conv;
    fr_conv_transpose2d_layer convt;
    fr_upsample_opts upsample;
    int out_h, out_w;  /* adaptive pool */
    fr_batch_norm2d_layer bn;
    fr_norm_kind norm_kind;    /* FR_NORM_BATCH: bn; else gn */
    fr_group_norm_layer gn;
    fr_act act;        /* norm and act layers */
    float slope;       /* its parameter, defaults applied (fr_act_forward) */
    fr_linear_layer linear;
    fr_pool_params pool;
    float p;
} fr_layer;

/* The segments chosen for one input shape, strategy and precision. */
typedef struct {
    bool valid;
    int ndim;
    int64_t shape[FR_MAX_DIMS];
    fr_dtype dtype, autocast;
    fr_device device;
    fr_strategy strategy;
    bool training;
    int n_groups;
    int *group_len;    /* steps per group */
    bool *group_ckpt;  /* whether the group runs as one checkpointed segment */
    /* NULL: every group runs under the run's strategy. Set by the memory
     * planner (planner/planner.h): group g runs under group_strategy[g] (its
     * recompute / abn switches, and checkpoint for a dense
     * module's own children) */
    fr_strategy *group_strategy;
} fr_seg_layout;

struct fr_module {
    fr_module_kind kind;
    char name[FR_NAME_MAX];   /* full dotted name */
    fr_model *model;
    fr_block_fn forward;      /* blocks */
    void *state;              /* block: the user's bytes; layer: fr_layer */
    int n_children, cap_children;
    fr_module **children;
    fr_module *next;          /* every module of the model, for freeing */
    /* chains (set by fr_model_finish): the children with nested chains
     * expanded, cut into steps (a block, a dense module, or a run of
     * layers): step s is items[step_first[s]] .. + step_len[s] */
    int n_items, n_steps;
    fr_module **items;
    int *step_first, *step_len;
    fr_seg_layout layout;       /* root chain and dense modules */
    /* the root chain: a layout installed by fr_plan_apply (planner/planner.h),
     * used instead of `layout` for the input shape, precision and strategy
     * it was made for */
    fr_seg_layout installed;
};

/* The build state a model carries (model.h: fr_model.build). */
struct fr_model_build {
    fr_rng rng;
    fr_status status;         /* first construction error */
    fr_module *root;
    fr_module *modules;       /* list through ->next */
    int n_norms;
    bool finished;
    /* the memory planner's per-block profiles (planner/profile.c), owned */
    void *profiles;
    void (*profiles_free)(void *profiles);
};

/* build.c: frees the modules (fr_model_free calls it). NULL-safe. */
void fr_model_build_free(struct fr_model_build *b);

/* norm.c: act(bn(x) + residual) under run->strategy. */
fr_tensor *fr_norm_apply(const fr_module *m, fr_tensor *x, fr_tensor *residual, const fr_run *run);
/* An act layer (fr_act_new) under the run's strategy (norm.c). */
fr_tensor *fr_act_layer_apply(const fr_module *m, fr_tensor *x, const fr_run *run);

/* segments.c */
fr_tensor *fr_chain_forward(fr_module *c, fr_tensor *x, const fr_run *run);
fr_tensor *fr_dense_forward(fr_module *d, fr_tensor *x, const fr_run *run);
/* The steps of chain c (items, step arrays); FR_ERR_OOM. */
fr_status fr_chain_prepare(fr_module *c);
void fr_seg_layout_free(fr_seg_layout *p);
/* The number of steps of a chain or dense module, whether step s is a
 * barrier (a dense module inside a chain: never inside a segment), and
 * steps [first, first + count) run over x as a step runs in a forward that
 * is not segmented at that level (a dense module step still cuts its own
 * children under run->strategy.checkpoint). For the planner's trials. */
int fr_seq_steps(const fr_module *seq);
bool fr_seq_is_barrier(const fr_module *seq, int step);
fr_tensor *fr_seq_run_steps(fr_module *seq, int first, int count, fr_tensor *x, const fr_run *run);
/* The splitter's estimates (nn/seg_split.h) for seq cut into n_seg segments
 * of seg_len steps over x under run, from the same measured costs
 * "checkpoint" splits by (seq without barriers): the saved bytes when the
 * forward ends (fr_seg_forward_saved) and the peak (fr_seg_peak). For
 * tests that hold the estimate to the ledger. */
fr_status fr_seq_estimate(fr_module *seq, fr_tensor *x, const fr_run *run, const int *seg_len,
                          int n_seg, double *forward_saved, double *peak);

#endif
