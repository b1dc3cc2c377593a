/* program_train.c: the train program as a library call, fr_train_main
 * (programs/programs.h; examples/train.c is its main).
 *
 * train: trains a model on an image dataset and reports accuracy, speed and
 * memory as it goes.
 *
 *     train --model resnet20 --data fashion-mnist --epochs 2 --save out/run.safetensors
 *     train --resume out/run.safetensors            # continues the same run exactly
 *     train --model resnet20 --precision f16        # half activations, dynamic loss scaling
 *     mpirun -np 2 train --batch 64                 # data parallel: 2 processes x 64 images a step
 *
 * Each epoch ends with a test pass (eval mode, no_grad) and, with --save, a
 * training checkpoint (train/state.h). docs/TRAINING.md describes the flags
 * and what the output means. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/conv.h"
#include "dist/dist.h"
#include "frugal.h"
#include "train/state.h"
#include "programs/cli_impl.h"
#include "programs/programs.h"
#include "planner/planner.h"
#include "train/schedule.h"

enum { OPT_SGD, OPT_ADAM, OPT_ADAMW };
static const char *const optimizer_names[] = {"sgd", "adam", "adamw"};
enum { SCHED_COSINE, SCHED_STEP, SCHED_CONSTANT };
static const char *const schedule_names[] = {"cosine", "step", "constant"};
static const char *const device_names[] = {"cpu", "cuda"};

typedef struct {
    const char *model, *data, *strategy, *save, *resume;
    int64_t batch, accum, epochs, warmup, seed, threads, limit_train, limit_test, log_every, stop_after;
    double lr, momentum, wd;
    bool nesterov, batch_auto; /* --batch auto: the largest that fits --memory-budget */
    bool dist, sync_bn; /* --dist, --sync-bn */
    bool allow_compress; /* --allow-compress: the planner may give blocks compress:B */
    double bucket_mb;   /* --bucket-mb (0: dist's default) */
    double dist_timeout; /* --dist-timeout, seconds (0: none) */
    fr_strategy strat; /* parsed --strategy */
    fr_dtype precision; /* parsed --precision (f32 when not given) */
    bool precision_given;
    int optimizer, schedule, device;
    int augment; /* -1: the dataset's default */
    size_t memory_limit; /* --memory-limit: ledger cap per device, 0 = none */
    size_t memory_budget; /* --memory-budget: plan the step to fit (planner/planner.h), 0 = none */
    /* flags that decide the run's trajectory, given on the command line:
     * with --resume they come from the checkpoint instead */
    const char *trajectory_flag;
} options;

static void usage(FILE *out, const char *model) {
    fprintf(out,
            "usage: train [flags]\n"
            "  --model NAME          %s (default), any resnet<6n+2>, preresnet<9n+2>, densenet-bc-<L>,\n"
            "                        or a model the program registered\n"
            "  --data SPEC           fashion-mnist[:DIR] (default, DIR %s),\n"
            "                        mnist:DIR, cifar10:DIR, cifar100:DIR, folder:DIR (DIR/train, DIR/test)\n"
            "  --strategy S          memory strategy: plain (default), recompute, abn,\n"
            "                        checkpoint[:K], compress[:8|4|2], joined with '+'\n"
            "                        (recompute+checkpoint)\n"
            "  --precision P         f32 (default), f16 or bf16: the precision of activations and\n"
            "                        compute (weights stay f32); f16 with dynamic loss scaling\n"
            "  --batch N|auto        images per optimizer step (128); auto: the largest whose\n"
            "                        measured step the planner fits in --memory-budget\n"
            "  --accum K             split each batch into K micro-batches (1); see docs/TRAINING.md\n"
            "  --epochs N            (10)\n"
            "  --lr X                base learning rate (0.1 for sgd, 0.001 for adam and adamw)\n"
            "  --schedule S          cosine (default), step (x0.1 at 50%% and 75%%), constant\n"
            "  --warmup N            linear warm-up steps from 0.1 x lr (0)\n"
            "  --optimizer O         sgd (default), adam, adamw\n"
            "  --momentum X          SGD momentum (0.9)\n"
            "  --nesterov            Nesterov momentum\n"
            "  --wd X                weight decay (5e-4; adamw: 0.01, decoupled)\n"
            "  --seed N              weights, shuffling and augmentation (42)\n"
            "  --augment, --no-augment  random crop + flip (default on for CIFAR and folders, off for\n"
            "                        (Fashion-)MNIST)\n"
            "  --limit-train N       use only the first N training images (0 = all; a folder:\n"
            "                        the first of every class, then the second, ...)\n"
            "  --limit-test N        use only the first N test images (0 = all)\n"
            "  --save PATH           training checkpoint at the end of every epoch\n"
            "  --resume PATH         continue the run saved in PATH (its settings are used; saves to\n"
            "                        PATH unless --save says otherwise)\n"
            "  --stop-after N        stop after N epochs of this invocation (continue with --resume)\n"
            "  --threads N           CPU threads (default: OpenMP's)\n"
            "  --device D            cpu (default) or cuda\n"
            "  --log-every N         when the output is not a terminal, a line every N steps (50)\n"
            "  --memory-limit SIZE   cap the memory ledger of each device (K, M or G suffix): a\n"
            "                        bigger request fails with an out-of-memory error\n"
            "  --memory-budget SIZE  plan the fastest step that fits SIZE (bytes, K, M or G): a\n"
            "                        strategy per block, checkpoint segments and, if needed,\n"
            "                        micro-batches (replaces --strategy and --accum; abn only when\n"
            "                        --strategy names it)\n"
            "  --allow-compress      with --memory-budget: blocks may also keep their saved\n"
            "                        activations compressed (compress:8/4/2; it changes the\n"
            "                        gradients, docs/MODELS.md)\n"
            "data parallel (docs/DISTRIBUTED.md): launch with mpirun -np P train ...; --batch is then\n"
            "per process (P x N images a step), and each process trains on its shard of every batch\n"
            "  --dist                require MPI (implied when started by mpirun)\n"
            "  --sync-bn             batch norm statistics over all processes (default: per process)\n"
            "  --bucket-mb X         gradient all-reduce bucket size (25 on GPUs, 0.05 on the CPU)\n"
            "  --dist-timeout S      end a process that waits S seconds for the others (a lost\n"
            "                        machine or link; 0: wait for ever; default 1800)\n",
            model, FR_FASHION_MNIST_DIR);
}

static bool is_value_flag(const char *a) {
    static const char *const flags[] = {
        "--model", "--data", "--strategy", "--save", "--resume", "--threads", "--limit-test",
        "--log-every", "--stop-after", "--device", "--batch", "--accum", "--epochs", "--warmup", "--seed",
        "--limit-train", "--lr", "--momentum", "--wd", "--optimizer", "--schedule", "--precision",
        "--bucket-mb", "--dist-timeout", "--memory-limit", "--memory-budget"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (!strcmp(a, flags[i]))
            return true;
    return false;
}

/* Parses argv into *o; prints nothing. */
static fr_status parse_args(int argc, char **argv, const char *model, options *o) {
    *o = (options){.model = model, .strategy = NULL, .batch = 128, .accum = 1, .epochs = 10,
                   .seed = 42, .lr = -1, .momentum = 0.9, .wd = -1, .augment = -1, .log_every = 50,
                   .dist_timeout = FR_DIST_DEFAULT_TIMEOUT};
    fr_cli_seen seen = {.n = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool trajectory = true;
        bool is_switch = !strcmp(a, "--nesterov") || !strcmp(a, "--sync-bn") || !strcmp(a, "--dist") ||
                         !strcmp(a, "--allow-compress") ||
                         !strcmp(a, "--augment") || !strcmp(a, "--no-augment");
        if (!is_switch && (!is_value_flag(a) || !v))
            return fr_cli_bad_flag("train", a, is_value_flag(a));
        FR_TRY(fr_cli_seen_add(&seen, a, is_switch ? NULL : v));
        if (!strcmp(a, "--nesterov")) {
            o->nesterov = true;
        } else if (!strcmp(a, "--sync-bn")) {
            o->sync_bn = true;
        } else if (!strcmp(a, "--allow-compress")) {
            o->allow_compress = true;
        } else if (!strcmp(a, "--dist")) {
            o->dist = true;
            trajectory = false;
        } else if (!strcmp(a, "--augment") || !strcmp(a, "--no-augment")) {
            o->augment = !strcmp(a, "--augment");
        } else {
            i++;
            trajectory = false;
            if (!strcmp(a, "--model")) {
                o->model = v;
                trajectory = true;
            } else if (!strcmp(a, "--data")) {
                o->data = v;
            } else if (!strcmp(a, "--strategy")) {
                o->strategy = v;
                FR_TRY(fr_cli_strategy(a, v, &o->strat));
            } else if (!strcmp(a, "--precision")) {
                /* decides the trajectory, but may repeat a resumed run's own
                 * precision: setup compares it with the checkpoint's */
                FR_TRY(fr_cli_precision(a, v, &o->precision));
                o->precision_given = true;
            } else if (!strcmp(a, "--save")) {
                o->save = v;
            } else if (!strcmp(a, "--resume")) {
                o->resume = v;
            } else if (!strcmp(a, "--threads")) {
                FR_TRY(fr_cli_int(a, v, 1, 1024, &o->threads));
            } else if (!strcmp(a, "--limit-test")) {
                FR_TRY(fr_cli_int(a, v, 0, INT64_MAX, &o->limit_test));
            } else if (!strcmp(a, "--stop-after")) {
                FR_TRY(fr_cli_int(a, v, 1, INT32_MAX, &o->stop_after));
            } else if (!strcmp(a, "--log-every")) {
                FR_TRY(fr_cli_int(a, v, 1, INT32_MAX, &o->log_every));
            } else if (!strcmp(a, "--memory-limit")) {
                FR_TRY(fr_cli_size(a, v, &o->memory_limit));
            } else if (!strcmp(a, "--memory-budget")) {
                FR_TRY(fr_cli_size(a, v, &o->memory_budget));
            } else if (!strcmp(a, "--device")) {
                FR_TRY(fr_cli_choice(a, v, device_names, 2, &o->device));
            } else if (!strcmp(a, "--bucket-mb")) {
                FR_TRY(fr_cli_double(a, v, 0.001, 1024, &o->bucket_mb));
            } else if (!strcmp(a, "--dist-timeout")) {
                FR_TRY(fr_cli_double(a, v, 0, 1e7, &o->dist_timeout));
            } else {
                trajectory = true;
                if (!strcmp(a, "--batch") && !strcmp(v, "auto"))
                    o->batch_auto = true;
                else if (!strcmp(a, "--batch"))
                    FR_TRY(fr_cli_int(a, v, 1, INT32_MAX, &o->batch));
                else if (!strcmp(a, "--accum"))
                    FR_TRY(fr_cli_int(a, v, 1, INT32_MAX, &o->accum));
                else if (!strcmp(a, "--epochs"))
                    FR_TRY(fr_cli_int(a, v, 1, INT32_MAX, &o->epochs));
                else if (!strcmp(a, "--warmup"))
                    FR_TRY(fr_cli_int(a, v, 0, INT64_MAX, &o->warmup));
                else if (!strcmp(a, "--seed"))
                    FR_TRY(fr_cli_int(a, v, 0, INT64_MAX, &o->seed));
                else if (!strcmp(a, "--limit-train"))
                    FR_TRY(fr_cli_int(a, v, 0, INT64_MAX, &o->limit_train));
                else if (!strcmp(a, "--lr"))
                    FR_TRY(fr_cli_double(a, v, 0, 1e6, &o->lr));
                else if (!strcmp(a, "--momentum"))
                    FR_TRY(fr_cli_double(a, v, 0, 1, &o->momentum));
                else if (!strcmp(a, "--wd"))
                    FR_TRY(fr_cli_double(a, v, 0, 1e6, &o->wd));
                else if (!strcmp(a, "--optimizer"))
                    FR_TRY(fr_cli_choice(a, v, optimizer_names, 3, &o->optimizer));
                else if (!strcmp(a, "--schedule"))
                    FR_TRY(fr_cli_choice(a, v, schedule_names, 3, &o->schedule));
                else
                    FR_ASSERT(!"a flag of is_value_flag without a case");
            }
        }
        if (trajectory && !o->trajectory_flag)
            o->trajectory_flag = a;
    }
    FR_TRY(fr_cli_conflict(&seen, "--augment", "--no-augment", "one turns augmentation on, the other off"));
    FR_TRY(fr_cli_conflict(&seen, "--accum", "--memory-budget", "the budget's plan chooses the "
                           "micro-batches"));
    if (o->batch_auto && !o->memory_budget)
        return fr_error(FR_ERR_ARG, "--batch auto picks the largest batch that fits --memory-budget: give "
                        "--memory-budget SIZE too, or a number of images for --batch");
    if (o->allow_compress && !fr_cli_seen_get(&seen, "--memory-budget"))
        return fr_error(FR_ERR_ARG, "--allow-compress lets the --memory-budget planner compress "
                        "blocks and needs --memory-budget; without a budget name compress:B in "
                        "--strategy");
    if (o->optimizer != OPT_SGD) {
        FR_TRY(fr_cli_conflict(&seen, "--optimizer", "--momentum", "momentum is an SGD setting (adam and "
                               "adamw use their betas)"));
        FR_TRY(fr_cli_conflict(&seen, "--optimizer", "--nesterov", "Nesterov momentum is an SGD setting"));
    }
    if (o->accum > o->batch)
        return fr_error(FR_ERR_ARG, "--accum %lld is larger than --batch %lld: a micro-batch needs at least "
                        "one image", (long long)o->accum, (long long)o->batch);
    /* defaults that depend on the optimizer */
    if (o->lr < 0)
        o->lr = o->optimizer == OPT_SGD ? 0.1 : 1e-3;
    if (o->wd < 0)
        o->wd = o->optimizer == OPT_ADAMW ? 1e-2 : 5e-4;
    /* a resumed run goes on saving where it was saved unless told otherwise */
    if (o->resume && !o->save)
        o->save = o->resume;
    if (o->resume && o->trajectory_flag)
        return fr_error(FR_ERR_ARG, "%s cannot be combined with --resume: a resumed run keeps the "
                        "settings saved in its checkpoint", o->trajectory_flag);
    /* every flag error before any data is read or any step is taken */
    if (!o->resume)
        FR_TRY(fr_cli_model_check("--model", o->model));
    if (o->strategy && o->precision_given)
        FR_TRY(fr_cli_strategy_precision(o->strategy, o->strat, o->precision));
    /* the checkpoint may replace the one resumed from: no input to protect */
    if (o->save)
        FR_TRY(fr_outfile_check(o->save == o->resume ? "--resume" : "--save", o->save, NULL, 0));
    if (o->data) {
        fr_data_spec spec;
        FR_TRY(fr_data_spec_parse(o->data, &spec));
    }
    return FR_OK;
}

/* Everything one run holds, freed by run_free. */
typedef struct {
    fr_dataset *train_ds, *test_ds;
    fr_loader *train_ld, *test_ld;
    fr_model *model;
    fr_optim *opt;
    fr_loss_scaler scaler; /* for the model's precision; f32: an inf / NaN guard */
    fr_train_state st;
    fr_data_kind kind;
    fr_dist *dist;   /* data parallel; NULL alone */
    int rank, world; /* 0 and 1 alone */
    fr_memory_plan plan; /* --memory-budget */
    bool plan_reported;  /* its measured peak printed */
    fr_outfile_lock *save_lock; /* rank 0's, on --save, for the whole run */
} run;

static void run_free(run *r) {
    fr_outfile_unlock(r->save_lock);
    fr_memory_plan_free(&r->plan);
    fr_dist_detach(r->dist);
    fr_loader_free(r->train_ld);
    fr_loader_free(r->test_ld);
    fr_optim_free(r->opt);
    fr_model_free(r->model);
    fr_dataset_free(r->train_ds);
    fr_dataset_free(r->test_ds);
}

/* The run's settings: from the flags, or from the checkpoint to resume. */
static fr_status settings(const options *o, run *r, fr_state_info *info) {
    fr_train_state *st = &r->st;
    if (o->resume) {
        FR_TRY(fr_state_read_info(o->resume, info));
        if (!info->is_training)
            return fr_error(FR_ERR_FORMAT, "--resume %s: not a training checkpoint (a weights file: "
                            "use it with validate)", o->resume);
        FR_TRY(fr_cli_model_check("--resume: the checkpoint's model", info->model));
        *st = info->state;
        return FR_OK;
    }
    *info = (fr_state_info){.in_channels = 0};
    snprintf(info->model, sizeof info->model, "%s", o->model);
    if (o->optimizer == OPT_SGD) {
        info->optim_kind = FR_OPTIM_SGD;
        info->sgd = (fr_sgd_options){.lr = o->lr, .momentum = o->momentum, .weight_decay = o->wd,
                                     .nesterov = o->nesterov};
    } else {
        info->optim_kind = o->optimizer == OPT_ADAM ? FR_OPTIM_ADAM : FR_OPTIM_ADAMW;
        info->adam = fr_adam_defaults(o->lr, o->wd);
    }
    if (o->batch * r->world > INT32_MAX)
        return fr_error(FR_ERR_ARG, "--batch %lld x %d processes is too large", (long long)o->batch, r->world);
    *st = (fr_train_state){.seed = (uint64_t)o->seed, .batch_size = (int)o->batch * r->world,
                           .accum = (int)o->accum, .epochs = (int)o->epochs, .augment = o->augment,
                           .limit_train = o->limit_train, .world_size = r->world, .sync_bn = o->sync_bn};
    snprintf(st->data, sizeof st->data, "%s", o->data ? o->data : "fashion-mnist");
    return FR_OK;
}

/* The step's images split over this launch's processes. A resumed run keeps
 * its step size, so its position (in steps) and its schedule mean the same
 * with any number of processes that divides it: another number re-shards. */
static fr_status shard_batch(const options *o, run *r) {
    fr_train_state *st = &r->st;
    int was = st->world_size > 0 ? st->world_size : 1;
    if (st->batch_size % r->world != 0)
        return fr_error(FR_ERR_ARG, "--resume %s: the run's steps take %d images (it trained on %d "
                        "process%s), which %d processes cannot share equally; launch a number of "
                        "processes that divides %d, such as %d", o->resume, st->batch_size, was,
                        was == 1 ? "" : "es", r->world, st->batch_size, was);
    if (o->resume && was != r->world && r->rank == 0)
        printf("resuming on %d process%s instead of %d: each takes %d of every step's %d images (its "
               "batch norm statistics too, unless synchronised)\n", r->world, r->world == 1 ? "" : "es",
               was, st->batch_size / r->world, st->batch_size);
    st->world_size = r->world;
    return FR_OK;
}

static fr_status setup(const options *o, run *r) {
    fr_state_info info;
    FR_TRY(settings(o, r, &info));
    fr_train_state *st = &r->st;
    /* a resumed run may read its data from a new place, and records it */
    if (o->data)
        snprintf(st->data, sizeof st->data, "%s", o->data);
    fr_data_spec spec;
    FR_TRY(fr_data_spec_parse(st->data, &spec));
    r->kind = spec.kind;
    if (o->augment < 0 && !o->resume)
        st->augment = fr_data_augment_default(spec.kind);
    fr_mem_set_phase("loading the data", 0);
    if (!(r->train_ds = fr_data_open(&spec, true, st->limit_train)))
        return fr_last_status();
    spec.channels = (int)r->train_ds->c; /* a folder's test split takes the training split's */
    if (!(r->test_ds = fr_data_open(&spec, false, o->limit_test)))
        return fr_last_status();
    if (r->test_ds->h != r->train_ds->h || r->test_ds->w != r->train_ds->w)
        return fr_error(FR_ERR_FORMAT, "--data %s: the test split's images are %lldx%lld (WxH), the training "
                        "split's %lldx%lld: a model trained on one size is not tested on another",
                        spec.dir, (long long)r->test_ds->w, (long long)r->test_ds->h,
                        (long long)r->train_ds->w, (long long)r->train_ds->h);
    if (r->test_ds->num_classes > r->train_ds->num_classes || r->test_ds->c != r->train_ds->c)
        return fr_error(FR_ERR_FORMAT, "--data %s: the test split (%d classes, %lld channels) does not "
                        "match the training split (%d classes, %lld channels)", spec.dir,
                        r->test_ds->num_classes, (long long)r->test_ds->c, r->train_ds->num_classes,
                        (long long)r->train_ds->c);
    fr_mem_set_phase("setting up", 0);
    fr_device dev = o->device ? FR_CUDA : FR_CPU;
    int classes = o->resume ? info.num_classes : r->train_ds->num_classes;
    if (o->resume && (info.in_channels != r->train_ds->c || info.num_classes < r->train_ds->num_classes))
        return fr_error(FR_ERR_FORMAT, "--resume %s: the checkpoint's %s takes %d channels and %d classes, "
                        "the data has %lld and %d", o->resume, info.model, info.in_channels,
                        info.num_classes, (long long)r->train_ds->c, r->train_ds->num_classes);
    if (!(r->model = fr_cli_model_create(info.model, (int)r->train_ds->c, classes, st->seed)))
        return fr_last_status();
    r->model->cfg.strategy = info.strategy;
    if (o->strategy) {
        fr_strategy s = o->strat;
        if (o->resume && s.abn != info.strategy.abn)
            return fr_error(FR_ERR_ARG, "--strategy %s: abn changes the network's function, and the run in "
                            "%s was trained %s it", o->strategy, o->resume,
                            info.strategy.abn ? "with" : "without");
        r->model->cfg.strategy = s;
    }
    fr_dtype precision = o->resume ? info.state.precision : o->precision;
    if (o->resume && o->precision_given && o->precision != info.state.precision)
        return fr_error(FR_ERR_ARG, "--precision %s: the run in %s was trained in %s, and a resumed run "
                        "keeps its precision", fr_dtype_name(o->precision), o->resume,
                        fr_dtype_name(info.state.precision));
    r->model->cfg.precision = precision;
    FR_TRY(fr_loss_scaler_init(&r->scaler, precision));
    if (dev != FR_CPU)
        FR_TRY(fr_params_to_device(r->model->params, dev));
    r->opt = info.optim_kind == FR_OPTIM_SGD  ? fr_sgd_new(r->model->params, info.sgd)
             : info.optim_kind == FR_OPTIM_ADAM ? fr_adam_new(r->model->params, info.adam)
                                                : fr_adamw_new(r->model->params, info.adam);
    if (!r->opt)
        return fr_last_status();
    if (o->batch_auto) {
        FR_TRY(fr_cli_batch_auto(r->model, r->opt, r->train_ds, r->dist, o->memory_budget, o->allow_compress,
                                 &st->batch_size));
    }
    FR_TRY(shard_batch(o, r));
    int batch = st->batch_size / r->world; /* this process's part of each step */
    if (st->accum > batch)
        return fr_error(FR_ERR_ARG, "%s: %d micro-batches (--accum) of %d images a process (--batch): a "
                        "micro-batch needs at least one image", o->resume ? o->resume : "--accum",
                        st->accum, batch);
    fr_loader_config lc = {.batch_size = batch, .shuffle = true, .drop_last = true, .seed = st->seed,
                           .aug = fr_data_augment(spec.kind, r->train_ds, st->augment), .device = dev,
                           .prefetch = true, .shards = r->world, .shard = r->rank};
    if (!(r->train_ld = fr_loader_new(r->train_ds, &lc)))
        return fr_last_status();
    int64_t per_epoch = fr_loader_num_batches(r->train_ld);
    if (per_epoch == 0)
        return fr_error(FR_ERR_ARG, "--batch %d (a step's images, all processes together) is larger than "
                        "the training set (%lld images)", st->batch_size, (long long)r->train_ds->n);
    if (r->dist) {
        /* every process must read the same set: another size (other files
         * on another machine) left the ranks in different steps, waiting
         * in a collective until the timeout named a lost network. All equal
         * iff world * sum(n^2) == sum(n)^2, the same verdict on every rank */
        double n = (double)r->train_ds->n, sums[2] = {n, n * n};
        FR_TRY(fr_dist_sum(r->dist, sums, 2));
        if (sums[1] * r->world != sums[0] * sums[0])
            return fr_error(FR_ERR_ARG, "--data %s: the processes read training sets of different "
                            "sizes (this one, rank %d, %lld images; %g on average): every process "
                            "must read the same files", st->data, r->rank,
                            (long long)r->train_ds->n, sums[0] / r->world);
    }
    lc = (fr_loader_config){.batch_size = batch, .device = dev, .prefetch = true,
                            .aug = fr_data_augment(spec.kind, r->test_ds, false), .shards = r->world,
                            .shard = r->rank};
    if (!(r->test_ld = fr_loader_new(r->test_ds, &lc)))
        return fr_last_status();

    if (o->resume) {
        FR_TRY(fr_state_load(o->resume, r->model, r->opt, &r->scaler, st));
        if (o->data)
            snprintf(st->data, sizeof st->data, "%s", o->data);
        /* the position must be one this data gives: no step count from
         * another run, no overflow of the counters ahead */
        if (st->batch >= per_epoch || st->step != st->epoch * per_epoch + st->batch)
            return fr_error(FR_ERR_FORMAT, "--resume %s: epoch %lld, batch %lld, step %lld do not fit "
                            "%lld steps per epoch of --data %s", o->resume, (long long)st->epoch,
                            (long long)st->batch, (long long)st->step, (long long)per_epoch, st->data);
        /* the schedule was made for this run's steps (below): a cosine of
         * another length ran the rest of the run at another rate (at
         * eta_min, 0, past its end), silently */
        int64_t steps = per_epoch * st->epochs;
        if (st->schedule.kind == FR_SCHED_COSINE && st->schedule.total_steps != steps)
            return fr_error(FR_ERR_FORMAT, "--resume %s: schedule.total_steps is %lld, but the run "
                            "has %lld steps (%lld epochs of %lld): the file does not describe this "
                            "run", o->resume, (long long)st->schedule.total_steps, (long long)steps,
                            (long long)st->epochs, (long long)per_epoch);
        /* the random streams where the saved run had them: its dropout
         * masks and compressed codes from here on (a file before the
         * fields restarts them from the seed: not the same draws) */
        if (st->has_random) {
            fr_set_random_state(st->random_state);
            fr_set_compress_random_state(st->compress_random_state);
        } else {
            fr_manual_seed(st->seed);
        }
        return FR_OK;
    }
    /* dropout and compression draw from streams of the run's seed, which a
     * checkpoint saves where they stand (fr_train_state.has_random) */
    fr_manual_seed(st->seed);

    int64_t total = per_epoch * st->epochs;
    double lr = r->opt->lr;
    /* under every schedule (the cosine one refused it alone, without the
     * flag's name): a warm-up as long as the run never reached the rate */
    if (o->warmup >= total)
        return fr_error(FR_ERR_ARG, "--warmup %lld is not shorter than the run's %lld steps (%d "
                        "epochs of %lld)", (long long)o->warmup, (long long)total, st->epochs,
                        (long long)per_epoch);
    if (o->schedule == SCHED_COSINE) {
        FR_TRY(fr_schedule_cosine(&st->schedule, lr, total, 0.0));
    } else if (o->schedule == SCHED_STEP) {
        /* x0.1 at 50% and at 75% of the steps, each where it falls after
         * step 0: on a short run the two meet (2 steps: both at 1), and one
         * is kept rather than both dropped */
        int64_t ms[2];
        int n = 0;
        if (total / 2 > 0)
            ms[n++] = total / 2;
        if (total * 3 / 4 > (n ? ms[0] : 0))
            ms[n++] = total * 3 / 4;
        FR_TRY(fr_schedule_step(&st->schedule, lr, ms, n, 0.1));
    } else {
        FR_TRY(fr_schedule_constant(&st->schedule, lr));
    }
    if (o->warmup)
        FR_TRY(fr_schedule_warmup(&st->schedule, o->warmup, 0.1));
    return FR_OK;
}

static void print_header(const run *r, const options *o) {
    const fr_train_state *st = &r->st;
    char strat[96], bytes[32];
    printf("model %s: %lld parameters (%s), strategy %s, precision %s\n", r->model->name,
           (long long)fr_params_count(r->model->params),
           fr_mem_format_bytes(fr_params_bytes(r->model->params), bytes, sizeof bytes),
           fr_strategy_format(r->model->cfg.strategy, strat, sizeof strat),
           fr_dtype_name(r->model->cfg.precision));
    printf("data %s: %lld training images, %lld test images, %lld x %lld x %lld, %d classes, "
           "augmentation %s\n", st->data, (long long)r->train_ds->n, (long long)r->test_ds->n,
           (long long)r->train_ds->c, (long long)r->train_ds->h, (long long)r->train_ds->w,
           r->train_ds->num_classes, st->augment ? "on" : "off");
    const fr_schedule *s = &st->schedule;
    printf("optimizer %s, lr %g (%s schedule%s), batch %d", optimizer_names[r->opt->kind], s->base_lr,
           schedule_names[s->kind == FR_SCHED_COSINE ? SCHED_COSINE : s->kind == FR_SCHED_STEP ? SCHED_STEP
                                                                                          : SCHED_CONSTANT],
           s->warmup_steps ? ", warm-up" : "", st->batch_size);
    if (r->world > 1)
        printf(" (%d processes x %d%s)", r->world, st->batch_size / r->world,
               st->sync_bn ? ", synchronised batch norm" : "");
    if (st->accum > 1)
        printf(" in %d micro-batches%s", st->accum, r->world > 1 ? " each" : "");
    printf(", %d epochs of %lld steps, %d threads, %s\n", st->epochs,
           (long long)fr_loader_num_batches(r->train_ld), fr_get_num_threads(), device_names[o->device]);
    if (!o->device) { /* the instruction set and the conv kernels it selects (docs/ARCHITECTURE.md) */
        char isa[512];
        fr_cpu_conv_describe(isa, sizeof isa);
        /* the model's activation layout (nn/model.h, fr_layout_mode) */
        const char *layout;
        fr_model_channels_last(r->model, FR_CPU, &layout);
        printf("%s; activations %s\n", isa, layout);
    }
    if (o->resume)
        printf("resuming %s: %lld of %d epochs done, step %lld of %lld\n", o->resume, (long long)st->epoch,
               st->epochs, (long long)st->step, (long long)fr_loader_num_batches(r->train_ld) * st->epochs);
    fflush(stdout);
}

static fr_status train_epoch(run *r, fr_progress *pg, double *loss, double *acc, double *secs) {
    fr_train_state *st = &r->st;
    int64_t per_epoch = fr_loader_num_batches(r->train_ld);
    FR_TRY(fr_loader_seek(r->train_ld, st->epoch, st->batch));
    double t0 = fr_cli_now(), loss_sum = 0;
    int64_t seen = 0, hits = 0, steps = 0;
    while (st->batch < per_epoch) {
        fr_tensor *x, *y;
        FR_TRY(fr_loader_next(r->train_ld, &x, &y));
        r->opt->lr = fr_schedule_lr(&st->schedule, st->step);
        double l = 0;
        int64_t c = 0;
        bool stepped = false;
        fr_mem_set_phase("training", st->step + 1);
        fr_status s = fr_train_step(r->model, r->opt, &r->scaler, x, y, st->accum, &l, &c, &stepped);
        int64_t b = x->shape[0];
        fr_release(x);
        fr_release(y);
        FR_TRY(s);
        /* f16's loss scaler skips overflowing steps by design; anywhere else
         * a non-finite loss or gradient means the run has diverged, and a
         * non-finite loss is traced to the first tensor holding one */
        if (!isfinite(l) || (!stepped && r->scaler.dtype != FR_F16)) {
            char why[512] = "";
            if (!isfinite(l))
                fr_nonfinite_culprit(r->model, why, sizeof why);
            return fr_error(FR_ERR_ARG, "step %lld (epoch %lld, batch %lld): the %s is %s in %s training%s%s: "
                            "stopping (lower --lr?); no checkpoint is written from this state",
                            (long long)st->step + 1, (long long)st->epoch + 1, (long long)st->batch + 1,
                            isfinite(l) ? "gradient" : "loss", isfinite(l) ? "not finite" : isnan(l) ? "NaN" : "inf",
                            fr_dtype_name(r->scaler.dtype), *why ? ", " : "", why);
        }
        if (r->plan.units && !r->plan_reported && r->rank == 0) {
            fr_progress_break(pg);
            /* the optimizer's state appears at the end of the first step */
            size_t peak = fr_mem_total_peak(r->plan.device);
            fr_plan_print_measured(&r->plan, peak, st->step == 0 ? r->plan.options.optim_bytes : 0, stdout);
            r->plan_reported = true;
            /* the planner verified this layout with a whole measured step
             * (planner/planner.h), so a step past the budget is a plan that
             * did not hold: an error, never a run that carries on over it */
            FR_TRY(fr_cli_plan_check_step(&r->plan, r->model->name, st->step + 1));
        }
        st->batch++;
        st->step++;
        steps++;
        loss_sum += l;
        hits += c;
        seen += b;
        double dt = fr_cli_now() - t0;
        /* rank 0's own loss and accuracy; images/s of all processes */
        if (r->rank == 0)
            fr_progress_step(pg, st->epoch, st->batch, per_epoch, loss_sum / (double)steps,
                             r->model->loss ? NAN : (double)hits / (double)seen, dt > 0 ? (double)(seen * r->world) / dt : 0);
    }
    if (r->dist) {
        double sums[3] = {loss_sum, (double)hits, (double)seen};
        FR_TRY(fr_dist_sum(r->dist, sums, 3));
        loss_sum = sums[0] / r->world;
        hits = (int64_t)sums[1];
        seen = (int64_t)sums[2];
    }
    *loss = steps ? loss_sum / (double)steps : 0;
    *acc = r->model->loss ? NAN : seen ? (double)hits / (double)seen : 0;
    *secs = fr_cli_now() - t0;
    return FR_OK;
}

static fr_status train(run *r, const options *o) {
    fr_train_state *st = &r->st;
    int64_t per_epoch = fr_loader_num_batches(r->train_ld);
    int64_t last = o->stop_after && st->epoch + o->stop_after < st->epochs ? st->epoch + o->stop_after
                                                                            : st->epochs;
    fr_progress pg;
    fr_progress_init(&pg, stdout, o->device ? FR_CUDA : FR_CPU, per_epoch * last - st->step, st->epochs,
                     (int)o->log_every);
    pg.scaler = &r->scaler;
    if (st->epoch >= last)
        printf("nothing left to train: the run has done all %d epochs\n", st->epochs);
    fr_mem_reset_peak();
    for (; st->epoch < last; st->epoch++, st->batch = 0) {
        double loss = 0, acc = 0, secs = 0, test_loss, test_acc;
        int64_t n_test;
        FR_TRY(train_epoch(r, &pg, &loss, &acc, &secs));
        fr_progress_break(&pg);
        double t0 = fr_cli_now();
        FR_TRY(fr_loader_seek(r->test_ld, 0, 0));
        fr_mem_set_phase("evaluation", 0);
        FR_TRY(fr_evaluate(r->model, r->test_ld, &test_loss, &test_acc, &n_test));
        fr_mem_set_phase(NULL, 0);
        if (r->dist) { /* each process evaluated its shard of the test set */
            double sums[3] = {test_loss * (double)n_test, test_acc * (double)n_test, (double)n_test};
            FR_TRY(fr_dist_sum(r->dist, sums, 3));
            n_test = (int64_t)sums[2];
            test_loss = n_test ? sums[0] / sums[2] : 0;
            test_acc = n_test ? sums[1] / sums[2] : 0;
        }
        if (!isfinite(test_loss)) {
            char why[512];
            return fr_error(FR_ERR_ARG, "epoch %lld: the test loss is %s: %s; no checkpoint is written from "
                            "this state", (long long)st->epoch + 1, isnan(test_loss) ? "NaN" : "inf",
                            fr_nonfinite_culprit(r->model, why, sizeof why));
        }
        double eval_secs = fr_cli_now() - t0;
        char mem[96], d1[32], a1[16], a2[16];
        if (r->rank == 0)
            printf("epoch %lld/%d: train loss %.4f acc %s | test loss %.4f acc %s (%lld images) | "
               "%s train + %.1f s test | %s\n", (long long)st->epoch + 1, st->epochs, loss,
               fr_cli_format_acc(acc, 2, a1, sizeof a1), test_loss,
               fr_cli_format_acc(test_acc, 2, a2, sizeof a2), (long long)n_test, fr_cli_format_duration(secs, d1, sizeof d1),
               eval_secs, fr_cli_memory(pg.dev, mem, sizeof mem));
        if (o->save) {
            fr_train_state next = *st;
            next.epoch++;
            next.batch = 0;
            next.has_random = true;
            next.random_state = fr_random_state();
            next.compress_random_state = fr_compress_random_state();
            /* rank 0 writes (the replicas are the same); the others wait for its verdict */
            fr_status saved = r->rank == 0 ? fr_state_save(o->save, r->model, r->opt, &r->scaler, &next) : FR_OK;
            FR_TRY(r->dist ? fr_dist_share_status(r->dist, 0, saved) : saved);
            if (r->rank == 0)
                printf("saved %s\n", o->save);
        }
        fflush(stdout);
    }
    if (r->rank != 0)
        return FR_OK;
    char total[32], amp[96] = "";
    const fr_loss_scaler *sc = &r->scaler;
    if (sc->dtype != FR_F32)
        snprintf(amp, sizeof amp, " (loss scale %g, %lld steps skipped)", (double)sc->scale,
                 (long long)sc->skipped);
    else if (sc->skipped)
        snprintf(amp, sizeof amp, " (%lld steps skipped for inf / NaN gradients)", (long long)sc->skipped);
    printf("done in %s, precision %s%s; memory ledger (peaks since training started):\n",
           fr_cli_format_duration(fr_cli_now() - pg.t_start, total, sizeof total),
           fr_dtype_name(r->model->cfg.precision), amp);
    fr_mem_report(stdout);
    if (pg.dev == FR_CPU) { /* what the process really held, beside what the ledger counted */
        fr_mem_stats ms;
        fr_mem_get_stats(FR_CPU, &ms);
        size_t rss, hwm;
        fr_mem_process(&rss, &hwm);
        char a[32], b[32], c[32];
        printf("memory side by side: allocated peak %s | reserved peak %s (%.2fx) | process resident "
               "peak %s (VmHWM over the whole run: code, libraries and thread stacks included)\n",
               fr_mem_format_bytes(ms.total_peak, a, sizeof a),
               fr_mem_format_bytes(ms.reserved_peak, b, sizeof b),
               ms.total_peak ? (double)ms.reserved_peak / (double)ms.total_peak : 0.0,
               fr_mem_format_bytes(hwm, c, sizeof c));
    }
    if (r->dist) {
        fr_dist_stats ds = fr_dist_get_stats(r->dist);
        char bytes[32];
        printf("all-reduce: %d processes, %d buckets, %s a step, %.0f%% of it started during backward, "
               "%.1f ms a step waiting for it before the optimizer step\n", r->world, ds.buckets,
               fr_mem_format_bytes(ds.bytes, bytes, sizeof bytes), 100 * ds.started_early,
               ds.steps ? 1e3 * ds.wait_seconds / (double)ds.steps : 0);
    }
    return FR_OK;
}

/* The test pass under --memory-budget gets its own batch (planner/fit.c): the
 * largest whose measured no_grad forward fits the budget beside what the
 * run holds then (parameters, data sets, optimizer state, gradients, the
 * loader's batches: the one evaluated and two in preparation). */
static fr_status eval_batch(const options *o, run *r, const int64_t *shape, size_t optim_bytes,
                            size_t image_bytes) {
    fr_device dev = fr_device_of(r->model->params->items[0].tensor);
    int probe = r->plan.micro_batch > 0 ? r->plan.micro_batch : (int)shape[0], n = 0;
    size_t held = fr_mem_total_current(dev) + optim_bytes + fr_params_bytes(r->model->params);
    double predicted = 0;
    FR_TRY(fr_fit_eval_batch(r->model, shape, probe, o->memory_budget, held + 2 * probe * image_bytes,
                             &n, &predicted));
    if (n >= shape[0])
        return FR_OK;
    char b[32];
    if (r->rank == 0)
        printf("test pass: batch %d under no_grad (predicted peak %s within the budget)\n", n,
               fr_mem_format_bytes((size_t)predicted, b, sizeof b));
    fr_loader_free(r->test_ld);
    fr_loader_config lc = {.batch_size = n, .device = dev, .prefetch = true,
                           .aug = fr_data_augment(r->kind, r->test_ds, false), .shards = r->world,
                           .shard = r->rank};
    return (r->test_ld = fr_loader_new(r->test_ds, &lc)) ? FR_OK : fr_last_status();
}

/* --memory-budget: the planner chooses the strategy of each block, the
 * checkpoint segments and the micro-batches (planner/planner.h), for a step that
 * also holds the optimizer state and the batch the loader prefetches. Before
 * --dist attaches: the planner's trial steps must not all-reduce. */
static fr_status plan_memory(const options *o, run *r) {
    fr_train_state *st = &r->st;
    const fr_dataset *ds = r->train_ds;
    int64_t shape[4] = {st->batch_size / r->world, ds->c, ds->h, ds->w};
    /* the loaders' threads hold batches too: what they hold now (each
     * loader's ready batch), and two more for the one being built while a
     * step runs and its temporaries */
    size_t batch_bytes = (size_t)(shape[0] * (ds->c * ds->h * ds->w * 4 + 4));
    fr_device dev = fr_device_of(r->model->params->items[0].tensor);
    fr_plan_options po = {.allow_abn = r->model->cfg.strategy.abn,
                          .allow_compress = o->allow_compress,
                          .optim_bytes = fr_plan_optim_bytes(r->opt),
                          .extra_bytes = fr_mem_current(dev, FR_TAG_DATA) + 2 * batch_bytes};
    fr_mem_set_phase("planning", 0);
    FR_TRY(fr_plan_memory(r->model, shape, o->memory_budget, &po, &r->plan));
    if (o->resume && r->plan.accum != st->accum)
        return fr_error(FR_ERR_ARG, "--memory-budget: the plan needs %d micro-batches, the run in %s "
                        "was trained in %d: a resumed run keeps its micro-batches (and their batch "
                        "norm statistics); give a budget that fits %d", r->plan.accum, o->resume,
                        st->accum, st->accum);
    st->accum = r->plan.accum;
    if (r->rank == 0)
        fr_plan_print(&r->plan, stdout);
    FR_TRY(eval_batch(o, r, shape, po.optim_bytes, batch_bytes / (size_t)shape[0]));
    fr_mem_set_phase(NULL, 0);
    return fr_plan_apply(r->model, &r->plan);
}

/* MPI when asked (--dist) or when started by an MPI launcher. */
static fr_status start_dist(const options *o, run *r) {
    r->world = 1;
    int launched_world = 1;
    bool launched = fr_dist_launched(&launched_world);
    if (!o->dist && !launched)
        return FR_OK;
    if (!fr_dist_built())
        return fr_error(FR_ERR_ARG, "%s, but this train was built without MPI, so it cannot train "
                        "data-parallel (install libopenmpi-dev and openmpi-bin, then rebuild)%s",
                        launched ? "started by an MPI launcher" : "--dist",
                        launched && launched_world > 1 ? "; each process would train alone and write "
                                                         "the same files" : "");
    FR_TRY(fr_dist_init(&r->dist));
    r->rank = fr_dist_rank(r->dist);
    r->world = fr_dist_world(r->dist);
    FR_TRY(fr_dist_set_timeout(r->dist, o->dist_timeout));
    return o->device ? fr_dist_select_gpu(r->dist) : FR_OK;
}

int fr_train_main(int argc, char **argv) {
    return fr_train_main_model(argc, argv, "resnet20");
}

static int train_main(int argc, char **argv, const char *model);

int fr_train_main_model(int argc, char **argv, const char *model) {
    return fr_cli_exit("train", train_main(argc, argv, model));
}

static int train_main(int argc, char **argv, const char *model) {
    if (fr_cli_wants_help(argc, argv)) {
        usage(stdout, model);
        return 0;
    }
    options o;
    run r = {0};
    fr_status s = parse_args(argc, argv, model, &o);
    if (s == FR_OK)
        fr_cli_apply_limits(o.threads, o.memory_limit);
    if (s == FR_OK)
        s = start_dist(&o, &r);
    if (s == FR_OK && o.save) {
        /* before the checkpoint to resume is read: a second run on one
         * destination is refused (rank 0 writes; the others hear of it) */
        fr_status locked = r.rank == 0 ? fr_outfile_lock_take(o.save == o.resume ? "--resume" : "--save",
                                                              o.save, &r.save_lock)
                                       : FR_OK;
        s = r.dist ? fr_dist_share_status(r.dist, 0, locked) : locked;
    }
    if (s == FR_OK)
        s = setup(&o, &r);
    if (s == FR_OK && o.memory_budget)
        s = plan_memory(&o, &r);
    if (s == FR_OK && r.dist)
        s = fr_dist_attach(r.dist, r.model, &(fr_dist_options){
            .sync_bn = r.st.sync_bn, .bucket_bytes = (size_t)(o.bucket_mb * 1024 * 1024)});
    if (s == FR_OK) {
        if (r.rank == 0)
            print_header(&r, &o);
        s = train(&r, &o);
    }
    if (s == FR_ERR_OOM)
        s = fr_cli_oom_hint(&r.plan, o.memory_limit, o.memory_budget);
    if (s != FR_OK && r.world > 1) {
        /* the others may be waiting for this process in a collective: end them all */
        fprintf(stderr, "train: rank %d of %d: %s\n", r.rank, r.world, fr_last_error());
        fr_dist_abort(r.dist, 1);
    }
    int status = fr_cli_exit_status("train", s);
    run_free(&r);
    fr_dist_free(r.dist);
    return status;
}
