/* cpu/conv_bf16.c: convolutions computed in bf16 (kernels.def: conv2d_half)
 * on CPUs with AVX512_BF16, under `--precision bf16`: x, w and y (or dy, w
 * and dx) stay bf16 and oneDNN's bf16 kernels multiply them with f32
 * accumulation, instead of staging every operand to f32 for the f32
 * kernels and rounding the result back.
 *
 * When: only where a bf16 kernel measured faster than the staged f32 path,
 * so that bf16 is never slower than f32 (issue 24). That depends on which
 * bf16 kernels oneDNN has on the CPU (bench/RESULTS.md, 2026-12-02):
 *  - AMX (oneDNN's avx512_core_amx): measured earlier that day on the
 *    Xeon when its features listed AMX, the bf16 3x3 layers ran 2.1-5.9x
 *    faster forward and 1.5-4.0x backward (data) than staged f32 (batch 8;
 *    docs/ARCHITECTURE.md, "CPU convolution and GEMM"). Those were probably
 *    AMX kernels, not proven: 0.13 ms for 16->16 @32 is about 290 GFLOP/s
 *    on one core, which AVX512_BF16's dot products (about 128 FLOP a cycle
 *    on two FMA ports) could also reach, and the primitive's implementation
 *    name was not recorded. The rule runs them.
 *  - AVX512_BF16 without AMX (avx512_core_bf16; the same machine later,
 *    AMX no longer listed): through the op, one thread, CPU time, the bf16
 *    kernels took 0.92-1.96x the staged f32 path's time on the ResNet 3x3
 *    layers at batch 8 and 128: 16->32 s2 @32 about even (0.92-1.02x,
 *    forward and backward (data)), every other layer 1.11-1.96x; and a
 *    bf16 ResNet-20 step ran 10-25% faster with every layer staged. The
 *    rule stages them all.
 *  - AVX512_BF16 on an AMD EPYC of family 19h (Zen 4; no AMX, oneDNN's
 *    same avx512_core_bf16 kernels): the same layers through the op took
 *    0.41-0.65x the staged path's time, forward and backward (data), at
 *    batch 8 and 64, and a ResNet-56 bf16 run 0.91x f32's CPU time against
 *    1.16x staged (bench/RESULTS.md, 2026-12-02, eleventh session); the
 *    1x1 layers of the MobileNet example, ResNet's strided shortcuts and
 *    DenseNet's bottlenecks 0.37-0.96x. The rule runs both there (3x3
 *    only with AMX, where 1x1 was mixed). Other AMD families were not
 *    measured: staged.
 * So the default follows the CPU (oneDNN's AMX listing, the AMD family):
 * the same checkpoint resumed on a host of another kind rounds its bf16
 * convolutions differently (bf16 kernels against staged f32;
 * docs/MIXED_PRECISION.md), and the train header's conv line says which
 * (fr_cpu_conv_bf16_describe).
 * FR_CONV_BF16 overrides: "on" runs the bf16 kernels wherever they exist
 * (3x3 and 1x1)
 * (for a CPU where they measure faster, and for the tests), "off" never,
 * "auto" (or unset) is the rule. Any other value is refused, as FR_CPU_ISA
 * is (cpu/isa.h). It is read once per process and the rule depends on the
 * CPU only, so a shape runs the same kernel in every call: strategies stay
 * bit for bit equal to plain.
 *
 * The weight gradient always stays f32: dw goes to f32 master weights, and
 * oneDNN's multi-threaded weight gradient splits its sums by the team size,
 * which the f32 path avoids with image groups (cpu/conv_dnnl.c).
 *
 * Without AVX512_BF16, or with FR_CPU_ISA below avx512, bf16 stays a
 * storage format even with FR_CONV_BF16=on: the call declines and the
 * caller stages to f32. f16 operands always decline (no f16 compute on the
 * CPU). */
#include <stdlib.h>
#include <string.h>

#include "../tensor/kernels.h"
#include "conv.h"
#include "fr_dnnl.h"
#include "isa.h"

typedef enum { BF16_AUTO = 0, BF16_ON, BF16_OFF, BF16_INVALID } bf16_mode;

/* FR_CONV_BF16, read on the first call */
static bf16_mode mode(void) {
    static int m = -1; /* benign race: every thread reads the same variable */
    if (m < 0) {
        const char *e = getenv("FR_CONV_BF16");
        m = !e || !*e || !strcmp(e, "auto") ? BF16_AUTO
            : !strcmp(e, "on")              ? BF16_ON
            : !strcmp(e, "off")             ? BF16_OFF
                                            : BF16_INVALID;
    }
    return (bf16_mode)m;
}

/* Where oneDNN has a bf16 kernel that frugal runs: 3x3 and 1x1 (dense,
 * undilated), forward and backward (data). */
static bool kernel_exists(const fr_conv_shape *s, int direction) {
    return fr_cpu_have_dnnl() && fr_cpu_isa_has_bf16() && (direction == 0 || direction == 1) &&
           ((s->r == 3 && s->s == 3) || (s->r == 1 && s->s == 1)) && fr_conv_groups(s) == 1 &&
           fr_conv_dilation(s) == 1;
}

static bool zen4(void) {
    return fr_cpu_have_dnnl() && fr_cpu_isa_has_bf16() && fr_cpu_features_detected()->amd_zen4;
}

#ifdef FR_HAVE_DNNL
bool fr_cpu_conv_bf16_amx(void) {
    (void)fr_dnnl_engine(); /* sets oneDNN's ISA cap (FR_CPU_ISA) before the query */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
}
#else
bool fr_cpu_conv_bf16_amx(void) { return false; }
#endif

bool fr_cpu_conv_bf16_default(void) { return fr_cpu_conv_bf16_amx() || zen4(); }

bool fr_cpu_conv_bf16_applies(const fr_conv_shape *s, int direction) {
    bf16_mode m = mode();
    if (m != BF16_ON && m != BF16_AUTO)
        return false;
    if (!kernel_exists(s, direction))
        return false;
    /* the default: 1x1 layers only on Zen 4 (mixed against staging with AMX) */
    return m == BF16_ON || zen4() || (fr_cpu_conv_bf16_amx() && s->r == 3);
}

const char *fr_cpu_conv_bf16_describe(void) {
    /* the variable first: fr_cpu_conv2d_half refuses a bad value on every
     * CPU, so the line says so on every CPU too */
    bf16_mode m = mode();
    if (m == BF16_INVALID)
        return "refused: FR_CONV_BF16 must be auto, on or off";
    if (!fr_cpu_have_dnnl() || !fr_cpu_isa_has_bf16())
        return "is storage only";
    switch (m) {
    case BF16_ON: return "computes 3x3 and 1x1 forward and backward (data) (FR_CONV_BF16=on)";
    case BF16_OFF: return "is storage only (FR_CONV_BF16=off)";
    default:
        /* which path the default took on this host: it differs between
         * kinds of CPU (see the top of this file) */
        return fr_cpu_conv_bf16_amx()     ? "computes 3x3 forward and backward (data) (auto: AMX)"
               : fr_cpu_conv_bf16_default() ? "computes 3x3 and 1x1 forward and backward (data) (auto: AMD Zen 4)"
                                            : "is storage only, convs staged to f32 (auto: neither AMX "
                                              "nor AMD Zen 4)";
    }
}

fr_status fr_cpu_conv2d_half(void *out, const void *in0, const void *in1, fr_dtype dtype,
                             int direction, const fr_conv_shape *s, bool *done) {
    *done = false;
    if (mode() == BF16_INVALID)
        return fr_error(FR_ERR_ARG, "conv2d: FR_CONV_BF16=\"%s\" is not auto, on or off",
                        getenv("FR_CONV_BF16"));
    if (dtype != FR_BF16 || fr_cpu_conv_get_backend() != FR_CPU_CONV_AUTO || s->n <= 0 ||
        !fr_cpu_conv_bf16_applies(s, direction))
        return FR_OK;
    return fr_cpu_conv_dnnl_bf16(out, in0, in1, s, direction, done);
}
