/* shapes.h: the shape records of convolution, pooling and upsampling,
 * filled by fr_conv2d_shape / fr_pool2d_shape / fr_upsample_shape_of (ops.h)
 * and handed to the kernels (kernels.def), the parameters they are made
 * from, and the activations (fr_act). Public: a program may ask for an
 * output shape. */
#ifndef FR_SHAPES_H
#define FR_SHAPES_H

#include <stdbool.h>
#include <stddef.h>

/* What a convolution and a pooling take besides their tensors, in the
 * differentiable functions (autograd/functions.h) and the build API's layers
 * (nn/build.h) as in the tape-free ops (ops.h). */
typedef struct {
    int stride, pad;
    int groups;    /* [1]; C and K must be multiples, w is (K, C/groups, R, S) */
    int dilation;  /* [1] */
} fr_conv_params;

typedef struct {
    int kernel, stride, pad;
} fr_pool_params;

/* PyTorch's ConvTranspose2d (ops.h: fr_conv_transpose2d_shape). */
typedef struct {
    int stride, pad;
    int output_pad;  /* [0]; < stride */
    int groups;      /* [1] */
    int dilation;    /* [1] */
} fr_conv_transpose_params;

typedef struct {
    int n, c, h, w;   /* input (N,C,H,W) */
    int k, r, s;      /* weight (K,C/groups,R,S) */
    int oh, ow;       /* output (N,K,OH,OW) */
    int stride, pad;  /* same along both axes */
    /* groups: input channel group g (C/groups channels) feeds output group
     * g only (depthwise when groups == C); dilation: the spacing of the
     * kernel's taps. 0 is taken as 1 (fr_conv_groups, fr_conv_dilation), so
     * a shape written without them is an ordinary convolution. */
    int groups, dilation;
} fr_conv_shape;

#ifdef __CUDACC__
__host__ __device__
#endif
static inline int fr_conv_groups(const fr_conv_shape *s) { return s->groups > 1 ? s->groups : 1; }
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int fr_conv_dilation(const fr_conv_shape *s) { return s->dilation > 1 ? s->dilation : 1; }

typedef struct {
    int n, c, h, w;    /* input */
    int oh, ow;        /* output */
    int kernel, stride, pad;
} fr_pool_shape;

/* ---- broadcasting (tensor/ops_broadcast.c; docs/ARCHITECTURE.md,
 * "Broadcasting ops") ----
 * NumPy's rule, read from the last dim: two sizes fit when equal or when
 * one is 1. A binary op walks the output's shape with each operand's
 * strides (0 along a dim it is broadcast over); a reduction sums x over the
 * dims where the output's size is 1 and x's is not. */
#define FR_BCAST_DIMS 5
typedef enum {
    FR_BINARY_ADD = 0,
    FR_BINARY_SUB,
    FR_BINARY_MUL,
    FR_BINARY_DIV,
    FR_BINARY_FIRST,   /* out = a: expanding a to the output's shape */
    FR_BINARY_EQ,      /* out = a == b ? 1 : 0 (max's gradient mask) */
    FR_BINARY_COUNT
} fr_binary_op;
typedef struct {
    int ndim;
    long long shape[FR_BCAST_DIMS];     /* the output's */
    long long stride_a[FR_BCAST_DIMS];  /* in elements, 0 where a is broadcast */
    long long stride_b[FR_BCAST_DIMS];
} fr_bcast_shape;
/* x (shape) reduced to out: out's size along dim d is shape[d] or 1 */
typedef struct {
    int ndim;
    long long shape[FR_BCAST_DIMS];     /* x's */
    bool reduce[FR_BCAST_DIMS];         /* summed over (out's size 1) */
} fr_reduce_shape;

/* ---- padding of the last two dims (tensor/ops_pad.c): x (P, H, W) with
 * P = N * C planes -> y (P, top + H + bottom, left + W + right) ---- */
typedef enum { FR_PAD_ZERO = 0, FR_PAD_REFLECT, FR_PAD_COUNT } fr_pad_mode;
typedef struct {
    long long planes;
    int h, w, top, bottom, left, right;
    fr_pad_mode mode;
} fr_pad_shape;

/* ---- group normalisation (tensor/ops_groupnorm.c): x (N, C, HW) in G
 * groups of C / G channels, each sample's group normalised over its
 * C / G * HW values. Layer norm over (C, H, W) is G = 1, instance norm
 * G = C (nn/build.h: fr_norm_opts.kind). ---- */
typedef struct {
    int n, c, hw, groups;
} fr_gn_shape;
/* Upsampling by an integer factor (ops.h: fr_upsample_opts), PyTorch's
 * nn.Upsample modes. */
typedef enum {
    FR_UPSAMPLE_NEAREST = 0,
    FR_UPSAMPLE_BILINEAR,
    FR_UPSAMPLE_MODE_COUNT
} fr_upsample_mode;

/* nn.Upsample(scale_factor = scale, mode, align_corners), integer scale
 * (ops.h: fr_upsample_shape_of). */
typedef struct {
    int scale;                /* >= 1 (required) */
    fr_upsample_mode mode;    /* [FR_UPSAMPLE_NEAREST] */
    bool align_corners;       /* bilinear only [false] */
} fr_upsample_opts;

typedef struct {
    int n, c, h, w;    /* input */
    int oh, ow;        /* output: h * scale, w * scale */
    int scale;
    fr_upsample_mode mode;
    int align_corners; /* bilinear: corner pixels aligned (PyTorch's flag) */
} fr_upsample_shape;

/* The activations (tensor/activation.h has their formulas; docs/MODELS.md
 * the PyTorch equivalents). One line each: X(NAME, "name", needs,
 * invertible). `needs` is what backward reads: FR_ACT_NEEDS_OUTPUT (y alone
 * gives the gradient, so the op may overwrite its input: the inplace
 * strategy) or FR_ACT_NEEDS_INPUT (the gradient needs x). `invertible`: x
 * can be recovered from y exactly in f32 over the whole line, which
 * InPlace-ABN needs (ELU, sigmoid, tanh and softplus saturate in f32, so
 * they are not). The parameter `slope` is leaky ReLU's negative slope and
 * ELU's alpha; the others ignore it. */
#define FR_ACT_LIST(X)                                        \
    X(IDENTITY, "identity", FR_ACT_NEEDS_OUTPUT, 1)           \
    X(RELU, "relu", FR_ACT_NEEDS_OUTPUT, 0)                   \
    X(LEAKY_RELU, "leaky_relu", FR_ACT_NEEDS_OUTPUT, 1)       \
    X(ELU, "elu", FR_ACT_NEEDS_OUTPUT, 0)                     \
    X(GELU, "gelu", FR_ACT_NEEDS_INPUT, 0)                    \
    X(GELU_TANH, "gelu_tanh", FR_ACT_NEEDS_INPUT, 0)          \
    X(SILU, "silu", FR_ACT_NEEDS_INPUT, 0)                    \
    X(SIGMOID, "sigmoid", FR_ACT_NEEDS_OUTPUT, 0)             \
    X(TANH, "tanh", FR_ACT_NEEDS_OUTPUT, 0)                   \
    X(HARDSWISH, "hardswish", FR_ACT_NEEDS_INPUT, 0)          \
    X(HARDSIGMOID, "hardsigmoid", FR_ACT_NEEDS_INPUT, 0)      \
    X(SOFTPLUS, "softplus", FR_ACT_NEEDS_INPUT, 0)            \
    X(MISH, "mish", FR_ACT_NEEDS_INPUT, 0)

typedef enum { FR_ACT_NEEDS_OUTPUT = 0, FR_ACT_NEEDS_INPUT } fr_act_needs;

typedef enum {
#define FR_ACT_ENUM_(NAME, name, needs, inv) FR_ACT_##NAME,
    FR_ACT_LIST(FR_ACT_ENUM_)
#undef FR_ACT_ENUM_
    FR_ACT_COUNT
} fr_act;

/* The pointwise losses, mean over every element (ops.h:
 * fr_pointwise_loss_forward; autograd/functions.h: fr_mse_loss, ...). */
typedef enum {
    FR_LOSS_MSE = 0,
    FR_LOSS_L1,
    FR_LOSS_SMOOTH_L1,
    FR_LOSS_BCE_LOGITS,
    FR_LOSS_COUNT
} fr_pointwise_loss;

/* Compressed saved activations (kernels.def: compress_pack): elements per
 * group, and the bytes of the packed form of n elements at `bits` (8, 4, 2):
 * lo and step (two f32) plus FR_COMPRESS_GROUP * bits / 8 bytes of codes a
 * group. */
#define FR_COMPRESS_GROUP 256
static inline size_t fr_compress_nbytes(int bits, size_t n) {
    size_t groups = (n + FR_COMPRESS_GROUP - 1) / FR_COMPRESS_GROUP;
    return groups * (2 * sizeof(float) + (size_t)FR_COMPRESS_GROUP * (size_t)bits / 8);
}
/* Bytes of a sign mask of n elements (kernels.def: sign_pack). */
static inline size_t fr_sign_nbytes(size_t n) { return (n + 7) / 8; }

#endif
