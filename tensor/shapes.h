/* shapes.h: the shape records of convolution and pooling, filled by
 * fr_conv2d_shape / fr_pool2d_shape (ops.h) and handed to the kernels
 * (kernels.def). Public: a program may ask for an output shape. */
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

#endif
