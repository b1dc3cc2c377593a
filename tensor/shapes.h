/* shapes.h: the shape records of convolution and pooling, filled by
 * fr_conv2d_shape / fr_pool2d_shape (ops.h) and handed to the kernels
 * (kernels.def), and the activation code of the fused batch-norm kernels. Public: a program may ask for an output shape. */
#ifndef FR_SHAPES_H
#define FR_SHAPES_H

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

/* The activation a fused batch-norm pass ends with (ops.h: fr_bn_act_forward;
 * autograd/functions.h: fr_bn_act): identity, ReLU, or leaky ReLU with a
 * positive slope. */
typedef enum { FR_ACT_IDENTITY = 0, FR_ACT_RELU, FR_ACT_LEAKY_RELU, FR_ACT_COUNT } fr_act;

#endif
