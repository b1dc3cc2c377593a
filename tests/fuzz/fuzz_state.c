/* fuzz_state.c: checkpoint metadata (train/state.c) on arbitrary
 * files: read_info, then a full load into a fixed tiny model (fz_tiny_model)
 * with its SGD optimizer, loss scaler and training state, the path
 * examples/train takes on --resume. A load that fails must leave the model
 * as it was; one that succeeds may change it (later inputs see that). */
#include "fuzz_common.h"
#include "train/state.h"

static fr_model *model;
static fr_optim *opt;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!model) {
        model = fz_tiny_model();
        opt = fr_sgd_new(model->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9});
        if (!opt)
            abort();
    }
    size_t before = fr_mem_total_current(FR_CPU);
    const char *path = fz_memfd_path(data, size);
    fr_state_info info;
    if (fr_state_read_info(path, &info) == FR_OK && info.is_training) {
        if (info.state.epoch > info.state.epochs || info.state.step < 0 || info.num_classes < 1)
            abort(); /* what read_info promises */
        fr_loss_scaler scaler;
        fr_train_state st;
        model->cfg.precision = info.state.precision;
        if (fr_loss_scaler_init(&scaler, info.state.precision) == FR_OK)
            (void)fr_state_load(path, model, opt, &scaler, &st);
        model->cfg.precision = FR_F32;
    }
    /* optimizer state a load created stays (it belongs to the model now) */
    if (fr_mem_total_current(FR_CPU) < before)
        abort();
    return 0;
}
