/* bench_dist: training-step throughput of one process against several
 * (dist/dist.h), and how much of the gradient all-reduce backward hides.
 *
 *     OMP_NUM_THREADS=2 bench_dist --batch 128                     # 1 process x 2 threads
 *     OMP_NUM_THREADS=1 mpirun -np 2 bench_dist --batch 128        # 2 processes x 1 thread
 *     OMP_NUM_THREADS=1 mpirun -np 2 bench_dist --batch 128 --no-overlap
 *
 * --batch is the step's images, all processes together. Data is synthetic
 * (CIFAR-shaped, 3 x 32 x 32, 10 classes); SGD with momentum. Rank 0 prints
 * one line: processes, threads, images/s, ms per step, and the milliseconds
 * per step spent waiting for the all-reduce after backward. With
 * --no-overlap every all-reduce starts after backward, so that wait is the
 * whole all-reduce.
 *
 * The wait also holds the time a process waits for a slower one to end its
 * backward, which on a shared machine is most of it. So rank 0 also prints
 * the *exposed* all-reduce time: per step, the latest end of the
 * all-reduces over processes minus the latest end of backward (the
 * processes share one clock on one machine: fr_dist_stats), averaged over
 * the steps. Without overlap that is the whole all-reduce after the last
 * process is ready; the share hidden behind backward is 1 - (exposed with
 * overlap) / (exposed without), which bench/dist.sh prints. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"
#include "frugal.h"
#include "programs/cli_impl.h"

static fr_status fill_batch(fr_tensor *x, fr_tensor *y, uint32_t seed) {
    float *px = fr_data_f32(x);
    int32_t *lab = fr_data(y);
    for (int64_t i = 0; i < fr_numel(x); i++) {
        seed = seed * 1664525u + 1013904223u;
        px[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    for (int64_t i = 0; i < y->shape[0]; i++)
        lab[i] = (int32_t)(i % 10);
    return FR_OK;
}

int main(int argc, char **argv) {
    const char *model = "resnet20";
    int64_t batch = 128, steps = 10, warmup = 2;
    double bucket_mb = 0;
    bool overlap = true;
    fr_status s = FR_OK;
    for (int i = 1; i < argc && s == FR_OK; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--no-overlap"))
            overlap = false;
        else if (!strcmp(argv[i], "--model") && v)
            model = argv[++i];
        else if (!strcmp(argv[i], "--batch") && v)
            s = fr_cli_int("--batch", argv[++i], 1, 1 << 20, &batch);
        else if (!strcmp(argv[i], "--steps") && v)
            s = fr_cli_int("--steps", argv[++i], 1, 1 << 20, &steps);
        else if (!strcmp(argv[i], "--warmup") && v)
            s = fr_cli_int("--warmup", argv[++i], 0, 1 << 20, &warmup);
        else if (!strcmp(argv[i], "--bucket-mb") && v)
            s = fr_cli_double("--bucket-mb", argv[++i], 0.001, 1024, &bucket_mb);
        else
            s = fr_cli_bad_flag("bench_dist", argv[i], false);
    }
    fr_dist *d = NULL;
    if (s == FR_OK && fr_dist_launched(NULL))
        s = fr_dist_init(&d);
    int rank = fr_dist_rank(d), world = fr_dist_world(d);
    if (s == FR_OK && batch % world)
        s = fr_error(FR_ERR_ARG, "--batch %lld cannot be split over %d processes", (long long)batch, world);
    fr_model *m = s == FR_OK ? fr_cli_model_create(model, 3, 10, 1) : NULL;
    fr_optim *opt = m ? fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9}) : NULL;
    if (s == FR_OK && !opt)
        s = fr_last_status();
    if (s == FR_OK && d)
        s = fr_dist_attach(d, m, &(fr_dist_options){.no_overlap = !overlap,
                                                     .bucket_bytes = (size_t)(bucket_mb * 1024 * 1024)});
    int64_t b = batch / world;
    fr_tensor *x = s == FR_OK ? fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(b, 3, 32, 32), FR_TAG_DATA) : NULL;
    fr_tensor *y = x ? fr_empty(FR_CPU, FR_I32, 1, FR_SHAPE(b), FR_TAG_DATA) : NULL;
    if (s == FR_OK && !y)
        s = fr_last_status();
    if (s == FR_OK)
        s = fill_batch(x, y, 7u + (uint32_t)rank);
    double t0 = 0, wait0 = 0;
    /* per process and timed step: backward end, all-reduce end (MPI_Wtime) */
    double *ends = calloc((size_t)(2 * world * steps), sizeof *ends);
    if (s == FR_OK && !ends)
        s = fr_error(FR_ERR_OOM, "bench_dist: out of memory");
    for (int64_t k = 0; s == FR_OK && k < warmup + steps; k++) {
        if (k == warmup) {
            if (d)
                s = fr_dist_barrier(d);
            t0 = fr_cli_now();
            wait0 = d ? fr_dist_get_stats(d).wait_seconds : 0;
        }
        if (s == FR_OK)
            s = fr_train_step(m, opt, NULL, x, y, 1, NULL, NULL, NULL);
        if (s == FR_OK && d && k >= warmup) {
            fr_dist_stats ds = fr_dist_get_stats(d);
            ends[2 * (rank * steps + k - warmup)] = ds.backward_end;
            ends[2 * (rank * steps + k - warmup) + 1] = ds.reduced_end;
        }
    }
    if (s == FR_OK && d)
        s = fr_dist_barrier(d);
    double secs = fr_cli_now() - t0;
    if (s == FR_OK && d) /* every process's ends on every process (the others' slots are 0) */
        s = fr_dist_sum(d, ends, (int)(2 * world * steps));
    double exposed = 0;
    for (int64_t k = 0; k < steps && d; k++) {
        double bw = 0, rd = 0;
        for (int r = 0; r < world; r++) {
            bw = fmax(bw, ends[2 * (r * steps + k)]);
            rd = fmax(rd, ends[2 * (r * steps + k) + 1]);
        }
        exposed += fmax(0, rd - bw) / (double)steps;
    }
    if (s == FR_OK && rank == 0) {
        fr_dist_stats ds = d ? fr_dist_get_stats(d) : (fr_dist_stats){0};
        printf("%s batch %lld: %d process%s x %d thread%s: %.1f images/s, %.1f ms a step, all-reduce wait "
               "%.2f ms a step, exposed all-reduce %.2f ms a step (%d buckets, %.2f MiB, overlap %s)\n", model, (long long)batch, world,
               world == 1 ? "" : "es", omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s",
               (double)(batch * steps) / secs, 1e3 * secs / (double)steps,
               d ? 1e3 * (ds.wait_seconds - wait0) / (double)steps : 0, 1e3 * exposed, ds.buckets,
               (double)ds.bytes / 1048576.0, overlap ? "on" : "off");
    }
    free(ends);
    fr_release(x);
    fr_release(y);
    fr_dist_detach(d);
    fr_optim_free(opt);
    fr_model_free(m);
    if (s != FR_OK) {
        fprintf(stderr, "bench_dist: rank %d: %s\n", rank, fr_last_error());
        if (world > 1)
            fr_dist_abort(d, 1);
    }
    fr_dist_free(d);
    return s == FR_OK ? 0 : 1;
}
