/* build.c: the model (its life and forward, model.h), the module tree, its
 * names, and the layers; see build.h. */
#include "module_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the model: its life and its forward (model.h) ---- */

/* A model with an empty registry; fr_model_new gives it its module tree. */
static fr_model *model_alloc(const char *name, int in_channels, int num_classes) {
    fr_model *m = calloc(1, sizeof *m);
    if (!m || !(m->params = fr_params_new())) {
        free(m);
        fr_error(FR_ERR_OOM, "model %s: out of memory", name);
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    m->in_channels = in_channels;
    m->num_classes = num_classes;
    return m;
}

void fr_model_free(fr_model *m) {
    if (!m)
        return;
    fr_model_build_free(m->build);
    fr_params_free(m->params);
    free(m);
}

/* FR_OK when the model can honour its strategy, else FR_ERR_ARG naming the
 * model and the strategy (what can only be found while running, abn over
 * an input read elsewhere, the norm layers report). */
static fr_status check_strategy(const fr_model *m) {
    fr_strategy s = m->cfg.strategy;
    char text[96];
    fr_strategy_format(s, text, sizeof text);
    if (!m->build || !m->build->finished)
        return fr_error(FR_ERR_ARG, "%s: the model was not finished (fr_model_finish)", m->name);
    bool per_layer = s.recompute || s.abn || s.abn_reference;
    if (per_layer && m->build->n_norms == 0)
        return fr_error(FR_ERR_ARG, "%s: strategy %s cannot apply: the model has no norm layer "
                        "(BatchNorm + activation, fr_norm_new), where recompute and abn "
                        "act", m->name, text);
    if (s.checkpoint) {
        /* some sequence must have two steps: the root's, or a dense module's */
        bool any = m->build->root->n_steps >= 2;
        for (const fr_module *mod = m->build->modules; mod && !any; mod = mod->next)
            any = mod->kind == FR_MODULE_DENSE && mod->n_children >= 2;
        if (!any)
            return fr_error(FR_ERR_ARG, "%s: strategy %s cannot apply: the model has nothing to "
                            "cut into segments (its root runs one step, a layer, block or dense "
                            "module, and no dense module has two children)", m->name, text);
    }
    return FR_OK;
}

fr_tensor *fr_model_forward(fr_model *m, fr_tensor *x, bool training) {
    if (!m) {
        fr_error(FR_ERR_ARG, "model forward: model is NULL");
        return NULL;
    }
    if (fr_check_defined(m->name, "input", x) != FR_OK || check_strategy(m) != FR_OK ||
        fr_autocast_enter(m->cfg.precision) != FR_OK)
        return NULL;
    fr_run run = {.strategy = m->cfg.strategy, .training = training,
                  .channels_last = fr_model_channels_last(m, fr_device_of(x), NULL)};
    snprintf(run.model, sizeof run.model, "%s", m->name);
    fr_tensor *y = fr_forward(m->build->root, x, &run);
    fr_autocast_exit();
    if (!y || y->dtype == FR_F32)
        return y;
    fr_tensor *logits = fr_cast(y, FR_F32);
    fr_release(y);
    return logits;
}

/* ---- construction ---- */

/* Whether a constructor may proceed: NULL parent or an earlier failure in
 * the model stop it without touching the error (build.h: Conventions). */
static bool can_build(const fr_module *parent) {
    return parent && parent->model->build && parent->model->build->status == FR_OK &&
           !parent->model->build->finished;
}

/* Records the first construction error of the model (the one fr_last_error
 * holds now) and returns NULL. */
static fr_module *fail(fr_model *m, fr_status st) {
    if (m->build->status == FR_OK)
        m->build->status = st;
    return NULL;
}

static fr_module *module_new(fr_model *m, fr_module *parent, const char *name, fr_module_kind kind) {
    fr_module *mod = calloc(1, sizeof *mod);
    if (!mod) {
        fr_error(FR_ERR_OOM, "%s: out of memory building module %s", m->name, name ? name : "");
        return fail(m, FR_ERR_OOM);
    }
    mod->kind = kind;
    mod->model = m;
    mod->next = m->build->modules;
    m->build->modules = mod;
    const char *prefix = parent ? parent->name : "";
    if (!name)
        name = "";
    if (strlen(prefix) + strlen(name) + 2 > sizeof mod->name) {
        fr_error(FR_ERR_ARG, "%s: module name %s.%s is too long", m->name, prefix, name);
        return fail(m, FR_ERR_ARG);
    }
    if (*name)
        fr_name_join(mod->name, sizeof mod->name, prefix, name);
    else /* an unnamed module adds no component */
        snprintf(mod->name, sizeof mod->name, "%s", prefix);
    if (parent) {
        if (parent->n_children == parent->cap_children) {
            int cap = parent->cap_children ? 2 * parent->cap_children : 4;
            fr_module **grown = realloc(parent->children, (size_t)cap * sizeof *grown);
            if (!grown) {
                fr_error(FR_ERR_OOM, "%s: out of memory building %s", m->name, mod->name);
                return fail(m, FR_ERR_OOM);
            }
            parent->children = grown;
            parent->cap_children = cap;
        }
        parent->children[parent->n_children++] = mod;
    }
    return mod;
}

fr_model *fr_model_new(const char *name, int in_channels, int num_classes, uint64_t seed) {
    if (!name || !*name || in_channels <= 0 || num_classes <= 0) {
        fr_error(FR_ERR_ARG, "model \"%s\": needs a name and positive in_channels (%d) and "
                 "num_classes (%d)", name ? name : "", in_channels, num_classes);
        return NULL;
    }
    fr_model *m = model_alloc(name, in_channels, num_classes);
    if (!m)
        return NULL;
    if (!(m->build = calloc(1, sizeof *m->build))) {
        fr_model_free(m);
        fr_error(FR_ERR_OOM, "model %s: out of memory", name);
        return NULL;
    }
    fr_rng_seed(&m->build->rng, seed);
    m->build->root = module_new(m, NULL, "", FR_MODULE_CHAIN);
    if (!m->build->root) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

fr_module *fr_model_root(fr_model *m) { return m && m->build ? m->build->root : NULL; }

fr_model *fr_model_finish(fr_model *m) {
    if (!m)
        return NULL;
    fr_status st = m->build ? m->build->status : FR_OK;
    for (fr_module *mod = m->build ? m->build->modules : NULL; mod && st == FR_OK; mod = mod->next)
        if (mod->kind == FR_MODULE_CHAIN)
            st = fr_chain_prepare(mod);
    if (st != FR_OK) {
        /* the message of the first failure is the one fr_last_error holds */
        fr_model_free(m);
        return NULL;
    }
    if (m->build)
        m->build->finished = true;
    return m;
}

void fr_model_build_free(struct fr_model_build *b) {
    if (!b)
        return;
    for (fr_module *mod = b->modules, *next; mod; mod = next) {
        next = mod->next;
        free(mod->children);
        free(mod->state);
        free(mod->items);
        free(mod->step_first);
        free(mod->step_len);
        fr_seg_layout_free(&mod->layout);
        fr_seg_layout_free(&mod->installed);
        free(mod);
    }
    if (b->profiles_free)
        b->profiles_free(b->profiles);
    free(b);
}

fr_module *fr_chain_new(fr_module *parent, const char *name) {
    return can_build(parent) ? module_new(parent->model, parent, name, FR_MODULE_CHAIN) : NULL;
}

fr_module *fr_dense_new(fr_module *parent, const char *name) {
    return can_build(parent) ? module_new(parent->model, parent, name, FR_MODULE_DENSE) : NULL;
}

fr_module *fr_block_new(fr_module *parent, const char *name, fr_block_fn forward, size_t state_size) {
    if (!can_build(parent))
        return NULL;
    fr_model *m = parent->model;
    if (!forward) {
        fr_error(FR_ERR_ARG, "%s: block %s has no forward function", m->name, name ? name : "");
        return fail(m, FR_ERR_ARG);
    }
    fr_module *b = module_new(m, parent, name, FR_MODULE_BLOCK);
    if (!b)
        return NULL;
    b->forward = forward;
    if (!(b->state = calloc(1, state_size ? state_size : 1))) {
        fr_error(FR_ERR_OOM, "%s: out of memory building block %s", m->name, b->name);
        return fail(m, FR_ERR_OOM);
    }
    return b;
}

void *fr_block_state(const fr_module *block) {
    return block && block->kind == FR_MODULE_BLOCK ? block->state : NULL;
}

/* A layer module of `kind`; its fr_layer is zeroed for the caller to set. */
static fr_module *layer_new(fr_module *parent, const char *name, fr_layer_kind kind, fr_layer **out) {
    if (!can_build(parent))
        return NULL;
    fr_module *mod = module_new(parent->model, parent, name, FR_MODULE_LAYER);
    if (!mod)
        return NULL;
    if (!(mod->state = calloc(1, sizeof(fr_layer)))) {
        fr_error(FR_ERR_OOM, "%s: out of memory building %s", parent->model->name, mod->name);
        return fail(parent->model, FR_ERR_OOM);
    }
    *out = mod->state;
    (*out)->kind = kind;
    return mod;
}

fr_module *fr_conv2d_new(fr_module *parent, const char *name, fr_conv2d_opts o) {
    fr_layer *l;
    fr_module *mod = layer_new(parent, name, FR_LAYER_CONV2D, &l);
    if (!mod)
        return NULL;
    int kernel = o.kernel ? o.kernel : 3;
    int groups = o.groups ? o.groups : 1, dilation = o.dilation ? o.dilation : 1;
    int pad = o.pad == FR_NO_PAD ? 0 : o.pad ? o.pad : dilation * (kernel / 2);
    fr_status st = FR_OK;
    if (o.pad < FR_NO_PAD)
        st = fr_error(FR_ERR_ARG, "conv2d %s: negative padding %d", mod->name, o.pad);
    else if (groups < 1 || dilation < 1 || o.in % groups || o.out % groups)
        st = fr_error(FR_ERR_ARG, "conv2d %s: groups %d must divide in %d and out %d, and "
                      "dilation %d must be >= 1", mod->name, groups, o.in, o.out, dilation);
    else
        st = fr_conv2d_layer_init(&l->conv, mod->model->params, mod->name, o.in / groups, o.out,
                                  kernel, o.stride ? o.stride : 1, pad, o.bias,
                                  &mod->model->build->rng);
    l->conv.p.groups = groups;
    l->conv.p.dilation = dilation;
    return st == FR_OK ? mod : fail(mod->model, st);
}

fr_module *fr_conv_transpose2d_new(fr_module *parent, const char *name, fr_conv_transpose2d_opts o) {
    fr_layer *l;
    fr_module *mod = layer_new(parent, name, FR_LAYER_CONV_TRANSPOSE2D, &l);
    if (!mod)
        return NULL;
    fr_conv_transpose_params p = {.stride = o.stride ? o.stride : 1, .pad = o.pad,
                                  .output_pad = o.output_pad, .groups = o.groups ? o.groups : 1};
    fr_status st = FR_OK;
    if (o.pad < 0 || o.output_pad < 0 || o.output_pad >= p.stride)
        st = fr_error(FR_ERR_ARG, "conv_transpose2d %s: pad %d must be >= 0 and output_pad %d in "
                      "[0, stride %d)", mod->name, o.pad, o.output_pad, p.stride);
    else
        st = fr_conv_transpose2d_layer_init(&l->convt, mod->model->params, mod->name, o.in, o.out,
                                            o.kernel, p, !o.no_bias, &mod->model->build->rng);
    return st == FR_OK ? mod : fail(mod->model, st);
}

fr_module *fr_upsample_new(fr_module *parent, const char *name, fr_upsample_opts o) {
    fr_layer *l;
    fr_module *mod = layer_new(parent, name, FR_LAYER_UPSAMPLE, &l);
    if (!mod)
        return NULL;
    fr_status st = fr_upsample_check("upsample", mod->name, o);
    l->upsample = o;
    return st == FR_OK ? mod : fail(mod->model, st);
}

fr_module *fr_adaptive_avg_pool2d_new(fr_module *parent, const char *name, int out_h, int out_w) {
    fr_layer *l;
    fr_module *mod = layer_new(parent, name, FR_LAYER_ADAPTIVE_AVG_POOL2D, &l);
    if (!mod)
        return NULL;
    if (out_h < 1 || out_w < 1) {
        fr_error(FR_ERR_ARG, "adaptive_avg_pool2d %s: output size %dx%d must be positive",
                 mod->name, out_h, out_w);
        return fail(mod->model, FR_ERR_ARG);
    }
    l->out_h = out_h;
    l->out_w = out_w;
    return mod;
}

/* An activation's parameter with its default where 0: leaky ReLU's slope
 * 0.01 (PyTorch's nn.LeakyReLU), ELU's alpha 1. */
static float act_param(fr_act act, float p) {
    if (p != 0.0f)
        return p;
    return act == FR_ACT_LEAKY_RELU ? 0.01f : act == FR_ACT_ELU ? 1.0f : 0.0f;
}

/* A layer that ends with an activation (act, norm): its parameter's
 * default applied and checked, naming the layer. */
static fr_module *act_layer_new(fr_module *parent, const char *name, fr_layer_kind kind, fr_act act,
                                float p, fr_layer **out) {
    fr_module *mod = layer_new(parent, name, kind, out);
    if (!mod)
        return NULL;
    (*out)->act = act;
    (*out)->slope = act_param(act, p);
    fr_status st = fr_act_check(mod->name, act, (*out)->slope);
    return st == FR_OK ? mod : fail(mod->model, st);
}

fr_module *fr_act_new(fr_module *parent, const char *name, fr_act_opts o) {
    fr_layer *l;
    return act_layer_new(parent, name, FR_LAYER_ACT, o.act, o.slope, &l);
}

fr_module *fr_norm_new(fr_module *parent, const char *name, fr_norm_opts o) {
    fr_layer *l;
    fr_module *mod = act_layer_new(parent, name, FR_LAYER_NORM, o.act, o.slope, &l);
    if (!mod)
        return NULL;
    fr_status st;
    if ((unsigned)o.kind >= FR_NORM_KIND_COUNT)
        st = fr_error(FR_ERR_ARG, "norm %s: unknown kind %d", mod->name, (int)o.kind);
    else if (o.kind != FR_NORM_GROUP && o.groups != 0)
        st = fr_error(FR_ERR_ARG, "norm %s: .groups %d is for FR_NORM_GROUP only", mod->name, o.groups);
    else if (o.kind != FR_NORM_BATCH)
        st = fr_group_norm_layer_init(&l->gn, mod->model->params, mod->name, o.channels,
                                      o.kind == FR_NORM_GROUP   ? o.groups
                                      : o.kind == FR_NORM_LAYER ? 1
                                                                : o.channels);
    else
        st = fr_batch_norm2d_layer_init(&l->bn, mod->model->params, mod->name, o.channels);
    l->norm_kind = o.kind;
    if (st != FR_OK)
        return fail(mod->model, st);
    mod->model->build->n_norms++;
    return mod;
}

fr_module *fr_linear_new(fr_module *parent, const char *name, fr_linear_opts o) {
    fr_layer *l;
    fr_module *mod = layer_new(parent, name, FR_LAYER_LINEAR, &l);
    if (!mod)
        return NULL;
    fr_status st = fr_linear_layer_init(&l->linear, mod->model->params, mod->name, o.in, o.out,
                                        !o.no_bias, &mod->model->build->rng);
    return st == FR_OK ? mod : fail(mod->model, st);
}

static fr_module *pool_new(fr_module *parent, const char *name, fr_layer_kind kind, fr_pool_params p) {
    fr_layer *l;
    fr_module *mod = layer_new(parent, name, kind, &l);
    if (!mod)
        return NULL;
    if (p.kernel <= 0 || p.stride <= 0 || p.pad < 0) {
        fr_error(FR_ERR_ARG, "pool %s: kernel %d and stride %d must be positive, padding %d not "
                 "negative", mod->name, p.kernel, p.stride, p.pad);
        return fail(mod->model, FR_ERR_ARG);
    }
    l->pool = p;
    return mod;
}

fr_module *fr_max_pool2d_new(fr_module *parent, const char *name, fr_pool_params p) {
    return pool_new(parent, name, FR_LAYER_MAX_POOL2D, p);
}

fr_module *fr_avg_pool2d_new(fr_module *parent, const char *name, fr_pool_params p) {
    return pool_new(parent, name, FR_LAYER_AVG_POOL2D, p);
}

fr_module *fr_global_avg_pool_new(fr_module *parent, const char *name) {
    fr_layer *l;
    return layer_new(parent, name, FR_LAYER_GLOBAL_POOL, &l);
}

fr_module *fr_flatten_new(fr_module *parent, const char *name) {
    fr_layer *l;
    return layer_new(parent, name, FR_LAYER_FLATTEN, &l);
}

fr_module *fr_dropout_new(fr_module *parent, const char *name, float p) {
    fr_layer *l;
    fr_module *mod = layer_new(parent, name, FR_LAYER_DROPOUT, &l);
    if (!mod)
        return NULL;
    if (!(p >= 0.0f && p < 1.0f)) {
        fr_error(FR_ERR_ARG, "dropout %s: probability %g is not in [0, 1)", mod->name, (double)p);
        return fail(mod->model, FR_ERR_ARG);
    }
    l->p = p;
    return mod;
}

/* ---- running ---- */

static fr_tensor *layer_forward_nchw(const fr_module *m, fr_tensor *x, const fr_run *run);

/* Channels-last mode (model.h): convolutions make channels-last outputs,
 * batch norms take them; every other layer gets an NCHW copy, so no op
 * reads channels-last bytes it does not take. */
static fr_tensor *layer_forward(const fr_module *m, fr_tensor *x, const fr_run *run) {
    const fr_layer *l = m->state;
    if (!run->channels_last || !x)
        return layer_forward_nchw(m, x, run);
    if (l->kind == FR_LAYER_CONV2D)
        return fr_conv2d_channels_last(x, l->conv.weight, l->conv.bias, l->conv.p);
    if (l->kind == FR_LAYER_NORM && l->norm_kind == FR_NORM_BATCH)
        return layer_forward_nchw(m, x, run);
    fr_tensor *xc = fr_to_nchw(x);
    fr_tensor *y = xc ? layer_forward_nchw(m, xc, run) : NULL;
    fr_release(xc);
    return y;
}

static fr_tensor *layer_forward_nchw(const fr_module *m, fr_tensor *x, const fr_run *run) {
    const fr_layer *l = m->state;
    switch (l->kind) {
    case FR_LAYER_CONV2D:
        return fr_conv2d_layer_forward(&l->conv, x);
    case FR_LAYER_NORM:
        return fr_norm_apply(m, x, NULL, run);
    case FR_LAYER_LINEAR:
        return fr_linear_layer_forward(&l->linear, x);
    case FR_LAYER_MAX_POOL2D:
        return fr_max_pool2d(x, l->pool);
    case FR_LAYER_AVG_POOL2D:
        return fr_avg_pool2d(x, l->pool);
    case FR_LAYER_GLOBAL_POOL:
        return fr_global_avg_pool(x);
    case FR_LAYER_FLATTEN:
        return fr_flatten(x);
    case FR_LAYER_DROPOUT:
        return fr_dropout(x, l->p, run->training);
    case FR_LAYER_ACT:
        return fr_act_layer_apply(m, x, run);
    case FR_LAYER_CONV_TRANSPOSE2D:
        return fr_conv_transpose2d_layer_forward(&l->convt, x);
    case FR_LAYER_UPSAMPLE:
        return fr_upsample(x, l->upsample);
    case FR_LAYER_ADAPTIVE_AVG_POOL2D:
        return fr_adaptive_avg_pool2d(x, l->out_h, l->out_w);
    default:
        FR_ASSERT(!"unknown layer kind");
        return NULL;
    }
}

static fr_tensor *forward_kind(fr_module *m, fr_tensor *x, const fr_run *run) {
    switch (m->kind) {
    case FR_MODULE_LAYER:
        return layer_forward(m, x, run);
    case FR_MODULE_CHAIN:
        return fr_chain_forward(m, x, run);
    case FR_MODULE_DENSE:
        return fr_dense_forward(m, x, run);
    case FR_MODULE_BLOCK: {
        /* The block's input stays held for its whole forward, so that no
         * inplace strategy inside writes over what the block still reads
         * (an identity shortcut). */
        fr_tensor *pin = fr_retain(x);
        fr_tensor *y = m->forward(m, x, run);
        fr_release(pin);
        return y;
    }
    default:
        FR_ASSERT(!"unknown module kind");
        return NULL;
    }
}

/* m's forward on x under the run's compress bits; x as the caller passes
 * it (held by the caller alone when taken). */
static fr_tensor *forward_module(fr_module *m, fr_tensor *x, const fr_run *run) {
    /* compress:B applies to what this module's ops save (a planner gives
     * blocks different bits: each module enters its own run's) */
    int outer;
    if (fr_compress_enter(run->strategy.compress, &outer) != FR_OK)
        return NULL;
    fr_tensor *y = forward_kind(m, x, run);
    fr_compress_restore(outer);
    return y;
}

static bool forward_args(const fr_module *m, const fr_tensor *x, const fr_run *run) {
    if (!x) {
        fr_error_null(m && m->name[0] ? m->name : "forward", "x");
        return false;
    }
    if (!m || !run) {
        fr_error(FR_ERR_ARG, "forward: module or run is NULL");
        return false;
    }
    return true;
}

/* Borrowed x: held here for the call, so no layer takes it for a tensor
 * nobody else holds and writes over it (nn/norm.c's in-place activation,
 * residual add and abn): the caller may read x again. */
fr_tensor *fr_forward(fr_module *m, fr_tensor *x, const fr_run *run) {
    if (!forward_args(m, x, run))
        return NULL;
    fr_retain(x);
    fr_tensor *y = forward_module(m, x, run);
    fr_release(x);
    return y;
}

fr_tensor *fr_forward_take(fr_module *m, fr_tensor *x, const fr_run *run) {
    fr_tensor *y = forward_args(m, x, run) ? forward_module(m, x, run) : NULL;
    fr_release(x);
    return y;
}

static bool is_norm(const fr_module *norm) {
    if (norm && norm->kind == FR_MODULE_LAYER &&
        ((const fr_layer *)norm->state)->kind == FR_LAYER_NORM)
        return true;
    fr_error(FR_ERR_ARG, "norm_add: %s is not a norm layer", norm ? norm->name : "(null)");
    return false;
}

static bool norm_add_args(const fr_module *norm, const fr_tensor *x, const fr_tensor *residual,
                          const fr_run *run) {
    if (!x || !residual) {
        fr_error_null(norm && norm->name[0] ? norm->name : "norm_add", x ? "residual" : "x");
        return false;
    }
    if (!run) {
        fr_error(FR_ERR_ARG, "norm_add: run is NULL");
        return false;
    }
    return is_norm(norm);
}

fr_tensor *fr_norm_add(fr_module *norm, fr_tensor *x, fr_tensor *residual, const fr_run *run) {
    if (!norm_add_args(norm, x, residual, run))
        return NULL;
    fr_retain(x); /* borrowed: never written over (fr_forward) */
    fr_tensor *y = fr_norm_apply(norm, x, residual, run);
    fr_release(x);
    return y;
}

fr_tensor *fr_norm_add_take(fr_module *norm, fr_tensor *x, fr_tensor *residual, const fr_run *run) {
    fr_tensor *y = norm_add_args(norm, x, residual, run) ? fr_norm_apply(norm, x, residual, run)
                                                         : NULL;
    fr_release(x);
    return y;
}

fr_module_kind fr_module_kind_of(const fr_module *m) { return m->kind; }
const char *fr_module_name(const fr_module *m) { return m->name; }
int fr_module_children(const fr_module *m) { return m->n_children; }
fr_module *fr_module_child(const fr_module *m, int i) {
    return i >= 0 && i < m->n_children ? m->children[i] : NULL;
}
