/* params.h: the parameter registry of a model.
 *
 * An ordered list of (dotted name, tensor, kind). Names follow PyTorch's
 * state_dict ("layer1.0.conv1.weight", "bn1.running_mean"), and so does the
 * order: modules in registration order, each module's parameters before its
 * buffers. Files saved here therefore load into the same architecture written
 * in PyTorch (and the other way round), name for name.
 *
 * Kinds:
 *  - FR_PARAMETER: trainable, f32, tagged FR_TAG_PARAM, requires_grad on;
 *    optimizers update these and only these.
 *  - FR_BUFFER: state saved with the model but not trained (BatchNorm's
 *    running_mean / running_var, f32, FR_TAG_PARAM, no grad). BatchNorm's
 *    num_batches_tracked is a buffer too, registered so that the names equal
 *    PyTorch's state_dict keys; PyTorch keeps it as int64, frugal as a 0-d i32
 *    (frugal has no 64-bit integer dtype; PyTorch's int64 loads after a range
 *    check, fr_st_is_i64) that stays on the CPU even when the
 *    model moves to CUDA: it is a counter the host bumps, never an operand.
 *
 * Ownership: the registry owns one reference to every tensor in it. Tensors
 * handed out (fr_params_new_tensor, fr_params_get, items[i].tensor) are
 * BORROWED: they live as long as the registry. Layers keep such borrowed
 * pointers, which stay valid across fr_params_to_device and fr_params_load
 * (both change the bytes behind a tensor, never the tensor object). */
#ifndef FR_PARAMS_H
#define FR_PARAMS_H

#include "../tensor/tensor.h"
#include "../io/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FR_PARAMETER = 0, FR_BUFFER, FR_PARAM_KIND_COUNT } fr_param_kind;

typedef struct {
    char *name;          /* owned copy of the dotted name */
    fr_tensor *tensor;   /* owned reference */
    fr_param_kind kind;
} fr_param;

/* Iterate with `for (int i = 0; i < p->count; i++) { fr_param *e = &p->items[i]; }`. */
typedef struct fr_params {
    int count, cap;
    fr_param *items;
} fr_params;

fr_params *fr_params_new(void);
/* Releases every tensor (and its .grad). NULL-safe. */
void fr_params_free(fr_params *p);

/* A new zero-filled tensor on the CPU registered under `name`; BORROWED.
 * Parameters are f32 and require grad. NULL with FR_ERR_ARG on an empty or
 * duplicate name. */
fr_tensor *fr_params_new_tensor(fr_params *p, const char *name, fr_param_kind kind, fr_dtype dtype,
                                int ndim, const int64_t *shape);
/* Registers an existing tensor under `name` (the registry takes a new
 * reference; a parameter gets requires_grad). */
fr_status fr_params_add(fr_params *p, const char *name, fr_tensor *t, fr_param_kind kind);

/* The entries of one kind in order, PyTorch's named_parameters() (kind
 * FR_PARAMETER) or named_buffers() (FR_BUFFER):
 *     for (fr_param *e = NULL; (e = fr_params_next(p, e, FR_PARAMETER));)
 *         printf("%s\n", e->name);
 * prev NULL starts; NULL at the end. */
fr_param *fr_params_next(const fr_params *p, const fr_param *prev, fr_param_kind kind);

/* Freezes (trainable false) or unfreezes the parameters of a module: every
 * FR_PARAMETER named `prefix` or starting with `prefix.` ("" is all) stops
 * or starts requiring grad, so backward gives it no gradient and the
 * optimizer leaves it alone (requires_grad_(False) on module.parameters()).
 * FR_ERR_ARG naming the prefix when no parameter matches. */
fr_status fr_params_set_trainable(fr_params *p, const char *prefix, bool trainable);

/* The tensor registered under `name` (BORROWED), or NULL (no error set). */
fr_tensor *fr_params_get(const fr_params *p, const char *name);
/* Its index, or -1. */
int fr_params_find(const fr_params *p, const char *name);

/* Trainable scalars: the sum of numel over parameters (not buffers). */
int64_t fr_params_count(const fr_params *p);
/* Bytes of every tensor in the registry, parameters and buffers. */
size_t fr_params_bytes(const fr_params *p);

/* The first parameter or buffer (in registration order) holding an inf or
 * a NaN: *index is its index, or -1 when every f32 tensor is finite (the
 * i32 counters cannot hold either). One read per tensor, so call it only
 * once a loss came out non-finite, to name the culprit. */
fr_status fr_params_find_nonfinite(const fr_params *p, int *index);

/* Frees the .grad of every parameter (PyTorch's zero_grad(set_to_none=True):
 * no memory is held for gradients between steps). */
void fr_params_zero_grad(fr_params *p);

/* Moves every f32 tensor to `dev` (num_batches_tracked stays on the CPU, see
 * above). Gradients are dropped. The tensor objects are kept, so pointers
 * held by layers stay valid. On failure nothing that was moved is moved back;
 * the model is then mixed and the caller should free it. */
fr_status fr_params_to_device(fr_params *p, fr_device dev);

/* Adds every tensor to a writer under prefix + name (prefix may be NULL), so
 * a checkpoint can hold the model beside other state. */
fr_status fr_params_write(const fr_params *p, fr_st_writer *w, const char *prefix);
/* Saves every tensor (atomically; see safetensors.h). */
fr_status fr_params_save(const fr_params *p, const char *path);

/* Reads every tensor from an open file, names prefixed with `prefix` (may be
 * NULL). Strict: before anything is copied, each name must be in the file
 * with the registry's shape and dtype, the file may hold no other name that
 * starts with the prefix, each tensor's bytes must match the file's checksum
 * if it has one (fr_st_verify) and BatchNorm's statistics must be ones
 * training produces (fr_params_check_stats). Errors name `path` (used only
 * for messages) and the tensors: FR_ERR_FORMAT for missing or unexpected
 * names (the first few are listed), damaged bytes or bad statistics,
 * FR_ERR_SHAPE / FR_ERR_DTYPE for a mismatch. */
fr_status fr_params_read(fr_params *p, const fr_st_file *f, const char *path, const char *prefix);
/* Opens `path` and reads every tensor (fr_params_read without prefix). */
fr_status fr_params_load(fr_params *p, const char *path);
/* The values file `f` holds under `name` for registry entry `e`, when e is
 * a BatchNorm statistic (a buffer named running_mean, running_var or
 * num_batches_tracked, as PyTorch names them): running_mean finite,
 * running_var finite and >= 0, num_batches_tracked >= 0; FR_OK for anything
 * else. Call it after e's dtype and shape were checked against the file. A
 * negative or non-finite variance would otherwise load, and come back as a NaN
 * loss that no parameter explains. FR_ERR_FORMAT naming `op` ("checkpoint",
 * "load"), `path`, the tensor, the first bad element and its value. */
fr_status fr_params_check_stats(const fr_param *e, const fr_st_file *f, const char *path, const char *name,
                                const char *op);

/* Joins a dotted name into buf: "layer1.0" + "conv1" -> "layer1.0.conv1"
 * (prefix NULL or "" gives just `name`). Returns buf; FR_ASSERTs on
 * overflow (names are program text, not user input). */
char *fr_name_join(char *buf, size_t len, const char *prefix, const char *name);
#define FR_NAME_MAX 256

#ifdef __cplusplus
}
#endif
#endif
