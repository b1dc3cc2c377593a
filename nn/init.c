/* init.c: uniform and normal draws from the RNG (tensor/rng.h) and the weight
 * initialisers; see init.h. */
#include <math.h>

#include "layers.h"

double fr_rng_uniform(fr_rng *rng) { return (double)(fr_rng_next(rng) >> 11) * 0x1.0p-53; }

double fr_rng_normal(fr_rng *rng) {
    /* 1 - u lies in (0, 1], so the logarithm is finite. */
    double u1 = 1.0 - fr_rng_uniform(rng);
    double u2 = fr_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static fr_status check_init_target(const char *op, const fr_tensor *t) {
    FR_TRY(fr_check_f32c(op, "tensor", t));
    if (fr_device_of(t) != FR_CPU)
        return fr_error(FR_ERR_DEVICE, "%s: initialise on the CPU, then move the model "
                                       "(fr_params_to_device)", op);
    return FR_OK;
}

fr_status fr_init_normal_(fr_tensor *t, double mean, double std, fr_rng *rng) {
    FR_TRY(check_init_target("init_normal", t));
    float *x = fr_data_f32(t);
    for (int64_t i = 0, n = fr_numel(t); i < n; i++)
        x[i] = (float)(mean + std * fr_rng_normal(rng));
    fr_bump_version(t, "init_normal_");
    return FR_OK;
}

fr_status fr_init_uniform_(fr_tensor *t, double low, double high, fr_rng *rng) {
    FR_TRY(check_init_target("init_uniform", t));
    float *x = fr_data_f32(t);
    for (int64_t i = 0, n = fr_numel(t); i < n; i++)
        x[i] = (float)(low + (high - low) * fr_rng_uniform(rng));
    fr_bump_version(t, "init_uniform_");
    return FR_OK;
}
