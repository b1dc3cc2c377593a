/* cpu/conv_bf16.c: convolutions computed in bf16 (kernels.def: conv2d_half)
 * on CPUs with AVX512_BF16, under `--precision bf16`: x, w and y (or dy, w
 * and dx) stay bf16 and oneDNN's bf16 kernels multiply them with f32
 * accumulation, instead of staging every operand to f32 for the f32
 * kernels and rounding the result back.
 *
 * Which shapes: a fixed rule over one image's shape and the ISA class, as
 * for f32 (cpu/conv_rules.c), never a timing: the forward and backward
 * (data) passes of 3x3 layers, which measured faster in bf16 than staged
 * f32; 1x1 layers stay f32 (docs/ARCHITECTURE.md, "CPU convolution and
 * GEMM", has the measurements). The weight gradient always stays f32: dw
 * goes to f32 master weights, and oneDNN's multi-threaded weight gradient
 * splits its sums by the team size, which the f32 path avoids with image
 * groups (cpu/conv_dnnl.c).
 *
 * Without AVX512_BF16, or with FR_CPU_ISA below avx512, bf16 stays a
 * storage format: the call declines and the caller stages to f32. f16
 * operands always decline (no f16 compute on the CPU). */
#include "../tensor/kernels.h"
#include "conv.h"
#include "isa.h"

bool fr_cpu_conv_bf16_applies(const fr_conv_shape *s, int direction) {
    return fr_cpu_have_dnnl() && fr_cpu_isa_has_bf16() && (direction == 0 || direction == 1) &&
           s->r == 3 && s->s == 3 && fr_conv_groups(s) == 1 && fr_conv_dilation(s) == 1;
}

fr_status fr_cpu_conv2d_half(void *out, const void *in0, const void *in1, fr_dtype dtype,
                             int direction, const fr_conv_shape *s, bool *done) {
    *done = false;
    if (dtype != FR_BF16 || fr_cpu_conv_get_backend() != FR_CPU_CONV_AUTO || s->n <= 0 ||
        !fr_cpu_conv_bf16_applies(s, direction))
        return FR_OK;
    return fr_cpu_conv_dnnl_bf16(out, in0, in1, s, direction, done);
}
