/* fit.c: will it fit? Batch sizes chosen from measured bytes (planner.h).
 *
 * The evaluation pass of a run under --memory-budget: a no_grad forward at
 * the training batch can need more than the planned training step (a
 * checkpointed or micro-batched step holds less than one full-batch
 * forward's largest activations and conv workspace), so on a device of
 * exactly the budget the run used to die at its first evaluation (issue
 * 22). Its batch is chosen here: two eval-mode no_grad forwards at small
 * batches give the bytes a forward needs above what is held, as a + b * n
 * (activations and workspaces grow with the batch; a part does not), and
 * the largest n <= the batch whose prediction fits the budget is taken.
 * Evaluation in eval mode treats each image alone (batch norm uses its
 * running statistics), so its loss and accuracy do not depend on the
 * batch. */
#include "planner.h"
#include "profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../autograd/autograd.h"
#include "../train/train.h"

/* Peak bytes a no_grad eval-mode forward of n images needs above what is in
 * use before it, its input included (lock-free ledger reads). */
static fr_status forward_bytes(fr_model *m, const int64_t *shape, int n, fr_device dev, double *bytes) {
    int64_t s[4] = {n, shape[1], shape[2], shape[3]};
    size_t base = fr_mem_total_current(dev);
    fr_mem_reset_peak();
    fr_tensor *x = fr_zeros(dev, FR_F32, 4, s, FR_TAG_DATA);
    if (!x)
        return fr_last_status();
    fr_no_grad_enter();
    fr_tensor *y = fr_model_forward(m, x, false);
    fr_no_grad_exit();
    fr_status st = y ? FR_OK : fr_last_status();
    fr_release(y);
    fr_release(x);
    size_t peak = fr_mem_total_peak(dev);
    *bytes = peak > base ? (double)(peak - base) : 0;
    fr_mem_reset_peak();
    return st;
}

fr_status fr_fit_eval_batch(fr_model *m, const int64_t *shape, int probe, size_t budget, size_t held,
                            int *batch, double *predicted) {
    if (!m || !shape || !batch || shape[0] < 1 || probe < 1)
        return fr_error(FR_ERR_ARG, "fr_fit_eval_batch: a model, an input shape and a probe batch >= 1 "
                        "are needed");
    fr_device dev = fr_device_of(m->params->items[0].tensor);
    int full = (int)shape[0];
    int n2 = probe < full ? probe : full, n1 = n2 > 1 ? n2 / 2 : 1;
    double p1 = 0, p2 = 0;
    FR_TRY(forward_bytes(m, shape, n1, dev, &p1));
    if (n2 > n1)
        FR_TRY(forward_bytes(m, shape, n2, dev, &p2));
    double per = n2 > n1 && p2 > p1 ? (p2 - p1) / (double)(n2 - n1) : p1 / (double)n1;
    double fixed = p1 - per * (double)n1 > 0 ? p1 - per * (double)n1 : 0;
    int n = full;
    if ((double)held + fixed + per * (double)n > (double)budget)
        n = per > 0 && (double)budget > (double)held + fixed
                ? (int)(((double)budget - (double)held - fixed) / per)
                : 0;
    if (n < 1)
        n = 1;
    if (n > full)
        n = full;
    *batch = n;
    if (predicted)
        *predicted = (double)held + fixed + per * (double)n;
    return FR_OK;
}

/* ---- will it fit? the largest batch per strategy, from measured steps ----
 *
 * A trial is the library's own step (fr_train_step without an optimizer,
 * so nothing is updated) run twice at one batch, with what the real steps
 * would hold beside them allocated on the ledger: the loader's batches
 * (tagged data) and, in the second step, the optimizer state the first
 * real step creates at its end (tagged optim). Its peak is the highest ledger total over both
 * steps (the first at a new shape includes the checkpoint segment
 * planner's own trial). Gradients are freed after each step, as the
 * optimizer's zero_grad does; the caller's gradients, BN running
 * statistics and counters and the random stream are put back afterwards. */


typedef struct {
    fr_model *m;
    const int64_t *image;       /* (C, H, W) at image[1..3] */
    fr_device dev;
    size_t budget;
    size_t held;                /* in use beside the parameters before the trials */
    const fr_fit_options *o;
    fr_fit_row *row;
} fit_ctx;

/* The model's buffers (BN running statistics and counters) copied to host
 * memory outside the ledger, so copying them does not raise a measured
 * peak; restored after the trials. */
typedef struct {
    int n;
    void **host;
} buffer_stash;

static fr_status stash_buffers(fr_model *m, buffer_stash *s) {
    s->n = m->params->count;
    s->host = calloc((size_t)s->n + 1, sizeof *s->host);
    if (!s->host)
        return fr_error(FR_ERR_OOM, "will it fit: out of host memory");
    for (int i = 0; i < s->n; i++) {
        const fr_param *e = &m->params->items[i];
        const fr_tensor *t = e->tensor;
        if (e->kind != FR_BUFFER)
            continue;
        if (fr_device_of(t) != FR_CPU && t->dtype != FR_F32)
            return fr_error(FR_ERR_ARG, "will it fit: buffer %s is %s on %s: only f32 device buffers can "
                            "be set aside", e->name, fr_dtype_name(t->dtype), fr_device_name(fr_device_of(t)));
        if (!(s->host[i] = malloc(fr_nbytes(t) + 1)))
            return fr_error(FR_ERR_OOM, "will it fit: out of host memory");
        if (fr_device_of(t) == FR_CPU)
            memcpy(s->host[i], fr_data(t), fr_nbytes(t));
        else
            FR_TRY(fr_read_f32(t, s->host[i], (size_t)fr_numel(t)));
    }
    return FR_OK;
}

/* Puts the buffers back and frees the stash (also after a failed stash). */
static fr_status restore_buffers(fr_model *m, buffer_stash *s) {
    fr_status st = FR_OK;
    for (int i = 0; s->host && i < s->n; i++) {
        fr_tensor *t = m->params->items[i].tensor;
        if (s->host[i] && st == FR_OK) {
            if (fr_device_of(t) == FR_CPU) {
                memcpy(fr_data(t), s->host[i], fr_nbytes(t));
            } else {
                fr_tensor *h = fr_from_host(fr_device_of(t), FR_F32, t->ndim, t->shape, FR_TAG_TRANSIENT,
                                            s->host[i]);
                st = h ? fr_copy_(t, h) : fr_last_status();
                fr_release(h);
            }
        }
        free(s->host[i]);
    }
    free(s->host);
    s->host = NULL;
    return st;
}

/* Two steps at batch b under the model's strategy (and layout, if one is
 * installed) in `accum` micro-batches: *peak is the highest ledger total
 * over them, *at the bytes per tag at that moment (may be NULL). *fits is
 * whether the peak is within the budget; an out-of-memory error (a
 * --memory-limit) is a batch that does not fit, any other error comes back. */
static fr_status trial(fit_ctx *c, int b, int accum, size_t *peak, size_t *at, bool *fits) {
    const int64_t *s = c->image;
    fr_tensor *optim = NULL, *extra = NULL, *x = NULL, *y = NULL;
    fr_mem_reset_peak();
    fr_status st = FR_OK;
    if (c->o->extra_per_image &&
        !(extra = fr_empty(c->dev, FR_U8, 1, FR_SHAPE((int64_t)(c->o->extra_per_image * (size_t)b)),
                           FR_TAG_DATA)))
        st = fr_last_status();
    if (st == FR_OK && !(x = fr_zeros(c->dev, FR_F32, 4, FR_SHAPE(b, s[1], s[2], s[3]), FR_TAG_DATA)))
        st = fr_last_status();
    if (st == FR_OK && !(y = fr_zeros(c->dev, FR_I32, 1, FR_SHAPE(b), FR_TAG_DATA)))
        st = fr_last_status();
    for (int k = 0; k < 2 && st == FR_OK; k++) {
        /* the optimizer state exists from the end of the first step on */
        if (k == 1 && c->o->optim_bytes &&
            !(optim = fr_empty(c->dev, FR_U8, 1, FR_SHAPE((int64_t)c->o->optim_bytes), FR_TAG_OPTIM))) {
            st = fr_last_status();
            break;
        }
        st = fr_train_step(c->m, NULL, NULL, x, y, accum, NULL, NULL, NULL);
        fr_params_zero_grad(c->m->params);
    }
    fr_mem_stats ms;
    fr_mem_get_stats(c->dev, &ms);
    fr_release(x);
    fr_release(y);
    fr_release(extra);
    fr_release(optim);
    fr_mem_reset_peak();
    c->row->steps += 2;
    if (st == FR_ERR_OOM) {
        *fits = false;
        *peak = 0;
        return FR_OK;
    }
    FR_TRY(st);
    *peak = ms.total_peak;
    if (at)
        for (int k = 0; k < FR_TAG_COUNT; k++)
            at[k] = ms.at_peak[k];
    *fits = ms.total_peak <= c->budget;
    return FR_OK;
}

/* The planner's options for a step of b images in one micro-batch, holding
 * what the trials hold beside it. */
static fr_plan_options plan_options(const fit_ctx *c, int b) {
    fr_plan_options po = c->o->plan;
    po.max_accum = 1;
    po.optim_bytes = c->o->optim_bytes;
    po.extra_bytes += c->held + c->o->extra_per_image * (size_t)b;
    return po;
}

/* The planner's step at batch b in one micro-batch: planned for the budget
 * (a layout it predicts to fit), installed, then measured by a trial. A
 * batch it finds no layout for does not fit (peak 0: not measured). */
static fr_status planned_trial(fit_ctx *c, int b, size_t *peak, double *estimate, bool *fits) {
    fr_plan_options po = plan_options(c, b);
    fr_memory_plan plan = {0};
    int64_t shape[4] = {b, c->image[1], c->image[2], c->image[3]};
    fr_status st = fr_plan_memory(c->m, shape, c->budget, &po, &plan);
    *peak = 0;
    *fits = false;
    if (st == FR_ERR_ARG || st == FR_ERR_OOM) {
        *estimate = plan.min_budget; /* the least it predicts for b in one micro-batch */
        if (b == 1)
            snprintf(c->row->error, sizeof c->row->error, "%s", fr_last_error());
        return FR_OK;
    }
    FR_TRY(st);
    st = fr_plan_apply(c->m, &plan);
    if (st == FR_OK)
        st = trial(c, b, 1, peak, NULL, fits);
    fr_plan_remove(c->m);
    fr_memory_plan_free(&plan);
    return st;
}

typedef struct {
    int b;
    size_t peak;     /* 0: not measured (out of memory, or no plan) */
    double estimate; /* the measured peak, or the planner's prediction (0: none) */
    bool fits;
} point;

static fr_status measure(fit_ctx *c, point *p) {
    fr_status st = c->row->planned ? planned_trial(c, p->b, &p->peak, &p->estimate, &p->fits)
                                   : trial(c, p->b, 1, &p->peak, NULL, &p->fits);
    if (p->peak)
        p->estimate = (double)p->peak;
    return st;
}

/* The batch where the line through two points reaches the budget (0 when
 * they do not give a rising line). */
static int linear_guess(const point *p, const point *q, size_t budget, double *fixed, double *per) {
    if (!p || !q || p->estimate <= 0 || q->estimate <= 0 || p->b == q->b || (q->estimate - p->estimate) *
        (double)(q->b - p->b) <= 0)
        return 0;
    *per = (q->estimate - p->estimate) / (double)(q->b - p->b);
    *fixed = p->estimate - *per * (double)p->b;
    double g = ((double)budget - *fixed) / *per;
    return g < 1 ? 1 : g > 1e9 ? 1000000000 : (int)g;
}

/* The largest batch in [1, max] whose measured step fits. Every guess is
 * measured: the line through the ends of the bracket [largest batch that
 * fits, smallest that does not] (or through the last two points while one
 * end is missing) says where the budget is reached; after four such guesses
 * the bracket is bisected. It ends when the two ends are neighbours, so the
 * batch reported fits and the next does not. */
static fr_status search(fit_ctx *c, int guess, const point *probes, int n_probes) {
    fr_fit_row *r = c->row;
    int max = c->o->max_batch;
    enum { MAX_POINTS = 40, LINE_GUESSES = 4 };
    point pts[MAX_POINTS];
    int np = 0, guesses = 0;
    for (int i = 0; i < n_probes; i++)
        pts[np++] = probes[i];
    const point *lo = NULL, *hi = NULL;
    for (;;) {
        lo = hi = NULL;
        for (int i = 0; i < np; i++) {
            if (pts[i].b > max)
                continue;
            if (pts[i].fits && (!lo || pts[i].b > lo->b))
                lo = &pts[i];
            if (!pts[i].fits && (!hi || pts[i].b < hi->b))
                hi = &pts[i];
        }
        int a = lo ? lo->b : 0, z = hi ? hi->b : max + 1;
        if (z - a <= 1 || np == MAX_POINTS)
            break;
        /* above a batch that fits, without one known not to, grow at most
         * 4x a step: a batch far above the budget is a long trial of much
         * memory (the first guess is the caller's) */
        int top = hi || !lo ? z : a + 1 + 3 * (a + 1) < z ? a + 1 + 3 * (a + 1) : z;
        double f, per;
        if (!guess && guesses < LINE_GUESSES)
            guess = lo && hi ? linear_guess(lo, hi, c->budget, &f, &per)
                    : np >= 2 ? linear_guess(&pts[np - 2], &pts[np - 1], c->budget, &f, &per) : 0;
        if (!guess)
            guess = lo && !hi && guesses < LINE_GUESSES ? a + 1 : a + (top - a) / 2;
        guess = guess <= a ? a + 1 : guess >= top ? top - 1 : guess;
        point *p = &pts[np++];
        *p = (point){.b = guess};
        FR_TRY(measure(c, p));
        guesses++;
        guess = 0;
    }
    r->batch = lo ? lo->b : 0;
    r->peak = lo ? lo->peak : 0;
    r->next_measured = hi != NULL;
    r->peak_next = hi ? hi->peak : 0;
    return FR_OK;
}

static const char *const default_strategies[] = {"plain", "recompute", "abn", "checkpoint",
                                                 "recompute+checkpoint", "abn+checkpoint"};
enum { N_DEFAULT_STRATEGIES = sizeof default_strategies / sizeof *default_strategies };

/* One strategy's row: a step at the asked batch (the budget it needs and
 * where its bytes go), one at half of it (the line), then the search. */
static fr_status strategy_row(fit_ctx *c, int asked) {
    fr_fit_row *r = c->row;
    c->m->cfg.strategy = r->strategy;
    point pr[2] = {{.b = asked > 1 ? asked / 2 : 2}, {.b = asked}};
    fr_status st = trial(c, asked, 1, &pr[1].peak, r->at_peak, &pr[1].fits);
    if (st == FR_OK)
        st = measure(c, &pr[0]);
    pr[1].estimate = (double)pr[1].peak;
    if (st != FR_OK) { /* a strategy the model refuses */
        r->status = st;
        snprintf(r->error, sizeof r->error, "%s", fr_last_error());
        return st == FR_ERR_ARG ? FR_OK : st;
    }
    r->need = pr[1].peak;
    int g = linear_guess(&pr[pr[0].b > pr[1].b], &pr[pr[0].b < pr[1].b], c->budget, &r->fixed,
                         &r->per_image);
    return search(c, g, pr, 2);
}

/* The planner's row: the budget the planner predicts for the asked batch in
 * one micro-batch, then the search from the best strategy row's batch. */
static fr_status planner_row(fit_ctx *c, int asked, int start) {
    fr_fit_row *r = c->row;
    fr_plan_options po = plan_options(c, asked);
    fr_memory_plan plan = {0};
    int64_t shape[4] = {asked, c->image[1], c->image[2], c->image[3]};
    fr_status st = fr_plan_memory(c->m, shape, (size_t)1 << 60, &po, &plan);
    r->need = st == FR_OK ? (size_t)plan.leanest_peak : 0;
    r->need_predicted = true;
    fr_memory_plan_free(&plan);
    if (st != FR_OK) {
        r->status = st;
        snprintf(r->error, sizeof r->error, "%s", fr_last_error());
        return st == FR_ERR_ARG ? FR_OK : st;
    }
    return search(c, start > 0 ? start : 1, NULL, 0);
}

fr_status fr_fit(fr_model *m, const int64_t *shape, size_t budget, const fr_fit_options *opts,
                 fr_fit_report *out) {
    if (!out)
        return fr_error(FR_ERR_ARG, "fr_fit: out is NULL");
    memset(out, 0, sizeof *out);
    if (!m || !shape || shape[0] < 1 || shape[0] > INT32_MAX || shape[1] < 1 || shape[2] < 1 ||
        shape[3] < 1 || !budget)
        return fr_error(FR_ERR_ARG, "fr_fit: a model, an input shape (N, C, H, W) with N >= 1 and a "
                        "budget > 0 are needed");
    fr_fit_options o = opts ? *opts : (fr_fit_options){0};
    int asked = (int)shape[0];
    if (o.max_batch < 1)
        o.max_batch = asked < 8 ? 64 : 8 * asked;
    if (o.max_batch < asked)
        return fr_error(FR_ERR_ARG, "fr_fit: max_batch %d is below the batch asked about (%d)",
                        o.max_batch, asked);
    int n_strat = o.strategies ? o.n_strategies : N_DEFAULT_STRATEGIES;
    out->rows = calloc((size_t)n_strat + 1, sizeof *out->rows);
    if (!out->rows)
        return fr_error(FR_ERR_OOM, "fr_fit: out of host memory");
    memcpy(out->shape, shape, sizeof out->shape);
    out->budget = budget;
    out->max_batch = o.max_batch;
    fr_device dev = fr_device_of(m->params->items[0].tensor);
    fit_ctx c = {.m = m, .image = shape, .dev = dev, .budget = budget, .o = &o};
    for (int i = 0; i < n_strat; i++) {
        fr_fit_row *r = &out->rows[out->n_rows++];
        if (o.strategies)
            r->strategy = o.strategies[i];
        else
            FR_TRY(fr_strategy_parse(default_strategies[i], &r->strategy));
        fr_strategy_format(r->strategy, r->name, sizeof r->name);
    }
    if (o.planner) {
        fr_fit_row *r = &out->rows[out->n_rows++];
        r->planned = true;
        snprintf(r->name, sizeof r->name, "planner");
    }

    /* set aside what the trials must not change */
    fr_strategy was = m->cfg.strategy;
    fr_plan_remove(m);
    fr_trial_stash stash = {0};
    buffer_stash bs = {0};
    fr_status st = fr_trial_stash_take(m, &stash);
    if (st == FR_OK)
        st = stash_buffers(m, &bs);
    /* the planner is told what is in use beside the parameters now (data
     * sets, set-aside gradients), which the trials hold too */
    size_t now = fr_mem_total_current(dev), params = fr_mem_current(dev, FR_TAG_PARAM);
    c.held = now > params ? now - params : 0;
    int best = 0;
    for (int i = 0; st == FR_OK && i < out->n_rows; i++) {
        c.row = &out->rows[i];
        if (!c.row->planned) {
            st = strategy_row(&c, asked);
            if (c.row->status == FR_OK && c.row->batch > best)
                best = c.row->batch;
        } else {
            st = planner_row(&c, asked, best);
        }
    }
    fr_trial_stash_put_back(m, &stash);
    fr_status rs = restore_buffers(m, &bs);
    m->cfg.strategy = was;
    fr_mem_reset_peak();
    if (st == FR_OK)
        st = rs;
    if (st != FR_OK)
        fr_fit_report_free(out);
    return st;
}

void fr_fit_report_free(fr_fit_report *r) {
    if (!r)
        return;
    free(r->rows);
    r->rows = NULL;
    r->n_rows = 0;
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

void fr_fit_print(const fr_fit_report *r, FILE *out) {
    static const fr_mem_tag tags[] = {FR_TAG_SAVED, FR_TAG_TRANSIENT, FR_TAG_WORKSPACE, FR_TAG_PARAM,
                                      FR_TAG_GRAD, FR_TAG_OPTIM, FR_TAG_DATA};
    enum { N_TAGS = sizeof tags / sizeof *tags };
    FR_STATIC_ASSERT((int)N_TAGS == (int)FR_TAG_COUNT, "the split shows every tag");
    char b[32];
    fprintf(out, "will it fit? budget %s, batch %lld of %lldx%lldx%lld (MiB, measured steps)\n",
            fr_mem_format_bytes(r->budget, b, sizeof b), (long long)r->shape[0], (long long)r->shape[1],
            (long long)r->shape[2], (long long)r->shape[3]);
    fprintf(out, "%-22s %7s %8s %8s   %8s", "strategy", "largest", "peak", "next", "need");
    for (int k = 0; k < N_TAGS; k++)
        fprintf(out, " %9.9s", fr_mem_tag_name(tags[k]));
    fprintf(out, "\n%-22s %7s %8s %8s   %8lld %s\n", "", "batch", "there", "batch", (long long)r->shape[0],
            "<- split of that step's peak by tag");
    for (int i = 0; i < r->n_rows; i++) {
        const fr_fit_row *w = &r->rows[i];
        fprintf(out, "%-22s", w->name);
        if (w->status != FR_OK) {
            fprintf(out, " refused: %.100s\n", w->error);
            continue;
        }
        if (w->batch)
            fprintf(out, " %7d %8.2f", w->batch, mib((double)w->peak));
        else
            fprintf(out, " %7s %8s", "none", "-");
        if (!w->next_measured)
            fprintf(out, " %8s", w->batch >= r->max_batch ? "max" : "-");
        else if (w->peak_next)
            fprintf(out, " %8.2f", mib((double)w->peak_next));
        else
            fprintf(out, " %8s", w->planned ? "no plan" : "oom");
        fprintf(out, " %s %8.2f", w->need_predicted ? "~" : " ", mib((double)w->need));
        for (int k = 0; k < N_TAGS && !w->planned; k++)
            fprintf(out, " %9.2f", mib((double)w->at_peak[tags[k]]));
        fprintf(out, "\n");
    }
    fprintf(out, "largest batch: the largest (up to %d) whose step's peak is within the budget; next: the\n"
            "peak of a step one image larger; need: the least budget for batch %lld (~ the planner's\n"
            "prediction, in one micro-batch). Every step holds the optimizer state.\n",
            r->max_batch, (long long)r->shape[0]);
    for (int i = 0; i < r->n_rows; i++)
        if (r->rows[i].planned && r->rows[i].status == FR_OK && !r->rows[i].batch && r->rows[i].error[0])
            fprintf(out, "planner: %s\n", r->rows[i].error);
}

/* ---- --batch auto: the largest batch the planner fits, from few plans ----
 *
 * A batch fits when fr_plan_memory finds a layout in one micro-batch whose
 * whole measured step holds the budget (planner.h, step 4): that step is
 * the measurement, no trial is run beside it. Each plan at a new batch
 * profiles the model there, which costs about as much as a few steps at
 * that batch, so the search asks for few: two small batches give the line
 * through the least each needs (the leanest layout's bytes); the guess
 * where it meets the budget is planned; from then on the line through
 * the two planned batches nearest the budget guesses again, until the
 * batch that fits and the one that does not are neighbours, or the line
 * through the largest that fits says one image more passes the budget. */
typedef struct {
    int b;
    bool fits;
    double need; /* the leanest layout's bytes at b (0: not known) */
    double peak; /* fits: the verified peak of its plan */
} planned_point;

static fr_status plan_point(fr_model *m, const int64_t *image, size_t budget, const fr_plan_options *po,
                            size_t extra_per_image, planned_point *p, fr_fit_batch_result *out) {
    fr_plan_options o = *po;
    o.max_accum = 1;
    o.extra_bytes += extra_per_image * (size_t)p->b;
    fr_memory_plan plan;
    fr_status st = fr_plan_memory(m, FR_SHAPE(p->b, image[1], image[2], image[3]), budget, &o, &plan);
    out->plans++;
    p->fits = st == FR_OK;
    p->need = st == FR_OK ? plan.leanest_peak : plan.min_budget;
    p->peak = st == FR_OK ? plan.verified_peak : 0;
    fr_memory_plan_free(&plan);
    if (st == FR_ERR_ARG || st == FR_ERR_OOM) { /* no layout, or none whose step holds */
        snprintf(out->why, sizeof out->why, "%s", fr_last_error());
        fr_clear_error();
        return FR_OK;
    }
    return st;
}

/* Where the line through p and q (their `need`) meets the budget, or 0. */
static int meets(const planned_point *p, const planned_point *q, size_t budget, double *per) {
    if (!p || !q || p->b == q->b || p->need <= 0 || q->need <= 0 || (q->need - p->need) * (q->b - p->b) <= 0)
        return 0;
    *per = (q->need - p->need) / (double)(q->b - p->b);
    double g = (double)p->b + ((double)budget - p->need) / *per;
    return g < 1 ? 1 : g > 1e9 ? 1000000000 : (int)g;
}

fr_status fr_fit_batch(fr_model *m, const int64_t *image, size_t budget, const fr_plan_options *po,
                       size_t extra_per_image, int max_batch, fr_fit_batch_result *out) {
    *out = (fr_fit_batch_result){0};
    if (!m || !image || !po || max_batch < 1 || !budget)
        return fr_error(FR_ERR_ARG, "fr_fit_batch: a model, an image shape, plan options, a budget and "
                        "max_batch >= 1 are needed");
    enum { MAX_PLANS = 10 };
    planned_point pts[MAX_PLANS + 2];
    int np = 0;
    const planned_point *lo = NULL, *hi = NULL, *near = NULL;
    double per = 0;
    bool by_line = false;
    for (int probe = max_batch < 8 ? max_batch : 8;; probe = 0) {
        int g = probe;
        if (!g) {
            /* the two points nearest the budget: the ends of the bracket, or
             * the last two planned */
            lo = hi = NULL;
            for (int i = 0; i < np; i++) {
                if (pts[i].fits && (!lo || pts[i].b > lo->b))
                    lo = &pts[i];
                if (!pts[i].fits && (!hi || pts[i].b < hi->b))
                    hi = &pts[i];
            }
            int a = lo ? lo->b : 0, z = hi ? hi->b : max_batch + 1;
            if (z - a <= 1 || np >= MAX_PLANS)
                break;
            near = NULL; /* the point nearest lo, for the line through lo */
            for (int i = 0; lo && i < np; i++)
                if (&pts[i] != lo && pts[i].need > 0 && (!near || abs(pts[i].b - a) < abs(near->b - a)))
                    near = &pts[i];
            g = lo && hi ? meets(lo, hi, budget, &per) : lo ? meets(near, lo, budget, &per)
                                                             : np >= 2 ? meets(&pts[np - 2], &pts[np - 1], budget, &per) : 0;
            /* the line through the largest that fits puts the next one over
             * the budget: that is the answer, by the measured line */
            if ((by_line = lo && g == a && per > 0 && lo->need + per > (double)budget))
                break;
            if (g <= a || g >= z)
                g = g <= a ? a + 1 : z - 1;
            if (!lo && !g)
                g = z / 2 > 0 ? z / 2 : 1;
            if (lo && !hi && np < 2)
                g = 2 * a < z ? 2 * a : z - 1;
        }
        planned_point *p = &pts[np++];
        *p = (planned_point){.b = g};
        FR_TRY(plan_point(m, image, budget, po, extra_per_image, p, out));
    }
    if (lo) {
        out->batch = lo->b;
        out->peak = lo->peak;
    }
    if (by_line) {
        out->next = lo->b + 1;
        out->next_need = lo->need + per;
        out->next_estimated = true;
    } else if (hi) {
        out->next = hi->b;
        out->next_need = hi->need;
    }
    return FR_OK;
}
