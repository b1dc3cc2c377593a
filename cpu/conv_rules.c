/* cpu/conv_rules.c: the AUTO backend's rule table (conv.h): for each ISA
 * class (isa.h) and conv pass, which shapes run oneDNN and which frugal's
 * own kernels. A fixed rule over one image's shape and the class, never a
 * timing, the batch or the thread count: every process, rank and run of a
 * class takes the same path and gets the same bits, and an image's result
 * does not depend on the batch it is in. docs/ARCHITECTURE.md ("CPU
 * convolution and GEMM") has the measurements behind each row. */
#include <stdio.h>

#include "conv.h"
#include "isa.h"

/* A data pass (forward, backward (data)) runs oneDNN for C <= max_c input
 * and K >= min_k output channels, and for every 3x3 layer when any_3x3. */
typedef struct {
    int max_c, min_k;
    bool any_3x3;
} data_rule;

typedef struct {
    data_rule fwd, bwd_data;
    /* the weight gradient on oneDNN in image groups: 3x3 stride-1 layers,
     * and 3x3 and 1x1 strided layers (else frugal's own kernels) */
    bool weight_3x3_s1, weight_strided;
    /* where a 3x3 stride-1 backward (data) runs frugal's own kernels:
     * im2col (on oneDNN's sgemm, cpu/gemm.c) rather than the shifted planes */
    bool own_bwd_data_im2col;
} isa_rule;

static const isa_rule rules[FR_ISA_COUNT] = {
    /* baseline: oneDNN's SSE4.1 kernels against the im2col reference;
     * not measured apart from AVX2's row, whose rule it keeps */
    [FR_ISA_BASELINE] = {{64, 16, false}, {64, 16, false}, false, false, false},
    /* AVX2: the data passes as measured on an AMD EPYC (Zen 3); every
     * weight gradient on the Xeon under FR_CPU_ISA=avx2, where oneDNN's
     * AVX2 kernels in image groups beat im2col 2-3x on the strided layers
     * and the shifted planes 1.2-1.6x on ResNet's 3x3 stride-1 layers (Zen
     * 3 had compared the shifted planes with im2col and whole-batch oneDNN
     * only, before the groups existed); there im2col's OpenBLAS lost
     * DenseNet's 48->12 backward (data) to the shifted planes 2.5x */
    [FR_ISA_AVX2] = {{64, 16, false}, {64, 16, false}, true, true, false},
    /* AVX-512 (an Intel Xeon with AVX512_BF16/FP16, which listed AMX when
     * these rows were measured, 2026-12-01; f32 kernels only): oneDNN's 3x3
     * forward wins at every width (DenseNet's 128..256 -> 12 growth layers
     * 2x faster than the shifted planes), its wide 1x1 forward and wide
     * backward (data) lose to im2col as on AVX2; its weight gradient in
     * image groups beats the shifted planes 1.5x and im2col 2-3x; where its
     * backward (data) loses, im2col on oneDNN's sgemm beats the shifted
     * planes 2.1-2.6x (DenseNet's 48->12 growth layers, 128->32, 128->128) */
    [FR_ISA_AVX512] = {{64, 16, true}, {64, 16, false}, true, true, true},
};

fr_conv_path fr_cpu_conv_rule(const fr_conv_shape *s, int direction, fr_cpu_isa isa) {
    if (!fr_cpu_have_dnnl() || (unsigned)isa >= FR_ISA_COUNT)
        return FR_CONV_PATH_OWN;
    const isa_rule *r = &rules[isa];
    /* Grouped and dilated shapes: oneDNN's depthwise and dilated kernels
     * (the weight gradient in image groups, so it does not depend on the
     * thread count); frugal's own kernels have only the reference for them. */
    if (fr_conv_groups(s) > 1 || fr_conv_dilation(s) > 1)
        return direction == 2 ? FR_CONV_PATH_DNNL_GROUPS : FR_CONV_PATH_DNNL;
    if (direction != 2) {
        const data_rule *d = direction == 0 ? &r->fwd : &r->bwd_data;
        bool wins = (s->c <= d->max_c && s->k >= d->min_k) || (d->any_3x3 && s->r == 3 && s->s == 3);
        return wins ? FR_CONV_PATH_DNNL : FR_CONV_PATH_OWN;
    }
    bool s1_3x3 = s->r == 3 && s->s == 3 && s->stride == 1;
    /* 1x1 stride-1 weight gradients stay with im2col, which is one GEMM
     * per image band there (no copy), and measured faster */
    bool other = (s->r == 3 && s->s == 3 && s->stride > 1) ||
                 (s->r == 1 && s->s == 1 && s->stride > 1);
    return (s1_3x3 && r->weight_3x3_s1) || (other && r->weight_strided)
               ? FR_CONV_PATH_DNNL_GROUPS
               : FR_CONV_PATH_OWN;
}

bool fr_cpu_conv_own_shift(int direction, fr_cpu_isa isa) {
    /* the im2col row stands on oneDNN's sgemm, which a build without
     * oneDNN does not have */
    return (unsigned)isa < FR_ISA_COUNT && isa >= FR_ISA_AVX2 &&
           !(direction == 1 && rules[isa].own_bwd_data_im2col && fr_cpu_have_dnnl());
}

fr_status fr_cpu_conv_path(const fr_conv_shape *s, int direction, fr_conv_path *out) {
    fr_cpu_isa isa;
    *out = FR_CONV_PATH_OWN;
    FR_TRY(fr_cpu_isa_get(&isa));
    *out = fr_cpu_conv_rule(s, direction, isa);
    return FR_OK;
}

/* Channels last runs oneDNN's nhwc kernels directly on the avx512 class
 * only: measured there at the blocked kernels' speed on every CIFAR ResNet
 * layer (bench/bench_conv_layout.c; docs/ARCHITECTURE.md, "CPU convolution
 * and GEMM", layout between ops); not measured on avx2 or baseline, and not
 * on grouped or dilated layers, which therefore take transposes. */
static bool nhwc_rule(const fr_conv_shape *s, int direction, fr_cpu_isa isa) {
    return isa == FR_ISA_AVX512 && fr_conv_groups(s) == 1 && fr_conv_dilation(s) == 1 &&
           fr_cpu_conv_rule(s, direction, isa) != FR_CONV_PATH_OWN;
}

fr_status fr_cpu_conv_nhwc_path(const fr_conv_shape *s, int direction, bool *direct) {
    fr_cpu_isa isa;
    *direct = false;
    FR_TRY(fr_cpu_isa_get(&isa));
    *direct = nhwc_rule(s, direction, isa);
    return FR_OK;
}

bool fr_cpu_channels_last_default(void) {
    fr_cpu_isa isa;
    return fr_cpu_have_dnnl() && fr_cpu_isa_get(&isa) == FR_OK && isa == FR_ISA_AVX512;
}

void fr_cpu_conv_describe(char *buf, size_t size) {
    char isa_text[128];
    fr_cpu_isa_describe(isa_text, sizeof isa_text);
    fr_cpu_isa isa;
    if (fr_cpu_isa_get(&isa) != FR_OK) {
        snprintf(buf, size, "cpu %s", isa_text);
        return;
    }
    const isa_rule *r = &rules[isa];
    /* frugal's own kernels as fr_cpu_conv_own_shift picks them: im2col
     * where the shifted planes do not apply, and for every pass the rule
     * keeps on im2col (the avx512 class's backward (data) with oneDNN) */
    const char *own = fr_cpu_conv_own_shift(0, isa) ? "shifted planes/im2col" : "im2col";
    if (!fr_cpu_have_dnnl()) {
        snprintf(buf, size, "cpu %s; conv: %s (no oneDNN)", isa_text, own);
        return;
    }
    char own_text[96];
    if (fr_cpu_conv_own_shift(1, isa) == fr_cpu_conv_own_shift(0, isa))
        snprintf(own_text, sizeof own_text, "%s", own);
    else
        snprintf(own_text, sizeof own_text, "%s (backward (data) %s)", own,
                 fr_cpu_conv_own_shift(1, isa) ? "shifted planes/im2col" : "im2col");
    char fwd[64];
    snprintf(fwd, sizeof fwd, "oneDNN for %sC <= %d, K >= %d", r->fwd.any_3x3 ? "3x3 and " : "",
             r->fwd.max_c, r->fwd.min_k);
    snprintf(buf, size, "cpu %s; conv forward %s, backward (data) oneDNN for C <= %d, K >= %d, "
             "weight gradient %s%s, else %s; bf16 %s", isa_text, fwd, r->bwd_data.max_c,
             r->bwd_data.min_k, r->weight_3x3_s1 ? "oneDNN in image groups" : r->weight_strided ?
             "oneDNN in image groups for strided 3x3 and 1x1" : own,
             r->weight_3x3_s1 && r->weight_strided ? " for 3x3 and strided 1x1" : "", own_text,
             fr_cpu_conv_bf16_describe());
}
