/* shapes.h: the shape records of convolution and pooling, filled by
 * fr_conv2d_shape / fr_pool2d_shape (ops.h) and handed to the kernels
 * (kernels.def), the parameters they are made from, and the activations
 * (fr_act). Public: a program may ask for an output shape. */
#ifndef FR_SHAPES_H
#define FR_SHAPES_H

/* What a convolution (groups 1) and a pooling take besides their tensors,
 * in the differentiable functions (autograd/functions.h) and the build
 * API's layers (nn/build.h) as in the tape-free ops (ops.h). */
typedef struct {
    int stride, pad;
} fr_conv_params;

typedef struct {
    int kernel, stride, pad;
} fr_pool_params;

typedef struct {
    int n, c, h, w;   /* input (N,C,H,W) */
    int k, r, s;      /* weight (K,C,R,S) */
    int oh, ow;       /* output (N,K,OH,OW) */
    int stride, pad;  /* same along both axes */
} fr_conv_shape;

typedef struct {
    int n, c, h, w;    /* input */
    int oh, ow;        /* output */
    int kernel, stride, pad;
} fr_pool_shape;

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

#endif
