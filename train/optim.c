/* optim.c: SGD, Adam and AdamW; see optim.h. The arithmetic is in
 * cpu/optim.c (and its CUDA twin); this file keeps the state. */
#include "optim.h"

#include <stdio.h>
#include <stdlib.h>

#include "../tensor/ops.h"

static const char *const state_names[FR_OPTIM_KIND_COUNT][2] = {
    [FR_OPTIM_SGD] = {"momentum_buffer", NULL},
    [FR_OPTIM_ADAM] = {"exp_avg", "exp_avg_sq"},
    [FR_OPTIM_ADAMW] = {"exp_avg", "exp_avg_sq"},
};

fr_adam_options fr_adam_defaults(double lr, double weight_decay) {
    return (fr_adam_options){.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                             .weight_decay = weight_decay};
}

static fr_optim *optim_alloc(fr_params *params, fr_optim_kind kind, double lr) {
    if (!params) {
        fr_error(FR_ERR_ARG, "optim: params is NULL");
        return NULL;
    }
    fr_optim *o = calloc(1, sizeof *o);
    int n = params->count ? params->count : 1;
    if (!o || !(o->state[0] = calloc((size_t)n, sizeof(fr_tensor *))) ||
        !(o->state[1] = calloc((size_t)n, sizeof(fr_tensor *))) ||
        !(o->steps = calloc((size_t)n, sizeof(int64_t)))) {
        fr_optim_free(o);
        fr_error(FR_ERR_OOM, "optim: out of memory");
        return NULL;
    }
    o->kind = kind;
    o->lr = lr;
    o->params = params;
    o->n = params->count;
    return o;
}

fr_optim *fr_sgd_new(fr_params *params, fr_sgd_options o) {
    const char *bad = o.lr < 0                ? "lr must be >= 0"
                      : o.momentum < 0        ? "momentum must be >= 0"
                      : o.dampening < 0       ? "dampening must be >= 0"
                      : o.weight_decay < 0    ? "weight_decay must be >= 0"
                      : o.nesterov && (o.momentum <= 0 || o.dampening != 0)
                          ? "nesterov needs momentum > 0 and dampening 0"
                          : NULL;
    if (bad) {
        fr_error(FR_ERR_ARG, "sgd: %s (lr %g, momentum %g, dampening %g, weight_decay %g)", bad, o.lr,
                 o.momentum, o.dampening, o.weight_decay);
        return NULL;
    }
    fr_optim *opt = optim_alloc(params, FR_OPTIM_SGD, o.lr);
    if (opt)
        opt->sgd = o;
    return opt;
}

static fr_optim *adam_new(fr_params *params, fr_adam_options o, fr_optim_kind kind) {
    const char *op = kind == FR_OPTIM_ADAMW ? "adamw" : "adam";
    const char *bad = o.lr < 0                         ? "lr must be >= 0"
                      : o.eps < 0                      ? "eps must be >= 0"
                      : o.beta1 < 0 || o.beta1 >= 1    ? "beta1 must be in [0, 1)"
                      : o.beta2 < 0 || o.beta2 >= 1    ? "beta2 must be in [0, 1)"
                      : o.weight_decay < 0             ? "weight_decay must be >= 0"
                                                       : NULL;
    if (bad) {
        fr_error(FR_ERR_ARG, "%s: %s (lr %g, betas (%g, %g), eps %g, weight_decay %g)", op, bad, o.lr,
                 o.beta1, o.beta2, o.eps, o.weight_decay);
        return NULL;
    }
    fr_optim *opt = optim_alloc(params, kind, o.lr);
    if (opt)
        opt->adam = o;
    return opt;
}

fr_optim *fr_adam_new(fr_params *params, fr_adam_options o) { return adam_new(params, o, FR_OPTIM_ADAM); }
fr_optim *fr_adamw_new(fr_params *params, fr_adam_options o) {
    return adam_new(params, o, FR_OPTIM_ADAMW);
}

void fr_optim_free(fr_optim *opt) {
    if (!opt)
        return;
    for (int s = 0; s < 2; s++) {
        for (int i = 0; opt->state[s] && i < opt->n; i++)
            fr_release(opt->state[s][i]);
        free(opt->state[s]);
    }
    free(opt->steps);
    free(opt);
}

/* The state tensor in `slot` for entry i, created (zeros, like w) on first
 * use; NULL with an error when it cannot be allocated. */
static fr_tensor *state_of(fr_optim *opt, int slot, int i, const fr_tensor *w) {
    if (!opt->state[slot][i])
        opt->state[slot][i] = fr_zeros_like(w, FR_TAG_OPTIM);
    return opt->state[slot][i];
}

static fr_status step_one(fr_optim *opt, int i, fr_tensor *w) {
    if (opt->kind == FR_OPTIM_SGD) {
        const fr_sgd_options *o = &opt->sgd;
        fr_tensor *buf = NULL;
        bool first = !opt->state[0][i]; /* PyTorch: the buffer starts as a copy of d */
        if (o->momentum != 0 && !(buf = state_of(opt, 0, i, w)))
            return fr_last_status();
        FR_TRY(fr_sgd_update_(w, buf, w->grad, opt->lr, o->momentum, o->dampening, o->weight_decay,
                              o->nesterov, first));
    } else {
        const fr_adam_options *o = &opt->adam;
        fr_tensor *m = state_of(opt, 0, i, w), *v = m ? state_of(opt, 1, i, w) : NULL;
        if (!v)
            return fr_last_status();
        FR_TRY(fr_adam_update_(w, m, v, w->grad, opt->lr, o->beta1, o->beta2, o->eps, o->weight_decay,
                               opt->kind == FR_OPTIM_ADAMW, opt->steps[i] + 1));
    }
    opt->steps[i]++;
    return FR_OK;
}

fr_status fr_optim_step(fr_optim *opt) {
    if (!opt)
        return fr_error(FR_ERR_ARG, "optim step: optimizer is NULL");
    if (opt->params->count != opt->n)
        return fr_error(FR_ERR_ARG, "optim step: the registry has %d tensors, %d when the optimizer "
                                    "was made; make the optimizer after the model",
                        opt->params->count, opt->n);
    for (int i = 0; i < opt->n; i++) {
        fr_param *e = &opt->params->items[i];
        if (e->kind != FR_PARAMETER || !e->tensor->grad)
            continue;
        fr_status st = step_one(opt, i, e->tensor);
        if (st != FR_OK) {
            char cause[256];
            snprintf(cause, sizeof cause, "%s", fr_last_error());
            return fr_error(st, "optim step, parameter %s: %s", e->name, cause);
        }
    }
    return FR_OK;
}

void fr_optim_zero_grad(fr_optim *opt) { fr_params_zero_grad(opt->params); }

size_t fr_optim_state_bytes(const fr_optim *opt) {
    size_t n = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < opt->n; i++)
            if (opt->state[s][i])
                n += fr_nbytes(opt->state[s][i]);
    return n;
}

const char *fr_optim_state_name(const fr_optim *opt, int slot) {
    if (slot < 0 || slot > 1 || (opt->kind == FR_OPTIM_SGD && opt->sgd.momentum == 0))
        return NULL;
    return state_names[opt->kind][slot];
}
