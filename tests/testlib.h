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

/* Both header tiers, and the internals tests reach into: the layer structs,
 * the segment splitter and the programs' own helpers. */
#include "ext.h"
#include "io/safetensors.h"
#include "nn/layers.h"
#include "nn/model.h"
#include "nn/seg_split.h"
#include "programs/cli_impl.h"

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
/* The caching allocator's reuse on `dev`: the k (<= 16) sizes allocated and
 * freed once to fill the cache, then `rounds` times more, checking that the
 * repeats make no system allocation and reserve nothing more, that reserved
 * stays >= the bytes in use, and that two 0-byte requests get distinct
 * pointers. On the CPU each block is also checked 64-byte aligned and
 * written in full. */
void fr_t_check_allocator_reuse(fr_device dev, const size_t *sizes, int k, int rounds);
/* One training step of m on (x, y): forward, cross-entropy, backward,
 * optimizer step, gradients zeroed. Returns the loss (NaN, with the test
 * failed, when a part of it fails). */
float fr_t_train_step(fr_model *m, fr_optim *opt, fr_tensor *x, fr_tensor *y);
bool fr_t_have_cuda(void);

/* Skips the test unless CUDA tests can run here (see fr_t_have_cuda). */
#define NEED_CUDA()                 \
    do {                            \
        if (!fr_t_have_cuda())      \
            SKIP("no CUDA device"); \
    } while (0)

/* ---- CPU/CUDA pairs (test_cuda*.c) ---- */

/* One tensor on each device with the same values. */
typedef struct {
    fr_tensor *c, *g;
} fr_t_pair;

/* cpu (owned by the pair) and a copy of it on CUDA. */
fr_t_pair fr_t_pair_of(fr_tensor *cpu);
/* fr_t_rand values on both devices. */
fr_t_pair fr_t_pair_rand(int ndim, const int64_t *shape, uint32_t seed);
/* Uninitialised f32, tagged transient. */
fr_t_pair fr_t_pair_empty(int ndim, const int64_t *shape);
void fr_t_pair_free(fr_t_pair *p);
/* The CUDA side against the CPU side (see fr_t_allclose). */
void fr_t_pair_check(fr_t_pair p, double atol, double rtol, const char *what);
#define PR_RAND(seed, ...) fr_t_pair_rand(FR_NDIM(__VA_ARGS__), FR_SHAPE(__VA_ARGS__), (seed))
#define PR_EMPTY(...) fr_t_pair_empty(FR_NDIM(__VA_ARGS__), FR_SHAPE(__VA_ARGS__))

/* ---- whole models ---- */

/* Compares a registry with "name:d0,d1;..." (PyTorch's state_dict order, as
 * the fixture generators' describe() writes it): names, shapes, and which
 * entries are buffers (running statistics, counters: no gradient). */
void fr_t_check_state_dict(const fr_params *p, const char *described, const char *model);

/* A gradient against PyTorch's, per tensor: |got - want| <= tol * max|want|
 * + tol * |want| (relative, with a floor scaled to the tensor: a gradient
 * summed over the batch can cancel to near zero in one element while its
 * neighbours are large). Fails the test if either is missing. */
void fr_t_check_grad(const fr_tensor *got, const fr_tensor *want, double tol, const char *what);

/* One step against a fixture of gen_resnet.py / gen_densenet.py's run: its
 * "input" and "labels" through m in eval mode under no_grad ("logits_eval"),
 * then in train mode ("logits_train"), cross-entropy ("loss"), each
 * |got - want| <= atol + rtol |want|; then backward, after which nothing is
 * left saved. The gradients and running statistics are left for the caller
 * to compare. */
void fr_t_step_vs_fixture(fr_model *m, fr_st_file *f, double atol, double rtol);

/* A copy of the f32 entries of m's registry (one malloc'd array per entry,
 * NULL for the others), to restore the same weights before each run. */
float **fr_t_snapshot_save(const fr_model *m);
void fr_t_snapshot_restore(const fr_model *m, float **snap);
void fr_t_snapshot_free(const fr_model *m, float **snap);

/* One training step of a model (forward, cross-entropy, backward; no
 * optimizer step) and what it cost. */
typedef struct {
    float loss;
    float **values;           /* per registry entry: its gradient (parameters) or its
                                 value after the step (f32 buffers); NULL where none */
    size_t forward_allocs;    /* allocations the forward made */
    size_t forward_transient; /* peak of in-flight activations in the forward */
    size_t saved_forward;     /* FR_TAG_SAVED when the logits are out */
    size_t saved_loss;        /* ... and after the loss */
    size_t peak_saved;        /* FR_TAG_SAVED over the step */
    size_t peak_total;        /* all bytes over the step, above its start */
} fr_t_step;

/* Visits each node of the tape behind t once (a bounded walk, 4096 nodes),
 * in breadth-first order from t's grad_fn, until visit returns true;
 * returns whether it did. */
bool fr_t_tape_any(const fr_tensor *t, bool (*visit)(const fr_node *node, void *ctx), void *ctx);

/* Runs one step under `strategy` (fr_strategy_parse's text), from the
 * weights in `init` (fr_t_snapshot_save's, restored first) or, if NULL, as they
 * are; gradients are copied out, then zeroed. The loss is fr_model_loss's:
 * m->loss when the model has one (an autoencoder), else cross-entropy. */
fr_t_step fr_t_model_step(fr_model *m, const char *strategy, float **init, fr_tensor *x,
                          fr_tensor *labels);
/* The loss given and m's gradients / f32 buffers as they are now (the values
 * of fr_t_model_step, for a step run by hand); nothing is zeroed. */
fr_t_step fr_t_step_capture(const fr_model *m, float loss);
void fr_t_step_free(fr_t_step *r, int n);
/* All gradients of the parameters whose name starts with `prefix` ("" for
 * all) as one vector: |got - ref| / |ref|. INFINITY when a parameter has a
 * gradient in one step and not the other, or ref's are all zero. */
double fr_t_grad_rel_error(const fr_model *m, const fr_t_step *ref, const fr_t_step *got,
                           const char *prefix);
/* got against ref: tol < 0 bit-identical (loss and every value); else
 * |a - b| <= tol * (1 + max |ref|) per tensor and for the loss. Every
 * parameter must have a gradient in both. */
void fr_t_compare_steps(const fr_model *m, const fr_t_step *ref, const fr_t_step *got, double tol,
                        const char *what);
/* Each of strategies[0..n) against ref_strategy, one step each from `init`
 * with the random stream seeded `seed` before every step (the same dropout
 * masks): fr_t_compare_steps at tol, and fewer saved bytes: tol < 0 (a
 * function-preserving strategy against plain) at most ref's, below it when
 * the strategy checkpoints; else (abn against abn_reference) below ref's. */
void fr_t_check_strategies(fr_model *m, float **init, fr_tensor *x, fr_tensor *labels,
                           const char *ref_strategy, const char *const *strategies, int n,
                           double tol, uint64_t seed);

/* ---- files ---- */
/* The whole file, malloc'd and NUL-terminated (its length into *len when len
 * is not NULL), or NULL if it cannot be read. */
char *fr_t_read_file(const char *path, size_t *len);
/* Writes n bytes to path (created or truncated); whether all were written. */
bool fr_t_write_file(const char *path, const void *b, size_t n);
/* Takes FR_ST_CHECKSUM_KEY out of the safetensors file `path` (written by
 * fr_st_writer: the field is last in its __metadata__), as a frugal from
 * before checksums would have written it, so that a test that edits the
 * file reaches the check it means (a value's range, say) instead of the
 * checksum's. The header keeps its length (spaces after its closing brace).
 * True also when the file has no such field; false when it cannot be read
 * or written. */
bool fr_t_st_unseal(const char *path);
/* Flips the low bit of byte `at` of tensor `name`'s data in the safetensors
 * file `path` (written by fr_st_writer), as a bad disk or copy would; false
 * when the file, the tensor or the byte is not there. */
bool fr_t_st_flip(const char *path, const char *name, size_t at);

/* ---- the example programs (build/examples/<prog>, the build folder being
 * the one above the running test's) ---- */
/* Runs `<prefix> timeout 300 <build>/examples/<prog> <args> 2>&1` through
 * the shell, its output (truncated to len - 1) into out; the exit status,
 * 124 on the timeout, or -1. */
int fr_t_run_example(const char *prefix, const char *prog, const char *args, char *out, size_t len);
/* Whether <build>/examples/<prog> is there. */
bool fr_t_have_example(const char *prog);
/* Whether the three programs (train, validate, memreport) are all there. */
bool fr_t_have_programs(void);
/* The program must fail, not time out, with n1 and n2 (NULL: none) in its
 * output; else the test fails, printing the output. */
void fr_t_example_fails(const char *prog, const char *args, const char *n1, const char *n2);

/* max |a - b| over max |ref| (f32 tensors of one size): the error relative to the
 * tensor's scale, which stays meaningful for sums of thousands of products
 * (an element near 0 can lose every digit to round-off); NaN when a has one. */
double fr_t_scaled_diff(const fr_tensor *a, const fr_tensor *ref);
/* a and b hold the same bytes (same element count and dtype) */
bool fr_t_same_bits(const fr_tensor *a, const fr_tensor *b);
/* Runs the program `self` again as a child with environment variable `name`
 * set to `value` and arguments argv (NULL-terminated, argv[0] first); its
 * exit status, -1 when it could not run or did not exit. */
int fr_t_run_self(const char *self, const char *name, const char *value, char *const argv[]);
/* One unit in the last place of a half format at 1.0 (f16 2^-10, bf16
 * 2^-7): the scale of the half-precision tests' tolerances. */
double fr_t_half_ulp(fr_dtype dt);
/* t converted to dt (a new tensor; the test fails if that fails). */
fr_tensor *fr_t_as(const fr_tensor *t, fr_dtype dt);
/* t's values rounded to dt, in place (t stays f32): inputs an f32 and a
 * half run can share exactly. */
void fr_t_round_to(fr_tensor *t, fr_dtype dt);
/* An uninitialised transient tensor of like's shape and device, in dt. */
fr_tensor *fr_t_empty_as(const fr_tensor *like, fr_dtype dt);
/* Fails the test when `bad` of n elements of got were off against ref,
 * printing `what`, the dtype and the first one off. */
void fr_t_report_off(const char *what, fr_dtype dt, size_t bad, size_t n, size_t first, const float *got,
                     const float *ref);
/* Runs backward from `loss` (NULL: a failure already reported; nothing
 * runs) and returns the CPU ledger's peak during it above the total held
 * just before: what a backward needs beyond what the forward left. */
size_t fr_t_backward_peak(fr_tensor *loss);
/* Runs a program's main in this process (programs/programs.h: fr_train_main
 * and the others, on models this test registered) from a command line split
 * at spaces; its exit status. */
int fr_t_run_main(int (*prog)(int, char **), const char *line);

#endif
