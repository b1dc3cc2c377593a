/* test_conv_isa.c: the CPU convolution's choice by instruction set
 * (cpu/isa.c, cpu/conv_rules.c). The rule table is a function of one
 * image's shape and the ISA class only; every class this CPU can run,
 * forced with FR_CPU_ISA, gives the im2col reference's results within 1e-5
 * of the largest reference value in every pass and takes the kernels of
 * that class (oneDNN's included); a class the CPU lacks, or a name that is
 * no class, is refused with an error naming FR_CPU_ISA.
 *
 * FR_CPU_ISA is read once per process and caps oneDNN before its first
 * primitive, so each class runs in a child process: this program re-runs
 * itself as `test_conv_isa --child CLASS` with the variable set. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"
#include "cpu/conv.h"
#include "cpu/isa.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"

static const char *self_path;

typedef struct {
    int n, c, h, k, r, stride, pad;
} conv_case;

/* ResNet's 3x3 layers, the strided and 1x1 transitions, DenseNet's wide
 * bottleneck and growth layers, a 5x5 and odd sizes */
static const conv_case cases[] = {
    {8, 3, 32, 16, 3, 1, 1},  {8, 16, 32, 16, 3, 1, 1}, {8, 16, 32, 32, 3, 2, 1},
    {8, 32, 16, 32, 1, 2, 0}, {6, 64, 8, 64, 3, 1, 1},  {4, 96, 8, 32, 1, 1, 0},
    {4, 128, 8, 12, 3, 1, 1}, {3, 5, 13, 7, 3, 2, 0},   {2, 9, 11, 6, 5, 2, 2},
    {17, 16, 8, 16, 3, 1, 1}, /* 17 images: groups of one and two */
};

static double scaled_diff(const fr_tensor *a, const fr_tensor *ref) {
    const float *pa = fr_data_f32(a), *pr = fr_data_f32(ref);
    double worst = 0.0, scale = 0.0;
    for (int64_t i = 0; i < fr_numel(ref); i++) {
        double d = fabs((double)pa[i] - pr[i]);
        worst = d > worst || d != d ? d : worst;
        scale = fabs(pr[i]) > scale ? fabs(pr[i]) : scale;
    }
    return scale > 0.0 ? worst / scale : worst;
}

static fr_conv_shape shape_of(const conv_case *cc) {
    fr_conv_shape s = {.n = cc->n, .c = cc->c, .h = cc->h, .w = cc->h, .k = cc->k, .r = cc->r,
                       .s = cc->r, .stride = cc->stride, .pad = cc->pad};
    s.oh = s.ow = (cc->h + 2 * cc->pad - cc->r) / cc->stride + 1;
    return s;
}

/* The table depends on one image's shape and the class: never on the
 * batch; and what it routes to oneDNN needs oneDNN. */
static void test_rule_table(void) {
    for (int isa = 0; isa < FR_ISA_COUNT; isa++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            for (int d = 0; d < 3; d++) {
                fr_conv_shape s = shape_of(&cases[i]), one = s, many = s;
                one.n = 1;
                many.n = 256;
                fr_conv_path p = fr_cpu_conv_rule(&s, d, (fr_cpu_isa)isa);
                CHECK(p == fr_cpu_conv_rule(&one, d, (fr_cpu_isa)isa));
                CHECK(p == fr_cpu_conv_rule(&many, d, (fr_cpu_isa)isa));
                if (!fr_cpu_have_dnnl())
                    CHECK(p == FR_CONV_PATH_OWN);
                CHECK(p != FR_CONV_PATH_DNNL_GROUPS || d == 2);
            }
    if (!fr_cpu_have_dnnl())
        return;
    /* the rows as docs/ARCHITECTURE.md states them */
    fr_conv_shape s3 = shape_of(&cases[1]), s3s2 = shape_of(&cases[2]), s1x1 = shape_of(&cases[3]);
    fr_conv_shape wide = shape_of(&cases[6]), k5 = shape_of(&cases[8]);
    CHECK(fr_cpu_conv_rule(&s3, 2, FR_ISA_BASELINE) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&s3s2, 2, FR_ISA_BASELINE) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&s3, 2, FR_ISA_AVX2) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&s3s2, 2, FR_ISA_AVX2) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&s1x1, 2, FR_ISA_AVX2) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&s3, 2, FR_ISA_AVX512) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&s3s2, 2, FR_ISA_AVX512) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&k5, 2, FR_ISA_AVX512) == FR_CONV_PATH_OWN);
    fr_conv_shape b1x1 = shape_of(&cases[5]); /* 1x1 stride 1: im2col is one GEMM there */
    CHECK(fr_cpu_conv_rule(&b1x1, 2, FR_ISA_AVX512) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&wide, 0, FR_ISA_AVX2) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&wide, 0, FR_ISA_AVX512) == FR_CONV_PATH_DNNL);
    CHECK(fr_cpu_conv_rule(&wide, 1, FR_ISA_AVX512) == FR_CONV_PATH_OWN);
    for (int isa = 0; isa < FR_ISA_COUNT; isa++)
        CHECK(fr_cpu_conv_rule(&s3, 0, (fr_cpu_isa)isa) == FR_CONV_PATH_DNNL);
}

/* ---- the child: one forced class ---- */

static fr_cpu_isa child_isa;

static void check_case(const conv_case *cc, int seed) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->n, cc->c, cc->h, cc->h), seed);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->k, cc->c, cc->r, cc->r), seed + 1);
    fr_conv_shape s;
    fr_conv_params p = {cc->stride, cc->pad};
    CHECK_OK(fr_conv2d_shape(x, w, p, &s));
    fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(s.n, s.k, s.oh, s.ow), seed + 2);
    fr_tensor *out[2][3];
    for (int b = 0; b < 2; b++) {
        out[b][0] = fr_empty_like(dy, FR_TAG_TRANSIENT);
        out[b][1] = fr_empty_like(x, FR_TAG_TRANSIENT);
        out[b][2] = fr_empty_like(w, FR_TAG_TRANSIENT);
        for (int d = 0; d < 3; d++)
            CHECK_OK(fr_fill_(out[b][d], NAN)); /* every element written */
        CHECK_OK(fr_cpu_conv_set_backend(b ? FR_CPU_CONV_AUTO : FR_CPU_CONV_IM2COL));
        CHECK_OK(fr_conv2d_forward(out[b][0], x, w, NULL, p));
        CHECK_OK(fr_conv2d_backward(out[b][1], out[b][2], NULL, dy, x, w, p));
    }
    for (int d = 0; d < 3; d++) {
        double e = scaled_diff(out[1][d], out[0][d]);
        const char *impl = fr_cpu_conv_impl(&s, d);
        if (!(e <= 1e-5))
            fprintf(stderr, "    %s: %d->%d %dx%d /%d @%d pass %d (%s): %.2e from im2col\n",
                    fr_cpu_isa_name(child_isa), cc->c, cc->k, cc->r, cc->r, cc->stride, cc->h, d,
                    impl, e);
        CHECK(e <= 1e-5);
        /* the kernels of the class: oneDNN's capped at it, the shifted
         * planes from AVX2 up */
        if (child_isa < FR_ISA_AVX512)
            CHECK(strstr(impl, "avx512") == NULL);
        if (child_isa < FR_ISA_AVX2)
            CHECK(strstr(impl, "avx2") == NULL && strcmp(impl, "shift") != 0);
        fr_conv_path path;
        CHECK_OK(fr_cpu_conv_path(&s, d, &path));
        CHECK(path == fr_cpu_conv_rule(&s, d, child_isa));
        CHECK((path == FR_CONV_PATH_OWN) ==
              (strcmp(impl, "im2col") == 0 || strcmp(impl, "shift") == 0));
        if (path == FR_CONV_PATH_DNNL_GROUPS)
            CHECK(strstr(impl, "/groups") != NULL);
    }
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 3; d++)
            fr_release(out[b][d]);
    fr_release(dy);
    fr_release(w);
    fr_release(x);
}

static void test_forced_class(void) {
    fr_cpu_isa isa;
    CHECK_OK(fr_cpu_isa_get(&isa));
    CHECK(isa == child_isa);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_case(&cases[i], 100 + 10 * (int)i);
    fr_conv_shape probe = shape_of(&cases[1]);
    CHECK(fr_cpu_conv_shift_applies(&probe) == (child_isa >= FR_ISA_AVX2));
}

/* FR_CPU_ISA names no class or a class above this CPU's: every conv call
 * fails with an error that names the variable. */
static void test_refused(void) {
    fr_cpu_isa isa;
    CHECK_ERR(fr_cpu_isa_get(&isa), FR_ERR_ARG, "FR_CPU_ISA");
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 4, 8, 8), 1);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(8, 4, 3, 3), 2);
    fr_tensor *y = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(2, 8, 8, 8), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_conv2d_forward(y, x, w, NULL, (fr_conv_params){1, 1}), FR_ERR_ARG, "FR_CPU_ISA");
    char line[256];
    fr_cpu_conv_describe(line, sizeof line);
    CHECK(strstr(line, "FR_CPU_ISA") != NULL);
    fr_release(y);
    fr_release(w);
    fr_release(x);
}

/* ---- the parent ---- */

/* Runs this program as a child with FR_CPU_ISA=value; its exit status. */
static int run_child(const char *value, const char *mode) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("FR_CPU_ISA", value, 1);
        execl(self_path, self_path, "--child", mode, value, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_every_class_below_the_machine(void) {
    fr_cpu_isa top = fr_cpu_isa_detected();
    for (int isa = 0; isa <= (int)top; isa++) {
        int rc = run_child(fr_cpu_isa_name((fr_cpu_isa)isa), "class");
        if (rc != 0)
            fprintf(stderr, "    FR_CPU_ISA=%s: child exited %d\n", fr_cpu_isa_name((fr_cpu_isa)isa), rc);
        CHECK(rc == 0);
    }
}

static void test_bad_values_refused(void) {
    CHECK(run_child("avx1024", "refused") == 0);
    if (fr_cpu_isa_detected() < FR_ISA_AVX512)
        CHECK(run_child("avx512", "refused") == 0);
}

static void test_describe(void) {
    char line[256];
    fr_cpu_conv_describe(line, sizeof line);
    fr_cpu_isa isa;
    CHECK_OK(fr_cpu_isa_get(&isa));
    CHECK(strncmp(line, "cpu ", 4) == 0 && strstr(line, fr_cpu_isa_name(isa)) != NULL);
    const fr_cpu_features *f = fr_cpu_features_detected();
    CHECK(!f->avx512_bf16 || strstr(line, "avx512_bf16") != NULL);
    /* the class follows the features */
    CHECK((fr_cpu_isa_detected() >= FR_ISA_AVX2) == (f->avx2 && f->fma));
    CHECK((fr_cpu_isa_detected() >= FR_ISA_AVX512) == (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512cd));
}

int main(int argc, char **argv) {
    self_path = argv[0];
    if (argc == 4 && strcmp(argv[1], "--child") == 0) {
        if (strcmp(argv[2], "refused") == 0) {
            RUN(test_refused);
            return TEST_SUMMARY();
        }
        for (int i = 0; i < FR_ISA_COUNT; i++)
            if (strcmp(argv[3], fr_cpu_isa_name((fr_cpu_isa)i)) == 0)
                child_isa = (fr_cpu_isa)i;
        RUN(test_forced_class);
        return TEST_SUMMARY();
    }
    if (getenv("FR_CPU_ISA")) /* the parent checks the machine's own class */
        unsetenv("FR_CPU_ISA");
    RUN(test_rule_table);
    RUN(test_describe);
    RUN(test_every_class_below_the_machine);
    RUN(test_bad_values_refused);
    return TEST_SUMMARY();
}
