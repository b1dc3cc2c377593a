/* state.c: training checkpoints; see state.h.
 *
 * Loading is two passes over the file: every check (metadata, model
 * tensors, optimizer tensors) and every allocation first, then the copies,
 * so the only way a load can fail after it has started changing the model is
 * a failing copy into memory already checked and allocated. */
#include "state.h"
#include "state_impl.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writing ---- */

static fr_status put_str(fr_st_writer *w, const char *key, const char *value) {
    return fr_st_writer_add_metadata(w, key, value);
}

static fr_status put_int(fr_st_writer *w, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return put_str(w, key, buf);
}

/* 17 significant digits: strtod gives back the same double. */
static fr_status put_double(fr_st_writer *w, const char *key, double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    return put_str(w, key, buf);
}

static fr_status put_schedule(fr_st_writer *w, const fr_schedule *s) {
    FR_ASSERT((unsigned)s->kind < FR_SCHED_KIND_COUNT);
    char list[FR_SCHED_MAX_MILESTONES * 21 + 1] = "";
    size_t used = 0;
    for (int i = 0; i < s->n_milestones; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, i ? ",%" PRId64 : "%" PRId64,
                                 s->milestones[i]);
    FR_TRY(put_str(w, "schedule", sched_kind_names[s->kind]));
    FR_TRY(put_double(w, "schedule.base_lr", s->base_lr));
    FR_TRY(put_str(w, "schedule.milestones", list));
    FR_TRY(put_double(w, "schedule.gamma", s->gamma));
    FR_TRY(put_int(w, "schedule.total_steps", s->total_steps));
    FR_TRY(put_double(w, "schedule.eta_min", s->eta_min));
    FR_TRY(put_int(w, "schedule.warmup_steps", s->warmup_steps));
    return put_double(w, "schedule.warmup_start_factor", s->warmup_start_factor);
}

static fr_status put_optim(fr_st_writer *w, const fr_optim *opt) {
    FR_TRY(put_str(w, "optimizer", optim_kind_names[opt->kind]));
    if (opt->kind == FR_OPTIM_SGD) {
        FR_TRY(put_double(w, "optimizer.lr", opt->sgd.lr));
        FR_TRY(put_double(w, "optimizer.momentum", opt->sgd.momentum));
        FR_TRY(put_double(w, "optimizer.dampening", opt->sgd.dampening));
        FR_TRY(put_double(w, "optimizer.weight_decay", opt->sgd.weight_decay));
        return put_int(w, "optimizer.nesterov", opt->sgd.nesterov);
    }
    FR_TRY(put_double(w, "optimizer.lr", opt->adam.lr));
    FR_TRY(put_double(w, "optimizer.beta1", opt->adam.beta1));
    FR_TRY(put_double(w, "optimizer.beta2", opt->adam.beta2));
    FR_TRY(put_double(w, "optimizer.eps", opt->adam.eps));
    return put_double(w, "optimizer.weight_decay", opt->adam.weight_decay);
}

/* Adds the optimizer's tensors; the step counts are made here and handed
 * to the writer, which keeps them until it is freed. */
static fr_status add_optim_tensors(fr_st_writer *w, const fr_optim *opt) {
    char name[FR_NAME_MAX + 64];
    for (int i = 0; i < opt->n; i++) {
        const fr_param *e = &opt->params->items[i];
        if (e->kind != FR_PARAMETER)
            continue;
        for (int slot = 0; slot < 2; slot++) {
            const char *sname = fr_optim_state_name(opt, slot);
            if (!sname || !opt->state[slot][i])
                continue;
            snprintf(name, sizeof name, OPTIM_PREFIX "%s.%s", sname, e->name);
            FR_TRY(fr_st_writer_add(w, name, opt->state[slot][i]));
        }
        if (opt->steps[i] > INT32_MAX)
            return fr_error(FR_ERR_ARG, "checkpoint: parameter %s has %" PRId64 " optimizer steps, "
                            "more than an i32 holds", e->name, opt->steps[i]);
        int32_t count = (int32_t)opt->steps[i];
        fr_tensor *t = fr_from_host(FR_CPU, FR_I32, 0, FR_SHAPE(1), FR_TAG_WORKSPACE, &count);
        if (!t)
            return fr_last_status();
        snprintf(name, sizeof name, OPTIM_PREFIX STEP_SLOT ".%s", e->name);
        fr_status st = fr_st_writer_add(w, name, t);
        fr_release(t);
        FR_TRY(st);
    }
    return FR_OK;
}

/* The precision and, with a scaler, its state. The scale is an f32 whose
 * exact value a double holds: 17 digits give it back bit for bit. */
static fr_status put_amp(fr_st_writer *w, const fr_model *m, const fr_loss_scaler *scaler) {
    fr_dtype p = m->cfg.precision;
    if (!fr_dtype_is_float(p))
        return fr_error(FR_ERR_ARG, "checkpoint: model %s has precision %s, expected f32, f16 or bf16",
                        m->name, fr_dtype_name(p));
    FR_TRY(put_str(w, AMP_PRECISION, fr_dtype_name(p)));
    if (!scaler)
        return FR_OK;
    if (scaler->dtype != p)
        return fr_error(FR_ERR_ARG, "checkpoint: the loss scaler is for %s, model %s trains in %s",
                        fr_dtype_name(scaler->dtype), m->name, fr_dtype_name(p));
    fr_loss_scaler_state ss = fr_loss_scaler_get_state(scaler);
    FR_TRY(put_double(w, AMP_SCALE, (double)ss.scale));
    FR_TRY(put_int(w, AMP_TRACKER, ss.growth_tracker));
    return put_int(w, AMP_SKIPPED, ss.skipped);
}

static fr_status fill_writer(fr_st_writer *w, const fr_model *m, const fr_optim *opt,
                             const fr_loss_scaler *scaler, const fr_train_state *st) {
    char buf[64];
    FR_TRY(put_str(w, "format", FR_STATE_FORMAT));
    FR_TRY(put_int(w, "format_version", FR_STATE_VERSION));
    FR_TRY(put_str(w, "model", m->name));
    FR_TRY(put_int(w, "in_channels", m->in_channels));
    FR_TRY(put_int(w, "num_classes", m->num_classes));
    FR_TRY(put_str(w, "strategy", fr_strategy_format(m->cfg.strategy, buf, sizeof buf)));
    FR_TRY(put_amp(w, m, scaler));
    FR_TRY(fr_params_write(m->params, w, NULL));
    if (opt) {
        if (opt->params != m->params)
            return fr_error(FR_ERR_ARG, "checkpoint: the optimizer does not belong to model %s", m->name);
        FR_TRY(put_optim(w, opt));
        FR_TRY(add_optim_tensors(w, opt));
    } else {
        FR_TRY(put_str(w, "optimizer", "none"));
    }
    if (!st)
        return FR_OK;
    FR_TRY(put_str(w, "training", "1"));
    FR_TRY(put_int(w, "epoch", st->epoch));
    FR_TRY(put_int(w, "batch", st->batch));
    FR_TRY(put_int(w, "step", st->step));
    snprintf(buf, sizeof buf, "%" PRIu64, st->seed);
    FR_TRY(put_str(w, "seed", buf));
    FR_TRY(put_int(w, "batch_size", st->batch_size));
    FR_TRY(put_int(w, "accum", st->accum));
    FR_TRY(put_int(w, "epochs", st->epochs));
    FR_TRY(put_int(w, "augment", st->augment));
    FR_TRY(put_int(w, "limit_train", st->limit_train));
    FR_TRY(put_str(w, "data", st->data));
    if (st->world_size > 1) {
        FR_TRY(put_int(w, "dist.world_size", st->world_size));
        FR_TRY(put_int(w, "dist.sync_bn", st->sync_bn));
    }
    if (st->has_random) {
        snprintf(buf, sizeof buf, "%" PRIu64, st->random_state);
        FR_TRY(put_str(w, "random.dropout", buf));
        snprintf(buf, sizeof buf, "%" PRIu64, st->compress_random_state);
        FR_TRY(put_str(w, "random.compress", buf));
    }
    return put_schedule(w, &st->schedule);
}

/* Whether every value of a float tensor is finite; the error names it. */
static fr_status check_finite(const char *path, const char *what, const char *name, const fr_tensor *t) {
    if (!t || t->dtype != FR_F32)
        return FR_OK;
    size_t n = (size_t)fr_numel(t);
    float *host = malloc((n ? n : 1) * sizeof *host);
    if (!host)
        return fr_error(FR_ERR_OOM, "checkpoint save %s: out of memory checking %s", path, name);
    fr_status st = fr_read_f32(t, host, n);
    size_t i = 0;
    while (st == FR_OK && i < n && isfinite(host[i]))
        i++;
    if (st == FR_OK && i < n)
        st = fr_error(FR_ERR_ARG, "checkpoint save %s: %s %s holds %s at element %zu: refusing to replace "
                      "the file with non-finite weights (it is left as it was)", path, what, name,
                      isnan(host[i]) ? "NaN" : "inf", i);
    free(host);
    return st;
}

/* A run that has diverged must not overwrite the last good checkpoint. */
static fr_status check_all_finite(const char *path, const fr_model *m, const fr_optim *opt) {
    for (int i = 0; i < m->params->count; i++)
        FR_TRY(check_finite(path, "tensor", m->params->items[i].name, m->params->items[i].tensor));
    for (int i = 0; opt && i < opt->n; i++)
        for (int slot = 0; slot < 2; slot++)
            FR_TRY(check_finite(path, "optimizer state of", opt->params->items[i].name,
                                opt->state[slot][i]));
    return FR_OK;
}

fr_status fr_state_save(const char *path, const fr_model *m, const fr_optim *opt,
                       const fr_loss_scaler *scaler, const fr_train_state *st) {
    if (!path || !m)
        return fr_error(FR_ERR_ARG, "checkpoint save: path or model is NULL");
    FR_TRY(check_all_finite(path, m, opt));
    fr_st_writer *w = fr_st_writer_new();
    if (!w)
        return fr_last_status();
    fr_status s = fill_writer(w, m, opt, scaler, st);
    if (s != FR_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", fr_last_error());
        fr_st_writer_free(w);
        return fr_error(s, "checkpoint save %s: %s", path, why);
    }
    s = fr_st_writer_save(w, path);
    fr_st_writer_free(w);
    return s;
}

/* ---- loading ---- */

static bool shape_is(const fr_st_file *f, int j, const fr_tensor *t) {
    if (fr_st_ndim(f, j) != t->ndim)
        return false;
    for (int d = 0; d < t->ndim; d++)
        if (fr_st_shape(f, j)[d] != t->shape[d])
            return false;
    return true;
}

static char *file_shape(const fr_st_file *f, int j, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < fr_st_ndim(f, j) && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, d ? ", %" PRId64 : "%" PRId64,
                                 fr_st_shape(f, j)[d]);
    if (used < len)
        snprintf(buf + used, len - used, fr_st_ndim(f, j) == 1 ? ",)" : ")");
    return buf;
}

/* The file's entry `name` must exist with `like`'s shape and `dtype`. */
static fr_status check_entry(const fr_st_file *f, const char *path, const char *name, const fr_tensor *like,
                             fr_dtype dtype, int ndim) {
    char a[96], b[96];
    int j = fr_st_find(f, name);
    if (j < 0)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: tensor %s is missing", path, name);
    if (dtype == FR_I32 && fr_st_is_i64(f, j))
        FR_TRY(fr_st_check_i64_fits_i32(f, j)); /* PyTorch's int64 counters */
    else if (fr_st_dtype(f, j) != dtype)
        return fr_error(FR_ERR_DTYPE, "checkpoint %s: tensor %s has dtype %s, expected %s", path, name,
                        fr_st_dtype(f, j) == FR_DTYPE_COUNT ? "(one frugal cannot hold)"
                                                            : fr_dtype_name(fr_st_dtype(f, j)),
                        fr_dtype_name(dtype));
    if (like ? !shape_is(f, j, like) : fr_st_ndim(f, j) != ndim)
        return fr_error(FR_ERR_SHAPE, "checkpoint %s: tensor %s has shape %s, expected %s", path, name,
                        file_shape(f, j, a, sizeof a),
                        like ? fr_shape_str(like, b, sizeof b) : "() (a 0-d counter)");
    return FR_OK;
}

static fr_status check_model(const fr_st_file *f, const char *path, const fr_model *m,
                             const fr_state_info *info) {
    if (info->is_training || info->model[0]) {
        if (strcmp(info->model, m->name))
            return fr_error(FR_ERR_FORMAT, "checkpoint %s holds model %s, not %s", path, info->model,
                            m->name);
        if (info->in_channels != m->in_channels || info->num_classes != m->num_classes)
            return fr_error(FR_ERR_SHAPE, "checkpoint %s holds %s for %d input channels and %d classes, "
                            "the model has %d and %d", path, info->model, info->in_channels,
                            info->num_classes, m->in_channels, m->num_classes);
    }
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *e = &m->params->items[i];
        FR_TRY(check_entry(f, path, e->name, e->tensor, e->tensor->dtype, 0));
    }
    for (int j = 0; j < fr_st_count(f); j++) {
        const char *name = fr_st_name(f, j);
        if (strncmp(name, OPTIM_PREFIX, strlen(OPTIM_PREFIX)) && fr_params_find(m->params, name) < 0)
            return fr_error(FR_ERR_FORMAT, "checkpoint %s: tensor %s is not in model %s", path, name,
                            m->name);
    }
    /* the values last: they read the data, the checks above only the header */
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *e = &m->params->items[i];
        FR_TRY(fr_params_check_stats(e, f, path, e->name, "checkpoint"));
    }
    /* Every tensor's checksum, the optimizer's too when this load does not
     * read them (validate): a damaged file is refused the first time it is
     * read, not on the resume that needs the damaged part. */
    for (int j = 0; j < fr_st_count(f); j++)
        FR_TRY(fr_st_verify(f, fr_st_name(f, j)));
    return FR_OK;
}

/* Whether `name` is "optim.<slot>.<a parameter of opt>" for a slot opt keeps. */
static bool known_optim_name(const fr_optim *opt, const char *name) {
    const char *rest = name + strlen(OPTIM_PREFIX);
    for (int slot = -1; slot < 2; slot++) {
        const char *sname = slot < 0 ? STEP_SLOT : fr_optim_state_name(opt, slot);
        size_t n = sname ? strlen(sname) : 0;
        if (sname && !strncmp(rest, sname, n) && rest[n] == '.') {
            int i = fr_params_find(opt->params, rest + n + 1);
            return i >= 0 && opt->params->items[i].kind == FR_PARAMETER;
        }
    }
    return false;
}

/* The values of a file's tensor `name` (f32 or i32) before any is used:
 * finite, and >= 0 where `nonneg` (Adam's second moment, a step count), so
 * a resumed run cannot start from state no step produces (an infinite
 * momentum buffer, a negative step). The error names the tensor and the
 * first bad element. */
static fr_status check_values(const fr_st_file *f, const char *path, const char *name, bool nonneg) {
    fr_tensor *t = fr_st_get(f, name, FR_CPU, FR_TAG_WORKSPACE);
    if (!t)
        return fr_last_status();
    int64_t n = fr_numel(t), i = 0;
    bool i32 = t->dtype == FR_I32;
    const float *x = i32 ? NULL : fr_data_f32(t);
    const int32_t *k = i32 ? (const int32_t *)fr_data(t) : NULL;
    for (; i < n; i++)
        if (i32 ? k[i] < 0 || k[i] == INT32_MAX : !isfinite(x[i]) || (nonneg && x[i] < 0))
            break;
    fr_status st = FR_OK;
    if (i < n && i32)
        st = fr_error(FR_ERR_FORMAT, "checkpoint %s: tensor %s holds %d at element %lld, expected a step "
                      "count in [0, %d)", path, name, (int)k[i], (long long)i, INT32_MAX);
    else if (i < n)
        st = fr_error(FR_ERR_FORMAT, "checkpoint %s: tensor %s holds %g at element %lld, expected a finite "
                      "number%s: optimizer state no step produces", path, name, (double)x[i], (long long)i,
                      nonneg ? " >= 0" : "");
    fr_release(t);
    return st;
}

static fr_status check_optim(const fr_st_file *f, const char *path, const fr_optim *opt,
                             const fr_state_info *info) {
    char name[FR_NAME_MAX + 64];
    if (!info->has_optim)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s holds no optimizer state", path);
    if (info->optim_kind != opt->kind)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s holds %s state, the optimizer is %s", path,
                        optim_kind_names[info->optim_kind], optim_kind_names[opt->kind]);
    if (opt->params->count != opt->n)
        return fr_error(FR_ERR_ARG, "checkpoint load %s: the registry grew after the optimizer was made",
                        path);
    for (int i = 0; i < opt->n; i++) {
        const fr_param *e = &opt->params->items[i];
        if (e->kind != FR_PARAMETER)
            continue;
        snprintf(name, sizeof name, OPTIM_PREFIX STEP_SLOT ".%s", e->name);
        FR_TRY(check_entry(f, path, name, NULL, FR_I32, 0));
        FR_TRY(check_values(f, path, name, true));
        for (int slot = 0; slot < 2; slot++) {
            const char *sname = fr_optim_state_name(opt, slot);
            if (!sname)
                continue;
            snprintf(name, sizeof name, OPTIM_PREFIX "%s.%s", sname, e->name);
            if (fr_st_find(f, name) >= 0) {
                FR_TRY(check_entry(f, path, name, e->tensor, FR_F32, 0));
                FR_TRY(check_values(f, path, name, slot == 1));
            }
        }
    }
    for (int j = 0; j < fr_st_count(f); j++) {
        const char *fname = fr_st_name(f, j);
        if (!strncmp(fname, OPTIM_PREFIX, strlen(OPTIM_PREFIX)) && !known_optim_name(opt, fname))
            return fr_error(FR_ERR_FORMAT, "checkpoint %s: tensor %s is not state of this %s optimizer",
                            path, fname, optim_kind_names[opt->kind]);
    }
    return FR_OK;
}

/* Second pass for the optimizer: state tensors the file has and the
 * optimizer lacks are allocated before anything is copied; state the file
 * lacks is dropped (that parameter had not been updated yet). */
static fr_status load_optim(const fr_st_file *f, const char *path, fr_optim *opt) {
    char name[FR_NAME_MAX + 64];
    int n = opt->n;
    fr_tensor **fresh = calloc((size_t)(2 * n + 1), sizeof *fresh);
    if (!fresh)
        return fr_error(FR_ERR_OOM, "checkpoint load %s: out of memory", path);
    fr_status st = FR_OK;
    for (int i = 0; i < n && st == FR_OK; i++)
        for (int slot = 0; slot < 2 && st == FR_OK; slot++) {
            const char *sname = fr_optim_state_name(opt, slot);
            const fr_param *e = &opt->params->items[i];
            if (!sname || e->kind != FR_PARAMETER || opt->state[slot][i])
                continue;
            snprintf(name, sizeof name, OPTIM_PREFIX "%s.%s", sname, e->name);
            if (fr_st_find(f, name) >= 0 && !(fresh[2 * i + slot] = fr_zeros_like(e->tensor, FR_TAG_OPTIM)))
                st = fr_last_status();
        }
    if (st != FR_OK) {
        for (int k = 0; k < 2 * n; k++)
            fr_release(fresh[k]);
        free(fresh);
        return st;
    }
    for (int i = 0; i < n; i++) {
        const fr_param *e = &opt->params->items[i];
        if (e->kind != FR_PARAMETER)
            continue;
        for (int slot = 0; slot < 2; slot++) {
            const char *sname = fr_optim_state_name(opt, slot);
            if (!sname)
                continue;
            if (fresh[2 * i + slot])
                opt->state[slot][i] = fresh[2 * i + slot];
            snprintf(name, sizeof name, OPTIM_PREFIX "%s.%s", sname, e->name);
            if (fr_st_find(f, name) < 0)
                fr_clear(&opt->state[slot][i]);
            else if (st == FR_OK)
                st = fr_st_read_into(f, name, opt->state[slot][i]);
        }
        snprintf(name, sizeof name, OPTIM_PREFIX STEP_SLOT ".%s", e->name);
        fr_tensor *t = fr_st_get(f, name, FR_CPU, FR_TAG_WORKSPACE);
        if (t)
            opt->steps[i] = *(const int32_t *)fr_data(t);
        else if (st == FR_OK)
            st = fr_last_status();
        fr_release(t);
    }
    free(fresh);
    return st;
}

/* The precision checks of a load, and the scaler as it will be after it
 * (set_state tried on a copy, so a refused state changes nothing). */
static fr_status check_amp(const fr_st_file *f, const char *path, const fr_model *m,
                           const fr_loss_scaler *scaler, const fr_train_state *state,
                           const fr_state_info *info, fr_loss_scaler *after) {
    const char *trained = fr_dtype_name(info->state.precision);
    const char *why = fr_st_metadata(f, AMP_PRECISION) ? "" : " (it records no " AMP_PRECISION ")";
    if (state && m->cfg.precision != info->state.precision)
        return fr_error(FR_ERR_ARG, "checkpoint %s was trained in %s%s, the model's precision is %s", path,
                        trained, why, fr_dtype_name(m->cfg.precision));
    if (!scaler)
        return FR_OK;
    if (scaler->dtype != info->state.precision)
        return fr_error(FR_ERR_ARG, "checkpoint %s was trained in %s%s, the loss scaler is for %s", path,
                        trained, why, fr_dtype_name(scaler->dtype));
    *after = *scaler;
    if (info->state.has_scaler && fr_loss_scaler_set_state(after, info->state.scaler) != FR_OK) {
        char cause[256];
        snprintf(cause, sizeof cause, "%s", fr_last_error());
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata fields amp.*: %s", path, cause);
    }
    return FR_OK;
}

fr_status fr_state_load(const char *path, fr_model *m, fr_optim *opt, fr_loss_scaler *scaler,
                       fr_train_state *state) {
    if (!path || !m)
        return fr_error(FR_ERR_ARG, "checkpoint load: path or model is NULL");
    if (opt && opt->params != m->params)
        return fr_error(FR_ERR_ARG, "checkpoint load %s: the optimizer does not belong to model %s", path,
                        m->name);
    fr_st_file *f = fr_st_open(path);
    if (!f)
        return fr_last_status();
    fr_state_info info;
    fr_status st = fr_state_read_info_from(f, path, &info);
    if (st == FR_OK)
        st = check_model(f, path, m, &info);
    if (st == FR_OK && opt)
        st = check_optim(f, path, opt, &info);
    if (st == FR_OK && state && !info.is_training)
        st = fr_error(FR_ERR_FORMAT, "checkpoint %s is a weights file, not a training checkpoint "
                      "(no position or schedule)", path);
    fr_loss_scaler restored = {0};
    if (st == FR_OK)
        st = check_amp(f, path, m, scaler, state, &info, &restored);
    for (int i = 0; st == FR_OK && i < m->params->count; i++)
        st = fr_st_read_into(f, m->params->items[i].name, m->params->items[i].tensor);
    if (st == FR_OK && opt)
        st = load_optim(f, path, opt);
    if (st == FR_OK && scaler)
        *scaler = restored;
    if (st == FR_OK && state)
        *state = info.state;
    fr_st_close(f);
    return st;
}
