/* cpu/upsample.c: nearest and bilinear upsampling by an integer scale on
 * the host, forward and backward. Each (image, channel) plane is one unit of
 * OpenMP work, so the backward's scatter-add stays in its own plane of dx:
 * no races, and the same sums whatever the team size. */
#include <string.h>

#include "../tensor/kernels.h"
#include "../tensor/upsample_math.h"

static int omp_worth(const fr_upsample_shape *s) {
    return (size_t)s->n * s->c * s->oh * s->ow > 32768;
}

fr_status fr_cpu_upsample_forward(float *y, const float *x, const fr_upsample_shape *s) {
    int planes = s->n * s->c;
    size_t in = (size_t)s->h * s->w, out = (size_t)s->oh * s->ow;
#pragma omp parallel for schedule(static) if (omp_worth(s))
    for (int p = 0; p < planes; p++) {
        const float *xp = x + p * in; // (H, W)
        float *yp = y + p * out;      // (OH, OW)
        for (int oy = 0; oy < s->oh; oy++) {
            if (s->mode == FR_UPSAMPLE_NEAREST) {
                const float *row = xp + (size_t)(oy / s->scale) * s->w;
                for (int ox = 0; ox < s->ow; ox++)
                    yp[(size_t)oy * s->ow + ox] = row[ox / s->scale];
                continue;
            }
            int y0, y1, x0, x1;
            float ly, lx;
            fr_upsample_src(oy, s->h, s->oh, s->scale, s->align_corners, &y0, &y1, &ly);
            for (int ox = 0; ox < s->ow; ox++) {
                fr_upsample_src(ox, s->w, s->ow, s->scale, s->align_corners, &x0, &x1, &lx);
                const float *r0 = xp + (size_t)y0 * s->w, *r1 = xp + (size_t)y1 * s->w;
                yp[(size_t)oy * s->ow + ox] = (1.0f - ly) * ((1.0f - lx) * r0[x0] + lx * r0[x1]) +
                                              ly * ((1.0f - lx) * r1[x0] + lx * r1[x1]);
            }
        }
    }
    return FR_OK;
}

/* dx gathers every output that read it, in (oy, ox) order and, within one
 * output, corner by corner (the order cuda/upsample.cu gathers in). */
fr_status fr_cpu_upsample_backward(float *dx, const float *dy, const fr_upsample_shape *s) {
    int planes = s->n * s->c;
    size_t in = (size_t)s->h * s->w, out = (size_t)s->oh * s->ow;
#pragma omp parallel for schedule(static) if (omp_worth(s))
    for (int p = 0; p < planes; p++) {
        float *d = dx + p * in;        // (H, W)
        const float *g = dy + p * out; // (OH, OW)
        memset(d, 0, in * sizeof *d);
        for (int oy = 0; oy < s->oh; oy++) {
            if (s->mode == FR_UPSAMPLE_NEAREST) {
                float *row = d + (size_t)(oy / s->scale) * s->w;
                for (int ox = 0; ox < s->ow; ox++)
                    row[ox / s->scale] += g[(size_t)oy * s->ow + ox];
                continue;
            }
            int y0, y1, x0, x1;
            float ly, lx;
            fr_upsample_src(oy, s->h, s->oh, s->scale, s->align_corners, &y0, &y1, &ly);
            for (int ox = 0; ox < s->ow; ox++) {
                fr_upsample_src(ox, s->w, s->ow, s->scale, s->align_corners, &x0, &x1, &lx);
                float v = g[(size_t)oy * s->ow + ox];
                d[(size_t)y0 * s->w + x0] += v * ((1.0f - ly) * (1.0f - lx));
                d[(size_t)y0 * s->w + x1] += v * ((1.0f - ly) * lx);
                d[(size_t)y1 * s->w + x0] += v * (ly * (1.0f - lx));
                d[(size_t)y1 * s->w + x1] += v * (ly * lx);
            }
        }
    }
    return FR_OK;
}
