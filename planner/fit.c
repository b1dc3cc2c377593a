/* fit.c: will it fit? Batch sizes chosen from measured bytes (planner.h).
 *
 * The evaluation pass of a run under --memory-budget: a no_grad forward at
 * the training batch can need more than the planned training step (a
 * checkpointed or micro-batched step holds less than one full-batch
 * forward's largest activations and conv workspace), so on a device of
 * exactly the budget the run used to die at its first evaluation (issue
 * 22). Its batch is chosen here: two eval-mode no_grad forwards at small
 * batches give the bytes a forward needs above what is held, as a + b * n
 * (activations and workspaces grow with the batch; a part does not), and
 * the largest n <= the batch whose prediction fits the budget is taken.
 * Evaluation in eval mode treats each image alone (batch norm uses its
 * running statistics), so its loss and accuracy do not depend on the
 * batch. */
#include "planner.h"

#include "../autograd/autograd.h"

/* Peak bytes a no_grad eval-mode forward of n images needs above what is in
 * use before it, its input included (lock-free ledger reads). */
static fr_status forward_bytes(fr_model *m, const int64_t *shape, int n, fr_device dev, double *bytes) {
    int64_t s[4] = {n, shape[1], shape[2], shape[3]};
    size_t base = fr_mem_total_current(dev);
    fr_mem_reset_peak();
    fr_tensor *x = fr_zeros(dev, FR_F32, 4, s, FR_TAG_DATA);
    if (!x)
        return fr_last_status();
    fr_no_grad_enter();
    fr_tensor *y = fr_model_forward(m, x, false);
    fr_no_grad_exit();
    fr_status st = y ? FR_OK : fr_last_status();
    fr_release(y);
    fr_release(x);
    size_t peak = fr_mem_total_peak(dev);
    *bytes = peak > base ? (double)(peak - base) : 0;
    fr_mem_reset_peak();
    return st;
}

fr_status fr_fit_eval_batch(fr_model *m, const int64_t *shape, int probe, size_t budget, size_t held,
                            int *batch, double *predicted) {
    if (!m || !shape || !batch || shape[0] < 1 || probe < 1)
        return fr_error(FR_ERR_ARG, "fr_fit_eval_batch: a model, an input shape and a probe batch >= 1 "
                        "are needed");
    fr_device dev = fr_device_of(m->params->items[0].tensor);
    int full = (int)shape[0];
    int n2 = probe < full ? probe : full, n1 = n2 > 1 ? n2 / 2 : 1;
    double p1 = 0, p2 = 0;
    FR_TRY(forward_bytes(m, shape, n1, dev, &p1));
    if (n2 > n1)
        FR_TRY(forward_bytes(m, shape, n2, dev, &p2));
    double per = n2 > n1 && p2 > p1 ? (p2 - p1) / (double)(n2 - n1) : p1 / (double)n1;
    double fixed = p1 - per * (double)n1 > 0 ? p1 - per * (double)n1 : 0;
    int n = full;
    if ((double)held + fixed + per * (double)n > (double)budget)
        n = per > 0 && (double)budget > (double)held + fixed
                ? (int)(((double)budget - (double)held - fixed) / per)
                : 0;
    if (n < 1)
        n = 1;
    if (n > full)
        n = full;
    *batch = n;
    if (predicted)
        *predicted = (double)held + fixed + per * (double)n;
    return FR_OK;
}
