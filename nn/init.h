/* init.h: draws from the RNG (tensor/rng.h) and the weight initialisers
 * (nn/init.c), for a program that makes inputs or weights of its own.
 *
 * Initialisation follows common PyTorch practice for CIFAR ResNets:
 * convolutions kaiming-normal (fan_out, relu gain): std = sqrt(2 / (K*R*S));
 * BatchNorm weight 1, bias 0, running mean 0, running var 1; Linear (and a
 * convolution's bias) as PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
#ifndef FR_INIT_H
#define FR_INIT_H

#include "../tensor/rng.h"
#include "../tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RNG draws (nn/init.c) ----
 * fr_rng is the SplitMix64 stream of tensor/rng.h. Uniforms take the top 53
 * bits (double, [0, 1)); normals use Box-Muller on two uniforms (the cosine
 * branch only, one normal per two draws), in double, then round to float.
 * Weights are therefore the same on every platform with an IEEE libm. */
double fr_rng_uniform(fr_rng *rng);  /* [0, 1) */
double fr_rng_normal(fr_rng *rng);   /* mean 0, std 1 */

/* Fill a CPU f32 tensor (initialisers of nn/init.c). */
fr_status fr_init_normal_(fr_tensor *t, double mean, double std, fr_rng *rng);
fr_status fr_init_uniform_(fr_tensor *t, double low, double high, fr_rng *rng);

#ifdef __cplusplus
}
#endif
#endif
