/* testlib.h: the tiny test runner and helpers shared by tests/test_*.c.
 *
 * A test program defines `static void test_x(void)` functions and a main that
 * calls RUN(test_x) for each and returns TEST_SUMMARY(). Every test runs with
 * a leak check: no tensor, storage or ledger byte may be alive at its end that
 * was not alive at its start, and the tape must be empty. The last line is
 * "N passed, N failed, N skipped"; tests/run_tests.sh adds these up. */
#ifndef FR_TESTLIB_H
#define FR_TESTLIB_H

#include <math.h>
#include <stdio.h>

#include "frugal.h"
#include "nn/safetensors.h"

extern int fr_t_failed_now;
extern const char *fr_t_skip_reason;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "    %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            fr_t_failed_now = 1;                                                     \
        }                                                                            \
    } while (0)

/* expr returns fr_status; fails the test (and prints the error) unless FR_OK */
#define CHECK_OK(expr)                                                                 \
    do {                                                                               \
        fr_status s_ = (expr);                                                         \
        if (s_ != FR_OK) {                                                             \
            fprintf(stderr, "    %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,    \
                    fr_status_name(s_), fr_last_error());                              \
            fr_t_failed_now = 1;                                                       \
        }                                                                              \
    } while (0)

/* a pointer that must not be NULL (prints the error otherwise) */
#define CHECK_NOTNULL(expr)                                                          \
    do {                                                                             \
        if (!(expr)) {                                                               \
            fprintf(stderr, "    %s:%d: %s is NULL: %s\n", __FILE__, __LINE__, #expr,  \
                    fr_last_error());                                                \
            fr_t_failed_now = 1;                                                     \
        }                                                                            \
    } while (0)

/* expr must fail with `code` and a message containing `needle` */
#define CHECK_ERR(expr, code, needle) \
    fr_t_check_err((expr), (code), (needle), #expr, __FILE__, __LINE__)

#define CHECK_CLOSE(a, b, tol)                                                           \
    do {                                                                                 \
        double a_ = (a), b_ = (b);                                                       \
        if (!(fabs(a_ - b_) <= (tol))) {                                                 \
            fprintf(stderr, "    %s:%d: %s = %.9g vs %s = %.9g (tol %g)\n", __FILE__, __LINE__, \
                    #a, a_, #b, b_, (double)(tol));                                      \
            fr_t_failed_now = 1;                                                         \
        }                                                                                \
    } while (0)

#define SKIP(reason)                 \
    do {                             \
        fr_t_skip_reason = (reason); \
        return;                      \
    } while (0)

#define RUN(fn) fr_t_run(#fn, fn)
#define TEST_SUMMARY() fr_t_summary()

void fr_t_run(const char *name, void (*fn)(void));
int fr_t_summary(void);
void fr_t_check_err(fr_status got, fr_status code, const char *needle, const char *expr,
                    const char *file, int line);
/* For functions returning a tensor that must be NULL with an error: releases
 * a non-NULL result and returns the last status (or FR_OK). */
fr_status fr_t_status_of(fr_tensor *t);

/* Deterministic values in [-1, 1) (uniform) from a seed. */
fr_tensor *fr_t_rand(fr_device dev, int ndim, const int64_t *shape, uint32_t seed);
void fr_t_fill_rand(float *x, size_t n, uint32_t seed);

/* Compares a tensor (any device) with expected host values elementwise:
 * |got - want| <= atol + rtol * |want|. Prints the worst element on failure. */
bool fr_t_allclose(const fr_tensor *got, const float *want, size_t n, double atol, double rtol,
                   const char *what);
/* Same against another tensor. */
bool fr_t_allclose_t(const fr_tensor *got, const fr_tensor *want, double atol, double rtol,
                     const char *what);

/* The committed fixture file tests/fixtures/<name>.safetensors (the folder can
 * be moved with FR_FIXTURES). NULL (and a failed test) if absent. */
fr_st_file *fr_t_fixture(const char *name);
/* A named tensor from a fixture on `dev`, tagged data. */
fr_tensor *fr_t_fixture_tensor(fr_st_file *f, const char *name, fr_device dev);

/* Fixture tensors named "<prefix>_<name>" (one file holds several cases). */
fr_tensor *fr_t_fixture_case(fr_st_file *f, const char *prefix, const char *name);
/* Compares `got` with the fixture tensor "<prefix>_<name>" (see fr_t_allclose). */
bool fr_t_fixture_expect(fr_st_file *f, const char *prefix, const char *name, const fr_tensor *got,
                         double atol, double rtol);

/* A fresh directory /tmp/fr_<tag>_XXXXXX (aborts the program if none can be
 * made: nothing can be tested then), and its recursive removal. */
const char *fr_t_make_tmpdir(const char *tag);
void fr_t_remove_tmpdir(const char *path);

/* Finite-difference check. `loss` builds a one-element tensor from the
 * current values of the inputs (grad mode does not matter). For each input
 * in `wrt` (CPU, f32), compares input->grad (already computed by the caller's
 * backward) with central differences at up to `max_points` elements.
 * |analytic - numeric| <= atol + rtol * |numeric|. */
typedef fr_tensor *(*fr_t_loss_fn)(void *ctx);
bool fr_t_gradcheck(fr_t_loss_fn loss, void *ctx, fr_tensor *const *wrt, int n_wrt, double eps,
                    double atol, double rtol, int max_points);

/* sum(y * r) for a fixed pseudo-random r of y's shape: a scalar whose gradient
 * with respect to y is r, so every element of y matters in a check. */
fr_tensor *fr_t_weighted_sum(fr_tensor *y, uint32_t seed);

/* Whether CUDA tests can run here (a CUDA build with a GPU). */
bool fr_t_have_cuda(void);

#endif
