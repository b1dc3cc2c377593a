/* test_gemm_serial.c: the GEMM the im2col and 1x1 convolutions call on one
 * thread per image or band (fr_cpu_gemm_serial, cpu/gemm.c). On the AVX-512
 * class with oneDNN built in it is oneDNN's sgemm, else OpenBLAS's (or the
 * built-in one); whichever runs must match the built-in GEMM within 1e-5 of
 * the largest value, overwrite a NaN-filled output when beta is 0, add to it
 * when beta is 1, and give the same bits inside and outside a parallel
 * region whatever the team size (oneDNN's sgemm would take every thread
 * outside one), leaving the caller's thread count as it was. The library is
 * chosen by the class FR_CPU_ISA forces, checked in a child process per
 * class. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "cpu/conv.h"
#include "cpu/gemm.h"
#include "cpu/isa.h"
#include "tensor/kernels.h"

static const char *self_path;

/* The library the rule names for a class (cpu/gemm.c, docs/ARCHITECTURE.md). */
static const char *expected_impl(fr_cpu_isa isa) {
    if (fr_cpu_have_dnnl() && isa >= FR_ISA_AVX512)
        return "onednn";
    return FR_CONFIG_CBLAS ? "openblas" : "builtin";
}

typedef struct {
    int m, n, k;
    bool ta, tb;
} prod;

/* DenseNet-BC-100's 1x1 layers per image (forward 48 x HW x C, backward
 * (data) C x HW x 48 with A transposed, weight gradient C x 48 x HW with B
 * transposed), a 3x3 band (16 x 256 x 144), and odd sizes. */
static const prod prods[] = {
    {48, 1024, 108, false, false}, {108, 1024, 48, true, false}, {108, 48, 1024, false, true},
    {48, 256, 204, false, false},  {204, 64, 48, true, false},   {16, 256, 144, false, false},
    {7, 13, 5, true, true},        {1, 1, 1, false, false},      {33, 17, 65, false, true},
};

/* c (m, n) with row stride ldc = n + 3 (a sub-block, as the convolutions
 * pass), from A and B in the layouts ta / tb ask for. */
static void run_prod(const prod *p, const float *a, const float *b, float *c, float beta,
                     bool serial) {
    int lda = p->ta ? p->m : p->k, ldb = p->tb ? p->k : p->n, ldc = p->n + 3;
    if (serial) {
        CHECK_OK(fr_cpu_gemm_serial(c, ldc, a, lda, b, ldb, p->m, p->n, p->k, p->ta, p->tb, 1.0f,
                                    beta));
        return;
    }
    /* the reference: the built-in GEMM (fr_cpu_gemm), row by row into the
     * strided block */
    float *tmp = malloc((size_t)p->m * p->n * sizeof *tmp);
    CHECK(tmp != NULL);
    if (!tmp)
        return;
    CHECK_OK(fr_cpu_gemm(tmp, a, b, p->m, p->n, p->k, p->ta, p->tb, 1.0f, 0.0f));
    for (int i = 0; i < p->m; i++)
        for (int j = 0; j < p->n; j++)
            c[(size_t)i * ldc + j] = beta * c[(size_t)i * ldc + j] + tmp[(size_t)i * p->n + j];
    free(tmp);
}

static float *rand_buf(size_t n, unsigned seed) {
    float *p = malloc(n * sizeof *p);
    srand(seed);
    for (size_t i = 0; p && i < n; i++)
        p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    return p;
}

static void test_matches_builtin(void) {
    for (size_t i = 0; i < sizeof prods / sizeof *prods; i++) {
        const prod *p = &prods[i];
        size_t na = (size_t)p->m * p->k, nb = (size_t)p->k * p->n, nc = (size_t)p->m * (p->n + 3);
        float *a = rand_buf(na, 1 + (unsigned)i), *b = rand_buf(nb, 50 + (unsigned)i);
        float *got = malloc(nc * sizeof *got), *ref = malloc(nc * sizeof *ref);
        CHECK(a && b && got && ref);
        if (!(a && b && got && ref)) {
            free(a), free(b), free(got), free(ref);
            continue;
        }
        /* beta 0: whatever was there (NaN) is overwritten */
        for (size_t j = 0; j < nc; j++)
            got[j] = ref[j] = NAN;
        run_prod(p, a, b, got, 0.0f, true);
        for (int r = 0; r < p->m; r++)
            for (int j = 0; j < p->n; j++)
                ref[(size_t)r * (p->n + 3) + j] = 0.0f;
        run_prod(p, a, b, ref, 0.0f, false);
        double big = 0.0, diff = 0.0;
        bool finite = true;
        for (int r = 0; r < p->m; r++)
            for (int j = 0; j < p->n; j++) {
                size_t at = (size_t)r * (p->n + 3) + j;
                finite = finite && isfinite(got[at]);
                big = fmax(big, fabs(ref[at]));
                diff = fmax(diff, fabs(got[at] - ref[at]));
            }
        CHECK(finite);
        CHECK(diff <= 1e-5 * fmax(big, 1.0));
        /* the padding columns past n are never written */
        for (int r = 0; r < p->m; r++)
            CHECK(isnan(got[(size_t)r * (p->n + 3) + p->n]));
        /* beta 1 adds: twice the product */
        run_prod(p, a, b, got, 1.0f, true);
        diff = 0.0;
        for (int r = 0; r < p->m; r++)
            for (int j = 0; j < p->n; j++) {
                size_t at = (size_t)r * (p->n + 3) + j;
                diff = fmax(diff, fabs(got[at] - 2.0f * ref[at]));
            }
        CHECK(diff <= 2e-5 * fmax(big, 1.0));
        if (diff > 2e-5 * fmax(big, 1.0) || !finite)
            fprintf(stderr, "    %d x %d x %d (%c%c): differs from the built-in GEMM\n", p->m,
                    p->n, p->k, p->ta ? 'T' : 'N', p->tb ? 'T' : 'N');
        free(a), free(b), free(got), free(ref);
    }
}

/* The same bits called alone with 1, 2 or 3 threads on offer and from
 * inside a parallel region, and the offer left as it was. */
static void test_same_bits_any_team(void) {
    int team = omp_get_max_threads();
    const prod *p = &prods[0];
    size_t na = (size_t)p->m * p->k, nb = (size_t)p->k * p->n, nc = (size_t)p->m * (p->n + 3);
    float *a = rand_buf(na, 7), *b = rand_buf(nb, 8);
    float *c[4];
    for (int t = 0; t < 4; t++)
        c[t] = calloc(nc, sizeof *c[t]);
    CHECK(a && b && c[0] && c[1] && c[2] && c[3]);
    if (a && b && c[0] && c[1] && c[2] && c[3]) {
        for (int t = 0; t < 3; t++) {
            omp_set_num_threads(t + 1);
            run_prod(p, a, b, c[t], 0.0f, true);
            CHECK(omp_get_max_threads() == t + 1);
        }
        omp_set_num_threads(2);
#pragma omp parallel num_threads(2)
        {
#pragma omp single
            run_prod(p, a, b, c[3], 0.0f, true);
        }
        for (int t = 1; t < 4; t++)
            CHECK(memcmp(c[0], c[t], nc * sizeof *c[0]) == 0);
    }
    free(a), free(b);
    for (int t = 0; t < 4; t++)
        free(c[t]);
    omp_set_num_threads(team);
}

static void test_impl_follows_class(void) {
    fr_cpu_isa isa;
    CHECK_OK(fr_cpu_isa_get(&isa));
    const char *impl = fr_cpu_gemm_serial_impl();
    CHECK(strcmp(impl, expected_impl(isa)) == 0);
    if (strcmp(impl, expected_impl(isa)))
        fprintf(stderr, "    class %s: gemm %s, expected %s\n", fr_cpu_isa_name(isa), impl,
                expected_impl(isa));
}

/* Every class up to the machine's, forced by FR_CPU_ISA in a child. */
static void test_every_class(void) {
    for (int isa = 0; isa <= (int)fr_cpu_isa_detected(); isa++) {
        const char *name = fr_cpu_isa_name((fr_cpu_isa)isa);
        int rc = fr_t_run_self(self_path, "FR_CPU_ISA", name,
                               (char *const[]){(char *)self_path, "--child", NULL});
        if (rc != 0)
            fprintf(stderr, "    FR_CPU_ISA=%s: child exited %d\n", name, rc);
        CHECK(rc == 0);
    }
}

int main(int argc, char **argv) {
    self_path = argv[0];
    if (argc == 2 && strcmp(argv[1], "--child") == 0) {
        RUN(test_impl_follows_class);
        RUN(test_matches_builtin);
        return TEST_SUMMARY();
    }
    if (getenv("FR_CPU_ISA"))
        unsetenv("FR_CPU_ISA");
    RUN(test_impl_follows_class);
    RUN(test_matches_builtin);
    RUN(test_same_bits_any_team);
    RUN(test_every_class);
    return TEST_SUMMARY();
}
