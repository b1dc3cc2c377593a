/* cpu/conv.h: the two CPU convolution paths behind fr_cpu_conv2d_* (the
 * kernel table's entries, in cpu/conv_dnnl.c), and the switch between them
 * for tests and benchmarks. Internal: not part of frugal.h. */
#ifndef FR_CPU_CONV_H
#define FR_CPU_CONV_H

#include "../tensor/kernels.h"
#include "isa.h"

/* The reference: im2col + GEMM (cpu/conv_im2col.c). Same contract as the
 * kernel-table entries. */
fr_status fr_cpu_conv2d_forward_im2col(float *y, const float *x, const float *w, const fr_conv_shape *s);
fr_status fr_cpu_conv2d_backward_data_im2col(float *dx, const float *dy, const float *w,
                                        const fr_conv_shape *s);
fr_status fr_cpu_conv2d_backward_weight_im2col(float *dw, const float *dy, const float *x,
                                          const fr_conv_shape *s);

/* The batch's images (or the reference's (image, band) units) are cut into
 * at most this many groups, each summed in order into its own partial dw,
 * and the partials are added in group order: the same additions whatever
 * the team size, so a run's weight gradients do not depend on how many
 * cores it got (the team follows the load average, cpu/threads.c). A team
 * larger than this leaves threads idle in the weight gradient. */
#define FR_CONV_WEIGHT_GROUPS 16

/* The weight gradient of a 3x3 stride-1 pad-1 convolution from padded
 * planes, without im2col (cpu/conv_shift.c): what the AUTO backend runs for
 * those shapes on CPUs with AVX2 and FMA where the rule table
 * (fr_cpu_conv_own_shift) says so. _applies says whether it takes s
 * on this CPU; the kernel refuses (FR_ERR_ARG) what it does not take. */
bool fr_cpu_conv_shift_applies(const fr_conv_shape *s);
fr_status fr_cpu_conv2d_backward_weight_shift(float *dw, const float *dy, const float *x,
                                              const fr_conv_shape *s);
fr_status fr_cpu_conv2d_forward_shift(float *y, const float *x, const float *w, const fr_conv_shape *s);
fr_status fr_cpu_conv2d_backward_data_shift(float *dx, const float *dy, const float *w,
                                            const fr_conv_shape *s);

typedef enum {
    FR_CPU_CONV_AUTO = 0,   /* oneDNN when built with it (the default), else im2col */
    FR_CPU_CONV_IM2COL,     /* the reference path only */
    FR_CPU_CONV_DNNL_PLAIN, /* oneDNN on NCHW buffers as they are (for measurements) */
    FR_CPU_CONV_DNNL_BLOCKED, /* oneDNN in its preferred layout, reorders around (measurements) */
    FR_CPU_CONV_DNNL_GROUPS,  /* as BLOCKED, but the weight gradient per image group on one
                                 thread each, as the AUTO rule runs it (tests, measurements) */
    FR_CPU_CONV_BACKEND_COUNT
} fr_cpu_conv_backend;

/* Selects the path for later calls (process-wide; not for use while convs
 * run on other threads). FR_ERR_ARG for a oneDNN backend in a build without
 * oneDNN. */
fr_status fr_cpu_conv_set_backend(fr_cpu_conv_backend b);
fr_cpu_conv_backend fr_cpu_conv_get_backend(void);
/* The AUTO backend's path for a conv pass (cpu/conv_rules.c): oneDNN on
 * the whole batch, oneDNN per image group (the weight gradient), or
 * frugal's own kernels (shifted planes where they apply, else im2col). */
typedef enum { FR_CONV_PATH_OWN = 0, FR_CONV_PATH_DNNL, FR_CONV_PATH_DNNL_GROUPS } fr_conv_path;

/* The rule table's entry for a shape, direction (0 fwd, 1 bwd_data, 2
 * bwd_weight) and ISA class, in this build (OWN without oneDNN). */
fr_conv_path fr_cpu_conv_rule(const fr_conv_shape *s, int direction, fr_cpu_isa isa);
/* Where the entry is OWN and the shifted planes apply (3x3 stride-1 pad-1,
 * fr_cpu_conv_shift_applies): whether they run (from the avx2 class up,
 * but the avx512 class's backward (data), which runs im2col on oneDNN's
 * sgemm in a oneDNN build), else im2col. */
bool fr_cpu_conv_own_shift(int direction, fr_cpu_isa isa);
/* The same for the class in use (FR_ERR_ARG when FR_CPU_ISA is refused). */
fr_status fr_cpu_conv_path(const fr_conv_shape *s, int direction, fr_conv_path *out);
/* One line for train's header: the ISA class and the rule it selects. */
void fr_cpu_conv_describe(char *buf, size_t size);

/* A forward (direction 0) or backward (data) (1) pass on bf16 buffers
 * (x, w, y or dy, w, dx), on oneDNN's bf16 kernels with f32 accumulation,
 * in chunks of images under the workspace cap (conv_chunk.h); *ran false
 * (nothing written) without oneDNN or without a oneDNN kernel for the
 * shape. cpu/conv_bf16.c decides when to call it. */
fr_status fr_cpu_conv_dnnl_bf16(void *out, const void *in0, const void *in1, const fr_conv_shape *s,
                                int direction, bool *ran);
/* The rule for bf16 compute (cpu/conv_bf16.c): whether a pass of s on bf16
 * operands runs in bf16 on this CPU and class (AVX512_BF16 and the avx512
 * class in use, a oneDNN build, and fr_cpu_conv_bf16_default or
 * FR_CONV_BF16=on). */
bool fr_cpu_conv_bf16_applies(const fr_conv_shape *s, int direction);
/* Whether oneDNN's bf16 kernels on this CPU are its AMX ones (with the
 * FR_CPU_ISA cap). */
bool fr_cpu_conv_bf16_amx(void);
/* Whether the rule's default computes in bf16 on this CPU: 3x3 layers with
 * AMX, 3x3 and 1x1 layers with AVX512_BF16 on an AMD Zen 4 (where they
 * measured faster than staged f32; cpu/conv_bf16.c). */
bool fr_cpu_conv_bf16_default(void);
/* What the rule does on this machine, for fr_cpu_conv_describe's line. */
const char *fr_cpu_conv_bf16_describe(void);

/* Channels-last activations (cpu/layout.h: PyTorch's channels_last): a
 * pass (0 fwd (y, x, w), 1 bwd_data (dx, dy, w), 2 bwd_weight (dw, dy, x))
 * whose activations are NHWC and weights (K, C/groups, R, S) as
 * everywhere. Where fr_cpu_conv_nhwc_path says direct, oneDNN's nhwc
 * kernels run on the buffers as they are (no reorder of an activation;
 * the weight gradient in the NCHW path's image groups); elsewhere the pass
 * runs the NCHW path on transposed copies (workspace), with its bits. */
fr_status fr_cpu_conv2d_nhwc(int direction, float *out, const float *in0, const float *in1,
                             const fr_conv_shape *s);
/* The rule (cpu/conv_rules.c) for this machine's ISA class in *direct:
 * the avx512 class, groups 1, dilation 1, and a shape the class's NCHW rule
 * sends to oneDNN; a fixed rule, like the NCHW table. FR_ERR_ARG when
 * FR_CPU_ISA is refused. */
fr_status fr_cpu_conv_nhwc_path(const fr_conv_shape *s, int direction, bool *direct);
/* Whether a model's channels-last mode is on by default (nn/model.h,
 * FR_LAYOUT_AUTO): the avx512 class with oneDNN, where channels last
 * between ops measured faster (bench/RESULTS.md, issue 24); elsewhere it
 * was not measured and every pass would take transposes. False when
 * FR_CPU_ISA is refused. */
bool fr_cpu_channels_last_default(void);
/* oneDNN's implementation name for the nhwc pass, "transposes" where the
 * NCHW path runs; for benchmarks and tests. */
const char *fr_cpu_conv_nhwc_impl(const fr_conv_shape *s, int direction);

/* True when this build has oneDNN. */
bool fr_cpu_have_dnnl(void);
/* oneDNN's implementation name for a shape and direction (0 fwd, 1
 * bwd_data, 2 bwd_weight) under the current backend, "im2col" when the
 * reference runs; for benchmarks. */
const char *fr_cpu_conv_impl(const fr_conv_shape *s, int direction);

#endif
