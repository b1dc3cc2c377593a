/* cpu/pool.c: max, average, adaptive average and global average pooling
 * on the host.
 *
 * Each (image, channel) plane is independent, so planes are the unit of
 * OpenMP work: backward scatters into its own plane of dx only, and never
 * races. Windows are clipped to the input; for max pooling that means padding
 * never wins (it acts as -inf), for average pooling the divisor stays
 * kernel * kernel (PyTorch's count_include_pad default: with floor-mode
 * output sizes no window reaches past the padded border). */
#include <math.h>
#include <string.h>

#include "../tensor/kernels.h"

/* The clipped window of output position o along one axis: [*a, *b). */
static void window(int o, int size, int kernel, int stride, int pad, int *a, int *b) {
    int start = o * stride - pad;
    *a = start < 0 ? 0 : start;
    *b = start + kernel > size ? size : start + kernel;
}

/* Index (within the plane) of the window's maximum. Like PyTorch, the first
 * maximum in row-major order wins, and a NaN counts as a maximum. */
static int window_argmax(const float *plane, const fr_pool_shape *s, int oh, int ow) {
    int h0, h1, w0, w1;
    window(oh, s->h, s->kernel, s->stride, s->pad, &h0, &h1);
    window(ow, s->w, s->kernel, s->stride, s->pad, &w0, &w1);
    int best = h0 * s->w + w0;
    float best_v = -INFINITY;
    for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) {
            float v = plane[ih * s->w + iw];
            if (v > best_v || isnan(v)) {
                best_v = v;
                best = ih * s->w + iw;
            }
        }
    return best;
}

fr_status fr_cpu_max_pool2d_forward(float *y, const float *x, const fr_pool_shape *s) {
    int planes = s->n * s->c;
    size_t in = (size_t)s->h * s->w, out = (size_t)s->oh * s->ow;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < planes; p++) {
        const float *plane = x + p * in; // (H, W)
        float *dst = y + p * out;        // (OH, OW)
        for (int oh = 0; oh < s->oh; oh++)
            for (int ow = 0; ow < s->ow; ow++)
                dst[oh * s->ow + ow] = plane[window_argmax(plane, s, oh, ow)];
    }
    return FR_OK;
}

fr_status fr_cpu_max_pool2d_backward(float *dx, const float *dy, const float *x, const fr_pool_shape *s) {
    int planes = s->n * s->c;
    size_t in = (size_t)s->h * s->w, out = (size_t)s->oh * s->ow;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < planes; p++) {
        const float *plane = x + p * in; // (H, W)
        const float *g = dy + p * out;   // (OH, OW)
        float *d = dx + p * in;          // (H, W)
        memset(d, 0, in * sizeof *d);
        for (int oh = 0; oh < s->oh; oh++)
            for (int ow = 0; ow < s->ow; ow++)
                d[window_argmax(plane, s, oh, ow)] += g[oh * s->ow + ow];
    }
    return FR_OK;
}

fr_status fr_cpu_avg_pool2d_forward(float *y, const float *x, const fr_pool_shape *s) {
    int planes = s->n * s->c;
    size_t in = (size_t)s->h * s->w, out = (size_t)s->oh * s->ow;
    float area = (float)(s->kernel * s->kernel);
#pragma omp parallel for schedule(static)
    for (int p = 0; p < planes; p++) {
        const float *plane = x + p * in; // (H, W)
        float *dst = y + p * out;        // (OH, OW)
        for (int oh = 0; oh < s->oh; oh++)
            for (int ow = 0; ow < s->ow; ow++) {
                int h0, h1, w0, w1;
                window(oh, s->h, s->kernel, s->stride, s->pad, &h0, &h1);
                window(ow, s->w, s->kernel, s->stride, s->pad, &w0, &w1);
                float sum = 0.0f;
                for (int ih = h0; ih < h1; ih++)
                    for (int iw = w0; iw < w1; iw++)
                        sum += plane[ih * s->w + iw];
                dst[oh * s->ow + ow] = sum / area;
            }
    }
    return FR_OK;
}

fr_status fr_cpu_avg_pool2d_backward(float *dx, const float *dy, const fr_pool_shape *s) {
    int planes = s->n * s->c;
    size_t in = (size_t)s->h * s->w, out = (size_t)s->oh * s->ow;
    float area = (float)(s->kernel * s->kernel);
#pragma omp parallel for schedule(static)
    for (int p = 0; p < planes; p++) {
        const float *g = dy + p * out; // (OH, OW)
        float *d = dx + p * in;        // (H, W)
        memset(d, 0, in * sizeof *d);
        for (int oh = 0; oh < s->oh; oh++)
            for (int ow = 0; ow < s->ow; ow++) {
                int h0, h1, w0, w1;
                window(oh, s->h, s->kernel, s->stride, s->pad, &h0, &h1);
                window(ow, s->w, s->kernel, s->stride, s->pad, &w0, &w1);
                float v = g[oh * s->ow + ow] / area;
                for (int ih = h0; ih < h1; ih++)
                    for (int iw = w0; iw < w1; iw++)
                        d[ih * s->w + iw] += v;
            }
    }
    return FR_OK;
}

/* The mean of a plane is accumulated in double; the cost is nothing next to
 * reading the plane. */
fr_status fr_cpu_global_avg_pool_forward(float *y, const float *x, int nc, int hw) {
#pragma omp parallel for schedule(static) if ((size_t)nc * hw > 32768)
    for (int p = 0; p < nc; p++) {
        const float *plane = x + (size_t)p * hw; // (HW)
        double sum = 0.0;
        for (int i = 0; i < hw; i++)
            sum += plane[i];
        y[p] = hw ? (float)(sum / hw) : 0.0f;
    }
    return FR_OK;
}

fr_status fr_cpu_global_avg_pool_backward(float *dx, const float *dy, int nc, int hw) {
#pragma omp parallel for schedule(static) if ((size_t)nc * hw > 32768)
    for (int p = 0; p < nc; p++) {
        float v = dy[p] / (float)hw;
        float *d = dx + (size_t)p * hw; // (HW)
        for (int i = 0; i < hw; i++)
            d[i] = v;
    }
    return FR_OK;
}

/* ---- adaptive average pooling: output o of an axis averages input
 * [floor(o in / out), ceil((o + 1) in / out)) ---- */

static int adaptive_start(int o, int in, int out) { return (int)((long long)o * in / out); }
static int adaptive_end(int o, int in, int out) {
    return (int)(((long long)(o + 1) * in + out - 1) / out);
}

fr_status fr_cpu_adaptive_avg_pool2d_forward(float *y, const float *x, const fr_pool_shape *s) {
    int planes = s->n * s->c;
    size_t in = (size_t)s->h * s->w, out = (size_t)s->oh * s->ow;
#pragma omp parallel for schedule(static) if ((size_t)planes * in > 32768)
    for (int p = 0; p < planes; p++) {
        const float *xp = x + p * in; // (H, W)
        float *yp = y + p * out;      // (OH, OW)
        for (int oh = 0; oh < s->oh; oh++) {
            int h0 = adaptive_start(oh, s->h, s->oh), h1 = adaptive_end(oh, s->h, s->oh);
            for (int ow = 0; ow < s->ow; ow++) {
                int w0 = adaptive_start(ow, s->w, s->ow), w1 = adaptive_end(ow, s->w, s->ow);
                float sum = 0.0f;
                for (int ih = h0; ih < h1; ih++)
                    for (int iw = w0; iw < w1; iw++)
                        sum += xp[(size_t)ih * s->w + iw];
                yp[(size_t)oh * s->ow + ow] = sum / (float)((h1 - h0) * (w1 - w0));
            }
        }
    }
    return FR_OK;
}

/* dx gathers from every window holding it, in (oh, ow) order (as
 * cuda/pool.cu does). */
fr_status fr_cpu_adaptive_avg_pool2d_backward(float *dx, const float *dy, const fr_pool_shape *s) {
    int planes = s->n * s->c;
    size_t in = (size_t)s->h * s->w, out = (size_t)s->oh * s->ow;
#pragma omp parallel for schedule(static) if ((size_t)planes * in > 32768)
    for (int p = 0; p < planes; p++) {
        float *d = dx + p * in;        // (H, W)
        const float *g = dy + p * out; // (OH, OW)
        memset(d, 0, in * sizeof *d);
        for (int oh = 0; oh < s->oh; oh++) {
            int h0 = adaptive_start(oh, s->h, s->oh), h1 = adaptive_end(oh, s->h, s->oh);
            for (int ow = 0; ow < s->ow; ow++) {
                int w0 = adaptive_start(ow, s->w, s->ow), w1 = adaptive_end(ow, s->w, s->ow);
                float v = g[(size_t)oh * s->ow + ow] / (float)((h1 - h0) * (w1 - w0));
                for (int ih = h0; ih < h1; ih++)
                    for (int iw = w0; iw < w1; iw++)
                        d[(size_t)ih * s->w + iw] += v;
            }
        }
    }
    return FR_OK;
}
