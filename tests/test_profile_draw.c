/* The profiler's draw of the gap to the next sample (src/api/profile_draw.h)
 * is -ln(k 2^-53) within 1e-10 of libm's log, for every k the sampler can
 * draw: every cell of its table at every exponent (the cell's first, centre
 * and last mantissas), the smallest and largest 4096 k, and a million k
 * drawn at random. A wrong digit in a table entry, a cell taken from the
 * wrong bits or a term of the series lost, each moves some k's result far
 * past 1e-10 (the draw is within about 1e-11 of -ln u). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "api/profile_draw.h"

#define TOLERANCE 1e-10
#define TOP ((uint64_t)1 << 53)

static double worst_error;
static uint64_t worst_k;
static long checked;

static void check(uint64_t k) {
    double want = -log((double)k / (double)TOP); /* (k and the quotient exact) */
    double got = coral_profile_minus_ln_uniform(k);
    double error = fabs(got - want);
    if (error > worst_error) worst_error = error, worst_k = k;
    checked++;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(void) {
    for (int e = 6; e < 53; e++) { /* (below 2^6 a cell holds no k, or one) */
        for (uint64_t cell = 0; cell < CORAL_DRAW_CELLS; cell++) {
            uint64_t width = (uint64_t)1 << (e - CORAL_DRAW_CELL_BITS);
            uint64_t first = ((uint64_t)1 << e) + cell * width;
            check(first);
            check(first + width / 2);
            check(first + width - 1);
        }
    }
    for (uint64_t k = 1; k <= 4096; k++) check(k);
    for (uint64_t k = TOP - 4095; k <= TOP; k++) check(k);
    for (int i = 0; i < 1000000; i++) check((rng_next() >> 11) + 1);
    double at_one = coral_profile_minus_ln_uniform(TOP);
    if (at_one > TOLERANCE || at_one < -TOLERANCE) {
        fprintf(stderr, "FAIL: -ln 1 drawn as %g\n", at_one);
        return 1;
    }
    if (worst_error > TOLERANCE) {
        fprintf(stderr, "FAIL: k = %llu: -ln(k 2^-53) drawn %.17g, libm %.17g (error %g)\n",
                (unsigned long long)worst_k, coral_profile_minus_ln_uniform(worst_k),
                -log((double)worst_k / (double)TOP), worst_error);
        return 1;
    }
    printf("profile_draw: %ld k checked, largest error %.3g (k = %llu)\n", checked, worst_error,
           (unsigned long long)worst_k);
    return 0;
}
