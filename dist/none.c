/* none.c: dist.h in a build without MPI: every entry point says so. */
#include "dist.h"

static fr_status not_built(void) {
    return fr_error(FR_ERR_ARG, "distributed training: this frugal was built without MPI (install "
                    "libopenmpi-dev and openmpi-bin, then rebuild: the Makefile finds mpicc)");
}

bool fr_dist_built(void) { return false; }

fr_status fr_dist_init(fr_dist **out) {
    *out = NULL;
    return not_built();
}
void fr_dist_free(fr_dist *d) { (void)d; }
int fr_dist_rank(const fr_dist *d) { return (void)d, 0; }
int fr_dist_world(const fr_dist *d) { return (void)d, 1; }
fr_status fr_dist_select_gpu(fr_dist *d) { return (void)d, not_built(); }
fr_status fr_dist_attach(fr_dist *d, fr_model *m, const fr_dist_options *o) {
    (void)d, (void)m, (void)o;
    return not_built();
}
void fr_dist_detach(fr_dist *d) { (void)d; }
fr_dist_stats fr_dist_get_stats(const fr_dist *d) { return (void)d, (fr_dist_stats){0}; }
fr_status fr_dist_sum(fr_dist *d, double *values, int n) { return (void)d, (void)values, (void)n, not_built(); }
fr_status fr_dist_share_status(fr_dist *d, int root, fr_status local) {
    return (void)d, (void)root, (void)local, not_built();
}
fr_status fr_dist_barrier(fr_dist *d) { return (void)d, not_built(); }
fr_status fr_dist_set_timeout(fr_dist *d, double seconds) { return (void)d, (void)seconds, not_built(); }
double fr_dist_timeout(const fr_dist *d) { return (void)d, 0; }
/* One process: nothing else to end; the program exits with its own code. */
void fr_dist_abort(fr_dist *d, int code) { (void)d, (void)code; }
