/* fn_upsample.c: differentiable upsampling (nearest, bilinear). Its
 * gradient depends on shapes only, so the node saves no tensor: an
 * upsampled decoder keeps nothing for it. */
#include "functions.h"
#include "node.h"

static fr_status upsample_grad(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *saved,
                               const void *ctx) {
    (void)saved;
    return fr_upsample_backward(dx, dy, *(const fr_upsample_opts *)ctx);
}

fr_tensor *fr_upsample(fr_tensor *x, fr_upsample_opts o) {
    fr_upsample_shape s;
    if (fr_check_defined("upsample", "x", x) != FR_OK || fr_upsample_shape_of(x, o, &s) != FR_OK)
        return NULL;
    fr_tensor *y = fr_empty(fr_device_of(x), x->dtype, 4, FR_SHAPE(s.n, s.c, s.oh, s.ow),
                            FR_TAG_TRANSIENT);
    if (y && (fr_upsample_forward(y, x, o) != FR_OK ||
              fr_record_unary_grad("upsample", upsample_grad, x, y, &o, sizeof o, NULL) != FR_OK))
        fr_clear(&y);
    return y;
}
