/* cpu/threads.c: how many OpenMP threads frugal's CPU kernels use (see
 * threads.h). */
#include "threads.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int chosen;
/* > 0: fr_set_num_threads asked for this many, and the load is not asked */
static _Atomic int requested;

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
 * user's OMP_NUM_THREADS, fr_set_num_threads (the programs' --threads), or
 * a program's omp_set_num_threads to other than the core count before the
 * first kernel, is left alone. (omp_set_num_threads(cores) looks like the
 * default, which is why --threads goes through fr_set_num_threads: with
 * --threads 2 on 2 cores at load 1 the team used to shrink to 1 thread,
 * and the demo trained at 222 images/s instead of about 400.) */
static void choose(void) {
    int procs = omp_get_num_procs(), max = omp_get_max_threads();
    chosen = max;
    if (requested > 0 || getenv("OMP_NUM_THREADS") || max != procs)
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

void fr_set_num_threads(int n) {
    if (n < 1)
        n = 1;
    requested = n;
    omp_set_num_threads(n);
}

int fr_get_num_threads(void) { return fr_cpu_threads(); }
