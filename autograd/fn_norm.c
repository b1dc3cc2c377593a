/* fn_norm.c: group normalisation (group, layer and instance norm are its
 * cases) fused with any activation, differentiable.
 *
 * The node keeps x and the per-(sample, group) statistics, never the
 * output: backward recomputes the pre-activation from x with the forward's
 * arithmetic (kernels.def: group_norm_act_backward), so every activation
 * works the same whatever its gradient reads. With `recompute` the output
 * also carries a recipe (x and the statistics), so an op that saves it (the
 * next convolution) keeps the recipe instead of the bytes, as fused BN+act
 * does under the recompute strategy (docs/ARCHITECTURE.md, "Saved tensors:
 * held or recipe").
 *
 * Under compress:B a ReLU or leaky ReLU also keeps its output's sign as
 * bits (fr_node_keep_sign, checkpoint_log.h), as the fused BN + activation
 * does: in a checkpoint's replay x is rebuilt from the segment input's
 * decoded codes, and a mask recomputed from it flips wherever the forward's
 * pre-activation lay near zero (six conv + GroupNorm(4) + ReLU layers,
 * checkpoint:1 + compress:8: 0.029 relative gradient error against plain,
 * compress:8 alone 0.0013; docs/ARCHITECTURE.md, "Group normalisation +
 * activation"), so the replay takes its forward's mask. Elsewhere the kept mask is the sign the backward would
 * recompute from x, bit for bit. */
#include <stdlib.h>

#include "checkpoint_log.h"
#include "functions.h"
#include "node.h"

typedef struct {
    int groups;
    fr_act act;
    float slope;
    int i_mask; /* the output's sign kept (compress:B, sign-only activations), else -1 */
} gn_ctx;

/* Whether the activation's gradient is read from its output's sign alone,
 * so that its mask can be kept (fn_bn_act.c asks the same) */
static bool sign_act(fr_act act) { return act == FR_ACT_RELU || act == FR_ACT_LEAKY_RELU; }

/* ---- the recipe that rebuilds y from x and the statistics ---- */

typedef struct {
    fr_recipe base;
    fr_tensor *x, *mean, *invstd, *gamma, *beta;
    uint64_t x_version;
    gn_ctx c;
} gn_recipe;

static fr_tensor *gn_recipe_make(fr_recipe *self) {
    gn_recipe *r = (gn_recipe *)self;
    if (r->x->storage->version != r->x_version) {
        fr_error(FR_ERR_VERSION, "group_norm recompute: its input was modified inplace by %s after the forward",
                 r->x->storage->last_writer ? r->x->storage->last_writer : "an inplace op");
        return NULL;
    }
    fr_tensor *y = fr_empty_like(r->x, FR_TAG_TRANSIENT);
    if (y && fr_group_norm_act_forward(y, r->x, r->mean, r->invstd, r->gamma, r->beta, r->c.groups,
                                       r->c.act, r->c.slope) != FR_OK)
        fr_clear(&y);
    return y;
}

static void gn_recipe_destroy(fr_recipe *self) {
    gn_recipe *r = (gn_recipe *)self;
    fr_release(r->x);
    fr_release(r->mean);
    fr_release(r->invstd);
    fr_release(r->gamma);
    fr_release(r->beta);
    free(r);
}

static fr_recipe *gn_recipe_new(fr_tensor *x, fr_tensor *mean, fr_tensor *invstd, fr_tensor *gamma,
                                fr_tensor *beta, gn_ctx c) {
    gn_recipe *r = calloc(1, sizeof *r);
    if (!r) {
        fr_error(FR_ERR_OOM, "group_norm: out of memory");
        return NULL;
    }
    r->base = (fr_recipe){.refcount = 1, .op = "group_norm", .make = gn_recipe_make,
                          .destroy = gn_recipe_destroy};
    r->x = fr_retain(x);
    r->mean = fr_retain(mean);
    r->invstd = fr_retain(invstd);
    r->gamma = fr_retain(gamma);
    r->beta = fr_retain(beta);
    r->x_version = x->storage->version;
    r->c = c;
    return &r->base;
}

/* ---- backward: saved 0 x, 1 mean, 2 invstd, 3 gamma, 4 beta, and the
 * mask at c->i_mask when kept ---- */

/* The activation's gradient read from the kept mask, into a new tensor
 * (over dy when nothing else holds it): from its bits where dy lies as the
 * mask was packed (no f32 mask of 1 and 0 is made, as in fn_bn_act.c),
 * else from the unpacked mask, whose 1 and 0 have the output's sign. */
static fr_tensor *mask_grad(fr_node *node, const gn_ctx *c, fr_tensor *dy) {
    fr_tensor *bits = dy->dtype == FR_F32 ? fr_node_sign_bits(node, c->i_mask, dy) : NULL;
    fr_tensor *mask = bits ? NULL : fr_node_unpack(node, c->i_mask);
    fr_tensor *g = bits || mask ? (fr_grad_held_alone(dy) ? fr_retain(dy)
                                                          : fr_empty_like(dy, FR_TAG_TRANSIENT))
                                : NULL;
    fr_status st = !g    ? fr_last_status()
                   : bits ? fr_sign_act_backward(g, dy, bits, c->act, c->slope)
                          : fr_act_backward(g, dy, mask, c->act, c->slope);
    fr_release(bits);
    fr_release(mask);
    if (st != FR_OK)
        fr_clear(&g);
    return g;
}

static fr_status gn_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const gn_ctx *c = node->ctx;
    fr_tensor *t[5] = {NULL};
    fr_status st = FR_OK;
    for (int i = 0; i < 5 && st == FR_OK; i++)
        if (!(t[i] = fr_node_unpack(node, i)))
            st = fr_last_status();
    fr_tensor *dy = st == FR_OK ? fr_contiguous(dout[0], FR_TAG_TRANSIENT) : NULL;
    /* a kept mask: the activation's gradient from it, then the norm's with
     * the identity (the pre-activation x would give is not the one the
     * forward's output came from in a replay on decoded codes) */
    fr_act act = c->act;
    if (dy && c->i_mask >= 0) {
        fr_tensor *g = mask_grad(node, c, dy);
        fr_release(dy);
        dy = g;
        act = FR_ACT_IDENTITY;
    }
    fr_tensor *dx = dy && fr_node_needs_grad(node, 0) ? fr_empty_like(t[0], FR_TAG_TRANSIENT) : NULL;
    fr_tensor *dg = dy ? fr_empty_like(t[3], FR_TAG_TRANSIENT) : NULL;
    fr_tensor *db = dg ? fr_empty_like(t[4], FR_TAG_TRANSIENT) : NULL;
    if (st == FR_OK && (!db || (fr_node_needs_grad(node, 0) && !dx)))
        st = fr_last_status();
    if (st == FR_OK)
        st = fr_group_norm_act_backward(dx, dg, db, dy, t[0], t[1], t[2], t[3], t[4], c->groups, act,
                                        c->slope);
    for (int i = 0; i < 5; i++)
        fr_release(t[i]);
    fr_release(dy);
    if (st != FR_OK) {
        fr_release(dx);
        fr_release(dg);
        fr_release(db);
        return st;
    }
    din[0] = dx;
    if (fr_node_needs_grad(node, 1))
        din[1] = dg;
    else
        fr_release(dg);
    if (fr_node_needs_grad(node, 2))
        din[2] = db;
    else
        fr_release(db);
    return FR_OK;
}

fr_tensor *fr_group_norm_act(fr_tensor *x, fr_tensor *gamma, fr_tensor *beta, int groups, float eps,
                             fr_act act, float slope, bool recompute) {
    if (fr_check_defined("group_norm", "x", x) != FR_OK ||
        fr_check_defined("group_norm", "weight", gamma) != FR_OK ||
        fr_check_defined("group_norm", "bias", beta) != FR_OK)
        return NULL;
    if (groups < 1) { /* before (N, groups) statistics are made of it */
        fr_error(FR_ERR_SHAPE, "group_norm: groups %d must be >= 1", groups);
        return NULL;
    }
    int64_t n = x->ndim >= 1 ? x->shape[0] : 0;
    fr_tensor *cx = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *mean = cx ? fr_empty(fr_device_of(x), FR_F32, 2, FR_SHAPE(n, groups), FR_TAG_TRANSIENT) : NULL;
    fr_tensor *invstd = mean ? fr_empty_like(mean, FR_TAG_TRANSIENT) : NULL;
    fr_tensor *y = invstd ? fr_empty_like(cx, FR_TAG_TRANSIENT) : NULL;
    bool ok = y && fr_group_norm_stats(mean, invstd, cx, groups, eps) == FR_OK &&
              fr_group_norm_act_forward(y, cx, mean, invstd, gamma, beta, groups, act, slope) == FR_OK;
    fr_tensor *in[3] = {x, gamma, beta};
    /* the mask goes where its checkpoint's replay will look for it: kept
     * under compress:B, which the replay runs under too, whether or not
     * this forward records (checkpoint_log.h) */
    bool keep_mask = sign_act(act) && fr_compress_bits() > 0;
    if (ok && fr_should_record(3, in)) {
        gn_ctx *c = malloc(sizeof *c);
        fr_node *node = c ? fr_node_new("group_norm", gn_backward, 3, in, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "group_norm: out of memory");
            free(c);
            ok = false;
        } else {
            *c = (gn_ctx){.groups = groups, .act = act, .slope = slope, .i_mask = -1};
            fr_node_set_ctx(node, c, NULL);
            ok = fr_node_save_held(node, cx) == 0 && fr_node_save(node, mean) == 1 &&
                 fr_node_save(node, invstd) == 2 && fr_node_save(node, gamma) == 3 &&
                 fr_node_save(node, beta) == 4;
            /* before y takes its recipe: the mask is of y's bytes */
            if (ok && keep_mask)
                ok = (c->i_mask = fr_node_keep_sign(node, y)) >= 0;
            if (ok && recompute) {
                fr_recipe *r = gn_recipe_new(cx, mean, invstd, gamma, beta, *c);
                ok = r != NULL;
                if (ok)
                    fr_set_recipe(y, r);
            }
            if (ok)
                fr_node_set_output(node, 0, y);
        }
    } else if (ok && keep_mask)
        ok = fr_node_keep_sign(NULL, y) >= 0;
    fr_release(cx);
    fr_release(mean);
    fr_release(invstd);
    if (!ok)
        fr_clear(&y);
    return y;
}

fr_tensor *fr_group_norm(fr_tensor *x, fr_tensor *gamma, fr_tensor *beta, int groups, float eps) {
    return fr_group_norm_act(x, gamma, beta, groups, eps, FR_ACT_IDENTITY, 0.0f, false);
}
