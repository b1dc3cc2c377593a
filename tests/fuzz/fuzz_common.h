/* fuzz_common.h: what the libFuzzer harnesses share. The parsers under test
 * take paths, so each input is written to a file first: a memfd (no disk,
 * named through /proc/self/fd) where one file is enough, a private temp
 * folder where names matter (IDX pairs, CIFAR batches, image folders). */
#ifndef FR_FUZZ_COMMON_H
#define FR_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "frugal.h"
#include "nn/model.h"
#include "nn/params.h"

/* Replaces the contents of file `path` with data; aborts on a failed write
 * (the harness, not the code under test, would be broken). */
static inline void fz_write(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* A memfd's path, refilled with each input. */
static inline const char *fz_memfd_path(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz-input", 0);
        if (fd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size))
        abort();
    return path;
}

/* A private folder for the process, made once. */
static inline const char *fz_dir(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/frugal-fuzz-XXXXXX");
        if (!mkdtemp(dir))
            abort();
    }
    return dir;
}

/* Every input must leave the ledger as it found it. */
static inline void fz_check_no_leak(size_t before) {
    if (fr_mem_total_current(FR_CPU) != before) {
        fprintf(stderr, "ledger leak: %zu bytes before the input, %zu after\n", before,
                fr_mem_total_current(FR_CPU));
        abort();
    }
}

/* The model of the checkpoint harness and its seeds: a linear classifier
 * ("fc.weight" (2, 4), "fc.bias" (2)) for 1 x 2 x 2 images, small enough
 * that a whole training checkpoint of it is a few hundred bytes. */
static inline fr_model *fz_tiny_model(void) {
    fr_model *m = fr_model_new("tiny", 1, 2, 1);
    fr_flatten_new(fr_model_root(m), "flat");
    fr_linear_new(fr_model_root(m), "fc", (fr_linear_opts){.in = 4, .out = 2});
    if (!(m = fr_model_finish(m)))
        abort();
    float *w = fr_data_f32(fr_params_get(m->params, "fc.weight"));
    for (int i = 0; i < 8; i++)
        w[i] = 0.125f * (float)(i - 3);
    fr_fill_(fr_params_get(m->params, "fc.bias"), 0.5f);
    return m;
}

#endif
