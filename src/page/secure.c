/* The secure build's checks on blocks (page.h, "the secure build"): the
 * keys, canaries and freed marks, the fill of freed blocks, the random
 * order of fresh blocks, and the inaccessible slots malloc(0) returns.
 *
 * Compiled into both builds; in the default build nothing here is called
 * (every caller tests CORAL_SECURE, a constant 0 there). */
#include <string.h>

#include "page/page.h"

/* Written once by coral_secure_init, before the first block is linked or
 * handed out; read-only afterwards. */
uintptr_t coral_list_key;
uint64_t coral_canary_key;
static uint64_t epoch_key; /* seeds the pages' epochs */

void coral_secure_init(void) {
    uint64_t keys[3];
    coral_os_random(keys, sizeof keys);
    coral_list_key = (uintptr_t)keys[0];
    coral_canary_key = (keys[1] | CORAL_CANARY_HIGH) & CORAL_CANARY_EVEN; /* (page.h) */
    epoch_key = keys[2];
}

/* splitmix64: a step of a generator whose state is *state. */
static uint64_t mix_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static _Atomic(uint64_t) epochs; /* pages made so far */

uint32_t coral_secure_next_epoch(void) {
    /* The n-th output of a generator seeded by the secret: distinct
     * counters give unrelated values, none an attacker can predict. */
    uint64_t state = epoch_key ^ atomic_fetch_add_explicit(&epochs, 1, memory_order_relaxed) *
                                     0xd1b54a32d192ed03ull;
    return (uint32_t)mix_next(&state);
}

void coral_bad_link(const coral_block_t *block, uintptr_t next) {
    coral_fatal("free list corrupted: the freed block %p links to %p (a write after free or an "
                "overflow into it)",
                (const void *)block, (void *)next);
}

void *coral_secure_write_after_free(const coral_page_t *page, const uint8_t *block) {
    size_t end = page->block_size - CORAL_CANARY_SIZE;
    if (end > CORAL_FILL_END) end = CORAL_FILL_END;
    size_t at = sizeof(coral_block_t);
    while (at < end && block[at] == CORAL_FILL_BYTE) at++;
    coral_fatal("write after free detected: block %p of %zu bytes was written at offset %zu after "
                "it was freed",
                (const void *)block, page->block_size - CORAL_CANARY_SIZE, at);
}

/* ---- the slow halves of the block checks (page.h) ------------------------------- */

bool coral_secure_check_slow(coral_page_t *page, void *p, bool release) {
    uint8_t *block = coral_page_block_start(page, p);
    size_t usable = page->block_size - CORAL_CANARY_SIZE;
    if (block != (uint8_t *)p && !(coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED)) {
        coral_misuse("invalid pointer %p (inside a block of %zu bytes, not its start)", p, usable);
        return false;
    }
    uint64_t canary = coral_canary_of(page, block), *mark = coral_mark_word(page, block);
    if (*mark == coral_freed_mark_of(canary)) {
        coral_misuse("double free detected: block %p of %zu bytes was already free", p, usable);
        return false;
    }
    if (*mark != canary) {
        coral_misuse("heap overflow detected: block %p of %zu bytes was written past its end", p,
                     usable);
        return false;
    }
    if (release) coral_secure_mark_freed(page, block, canary);
    return true;
}

/* An aligned allocation's pointer: its block's start first. */
void coral_secure_block_out_any(void *p, size_t zero) {
    coral_page_t *page = coral_secure_page_of(p);
    if (page != NULL) coral_secure_page_out(page, coral_page_block_start(page, p), 0);
    if (zero != 0) memset(p, 0, zero);
}

/* ---- fresh blocks in a random order ------------------------------------------------ */

#define CARVE_SHUFFLE_MAX 256u /* a carve step is at most this many blocks (page.c) */

coral_block_t *coral_secure_carve(uint8_t *first, uint32_t n, size_t block_size,
                                  coral_block_t *rest) {
    coral_block_t *head = rest;
    /* Seeded by the secret key and the address: another order per carve,
     * none an attacker can predict. */
    uint64_t state = coral_list_key ^ (uintptr_t)first;
    while (n > 0) {
        uint32_t k = n < CARVE_SHUFFLE_MAX ? n : CARVE_SHUFFLE_MAX;
        uint16_t order[CARVE_SHUFFLE_MAX];
        /* Fisher-Yates, inside out: order[0..i] is a random permutation of
         * 0..i once i is placed. j is uniform in 0..i to within 2^-8 (a
         * 16-bit draw scaled by a multiply, no division); each 64-bit
         * output of the generator gives four draws. */
        uint64_t bits = 0;
        for (uint32_t i = 0; i < k; i++) {
            if ((i & 3) == 0) bits = mix_next(&state);
            uint32_t j = (uint32_t)(((bits & 0xffffu) * (i + 1)) >> 16);
            bits >>= 16;
            order[i] = order[j];
            order[j] = (uint16_t)i;
        }
        for (uint32_t i = 0; i < k; i++) {
            coral_block_t *b = (coral_block_t *)(void *)(first + (size_t)order[i] * block_size);
            coral_block_set_next(b, head);
            head = b;
        }
        first += (size_t)k * block_size;
        n -= k;
    }
    return head;
}

/* ---- malloc(0): inaccessible slots --------------------------------------------------
 * One region of CORAL_SEGMENT_SIZE bytes, mapped on the first malloc(0) and
 * never accessible, cut into 16-byte slots; a bit per slot says it is
 * handed out. Lock-free: a slot is taken by setting its bit (fetch_or: the
 * thread that turned it on owns the slot) and given back by clearing it
 * (fetch_and: a clear bit found there is a double free). */
#define ZERO_SLOT_SIZE CORAL_ALIGNMENT
#define ZERO_SLOTS (CORAL_SEGMENT_SIZE / ZERO_SLOT_SIZE)
#define ZERO_WORDS (ZERO_SLOTS / 64)

#if CORAL_SECURE
static _Atomic(uintptr_t) zero_region;
static _Atomic(uint64_t) zero_bits[ZERO_WORDS];
static _Atomic(size_t) zero_cursor; /* the word to try first: a hint */

static uint8_t *zero_region_get(void) {
    uintptr_t r = atomic_load_explicit(&zero_region, memory_order_acquire);
    if (r != 0) return (uint8_t *)r;
    uint8_t *mapped = coral_os_map_aligned(CORAL_SEGMENT_SIZE, CORAL_SEGMENT_SIZE);
    if (mapped == NULL) return NULL;
    if (!coral_os_protect(mapped, CORAL_SEGMENT_SIZE, false)) {
        coral_os_unmap(mapped, CORAL_SEGMENT_SIZE);
        return NULL;
    }
    if (atomic_compare_exchange_strong_explicit(&zero_region, &r, (uintptr_t)mapped,
                                                memory_order_acq_rel, memory_order_acquire))
        return mapped;
    coral_os_unmap(mapped, CORAL_SEGMENT_SIZE); /* another thread mapped it first */
    return (uint8_t *)r;
}

void *coral_zero_slot_alloc(void) {
    uint8_t *region = zero_region_get();
    if (region == NULL) return NULL;
    size_t start = atomic_load_explicit(&zero_cursor, memory_order_relaxed);
    for (size_t k = 0; k < ZERO_WORDS; k++) {
        size_t w = (start + k) % ZERO_WORDS;
        uint64_t bits = atomic_load_explicit(&zero_bits[w], memory_order_relaxed);
        while (bits != UINT64_MAX) {
            unsigned bit = (unsigned)__builtin_ctzll(~bits);
            uint64_t was =
                atomic_fetch_or_explicit(&zero_bits[w], (uint64_t)1 << bit, memory_order_relaxed);
            if (!(was & ((uint64_t)1 << bit))) {
                atomic_store_explicit(&zero_cursor, w, memory_order_relaxed);
                return region + (w * 64 + bit) * ZERO_SLOT_SIZE;
            }
            bits = was | ((uint64_t)1 << bit);
        }
    }
    return NULL;
}

bool coral_is_zero_slot(const void *p) {
    uintptr_t r = atomic_load_explicit(&zero_region, memory_order_acquire);
    return r != 0 && (uintptr_t)p - r < CORAL_SEGMENT_SIZE;
}

bool coral_zero_slot_free(void *p) {
    if (!coral_is_zero_slot(p)) return false;
    size_t slot =
        ((uintptr_t)p - atomic_load_explicit(&zero_region, memory_order_relaxed)) / ZERO_SLOT_SIZE;
    if ((uintptr_t)p % ZERO_SLOT_SIZE != 0) {
        coral_misuse("free(): invalid pointer %p (inside a malloc(0) slot)", p);
        return true;
    }
    uint64_t bit = (uint64_t)1 << (slot % 64);
    uint64_t was = atomic_fetch_and_explicit(&zero_bits[slot / 64], ~bit, memory_order_relaxed);
    if (!(was & bit))
        coral_misuse("double free detected: the malloc(0) block %p was already free", p);
    return true;
}
#else
void *coral_zero_slot_alloc(void) { return NULL; }
bool coral_is_zero_slot(const void *p) {
    (void)p;
    return false;
}
bool coral_zero_slot_free(void *p) {
    (void)p;
    return false;
}
#endif
