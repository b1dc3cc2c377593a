/* tensor.h: refcounted n-d tensors over refcounted storages.
 *
 * Ownership: every function returning fr_tensor * hands the caller ONE
 * reference (or NULL with fr_last_error() set); fr_release drops one and
 * accepts NULL. A view (reshape, narrow) holds a reference to the storage, so
 * the bytes live while any view does.
 *
 * Layout: NCHW, row-major; strides are in elements. Fresh tensors are
 * contiguous; narrow on dim 1 gives a strided view. Kernels take contiguous
 * tensors; fr_contiguous makes one when needed.
 *
 * Versions: every storage has a counter bumped by each inplace write. The
 * autograd engine records it when it saves a tensor and compares at backward.
 *
 * Nothing here knows about the tape; the autograd fields are plain data that
 * autograd/ owns and interprets. */
#ifndef FR_TENSOR_H
#define FR_TENSOR_H

#include "fr_base.h"
#include "memory.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FR_MAX_DIMS 5

typedef struct fr_storage {
    void *data;
    size_t nbytes;
    fr_device device;
    fr_mem_tag home_tag;      /* the tag it was allocated under */
    fr_mem_tag tag;           /* the tag its bytes count under now */
    int refcount;
    int saved_count;          /* how many tape entries hold it for backward */
    uint64_t version;         /* bumped by every inplace write */
    const char *last_writer;  /* the op that last wrote it inplace (or NULL) */
} fr_storage;

struct fr_node;
struct fr_tensor;

/* A way to compute a tensor's values again later, so that whoever needs the
 * tensor in backward can keep the recipe instead of the bytes (recompute on
 * backward; docs/ARCHITECTURE.md, "Saved tensors: held or recipe"). tensor/ only counts references; autograd/ and the ops
 * that build recipes give them meaning. */
typedef struct fr_recipe {
    int refcount;
    const char *op;                                        /* producer, for errors */
    struct fr_tensor *(*make)(struct fr_recipe *self);     /* new reference or NULL */
    void (*destroy)(struct fr_recipe *self);               /* frees self and its holdings */
} fr_recipe;

fr_recipe *fr_recipe_retain(fr_recipe *r);
void fr_recipe_release(fr_recipe *r);

typedef struct fr_tensor {
    fr_storage *storage;
    size_t offset;                 /* in elements */
    int ndim;
    int64_t shape[FR_MAX_DIMS];
    int64_t stride[FR_MAX_DIMS];   /* in elements */
    fr_dtype dtype;
    int refcount;
    /* autograd/ bookkeeping */
    bool requires_grad;
    struct fr_tensor *grad;        /* owned; leaves only */
    struct fr_node *grad_fn;       /* producer on the tape, valid while a node */
    uint64_t grad_fn_gen;          /*   with this sequence number is on it */
    int grad_fn_out;               /* which output of grad_fn */
    fr_recipe *recipe;             /* owned; set when the values can be recomputed; valid
                                      while the storage is at recipe_version (read it
                                      through fr_live_recipe) */
    uint64_t recipe_version;
    fr_recipe *packed;             /* owned; the compressed copy the tape made of these
                                      values (autograd/compressed.c), so two ops saving
                                      one tensor share one copy; valid while the storage
                                      is at packed_version */
    uint64_t packed_version;
    const char *name;              /* optional, static or owned elsewhere */
    bool cut_from_graph;           /* a view (fr_view, fr_narrow) of a tensor that takes part
                                      in autograd: the view carries no gradient, so autograd/
                                      refuses it as a recorded op's input (fr_node_new) */
    uint64_t made_in;              /* the birth mark in force when this header was made
                                      (fr_set_birth_mark; 0: none): autograd/ marks what a
                                      checkpointed segment's no-grad forward makes */
} fr_tensor;

/* A shape literal: FR_SHAPE(2, 3) is (const int64_t[]){2, 3}. */
#define FR_SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define FR_NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

/* New contiguous tensor, contents undefined. */
fr_tensor *fr_empty(fr_device dev, fr_dtype dtype, int ndim, const int64_t *shape, fr_mem_tag tag);
fr_tensor *fr_zeros(fr_device dev, fr_dtype dtype, int ndim, const int64_t *shape, fr_mem_tag tag);
/* New tensor with the same shape, dtype and device as `like`. */
fr_tensor *fr_empty_like(const fr_tensor *like, fr_mem_tag tag);
fr_tensor *fr_zeros_like(const fr_tensor *like, fr_mem_tag tag);
/* New tensor filled from host memory holding numel elements of `dtype`. */
fr_tensor *fr_from_host(fr_device dev, fr_dtype dtype, int ndim, const int64_t *shape,
                        fr_mem_tag tag, const void *host_data);

fr_tensor *fr_retain(fr_tensor *t);
void fr_release(fr_tensor *t);
/* Releases *pt and sets it to NULL. */
void fr_clear(fr_tensor **pt);

int64_t fr_numel(const fr_tensor *t);
size_t fr_nbytes(const fr_tensor *t);
bool fr_is_contiguous(const fr_tensor *t);
/* Channels last (PyTorch's channels_last): an f32 (N, C, H, W) tensor at
 * offset 0 with strides (HWC, 1, WC, C), not also contiguous (C or HW of 1
 * lay the same bytes out in both). Made only by a model's channels-last
 * mode (nn/model.h); ops that do not take it refuse it as non-contiguous
 * (docs/ARCHITECTURE.md, layout between ops). fr_empty_like keeps it. */
bool fr_is_channels_last(const fr_tensor *t);
fr_tensor *fr_empty_channels_last(fr_device dev, const int64_t *shape, fr_mem_tag tag);
/* Both channels last with one shape: elementwise ops read them as flat buffers. */
bool fr_same_dense_layout(const fr_tensor *a, const fr_tensor *b);
static inline fr_device fr_device_of(const fr_tensor *t) { return t->storage->device; }
/* Pointer to the first element (host or device memory). */
void *fr_data(const fr_tensor *t);
float *fr_data_f32(const fr_tensor *t);
/* "(64, 16, 32, 32)" into buf; returns buf. */
char *fr_shape_str(const fr_tensor *t, char *buf, size_t len);

/* Views sharing storage. reshape needs a contiguous tensor and the same
 * numel; one entry of shape may be -1. narrow takes dim 0 or 1. Neither is
 * recorded by autograd: a view of a tensor that wants a gradient carries
 * none, and a recorded op refuses it as an input (cut_from_graph); the
 * differentiable views are autograd's fr_reshape and fr_slice. */
fr_tensor *fr_view(fr_tensor *t, int ndim, const int64_t *shape);
fr_tensor *fr_narrow(fr_tensor *t, int dim, int64_t start, int64_t length);
/* t itself (one more reference) when contiguous, else a contiguous copy. */
fr_tensor *fr_contiguous(fr_tensor *t, fr_mem_tag tag);

/* Copies src into dst (same numel; same dtype across devices; any dtype pair
 * on one device, converting). Bumps dst's version. */
fr_status fr_copy_(fr_tensor *dst, const fr_tensor *src);
/* A new tensor on `dev` / of `dtype` holding t's values. */
fr_tensor *fr_to_device(const fr_tensor *t, fr_device dev, fr_mem_tag tag);
fr_tensor *fr_to_dtype(const fr_tensor *t, fr_dtype dtype, fr_mem_tag tag);
/* Reads an f32 tensor's values (any device, any layout) into host memory. */
fr_status fr_read_f32(const fr_tensor *t, float *host, size_t n);
/* One element as float (any dtype, any device); for losses and tests. */
float fr_item(const fr_tensor *t);
fr_status fr_fill_(fr_tensor *t, float value);

/* Attaches a recipe (takes the caller's reference; replaces any earlier
 * one) for t's values as they are now (its storage's version). */
void fr_set_recipe(fr_tensor *t, fr_recipe *r);
/* t's recipe while t's storage is at the version it was attached at, else
 * NULL: an inplace write since (through t or a view sharing its storage)
 * changed the values the recipe rebuilds, and a tensor saved through it
 * would come back as it was before the write. */
fr_recipe *fr_live_recipe(const fr_tensor *t);

/* Records an inplace write by `op` (see the version-counter note above);
 * t's recipe no longer describes it and is dropped. */
void fr_bump_version(fr_tensor *t, const char *op);

/* Every tensor header made on this thread from now on (new tensors and
 * views alike) gets `mark` in made_in; returns the mark in force before,
 * for putting it back. autograd/ sets one around a checkpointed segment's
 * no-grad forward (autograd/fn_checkpoint.c). */
uint64_t fr_set_birth_mark(uint64_t mark);

/* The tape marks storages it holds for backward; transient activations count
 * as FR_TAG_SAVED in the ledger while at least one mark is on. */
void fr_storage_mark_saved(fr_storage *s);
void fr_storage_unmark_saved(fr_storage *s);

/* Argument checks for ops: each returns FR_OK, or an error whose message names
 * the op, the argument and what was wrong. */
fr_status fr_check_defined(const char *op, const char *arg, const fr_tensor *t);
fr_status fr_check_dtype(const char *op, const char *arg, const fr_tensor *t, fr_dtype want);
fr_status fr_check_ndim(const char *op, const char *arg, const fr_tensor *t, int ndim);
/* shape entries < 0 match anything */
fr_status fr_check_shape(const char *op, const char *arg, const fr_tensor *t, int ndim,
                         const int64_t *shape);
fr_status fr_check_same_shape(const char *op, const char *arg_a, const fr_tensor *a,
                              const char *arg_b, const fr_tensor *b);
fr_status fr_check_same_device(const char *op, const char *arg_a, const fr_tensor *a,
                               const char *arg_b, const fr_tensor *b);
fr_status fr_check_contiguous(const char *op, const char *arg, const fr_tensor *t);
/* defined + f32 + contiguous, the common case for kernels */
fr_status fr_check_f32c(const char *op, const char *arg, const fr_tensor *t);
/* f32, f16 or bf16, and contiguous: what ops accept for activations (mixed
 * precision). */
fr_status fr_check_floatc(const char *op, const char *arg, const fr_tensor *t);
/* Both fr_check_floatc, of one shape, on one device: an elementwise op's
 * output and input. Two channels-last tensors of one shape pass too
 * (fr_same_dense_layout): elementwise, they are flat buffers laid out alike. */
fr_status fr_check_float_pair(const char *op, const char *a_name, const fr_tensor *a,
                              const char *b_name, const fr_tensor *b);

/* Tensors and storages alive now (for leak checks in tests). */
long fr_live_tensors(void);
long fr_live_storages(void);

#ifdef __cplusplus
}
#endif
#endif
