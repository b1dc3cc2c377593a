/* program_validate.c: the validate program as a library call,
 * fr_validate_main (programs/programs.h; examples/validate.c is its main). It
 * evaluates saved weights on a test set and compares the memory of
 * that pass with the memory of one training step of the same model.
 *
 *     validate --checkpoint out/demo.safetensors --data fashion-mnist
 *
 * The file is a training checkpoint (train --save) or a plain weights file
 * (fr_params_save, or PyTorch's safetensors with the same names; then give
 * --model). The pass runs in eval mode under no_grad, so it keeps no
 * activations for backward: its peak is the weights plus the few activations
 * in flight. The training step (forward + backward on one batch, with the
 * checkpoint's memory strategy, no optimizer) shows what training the same
 * model at the same batch size costs. Both run under --precision (default: the
 * precision the checkpoint records, else f32). --save-logits FILE writes the
 * eval pass's logits, labels and predictions, in dataset order, as
 * safetensors (docs/INSTALL.md reads them from Python). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frugal.h"
#include "train/state.h"
#include "programs/cli_impl.h"
#include "programs/programs.h"

static const char *const device_names[] = {"cpu", "cuda"};

typedef struct {
    const char *checkpoint, *model, *data, *strategy, *save_logits;
    int64_t batch, limit_test, threads;
    int device;
    fr_dtype precision;
    bool precision_given;
    fr_strategy strat;   /* parsed --strategy */
    size_t memory_limit; /* --memory-limit: ledger cap per device, 0 = none */
} options;

static void usage(FILE *out) {
    fprintf(out,
            "usage: validate --checkpoint PATH [flags]\n"
            "  --checkpoint PATH   training checkpoint or weights file (safetensors)\n"
            "  --model NAME        needed for a weights file without frugal metadata\n"
            "  --data SPEC         fashion-mnist[:DIR] (default), mnist:DIR, cifar10:DIR, cifar100:DIR,\n"
            "                      folder:DIR (uses DIR/test)\n"
            "  --batch N           images per batch (128)\n"
            "  --strategy S        memory strategy of the measured training step (default: the\n"
            "                      checkpoint's, else plain)\n"
            "  --precision P       f32, f16 or bf16: the precision of both passes (default: the\n"
            "                      checkpoint's, else f32)\n"
            "  --limit-test N      only the first N test images (0 = all)\n"
            "  --threads N         CPU threads\n"
            "  --device D          cpu (default) or cuda\n"
            "  --memory-limit SIZE cap the memory ledger of each device (K, M or G suffix)\n"
            "  --save-logits FILE  write logits (N, classes) f32, labels and predictions (N) i32\n"
            "                      of the test images, in order, as safetensors\n");
}

static fr_status parse_args(int argc, char **argv, options *o) {
    *o = (options){.batch = 128};
    fr_cli_seen seen = {.n = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        static const char *const known[] = {"--checkpoint", "--model", "--data", "--strategy",
                                            "--batch", "--limit-test", "--threads", "--device",
                                            "--precision", "--memory-limit",
                                            "--save-logits"};
        bool ok = false;
        for (size_t k = 0; k < sizeof known / sizeof *known; k++)
            ok |= !strcmp(a, known[k]);
        if (!ok || !v)
            return fr_cli_bad_flag("validate", a, ok);
        FR_TRY(fr_cli_seen_add(&seen, a, v));
        i++;
        if (!strcmp(a, "--checkpoint"))
            o->checkpoint = v;
        else if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--data"))
            o->data = v;
        else if (!strcmp(a, "--strategy")) {
            o->strategy = v;
            FR_TRY(fr_cli_strategy(a, v, &o->strat));
        } else if (!strcmp(a, "--memory-limit"))
            FR_TRY(fr_cli_size(a, v, &o->memory_limit));
        else if (!strcmp(a, "--save-logits"))
            o->save_logits = v;
        else if (!strcmp(a, "--batch"))
            FR_TRY(fr_cli_int(a, v, 1, INT32_MAX, &o->batch));
        else if (!strcmp(a, "--limit-test"))
            FR_TRY(fr_cli_int(a, v, 0, INT64_MAX, &o->limit_test));
        else if (!strcmp(a, "--threads"))
            FR_TRY(fr_cli_int(a, v, 1, 1024, &o->threads));
        else if (!strcmp(a, "--device"))
            FR_TRY(fr_cli_choice(a, v, device_names, 2, &o->device));
        else if (!strcmp(a, "--precision")) {
            FR_TRY(fr_cli_precision(a, v, &o->precision));
            o->precision_given = true;
        } else
            FR_ASSERT(!"a known flag without a case");
    }
    if (!o->checkpoint)
        return fr_error(FR_ERR_ARG, "--checkpoint PATH is required (see validate --help)");
    if (o->model)
        FR_TRY(fr_cli_model_check("--model", o->model));
    if (o->strategy && o->precision_given)
        FR_TRY(fr_cli_strategy_precision(o->strategy, o->strat, o->precision));
    if (o->data) {
        fr_data_spec spec;
        FR_TRY(fr_data_spec_parse(o->data, &spec));
    }
    return FR_OK;
}

typedef struct {
    fr_dataset *ds;
    fr_loader *ld;
    fr_model *model;
    fr_device dev;
} run;

static void run_free(run *r) {
    fr_loader_free(r->ld);
    fr_model_free(r->model);
    fr_dataset_free(r->ds);
}

static fr_status setup(const options *o, run *r) {
    fr_state_info info;
    FR_TRY(fr_state_read_info(o->checkpoint, &info));
    const char *name = o->model ? o->model : info.model[0] ? info.model : NULL;
    if (!name)
        return fr_error(FR_ERR_ARG, "%s has no frugal metadata naming its model: give --model",
                        o->checkpoint);
    if (!o->model)
        FR_TRY(fr_cli_model_check("--checkpoint: the checkpoint's model", name));
    fr_data_spec spec;
    FR_TRY(fr_data_spec_parse(o->data ? o->data : info.is_training ? info.state.data : "fashion-mnist",
                              &spec));
    if (o->save_logits) {
        /* before any work: the logits never replace what is read */
        FR_TRY(fr_outfile_check("--save-logits", o->save_logits, &o->checkpoint, 1));
    }
    if (!spec.channels && info.in_channels)
        spec.channels = info.in_channels == 1 ? 1 : 3; /* a folder's images, as the model takes them */
    if (!(r->ds = fr_data_open(&spec, false, o->limit_test)))
        return fr_last_status();
    int classes = info.num_classes ? info.num_classes : r->ds->num_classes;
    if (r->ds->num_classes > classes)
        return fr_error(FR_ERR_FORMAT, "--data %s has %d classes, but the model %s in %s has %d outputs: "
                        "its labels cannot be scored by this model", o->data ? o->data : spec.dir,
                        r->ds->num_classes, name, o->checkpoint, classes);
    if (!(r->model = fr_cli_model_create(name, (int)r->ds->c, classes, 0)))
        return fr_last_status();
    r->model->cfg.strategy = info.strategy;
    /* abn replaces each BN + ReLU by BN + leaky ReLU (nn/model.h): another
     * function than the one the weights were trained as. The checkpoint's
     * "strategy" field says which; a file without it was trained plain. */
    bool leaky = info.strategy.abn || info.strategy.abn_reference;
    if (o->strategy && (o->strat.abn || o->strat.abn_reference) != leaky) {
        char trained[96];
        fr_strategy_format(info.strategy, trained, sizeof trained);
        return fr_error(FR_ERR_ARG, "--strategy %s: abn changes the network's function, and %s was "
                        "trained %s it (its strategy: %s%s); validate it with%s abn", o->strategy,
                        o->checkpoint, leaky ? "with" : "without", trained,
                        info.model[0] ? "" : ", as a weights file without frugal metadata",
                        leaky ? "" : "out");
    }
    if (o->strategy)
        r->model->cfg.strategy = o->strat;
    /* any precision evaluates any weights: they stay f32 */
    r->model->cfg.precision = o->precision_given ? o->precision : info.state.precision;
    r->dev = o->device ? FR_CUDA : FR_CPU;
    if (r->dev != FR_CPU)
        FR_TRY(fr_params_to_device(r->model->params, r->dev));
    FR_TRY(fr_state_load(o->checkpoint, r->model, NULL, NULL, NULL));
    fr_loader_config lc = {.batch_size = (int)o->batch, .aug = fr_data_augment(spec.kind, r->ds, false),
                           .device = r->dev, .prefetch = false};
    r->ld = fr_loader_new(r->ds, &lc);
    return r->ld ? FR_OK : fr_last_status();
}

/* Peak bytes above what was resident before the measured work (the dataset
 * on the CPU and the model), plus the model: what the pass needs besides
 * the data set it reads. The loader does not prefetch here, so the batch in
 * flight is allocated inside the pass and counted in it. */
static size_t peak_with_model(const run *r, size_t before) {
    return fr_mem_total_peak(r->dev) - before + fr_params_bytes(r->model->params);
}

/* One forward + backward on the first test batch in training mode with the
 * model's strategy; BN running statistics (changed by a training forward)
 * are copied first and put back, so the weights stay those validated. */
static fr_status measure_train_step(run *r, size_t *peak) {
    fr_params *p = r->model->params;
    fr_tensor **saved = calloc((size_t)p->count, sizeof *saved);
    if (!saved)
        return fr_error(FR_ERR_OOM, "validate: out of memory");
    fr_status st = FR_OK;
    for (int i = 0; i < p->count && st == FR_OK; i++)
        if (p->items[i].kind == FR_BUFFER) {
            saved[i] = fr_empty_like(p->items[i].tensor, FR_TAG_WORKSPACE);
            st = saved[i] ? fr_copy_(saved[i], p->items[i].tensor) : fr_last_status();
        }
    fr_tensor *x = NULL, *y = NULL;
    size_t before = fr_mem_total_current(r->dev);
    fr_mem_reset_peak();
    if (st == FR_OK)
        st = fr_loader_seek(r->ld, 0, 0);
    if (st == FR_OK)
        st = fr_loader_next(r->ld, &x, &y);
    if (st == FR_OK) {
        /* no optimizer: gradients stay until zeroed, as before a step */
        st = fr_train_step(r->model, NULL, NULL, x, y, 1, NULL, NULL, NULL);
        *peak = peak_with_model(r, before);
        fr_params_zero_grad(p);
    }
    fr_release(x);
    fr_release(y);
    for (int i = 0; i < p->count; i++) {
        if (saved[i] && st == FR_OK)
            st = fr_copy_(p->items[i].tensor, saved[i]);
        fr_release(saved[i]);
    }
    free(saved);
    return st;
}

/* The logits of every test image in order, under no_grad in eval mode, with
 * the labels and top-1 predictions (the first maximum, as torch.argmax). */
static fr_status save_logits(run *r, const options *o) {
    int64_t n = r->ds->n, k = r->model->num_classes;
    /* a model with its own loss (an autoencoder) outputs no class scores:
     * its first N x classes values were written as "logits" */
    if (r->model->loss)
        return fr_error(FR_ERR_ARG, "--save-logits %s: model %s has its own loss, so its output "
                        "is not class logits", o->save_logits, r->model->name);
    fr_tensor *logits = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(n, k), FR_TAG_DATA);
    fr_tensor *labels = fr_empty(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA);
    fr_tensor *preds = fr_empty(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA);
    fr_status st = logits && labels && preds ? fr_loader_seek(r->ld, 0, 0) : fr_last_status();
    int64_t at = 0;
    fr_no_grad_enter();
    while (st == FR_OK) {
        fr_tensor *x = NULL, *y = NULL, *out = NULL, *host = NULL, *yhost = NULL;
        st = fr_loader_next(r->ld, &x, &y);
        if (st != FR_OK || !x)
            break;
        int64_t b = x->shape[0];
        out = fr_model_forward(r->model, x, false);
        host = out ? fr_to_device(out, FR_CPU, FR_TAG_TRANSIENT) : NULL;
        yhost = host ? fr_to_device(y, FR_CPU, FR_TAG_TRANSIENT) : NULL;
        if (!yhost || at + b > n)
            st = yhost ? fr_error(FR_ERR_ARG, "validate: more test images than the data set holds")
                       : fr_last_status();
        else if (host->dtype != FR_F32 || host->ndim != 2 || host->shape[0] != b || host->shape[1] != k)
            st = fr_error(FR_ERR_SHAPE, "--save-logits %s: model %s outputs %dd %s, not (%lld, "
                          "%lld) f32 logits", o->save_logits, r->model->name, host->ndim,
                          fr_dtype_name(host->dtype), (long long)b, (long long)k);
        for (int64_t i = 0; st == FR_OK && i < b; i++) {
            const float *row = fr_data_f32(host) + i * k;
            int32_t best = 0;
            for (int32_t c = 1; c < k; c++)
                if (row[c] > row[best])
                    best = c;
            memcpy(fr_data_f32(logits) + (at + i) * k, row, (size_t)k * sizeof *row);
            ((int32_t *)fr_data(labels))[at + i] = ((const int32_t *)fr_data(yhost))[i];
            ((int32_t *)fr_data(preds))[at + i] = best;
        }
        at += b;
        fr_release(yhost);
        fr_release(host);
        fr_release(out);
        fr_release(x);
        fr_release(y);
    }
    fr_no_grad_exit();
    fr_tape_clear();
    if (st == FR_OK && at != n)
        st = fr_error(FR_ERR_ARG, "validate: the pass saw %lld of %lld test images", (long long)at,
                      (long long)n);
    fr_st_writer *w = st == FR_OK ? fr_st_writer_new() : NULL;
    if (st == FR_OK && !w)
        st = fr_last_status();
    if (st == FR_OK)
        st = fr_st_writer_add(w, "logits", logits);
    if (st == FR_OK)
        st = fr_st_writer_add(w, "labels", labels);
    if (st == FR_OK)
        st = fr_st_writer_add(w, "predictions", preds);
    if (st == FR_OK)
        st = fr_st_writer_add_metadata(w, "model", r->model->name);
    if (st == FR_OK)
        st = fr_st_writer_add_metadata(w, "checkpoint", o->checkpoint);
    if (st == FR_OK)
        st = fr_st_writer_save(w, o->save_logits);
    if (st == FR_OK)
        printf("logits of %lld images written to %s\n", (long long)n, o->save_logits);
    fr_st_writer_free(w);
    fr_release(logits);
    fr_release(labels);
    fr_release(preds);
    return st;
}

static fr_status validate(run *r, const options *o) {
    char strat[96], b1[32], b2[32], b3[32];
    printf("model %s (%s): %lld parameters, %s\n", r->model->name, o->checkpoint,
           (long long)fr_params_count(r->model->params),
           fr_mem_format_bytes(fr_params_bytes(r->model->params), b1, sizeof b1));
    printf("data %s: %lld test images, %lld x %lld x %lld, batch %lld, %d threads, %s, precision %s\n",
           r->ds->name, (long long)r->ds->n, (long long)r->ds->c, (long long)r->ds->h, (long long)r->ds->w,
           (long long)o->batch, fr_get_num_threads(), device_names[o->device],
           fr_dtype_name(r->model->cfg.precision));
    fflush(stdout);
    size_t before = fr_mem_total_current(r->dev);
    fr_mem_reset_peak();
    double t0 = fr_cli_now(), loss, acc;
    int64_t n;
    FR_TRY(fr_evaluate(r->model, r->ld, &loss, &acc, &n));
    if (!isfinite(loss)) { /* never an accuracy from a network that computes NaN */
        char why[512];
        return fr_error(FR_ERR_ARG, "%s: the test loss is %s: %s", o->checkpoint, isnan(loss) ? "NaN" : "inf",
                        fr_nonfinite_culprit(r->model, why, sizeof why));
    }
    double secs = fr_cli_now() - t0;
    size_t eval_peak = peak_with_model(r, before);
    size_t train_peak = 0;
    FR_TRY(measure_train_step(r, &train_peak));
    char acc_s[16];
    printf("accuracy %s (%lld images), loss %.4f, %.0f images/s\n",
           fr_cli_format_acc(acc, 2, acc_s, sizeof acc_s), (long long)n, loss, secs > 0 ? (double)n / secs : 0);
    char label[128];
    printf("peak memory (model included, data set excluded):\n");
    snprintf(label, sizeof label, "eval pass, no_grad, %s", fr_dtype_name(r->model->cfg.precision));
    printf("  %-40s %12s\n", label, fr_mem_format_bytes(eval_peak, b2, sizeof b2));
    snprintf(label, sizeof label, "one training step (fwd+bwd), %s, %s",
             fr_strategy_format(r->model->cfg.strategy, strat, sizeof strat),
             fr_dtype_name(r->model->cfg.precision));
    printf("  %-40s %12s  (%.1fx the eval pass)\n", label, fr_mem_format_bytes(train_peak, b3, sizeof b3),
           eval_peak ? (double)train_peak / (double)eval_peak : 0);
    return o->save_logits ? save_logits(r, o) : FR_OK;
}

static int validate_main(int argc, char **argv);

int fr_validate_main(int argc, char **argv) {
    return fr_cli_exit("validate", validate_main(argc, argv));
}

static int validate_main(int argc, char **argv) {
    if (fr_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    options o;
    run r = {0};
    fr_status s = parse_args(argc, argv, &o);
    if (s == FR_OK)
        fr_cli_apply_limits(o.threads, o.memory_limit);
    if (s == FR_OK)
        s = setup(&o, &r);
    if (s == FR_OK)
        s = validate(&r, &o);
    int status = fr_cli_exit_status("validate", s);
    run_free(&r);
    return status;
}
