/* rng.h: the one SplitMix64 (Steele, Lea, Flood 2014) of the project: a
 * 64-bit state advanced by a fixed odd constant (the golden ratio) and mixed
 * by two xor-shift-multiply rounds; every seed gives a full-period stream.
 * Its users: weight initialisation (fr_rng, nn/init.h), the tape's seed
 * streams for dropout and for compression's rounding (autograd/tape.c),
 * dropout's counter-based mask, the same on CPU and GPU (tensor/kernels.h),
 * and the seeding of data/'s shuffles and augmentation (data/rng.h).
 * Header-only, so the CUDA kernels share it. */
#ifndef FR_RNG_H
#define FR_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define FR_RNG_FN __host__ __device__ static inline
#else
#define FR_RNG_FN static inline
#endif

#define FR_RNG_GOLDEN 0x9E3779B97F4A7C15ull

/* The finaliser: a bijection of 64 bits with full avalanche. */
FR_RNG_FN uint64_t fr_rng_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Element i (from 0) of the stream seeded with `seed`, without stepping
 * through the ones before: what a counter-based kernel needs. */
FR_RNG_FN uint64_t fr_rng_at(uint64_t seed, uint64_t i) { return fr_rng_mix(seed + (i + 1) * FR_RNG_GOLDEN); }

typedef struct {
    uint64_t state;
} fr_rng;

FR_RNG_FN void fr_rng_seed(fr_rng *rng, uint64_t seed) { rng->state = seed; }

/* The next element: fr_rng_next after fr_rng_seed(r, s) gives
 * fr_rng_at(s, 0), fr_rng_at(s, 1), ... */
FR_RNG_FN uint64_t fr_rng_next(fr_rng *rng) { return fr_rng_mix(rng->state += FR_RNG_GOLDEN); }

#endif
