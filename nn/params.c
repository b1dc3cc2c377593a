/* params.c: the parameter registry; see params.h. */
#include "params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../autograd/autograd.h"
#include "../tensor/ops.h"

fr_params *fr_params_new(void) {
    fr_params *p = calloc(1, sizeof *p);
    if (!p)
        fr_error(FR_ERR_OOM, "params: out of memory");
    return p;
}

void fr_params_free(fr_params *p) {
    if (!p)
        return;
    for (int i = 0; i < p->count; i++) {
        if (p->items[i].tensor->name == p->items[i].name)
            p->items[i].tensor->name = NULL;
        free(p->items[i].name);
        fr_release(p->items[i].tensor);
    }
    free(p->items);
    free(p);
}

int fr_params_find(const fr_params *p, const char *name) {
    for (int i = 0; i < p->count; i++)
        if (!strcmp(p->items[i].name, name))
            return i;
    return -1;
}

fr_tensor *fr_params_get(const fr_params *p, const char *name) {
    int i = fr_params_find(p, name);
    return i < 0 ? NULL : p->items[i].tensor;
}

fr_status fr_params_add(fr_params *p, const char *name, fr_tensor *t, fr_param_kind kind) {
    if (!p || !name || !*name)
        return fr_error(FR_ERR_ARG, "params: add needs a registry and a non-empty name");
    FR_TRY(fr_check_defined("params", name, t));
    if ((unsigned)kind >= FR_PARAM_KIND_COUNT)
        return fr_error(FR_ERR_ARG, "params: %s: unknown kind %d", name, (int)kind);
    if (fr_params_find(p, name) >= 0)
        return fr_error(FR_ERR_ARG, "params: the name %s is registered twice", name);
    if (kind == FR_PARAMETER && t->dtype != FR_F32)
        return fr_error(FR_ERR_DTYPE, "params: parameter %s has dtype %s; parameters are f32", name,
                        fr_dtype_name(t->dtype));
    if (p->count == p->cap) {
        int cap = p->cap ? p->cap * 2 : 64;
        fr_param *grown = realloc(p->items, (size_t)cap * sizeof *grown);
        if (!grown)
            return fr_error(FR_ERR_OOM, "params: out of memory registering %s", name);
        p->items = grown;
        p->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy)
        return fr_error(FR_ERR_OOM, "params: out of memory registering %s", name);
    if (kind == FR_PARAMETER)
        fr_set_requires_grad(t, true);
    /* errors about the tensor can name it (fn_checkpoint.c's version
     * check); cleared when the registry goes, which owns the name */
    if (!t->name)
        t->name = copy;
    p->items[p->count++] = (fr_param){.name = copy, .tensor = fr_retain(t), .kind = kind};
    return FR_OK;
}

fr_tensor *fr_params_new_tensor(fr_params *p, const char *name, fr_param_kind kind, fr_dtype dtype,
                                int ndim, const int64_t *shape) {
    fr_tensor *t = fr_zeros(FR_CPU, dtype, ndim, shape, FR_TAG_PARAM);
    if (!t)
        return NULL;
    fr_status st = fr_params_add(p, name, t, kind);
    fr_release(t); /* the registry's reference keeps it alive */
    return st == FR_OK ? t : NULL;
}

int64_t fr_params_count(const fr_params *p) {
    int64_t n = 0;
    for (int i = 0; i < p->count; i++)
        if (p->items[i].kind == FR_PARAMETER)
            n += fr_numel(p->items[i].tensor);
    return n;
}

size_t fr_params_bytes(const fr_params *p) {
    size_t n = 0;
    for (int i = 0; i < p->count; i++)
        n += fr_nbytes(p->items[i].tensor);
    return n;
}

fr_status fr_params_find_nonfinite(const fr_params *p, int *index) {
    *index = -1;
    fr_status st = FR_OK;
    for (int i = 0; p && i < p->count && st == FR_OK && *index < 0; i++) {
        fr_tensor *t = p->items[i].tensor;
        if (t->dtype != FR_F32)
            continue;
        fr_tensor *c = fr_is_contiguous(t) ? fr_retain(t) : fr_contiguous(t, FR_TAG_WORKSPACE);
        fr_tensor *count = c ? fr_zeros(fr_device_of(t), FR_F32, 1, FR_SHAPE(1), FR_TAG_WORKSPACE) : NULL;
        st = count ? fr_nonfinite_count_(count, c) : fr_last_status();
        if (st == FR_OK && fr_item(count) > 0)
            *index = i;
        fr_release(count);
        fr_release(c);
    }
    return st;
}

void fr_params_zero_grad(fr_params *p) {
    for (int i = 0; i < p->count; i++)
        fr_zero_grad(p->items[i].tensor);
}

/* Counters the host bumps stay on the CPU (see params.h). */
static bool stays_on_host(const fr_param *e) { return e->tensor->dtype == FR_I32; }

fr_status fr_params_to_device(fr_params *p, fr_device dev) {
    for (int i = 0; i < p->count; i++) {
        fr_tensor *t = p->items[i].tensor;
        fr_zero_grad(t);
        if (fr_device_of(t) == dev || stays_on_host(&p->items[i]))
            continue;
        fr_tensor *moved = fr_to_device(t, dev, FR_TAG_PARAM);
        if (!moved)
            return fr_last_status();
        /* Swap the bytes behind the two tensor objects rather than the
         * objects: layers hold pointers to `t`, which must stay valid. Each
         * object keeps its own refcount and autograd flags. */
        fr_storage *old_storage = t->storage;
        size_t old_offset = t->offset;
        t->storage = moved->storage;
        t->offset = moved->offset;
        moved->storage = old_storage;
        moved->offset = old_offset;
        /* Both are contiguous with the same shape, so shape and strides
         * already agree. */
        fr_release(moved);
    }
    return FR_OK;
}

char *fr_name_join(char *buf, size_t len, const char *prefix, const char *name) {
    int n = prefix && *prefix ? snprintf(buf, len, "%s.%s", prefix, name) : snprintf(buf, len, "%s", name);
    FR_ASSERT(n >= 0 && (size_t)n < len);
    return buf;
}

fr_status fr_params_write(const fr_params *p, fr_st_writer *w, const char *prefix) {
    char name[FR_NAME_MAX];
    for (int i = 0; i < p->count; i++) {
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", p->items[i].name);
        FR_TRY(fr_st_writer_add(w, name, p->items[i].tensor));
    }
    return FR_OK;
}

fr_status fr_params_save(const fr_params *p, const char *path) {
    fr_st_writer *w = fr_st_writer_new();
    if (!w)
        return fr_last_status();
    fr_status st = fr_params_write(p, w, NULL);
    if (st == FR_OK)
        st = fr_st_writer_save(w, path);
    fr_st_writer_free(w);
    return st;
}

/* Appends ", name" to a bounded list of names for an error message. */
static void list_name(char *list, size_t len, int *listed, const char *name) {
    size_t used = strlen(list);
    if (*listed == 4) {
        snprintf(list + used, len - used, ", ...");
    } else if (*listed < 4) {
        snprintf(list + used, len - used, "%s%s", *listed ? ", " : "", name);
    }
    (*listed)++;
}

static bool same_shape(const fr_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim)
        return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d])
            return false;
    return true;
}

static char *shape_text(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < len)
        snprintf(buf + used, len - used, ndim == 1 ? ",)" : ")");
    return buf;
}

/* Every check before any copy, so a failed load leaves the model as it was. */
static fr_status check_file(const fr_params *p, const fr_st_file *f, const char *path,
                            const char *prefix) {
    char name[FR_NAME_MAX], missing[512] = "", unexpected[512] = "", a[96], b[96];
    int n_missing = 0, n_unexpected = 0;
    size_t plen = prefix ? strlen(prefix) : 0;
    for (int i = 0; i < p->count; i++) {
        const fr_param *e = &p->items[i];
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", e->name);
        int j = fr_st_find(f, name);
        if (j < 0) {
            list_name(missing, sizeof missing, &n_missing, name);
            continue;
        }
        fr_dtype dt = fr_st_dtype(f, j);
        if (fr_st_is_i64(f, j) && e->tensor->dtype == FR_I32)
            FR_TRY(fr_st_check_i64_fits_i32(f, j)); /* PyTorch's int64 counters */
        else if (dt != e->tensor->dtype)
            return fr_error(FR_ERR_DTYPE, "load %s: tensor %s has dtype %s in the file, the model expects %s",
                            path, name, dt == FR_DTYPE_COUNT ? "(one frugal cannot hold, e.g. i64)"
                                                             : fr_dtype_name(dt),
                            fr_dtype_name(e->tensor->dtype));
        if (!same_shape(e->tensor, fr_st_ndim(f, j), fr_st_shape(f, j)))
            return fr_error(FR_ERR_SHAPE, "load %s: tensor %s has shape %s in the file, the model expects %s",
                            path, name, shape_text(a, sizeof a, fr_st_ndim(f, j), fr_st_shape(f, j)),
                            fr_shape_str(e->tensor, b, sizeof b));
    }
    for (int j = 0; j < fr_st_count(f); j++) {
        const char *fname = fr_st_name(f, j);
        if (plen && strncmp(fname, prefix, plen))
            continue;
        if (fr_params_find(p, fname + plen) < 0)
            list_name(unexpected, sizeof unexpected, &n_unexpected, fname);
    }
    if (n_missing || n_unexpected)
        return fr_error(FR_ERR_FORMAT,
                        "load %s: tensors missing from the file: %d [%s]; unexpected (not in the "
                        "model): %d [%s]",
                        path, n_missing, missing, n_unexpected, unexpected);
    return FR_OK;
}

/* Which BatchNorm statistic a name is, by its last component. */
typedef enum { STAT_NONE, STAT_MEAN, STAT_VAR, STAT_COUNT } stat_kind;

static stat_kind stat_of(const char *name) {
    const char *dot = strrchr(name, '.'), *last = dot ? dot + 1 : name;
    return !strcmp(last, "running_mean")          ? STAT_MEAN
           : !strcmp(last, "running_var")         ? STAT_VAR
           : !strcmp(last, "num_batches_tracked") ? STAT_COUNT
                                                  : STAT_NONE;
}

fr_status fr_params_check_stats(const fr_param *e, const fr_st_file *f, const char *path, const char *name,
                                const char *op) {
    stat_kind kind = e->kind == FR_BUFFER ? stat_of(e->name) : STAT_NONE;
    if (kind == STAT_NONE || e->tensor->dtype != (kind == STAT_COUNT ? FR_I32 : FR_F32))
        return FR_OK;
    /* a CPU copy of the model's dtype: PyTorch's int64 counter reads into it too */
    fr_tensor *t = fr_empty(FR_CPU, e->tensor->dtype, e->tensor->ndim, e->tensor->shape, FR_TAG_WORKSPACE);
    fr_status st = t ? fr_st_read_into(f, name, t) : fr_last_status();
    int64_t n = st == FR_OK ? fr_numel(t) : 0, i = 0;
    const float *x = kind == STAT_COUNT || !t ? NULL : fr_data_f32(t);
    const int32_t *k = kind == STAT_COUNT && t ? (const int32_t *)fr_data(t) : NULL;
    while (i < n && (k ? k[i] >= 0 : isfinite(x[i]) && (kind == STAT_MEAN || x[i] >= 0)))
        i++;
    if (i < n && k)
        st = fr_error(FR_ERR_FORMAT, "%s %s: tensor %s holds %d, expected a count of batches >= 0", op, path,
                      name, (int)k[i]);
    else if (i < n)
        st = fr_error(FR_ERR_FORMAT, "%s %s: tensor %s holds %g at element %lld, expected a finite number%s: "
                      "BatchNorm statistics no training produces", op, path, name, (double)x[i], (long long)i,
                      kind == STAT_VAR ? " >= 0 (a variance)" : "");
    fr_release(t);
    return st;
}

fr_status fr_params_read(fr_params *p, const fr_st_file *f, const char *path, const char *prefix) {
    char name[FR_NAME_MAX];
    FR_TRY(check_file(p, f, path, prefix));
    /* the values last: they read the data, the checks above only the header */
    for (int i = 0; i < p->count; i++) {
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", p->items[i].name);
        FR_TRY(fr_params_check_stats(&p->items[i], f, path, name, "load"));
        FR_TRY(fr_st_verify(f, name));
    }
    for (int i = 0; i < p->count; i++) {
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", p->items[i].name);
        FR_TRY(fr_st_read_into(f, name, p->items[i].tensor));
    }
    return FR_OK;
}

fr_status fr_params_load(fr_params *p, const char *path) {
    fr_st_file *f = fr_st_open(path);
    if (!f)
        return fr_last_status();
    fr_status st = fr_params_read(p, f, path, NULL);
    fr_st_close(f);
    return st;
}

/* ---- iterating and freezing (params.h) ---- */

fr_param *fr_params_next(const fr_params *p, const fr_param *prev, fr_param_kind kind) {
    if (!p)
        return NULL;
    int i = prev ? (int)(prev - p->items) + 1 : 0;
    for (; i < p->count; i++)
        if (p->items[i].kind == kind)
            return &p->items[i];
    return NULL;
}

/* name is prefix itself or lies under it ("layer1" covers "layer1.0.conv1.weight",
 * not "layer10.weight") */
static bool under(const char *name, const char *prefix) {
    size_t n = strlen(prefix);
    return n == 0 || (!strncmp(name, prefix, n) && (name[n] == '\0' || name[n] == '.'));
}

fr_status fr_params_set_trainable(fr_params *p, const char *prefix, bool trainable) {
    if (!p || !prefix)
        return fr_error(FR_ERR_ARG, "set_trainable: %s is NULL", p ? "prefix" : "params");
    int hits = 0;
    for (fr_param *e = NULL; (e = fr_params_next(p, e, FR_PARAMETER));)
        if (under(e->name, prefix)) {
            fr_set_requires_grad(e->tensor, trainable);
            if (!trainable)
                fr_zero_grad(e->tensor);
            hits++;
        }
    if (!hits)
        return fr_error(FR_ERR_ARG, "set_trainable: no parameter is named \"%s\" or starts with \"%s.\"",
                        prefix, prefix);
    return FR_OK;
}
