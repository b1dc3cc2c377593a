/* loader.c: see loader.h.
 *
 * The batch at (epoch, index) is a pure function of the config and the
 * dataset (build_batch), so the background thread only changes WHEN a batch
 * is built, not what it holds. The thread and the caller share one slot
 * guarded by a mutex and a condition variable: the thread fills it and
 * waits while it is full; next() waits while it is empty and empties it.
 * A generation counter lets seek() and free() discard a batch the thread
 * was building for a position that no longer matters.
 *
 * CUDA batches are built into pinned (page-locked) staging buffers instead of
 * CPU tensors; next() allocates the device tensors, enqueues asynchronous
 * copies on the one stream (the caller's next kernels order after them) and
 * records the staging buffer's event. Two buffers alternate: batch k is
 * built into buffer k % 2, whose last reader was batch k-2's copy, so the
 * builder waits on that buffer's event before refilling it. The wait is
 * almost always already over (the copy was enqueued a whole batch earlier)
 * and happens on the builder's thread, never stalling the caller's stream.
 * Two suffice: the builder starts batch k only after next() took batch k-1,
 * which is after next() enqueued batch k-2's copy and recorded its event.
 * If the buffers cannot be pinned, batches go the plain way (CPU tensors,
 * then fr_to_device). */
#include "loader.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/fr_cuda.h"

#define N_STAGES 2

typedef struct {
    float *images;          // (B, C, H, W) pinned
    int32_t *labels;        // (B,) pinned
    fr_cuda_event *copied;  /* recorded after the copies that read this buffer */
} stage;

typedef struct {
    fr_tensor *images, *labels;  /* NULL, NULL (and stage -1): the end-of-epoch marker */
    int stage;                   /* >= 0: the batch is in that staging buffer */
    int64_t size;                /* images in it */
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
    /* CUDA staging; next_stage belongs to whoever builds (thread or caller) */
    bool staged;
    stage stages[N_STAGES];
    int next_stage;
};

static void make_perm(fr_loader *l, int64_t epoch) {
    int64_t n = l->ds->n;
    for (int64_t i = 0; i < n; i++)
        l->perm[i] = i;
    if (l->cfg.shuffle) {
        /* A stream apart from the per-image ones, which use positions < N. */
        fr_data_rng r;
        fr_data_rng_seed(&r, fr_data_rng_mix(l->cfg.seed, (uint64_t)epoch, UINT64_MAX));
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)fr_data_rng_below(&r, (uint64_t)i + 1);
            int64_t t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
    l->perm_epoch = epoch;
}

/* ---- sharding (loader.h) ---- */

static int64_t shard_count(const fr_loader *l) { return l->cfg.shards > 1 ? l->cfg.shards : 1; }

/* This process's part of global batch `index`: positions [*start, *start +
 * *size) of the epoch's order. */
static void shard_range(const fr_loader *l, int64_t index, int64_t *start, int64_t *size) {
    int64_t shards = shard_count(l), r = shards > 1 ? l->cfg.shard : 0;
    int64_t global = (int64_t)l->cfg.batch_size * shards, g0 = index * global;
    int64_t len = l->ds->n - g0 < global ? l->ds->n - g0 : global;
    int64_t lo = len * r / shards, hi = len * (r + 1) / shards;
    *start = g0 + lo;
    *size = hi - lo;
}

static int64_t count_batches(const fr_loader *l) {
    int64_t global = (int64_t)l->cfg.batch_size * shard_count(l), n = l->ds->n;
    if (l->cfg.drop_last || n % global == 0)
        return n / global;
    int64_t start, size;
    shard_range(l, n / global, &start, &size);
    return n / global + (size > 0);
}

/* ---- staging buffers (CUDA) ---- */

static void stages_free(fr_loader *l) {
    for (int k = 0; k < N_STAGES; k++) {
        stage *st = &l->stages[k];
        /* a copy still reading the buffer must finish before it is unpinned;
         * a failed wait leaves nothing better to do than free */
        if (st->copied)
            (void)fr_cuda_event_wait(st->copied);
        fr_cuda_host_free(st->images);
        fr_cuda_host_free(st->labels);
        fr_cuda_event_free(st->copied);
        memset(st, 0, sizeof *st);
    }
}

/* Pins N_STAGES buffers of one full batch each; false (nothing held) when the
 * driver refuses. */
static bool stages_new(fr_loader *l) {
    const fr_dataset *ds = l->ds;
    size_t bs = (size_t)l->cfg.batch_size, chw = (size_t)(ds->c * ds->h * ds->w);
    for (int k = 0; k < N_STAGES; k++) {
        stage *st = &l->stages[k];
        st->images = fr_cuda_host_alloc(bs * chw * sizeof(float));
        st->labels = st->images ? fr_cuda_host_alloc(bs * sizeof(int32_t)) : NULL;
        st->copied = st->labels ? fr_cuda_event_new() : NULL;
        if (!st->copied) {
            stages_free(l);
            return false;
        }
    }
    return true;
}

/* Builds batch `index` of `epoch` on the host, into CPU tensors or a staging
 * buffer; index == n_batches gives the end-of-epoch marker. */
static void build_batch(fr_loader *l, int64_t epoch, int64_t index, batch_result *out) {
    memset(out, 0, sizeof *out);
    out->stage = -1;
    if (index >= l->n_batches)
        return;
    if (l->perm_epoch != epoch)
        make_perm(l, epoch);
    const fr_dataset *ds = l->ds;
    int64_t start, bs;
    shard_range(l, index, &start, &bs);
    float *px = NULL;      // (bs, C, H, W)
    int32_t *lab = NULL;   // (bs,)
    if (l->staged) {
        int k = l->next_stage;
        l->next_stage = (k + 1) % N_STAGES;
        out->status = fr_cuda_event_wait(l->stages[k].copied); /* see the top of the file */
        out->stage = k;
        out->size = bs;
        px = l->stages[k].images;
        lab = l->stages[k].labels;
    } else {
        out->images = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(bs, ds->c, ds->h, ds->w), FR_TAG_DATA);
        out->labels = out->images ? fr_empty(FR_CPU, FR_I32, 1, FR_SHAPE(bs), FR_TAG_DATA) : NULL;
        out->status = out->labels ? FR_OK : fr_last_status();
        if (out->labels) {
            px = fr_data_f32(out->images);
            lab = fr_data(out->labels);
        }
    }
    const int64_t chw = ds->c * ds->h * ds->w;
    for (int64_t j = 0; j < bs && out->status == FR_OK; j++) {
        int64_t pos = start + j, i = l->perm[pos];
        fr_data_rng r;
        fr_data_rng_seed(&r, fr_data_rng_mix(l->cfg.seed, (uint64_t)epoch, (uint64_t)pos));
        out->status = fr_aug_apply(px + j * chw, fr_dataset_image(ds, i), (int)ds->c, (int)ds->h,
                                   (int)ds->w, &l->cfg.aug, &r);
        lab[j] = fr_dataset_label(ds, i);
    }
    if (out->status != FR_OK) {
        snprintf(out->message, sizeof out->message, "loader: batch %lld of epoch %lld: %s",
                 (long long)index, (long long)epoch, fr_last_error());
        fr_clear(&out->images);
        fr_clear(&out->labels);
        out->stage = -1;
    }
}

/* Device tensors for a staged batch, filled by asynchronous copies. */
static fr_status upload(fr_loader *l, const batch_result *r, fr_tensor **images,
                        fr_tensor **labels) {
    const fr_dataset *ds = l->ds;
    stage *st = &l->stages[r->stage];
    fr_tensor *x = fr_empty(FR_CUDA, FR_F32, 4, FR_SHAPE(r->size, ds->c, ds->h, ds->w), FR_TAG_DATA);
    fr_tensor *y = x ? fr_empty(FR_CUDA, FR_I32, 1, FR_SHAPE(r->size), FR_TAG_DATA) : NULL;
    fr_status s = y ? FR_OK : fr_last_status();
    if (s == FR_OK)
        s = fr_cuda_memcpy_async(fr_data(x), st->images, fr_nbytes(x), FR_COPY_H2D);
    if (s == FR_OK)
        s = fr_cuda_memcpy_async(fr_data(y), st->labels, fr_nbytes(y), FR_COPY_H2D);
    /* Recorded whatever happened: a copy that was enqueued must finish before
     * the builder refills the buffer. */
    fr_status e = fr_cuda_event_record(st->copied);
    if (s == FR_OK)
        s = e;
    if (s != FR_OK) {
        fr_release(x);
        fr_release(y);
        return s;
    }
    *images = x;
    *labels = y;
    return FR_OK;
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
    if (cfg->shards < 0 || (cfg->shards > 1 && (cfg->shard < 0 || cfg->shard >= cfg->shards))) {
        fr_error(FR_ERR_ARG, "loader: bad config for %s: shard %d of %d (0 <= shard < shards)",
                 ds->name, cfg->shard, cfg->shards);
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
    l->n_batches = count_batches(l);
    l->perm_epoch = -1;
    /* the order is input bookkeeping proportional to the dataset: counted */
    l->perm = fr_mem_alloc(FR_CPU, (size_t)ds->n * sizeof *l->perm, FR_TAG_DATA);
    if (!l->perm) {
        free(l);
        return NULL;
    }
    /* Without a device (or pinned memory) the plain path reports the problem
     * when a batch is moved, as it always has. */
    if (cfg->device == FR_CUDA && fr_cuda_device_count() > 0)
        l->staged = stages_new(l);
    if (cfg->prefetch) {
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv, NULL);
        if (pthread_create(&l->thread, NULL, worker, l) != 0) {
            pthread_mutex_destroy(&l->mu);
            pthread_cond_destroy(&l->cv);
            if (l->staged)
                stages_free(l);
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
    if (l->staged)
        stages_free(l);
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
    if (r.stage >= 0)
        return upload(l, &r, images, labels);
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
