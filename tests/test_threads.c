/* test_threads.c: the CPU team size (tensor/fr_base.h: fr_set_num_threads).
 * An explicit request is honoured whatever the load average, including a
 * request for exactly the core count, which the load heuristic (cpu/threads.c)
 * used to shrink on a busy machine (--threads 2 on 2 cores at load 1 ran on
 * one thread). Its own program: the team is fixed at the first kernel of a
 * process, so this must run before any other test's kernels. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static fr_tensor *relu_of(const fr_tensor *x) {
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT);
    if (y && fr_relu_forward(y, x) != FR_OK)
        fr_clear(&y);
    return y;
}

static void test_request_for_every_core_is_honoured(void) {
    int procs = omp_get_num_procs();
    double load[1] = {0};
    getloadavg(load, 1);
    fprintf(stderr, "    %d cores, load average %.2f\n", procs, load[0]);
    /* before the first kernel, as the programs' --threads */
    fr_set_num_threads(procs);
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(1 << 20), 1);
    fr_tensor *y = x ? relu_of(x) : NULL;
    CHECK_NOTNULL(y);
    CHECK(fr_get_num_threads() == procs);
    /* a later request changes it, and the kernels give the same bits */
    fr_set_num_threads(1);
    CHECK(fr_get_num_threads() == 1);
    fr_tensor *y1 = x ? relu_of(x) : NULL;
    CHECK(y && y1 && memcmp(fr_data(y), fr_data(y1), fr_nbytes(y)) == 0);
    /* fewer than one is one */
    fr_set_num_threads(0);
    CHECK(fr_get_num_threads() == 1);
    fr_set_num_threads(procs);
    CHECK(fr_get_num_threads() == procs);
    fr_release(x);
    fr_release(y);
    fr_release(y1);
}

int main(void) {
    RUN(test_request_for_every_core_is_honoured);
    return TEST_SUMMARY();
}
