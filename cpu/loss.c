/* cpu/loss.c: fused log-softmax + NLL (cross-entropy), mean over the batch,
 * and the pointwise losses (MSE, L1, smooth L1, BCE with logits).
 * logits (N, K), labels (N) i32. Subtracting the row maximum before exp keeps
 * every exponent <= 0, so logits of any magnitude give a finite loss. */
#include <math.h>

#include "../tensor/kernels.h"
#include "../tensor/loss_math.h"

static fr_status check_labels(const int32_t *labels, int n, int k) {
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= k)
            return fr_error(FR_ERR_ARG, "cross_entropy: labels[%d] = %d is outside [0, %d)", i,
                            (int)labels[i], k);
    return FR_OK;
}

/* log(sum(exp(row))) computed as max + log(sum(exp(row - max))). */
static double row_logsumexp(const float *row, int k) {
    float mx = row[0];
    for (int j = 1; j < k; j++)
        if (row[j] > mx)
            mx = row[j];
    double s = 0.0;
    for (int j = 0; j < k; j++)
        s += exp((double)row[j] - mx);
    return (double)mx + log(s);
}

fr_status fr_cpu_cross_entropy_forward(float *loss, const float *logits, const int32_t *labels, int n,
                                   int k) {
    FR_TRY(check_labels(labels, n, k));
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * (size_t)k;
        total += row_logsumexp(row, k) - (double)row[labels[i]];
    }
    loss[0] = n > 0 ? (float)(total / n) : 0.0f;
    return FR_OK;
}

fr_status fr_cpu_cross_entropy_backward(float *dlogits, const float *dloss, const float *logits,
                                   const int32_t *labels, int n, int k) {
    FR_TRY(check_labels(labels, n, k));
    double g = n > 0 ? (double)dloss[0] / n : 0.0;
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * (size_t)k;
        float *drow = dlogits + (size_t)i * (size_t)k;
        double lse = row_logsumexp(row, k);
        for (int j = 0; j < k; j++) {
            double p = exp((double)row[j] - lse);
            drow[j] = (float)((p - (j == labels[i] ? 1.0 : 0.0)) * g);
        }
    }
    return FR_OK;
}

/* ---- the pointwise losses (tensor/loss_math.h) ---- */

fr_status fr_cpu_pointwise_loss_forward(float *l, const float *pred, const float *target,
                                        fr_pointwise_loss kind, float beta, size_t n) {
#pragma omp parallel for if (n > 32768) schedule(static)
    for (size_t i = 0; i < n; i++)
        l[i] = fr_loss_value(kind, pred[i], target[i], beta);
    return FR_OK;
}

fr_status fr_cpu_pointwise_loss_backward(float *dpred, const float *dloss, const float *pred,
                                         const float *target, fr_pointwise_loss kind, float beta,
                                         float scale, size_t n) {
    float k = dloss[0] * scale;
#pragma omp parallel for if (n > 32768) schedule(static)
    for (size_t i = 0; i < n; i++)
        dpred[i] = fr_loss_grad(kind, pred[i], target[i], beta) * k;
    return FR_OK;
}
