/* fn_bn_act.c: fused BN + residual + activation under the memory modes of
 * functions.h (recompute, recompute with a recomputable input, InPlace-ABN,
 * keep). Forward is the batch statistics and one pass (fr_bn_act_forward),
 * backward one kernel (fr_bn_act_backward). */
#include <stdlib.h>

#include "checkpoint_log.h"
#include "functions.h"
#include "node.h"

typedef struct {
    fr_act act;
    float slope;
    fr_bnact_mode mode;
    bool has_residual;
    /* indices of saved tensors (-1: not saved) */
    int i_x, i_y, i_mean, i_invstd, i_gamma, i_beta, i_residual, i_gamma_eff;
    /* InPlace-ABN under compress:B: the codes of its pre-activation z
     * (i_y is then y's sign as bits) */
    int i_z;
} bnact_ctx;

static fr_tensor *channels_like(const fr_tensor *gamma) {
    return fr_empty(fr_device_of(gamma), FR_F32, 1, gamma->shape, FR_TAG_TRANSIENT);
}

/* ---- the recipe that rebuilds y = act(BN(x)) from x and the statistics;
 * x is either held or itself a recipe (FR_BNACT_RECOMPUTE_X) ---- */

typedef struct {
    fr_recipe base;
    fr_tensor *x, *mean, *invstd, *gamma, *beta;
    fr_recipe *x_recipe; /* set instead of x */
    uint64_t x_version;
    fr_act act;
    float slope;
} bnact_recipe;

static fr_tensor *bnact_recipe_make(fr_recipe *self) {
    bnact_recipe *r = (bnact_recipe *)self;
    fr_tensor *x, *y;
    if (r->x_recipe) {
        if (!(x = r->x_recipe->make(r->x_recipe)))
            return NULL;
    } else if (r->x->storage->version != r->x_version) {
        fr_error(FR_ERR_VERSION,
                 "bn_act recompute: its input was modified inplace by %s after the forward",
                 r->x->storage->last_writer ? r->x->storage->last_writer : "an inplace op");
        return NULL;
    } else {
        x = fr_retain(r->x);
    }
    /* A rebuilt x belongs to nobody else: normalise it in place, so that
     * rebuilding y costs one tensor, not two. */
    if (r->x_recipe && x->refcount == 1 && x->storage->refcount == 1)
        y = fr_retain(x);
    else
        y = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_status st = y ? fr_bn_act_forward(y, x, NULL, r->mean, r->invstd, r->gamma, r->beta,
                                         r->act, r->slope)
                     : fr_last_status();
    fr_release(x);
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}

static void bnact_recipe_destroy(fr_recipe *self) {
    bnact_recipe *r = (bnact_recipe *)self;
    fr_release(r->x);
    fr_recipe_release(r->x_recipe);
    fr_release(r->mean);
    fr_release(r->invstd);
    fr_release(r->gamma);
    fr_release(r->beta);
    free(r);
}

/* Keeps x, or x's own recipe when `via_recipe` and x carries one. */
static fr_recipe *bnact_recipe_new(fr_tensor *x, bool via_recipe, fr_tensor *mean,
                                   fr_tensor *invstd, const fr_bn_state *bn, fr_act act,
                                   float slope) {
    bnact_recipe *r = calloc(1, sizeof *r);
    if (!r) {
        fr_error(FR_ERR_OOM, "bn_act: out of memory");
        return NULL;
    }
    r->base = (fr_recipe){.refcount = 1, .op = "bn_act", .make = bnact_recipe_make,
                          .destroy = bnact_recipe_destroy};
    /* under compress:B, x's compressed copy (the one the node saved) */
    fr_recipe *live = via_recipe ? fr_live_recipe(x) : NULL;
    if (live)
        r->x_recipe = fr_recipe_retain(live);
    else if (fr_compressed_of(x, &r->x_recipe) != FR_OK) {
        free(r);
        return NULL;
    } else if (!r->x_recipe)
        r->x = fr_retain(x);
    r->mean = fr_retain(mean);
    r->invstd = fr_retain(invstd);
    r->gamma = fr_retain(bn->gamma);
    r->beta = fr_retain(bn->beta);
    r->x_version = x->storage->version;
    r->act = act;
    r->slope = slope;
    return &r->base;
}

/* ---- backward ---- */

/* ---- InPlace-ABN's output under compress:B, rebuilt as act(z) from the
 * codes of its pre-activation z: the op after it (a conv) saves this
 * recipe, so z's codes serve both (as y's did) ---- */

typedef struct {
    fr_recipe base;
    fr_recipe *z; /* z's codes (autograd/compressed.c) */
    fr_act act;
    float slope;
} abn_out_recipe;

static fr_tensor *abn_out_make(fr_recipe *self) {
    abn_out_recipe *r = (abn_out_recipe *)self;
    fr_tensor *y = r->z->make(r->z); /* a decoded tensor of its own: act in place */
    if (y && fr_act_forward(y, y, r->act, r->slope) != FR_OK)
        fr_clear(&y);
    return y;
}

static void abn_out_destroy(fr_recipe *self) {
    abn_out_recipe *r = (abn_out_recipe *)self;
    fr_recipe_release(r->z);
    free(r);
}

static fr_recipe *abn_out_new(fr_recipe *z, fr_act act, float slope) {
    abn_out_recipe *r = calloc(1, sizeof *r);
    if (!r) {
        fr_error(FR_ERR_OOM, "inplace_abn: out of memory");
        return NULL;
    }
    r->base = (fr_recipe){.refcount = 1, .op = "inplace_abn", .make = abn_out_make,
                          .destroy = abn_out_destroy};
    r->z = fr_recipe_retain(z);
    r->act = act;
    r->slope = slope;
    return &r->base;
}

static fr_status unpack_all(fr_node *node, const int *idx, fr_tensor **out, int n) {
    for (int i = 0; i < n; i++) {
        out[i] = idx[i] >= 0 ? fr_node_unpack(node, idx[i]) : NULL;
        if (idx[i] >= 0 && !out[i]) {
            for (int j = 0; j < i; j++)
                fr_clear(&out[j]);
            return fr_last_status();
        }
    }
    return FR_OK;
}

/* Whether the activation's gradient is read from its output's sign alone
 * (ReLU, leaky ReLU): its mask can be kept as bits, or rebuilt from x. */
static bool sign_act(fr_act act) { return act == FR_ACT_RELU || act == FR_ACT_LEAKY_RELU; }

/* The bits of a block output's sign mask kept as bits (compress:B), when
 * this backward can read them as bits: ReLU or leaky ReLU over an f32 dy
 * laid out as the output was (contiguous, or channels last in a model's
 * channels-last mode: the bits follow storage order); else NULL (the mask
 * is unpacked). */
static fr_tensor *sign_bits(fr_node *node, const bnact_ctx *c, const fr_tensor *dy) {
    bool sign = sign_act(c->act);
    if (c->i_y < 0 || !sign || dy->dtype != FR_F32)
        return NULL;
    return fr_node_sign_bits(node, c->i_y, dy);
}

/* True when the kept output need not be read: a ReLU or leaky ReLU with no
 * residual over an f32 x held as it was (not rebuilt, not compressed) on
 * the CPU, whose mask the one-pass kernel rebuilds bit for bit from x and
 * the statistics, which it reads anyway (plain's KEEP). Not reading y takes
 * one activation-sized stream off the backward, and lets the kernel keep g
 * out of memory (cpu/batchnorm.c: plane_dx_regen); DenseNet's BN backward
 * measured 30 -> 24 ms at 216 x 32x32, batch 64, one thread
 * (bench/RESULTS.md, issue 24, dn24). Not where fr_bn_act_backward takes
 * the chain (half operands, synchronised BN): there the chain would rebuild
 * a whole pre-activation tensor instead of reading y. */
static bool mask_from_x(const fr_node *node, const bnact_ctx *c, const fr_tensor *dy) {
    bool sign = sign_act(c->act);
    const fr_tensor *x = c->i_x >= 0 ? node->saved[c->i_x].held : NULL;
    return sign && c->i_y >= 0 && !c->has_residual && x && x->dtype == FR_F32 &&
           dy->dtype == FR_F32 && node->device == FR_CPU && !fr_batch_norm_synced();
}

static fr_status recompute_backward(fr_node *node, const bnact_ctx *c, fr_tensor *dy,
                                    fr_tensor **din) {
    enum { X, MEAN, INVSTD, GAMMA, BETA, Y, NT };
    int idx[NT] = {c->i_x, c->i_mean, c->i_invstd, c->i_gamma, c->i_beta, c->i_y};
    /* A mask kept as bits is read as bits: the activation's gradient g
     * first (fr_sign_act_backward, over dy when nothing else holds it,
     * else into the buffer dx takes), then BN's backward with the identity,
     * which reads g as the fused pass computes it, so the bits are the
     * same; the f32 mask of 1 and 0 an unpack makes, one more
     * activation-sized tensor at the peak, is never made (bench/RESULTS.md,
     * issue 23). */
    fr_tensor *bits = sign_bits(node, c, dy);
    if (bits || mask_from_x(node, c, dy))
        idx[Y] = -1;
    fr_tensor *t[NT];
    fr_status st = unpack_all(node, idx, t, NT);
    if (st != FR_OK) {
        fr_release(bits);
        return st;
    }
    fr_tensor *g = NULL;
    fr_act act = c->act;
    if (bits) {
        g = fr_grad_held_alone(dy) ? fr_retain(dy) : fr_empty_like(dy, FR_TAG_TRANSIENT);
        st = g ? fr_sign_act_backward(g, dy, bits, c->act, c->slope) : fr_last_status();
        fr_release(bits);
        act = FR_ACT_IDENTITY;
    }
    /* One pass over dy (ops.h: fr_bn_act_backward): the activation's mask
     * comes from the kept output when there is one (block outputs), else
     * from BN(x) recomputed element by element inside the kernel, so no
     * pre-activation tensor is rebuilt. dz, the gradient at the sum, is
     * made only for a residual that wants it. */
    bool want_dx = fr_node_needs_grad(node, 0);
    bool want_dz = c->has_residual && fr_node_needs_grad(node, 3);
    /* dx over dy (or g) when nothing else holds dy (node.h allows it; both
     * kernels read each element of dy before writing that element of dx):
     * the chain of separate ops frees the activation's kept output before
     * BN's backward makes its dx, and without this the fused op's peak was
     * one tensor above the chain's (DenseNet-BC-100's plain step: +5.3 MiB) */
    fr_tensor *src = g ? g : dy;
    bool reuse = want_dx && (g || fr_grad_held_alone(dy)) && src->dtype == t[X]->dtype;
    fr_tensor *dx = st != FR_OK ? NULL
                    : reuse     ? fr_retain(src)
                    : want_dx   ? fr_empty_like(t[X], FR_TAG_TRANSIENT)
                                : NULL;
    fr_tensor *dz = st == FR_OK && want_dz ? fr_empty_like(dy, FR_TAG_TRANSIENT) : NULL;
    fr_tensor *dgamma = channels_like(t[GAMMA]), *dbeta = channels_like(t[GAMMA]);
    if (st == FR_OK)
        st = dgamma && dbeta && (dx || !want_dx) && (dz || !want_dz)
                 ? fr_bn_act_backward(dx, dz, dgamma, dbeta, src, t[Y], t[X], t[MEAN], t[INVSTD],
                                      t[GAMMA], t[BETA], act, c->slope)
                 : fr_last_status();
    fr_release(g);
    if (st == FR_OK) {
        din[0] = dx;
        din[1] = fr_node_needs_grad(node, 1) ? dgamma : NULL;
        din[2] = fr_node_needs_grad(node, 2) ? dbeta : NULL;
        din[3] = dz;
        if (!din[1])
            fr_release(dgamma);
        if (!din[2])
            fr_release(dbeta);
    } else {
        fr_release(dx);
        fr_release(dz);
        fr_release(dgamma);
        fr_release(dbeta);
    }
    for (int i = 0; i < NT; i++)
        fr_release(t[i]);
    return st;
}

static fr_status abn_backward(fr_node *node, const bnact_ctx *c, fr_tensor *dy, fr_tensor **din) {
    enum { Y, INVSTD, GAMMA, BETA, GEFF, RES, Z, NT };
    int idx[NT] = {c->i_y,         c->i_invstd,   c->i_gamma, c->i_beta,
                   c->i_gamma_eff, c->i_residual, c->i_z};
    fr_tensor *t[NT];
    FR_TRY(unpack_all(node, idx, t, NT));
    bool want_dz = c->has_residual && fr_node_needs_grad(node, 3);
    fr_tensor *dz = want_dz ? fr_empty_like(dy, FR_TAG_TRANSIENT) : NULL;
    /* from z (compress): x-hat inverts the identity, and y is the
     * activation's mask as 1 and 0, all the backward reads of it (its sign) */
    bool from_z = t[Z] != NULL;
    fr_tensor *xhat = fr_empty_like(from_z ? t[Z] : t[Y], FR_TAG_TRANSIENT);
    fr_tensor *zero = channels_like(t[GAMMA]), *one = channels_like(t[GAMMA]);
    fr_tensor *scale = channels_like(t[GAMMA]), *dgeff = channels_like(t[GAMMA]);
    fr_tensor *dbeta = channels_like(t[GAMMA]), *dgamma = channels_like(t[GAMMA]);
    /* xhat may have failed (a planner trial's cap): shaped after t[Y] */
    fr_tensor *dx = xhat && fr_node_needs_grad(node, 0) ? fr_empty_like(xhat, FR_TAG_TRANSIENT) : NULL;
    fr_status st = (dz || !want_dz) && xhat && zero && one && scale && dgeff && dbeta && dgamma &&
                           (dx || !fr_node_needs_grad(node, 0))
                       ? FR_OK
                       : fr_last_status();
    float slope = c->act == FR_ACT_LEAKY_RELU ? c->slope : 1.0f;
    if (st == FR_OK)
        st = fr_abn_invert_out(xhat, from_z ? t[Z] : t[Y], t[GEFF], t[BETA], t[RES],
                               from_z ? 1.0f : slope);
    /* BN backward written in terms of xhat: with mean 0, invstd 1 and the
     * scale gamma_eff * invstd, the standard kernel gives exactly
     * dx = gamma_eff * invstd / M * (M dz - sum dz - xhat sum(dz xhat)),
     * fused with the activation's gradient (its sign read from y). */
    if (st == FR_OK)
        st = fr_fill_(zero, 0.0f);
    if (st == FR_OK)
        st = fr_fill_(one, 1.0f);
    if (st == FR_OK)
        st = fr_mul_out(scale, t[GEFF], t[INVSTD]);
    if (st == FR_OK)
        st = fr_bn_act_backward(dx, dz, dgeff, dbeta, dy, t[Y], xhat, zero, one, scale, NULL,
                                c->act, c->slope);
    if (st == FR_OK)
        st = fr_abn_gamma_backward(dgamma, dgeff, t[GAMMA]);
    if (st == FR_OK) {
        din[0] = dx;
        dx = NULL;
        if (fr_node_needs_grad(node, 1)) {
            din[1] = dgamma;
            dgamma = NULL;
        }
        if (fr_node_needs_grad(node, 2)) {
            din[2] = dbeta;
            dbeta = NULL;
        }
        din[3] = dz;
        dz = NULL;
    }
    fr_tensor *tmp[] = {dz, xhat, zero, one, scale, dgeff, dbeta, dgamma, dx};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        fr_release(tmp[i]);
    for (int i = 0; i < NT; i++)
        fr_release(t[i]);
    return st;
}

static fr_status bnact_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const bnact_ctx *c = node->ctx;
    return c->mode == FR_BNACT_INPLACE_ABN ? abn_backward(node, c, dout[0], din)
                                           : recompute_backward(node, c, dout[0], din);
}

/* ---- |gamma| + eps as a differentiable op (the ABN scale computed the
 * plain way, for reference models) ---- */

static fr_status abn_scale_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    fr_tensor *gamma = fr_node_unpack(node, 0);
    if (!gamma)
        return fr_last_status();
    din[0] = fr_empty_like(gamma, FR_TAG_TRANSIENT);
    fr_status st = din[0] ? fr_abn_gamma_backward(din[0], dout[0], gamma) : fr_last_status();
    fr_release(gamma);
    return st;
}

fr_tensor *fr_abn_scale(fr_tensor *gamma, float eps) {
    if (fr_check_f32c("abn_scale", "gamma", gamma) != FR_OK)
        return NULL;
    fr_tensor *y = fr_empty_like(gamma, FR_TAG_TRANSIENT);
    if (!y || fr_abn_gamma_forward(y, gamma, eps) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    if (fr_should_record(1, &gamma)) {
        fr_node *node = fr_node_new("abn_scale", abn_scale_backward, 1, &gamma, 1);
        if (!node || fr_node_save(node, gamma) < 0) {
            fr_release(y);
            return NULL;
        }
        fr_node_set_output(node, 0, y);
    }
    return y;
}

/* ---- forward ---- */

static fr_status check_args(fr_tensor *x, fr_tensor *residual, const fr_bn_state *bn, fr_act act,
                            float slope, fr_bnact_mode mode, bool recording) {
    const char *op = "bn_act";
    /* channels last (a model's mode, nn/model.h): the ops take it under
     * every mode, InPlace-ABN's inversion included (fr_abn_invert_out) */
    bool cl = fr_is_channels_last(x);
    if (!cl)
        FR_TRY(fr_check_floatc(op, "x", x));
    if (!bn)
        return fr_error(FR_ERR_ARG, "%s: bn state is NULL", op);
    FR_TRY(fr_check_defined(op, "gamma", bn->gamma));
    FR_TRY(fr_check_defined(op, "beta", bn->beta));
    if ((unsigned)mode >= FR_BNACT_COUNT)
        return fr_error(FR_ERR_ARG, "%s: unknown mode %d", op, (int)mode);
    FR_TRY(fr_act_check(op, act, slope));
    if (residual) {
        if (!cl || !fr_is_channels_last(residual))
            FR_TRY(fr_check_floatc(op, "residual", residual));
        FR_TRY(fr_check_same_shape(op, "residual", residual, "x", x));
        FR_TRY(fr_check_same_device(op, "residual", residual, "x", x));
    }
    if (mode == FR_BNACT_INPLACE_ABN && act == FR_ACT_RELU)
        return fr_error(FR_ERR_ARG,
                        "inplace_abn: plain ReLU cannot be inverted (it loses the negative "
                        "half); use leaky_relu (e.g. slope 0.01) or identity");
    if (mode == FR_BNACT_INPLACE_ABN && !fr_act_is_invertible(act))
        return fr_error(FR_ERR_ARG,
                        "inplace_abn: %s cannot be inverted exactly in f32 (it saturates or "
                        "folds), so its input cannot be recovered from its output; only "
                        "identity and leaky_relu can",
                        fr_act_name(act));
    if (recording && !bn->training)
        return fr_error(FR_ERR_ARG,
                        "%s: eval mode with gradient recording is not supported; run eval under "
                        "fr_no_grad_enter or use fr_batch_norm",
                        op);
    if (mode == FR_BNACT_INPLACE_ABN && recording && x->requires_grad && !fr_has_grad_fn(x))
        return fr_error(FR_ERR_ARG, "inplace_abn: in-place write on a leaf that requires grad");
    return FR_OK;
}

/* y = act(BN(x; gamma_used) + residual) into y (which may be x); fills mean
 * and invstd in training mode. */
static fr_status compute(fr_tensor *y, fr_tensor *mean, fr_tensor *invstd, fr_tensor *x,
                         fr_tensor *residual, const fr_bn_state *bn, const fr_tensor *gamma_used,
                         fr_act act, float slope) {
    /* the statistics first (so y may be x), then one pass for the
     * normalisation, the residual and the activation */
    fr_status st;
    fr_tensor *centre = mean;
    if (bn->training) {
        /* a checkpoint's replay takes the statistics its forward kept
         * (checkpoint_log.h), the same bits without the pass over x */
        bool update = bn->running_mean && !fr_in_recompute();
        st = FR_OK;
        if (!fr_checkpoint_stats_take(bn->gamma, x, mean, invstd))
            st = fr_batch_norm_train_stats(mean, invstd, x, update ? bn->running_mean : NULL,
                                           update ? bn->running_var : NULL, bn->momentum,
                                           bn->eps);
        if (st == FR_OK)
            fr_checkpoint_stats_keep(bn->gamma, x, mean, invstd);
    } else {
        FR_TRY(fr_check_defined("bn_act (eval)", "running_mean", bn->running_mean));
        FR_TRY(fr_check_defined("bn_act (eval)", "running_var", bn->running_var));
        /* read here, so a checkpoint's replay reads them again */
        fr_tensor *stats[2] = {bn->running_mean, bn->running_var};
        fr_checkpoint_note_reads(2, stats);
        st = fr_batch_norm_invstd(invstd, bn->running_var, bn->eps);
        centre = bn->running_mean;
    }
    if (st == FR_OK)
        st = fr_bn_act_forward(y, x, residual, centre, invstd, gamma_used, bn->beta, act, slope);
    return st;
}

/* InPlace-ABN's output y under compress:B, kept for backward. Its own
 * codes would be inverted there, and leaky ReLU's inverse multiplies a
 * negative value's error by 1/slope (100 at 0.01): one step's gradients
 * came out 1.1-1.3x their own size off abn's at any B (ResNet-20). So the
 * codes are of the pre-activation z = act^-1(y), whose error x-hat inherits
 * unamplified; the mask is y's sign as bits; y carries the recipe act(z),
 * which the next op saves, so one set of codes serves both as before. */
static bool abn_keep_codes(fr_node *node, bnact_ctx *c, fr_tensor *y, fr_act act, float slope) {
    fr_tensor *z = fr_empty_like(y, FR_TAG_TRANSIENT);
    fr_recipe *zc = NULL, *out = NULL;
    bool ok = z &&
              fr_act_forward(z, y, FR_ACT_LEAKY_RELU,
                             act == FR_ACT_LEAKY_RELU ? 1.0f / slope : 1.0f) == FR_OK &&
              fr_compressed_of(z, &zc) == FR_OK && zc && (out = abn_out_new(zc, act, slope)) != NULL &&
              (c->i_z = fr_node_save_recipe(node, fr_recipe_retain(zc))) >= 0 &&
              (!sign_act(act) || (c->i_y = fr_node_keep_sign(node, y)) >= 0);
    if (ok)
        fr_set_recipe(y, fr_recipe_retain(out));
    fr_recipe_release(out);
    fr_recipe_release(zc);
    fr_release(z);
    return ok;
}

fr_tensor *fr_bn_act(fr_tensor *x, fr_tensor *residual, const fr_bn_state *bn, fr_act act,
                     float slope, fr_bnact_mode mode) {
    fr_tensor *in[4] = {x, bn ? bn->gamma : NULL, bn ? bn->beta : NULL, residual};
    bool recording = fr_should_record(4, in);
    if (check_args(x, residual, bn, act, slope, mode, recording) != FR_OK)
        return NULL;
    if (residual && fr_act_needs_input(act)) {
        /* The one-pass backward rebuilds an input-needing activation's input
         * from x alone (ops.h), which misses the residual: the sum is made
         * by the fused op and the activation applied as its own op, which
         * keeps the sum (the chain's bits and memory). */
        fr_tensor *z = fr_bn_act(x, residual, bn, FR_ACT_IDENTITY, 0.0f, mode);
        fr_tensor *y = z ? fr_activation(z, act, slope) : NULL;
        fr_release(z);
        return y;
    }
    bool abn = mode == FR_BNACT_INPLACE_ABN;
    const char *op = abn ? "inplace_abn" : "bn_act";
    fr_tensor *mean = channels_like(bn->gamma), *invstd = channels_like(bn->gamma);
    fr_tensor *gamma_eff = abn ? channels_like(bn->gamma) : NULL;
    fr_tensor *y = NULL;
    fr_node *node = NULL;
    bnact_ctx *c = NULL;
    fr_status st = mean && invstd && (gamma_eff || !abn) ? FR_OK : fr_last_status();
    if (st == FR_OK && abn)
        st = fr_abn_gamma_forward(gamma_eff, bn->gamma, bn->eps);
    /* An inplace op records before writing, so x's edge is its old producer. */
    if (st == FR_OK && recording) {
        c = malloc(sizeof *c);
        node = c ? fr_node_new(op, bnact_backward, 4, in, 1) : NULL;
        if (!node) {
            st = c ? fr_last_status() : fr_error(FR_ERR_OOM, "%s: out of memory", op);
            free(c);
            c = NULL;
        } else {
            *c = (bnact_ctx){.act = act, .slope = slope, .mode = mode,
                             .has_residual = residual != NULL, .i_x = -1, .i_y = -1,
                             .i_mean = -1, .i_invstd = -1, .i_gamma = -1, .i_beta = -1,
                             .i_residual = -1, .i_gamma_eff = -1, .i_z = -1};
            fr_node_set_ctx(node, c, NULL);
        }
    }
    /* KEEP with an activation that reads its input: the pre-activation is
     * made and kept as the chain of separate ops keeps it (plain's bytes,
     * PyTorch's), then the activation applied; backward never reads it
     * (fr_bn_act_backward rebuilds it from x in its pass), which saves the
     * chain's separate activation backward and its gradient tensor. */
    fr_tensor *pre = NULL;
    if (st == FR_OK && node && mode == FR_BNACT_KEEP && fr_act_needs_input(act)) {
        pre = fr_empty_like(x, FR_TAG_TRANSIENT);
        st = pre ? compute(pre, mean, invstd, x, NULL, bn, bn->gamma, FR_ACT_IDENTITY, 0.0f)
                 : fr_last_status();
        y = st == FR_OK ? fr_empty_like(x, FR_TAG_TRANSIENT) : NULL;
        if (st == FR_OK)
            st = y ? fr_act_forward(y, pre, act, slope) : fr_last_status();
    } else if (st == FR_OK) {
        y = abn ? fr_retain(x) : fr_empty_like(x, FR_TAG_TRANSIENT);
        st = y ? compute(y, mean, invstd, x, residual, bn, abn ? gamma_eff : bn->gamma, act, slope)
               : fr_last_status();
    }
    if (st == FR_OK && abn)
        fr_bump_version(x, "inplace_abn");
    /* where a recording run would keep the mask (below), an unrecorded one
     * hands it to a checkpoint's replay (checkpoint_log.h) */
    bool abn_codes = abn && fr_compress_bits() > 0 && fr_compress_would_pack(y);
    if (st == FR_OK && !node && sign_act(act) &&
        (abn ? abn_codes : residual || mode == FR_BNACT_KEEP || fr_compress_bits() > 0) &&
        fr_node_keep_sign(NULL, y) < 0)
        st = fr_last_status();
    if (st == FR_OK && node) {
        bool ok;
        if (abn) {
            ok = (abn_codes ? abn_keep_codes(node, c, y, act, slope)
                            : (c->i_y = fr_node_save_activation(node, y, false)) >= 0) &&
                 (c->i_invstd = fr_node_save(node, invstd)) >= 0 &&
                 (c->i_gamma = fr_node_save(node, bn->gamma)) >= 0 &&
                 (c->i_beta = fr_node_save(node, bn->beta)) >= 0 &&
                 (c->i_gamma_eff = fr_node_save(node, gamma_eff)) >= 0 &&
                 (!residual || (c->i_residual = fr_node_save_activation(node, residual, true)) >= 0);
        } else {
            /* RECOMPUTE_X keeps x's recipe when it has one; plain RECOMPUTE
             * holds x, which its own recipe for y reads. KEEP under
             * compress:B too: a dense layer's concatenation then stays the
             * recipe over its features' codes, each feature packed once,
             * rather than codes of the whole concatenation packed again by
             * every layer (DenseNet-BC-100 b64 compress:8: saved 570 -> 405
             * MiB, step 1.36x -> 1.09x plain's, bench/RESULTS.md). */
            bool via_recipe = mode == FR_BNACT_RECOMPUTE_X ||
                              (mode == FR_BNACT_KEEP && fr_compress_bits() > 0);
            c->i_x = fr_node_save_activation(node, x, via_recipe);
            ok = c->i_x >= 0 &&
                 (c->i_mean = fr_node_save(node, mean)) >= 0 &&
                 (c->i_invstd = fr_node_save(node, invstd)) >= 0 &&
                 (c->i_gamma = fr_node_save(node, bn->gamma)) >= 0 &&
                 (c->i_beta = fr_node_save(node, bn->beta)) >= 0;
            if (ok && (residual || mode == FR_BNACT_KEEP)) {
                /* a block output: kept by the next block anyway, so its mask
                 * costs nothing (KEEP: kept whatever follows) */
                bool sign = sign_act(act);
                ok = (c->i_y = sign  ? fr_node_keep_sign(node, y)
                               : pre ? fr_node_save_activation(node, pre, true)
                                     : fr_node_save_activation(node, y, false)) >= 0;
            } else if (ok) {
                /* Under compress:B, x is kept as codes, and a mask rebuilt
                 * from their decoding flips wherever BN(x) lies near zero:
                 * each flip passes or blocks a whole gradient value, and
                 * BN's backward keeps them as a large error in sums that
                 * mostly cancel (ResNet-20 recompute+compress:8, one step:
                 * 0.18 relative gradient error against plain, compress:8
                 * alone 0.006). So the mask is kept too, as bits (1/32 of y),
                 * packed before y takes its recipe. */
                if (sign_act(act) && fr_compress_bits() > 0)
                    ok = (c->i_y = fr_node_keep_sign(node, y)) >= 0;
                fr_recipe *r = ok ? bnact_recipe_new(x, via_recipe, mean, invstd, bn, act, slope) : NULL;
                ok = r != NULL;
                if (ok)
                    fr_set_recipe(y, r);
            }
        }
        if (ok)
            fr_node_set_output(node, 0, y);
        else
            st = fr_last_status();
    }
    fr_release(mean);
    fr_release(invstd);
    fr_release(gamma_eff);
    fr_release(pre);
    if (st != FR_OK) {
        fr_release(y);
        return NULL;
    }
    return y;
}
