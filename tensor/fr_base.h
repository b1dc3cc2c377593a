/* fr_base.h: what every frugal file needs: status codes, the error channel,
 * assertions, dtypes and devices.
 *
 * Errors come in two tiers (docs/ARCHITECTURE.md, "Errors"):
 *  - what a user can cause (bad shape, bad file, out of memory) is returned as
 *    an fr_status (or NULL) and described by fr_last_error();
 *  - a broken invariant is a bug in frugal: FR_ASSERT aborts with file:line.
 * The library never calls exit(). */
#ifndef FR_BASE_H
#define FR_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#define FR_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define FR_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

typedef enum {
    FR_OK = 0,
    FR_ERR_ARG,      /* a bad argument: NULL, negative size, unknown name */
    FR_ERR_SHAPE,    /* shapes that do not fit together */
    FR_ERR_DTYPE,    /* a dtype the op does not take */
    FR_ERR_DEVICE,   /* tensors on different devices, or no CUDA */
    FR_ERR_OOM,      /* an allocation failed or would pass the set limit */
    FR_ERR_IO,       /* a file could not be opened, read or written */
    FR_ERR_FORMAT,   /* a file's contents are malformed */
    FR_ERR_VERSION,  /* a saved tensor was modified inplace before backward */
    FR_ERR_GRAPH,    /* backward through a freed graph, or on a non-scalar */
    FR_ERR_CUDA,     /* a CUDA, cuBLAS or cuDNN call failed */
    FR_ERR_COUNT
} fr_status;

/* CPU threads (cpu/threads.c). By default the CPU kernels' OpenMP team is
 * sized once, at the first kernel, to the cores the load average leaves
 * free (or to OMP_NUM_THREADS when it is set). fr_set_num_threads(n) asks
 * for n threads (n >= 1) instead, whatever the load: call it before the
 * first kernel, as the programs' --threads does. fr_get_num_threads() is
 * the team size the next kernel gets. */
void fr_set_num_threads(int n);
int fr_get_num_threads(void);

/* The message of the most recent error on this thread ("" if none). */
const char *fr_last_error(void);
/* The status of the most recent error on this thread. */
fr_status fr_last_status(void);
/* Records an error (printf-style message) and returns `code`, so callers can
 * write `return fr_error(FR_ERR_SHAPE, "conv2d: ...")`. */
fr_status fr_error(fr_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void fr_clear_error(void);
const char *fr_status_name(fr_status s);
/* The one NULL convention of every function and layer that takes a tensor
 * (see docs/ARCHITECTURE.md, "Errors"): a NULL argument is an error naming
 * `op` and `arg`. When an error is pending (fr_last_status() != FR_OK) the
 * NULL is taken to be that failure's result, so its status is kept and its
 * message is kept inside the new one: the first error always survives a
 * chain `y = fr_chain(y, f(y))`, however long, wrapped once (the message
 * names the latest op that met the NULL and the first cause). After
 * handling an error, fr_clear_error() makes the next NULL its own error. */
fr_status fr_error_null(const char *op, const char *arg);

/* Propagates a non-OK status from an expression. */
#define FR_TRY(expr)                       \
    do {                                   \
        fr_status fr_try_s_ = (expr);      \
        if (fr_try_s_ != FR_OK)            \
            return fr_try_s_;              \
    } while (0)

void fr_assert_fail(const char *cond, const char *file, int line)
    __attribute__((noreturn));
#define FR_ASSERT(cond)                                        \
    do {                                                       \
        if (!(cond))                                           \
            fr_assert_fail(#cond, __FILE__, __LINE__);         \
    } while (0)

typedef enum { FR_F32 = 0, FR_F16, FR_BF16, FR_I32, FR_U8, FR_DTYPE_COUNT } fr_dtype;
typedef enum { FR_CPU = 0, FR_CUDA, FR_DEVICE_COUNT } fr_device;

size_t fr_dtype_size(fr_dtype t);
/* f32, f16 or bf16: the dtypes activations, autocast and precision policies take. */
static inline bool fr_dtype_is_float(fr_dtype t) { return t == FR_F32 || t == FR_F16 || t == FR_BF16; }
const char *fr_dtype_name(fr_dtype t);
const char *fr_device_name(fr_device d);

/* Scalar conversions; f32 -> half rounds to nearest, ties to even, and keeps
 * inf/NaN. */
uint16_t fr_f32_to_f16(float f);
float fr_f16_to_f32(uint16_t h);
uint16_t fr_f32_to_bf16(float f);
float fr_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
