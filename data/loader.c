/* loader.c: see loader.h.
 *
 * The batch at (epoch, index) is a pure function of the config and the
 * dataset (build_batch), so the background thread only changes WHEN a batch
 * is built, not what it holds. The thread and the caller share one slot
 * guarded by a mutex and a condition variable: the thread fills it and
 * waits while it is full; next() waits while it is empty and empties it.
 * A generation counter lets seek() and free() discard a batch the thread
 * was building for a position that no longer matters. */
#include "loader.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fr_tensor *images, *labels;  /* NULL, NULL: the end-of-epoch marker */
    fr_status status;
    char message[1024];
} batch_result;

struct fr_loader {
    const fr_dataset *ds;
    fr_loader_config cfg;
    int64_t n_batches;
    /* the order of the epoch being built; only the builder touches it */
    int64_t *perm;  // (N,)
    int64_t perm_epoch;
    /* the caller's position: what next() returns next */
    int64_t epoch, batch;
    /* prefetch state, under mu */
    bool threaded, stop, full;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen;
    int64_t build_epoch, build_batch;  /* what the thread builds next */
    batch_result slot;
};

static void make_perm(fr_loader *l, int64_t epoch) {
    int64_t n = l->ds->n;
    for (int64_t i = 0; i < n; i++)
        l->perm[i] = i;
    if (l->cfg.shuffle) {
        /* A stream apart from the per-image ones, which use positions < N. */
        fr_rng r;
        fr_rng_seed(&r, fr_rng_mix(l->cfg.seed, (uint64_t)epoch, UINT64_MAX));
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)fr_rng_below(&r, (uint64_t)i + 1);
            int64_t t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
    l->perm_epoch = epoch;
}

/* Builds batch `index` of `epoch` on the CPU; index == n_batches gives the
 * end-of-epoch marker. */
static void build_batch(fr_loader *l, int64_t epoch, int64_t index, batch_result *out) {
    memset(out, 0, sizeof *out);
    if (index >= l->n_batches)
        return;
    if (l->perm_epoch != epoch)
        make_perm(l, epoch);
    const fr_dataset *ds = l->ds;
    int64_t start = index * l->cfg.batch_size;
    int64_t bs = ds->n - start < l->cfg.batch_size ? ds->n - start : l->cfg.batch_size;
    out->images = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(bs, ds->c, ds->h, ds->w), FR_TAG_DATA);
    out->labels = out->images ? fr_empty(FR_CPU, FR_I32, 1, FR_SHAPE(bs), FR_TAG_DATA) : NULL;
    out->status = out->labels ? FR_OK : fr_last_status();
    const int64_t chw = ds->c * ds->h * ds->w;
    for (int64_t j = 0; j < bs && out->status == FR_OK; j++) {
        int64_t pos = start + j, i = l->perm[pos];
        fr_rng r;
        fr_rng_seed(&r, fr_rng_mix(l->cfg.seed, (uint64_t)epoch, (uint64_t)pos));
        out->status = fr_aug_apply(fr_data_f32(out->images) + j * chw, fr_dataset_image(ds, i),
                                   (int)ds->c, (int)ds->h, (int)ds->w, &l->cfg.aug, &r);
        ((int32_t *)fr_data(out->labels))[j] = fr_dataset_label(ds, i);
    }
    if (out->status != FR_OK) {
        snprintf(out->message, sizeof out->message, "loader: batch %lld of epoch %lld: %s",
                 (long long)index, (long long)epoch, fr_last_error());
        fr_clear(&out->images);
        fr_clear(&out->labels);
    }
}

static void result_release(batch_result *r) {
    fr_clear(&r->images);
    fr_clear(&r->labels);
}

static void *worker(void *arg) {
    fr_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (l->full && !l->stop)
            pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop)
            break;
        int64_t e = l->build_epoch, b = l->build_batch;
        uint64_t gen = l->gen;
        pthread_mutex_unlock(&l->mu);
        batch_result r;
        build_batch(l, e, b, &r);
        pthread_mutex_lock(&l->mu);
        if (l->stop || gen != l->gen) {
            /* seek() or free() happened meanwhile: this batch is stale */
            result_release(&r);
            continue;
        }
        l->slot = r;
        l->full = true;
        if (b >= l->n_batches) {
            l->build_epoch = e + 1;
            l->build_batch = 0;
        } else {
            l->build_batch = b + 1;
        }
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

fr_loader *fr_loader_new(const fr_dataset *ds, const fr_loader_config *cfg) {
    if (!ds || !cfg || !ds->images || !ds->labels) {
        fr_error(FR_ERR_ARG, "loader: dataset or config is NULL");
        return NULL;
    }
    if (cfg->batch_size < 1 || ds->c > FR_AUG_MAX_C || cfg->aug.pad < 0 ||
        (unsigned)cfg->device >= FR_DEVICE_COUNT) {
        fr_error(FR_ERR_ARG, "loader: bad config for %s: batch_size %d (>= 1), pad %d (>= 0), %lld "
                 "channels (<= %d)", ds->name, cfg->batch_size, cfg->aug.pad, (long long)ds->c,
                 FR_AUG_MAX_C);
        return NULL;
    }
    fr_loader *l = calloc(1, sizeof *l);
    if (!l) {
        fr_error(FR_ERR_OOM, "loader: out of memory");
        return NULL;
    }
    l->ds = ds;
    l->cfg = *cfg;
    l->n_batches = cfg->drop_last ? ds->n / cfg->batch_size
                                  : (ds->n + cfg->batch_size - 1) / cfg->batch_size;
    l->perm_epoch = -1;
    /* the order is input bookkeeping proportional to the dataset: counted */
    l->perm = fr_mem_alloc(FR_CPU, (size_t)ds->n * sizeof *l->perm, FR_TAG_DATA);
    if (!l->perm) {
        free(l);
        return NULL;
    }
    if (cfg->prefetch) {
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv, NULL);
        if (pthread_create(&l->thread, NULL, worker, l) != 0) {
            pthread_mutex_destroy(&l->mu);
            pthread_cond_destroy(&l->cv);
            fr_mem_free(FR_CPU, l->perm, (size_t)ds->n * sizeof *l->perm, FR_TAG_DATA);
            free(l);
            fr_error(FR_ERR_OOM, "loader: cannot start the prefetch thread");
            return NULL;
        }
        l->threaded = true;
    }
    return l;
}

void fr_loader_free(fr_loader *l) {
    if (!l)
        return;
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        if (l->full)
            result_release(&l->slot);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
    }
    fr_mem_free(FR_CPU, l->perm, (size_t)l->ds->n * sizeof *l->perm, FR_TAG_DATA);
    free(l);
}

int64_t fr_loader_num_batches(const fr_loader *l) { return l->n_batches; }
int64_t fr_loader_epoch(const fr_loader *l) { return l->epoch; }
int64_t fr_loader_batch(const fr_loader *l) { return l->batch; }

fr_status fr_loader_seek(fr_loader *l, int64_t epoch, int64_t batch) {
    if (!l || epoch < 0 || batch < 0 || batch > l->n_batches)
        return fr_error(FR_ERR_ARG, "loader: cannot seek to batch %lld of epoch %lld (%lld batches "
                        "per epoch)", (long long)batch, (long long)epoch,
                        (long long)(l ? l->n_batches : 0));
    l->epoch = epoch;
    l->batch = batch;
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        l->gen++;
        if (l->full)
            result_release(&l->slot);
        l->full = false;
        l->build_epoch = epoch;
        l->build_batch = batch;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
    return FR_OK;
}

fr_status fr_loader_next(fr_loader *l, fr_tensor **images, fr_tensor **labels) {
    if (!l || !images || !labels)
        return fr_error(FR_ERR_ARG, "loader: next: loader or output pointer is NULL");
    *images = *labels = NULL;
    batch_result r;
    if (l->threaded) {
        pthread_mutex_lock(&l->mu);
        while (!l->full)
            pthread_cond_wait(&l->cv, &l->mu);
        r = l->slot;
        l->full = false;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
    } else {
        build_batch(l, l->epoch, l->batch, &r);
    }
    if (l->batch >= l->n_batches) {
        l->epoch++;
        l->batch = 0;
    } else {
        l->batch++;
    }
    if (r.status != FR_OK)
        return fr_error(r.status, "%s", r.message);
    if (r.images && l->cfg.device != FR_CPU) {
        fr_tensor *x = fr_to_device(r.images, l->cfg.device, FR_TAG_DATA);
        fr_tensor *y = x ? fr_to_device(r.labels, l->cfg.device, FR_TAG_DATA) : NULL;
        result_release(&r);
        if (!y) {
            fr_release(x);
            return fr_last_status();
        }
        r.images = x;
        r.labels = y;
    }
    *images = r.images;
    *labels = r.labels;
    return FR_OK;
}
