/* test_interop.c: a state dict as PyTorch writes it, validated by frugal's
 * own program. tests/fixtures/pytorch_resnet20.py trains ResNet-20 a few
 * steps on Fashion-MNIST and saves model.state_dict() with
 * safetensors.torch.save_file: PyTorch's default dtypes (int64
 * num_batches_tracked), no frugal metadata. Then
 *     validate --checkpoint state.safetensors --model resnet20 --save-logits F
 * must print the accuracy PyTorch computed on the same images, and the logits
 * it writes must match PyTorch's within 1e-4 (same labels, same order).
 * Skips when python3-torch, the safetensors wheel (.pydeps) or the data set
 * is absent. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"

#define IMAGES 200

static char validate_bin[PATH_MAX];

static void remove_dir(const char *dir) {
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "    could not remove %s\n", dir);
}

static fr_tensor *read_tensor(const char *path, const char *name) {
    fr_st_file *f = fr_st_open(path);
    fr_tensor *t = f ? fr_st_get(f, name, FR_CPU, FR_TAG_DATA) : NULL;
    if (!t)
        fprintf(stderr, "    %s\n", fr_last_error());
    fr_st_close(f);
    return t;
}

static void test_pytorch_state_dict_validates(void) {
    if (access("/usr/bin/python3", X_OK) != 0)
        SKIP("no /usr/bin/python3");
    if (access(FR_FASHION_MNIST_DIR, R_OK) != 0)
        SKIP("no Fashion-MNIST at " FR_FASHION_MNIST_DIR " (apt install dataset-fashion-mnist)");
    if (access(validate_bin, X_OK) != 0)
        SKIP("the validate program is not built beside the tests");
    char dir[] = "/tmp/frugal_interop_XXXXXX", cmd[3 * PATH_MAX], path[PATH_MAX];
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/fixtures/pytorch_resnet20.py '%s' %d '%s'",
             FR_FASHION_MNIST_DIR, IMAGES, dir);
    int rc = system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
        remove_dir(dir);
        SKIP("python3-torch or the safetensors wheel is missing (scripts/install-deps.sh)");
    }
    CHECK(rc == 0);
    snprintf(cmd, sizeof cmd,
             "'%s' --checkpoint '%s/state.safetensors' --model resnet20 --data fashion-mnist "
             "--limit-test %d --batch 50 --threads 2 --save-logits '%s/frugal.safetensors' "
             "> '%s/validate.txt' 2>&1",
             validate_bin, dir, IMAGES, dir, dir);
    rc = rc == 0 ? system(cmd) : rc;
    snprintf(path, sizeof path, "%s/validate.txt", dir);
    FILE *out = fopen(path, "r");
    char line[512];
    double printed = -1;
    long long printed_n = -1;
    while (out && fgets(line, sizeof line, out)) {
        fputs("    validate: ", stdout);
        fputs(line, stdout);
        sscanf(line, "accuracy %lf%% (%lld images)", &printed, &printed_n);
    }
    if (out)
        fclose(out);
    CHECK(rc == 0);

    snprintf(path, sizeof path, "%s/torch.safetensors", dir);
    fr_st_file *tf = rc == 0 ? fr_st_open(path) : NULL;
    const char *correct_text = tf ? fr_st_metadata(tf, "correct") : NULL;
    long torch_correct = correct_text ? strtol(correct_text, NULL, 10) : -1;
    fr_st_close(tf);
    fr_tensor *want = rc == 0 ? read_tensor(path, "logits") : NULL;
    fr_tensor *want_labels = rc == 0 ? read_tensor(path, "labels") : NULL;
    snprintf(path, sizeof path, "%s/frugal.safetensors", dir);
    fr_tensor *got = rc == 0 ? read_tensor(path, "logits") : NULL;
    fr_tensor *labels = rc == 0 ? read_tensor(path, "labels") : NULL;
    fr_tensor *preds = rc == 0 ? read_tensor(path, "predictions") : NULL;
    CHECK(want && want_labels && got && labels && preds && torch_correct >= 0);
    if (want && want_labels && got && labels && preds) {
        CHECK(got->shape[0] == IMAGES && got->shape[1] == 10 && want->shape[0] == IMAGES);
        fr_t_allclose_t(got, want, 1e-4, 0, "frugal's logits against PyTorch's");
        double worst = 0;
        for (int64_t i = 0; i < fr_numel(got); i++) {
            double d = fabs((double)fr_data_f32(got)[i] - fr_data_f32(want)[i]);
            worst = d > worst ? d : worst;
        }
        printf("    max |frugal - PyTorch| over %d x 10 logits: %.3g\n", IMAGES, worst);
        long correct = 0;
        for (int i = 0; i < IMAGES; i++) {
            CHECK(((int32_t *)fr_data(labels))[i] == ((int32_t *)fr_data(want_labels))[i]);
            correct += ((int32_t *)fr_data(preds))[i] == ((int32_t *)fr_data(labels))[i];
        }
        /* the same images give the same accuracy, to the image */
        printf("    accuracy: PyTorch %ld/%d, frugal %ld/%d (printed %.2f%%)\n", torch_correct,
               IMAGES, correct, IMAGES, printed);
        CHECK(correct == torch_correct);
        CHECK(printed_n == IMAGES && fabs(printed - 100.0 * (double)torch_correct / IMAGES) < 0.006);
    }
    fr_release(want);
    fr_release(want_labels);
    fr_release(got);
    fr_release(labels);
    fr_release(preds);
    remove_dir(dir);
}

int main(int argc, char **argv) {
    (void)argc;
    /* build/tests/test_interop -> build/examples/validate */
    snprintf(validate_bin, sizeof validate_bin, "%s", argv[0]);
    char *slash = strrchr(validate_bin, '/');
    if (slash)
        snprintf(slash, sizeof validate_bin - (size_t)(slash - validate_bin), "/../examples/validate");
    else
        snprintf(validate_bin, sizeof validate_bin, "../examples/validate");
    RUN(test_pytorch_state_dict_validates);
    return TEST_SUMMARY();
}
