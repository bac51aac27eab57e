/* examples/splitmix.h - the examples' deterministic generator (splitmix64), so every run and
   rank sees the same numbers: examples/mlp.h, examples/gpt.h and examples/gpt_cuda.h name it
   after themselves (mlp_rng_next, gpt_rng_next). C and C++ (nvcc).
   What to copy: nothing pipeline-specific; any generator that every rank seeds alike will do. */
#ifndef PP_EXAMPLE_SPLITMIX_H
#define PP_EXAMPLE_SPLITMIX_H

#include <stdint.h>

static inline uint64_t splitmix_next(uint64_t* s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1): the top 24 bits. */
static inline float splitmix_uniform(uint64_t* s) { return (float)((splitmix_next(s) >> 40) * (1.0 / 16777216.0)); }

#endif
