/* cpu/pad.c: zero and reflect padding of the last two dims, forward and
 * backward (kernels.def; the index rules are tensor/pad_math.h's). */
#include "../tensor/kernels.h"
#include "../tensor/pad_math.h"

fr_status fr_cpu_pad2d_forward(float *y, const float *x, const fr_pad_shape *s) {
    int oh = s->top + s->h + s->bottom, ow = s->left + s->w + s->right;
#pragma omp parallel for schedule(static)
    for (long long p = 0; p < s->planes; p++) {
        const float *xp = x + p * s->h * s->w;   // (H, W)
        float *yp = y + p * oh * ow;             // (OH, OW)
        for (int r = 0; r < oh; r++) {
            int sr = fr_pad_source(r, s->h, s->top, s->mode);
            for (int c = 0; c < ow; c++) {
                int sc = fr_pad_source(c, s->w, s->left, s->mode);
                yp[r * ow + c] = sr < 0 || sc < 0 ? 0.0f : xp[sr * s->w + sc];
            }
        }
    }
    return FR_OK;
}

fr_status fr_cpu_pad2d_backward(float *dx, const float *dy, const fr_pad_shape *s) {
    int oh = s->top + s->h + s->bottom, ow = s->left + s->w + s->right;
#pragma omp parallel for schedule(static)
    for (long long p = 0; p < s->planes; p++) {
        const float *dyp = dy + p * oh * ow;     // (OH, OW)
        float *dxp = dx + p * s->h * s->w;       // (H, W)
        for (int i = 0; i < s->h; i++) {
            int rows[3], nr = fr_pad_readers(i, s->h, s->top, s->bottom, s->mode, rows);
            for (int j = 0; j < s->w; j++) {
                int cols[3], nc = fr_pad_readers(j, s->w, s->left, s->right, s->mode, cols);
                float g = 0.0f;
                for (int a = 0; a < nr; a++)
                    for (int b = 0; b < nc; b++)
                        g += dyp[rows[a] * ow + cols[b]];
                dxp[i * s->w + j] = g;
            }
        }
    }
    return FR_OK;
}
