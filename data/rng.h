/* rng.h: a small seeded random number generator for data/ (shuffles and
 * augmentation), so that every run with the same seed sees the same batches.
 *
 * The generator is xorshift64* (Marsaglia 2003, with Vigna's multiplier):
 * 64 bits of state, never zero. Seeds are scrambled with splitmix64 so that
 * nearby seeds (0, 1, 2 ...) give unrelated streams; fr_data_rng_mix derives
 * independent streams from several numbers (seed, epoch, sample position). */
#ifndef FR_DATA_RNG_H
#define FR_DATA_RNG_H

#include <stdint.h>

#include "../tensor/rng.h"

typedef struct {
    uint64_t s;
} fr_data_rng;

/* One SplitMix64 step from x (tensor/rng.h): the seed scrambler. */
static inline uint64_t fr_splitmix64(uint64_t x) { return fr_rng_at(x, 0); }

/* A seed for a stream identified by (a, b, c). */
static inline uint64_t fr_data_rng_mix(uint64_t a, uint64_t b, uint64_t c) {
    return fr_splitmix64(fr_splitmix64(fr_splitmix64(a) ^ b) ^ c);
}

static inline void fr_data_rng_seed(fr_data_rng *r, uint64_t seed) {
    r->s = fr_splitmix64(seed);
    if (r->s == 0)
        r->s = FR_RNG_GOLDEN;
}

static inline uint64_t fr_data_rng_next(fr_data_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

static inline uint32_t fr_data_rng_u32(fr_data_rng *r) { return (uint32_t)(fr_data_rng_next(r) >> 32); }

/* Uniform in [0, n), n >= 1, without modulo bias (rejection). */
static inline uint64_t fr_data_rng_below(fr_data_rng *r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = fr_data_rng_next(r);
    while (x >= limit);
    return x % n;
}

/* Uniform in [0, 1) with 24 random bits (exact in a float). */
static inline float fr_data_rng_float(fr_data_rng *r) { return (float)(fr_data_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

#endif
