/* ops_amp.c: checked gradient checks of dynamic loss scaling (see ops.h). */
#include "kernels.h"
#include "ops.h"

fr_status fr_nonfinite_count_(fr_tensor *count, const fr_tensor *x) {
    FR_TRY(fr_check_f32c("nonfinite_count", "count", count));
    FR_TRY(fr_check_f32c("nonfinite_count", "x", x));
    FR_TRY(fr_check_same_device("nonfinite_count", "count", count, "x", x));
    if (fr_numel(count) != 1)
        return fr_error(FR_ERR_SHAPE, "nonfinite_count: count must have one element, has %lld",
                        (long long)fr_numel(count));
    FR_TRY(FR_CALL_KERNEL(fr_device_of(x), nonfinite_count, fr_data_f32(count), fr_data_f32(x),
                          (size_t)fr_numel(x)));
    fr_bump_version(count, "nonfinite_count");
    return FR_OK;
}

fr_status fr_unscale_(fr_tensor *x, float inv_scale) {
    FR_TRY(fr_check_f32c("unscale", "x", x));
    FR_TRY(FR_CALL_KERNEL(fr_device_of(x), unscale, fr_data_f32(x), inv_scale, (size_t)fr_numel(x)));
    fr_bump_version(x, "unscale");
    return FR_OK;
}
