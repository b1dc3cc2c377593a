/* cpu/gemm.c: row-major single-precision GEMM on the host, and the
 * per-channel bias kernels that go with linear and convolution layers.
 *
 * Two GEMMs. fr_cpu_gemm_serial, which the im2col and 1x1 convolutions call
 * on one thread per image or band, is oneDNN's sgemm on the AVX-512 class
 * (FR_HAVE_DNNL), else OpenBLAS's sgemm when the build has it
 * (FR_HAVE_CBLAS), else the built-in one (gemm.h names which).
 * fr_cpu_gemm, the kernel table's GEMM (linear layers), is always the
 * built-in one below, because its rows do not depend on how many there are:
 * an image's logits and input gradient are the same bits in any batch
 * (docs/ARCHITECTURE.md, "CPU convolution and GEMM"), which OpenBLAS's
 * sgemm and oneDNN's matmul do not give.
 *
 * Threading: OpenMP is frugal's only thread pool on the CPU. OpenBLAS is
 * switched to one thread on first use, and fr_cpu_gemm splits a large
 * product into column or row slabs, one serial built-in GEMM per OpenMP
 * thread. Two pools would fight: OpenBLAS's threads busy-wait after each
 * call while the OpenMP threads of the im2col around it want the same
 * cores, which measured 5-10x slower on the two cores here.
 *
 * The built-in GEMM is the classic blocking (K panels, packed strips of A
 * and B so the innermost loop streams contiguous memory, and a 6x16
 * register tile written with GCC vector extensions, with an FMA copy chosen
 * at load time). Slower than OpenBLAS on large products, never naive-slow. */
#include <omp.h>
#include <pthread.h>
#include <string.h>

#include "../tensor/kernels.h"
#include "../tensor/memory.h"
#include "gemm.h"
#include "threads.h"

#ifdef FR_HAVE_CBLAS
#include <cblas.h>
#endif
#ifdef FR_HAVE_DNNL
#include <dnnl.h>

#include "isa.h"
#endif

/* Below this many multiply-adds a product runs on one thread: splitting
 * costs more than it saves. */
#define GEMM_PARALLEL_MIN ((size_t)1 << 18)

/* Scales the (m, n) block at c (row stride ldc) by beta; beta == 0
 * overwrites, so NaN/inf already in c (uninitialised outputs) never leak into
 * the result, as in BLAS. */
static void scale_c(float *c, int ldc, int m, int n, float beta) {
    if (beta == 1.0f)
        return;
    for (int i = 0; i < m; i++) {
        float *row = c + (size_t)i * ldc;
        if (beta == 0.0f)
            memset(row, 0, (size_t)n * sizeof *row);
        else
            for (int j = 0; j < n; j++)
                row[j] *= beta;
    }
}

#ifdef FR_HAVE_DNNL
/* One product on the calling thread only: oneDNN's sgemm takes every
 * thread OpenMP offers when called outside an active parallel region (and
 * one inside one), and a product split over threads could sum in another
 * order; so outside one the offer is cut to one thread for the call. */
static fr_status dnnl_serial(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                             int m, int n, int k, bool trans_a, bool trans_b, float alpha,
                             float beta) {
    int outer = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (outer > 1)
        omp_set_num_threads(1);
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda,
                                  b, ldb, beta, c, ldc);
    if (outer > 1)
        omp_set_num_threads(outer);
    if (st != dnnl_success)
        return fr_error(st == dnnl_out_of_memory ? FR_ERR_OOM : FR_ERR_ARG,
                        "gemm: oneDNN's sgemm failed (status %d) for a (%d, %d, %d) product",
                        (int)st, m, n, k);
    return FR_OK;
}
#endif

#ifdef FR_HAVE_CBLAS

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { openblas_set_num_threads(1); }

/* OpenBLAS 0.3.21 takes a 128 MiB work buffer (plus a page) per calling
 * thread on that thread's first call, and retries forever when the system
 * refuses it: so each thread first checks that the space is there and turns
 * a refusal into the ledger's out-of-memory error. */
#define BLAS_BUFFER_BYTES (((size_t)128 << 20) + ((size_t)1 << 20))
static _Thread_local bool blas_buffer_checked;

/* OpenBLAS's sgemm on the calling thread (m, n, k > 0). */
static fr_status blas_serial(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                             int m, int n, int k, bool trans_a, bool trans_b, float alpha,
                             float beta) {
    pthread_once(&blas_once, blas_single_thread);
    if (!blas_buffer_checked) {
        FR_TRY(fr_mem_probe_host(BLAS_BUFFER_BYTES, "OpenBLAS's per-thread buffer"));
        blas_buffer_checked = true;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return FR_OK;
}

#endif

/* ---- the built-in GEMM ---- */

enum {
    GEMM_MR = 6,    /* rows of the register tile */
    GEMM_NR = 16,   /* columns of the register tile: two 8-float vectors */
    GEMM_KC = 256,  /* depth of a packed panel: a 16-column strip of B stays in L1 */
    GEMM_MC = 96,   /* rows of a packed A block: MC x KC floats = 96 KiB (L2) */
    GEMM_NC = 1024, /* columns of a packed B panel: KC x NC floats = 1 MiB (L2/L3) */
};

typedef float fr_v8 __attribute__((vector_size(32)));

/* A macro, not a function: an 8-float vector returned from a function
 * built for another target (the micro-kernel's FMA copy) changes the ABI. */
#define LOAD_V8(v, p) memcpy(&(v), (p), sizeof(fr_v8))

/* Packs rows [i0, i0+mc) and depth [p0, p0+kc) of op(A) into strips of MR
 * rows, each stored depth-major: strip[p * MR + i]. Rows past mc are zero,
 * so the micro-kernel never branches. */
static void pack_a(float *dst, const float *a, int lda, bool trans_a, int i0, int mc, int p0, int kc) {
    for (int is = 0; is < mc; is += GEMM_MR) {
        float *strip = dst + (size_t)is * kc;
        int rows = mc - is < GEMM_MR ? mc - is : GEMM_MR;
        if (rows < GEMM_MR)
            memset(strip, 0, (size_t)kc * GEMM_MR * sizeof *strip);
        for (int i = 0; i < rows; i++) {
            int row = i0 + is + i;
            if (trans_a) {
                const float *src = a + (size_t)p0 * lda + row; /* column `row` of A^T */
                for (int p = 0; p < kc; p++)
                    strip[p * GEMM_MR + i] = src[(size_t)p * lda];
            } else {
                const float *src = a + (size_t)row * lda + p0;
                for (int p = 0; p < kc; p++)
                    strip[p * GEMM_MR + i] = src[p];
            }
        }
    }
}

/* Packs depth [p0, p0+kc) and columns [j0, j0+nc) of op(B) into strips of
 * NR columns: strip[p * NR + j]; columns past nc are zero. */
static void pack_b(float *dst, const float *b, int ldb, bool trans_b, int j0, int nc, int p0, int kc) {
    for (int js = 0; js < nc; js += GEMM_NR) {
        float *strip = dst + (size_t)js * kc;
        int cols = nc - js < GEMM_NR ? nc - js : GEMM_NR;
        if (cols < GEMM_NR)
            memset(strip, 0, (size_t)kc * GEMM_NR * sizeof *strip);
        if (trans_b) {
            for (int j = 0; j < cols; j++) {
                const float *src = b + (size_t)(j0 + js + j) * ldb + p0;
                for (int p = 0; p < kc; p++)
                    strip[p * GEMM_NR + j] = src[p];
            }
        } else {
            for (int p = 0; p < kc; p++)
                memcpy(strip + p * GEMM_NR, b + (size_t)(p0 + p) * ldb + j0 + js,
                       (size_t)cols * sizeof *strip);
        }
    }
}

/* c(mr, nr) += alpha * strip_a * strip_b over depth kc. The twelve
 * accumulators are named variables so they stay in registers. Contraction
 * into FMA is allowed here (the -std=c11 default forbids it): it only drops
 * an intermediate rounding, as every BLAS does. Portable builds get an FMA
 * copy chosen at load time on CPUs that have FMA (without it, 8-float
 * vectors on SSE ran at 1 GFLOP/s here, against 8-60 with it). Every
 * element of C is the same chain of operations over k, whatever its row,
 * column or the product's size: that is what makes fr_cpu_gemm's rows
 * independent of the batch. */
#ifdef __clang__
#define GEMM_KERNEL_ATTRS __attribute__((target_clones("fma", "default")))
#else
#define GEMM_KERNEL_ATTRS __attribute__((optimize("fp-contract=fast"), target_clones("fma", "default")))
#endif
#define GEMM_ROW(i)                          \
    do {                                     \
        float a_ = pa[p * GEMM_MR + (i)];    \
        acc##i##0 += a_ * b0;                \
        acc##i##1 += a_ * b1;                \
    } while (0)

GEMM_KERNEL_ATTRS static void micro_kernel(int kc, const float *pa, const float *pb, float *c,
                                           int ldc, int mr, int nr, float alpha) {
#ifdef __clang__
#pragma clang fp contract(fast)
#endif
    fr_v8 acc00 = {0}, acc01 = {0}, acc10 = {0}, acc11 = {0}, acc20 = {0}, acc21 = {0};
    fr_v8 acc30 = {0}, acc31 = {0}, acc40 = {0}, acc41 = {0}, acc50 = {0}, acc51 = {0};
    for (int p = 0; p < kc; p++) {
        fr_v8 b0, b1;
        LOAD_V8(b0, pb + p * GEMM_NR);
        LOAD_V8(b1, pb + p * GEMM_NR + 8);
        GEMM_ROW(0);
        GEMM_ROW(1);
        GEMM_ROW(2);
        GEMM_ROW(3);
        GEMM_ROW(4);
        GEMM_ROW(5);
    }
    fr_v8 acc[GEMM_MR][2] = {{acc00, acc01}, {acc10, acc11}, {acc20, acc21},
                             {acc30, acc31}, {acc40, acc41}, {acc50, acc51}};
    float tile[GEMM_MR][GEMM_NR];
    memcpy(tile, acc, sizeof tile);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            c[(size_t)i * ldc + j] += alpha * tile[i][j];
}

static fr_status builtin_serial(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                                int m, int n, int k, bool trans_a, bool trans_b, float alpha,
                                float beta) {
    if (m <= 0 || n <= 0)
        return FR_OK;
    scale_c(c, ldc, m, n, beta);
    if (k <= 0 || alpha == 0.0f)
        return FR_OK;
    int kc_max = k < GEMM_KC ? k : GEMM_KC;
    int nc_max = (n < GEMM_NC ? n : GEMM_NC) + GEMM_NR; /* room for the zero-padded strip */
    size_t a_bytes = (size_t)(GEMM_MC + GEMM_MR) * kc_max * sizeof(float);
    size_t b_bytes = (size_t)nc_max * kc_max * sizeof(float);
    float *pa = fr_mem_alloc(FR_CPU, a_bytes, FR_TAG_WORKSPACE);
    float *pb = pa ? fr_mem_alloc(FR_CPU, b_bytes, FR_TAG_WORKSPACE) : NULL;
    if (!pb) {
        fr_mem_free(FR_CPU, pa, a_bytes, FR_TAG_WORKSPACE);
        return fr_last_status();
    }
    for (int j0 = 0; j0 < n; j0 += GEMM_NC) {
        int nc = n - j0 < GEMM_NC ? n - j0 : GEMM_NC;
        for (int p0 = 0; p0 < k; p0 += GEMM_KC) {
            int kc = k - p0 < GEMM_KC ? k - p0 : GEMM_KC;
            pack_b(pb, b, ldb, trans_b, j0, nc, p0, kc);
            for (int i0 = 0; i0 < m; i0 += GEMM_MC) {
                int mc = m - i0 < GEMM_MC ? m - i0 : GEMM_MC;
                pack_a(pa, a, lda, trans_a, i0, mc, p0, kc);
                for (int js = 0; js < nc; js += GEMM_NR)
                    for (int is = 0; is < mc; is += GEMM_MR)
                        micro_kernel(kc, pa + (size_t)is * kc, pb + (size_t)js * kc,
                                     c + (size_t)(i0 + is) * ldc + j0 + js, ldc,
                                     mc - is < GEMM_MR ? mc - is : GEMM_MR,
                                     nc - js < GEMM_NR ? nc - js : GEMM_NR, alpha);
            }
        }
    }
    fr_mem_free(FR_CPU, pa, a_bytes, FR_TAG_WORKSPACE);
    fr_mem_free(FR_CPU, pb, b_bytes, FR_TAG_WORKSPACE);
    return FR_OK;
}

/* ---- the serial GEMM: one choice per process ---- */

typedef fr_status (*serial_gemm)(float *c, int ldc, const float *a, int lda, const float *b,
                                 int ldb, int m, int n, int k, bool trans_a, bool trans_b,
                                 float alpha, float beta);

static pthread_once_t serial_once = PTHREAD_ONCE_INIT;
static serial_gemm serial_fn;
static const char *serial_name;

/* oneDNN's sgemm (its JIT avx512_core kernels) on the AVX-512 class: at
 * the shapes the im2col and 1x1 convolutions multiply (DenseNet's 1x1
 * layers, C x 48 x H*W per image; 3x3 bands of 256 columns) it ran 1.3-1.9x
 * OpenBLAS 0.3.21's SKYLAKEX kernels, one thread (docs/ARCHITECTURE.md,
 * "CPU convolution and GEMM"). Below AVX-512 (and under FR_CPU_ISA=avx2 or
 * baseline, or a refused FR_CPU_ISA) OpenBLAS stays: not measured against
 * it there; the built-in GEMM where the build has neither. */
static void choose_serial(void) {
#ifdef FR_HAVE_CBLAS
    serial_fn = blas_serial;
    serial_name = "openblas";
#else
    serial_fn = builtin_serial;
    serial_name = "builtin";
#endif
#ifdef FR_HAVE_DNNL
    fr_cpu_isa isa;
    if (fr_cpu_isa_get(&isa) == FR_OK && isa >= FR_ISA_AVX512) {
        serial_fn = dnnl_serial;
        serial_name = "onednn";
    }
#endif
}

const char *fr_cpu_gemm_serial_impl(void) {
    pthread_once(&serial_once, choose_serial);
    return serial_name;
}

fr_status fr_cpu_gemm_serial(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                             int m, int n, int k, bool trans_a, bool trans_b, float alpha,
                             float beta) {
    if (m <= 0 || n <= 0)
        return FR_OK;
    if (k <= 0) { /* BLAS rejects a zero leading dimension; the product is empty */
        scale_c(c, ldc, m, n, beta);
        return FR_OK;
    }
    pthread_once(&serial_once, choose_serial);
    return serial_fn(c, ldc, a, lda, b, ldb, m, n, k, trans_a, trans_b, alpha, beta);
}

/* Splits C into one slab per thread along its longer side (slab edges on
 * multiples of 16 so each slab keeps whole register tiles), each slab a
 * serial GEMM over the matching rows of op(A) or columns of op(B). */
fr_status fr_cpu_gemm(float *c, const float *a, const float *b, int m, int n, int k, bool trans_a,
                      bool trans_b, float alpha, float beta) {
    int lda = trans_a ? m : k, ldb = trans_b ? k : n;
    if (lda < 1)
        lda = 1;
    if (ldb < 1)
        ldb = 1;
    int threads = fr_cpu_threads();
    if (threads <= 1 || m <= 0 || n <= 0 || (size_t)m * n * (k > 0 ? k : 1) < GEMM_PARALLEL_MIN)
        return builtin_serial(c, n, a, lda, b, ldb, m, n, k, trans_a, trans_b, alpha, beta);
    bool split_n = n >= m;
    int len = split_n ? n : m;
    int slab = (len + threads - 1) / threads;
    slab = (slab + 15) / 16 * 16;
    int slabs = (len + slab - 1) / slab;
    fr_status failed = FR_OK;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < slabs; t++) {
        int start = t * slab, size = len - start < slab ? len - start : slab;
        fr_status st;
        if (split_n)
            st = builtin_serial(c + start, n, a, lda, trans_b ? b + (size_t)start * ldb : b + start,
                                    ldb, m, size, k, trans_a, trans_b, alpha, beta);
        else
            st = builtin_serial(c + (size_t)start * n, n,
                                    trans_a ? a + start : a + (size_t)start * lda, lda, b, ldb, size,
                                    n, k, trans_a, trans_b, alpha, beta);
        if (st != FR_OK) {
#pragma omp atomic write
            failed = st;
        }
    }
    if (failed != FR_OK)
        return fr_error(failed, "gemm: out of memory for the packing buffers of a (%d, %d, %d) product",
                        m, n, k);
    return FR_OK;
}

fr_status fr_cpu_bias_add(float *y, const float *b, int n, int c, int hw) {
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)n * c * hw > 32768)
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++) {
            float *row = y + ((size_t)i * c + ch) * hw; // (HW)
            float v = b[ch];
            for (int j = 0; j < hw; j++)
                row[j] += v;
        }
    return FR_OK;
}

/* Sums in double: a bias gradient adds N*HW terms (65536 for a CIFAR batch),
 * where float accumulation would lose digits PyTorch keeps. */
fr_status fr_cpu_bias_grad(float *db, const float *dy, int n, int c, int hw) {
#pragma omp parallel for schedule(static) if ((size_t)n * c * hw > 32768)
    for (int ch = 0; ch < c; ch++) {
        double total = 0.0;
        for (int i = 0; i < n; i++) {
            const float *row = dy + ((size_t)i * c + ch) * hw; // (HW)
            for (int j = 0; j < hw; j++)
                total += row[j];
        }
        db[ch] = (float)total;
    }
    return FR_OK;
}
