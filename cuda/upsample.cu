/* upsample.cu: nearest and bilinear upsampling by an integer scale on the
 * GPU. Forward: one thread per output. Backward: one thread per INPUT
 * element, gathering from the outputs that read it in (oy, ox) order and,
 * within one output, corner by corner: the order in which cpu/upsample.c
 * scatters, so no atomics, deterministic, the CPU's sums. Where an output
 * reads is tensor/upsample_math.h, shared with the CPU. */
#include "internal.h"
#include "../tensor/upsample_math.h"

__global__ void upsample_forward_kernel(float *y, const float *x, fr_upsample_shape s, size_t total) {
    FR_CUDA_FOR(i, total) {
        int ox = (int)(i % (size_t)s.ow), oy = (int)(i / (size_t)s.ow % (size_t)s.oh);
        const float *xp = x + i / ((size_t)s.oh * s.ow) * (size_t)s.h * s.w; // (H, W)
        if (s.mode == FR_UPSAMPLE_NEAREST) {
            y[i] = xp[(size_t)(oy / s.scale) * s.w + ox / s.scale];
            continue;
        }
        int y0, y1, x0, x1;
        float ly, lx;
        fr_upsample_src(oy, s.h, s.oh, s.scale, s.align_corners, &y0, &y1, &ly);
        fr_upsample_src(ox, s.w, s.ow, s.scale, s.align_corners, &x0, &x1, &lx);
        const float *r0 = xp + (size_t)y0 * s.w, *r1 = xp + (size_t)y1 * s.w;
        y[i] = (1.0f - ly) * ((1.0f - lx) * r0[x0] + lx * r0[x1]) +
               ly * ((1.0f - lx) * r1[x0] + lx * r1[x1]);
    }
}

/* The outputs along one axis that can read input i: [*a, *b), a few
 * candidates either side of i * scale (each is tested exactly). */
__device__ inline void candidates(int i, int scale, int out, int *a, int *b) {
    int lo = (i - 1) * scale - 2, hi = (i + 2) * scale + 2;
    *a = lo < 0 ? 0 : lo;
    *b = hi > out ? out : hi;
}

__global__ void upsample_backward_kernel(float *dx, const float *dy, fr_upsample_shape s,
                                         size_t total) {
    FR_CUDA_FOR(i, total) {
        int ix = (int)(i % (size_t)s.w), iy = (int)(i / (size_t)s.w % (size_t)s.h);
        const float *g = dy + i / ((size_t)s.h * s.w) * (size_t)s.oh * s.ow; // (OH, OW)
        float acc = 0.0f;
        if (s.mode == FR_UPSAMPLE_NEAREST) {
            for (int oy = iy * s.scale; oy < (iy + 1) * s.scale; oy++)
                for (int ox = ix * s.scale; ox < (ix + 1) * s.scale; ox++)
                    acc += g[(size_t)oy * s.ow + ox];
            dx[i] = acc;
            continue;
        }
        int ya, yb, xa, xb;
        if (s.align_corners) { /* outputs spread over the whole axis */
            ya = 0, yb = s.oh, xa = 0, xb = s.ow;
        } else {
            candidates(iy, s.scale, s.oh, &ya, &yb);
            candidates(ix, s.scale, s.ow, &xa, &xb);
        }
        for (int oy = ya; oy < yb; oy++) {
            int y0, y1;
            float ly;
            fr_upsample_src(oy, s.h, s.oh, s.scale, s.align_corners, &y0, &y1, &ly);
            if (y0 != iy && y1 != iy)
                continue;
            for (int ox = xa; ox < xb; ox++) {
                int x0, x1;
                float lx;
                fr_upsample_src(ox, s.w, s.ow, s.scale, s.align_corners, &x0, &x1, &lx);
                if (x0 != ix && x1 != ix)
                    continue;
                float v = g[(size_t)oy * s.ow + ox];
                if (y0 == iy && x0 == ix)
                    acc += v * ((1.0f - ly) * (1.0f - lx));
                if (y0 == iy && x1 == ix)
                    acc += v * ((1.0f - ly) * lx);
                if (y1 == iy && x0 == ix)
                    acc += v * (ly * (1.0f - lx));
                if (y1 == iy && x1 == ix)
                    acc += v * (ly * lx);
            }
        }
        dx[i] = acc;
    }
}

extern "C" fr_status fr_cuda_upsample_forward(float *y, const float *x, const fr_upsample_shape *s) {
    size_t total = (size_t)s->n * s->c * s->oh * s->ow;
    FR_CUDA_RUN_1D(upsample_forward_kernel, total, y, x, *s, total);
}

extern "C" fr_status fr_cuda_upsample_backward(float *dx, const float *dy, const fr_upsample_shape *s) {
    size_t total = (size_t)s->n * s->c * s->h * s->w;
    FR_CUDA_RUN_1D(upsample_backward_kernel, total, dx, dy, *s, total);
}
