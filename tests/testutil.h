/* testutil.h: helpers shared by coralloc's tests (C and C++).
 *
 * - opaque(): hides a pointer from the optimiser, so that it can neither
 *   delete an allocation nor fold an alignment or aliasing check using what
 *   it assumes about malloc.
 * - fill_pattern()/verify_pattern(): a position- and seed-dependent byte
 *   pattern. Byte i of a block filled with seed s is byte (i % 8) of the
 *   little-endian word pattern_word(s, i / 8), so a prefix of a block has the
 *   same pattern whatever the block's size (what realloc must keep).
 * - rng: splitmix64.
 */
#ifndef CORAL_TEST_UTIL_H
#define CORAL_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* A test whose pattern checks need no race detection (single-threaded) may
 * define CORAL_TEST_UNINSTRUMENTED_PATTERNS before including this file: the
 * pattern loops are then not instrumented by TSan, which would otherwise
 * spend most of the run time on them. */
#if defined(CORAL_TEST_UNINSTRUMENTED_PATTERNS) && defined(__GNUC__)
#define TU_INLINE static inline __attribute__((no_sanitize("thread")))
#else
#define TU_INLINE static inline
#endif

TU_INLINE void *opaque(void *p) {
    __asm__ volatile("" : "+r"(p) : : "memory");
    return p;
}

TU_INLINE uint64_t pattern_word(uint64_t seed, size_t w) {
    return (seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) ^
           ((uint64_t)w * 0xD1B54A32D192ED03ull);
}

TU_INLINE void fill_pattern(void *p, size_t n, uint64_t seed) {
    unsigned char *b = (unsigned char *)p;
    size_t nw = n / 8, w;
    for (w = 0; w < nw; w++) {
        uint64_t v = pattern_word(seed, w);
        __builtin_memcpy(b + 8 * w, &v, 8);
    }
    if (n % 8) {
        uint64_t v = pattern_word(seed, nw);
        __builtin_memcpy(b + 8 * nw, &v, n % 8);
    }
}

/* Returns (size_t)-1 when the first n bytes carry the pattern of seed,
 * else the offset of the first wrong byte. */
TU_INLINE size_t pattern_mismatch(const void *p, size_t n, uint64_t seed) {
    const unsigned char *b = (const unsigned char *)p;
    size_t nw = n / 8, w, i;
    for (w = 0; w < nw; w++) {
        uint64_t v = pattern_word(seed, w), got;
        __builtin_memcpy(&got, b + 8 * w, 8);
        if (got != v) break;
    }
    for (i = 8 * w; i < n; i++) {
        uint64_t v = pattern_word(seed, i / 8);
        unsigned char want = (unsigned char)(v >> (8 * (i % 8)));
        if (b[i] != want) return i;
    }
    return (size_t)-1;
}

/* memset, as a plain loop (not intercepted by the sanitizers). */
TU_INLINE void fill_bytes(void *p, unsigned char c, size_t n) {
    unsigned char *b = (unsigned char *)p;
    uint64_t cw = 0x0101010101010101ull * c;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) __builtin_memcpy(b + i, &cw, 8);
    for (; i < n; i++) b[i] = c;
}

/* Offset of the first byte of p[0..n) that is not c, or (size_t)-1. */
TU_INLINE size_t byte_mismatch(const void *p, size_t n, unsigned char c) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i = 0;
    uint64_t cw = 0x0101010101010101ull * c;
    for (; i + 8 <= n; i += 8) {
        uint64_t got;
        __builtin_memcpy(&got, b + i, 8);
        if (got != cw) break;
    }
    for (; i < n; i++)
        if (b[i] != c) return i;
    return (size_t)-1;
}

#define CHECK_PATTERN(p, n, seed)                                                                  \
    do {                                                                                           \
        size_t tu_off_ = pattern_mismatch((p), (n), (seed));                                       \
        if (tu_off_ != (size_t)-1)                                                                 \
            check_fail_(__FILE__, __LINE__,                                                        \
                        "pattern of seed %ju broken at offset %zu of %zu "                         \
                        "bytes at %p (%s)",                                                        \
                        (uintmax_t)(seed), tu_off_, (size_t)(n), (const void *)(p), #p);           \
    } while (0)

#define CHECK_BYTES(p, n, c)                                                                       \
    do {                                                                                           \
        size_t tu_off_ = byte_mismatch((p), (n), (unsigned char)(c));                              \
        if (tu_off_ != (size_t)-1)                                                                 \
            check_fail_(__FILE__, __LINE__,                                                        \
                        "byte at offset %zu of %zu at %p (%s) is 0x%02x, "                         \
                        "not 0x%02x",                                                              \
                        tu_off_, (size_t)(n), (const void *)(p), #p,                               \
                        ((const unsigned char *)(p))[tu_off_], (unsigned)(unsigned char)(c));      \
    } while (0)

typedef struct {
    uint64_t s;
} tu_rng;

TU_INLINE uint64_t rng_next(tu_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
TU_INLINE size_t rng_range(tu_rng *r, size_t lo, size_t hi) {
    return lo + (size_t)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

TU_INLINE double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* CORAL_TEST_UTIL_H */
