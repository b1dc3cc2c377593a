/* cpu/layout.h: channels-last (NHWC) activations on the CPU: the
 * transposes between NCHW and NHWC, and batch norm + activation on
 * channels-last buffers (cpu/layout.c), and InPlace-ABN's inversion
 * (cpu/abn.c, beside its NCHW kernel). An NHWC activation is PyTorch's
 * channels_last: element (i, ch, y, x) of an (N, C, H, W) tensor at
 * ((i * H + y) * W + x) * C + ch. Internal to cpu/; the convolution's
 * channels-last entry is in conv.h (docs/ARCHITECTURE.md, "CPU
 * convolution and GEMM", layout between ops). */
#ifndef FR_CPU_LAYOUT_H
#define FR_CPU_LAYOUT_H

#include "../tensor/activation.h"
#include "../tensor/fr_base.h"

/* dst (N, HW, C) from src (N, C, HW) and back; buffers do not overlap. */
void fr_cpu_nchw_to_nhwc(float *dst, const float *src, int n, int c, int hw);
void fr_cpu_nhwc_to_nchw(float *dst, const float *src, int n, int c, int hw);

/* Batch norm + residual + activation on channels-last buffers of px = N *
 * H * W pixels of c channels: the same contracts and formulas as
 * kernels.def's batch_norm_stats, bn_act_forward and bn_act_backward (the
 * NCHW kernels of cpu/batchnorm.c), with the pixels summed in
 * FR_CPU_LAYOUT_GROUPS fixed groups, each in order, then the groups in
 * order: the bits do not depend on the thread count. They differ from the
 * NCHW kernels' in the sums' order only (within round-off). */
#define FR_CPU_LAYOUT_GROUPS 16
fr_status fr_cpu_batch_norm_stats_nhwc(float *mean, float *var, const float *x, size_t px, int c);
fr_status fr_cpu_bn_act_forward_nhwc(float *y, const float *x, const float *residual,
                                     const float *mean, const float *invstd, const float *gamma,
                                     const float *beta, fr_act act, float slope, size_t px, int c);
fr_status fr_cpu_bn_act_backward_nhwc(float *dx, float *dz, float *dgamma, float *dbeta,
                                      const float *dy, const float *act_out, const float *x,
                                      const float *mean, const float *invstd, const float *gamma,
                                      const float *beta, fr_act act, float slope, size_t px, int c);

/* InPlace-ABN's x-hat from its output on channels-last buffers: kernels.def's
 * abn_invert (cpu/abn.c) element by element, the same bits. */
fr_status fr_cpu_abn_invert_nhwc(float *xhat, const float *y, const float *gamma_eff,
                                 const float *beta, const float *residual, float slope, size_t px,
                                 int c);

#endif
