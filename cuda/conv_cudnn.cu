/* conv_cudnn.cu: 2-d convolution (groups = 1, NCHW, f32) through cuDNN 9's
 * convolution API (cudnn_cnn.h); conv.cu dispatches here first and runs its
 * im2col + cuBLAS path when this file declines.
 *
 * Plans. The first call for a shape (an fr_conv_shape, batch size aside)
 * creates its four descriptors; the first call of each direction (forward, backward-data,
 * backward-filter) benchmarks cuDNN's algorithms with cudnnFind*AlgorithmEx
 * on the call's own buffers and a workspace from our allocator (the plain
 * Find variants would cudaMalloc behind the ledger). The usable algorithms,
 * fastest first, are kept in the plan; later calls look the plan up and run.
 * A plan serves every batch size: a call with another batch than the last
 * re-sets the x and y descriptors and asks each kept algorithm its
 * workspace again (an algorithm that does not apply at that batch is
 * skipped), so a DenseNet's last, smaller batch or validation's batch costs
 * no second Find per layer; the ranking is the one Find made at the first
 * batch.
 * Usable means: it succeeded; it is deterministic (the same inputs give the
 * same bits, like the rest of the backend; Find's timings may still pick
 * another algorithm in another process); it does not use tensor-op math (the
 * descriptor asks for CUDNN_FMA_MATH, since TF32 would break agreement with
 * the CPU path); its workspace is within the budget.
 *
 * Workspace. Allocated per call through fr_mem_alloc(FR_CUDA, ...,
 * FR_TAG_WORKSPACE) and freed before return, so the ledger shows it as
 * workspace while a convolution runs and 0 between them. The caching
 * allocator hands the same block to the next layer's convolution: that is
 * how one workspace is shared across layers without a buffer held for the
 * whole run. When the fastest algorithm's workspace cannot be had (a memory
 * limit, a full device) the next one is tried, down to those needing none;
 * when none is left the call goes to im2col, which chunks its own workspace
 * down to one image. Find is given as much workspace as the hungriest
 * algorithm asks for, capped by the budget and halved while it cannot be
 * allocated: the choice is made once, under the memory conditions of the
 * first call of the shape (fr_cuda_set_workspace_budget makes it again).
 *
 * A shape cuDNN refuses (setup fails, or Find fails or leaves no usable
 * algorithm) is remembered and always goes to im2col. A chosen algorithm
 * that fails when run (a cuDNN 9 engine is loaded lazily, and a wheel
 * install can lack its library; an engine can reject a shape only at run
 * time) is dropped from the plan with a note on stderr, and the next one is
 * tried, then im2col: a slower convolution, never a wrong one. A device in
 * an error state (a kernel faulted) is not a failed algorithm: that error is
 * returned (FR_ERR_CUDA).
 *
 * One mutex guards the table, the settings and the cuDNN handle, and is held
 * for the whole call: a cuDNN handle is for one thread at a time, and every
 * convolution runs on the one stream anyway. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DEFAULT_BUDGET ((size_t)256 << 20)
#define MIN_FIND_WS ((size_t)64 << 10) /* below this, halving gives up: Find gets none */
#define MAX_CANDIDATES 8
#define MAX_RESULTS 8 /* the largest of the three *_ALGO_COUNTs */

FR_STATIC_ASSERT(CUDNN_CONVOLUTION_FWD_ALGO_COUNT <= MAX_RESULTS &&
                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT <= MAX_RESULTS &&
                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT <= MAX_RESULTS,
                 "MAX_RESULTS must hold every algorithm of a direction");
/* Shapes are compared with memcmp: only ints, so no padding bytes. */
FR_STATIC_ASSERT(sizeof(fr_conv_shape) == 13 * sizeof(int), "fr_conv_shape must be 13 ints");

typedef enum { FWD = 0, BWD_DATA, BWD_FILTER, N_DIRS } direction;

typedef struct {
    int algo;
    size_t ws; /* workspace bytes it needs */
} candidate;

typedef struct {
    bool searched;
    int n;     /* 0 after a search: im2col for this direction */
    int batch; /* the batch size the candidates' ws are for */
    candidate c[MAX_CANDIDATES];
} choice;

typedef struct {
    fr_conv_shape shape;
    bool broken; /* setup failed: always im2col */
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    choice dir[N_DIRS];
} plan;

/* One Find result, whatever the direction's perf struct. */
typedef struct {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
} result;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static bool enabled = true;
static size_t budget = DEFAULT_BUDGET;
static plan **plans; /* a few hundred shapes at most (DenseNet): a linear search is enough */
static int n_plans, cap_plans;
static size_t n_cudnn_calls, n_im2col_calls;

static void read_env(void) {
    const char *v = getenv("FR_CUDNN");
    if (v && strcmp(v, "0") == 0)
        enabled = false;
}

/* ---- plans (lock held) ---- */

static void plan_release_descriptors(plan *p) {
    /* Teardown after a failed setup: a failure to destroy leaves nothing to do. */
    if (p->x)
        (void)cudnnDestroyTensorDescriptor(p->x);
    if (p->y)
        (void)cudnnDestroyTensorDescriptor(p->y);
    if (p->w)
        (void)cudnnDestroyFilterDescriptor(p->w);
    if (p->conv)
        (void)cudnnDestroyConvolutionDescriptor(p->conv);
    p->x = p->y = NULL;
    p->w = NULL;
    p->conv = NULL;
}

static fr_status plan_setup(plan *p) {
    const fr_conv_shape *s = &p->shape;
    FR_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
    FR_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s->n, s->c,
                                              s->h, s->w));
    FR_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
    FR_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s->n, s->k,
                                              s->oh, s->ow));
    FR_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
    int g = fr_conv_groups(s), d = fr_conv_dilation(s);
    /* a grouped filter is described per group: (K, C/groups, R, S) */
    FR_CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s->k,
                                              s->c / g, s->r, s->s));
    FR_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
    /* cross-correlation, as PyTorch and the CPU kernels compute */
    FR_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p->conv, s->pad, s->pad, s->stride, s->stride, d,
                                                   d, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    FR_CUDNN_CHECK(cudnnSetConvolutionGroupCount(p->conv, g));
    FR_CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, CUDNN_FMA_MATH));
    int n = 0, k = 0, oh = 0, ow = 0;
    FR_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n, &k, &oh, &ow));
    if (n != s->n || k != s->k || oh != s->oh || ow != s->ow)
        return fr_error(FR_ERR_SHAPE, "cudnn conv: cuDNN's output (%d, %d, %d, %d) is not frugal's "
                        "(%d, %d, %d, %d)", n, k, oh, ow, s->n, s->k, s->oh, s->ow);
    return FR_OK;
}

/* The plan of s's shape, whatever the batch size its descriptors hold now. */
static plan *plan_find(const fr_conv_shape *s) {
    for (int i = 0; i < n_plans; i++) {
        fr_conv_shape key = *s;
        key.n = plans[i]->shape.n;
        if (memcmp(&plans[i]->shape, &key, sizeof key) == 0)
            return plans[i];
    }
    return NULL;
}

/* Points p's x and y descriptors at batch n. Until both are set the plan
 * holds no batch (-1), so a failure halfway is set again on the next call. */
static fr_status plan_set_batch(plan *p, int n) {
    const fr_conv_shape *s = &p->shape;
    p->shape.n = -1;
    FR_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, s->c,
                                              s->h, s->w));
    FR_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, s->k,
                                              s->oh, s->ow));
    p->shape.n = n;
    return FR_OK;
}

/* A new plan in the table (marked broken when cuDNN refuses the shape), or
 * NULL with FR_ERR_OOM when the host is out of memory. */
static plan *plan_new(const fr_conv_shape *s) {
    if (n_plans == cap_plans) {
        int cap = cap_plans ? 2 * cap_plans : 32;
        plan **t = (plan **)realloc(plans, (size_t)cap * sizeof *t);
        if (!t) {
            fr_error(FR_ERR_OOM, "cudnn conv: out of host memory for the plan table");
            return NULL;
        }
        plans = t;
        cap_plans = cap;
    }
    plan *p = (plan *)calloc(1, sizeof *p);
    if (!p) {
        fr_error(FR_ERR_OOM, "cudnn conv: out of host memory for a plan");
        return NULL;
    }
    p->shape = *s;
    if (plan_setup(p) != FR_OK) {
        plan_release_descriptors(p);
        p->broken = true;
    }
    plans[n_plans++] = p;
    return p;
}

/* ---- algorithm choice (lock held) ---- */

static int algo_count(direction d) {
    switch (d) {
    case FWD:
        return (int)CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case BWD_DATA:
        return (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    default:
        return (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
    }
}

/* The workspace `algo` needs for this plan. A status other than success means
 * the algorithm does not apply to the shape: the callers skip it. */
static cudnnStatus_t ws_size(cudnnHandle_t h, const plan *p, direction d, int algo, size_t *out) {
    *out = 0;
    switch (d) {
    case FWD:
        return cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv, p->y,
                                                       (cudnnConvolutionFwdAlgo_t)algo, out);
    case BWD_DATA:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->y, p->conv, p->x,
                                                            (cudnnConvolutionBwdDataAlgo_t)algo, out);
    default:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, p->x, p->y, p->conv, p->w, (cudnnConvolutionBwdFilterAlgo_t)algo, out);
    }
}

template <typename Perf>
static int to_results(result *out, const Perf *perf, int n) {
    for (int i = 0; i < n; i++)
        out[i] = result{(int)perf[i].algo, perf[i].status, perf[i].memory, perf[i].determinism,
                        perf[i].mathType};
    return n;
}

/* Runs cuDNN's benchmark for direction d on the call's buffers (out is
 * written, then overwritten by the real call). Buffers as in fr_cudnn_conv2d_*:
 * forward (y; x, w), data (dx; dy, w), filter (dw; dy, x). */
static fr_status find(result *res, int *n_res, cudnnHandle_t h, const plan *p, direction d,
                      float *out, const float *a, const float *b, void *ws, size_t ws_bytes) {
    int got = 0;
    switch (d) {
    case FWD: {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        FR_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
            h, p->x, a, p->w, b, p->conv, p->y, out, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf,
            ws, ws_bytes));
        *n_res = to_results(res, perf, got);
        return FR_OK;
    }
    case BWD_DATA: {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        FR_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
            h, p->w, b, p->y, a, p->conv, p->x, out, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got,
            perf, ws, ws_bytes));
        *n_res = to_results(res, perf, got);
        return FR_OK;
    }
    default: {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        FR_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            h, p->x, b, p->y, a, p->conv, p->w, out, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got,
            perf, ws, ws_bytes));
        *n_res = to_results(res, perf, got);
        return FR_OK;
    }
    }
}

/* Keeps the usable results (see the top of the file), in Find's order:
 * fastest first. */
static void choose(choice *ch, const result *res, int n, cudnnHandle_t h, const plan *p,
                   direction d) {
    ch->n = 0;
    for (int i = 0; i < n && ch->n < MAX_CANDIDATES; i++) {
        const result *r = &res[i];
        if (r->status != CUDNN_STATUS_SUCCESS || r->determinism != CUDNN_DETERMINISTIC ||
            r->math == CUDNN_TENSOR_OP_MATH || r->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
            continue;
        /* Find's figure and the query's may differ; the larger is safe. */
        size_t need = 0;
        if (ws_size(h, p, d, r->algo, &need) != CUDNN_STATUS_SUCCESS)
            continue;
        if (r->memory > need)
            need = r->memory;
        if (need > budget)
            continue;
        ch->c[ch->n].algo = r->algo;
        ch->c[ch->n].ws = need;
        ch->n++;
    }
    ch->batch = p->shape.n;
}

/* The kept algorithms' workspace at the plan's current batch; those that do
 * not apply there get SIZE_MAX (over any budget: skipped). */
static void requery_ws(choice *ch, cudnnHandle_t h, const plan *p, direction d) {
    for (int i = 0; i < ch->n; i++) {
        size_t need = 0;
        ch->c[i].ws = ws_size(h, p, d, ch->c[i].algo, &need) == CUDNN_STATUS_SUCCESS ? need : SIZE_MAX;
    }
    ch->batch = p->shape.n;
}

/* Fills p->dir[d]: Find with as much workspace as any algorithm wants (at
 * most the budget), halved while it cannot be allocated. */
static fr_status search(cudnnHandle_t h, plan *p, direction d, float *out, const float *a,
                        const float *b) {
    size_t want = 0;
    for (int algo = 0; algo < algo_count(d); algo++) {
        size_t sz = 0;
        if (ws_size(h, p, d, algo, &sz) == CUDNN_STATUS_SUCCESS && sz > want)
            want = sz;
    }
    if (want > budget)
        want = budget;
    void *ws = NULL;
    size_t bytes = want;
    while (bytes > 0 && !(ws = fr_mem_alloc(FR_CUDA, bytes, FR_TAG_WORKSPACE)))
        bytes = bytes > MIN_FIND_WS ? bytes / 2 : 0;
    result res[MAX_RESULTS];
    int n = 0;
    fr_status st = find(res, &n, h, p, d, out, a, b, ws, bytes);
    fr_mem_free(FR_CUDA, ws, bytes, FR_TAG_WORKSPACE);
    if (st == FR_OK)
        choose(&p->dir[d], res, n, h, p, d);
    return st;
}

/* ---- running (lock held) ---- */

static fr_status execute(cudnnHandle_t h, const plan *p, direction d, int algo, float *out,
                         const float *a, const float *b, void *ws, size_t ws_bytes) {
    /* beta = 0: every output is overwritten and never read (bwd_weight
     * included, as the CPU kernel does), so stale NaNs cannot leak in. */
    const float one = 1.0f, zero = 0.0f;
    switch (d) {
    case FWD:
        FR_CUDNN_CHECK(cudnnConvolutionForward(h, &one, p->x, a, p->w, b, p->conv,
                                               (cudnnConvolutionFwdAlgo_t)algo, ws, ws_bytes, &zero,
                                               p->y, out));
        return FR_OK;
    case BWD_DATA:
        FR_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p->w, b, p->y, a, p->conv,
                                                    (cudnnConvolutionBwdDataAlgo_t)algo, ws,
                                                    ws_bytes, &zero, p->x, out));
        return FR_OK;
    default:
        FR_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p->x, b, p->y, a, p->conv,
                                                      (cudnnConvolutionBwdFilterAlgo_t)algo, ws,
                                                      ws_bytes, &zero, p->w, out));
        return FR_OK;
    }
}

/* Whether cuDNN may be asked at all: every extent at least 1 (im2col handles
 * the empty cases), element counts in int range (cuDNN's descriptors take
 * ints), and 16-byte aligned buffers (what vectorised algorithms assume; our
 * allocator gives 512, only a view at an odd offset is less). */
static bool worth_trying(const fr_conv_shape *s, const void *out, const void *a, const void *b) {
    if (s->n < 1 || s->c < 1 || s->h < 1 || s->w < 1 || s->k < 1 || s->r < 1 || s->s < 1 ||
        s->oh < 1 || s->ow < 1 || s->stride < 1 || s->pad < 0)
        return false;
    size_t x_elems = (size_t)s->n * s->c * s->h * s->w, y_elems = (size_t)s->n * s->k * s->oh * s->ow;
    size_t w_elems = (size_t)s->k * s->c * s->r * s->s;
    if (x_elems > INT32_MAX || y_elems > INT32_MAX || w_elems > INT32_MAX)
        return false;
    return (((uintptr_t)out | (uintptr_t)a | (uintptr_t)b) & 15) == 0;
}

static const char *dir_name(direction d) {
    return d == FWD ? "forward" : d == BWD_DATA ? "backward-data" : "backward-filter";
}

static fr_status conv_locked(direction d, float *out, const float *a, const float *b,
                             const fr_conv_shape *s, bool *ran) {
    *ran = false;
    if (!enabled || !worth_trying(s, out, a, b))
        return FR_OK;
    cudnnHandle_t h;
    if (fr_cuda_cudnn(&h) != FR_OK)
        return FR_OK; /* no usable cuDNN in this process: im2col */
    plan *p = plan_find(s);
    if (!p && !(p = plan_new(s)))
        return fr_last_status();
    if (p->broken)
        return FR_OK;
    if (p->shape.n != s->n && plan_set_batch(p, s->n) != FR_OK) {
        /* cuDNN refuses this batch: this call goes to im2col; the
         * descriptors are set again on the next call */
        fr_clear_error();
        return FR_OK;
    }
    choice *ch = &p->dir[d];
    if (ch->searched && ch->batch != s->n)
        requery_ws(ch, h, p, d);
    if (!ch->searched) {
        ch->searched = true;
        if (search(h, p, d, out, a, b) != FR_OK)
            ch->n = 0; /* cuDNN could not benchmark this direction: im2col from now on */
    }
    for (int i = 0; i < ch->n; i++) {
        candidate c = ch->c[i];
        void *ws = NULL;
        if (c.ws > budget || (c.ws > 0 && !(ws = fr_mem_alloc(FR_CUDA, c.ws, FR_TAG_WORKSPACE))))
            continue; /* a slower algorithm needing less may still fit */
        fr_status st = execute(h, p, d, c.algo, out, a, b, ws, c.ws);
        fr_mem_free(FR_CUDA, ws, c.ws, FR_TAG_WORKSPACE);
        if (st == FR_OK) {
            *ran = true;
            return FR_OK;
        }
        /* cudaStreamQuery returns a sticky error, else success or not-ready */
        cudaError_t dev = cudaStreamQuery(0);
        if (dev != cudaSuccess && dev != cudaErrorNotReady)
            return st;
        fprintf(stderr, "frugal: cudnn conv: %s algorithm %d failed for (n %d, c %d, %dx%d, k %d, "
                "%dx%d): %s; using the next one\n", dir_name(d), c.algo, s->n, s->c, s->h, s->w,
                s->k, s->r, s->s, fr_last_error());
        fr_clear_error();
        memmove(&ch->c[i], &ch->c[i + 1], (size_t)(ch->n - i - 1) * sizeof ch->c[0]);
        ch->n--;
        i--;
    }
    return FR_OK;
}

static fr_status conv(direction d, float *out, const float *a, const float *b,
                      const fr_conv_shape *s, bool *ran) {
    pthread_once(&env_once, read_env);
    pthread_mutex_lock(&lock);
    fr_status st = conv_locked(d, out, a, b, s, ran);
    if (st == FR_OK && *ran)
        n_cudnn_calls++;
    else if (st == FR_OK)
        n_im2col_calls++;
    pthread_mutex_unlock(&lock);
    return st;
}

/* ---- internal.h ---- */

fr_status fr_cudnn_conv2d_forward(float *y, const float *x, const float *w, const fr_conv_shape *s,
                              bool *ran) {
    return conv(FWD, y, x, w, s, ran);
}

fr_status fr_cudnn_conv2d_backward_data(float *dx, const float *dy, const float *w,
                                   const fr_conv_shape *s, bool *ran) {
    return conv(BWD_DATA, dx, dy, w, s, ran);
}

fr_status fr_cudnn_conv2d_backward_weight(float *dw, const float *dy, const float *x,
                                     const fr_conv_shape *s, bool *ran) {
    return conv(BWD_FILTER, dw, dy, x, s, ran);
}

/* ---- fr_cuda.h ---- */

extern "C" void fr_cuda_set_cudnn(bool on) {
    pthread_once(&env_once, read_env);
    pthread_mutex_lock(&lock);
    enabled = on;
    pthread_mutex_unlock(&lock);
}

extern "C" bool fr_cuda_cudnn_enabled(void) {
    pthread_once(&env_once, read_env);
    pthread_mutex_lock(&lock);
    bool on = enabled;
    pthread_mutex_unlock(&lock);
    return on;
}

extern "C" void fr_cuda_set_workspace_budget(size_t bytes) {
    pthread_mutex_lock(&lock);
    if (bytes != budget) {
        budget = bytes;
        /* The choices were filtered by the old budget: search again. */
        for (int i = 0; i < n_plans; i++)
            memset(plans[i]->dir, 0, sizeof plans[i]->dir);
    }
    pthread_mutex_unlock(&lock);
}

extern "C" size_t fr_cuda_workspace_budget(void) {
    pthread_mutex_lock(&lock);
    size_t b = budget;
    pthread_mutex_unlock(&lock);
    return b;
}

extern "C" void fr_cuda_conv_counts(size_t *cudnn_calls, size_t *im2col_calls) {
    pthread_mutex_lock(&lock);
    if (cudnn_calls)
        *cudnn_calls = n_cudnn_calls;
    if (im2col_calls)
        *im2col_calls = n_im2col_calls;
    pthread_mutex_unlock(&lock);
}
