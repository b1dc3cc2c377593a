/* test_resnet.c: whole networks against PyTorch (tests/fixtures/gen_resnet.py)
 * and the memory strategies against plain.
 *
 * Tolerances: logits, loss and running statistics |got - want| <= 1e-5 +
 * 1e-4 |want|; gradients per tensor |got - want| <= 1e-4 (max|want| +
 * |want|), i.e. 1e-4 relative with an absolute floor scaled to the tensor
 * (a gradient summed over the batch can cancel to near zero in one element
 * while its neighbours are large). Strategies: bit-identical. */
#include "testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/layers.h"
#include "train/optim.h"
#include "models/resnet.h"

#define TOL 1e-4

static void check_close(const fr_tensor *got, const fr_tensor *want, const char *what) {
    fr_t_allclose_t(got, want, 1e-5, TOL, what);
}

/* Eval forward (no_grad), then train forward, loss and backward, each
 * compared with the fixture, then the ledger. Grads compared for every
 * parameter whose "grad.<name>" is in the file. */
static void compare_with_pytorch(fr_model *m, fr_st_file *f, bool all_grads) {
    fr_t_step_vs_fixture(m, f, 1e-5, TOL);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) == 0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_WORKSPACE) == 0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_PARAM) == fr_params_bytes(m->params));
    CHECK(fr_mem_current(FR_CPU, FR_TAG_GRAD) == (size_t)fr_params_count(m->params) * sizeof(float));

    char key[FR_NAME_MAX + 8];
    int compared = 0;
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *e = &m->params->items[i];
        if (e->kind == FR_PARAMETER) {
            snprintf(key, sizeof key, "grad.%s", e->name);
            if (!all_grads && fr_st_find(f, key) < 0)
                continue;
            fr_tensor *g = fr_t_fixture_tensor(f, key, FR_CPU);
            fr_t_check_grad(e->tensor->grad, g, TOL, key);
            fr_release(g);
            compared++;
        } else if (all_grads && e->tensor->dtype == FR_F32) {
            snprintf(key, sizeof key, "after.%s", e->name);
            fr_tensor *r = fr_t_fixture_tensor(f, key, FR_CPU);
            check_close(e->tensor, r, key);
            fr_release(r);
        } else if (e->tensor->dtype == FR_I32) {
            CHECK(*(const int32_t *)fr_data(e->tensor) == 1); /* one training batch */
        }
    }
    CHECK(compared > 0);
}

static void test_resnet20_matches_pytorch(void) {
    fr_st_file *f = fr_t_fixture("resnet20");
    fr_model *m = fr_resnet_create("resnet20", 3, 10, 0);
    CHECK_NOTNULL(m);
    if (f && m) {
        CHECK_OK(fr_params_read(m->params, f, "tests/fixtures/resnet20.safetensors", "model."));
        compare_with_pytorch(m, f, true);
    }
    fr_model_free(m);
    fr_st_close(f);
}

/* gen_resnet.py's splitmix_range: the same weights on both sides without
 * storing them. */
static void fill_like_python(fr_params *p, uint64_t seed) {
    fr_rng rng;
    fr_rng_seed(&rng, seed);
    for (int i = 0; i < p->count; i++) {
        fr_tensor *t = p->items[i].tensor;
        const char *name = p->items[i].name, *leaf = strrchr(name, '.') + 1;
        if (t->dtype != FR_F32)
            continue;
        double lo, hi;
        if (t->ndim == 4) {
            hi = pow(6.0 / (double)(t->shape[1] * t->shape[2] * t->shape[3]), 0.5);
            lo = -hi;
        } else if (t->ndim == 2) {
            hi = pow((double)t->shape[1], -0.5);
            lo = -hi;
        } else if (!strcmp(name, "fc.bias")) {
            lo = -0.1, hi = 0.1;
        } else if (!strcmp(leaf, "weight") || !strcmp(leaf, "running_var")) {
            lo = 0.5, hi = 1.5;
        } else {
            lo = -0.2, hi = 0.2;
        }
        CHECK_OK(fr_init_uniform_(t, lo, hi, &rng));
    }
}

static void test_preresnet11_matches_pytorch(void) {
    fr_st_file *f = fr_t_fixture("preresnet11");
    fr_model *m = fr_resnet_create("preresnet11", 3, 10, 0);
    CHECK_NOTNULL(m);
    if (f && m) {
        fill_like_python(m->params, 11);
        compare_with_pytorch(m, f, false);
    }
    fr_model_free(m);
    fr_st_close(f);
}

/* recompute (with the in-place writes of the retired inplace strategy)
 * computes exactly what plain computes, in no more memory. */
static void check_recompute(const char *model, int batch, int size) {
    fr_model *m = fr_resnet_create(model, 3, 10, 5);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(batch, 3, size, size), 9);
    int32_t lab[8] = {1, 7, 3, 3, 0, 9, 4, 2};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(batch), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    fr_t_step plain = fr_t_model_step(m, "plain", init, x, labels);
    fr_t_step rec = fr_t_model_step(m, "recompute", init, x, labels);
    CHECK(plain.loss == rec.loss);
    /* every gradient and running statistic, bit for bit */
    fr_t_compare_steps(m, &plain, &rec, -1, model);
    /* recompute allocates no more outputs than plain (both fuse BN, the
     * residual sum and ReLU into one op) and keeps less (its fused
     * backward may need more transient bytes) */
    CHECK(rec.forward_allocs <= plain.forward_allocs);
    CHECK(rec.peak_saved < plain.peak_saved);
    CHECK(rec.peak_total <= plain.peak_total);
    fr_t_step_free(&plain, m->params->count);
    fr_t_step_free(&rec, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

static void test_resnet20_recompute_equals_plain(void) { check_recompute("resnet20", 4, 16); }
static void test_preresnet11_recompute_equals_plain(void) { check_recompute("preresnet11", 4, 8); }

/* The deep pre-activation network builds, runs and frees everything. */
static void test_preresnet164_trains(void) {
    fr_model *m = fr_resnet_create("preresnet164", 3, 10, 1);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 8, 8), 2);
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA, (int32_t[]){4, 1});
    fr_t_step r = fr_t_model_step(m, "recompute", NULL, x, labels);
    CHECK(isfinite(r.loss) && r.loss > 0);
    int with_grad = 0, params = 0;
    for (int i = 0; i < m->params->count; i++) {
        bool param = m->params->items[i].kind == FR_PARAMETER;
        params += param;
        with_grad += param && r.values[i] != NULL; /* values: gradients for parameters */
    }
    CHECK(with_grad == params);
    fr_t_step_free(&r, m->params->count);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* Fashion-MNIST shape: one channel, 28x28. */
static void test_one_channel_input(void) {
    fr_model *m = fr_resnet_create("resnet20", 1, 10, 1);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 1, 28, 28), 3);
    fr_no_grad_enter();
    fr_tensor *y = fr_model_forward(m, x, false);
    fr_no_grad_exit();
    CHECK(y && y->ndim == 2 && y->shape[0] == 2 && y->shape[1] == 10);
    fr_release(y);
    fr_release(x);
    fr_model_free(m);
}

/* The model on CUDA: same pointers, same results as on the CPU (1e-3
 * relative: cuDNN picks other algorithms), and one SGD step. */
static void test_cuda_matches_cpu(void) {
    if (!fr_t_have_cuda())
        SKIP("no CUDA device");
    fr_model *cpu = fr_resnet_create("resnet20", 3, 10, 4), *gpu = fr_resnet_create("resnet20", 3, 10, 4);
    fr_tensor *conv1 = fr_params_get(gpu->params, "conv1.weight");
    CHECK_OK(fr_params_to_device(gpu->params, FR_CUDA));
    CHECK(fr_params_get(gpu->params, "conv1.weight") == conv1 && fr_device_of(conv1) == FR_CUDA);
    CHECK(fr_device_of(fr_params_get(gpu->params, "bn1.num_batches_tracked")) == FR_CPU);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 16, 16), 5);
    int32_t lab[4] = {2, 4, 6, 8};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, lab);
    fr_tensor *xg = fr_to_device(x, FR_CUDA, FR_TAG_DATA), *lg = fr_to_device(labels, FR_CUDA, FR_TAG_DATA);
    fr_sgd_options o = {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true};
    fr_optim *oc = fr_sgd_new(cpu->params, o), *og = fr_sgd_new(gpu->params, o);
    fr_model *models[2] = {cpu, gpu};
    fr_tensor *inputs[2][2] = {{x, labels}, {xg, lg}}, *losses[2];
    for (int k = 0; k < 2; k++) {
        fr_tensor *logits = fr_model_forward(models[k], inputs[k][0], true);
        losses[k] = logits ? fr_cross_entropy(logits, inputs[k][1]) : NULL;
        fr_release(logits);
        CHECK_OK(fr_backward(losses[k]));
    }
    CHECK_CLOSE(fr_item(losses[1]), fr_item(losses[0]), 1e-3 * fabs(fr_item(losses[0])));
    for (int i = 0; i < cpu->params->count; i++) {
        const fr_param *e = &cpu->params->items[i];
        if (e->kind == FR_PARAMETER)
            fr_t_allclose_t(gpu->params->items[i].tensor->grad, e->tensor->grad, 1e-3 * 1e-2, 1e-3, e->name);
    }
    CHECK_OK(fr_optim_step(oc));
    CHECK_OK(fr_optim_step(og));
    for (int i = 0; i < cpu->params->count; i++)
        if (cpu->params->items[i].kind == FR_PARAMETER)
            fr_t_allclose_t(gpu->params->items[i].tensor, cpu->params->items[i].tensor, 1e-5, 1e-4,
                            cpu->params->items[i].name);
    fr_release(losses[0]);
    fr_release(losses[1]);
    fr_optim_free(oc);
    fr_optim_free(og);
    fr_release(xg);
    fr_release(lg);
    fr_release(x);
    fr_release(labels);
    fr_model_free(cpu);
    fr_model_free(gpu);
}

int main(void) {
    RUN(test_resnet20_matches_pytorch);
    RUN(test_preresnet11_matches_pytorch);
    RUN(test_resnet20_recompute_equals_plain);
    RUN(test_preresnet11_recompute_equals_plain);
    RUN(test_preresnet164_trains);
    RUN(test_one_channel_input);
    RUN(test_cuda_matches_cpu);
    return TEST_SUMMARY();
}
