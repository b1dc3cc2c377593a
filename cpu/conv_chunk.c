/* cpu/conv_chunk.c: a convolution's forward and backward (data) passes in
 * chunks of images under a workspace cap (conv_chunk.h).
 *
 * Why: oneDNN runs on its blocked layout, so a pass reorders its input and
 * output into workspace, two copies the size of the batch's activations.
 * At ResNet-56 batch 640 that is 80 MiB on the 16-channel layers, a quarter
 * of the step's peak under recompute+checkpoint+compress:2 (bench/RESULTS.md,
 * issue 23). Cut into chunks, a pass needs one chunk's copies only, and
 * since an image's result does not depend on its batch, the outputs are the
 * same bits. The weight gradient is not chunked here: it already runs in
 * image groups with one call's workspace per thread (cpu/conv_dnnl.c). */
#include "conv_chunk.h"

static size_t cap = FR_CONV_WORKSPACE_CAP_DEFAULT;

void fr_cpu_conv_set_workspace_cap(size_t bytes) { cap = bytes; }

size_t fr_cpu_conv_workspace_cap(void) { return cap; }

/* The most images (< s->n) whose pass fits the cap, or 1: starts from the
 * whole batch's bytes per image and steps down while a chunk is still over
 * (the bytes need not scale exactly with the images: a scratchpad may not). */
static fr_status chunk_images(const fr_conv_shape *s, int dir, size_t whole, fr_conv_ws_fn ws,
                              int *images) {
    size_t m = (size_t)s->n * cap / whole;
    m = m < 1 ? 1 : m >= (size_t)s->n ? (size_t)s->n - 1 : m;
    while (m > 1) {
        fr_conv_shape part = *s;
        part.n = (int)m;
        size_t bytes;
        FR_TRY(ws(&part, dir, &bytes));
        if (bytes <= cap)
            break;
        size_t fewer = m * cap / bytes;
        m = fewer < m - 1 ? (fewer < 1 ? 1 : fewer) : m - 1;
    }
    *images = (int)m;
    return FR_OK;
}

fr_status fr_cpu_conv_in_chunks(const fr_conv_shape *s, int dir, size_t elem, void *out,
                                const void *in0, const void *in1, fr_conv_ws_fn ws,
                                fr_conv_pass_fn pass) {
    if (dir != 0 && dir != 1)
        return fr_error(FR_ERR_ARG, "conv2d: only the forward and backward (data) passes are "
                        "cut into chunks of images (pass %d)", dir);
    size_t whole = 0;
    if (cap && s->n > 1)
        FR_TRY(ws(s, dir, &whole));
    if (!cap || s->n <= 1 || whole <= cap)
        return pass(s, dir, out, in0, in1);
    int m;
    FR_TRY(chunk_images(s, dir, whole, ws, &m));
    size_t x_img = (size_t)s->c * s->h * s->w * elem, y_img = (size_t)s->k * s->oh * s->ow * elem;
    size_t out_img = dir == 0 ? y_img : x_img, in_img = dir == 0 ? x_img : y_img;
    /* as few chunks as m images a chunk allow, of nearly equal sizes (two
     * sizes, so two plans) rather than a small last one */
    int chunks = (s->n + m - 1) / m;
    for (int i = 0; i < chunks; i++) {
        int lo = (int)((long long)s->n * i / chunks), hi = (int)((long long)s->n * (i + 1) / chunks);
        fr_conv_shape part = *s;
        part.n = hi - lo;
        FR_TRY(pass(&part, dir, (char *)out + (size_t)lo * out_img,
                    (const char *)in0 + (size_t)lo * in_img, in1));
    }
    return FR_OK;
}
