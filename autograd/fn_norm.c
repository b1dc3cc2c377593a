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
 * held or recipe"). */
#include <stdlib.h>

#include "functions.h"
#include "node.h"

typedef struct {
    int groups;
    fr_act act;
    float slope;
} gn_ctx;

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

/* ---- backward: saved 0 x, 1 mean, 2 invstd, 3 gamma, 4 beta ---- */

static fr_status gn_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const gn_ctx *c = node->ctx;
    fr_tensor *t[5] = {NULL};
    fr_status st = FR_OK;
    for (int i = 0; i < 5 && st == FR_OK; i++)
        if (!(t[i] = fr_node_unpack(node, i)))
            st = fr_last_status();
    fr_tensor *dy = st == FR_OK ? fr_contiguous(dout[0], FR_TAG_TRANSIENT) : NULL;
    fr_tensor *dx = dy && fr_node_needs_grad(node, 0) ? fr_empty_like(t[0], FR_TAG_TRANSIENT) : NULL;
    fr_tensor *dg = dy ? fr_empty_like(t[3], FR_TAG_TRANSIENT) : NULL;
    fr_tensor *db = dg ? fr_empty_like(t[4], FR_TAG_TRANSIENT) : NULL;
    if (st == FR_OK && (!db || (fr_node_needs_grad(node, 0) && !dx)))
        st = fr_last_status();
    if (st == FR_OK)
        st = fr_group_norm_act_backward(dx, dg, db, dy, t[0], t[1], t[2], t[3], t[4], c->groups, c->act,
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
    int64_t n = x->ndim >= 1 ? x->shape[0] : 0;
    fr_tensor *cx = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *mean = cx ? fr_empty(fr_device_of(x), FR_F32, 2, FR_SHAPE(n, groups), FR_TAG_TRANSIENT) : NULL;
    fr_tensor *invstd = mean ? fr_empty_like(mean, FR_TAG_TRANSIENT) : NULL;
    fr_tensor *y = invstd ? fr_empty_like(cx, FR_TAG_TRANSIENT) : NULL;
    bool ok = y && fr_group_norm_stats(mean, invstd, cx, groups, eps) == FR_OK &&
              fr_group_norm_act_forward(y, cx, mean, invstd, gamma, beta, groups, act, slope) == FR_OK;
    fr_tensor *in[3] = {x, gamma, beta};
    if (ok && fr_should_record(3, in)) {
        gn_ctx *c = malloc(sizeof *c);
        fr_node *node = c ? fr_node_new("group_norm", gn_backward, 3, in, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "group_norm: out of memory");
            free(c);
            ok = false;
        } else {
            *c = (gn_ctx){.groups = groups, .act = act, .slope = slope};
            fr_node_set_ctx(node, c, NULL);
            ok = fr_node_save_held(node, cx) == 0 && fr_node_save(node, mean) == 1 &&
                 fr_node_save(node, invstd) == 2 && fr_node_save(node, gamma) == 3 &&
                 fr_node_save(node, beta) == 4;
            if (ok && recompute) {
                fr_recipe *r = gn_recipe_new(cx, mean, invstd, gamma, beta, *c);
                ok = r != NULL;
                if (ok)
                    fr_set_recipe(y, r);
            }
            if (ok)
                fr_node_set_output(node, 0, y);
        }
    }
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
