/* test_cuda_loader.c: the loader's CUDA batches (pinned staging, async
 * copies) must equal its CPU batches bit for bit. Split from test_cuda.c,
 * which compares the ops of the two backends. Skips without a GPU (or in a
 * CUDA=0 build). */
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "testlib.h"

/* N images (3, 5, 6), pixels from a hash of (image, k); label = image % 7. */
static fr_dataset *loader_dataset(int n) {
    enum { CHW = 3 * 5 * 6 };
    uint8_t *px = malloc((size_t)n * CHW);
    int32_t *lab = malloc((size_t)n * sizeof *lab);
    for (int i = 0; i < n; i++) {
        lab[i] = i % 7;
        for (int k = 0; k < CHW; k++)
            px[i * CHW + k] = (uint8_t)((i * 97 + k * 31 + (i * k) % 11) & 255);
    }
    fr_dataset *ds = fr_dataset_from_host("cuda-loader", n, 3, 5, 6, px, lab, 7);
    free(px);
    free(lab);
    return ds;
}

enum { HELD_MAX = 24 };
typedef struct {
    int n;
    fr_tensor *x[HELD_MAX], *y[HELD_MAX];
    size_t cpu_allocs; /* CPU ledger allocations while batches were drawn */
} held_batches;

/* Runs `epochs` epochs and keeps every batch: nothing is read back until the
 * end, so a staging buffer refilled before its copy ran would show up as a
 * wrong batch. */
static void loader_run(const fr_dataset *ds, fr_loader_config cfg, int epochs, held_batches *out) {
    memset(out, 0, sizeof *out);
    fr_loader *l = fr_loader_new(ds, &cfg);
    CHECK_NOTNULL(l);
    if (!l)
        return;
    fr_mem_stats before, after;
    fr_mem_get_stats(FR_CPU, &before);
    for (int e = 0; e < epochs; e++)
        for (;;) {
            fr_tensor *x = NULL, *y = NULL;
            CHECK_OK(fr_loader_next(l, &x, &y));
            if (!x)
                break;
            CHECK(fr_device_of(x) == cfg.device && fr_device_of(y) == cfg.device);
            CHECK(out->n < HELD_MAX);
            if (out->n < HELD_MAX) {
                out->x[out->n] = x;
                out->y[out->n] = y;
                out->n++;
            } else {
                fr_release(x);
                fr_release(y);
            }
        }
    fr_mem_get_stats(FR_CPU, &after);
    out->cpu_allocs = after.n_allocs - before.n_allocs;
    fr_loader_free(l);
}

static void held_free(held_batches *h) {
    for (int i = 0; i < h->n; i++) {
        fr_release(h->x[i]);
        fr_release(h->y[i]);
    }
    h->n = 0;
}

/* The same bytes and shape, whatever the devices. */
static bool same_tensor(const fr_tensor *a, const fr_tensor *b) {
    if (!a || !b || a->dtype != b->dtype || fr_numel(a) != fr_numel(b) || a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    fr_tensor *ha = fr_to_device(a, FR_CPU, FR_TAG_DATA), *hb = fr_to_device(b, FR_CPU, FR_TAG_DATA);
    bool same = ha && hb && memcmp(fr_data(ha), fr_data(hb), fr_nbytes(ha)) == 0;
    fr_release(ha);
    fr_release(hb);
    return same;
}

static bool same_batches(const held_batches *a, const held_batches *b, const char *what) {
    bool same = a->n == b->n;
    for (int i = 0; same && i < a->n; i++)
        same = same_tensor(a->x[i], b->x[i]) && same_tensor(a->y[i], b->y[i]);
    if (!same) {
        fprintf(stderr, "    %s: batches differ from the CPU loader's\n", what);
        fr_t_failed_now = 1;
    }
    return same;
}

/* 37 images in batches of 4 (the last one short), shuffled and augmented,
 * over two epochs: the CUDA loader, with and without its thread, returns the
 * CPU loader's batches bit for bit, builds them in pinned memory (no CPU
 * tensor is allocated per batch), and seeks exactly. */
static void test_loader_cuda_batches(void) {
    NEED_CUDA();
    fr_dataset *ds = loader_dataset(37);
    fr_loader_config cfg = {.batch_size = 4, .shuffle = true, .seed = 7, .device = FR_CPU};
    cfg.aug = (fr_augment){.pad = 2, .flip = true, .mean = {0.5f, 0.4f, 0.3f},
                           .std = {0.2f, 0.25f, 0.3f}};
    held_batches ref, gpu;
    loader_run(ds, cfg, 2, &ref);
    CHECK(ref.n == 20 && ref.x[9] && ref.x[9]->shape[0] == 1);
    cfg.device = FR_CUDA;
    for (int threaded = 0; threaded < 2; threaded++) {
        cfg.prefetch = threaded;
        loader_run(ds, cfg, 2, &gpu);
        same_batches(&ref, &gpu, threaded ? "cuda loader, prefetch" : "cuda loader");
        CHECK(gpu.cpu_allocs == 0); /* the batches went through the staging buffers */
        held_free(&gpu);
    }
    /* seek: epoch 1, batch 3 is the 14th batch of the straight run */
    cfg.prefetch = true;
    fr_loader *l = fr_loader_new(ds, &cfg);
    CHECK_NOTNULL(l);
    if (l) {
        fr_tensor *x = NULL, *y = NULL;
        CHECK_OK(fr_loader_next(l, &x, &y));
        fr_release(x);
        fr_release(y);
        CHECK_OK(fr_loader_seek(l, 1, 3));
        CHECK_OK(fr_loader_next(l, &x, &y));
        CHECK(ref.n == 20 && same_tensor(x, ref.x[13]) && same_tensor(y, ref.y[13]));
        fr_release(x);
        fr_release(y);
        fr_loader_free(l);
    }
    held_free(&ref);
    fr_dataset_free(ds);
}

int main(void) {
    RUN(test_loader_cuda_batches);
    return TEST_SUMMARY();
}
