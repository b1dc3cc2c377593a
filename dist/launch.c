/* launch.c: whether an MPI launcher started this process (dist.h); built
 * with and without MPI, so a program can tell a user who ran it under mpirun
 * that this build cannot take part. */
#include <stdlib.h>

#include "dist.h"

bool fr_dist_launched(int *world) {
    /* Open MPI's mpirun, then PMI (MPICH's hydra, Slurm's srun), then PMIx. */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            if (world)
                *world = atoi(v) > 0 ? atoi(v) : 1;
            return true;
        }
    }
    if (world)
        *world = 1;
    return getenv("PMIX_RANK") != NULL;
}
