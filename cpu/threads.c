/* cpu/threads.c: how many OpenMP threads frugal's CPU kernels use (see
 * threads.h). */
#include "threads.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int chosen;

/* libgomp's threads busy-wait at every barrier unless OMP_WAIT_POLICY says
 * otherwise, and that setting is read once, when the library loads: a
 * program cannot change it. On a machine whose cores other processes
 * already keep busy, a team of one thread per core then spends its time
 * spinning for a partner that is not scheduled (measured here, 2 cores,
 * load average 10-14: tests/test_mixed 360 s wall with 2 spinning threads,
 * 66 s with OMP_WAIT_POLICY=passive, 54 s with 1 thread). So the team is
 * sized once, on first use, to the cores the load average leaves free
 * (all of them on a quiet machine), and never changed afterwards (the
 * CPU kernels give the same bits at any team size, so a run on a busier
 * machine still reproduces one on a quiet one: docs/ARCHITECTURE.md). A
 * user's OMP_NUM_THREADS, or a program's omp_set_num_threads before the
 * first kernel, is left alone. */
static void choose(void) {
    int procs = omp_get_num_procs(), max = omp_get_max_threads();
    chosen = max;
    if (getenv("OMP_NUM_THREADS") || max != procs)
        return;
    double load[1];
    if (getloadavg(load, 1) != 1)
        return;
    int busy = (int)(load[0] + 0.5), free_cores = procs - busy;
    chosen = free_cores < 1 ? 1 : free_cores > procs ? procs : free_cores;
    omp_set_num_threads(chosen);
}

int fr_cpu_threads(void) {
    pthread_once(&once, choose);
    return omp_in_parallel() ? 1 : omp_get_max_threads();
}
