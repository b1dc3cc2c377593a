/* ddp.c: a model replica per process, gradient buckets all-reduced while
 * backward runs (see dist.h).
 *
 * A bucket's all-reduce starts when its last parameter is reported final by
 * the tape (autograd.h: fr_set_grad_ready_hook) during the backward of the
 * step's last micro-batch. Every process runs the same graph, so buckets
 * become ready, and their collectives are issued, in the same order on all
 * of them, which MPI requires. Open MPI progresses a non-blocking
 * collective only inside MPI calls (no progress thread by default), so each
 * report also tests the all-reduces in flight. finish() starts what is left
 * (parameters backward never reported, buckets never filled) in bucket
 * order, waits, and writes sum / world size back into the gradients. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../autograd/autograd.h"
#include "../cuda/fr_cuda.h"
#include "../tensor/kernels.h"
#include "../tensor/ops.h"
#include "internal.h"

#define MIB ((size_t)1 << 20)

static fr_status mpi_fail(const char *what, int rc) {
    char msg[MPI_MAX_ERROR_STRING];
    return fr_error(FR_ERR_IO, "dist: %s failed: %s", what, fr_dist_mpi_error(rc, msg, (int)sizeof msg));
}

/* Rank 0's registry entries (all, or the buffers) on every process: CPU
 * tensors over MPI, CUDA tensors in one NCCL group on the device (the main
 * stream waits for it; the host does not). */
static fr_status bcast_entries(fr_dist *d, bool buffers_only) {
    fr_params *p = d->model->params;
    void **bufs = malloc((size_t)p->count * sizeof *bufs);
    size_t *bytes = malloc((size_t)p->count * sizeof *bytes);
    fr_status st = bufs && bytes ? FR_OK : fr_error(FR_ERR_OOM, "dist: out of memory broadcasting the model");
    int on_gpu = 0;
    for (int i = 0; i < p->count && st == FR_OK; i++) {
        fr_tensor *t = p->items[i].tensor;
        size_t n = fr_nbytes(t);
        if (buffers_only && p->items[i].kind != FR_BUFFER)
            continue;
        if (fr_device_of(t) != FR_CPU) {
            if (!d->nccl)
                st = fr_error(FR_ERR_DEVICE, "dist: %s is on the GPU but the model's parameters are not",
                              p->items[i].name);
            bufs[on_gpu] = fr_data(t);
            bytes[on_gpu++] = n;
        } else if (n > (size_t)INT32_MAX) {
            st = fr_error(FR_ERR_ARG, "dist: %s (%zu bytes) is too large to broadcast in one message",
                          p->items[i].name, n);
        } else {
            fr_dist_wait_begin(d, buffers_only ? "MPI_Bcast (batch norm buffers from rank 0)"
                                               : "MPI_Bcast (the model from rank 0)");
            int rc = MPI_Bcast(fr_data(t), (int)n, MPI_BYTE, 0, d->ctl);
            fr_dist_wait_end(d);
            if (rc != MPI_SUCCESS)
                st = mpi_fail("MPI_Bcast", rc);
        }
    }
    if (st == FR_OK && on_gpu)
        st = fr_cuda_nccl_broadcast_start(d->nccl, bufs, bytes, on_gpu, 0);
    if (st == FR_OK && on_gpu) {
        fr_dist_wait_begin(d, buffers_only ? "NCCL broadcast (batch norm buffers from rank 0)"
                                           : "NCCL broadcast (the model from rank 0)");
        st = fr_cuda_nccl_wait(d->nccl);
        fr_dist_wait_end(d);
    }
    free(bufs);
    free(bytes);
    return st;
}

static fr_status start_bucket(fr_dist *d, fr_bucket *b) {
    b->started = true;
    b->early = d->armed;
    if (d->dev != FR_CPU)
        return fr_cuda_nccl_sum_start(d->nccl, b->buf, b->numel, false);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)b->numel, MPI_FLOAT, MPI_SUM, d->grads, &b->req);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail("MPI_Iallreduce", rc);
}

/* Lets the all-reduces in flight advance (MPI progresses them in calls). */
static fr_status progress(fr_dist *d) {
    for (int k = 0; d->dev == FR_CPU && k < d->n_buckets; k++) {
        fr_bucket *b = &d->buckets[k];
        int done = 0;
        if (b->started && b->req != MPI_REQUEST_NULL) {
            int rc = MPI_Test(&b->req, &done, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS)
                return mpi_fail("MPI_Test", rc);
        }
    }
    return FR_OK;
}

/* Registry entry i's gradient is final: into its bucket, which starts when
 * it is full. */
static fr_status mark_ready(fr_dist *d, int i) {
    fr_tensor *t = d->model->params->items[i].tensor;
    fr_bucket *b = &d->buckets[d->bucket_of[i]];
    float *dst = b->buf + d->offset[i];
    size_t n = (size_t)fr_numel(t);
    fr_status st;
    d->ready[i] = true;
    d->had_grad[i] = t->grad != NULL;
    if (t->grad)
        st = FR_CALL_KERNEL(d->dev, scale, dst, fr_data_f32(t->grad), 1.0f, n);
    else
        st = FR_CALL_KERNEL(d->dev, fill, dst, 0.0f, n);
    if (st == FR_OK && --b->pending == 0)
        st = start_bucket(d, b);
    return st;
}

static fr_status on_grad_ready(fr_tensor *leaf, void *ctx) {
    fr_dist *d = ctx;
    if (!d->armed)
        return FR_OK;
    fr_params *p = d->model->params;
    /* Reports come in about reverse registry order: search down from the last hit. */
    int found = -1;
    for (int k = 0; k < p->count && found < 0; k++) {
        int j = ((d->last_hit - k) % p->count + p->count) % p->count;
        if (p->items[j].tensor == leaf && d->bucket_of[j] >= 0)
            found = j;
    }
    if (found < 0) /* not a parameter of the model (a checkpointed segment's input) */
        return FR_OK;
    d->last_hit = found;
    if (d->ready[found])
        return fr_error(FR_ERR_GRAPH, "dist: the gradient of %s was reported final twice in one backward "
                        "(a parameter shared across a checkpointed segment's boundary?); its bucket was "
                        "already sent, so data-parallel training cannot use this model",
                        p->items[found].name);
    FR_TRY(mark_ready(d, found));
    return progress(d);
}

static fr_status sync_begin(void *ctx, int micro, int parts) {
    fr_dist *d = ctx;
    if (d->opt.sync_bn)
        fr_batch_norm_set_sync(fr_dist_bn_sum, d);
    if (micro != parts - 1)
        return FR_OK;
    fr_params *p = d->model->params;
    memset(d->ready, 0, (size_t)p->count * sizeof *d->ready);
    memset(d->had_grad, 0, (size_t)p->count * sizeof *d->had_grad);
    for (int k = 0; k < d->n_buckets; k++) {
        fr_bucket *b = &d->buckets[k];
        b->pending = b->count;
        b->started = b->early = false;
        b->req = MPI_REQUEST_NULL;
    }
    d->last_hit = p->count - 1;
    d->armed = !d->opt.no_overlap;
    return FR_OK;
}

static fr_status sync_finish(void *ctx) {
    fr_dist *d = ctx;
    fr_batch_norm_set_sync(NULL, NULL);
    d->armed = false;
    double t0 = MPI_Wtime();
    fr_status st = FR_OK;
    for (int k = 0; k < d->n_buckets && st == FR_OK; k++) {
        fr_bucket *b = &d->buckets[k];
        for (int j = b->first; j < b->first + b->count && st == FR_OK && !b->started; j++)
            if (!d->ready[d->order[j]])
                st = mark_ready(d, d->order[j]);
    }
    fr_dist_wait_begin(d, d->dev == FR_CPU ? "MPI_Wait (gradient all-reduce)" : "NCCL wait (gradient all-reduce)");
    if (st == FR_OK && d->dev == FR_CPU) {
        for (int k = 0; k < d->n_buckets && st == FR_OK; k++) {
            int rc = MPI_Wait(&d->buckets[k].req, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS)
                st = mpi_fail("MPI_Wait", rc);
        }
    } else if (st == FR_OK) {
        st = fr_cuda_nccl_wait(d->nccl);
    }
    fr_dist_wait_end(d);
    d->stats.backward_end = t0;
    d->stats.reduced_end = MPI_Wtime();
    d->stats.wait_seconds += d->stats.reduced_end - t0;
    fr_params *p = d->model->params;
    float inv = 1.0f / (float)d->world;
    for (int j = 0; j < d->n_order && st == FR_OK; j++) {
        int i = d->order[j];
        fr_tensor *t = p->items[i].tensor;
        if (d->had_grad[i])
            st = FR_CALL_KERNEL(d->dev, scale, fr_data_f32(t->grad),
                                d->buckets[d->bucket_of[i]].buf + d->offset[i], inv, (size_t)fr_numel(t));
    }
    for (int k = 0; k < d->n_buckets; k++)
        if (d->buckets[k].early)
            d->early_bytes += d->buckets[k].numel * sizeof(float);
    d->all_bytes += d->stats.bytes;
    /* Every replica continues with rank 0's running statistics. */
    if (st == FR_OK)
        st = bcast_entries(d, true);
    d->stats.steps++;
    return st;
}

static fr_status sync_any(void *ctx, bool *flag) { return fr_dist_any(ctx, flag); }

/* The default bucket size of a CPU model, 0.05 MiB: over TCP what backward
 * cannot hide is the last buckets (the first layers), so small buckets hide
 * the most; tests/multihost.sh --bench measured ResNet-20/56 on 1 Gbit/s and
 * 100 Mbit/s links hiding 71-97% of the all-reduce with 0.05 MiB against
 * 35-69% with 25 MiB (bench/RESULTS.md, docs/DISTRIBUTED.md). GPU models keep
 * 25 MiB (NCCL; PyTorch's DDP default). */
#define CPU_BUCKET_BYTES ((size_t)52429)

static fr_status build_buckets(fr_dist *d) {
    fr_params *p = d->model->params;
    size_t cap = d->opt.bucket_bytes ? d->opt.bucket_bytes : d->dev == FR_CPU ? CPU_BUCKET_BYTES : 25 * MIB;
    size_t first_cap = d->opt.first_bucket_bytes ? d->opt.first_bucket_bytes : cap < MIB ? cap : MIB;
    int n = p->count;
    d->order = calloc((size_t)(n ? n : 1), sizeof *d->order);
    d->bucket_of = calloc((size_t)(n ? n : 1), sizeof *d->bucket_of);
    d->offset = calloc((size_t)(n ? n : 1), sizeof *d->offset);
    d->ready = calloc((size_t)(n ? n : 1), sizeof *d->ready);
    d->had_grad = calloc((size_t)(n ? n : 1), sizeof *d->had_grad);
    d->buckets = calloc((size_t)(n ? n : 1), sizeof *d->buckets);
    if (!d->order || !d->bucket_of || !d->offset || !d->ready || !d->had_grad || !d->buckets)
        return fr_error(FR_ERR_OOM, "dist: out of memory building gradient buckets");
    for (int i = n - 1; i >= 0; i--) {
        d->bucket_of[i] = -1;
        fr_tensor *t = p->items[i].tensor;
        if (p->items[i].kind != FR_PARAMETER)
            continue;
        if (t->dtype != FR_F32 || fr_device_of(t) != d->dev)
            return fr_error(FR_ERR_ARG, "dist: parameter %s must be f32 on the model's device", p->items[i].name);
        size_t bytes = (size_t)fr_numel(t) * sizeof(float);
        fr_bucket *b = d->n_buckets ? &d->buckets[d->n_buckets - 1] : NULL;
        size_t limit = d->n_buckets == 1 ? first_cap : cap;
        if (!b || (b->count > 0 && (b->numel * sizeof(float) + bytes > limit))) {
            b = &d->buckets[d->n_buckets++];
            b->first = d->n_order;
        }
        d->bucket_of[i] = d->n_buckets - 1;
        d->offset[i] = b->numel;
        b->numel += (size_t)fr_numel(t);
        b->count++;
        d->order[d->n_order++] = i;
    }
    for (int k = 0; k < d->n_buckets; k++) {
        fr_bucket *b = &d->buckets[k];
        if (b->numel > (size_t)INT32_MAX)
            return fr_error(FR_ERR_ARG, "dist: a bucket of %zu elements is too large for one all-reduce", b->numel);
        b->req = MPI_REQUEST_NULL;
        /* the reduced copy of the gradients: counted as gradient bytes */
        if (!(b->buf = fr_mem_alloc(d->dev, b->numel * sizeof(float), FR_TAG_GRAD)))
            return fr_last_status();
        d->stats.bytes += b->numel * sizeof(float);
    }
    d->stats.buckets = d->n_buckets;
    return FR_OK;
}

/* FNV-1a over bytes, folded into h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Every process attaches the same model: the same registry, entry for
 * entry (name, kind, dtype, shape), and the same options. Checked by one
 * all-reduce of a hash (min and max agree) before the broadcast, which
 * sent each tensor with its own local size: another model on one rank
 * crashed Open MPI's error handler, and other options (--sync-bn on one
 * rank) hung in a collective until the timeout, reported as a lost
 * network. */
static fr_status check_agreement(fr_dist *d) {
    const fr_params *p = d->model->params;
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv(h, &p->count, sizeof p->count);
    for (int i = 0; i < p->count; i++) {
        const fr_tensor *t = p->items[i].tensor;
        h = fnv(h, p->items[i].name, strlen(p->items[i].name) + 1);
        h = fnv(h, &p->items[i].kind, sizeof p->items[i].kind);
        h = fnv(h, &t->dtype, sizeof t->dtype);
        h = fnv(h, &t->ndim, sizeof t->ndim);
        h = fnv(h, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
    }
    uint64_t model = h;
    /* the options that shape a collective: the buckets' bounds, batch
     * norm's all-reduce (no_overlap only moves when a bucket starts) */
    const fr_dist_options *o = &d->opt;
    h = fnv(h, &o->bucket_bytes, sizeof o->bucket_bytes);
    h = fnv(h, &o->first_bucket_bytes, sizeof o->first_bucket_bytes);
    h = fnv(h, &o->sync_bn, sizeof o->sync_bn);
    uint64_t mine[2] = {h, ~h}, agreed[2];
    fr_dist_wait_begin(d, "MPI_Allreduce (checking that every process has the same model)");
    int rc = MPI_Allreduce(mine, agreed, 2, MPI_UINT64_T, MPI_MIN, d->ctl);
    fr_dist_wait_end(d);
    if (rc != MPI_SUCCESS)
        return mpi_fail("MPI_Allreduce", rc);
    if (agreed[0] == h && ~agreed[1] == h) /* the least and the greatest are this one */
        return FR_OK;
    /* which part differs somewhere: the model, or the options */
    uint64_t m2[2] = {model, ~model}, a2[2];
    rc = MPI_Allreduce(m2, a2, 2, MPI_UINT64_T, MPI_MIN, d->ctl);
    bool same_model = rc == MPI_SUCCESS && a2[0] == model && ~a2[1] == model;
    return fr_error(FR_ERR_ARG, "dist: rank %d: the processes did not attach the same %s (%s): every "
                    "process must run the same model with the same options",
                    d->rank, same_model ? "options" : "model",
                    same_model ? "bucket sizes, or synchronised batch norm on some processes only"
                               : "parameter and buffer names, kinds, dtypes or shapes differ");
}

fr_status fr_dist_attach(fr_dist *d, fr_model *m, const fr_dist_options *o) {
    if (!d || !m)
        return fr_error(FR_ERR_ARG, "dist: attach: dist or model is NULL");
    if (d->model)
        return fr_error(FR_ERR_ARG, "dist: a model is attached already (one per fr_dist)");
    if (!m->params->count)
        return fr_error(FR_ERR_ARG, "dist: model %s has no parameters", m->name);
    d->model = m;
    d->opt = o ? *o : (fr_dist_options){0};
    d->dev = fr_device_of(m->params->items[0].tensor);
    d->stats = (fr_dist_stats){0};
    d->early_bytes = d->all_bytes = 0;
    fr_status st = check_agreement(d);
    if (st == FR_OK && d->dev != FR_CPU)
        st = fr_dist_nccl_connect(d);
    if (st == FR_OK)
        st = build_buckets(d);
    if (st == FR_OK)
        st = bcast_entries(d, false);
    if (st != FR_OK) {
        fr_dist_detach(d);
        return st;
    }
    d->sync = (fr_grad_sync){.ctx = d, .begin = sync_begin, .finish = sync_finish, .any = sync_any};
    m->grad_sync = &d->sync;
    fr_set_grad_ready_hook(on_grad_ready, d);
    return FR_OK;
}

void fr_dist_detach(fr_dist *d) {
    if (!d || !d->model)
        return;
    if (d->model->grad_sync == &d->sync) {
        d->model->grad_sync = NULL;
        fr_set_grad_ready_hook(NULL, NULL);
    }
    fr_batch_norm_set_sync(NULL, NULL);
    /* first: it waits for any collective still reading a bucket (a failed step) */
    fr_cuda_nccl_free(d->nccl);
    for (int k = 0; d->buckets && k < d->n_buckets; k++)
        if (d->buckets[k].buf)
            fr_mem_free(d->dev, d->buckets[k].buf, d->buckets[k].numel * sizeof(float), FR_TAG_GRAD);
    free(d->buckets);
    free(d->order);
    free(d->bucket_of);
    free(d->offset);
    free(d->ready);
    free(d->had_grad);
    d->nccl = NULL;
    d->buckets = NULL;
    d->order = d->bucket_of = NULL;
    d->offset = NULL;
    d->ready = d->had_grad = NULL;
    d->n_buckets = d->n_order = 0;
    d->model = NULL;
}

fr_dist_stats fr_dist_get_stats(const fr_dist *d) {
    fr_dist_stats s = d->stats;
    s.started_early = d->all_bytes ? (double)d->early_bytes / (double)d->all_bytes : 0;
    return s;
}
