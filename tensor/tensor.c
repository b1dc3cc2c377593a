/* tensor.c: creation, refcounting, views, copies and argument checks. */
#include "tensor.h"
#include "staging.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "kernels.h"

static atomic_long live_tensors;
static atomic_long live_storages;

long fr_live_tensors(void) { return atomic_load(&live_tensors); }
long fr_live_storages(void) { return atomic_load(&live_storages); }

static fr_storage *storage_new(fr_device dev, size_t nbytes, fr_mem_tag tag) {
    if (dev == FR_CUDA && fr_cuda_device_count() == 0) {
        fr_error(FR_ERR_DEVICE, "cannot allocate on cuda: %s", fr_cuda_unavailable_reason());
        return NULL;
    }
    fr_storage *s = calloc(1, sizeof *s);
    if (!s) {
        fr_error(FR_ERR_OOM, "out of memory allocating a storage header");
        return NULL;
    }
    s->data = fr_mem_alloc(dev, nbytes, tag);
    if (!s->data) {
        free(s);
        return NULL;
    }
    s->nbytes = nbytes;
    s->device = dev;
    s->home_tag = s->tag = tag;
    s->refcount = 1;
    atomic_fetch_add(&live_storages, 1);
    return s;
}

static void storage_release(fr_storage *s) {
    if (!s || --s->refcount > 0)
        return;
    FR_ASSERT(s->saved_count == 0);
    fr_mem_free(s->device, s->data, s->nbytes, s->tag);
    free(s);
    atomic_fetch_sub(&live_storages, 1);
}

void fr_storage_mark_saved(fr_storage *s) {
    /* Only activations change category; a parameter or an input batch that an
     * op saves is still counted as what it is. */
    if (s->saved_count++ == 0 && s->home_tag == FR_TAG_TRANSIENT) {
        fr_mem_retag(s->device, s->nbytes, s->tag, FR_TAG_SAVED);
        s->tag = FR_TAG_SAVED;
    }
}

void fr_storage_unmark_saved(fr_storage *s) {
    FR_ASSERT(s->saved_count > 0);
    if (--s->saved_count == 0 && s->tag != s->home_tag) {
        fr_mem_retag(s->device, s->nbytes, s->tag, s->home_tag);
        s->tag = s->home_tag;
    }
}

static _Thread_local uint64_t birth_mark;

uint64_t fr_set_birth_mark(uint64_t mark) {
    uint64_t before = birth_mark;
    birth_mark = mark;
    return before;
}

static fr_tensor *tensor_header(fr_storage *s, fr_dtype dtype, int ndim, const int64_t *shape) {
    fr_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        fr_error(FR_ERR_OOM, "out of memory allocating a tensor header");
        return NULL;
    }
    t->storage = s;
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->stride[i] = stride;
        stride *= shape[i];
    }
    t->refcount = 1;
    t->made_in = birth_mark;
    atomic_fetch_add(&live_tensors, 1);
    return t;
}

static fr_status check_new_shape(int ndim, const int64_t *shape, int64_t *numel) {
    if (ndim < 0 || ndim > FR_MAX_DIMS)
        return fr_error(FR_ERR_SHAPE, "tensor: %d dimensions requested, frugal supports 0 to %d",
                        ndim, FR_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return fr_error(FR_ERR_SHAPE, "tensor: negative size %lld in dimension %d",
                            (long long)shape[i], i);
        if (shape[i] > 0 && n > INT64_MAX / 8 / shape[i])
            return fr_error(FR_ERR_SHAPE, "tensor: shape too large in dimension %d", i);
        n *= shape[i];
    }
    *numel = n;
    return FR_OK;
}

fr_tensor *fr_empty(fr_device dev, fr_dtype dtype, int ndim, const int64_t *shape, fr_mem_tag tag) {
    int64_t n = 0;
    if ((unsigned)dtype >= FR_DTYPE_COUNT || (unsigned)dev >= FR_DEVICE_COUNT ||
        (unsigned)tag >= FR_TAG_COUNT) {
        fr_error(FR_ERR_ARG, "tensor: unknown dtype, device or memory tag");
        return NULL;
    }
    if (check_new_shape(ndim, shape, &n) != FR_OK)
        return NULL;
    fr_storage *s = storage_new(dev, (size_t)n * fr_dtype_size(dtype), tag);
    if (!s)
        return NULL;
    fr_tensor *t = tensor_header(s, dtype, ndim, shape);
    if (!t)
        storage_release(s);
    return t;
}

static fr_status fill_block(fr_device dev, float *y, const float *const *in, size_t n, size_t off,
                            const void *value) {
    (void)in, (void)off;
    return FR_CALL_KERNEL(dev, fill, y, *(const float *)value, n);
}

/* Every element of a dense storage (contiguous or channels last) set to
 * value, f16 / bf16 through staged f32 blocks (rounded once, as a cast). */
static fr_status fill_storage(fr_tensor *t, float value) {
    return fr_stage_run(t, false, NULL, 0, (size_t)fr_numel(t), fill_block, &value);
}

/* Zeroes a new tensor's storage, whatever its dense layout (contiguous or
 * channels last): NULL in, or a failed fill, gives NULL. */
static fr_tensor *zeroed(fr_tensor *t) {
    if (!t)
        return NULL;
    if (fr_device_of(t) == FR_CPU) {
        memset(t->storage->data, 0, t->storage->nbytes);
    } else if (fill_storage(t, 0.0f) != FR_OK) {
        fr_release(t);
        return NULL;
    }
    return t;
}

fr_tensor *fr_zeros(fr_device dev, fr_dtype dtype, int ndim, const int64_t *shape, fr_mem_tag tag) {
    return zeroed(fr_empty(dev, dtype, ndim, shape, tag));
}

fr_tensor *fr_empty_like(const fr_tensor *like, fr_mem_tag tag) {
    /* a channels-last activation's sibling (its gradient, a sum) keeps the
     * layout, so ops taking two tensors of one dense layout see it
     * (docs/ARCHITECTURE.md, layout between ops) */
    if (fr_is_channels_last(like))
        return fr_empty_channels_last(fr_device_of(like), like->shape, tag);
    return fr_empty(fr_device_of(like), like->dtype, like->ndim, like->shape, tag);
}

fr_tensor *fr_empty_channels_last(fr_device dev, const int64_t *shape, fr_mem_tag tag) {
    fr_tensor *t = fr_empty(dev, FR_F32, 4, shape, tag);
    if (t) {
        t->stride[1] = 1;
        t->stride[3] = shape[1];
        t->stride[2] = shape[3] * shape[1];
        t->stride[0] = shape[2] * shape[3] * shape[1];
    }
    return t;
}

bool fr_is_channels_last(const fr_tensor *t) {
    return t && t->ndim == 4 && t->dtype == FR_F32 && t->offset == 0 && t->stride[1] == 1 &&
           t->stride[3] == t->shape[1] && t->stride[2] == t->shape[3] * t->shape[1] &&
           t->stride[0] == t->shape[2] * t->shape[3] * t->shape[1] && !fr_is_contiguous(t);
}

bool fr_same_dense_layout(const fr_tensor *a, const fr_tensor *b) {
    return fr_is_channels_last(a) && fr_is_channels_last(b) && a->ndim == b->ndim &&
           !memcmp(a->shape, b->shape, sizeof(int64_t) * 4);
}

fr_tensor *fr_zeros_like(const fr_tensor *like, fr_mem_tag tag) {
    return zeroed(fr_empty_like(like, tag)); /* keeps a channels-last layout, on any device */
}

fr_tensor *fr_from_host(fr_device dev, fr_dtype dtype, int ndim, const int64_t *shape,
                        fr_mem_tag tag, const void *host_data) {
    fr_tensor *t = fr_empty(dev, dtype, ndim, shape, tag);
    if (!t)
        return NULL;
    if (dev == FR_CPU) {
        memcpy(t->storage->data, host_data, t->storage->nbytes);
    } else if (fr_cuda_memcpy(t->storage->data, host_data, t->storage->nbytes, FR_COPY_H2D) != FR_OK) {
        fr_release(t);
        return NULL;
    }
    return t;
}

fr_tensor *fr_retain(fr_tensor *t) {
    if (t)
        t->refcount++;
    return t;
}

void fr_release(fr_tensor *t) {
    if (!t)
        return;
    FR_ASSERT(t->refcount > 0);
    if (--t->refcount > 0)
        return;
    fr_release(t->grad);
    fr_recipe_release(t->recipe);
    fr_recipe_release(t->packed);
    storage_release(t->storage);
    free(t);
    atomic_fetch_sub(&live_tensors, 1);
}

void fr_clear(fr_tensor **pt) {
    fr_release(*pt);
    *pt = NULL;
}

int64_t fr_numel(const fr_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t fr_nbytes(const fr_tensor *t) { return (size_t)fr_numel(t) * fr_dtype_size(t->dtype); }

bool fr_is_contiguous(const fr_tensor *t) {
    int64_t stride = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != stride)
            return false;
        stride *= t->shape[i];
    }
    return true;
}

void *fr_data(const fr_tensor *t) {
    return (char *)t->storage->data + t->offset * fr_dtype_size(t->dtype);
}

float *fr_data_f32(const fr_tensor *t) {
    FR_ASSERT(t->dtype == FR_F32);
    return (float *)fr_data(t);
}

char *fr_shape_str(const fr_tensor *t, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < t->ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, t->ndim == 1 ? ",)" : ")");
    return buf;
}

static fr_tensor *view_of(fr_tensor *t) {
    fr_tensor *v = tensor_header(t->storage, t->dtype, t->ndim, t->shape);
    if (!v)
        return NULL;
    t->storage->refcount++;
    v->cut_from_graph = t->requires_grad || t->cut_from_graph;
    v->offset = t->offset;
    memcpy(v->stride, t->stride, sizeof v->stride);
    return v;
}

fr_tensor *fr_view(fr_tensor *t, int ndim, const int64_t *shape) {
    char buf[96];
    if (fr_check_defined("view", "input", t) != FR_OK)
        return NULL;
    if (!fr_is_contiguous(t)) {
        fr_error(FR_ERR_SHAPE, "view: input %s is not contiguous; call fr_contiguous first",
                 fr_shape_str(t, buf, sizeof buf));
        return NULL;
    }
    if (ndim < 0 || ndim > FR_MAX_DIMS) {
        fr_error(FR_ERR_SHAPE, "view: %d dimensions requested, frugal supports 0 to %d", ndim,
                 FR_MAX_DIMS);
        return NULL;
    }
    int64_t resolved[FR_MAX_DIMS], known = 1, numel = fr_numel(t);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        resolved[i] = shape[i];
        if (shape[i] == -1 && infer < 0)
            infer = i;
        else if (shape[i] < 0) {
            fr_error(FR_ERR_SHAPE, "view: bad size %lld in dimension %d", (long long)shape[i], i);
            return NULL;
        } else
            known *= shape[i];
    }
    if (infer >= 0)
        resolved[infer] = known ? numel / known : 0;
    int64_t total = known * (infer >= 0 ? resolved[infer] : 1);
    if (total != numel) {
        fr_error(FR_ERR_SHAPE, "view: cannot view %s (%lld elements) with the requested shape",
                 fr_shape_str(t, buf, sizeof buf), (long long)numel);
        return NULL;
    }
    fr_tensor *v = view_of(t);
    if (!v)
        return NULL;
    v->ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        v->shape[i] = resolved[i];
        v->stride[i] = stride;
        stride *= resolved[i];
    }
    return v;
}

fr_tensor *fr_narrow(fr_tensor *t, int dim, int64_t start, int64_t length) {
    char buf[96];
    if (fr_check_defined("narrow", "input", t) != FR_OK)
        return NULL;
    if (dim < 0 || dim > 1 || dim >= t->ndim) {
        fr_error(FR_ERR_ARG, "narrow: dimension %d not supported for %s (dims 0 and 1 only)", dim,
                 fr_shape_str(t, buf, sizeof buf));
        return NULL;
    }
    if (start < 0 || length < 0 || start + length > t->shape[dim]) {
        fr_error(FR_ERR_SHAPE, "narrow: range [%lld, %lld) outside dimension %d of %s",
                 (long long)start, (long long)(start + length), dim, fr_shape_str(t, buf, sizeof buf));
        return NULL;
    }
    fr_tensor *v = view_of(t);
    if (!v)
        return NULL;
    v->offset += (size_t)(start * t->stride[dim]);
    v->shape[dim] = length;
    return v;
}

fr_tensor *fr_contiguous(fr_tensor *t, fr_mem_tag tag) {
    if (fr_check_defined("contiguous", "input", t) != FR_OK)
        return NULL;
    if (fr_is_contiguous(t))
        return fr_retain(t);
    fr_tensor *c = fr_empty_like(t, tag);
    if (c && fr_copy_(c, t) != FR_OK)
        fr_clear(&c);
    return c;
}

/* Strided host copy of same-dtype elements, innermost dimension contiguous or
 * not; dims are padded to FR_MAX_DIMS with size 1. */
static void copy_strided_host(const fr_tensor *dst, const fr_tensor *src) {
    int64_t shape[FR_MAX_DIMS], ds[FR_MAX_DIMS], ss[FR_MAX_DIMS];
    int pad = FR_MAX_DIMS - src->ndim;
    /* dst may have another shape with the same numel only when contiguous;
     * then index it linearly. */
    bool dst_linear = fr_is_contiguous(dst);
    for (int i = 0; i < FR_MAX_DIMS; i++) {
        shape[i] = i < pad ? 1 : src->shape[i - pad];
        ss[i] = i < pad ? 0 : src->stride[i - pad];
        ds[i] = i < pad || dst_linear ? 0 : dst->stride[i - pad];
    }
    size_t es = fr_dtype_size(src->dtype);
    char *d = fr_data(dst);
    const char *s = fr_data(src);
    int64_t linear = 0;
    for (int64_t a = 0; a < shape[0]; a++)
        for (int64_t b = 0; b < shape[1]; b++)
            for (int64_t c = 0; c < shape[2]; c++)
                for (int64_t e = 0; e < shape[3]; e++)
                    for (int64_t f = 0; f < shape[4]; f++, linear++) {
                        int64_t so = a * ss[0] + b * ss[1] + c * ss[2] + e * ss[3] + f * ss[4];
                        int64_t dof = dst_linear ? linear
                                                 : a * ds[0] + b * ds[1] + c * ds[2] + e * ds[3] + f * ds[4];
                        memcpy(d + dof * (int64_t)es, s + so * (int64_t)es, es);
                    }
}

fr_status fr_copy_(fr_tensor *dst, const fr_tensor *src) {
    char a[96], b[96];
    FR_TRY(fr_check_defined("copy", "dst", dst));
    FR_TRY(fr_check_defined("copy", "src", src));
    if (fr_numel(dst) != fr_numel(src))
        return fr_error(FR_ERR_SHAPE, "copy: dst %s and src %s differ in size",
                        fr_shape_str(dst, a, sizeof a), fr_shape_str(src, b, sizeof b));
    if (!fr_is_contiguous(dst) && !(dst->ndim == src->ndim &&
                                    !memcmp(dst->shape, src->shape, sizeof(int64_t) * (size_t)dst->ndim)))
        return fr_error(FR_ERR_SHAPE, "copy: a strided dst %s needs a src of the same shape, got %s",
                        fr_shape_str(dst, a, sizeof a), fr_shape_str(src, b, sizeof b));
    fr_device dd = fr_device_of(dst), sd = fr_device_of(src);
    /* two channels-last tensors of one shape lie alike: a flat copy too */
    bool both_contig = (fr_is_contiguous(dst) && fr_is_contiguous(src)) ||
                       fr_same_dense_layout(dst, src);
    size_t n = (size_t)fr_numel(src);
    fr_status st = FR_OK;
    if (dd == FR_CPU && sd == FR_CPU) {
        if (dst->dtype != src->dtype) {
            if (!both_contig)
                return fr_error(FR_ERR_SHAPE, "copy: dtype conversion needs contiguous tensors");
            st = fr_cpu_cast(fr_data(dst), dst->dtype, fr_data(src), src->dtype, n);
        } else if (both_contig) {
            memmove(fr_data(dst), fr_data(src), fr_nbytes(src));
        } else {
            copy_strided_host(dst, src);
        }
    } else {
        if (!both_contig)
            return fr_error(FR_ERR_SHAPE, "copy: copies involving cuda need contiguous tensors");
        if (dst->dtype != src->dtype) {
            if (dd != sd)
                return fr_error(FR_ERR_DTYPE, "copy: %s -> %s across devices; convert on one device first",
                                fr_dtype_name(src->dtype), fr_dtype_name(dst->dtype));
            st = FR_CALL_KERNEL(dd, cast, fr_data(dst), dst->dtype, fr_data(src), src->dtype, n);
        } else {
            fr_copy_kind kind = dd == FR_CUDA && sd == FR_CUDA ? FR_COPY_D2D
                                : dd == FR_CUDA                ? FR_COPY_H2D
                                                               : FR_COPY_D2H;
            st = fr_cuda_memcpy(fr_data(dst), fr_data(src), fr_nbytes(src), kind);
        }
    }
    if (st == FR_OK)
        fr_bump_version(dst, "copy_");
    return st;
}

fr_tensor *fr_to_device(const fr_tensor *t, fr_device dev, fr_mem_tag tag) {
    if (fr_check_defined("to_device", "input", t) != FR_OK)
        return NULL;
    fr_tensor *out = fr_empty(dev, t->dtype, t->ndim, t->shape, tag);
    if (!out)
        return NULL;
    fr_tensor *src = fr_contiguous((fr_tensor *)t, FR_TAG_TRANSIENT);
    fr_status st = src ? fr_copy_(out, src) : fr_last_status();
    fr_release(src);
    if (st != FR_OK)
        fr_clear(&out);
    return out;
}

fr_tensor *fr_to_dtype(const fr_tensor *t, fr_dtype dtype, fr_mem_tag tag) {
    if (fr_check_defined("to_dtype", "input", t) != FR_OK)
        return NULL;
    fr_tensor *out = fr_empty(fr_device_of(t), dtype, t->ndim, t->shape, tag);
    if (!out)
        return NULL;
    fr_tensor *src = fr_contiguous((fr_tensor *)t, FR_TAG_TRANSIENT);
    fr_status st = src ? fr_copy_(out, src) : fr_last_status();
    fr_release(src);
    if (st != FR_OK)
        fr_clear(&out);
    return out;
}

fr_status fr_read_f32(const fr_tensor *t, float *host, size_t n) {
    char buf[96];
    FR_TRY(fr_check_defined("read_f32", "input", t));
    FR_TRY(fr_check_dtype("read_f32", "input", t, FR_F32));
    if ((size_t)fr_numel(t) != n)
        return fr_error(FR_ERR_SHAPE, "read_f32: tensor %s has %lld elements, buffer holds %zu",
                        fr_shape_str(t, buf, sizeof buf), (long long)fr_numel(t), n);
    fr_tensor *c = fr_contiguous((fr_tensor *)t, FR_TAG_TRANSIENT);
    if (!c)
        return fr_last_status();
    fr_status st = FR_OK;
    if (fr_device_of(c) == FR_CPU)
        memcpy(host, fr_data(c), n * sizeof(float));
    else
        st = fr_cuda_memcpy(host, fr_data(c), n * sizeof(float), FR_COPY_D2H);
    fr_release(c);
    return st;
}

float fr_item(const fr_tensor *t) {
    FR_ASSERT(t && fr_numel(t) >= 1);
    unsigned char raw[8];
    size_t es = fr_dtype_size(t->dtype);
    if (fr_device_of(t) == FR_CPU)
        memcpy(raw, fr_data(t), es);
    else if (fr_cuda_memcpy(raw, fr_data(t), es, FR_COPY_D2H) != FR_OK)
        return 0.0f / 0.0f;
    float v;
    fr_cpu_cast(&v, FR_F32, raw, t->dtype, 1);
    return v;
}

fr_status fr_fill_(fr_tensor *t, float value) {
    FR_TRY(fr_check_floatc("fill", "input", t));
    FR_TRY(fill_storage(t, value));
    fr_bump_version(t, "fill_");
    return FR_OK;
}

fr_recipe *fr_recipe_retain(fr_recipe *r) {
    if (r)
        r->refcount++;
    return r;
}

void fr_recipe_release(fr_recipe *r) {
    if (r && --r->refcount == 0)
        r->destroy(r);
}

void fr_set_recipe(fr_tensor *t, fr_recipe *r) {
    fr_recipe_release(t->recipe);
    t->recipe = r;
    t->recipe_version = t->storage->version;
}

fr_recipe *fr_live_recipe(const fr_tensor *t) {
    return t->recipe && t->recipe_version == t->storage->version ? t->recipe : NULL;
}

void fr_bump_version(fr_tensor *t, const char *op) {
    t->storage->version++;
    t->storage->last_writer = op;
    fr_set_recipe(t, NULL);
}

/* ---- argument checks ---- */

fr_status fr_check_defined(const char *op, const char *arg, const fr_tensor *t) {
    return t ? FR_OK : fr_error_null(op, arg);
}

fr_status fr_check_dtype(const char *op, const char *arg, const fr_tensor *t, fr_dtype want) {
    FR_TRY(fr_check_defined(op, arg, t));
    if (t->dtype != want)
        return fr_error(FR_ERR_DTYPE, "%s: %s has dtype %s, expected %s", op, arg,
                        fr_dtype_name(t->dtype), fr_dtype_name(want));
    return FR_OK;
}

fr_status fr_check_ndim(const char *op, const char *arg, const fr_tensor *t, int ndim) {
    char buf[96];
    FR_TRY(fr_check_defined(op, arg, t));
    if (t->ndim != ndim)
        return fr_error(FR_ERR_SHAPE, "%s: %s has shape %s, expected %d dimensions", op, arg,
                        fr_shape_str(t, buf, sizeof buf), ndim);
    return FR_OK;
}

fr_status fr_check_shape(const char *op, const char *arg, const fr_tensor *t, int ndim,
                         const int64_t *shape) {
    char buf[96], want[96];
    FR_TRY(fr_check_defined(op, arg, t));
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] < 0 || shape[i] == t->shape[i];
    if (ok)
        return FR_OK;
    size_t used = (size_t)snprintf(want, sizeof want, "(");
    for (int i = 0; i < ndim && used < sizeof want; i++) {
        if (shape[i] < 0)
            used += (size_t)snprintf(want + used, sizeof want - used, i ? ", *" : "*");
        else
            used += (size_t)snprintf(want + used, sizeof want - used, i ? ", %lld" : "%lld",
                                     (long long)shape[i]);
    }
    if (used < sizeof want)
        snprintf(want + used, sizeof want - used, ")");
    return fr_error(FR_ERR_SHAPE, "%s: %s has shape %s, expected %s", op, arg,
                    fr_shape_str(t, buf, sizeof buf), want);
}

fr_status fr_check_same_shape(const char *op, const char *arg_a, const fr_tensor *a,
                              const char *arg_b, const fr_tensor *b) {
    FR_TRY(fr_check_defined(op, arg_a, a));
    FR_TRY(fr_check_defined(op, arg_b, b));
    bool ok = a->ndim == b->ndim;
    for (int i = 0; ok && i < a->ndim; i++)
        ok = a->shape[i] == b->shape[i];
    if (ok)
        return FR_OK;
    char sa[96], sb[96];
    return fr_error(FR_ERR_SHAPE, "%s: %s %s and %s %s must have the same shape", op, arg_a,
                    fr_shape_str(a, sa, sizeof sa), arg_b, fr_shape_str(b, sb, sizeof sb));
}

fr_status fr_check_same_device(const char *op, const char *arg_a, const fr_tensor *a,
                               const char *arg_b, const fr_tensor *b) {
    FR_TRY(fr_check_defined(op, arg_a, a));
    FR_TRY(fr_check_defined(op, arg_b, b));
    if (fr_device_of(a) != fr_device_of(b))
        return fr_error(FR_ERR_DEVICE, "%s: %s is on %s but %s is on %s", op, arg_a,
                        fr_device_name(fr_device_of(a)), arg_b, fr_device_name(fr_device_of(b)));
    return FR_OK;
}

fr_status fr_check_contiguous(const char *op, const char *arg, const fr_tensor *t) {
    char buf[96];
    FR_TRY(fr_check_defined(op, arg, t));
    if (!fr_is_contiguous(t))
        return fr_error(FR_ERR_SHAPE, "%s: %s %s is not contiguous", op, arg,
                        fr_shape_str(t, buf, sizeof buf));
    return FR_OK;
}

fr_status fr_check_f32c(const char *op, const char *arg, const fr_tensor *t) {
    FR_TRY(fr_check_dtype(op, arg, t, FR_F32));
    return fr_check_contiguous(op, arg, t);
}

fr_status fr_check_floatc(const char *op, const char *arg, const fr_tensor *t) {
    FR_TRY(fr_check_defined(op, arg, t));
    if (!fr_dtype_is_float(t->dtype))
        return fr_error(FR_ERR_DTYPE, "%s: %s must be f32, f16 or bf16, got %s", op, arg,
                        fr_dtype_name(t->dtype));
    return fr_check_contiguous(op, arg, t);
}

fr_status fr_check_float_pair(const char *op, const char *a_name, const fr_tensor *a,
                              const char *b_name, const fr_tensor *b) {
    /* two channels-last tensors of one shape (a channels-last model's,
     * nn/model.h) are flat buffers laid out alike: elementwise ops run on
     * them as on contiguous ones (docs/ARCHITECTURE.md, layout between ops) */
    if (fr_same_dense_layout(a, b))
        return fr_check_same_device(op, a_name, a, b_name, b);
    FR_TRY(fr_check_floatc(op, a_name, a));
    FR_TRY(fr_check_floatc(op, b_name, b));
    FR_TRY(fr_check_same_shape(op, a_name, a, b_name, b));
    return fr_check_same_device(op, a_name, a, b_name, b);
}
