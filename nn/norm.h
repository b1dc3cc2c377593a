/* norm.h: the norm layer (BatchNorm2d + activation, with an optional
 * residual) and the residual add are where recompute and abn change
 * how a model runs; their entry points are in nn/build.h (fr_forward on a
 * norm layer, fr_norm_add, fr_residual_add). This header only names the
 * file: nn/norm.c is the ONE place those three strategies live.
 *
 * Why INPLACE is legal: BatchNorm's backward needs its input, never its
 * output, and ReLU's backward needs only its output; so BN's output may be
 * overwritten by the residual add and the ReLU, saving one activation-sized
 * tensor per ReLU. */
#ifndef FR_NORM_H
#define FR_NORM_H

#include "build.h"

#endif
