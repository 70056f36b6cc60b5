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
uint64_t coral_page_key;
/* Seeds the pages' epochs, the default build's freed-mark keys and the
 * carves' orders; 0 until drawn (the secure build draws it at start-up, the
 * default build at its first page). */
static _Atomic(uint64_t) epoch_key;

coral_ring_shape_t coral_ring_shapes[CORAL_CLASS_LARGE];

/* The ring fill's shape for blocks of `usable` bytes (page.h): pieces
 * from `first` (0, or 8 in a block of 72 usable bytes or more) to `end`
 * (its usable size, at most 72), the last ending there, the middle two 16
 * and 32 bytes after the first or at the last; a 16-byte block's all at
 * 0, their first 8 bytes compared. */
static coral_ring_shape_t ring_shape_for(size_t usable) {
    if (usable <= 8) return (coral_ring_shape_t){{0, 0, 0, 0}, 0x00ff};
    size_t first = usable < CORAL_RING_FILL_END ? 0 : 8;
    size_t last = coral_ring_fill_end(usable) - 16;
    size_t second = first + 16 < last ? first + 16 : last,
           third = first + 32 < last ? first + 32 : last;
    return (coral_ring_shape_t){{(uint8_t)first, (uint8_t)second, (uint8_t)third, (uint8_t)last},
                                0xffff};
}

void coral_secure_init(void) {
    uint64_t keys[4];
    coral_os_random(keys, sizeof keys);
    coral_list_key = (uintptr_t)keys[0];
    coral_canary_key = (keys[1] | CORAL_CANARY_HIGH) & CORAL_CANARY_EVEN; /* (page.h) */
    atomic_store_explicit(&epoch_key, keys[2] | 1, memory_order_relaxed);
    coral_page_key = keys[3];
    for (unsigned cls = 1; cls < CORAL_CLASS_LARGE; cls++)
        coral_ring_shapes[cls] = ring_shape_for(coral_class_size(cls) - CORAL_CANARY_SIZE);
}

/* The secret, drawn by the first caller (two threads racing keep the
 * first draw stored). */
static uint64_t secret_key(void) {
    uint64_t key = atomic_load_explicit(&epoch_key, memory_order_relaxed);
    if (coral_likely(key != 0)) return key;
    uint64_t drawn;
    coral_os_random(&drawn, sizeof drawn);
    drawn |= 1;
    if (atomic_compare_exchange_strong_explicit(&epoch_key, &key, drawn, memory_order_relaxed,
                                                memory_order_relaxed))
        return drawn;
    return key;
}

/* splitmix64: a step of a generator whose state is *state. */
static uint64_t mix_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static _Atomic(uint64_t) draws; /* secret values drawn so far */

/* The n-th output of a generator seeded by the secret: distinct counters
 * give unrelated values, none an attacker can predict. */
static uint64_t next_secret(void) {
    uint64_t state = secret_key() ^ atomic_fetch_add_explicit(&draws, 1, memory_order_relaxed) *
                                        0xd1b54a32d192ed03ull;
    return mix_next(&state);
}

uint32_t coral_secure_next_epoch(void) { return (uint32_t)next_secret(); }

void coral_bad_link(const coral_block_t *block, uintptr_t next) {
    coral_fatal("free list corrupted: the freed block %p links to %p (a write after free or an "
                "overflow into it)",
                (const void *)block, (void *)next);
}

/* The first byte of block from `from` up to its ring fill's end (its
 * first byte off the fill lies below it) that is not the fill, reported. */
__attribute__((noreturn)) static void write_after_free_at(const coral_page_t *page,
                                                          const uint8_t *block, size_t from) {
    size_t usable = page->block_size - CORAL_CANARY_SIZE, end = coral_ring_fill_end(usable);
    size_t at = from;
    while (at < end && block[at] == CORAL_FILL_BYTE) at++;
    coral_fatal("write after free detected: block %p of %zu bytes was written at offset %zu after "
                "it was freed",
                (const void *)block, usable, at);
}

void *coral_secure_write_after_free(const coral_page_t *page, const uint8_t *block) {
    if ((size_t)(block - coral_page_start_of(page)) > page->owner_last_block)
        coral_fatal("free list corrupted: a page of %zu-byte blocks was to hand out %p, outside "
                    "it (a link forged or overwritten after a free)",
                    page->block_size, (const void *)block);
    write_after_free_at(page, block, sizeof(coral_block_t)); /* (word 0: its link) */
    return NULL;
}

void coral_secure_ring_write_after_free(const coral_page_t *page, const uint8_t *block) {
    write_after_free_at(page, block, coral_ring_shape_of(page)->at[0]);
}

/* ---- the slow halves of the block checks (page.h) ------------------------------- */

bool coral_secure_check_slow(coral_page_t *page, void *p, bool release) {
    uint8_t *block = coral_page_block_start(page, p);
    size_t usable = page->block_size - CORAL_CANARY_SIZE;
    if ((coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED)
            ? (uint8_t *)p != coral_page_large_block(page)
            : block != (uint8_t *)p) {
        coral_misuse("invalid pointer %p (inside a block of %zu bytes, not its start)", p, usable);
        return false;
    }
    uint64_t canary = coral_canary_of(page, block), *mark = coral_mark_word(page, block);
    uint64_t freed = coral_freed_mark_of(canary);
    /* (p's usable bytes end at the mark: an aligned large block starts past block) */
    size_t from_p = (size_t)((uint8_t *)mark - (uint8_t *)p);
    if (*mark == freed) {
        coral_misuse("double free detected: block %p of %zu bytes was already free", p, usable);
        return false;
    }
    /* A few bits from the freed mark (48 from the canary; data written
     * over it is as far from both, an ASCII byte 1 bit at least from each
     * of their bytes): a freed block whose mark a stray write changed. */
    if (__builtin_popcountll(*mark ^ freed) < 8) {
        coral_misuse("double free detected: block %p of %zu bytes was already free (and written "
                     "after its free: its freed mark changed)",
                     p, usable);
        return false;
    }
    if (!coral_secure_canaries_intact(p, from_p, *mark, canary)) {
        /* (the request when the word still holds a slack, else the usable size) */
        size_t request = (*mark ^ canary) & ~CORAL_SLACK_BITS
                             ? from_p
                             : coral_secure_request_of(from_p, *mark, canary);
        coral_misuse("heap overflow detected: block %p of %zu bytes was written past its end", p,
                     request);
        return false;
    }
    if (release) coral_secure_mark_freed(page, block, canary);
    return true;
}

static void check_live_canary(coral_page_t *page, uint8_t *block) {
    if (coral_secure_canaries_intact(block, page->block_size - CORAL_CANARY_SIZE,
                                     *coral_mark_word(page, block), coral_canary_of(page, block)))
        return;
    coral_misuse("heap overflow detected: block %p of %zu bytes was written past its end (found "
                 "when its heap was destroyed or reset)",
                 (void *)block, page->block_size - CORAL_CANARY_SIZE);
}

void coral_page_check_live_canaries(coral_page_t *page) {
    /* (A page of aligned large blocks may hold its block past start.) */
    if (CORAL_SECURE && !(coral_slice_flags(page) & CORAL_PAGE_HAS_ALIGNED))
        coral_page_each_live(page, check_live_canary);
}

/* The blocks of `list` (at most the page's reserved count followed), each
 * with its fill and, in a block of 32 bytes or less, its freed mark as
 * coral_secure_fill_intact reads them: a write after free is reported. */
static void check_list_fills(coral_page_t *page, coral_block_t *list) {
    size_t usable = page->block_size - CORAL_CANARY_SIZE;
    uint32_t left = page->reserved;
    for (coral_block_t *b = list; b != NULL && left-- != 0; b = coral_block_next(b))
        if (coral_unlikely(
                !coral_secure_fill_intact(usable, (uint8_t *)b, coral_canary_of(page, b))))
            coral_secure_write_after_free(page, (uint8_t *)b);
}

/* Whether `next` (a decoded link, or a list's head) is NULL or a carved
 * block start of page: its offset from the first block below
 * `carved_bytes`, a multiple of the block size. */
static bool link_in_page(const coral_page_t *page, uintptr_t next, uint32_t carved_bytes) {
    uintptr_t offset = next - (uintptr_t)page->start;
    return next == 0 ||
           (offset < carved_bytes && (uint32_t)offset % (uint32_t)page->block_size == 0);
}

/* An empty page's carved blocks in address order (a stream the hardware
 * prefetches, where the lists' walk waits for each block's line before it
 * can read the next link): true when each holds its fill (and, in a block
 * of 32 bytes or less, its freed mark) as check_list_fills wants it and a
 * link to NULL or to a carved block start of the page, and both lists'
 * heads are NULL or such starts. Then every block on the lists is one of
 * those blocks (each list starts at one, and each link leads to one or
 * ends), so the walk would find nothing: it is skipped. Every carved block
 * is read: the span's memory is the page's, accessible (a parked page,
 * whose memory the purger may have returned, is never empty: used counts
 * its blocks). */
static bool carved_blocks_look_free(coral_page_t *page) {
    size_t bs = page->block_size, usable = bs - CORAL_CANARY_SIZE;
    uint32_t carved_bytes = (uint32_t)(page->capacity * bs);
    if (!link_in_page(page, (uintptr_t)page->free, carved_bytes) ||
        !link_in_page(page, (uintptr_t)page->local_free, carved_bytes))
        return false;
    uint64_t canary0 = coral_canary_of(page, NULL); /* a block's: ^ its address (page.h) */
    uintptr_t key = coral_list_key;
    for (uint8_t *b = page->start, *end = b + carved_bytes; b < end; b += bs) {
        uintptr_t next = *(const uintptr_t *)(const void *)b ^ key ^ (uintptr_t)b;
        if (!coral_secure_fill_intact(usable, b, canary0 ^ ((uintptr_t)b & CORAL_CANARY_VARY)) ||
            !link_in_page(page, next, carved_bytes))
            return false;
    }
    return true;
}

void coral_page_check_free_fills(coral_page_t *page) {
    if (!CORAL_SECURE || page->class_idx == CORAL_CLASS_LARGE) return;
    /* Every block free (the page's release after its last free): the
     * scan, else (a user heap's pages freed whole with live blocks, or a
     * scan that found something) the walk, which reports what it finds. */
    if (page->used == 0 && carved_blocks_look_free(page)) return;
    check_list_fills(page, page->free);
    check_list_fills(page, page->local_free);
}

/* ---- fresh blocks in a random order ------------------------------------------------
 * Each block of a carve step is drawn uniformly from the window: the
 * CORAL_CARVE_WINDOW lowest blocks of the step not linked yet (fewer only
 * for the step's last blocks). The list is built in the order of the
 * draws, which is the order malloc hands the blocks out: nearly the
 * address order, so that objects allocated one after the other stay a few
 * blocks apart and a walk over them in allocation order goes forward
 * through memory (docs/experiments/, "The secure build"), yet which of
 * the window's blocks comes next is a fresh secret draw every time. */

/* A draw uniform in 0..count-1 (count <= CORAL_CARVE_WINDOW) from the low
 * 16 bits of *bits, which it consumes: a multiply, no division, uniform to
 * within count / 2^16. */
static uint32_t draw_below(uint64_t *bits, uint32_t count) {
    uint32_t r = (uint32_t)(((*bits & 0xffffu) * count) >> 16);
    *bits >>= 16;
    return r;
}

/* A fresh block of a page (its canary `canary`, its size bs) made to look
 * freed (page.h, coral_secure_mark_freed) and linked to next with the list
 * key `key`, both as their inline functions do; here with the keys in
 * registers, which the stores into the blocks would otherwise make the
 * compiler reload (a uint64_t store may alias the global key). */
static inline void carve_one(uint8_t *b, size_t bs, uint64_t canary, uintptr_t key,
                             coral_block_t *next) {
    coral_secure_fill_words(b, bs - CORAL_CANARY_SIZE);
    *(uint64_t *)(void *)(b + bs - CORAL_CANARY_SIZE) = coral_freed_mark_of(canary);
    ((coral_block_t *)(void *)b)->next = (coral_block_t *)((uintptr_t)next ^ key ^ (uintptr_t)b);
}

coral_block_t *coral_secure_carve(const coral_page_t *page, uint8_t *first, uint32_t n,
                                  coral_block_t *rest) {
    size_t bs = page->block_size;
    uint64_t canary0 = coral_canary_of(page, NULL); /* a block's: ^ its address (page.h) */
    uintptr_t key = coral_list_key;
    if (n == 1) {
        carve_one(first, bs, canary0 ^ ((uintptr_t)first & CORAL_CANARY_VARY), key, rest);
        return (coral_block_t *)first;
    }
    /* A fresh secret per carve: another order each time, even for the
     * same blocks carved again (a page reset, a span made a page again),
     * none an attacker can predict. */
    uint64_t state = next_secret(), bits = 0;
    /* window[0..in_window) are the indices of the lowest unlinked blocks:
     * every index below `next` is linked or in the window. */
    uint32_t window[CORAL_CARVE_WINDOW];
    uint32_t in_window = n < CORAL_CARVE_WINDOW ? n : CORAL_CARVE_WINDOW, next = in_window;
    for (uint32_t i = 0; i < in_window; i++) window[i] = i;
    uint8_t *head = NULL, *tail = NULL;
    for (uint32_t i = 0; i < n; i++) {
        if ((i & 3) == 0) bits = mix_next(&state); /* four 16-bit draws a step */
        uint32_t j = draw_below(&bits, in_window);
        uint8_t *b = first + (size_t)window[j] * bs;
        window[j] = next < n ? next++ : window[--in_window];
        /* The block drawn before this one is linked to it now. */
        if (tail != NULL)
            carve_one(tail, bs, canary0 ^ ((uintptr_t)tail & CORAL_CANARY_VARY), key,
                      (coral_block_t *)(void *)b);
        else
            head = b;
        tail = b;
    }
    carve_one(tail, bs, canary0 ^ ((uintptr_t)tail & CORAL_CANARY_VARY), key, rest);
    return (coral_block_t *)(void *)head;
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

/* A slot whose address is a multiple of alignment (above the slot size,
 * at most the region's): every step-th slot, the first free one. */
static void *zero_slot_alloc_aligned(uint8_t *region, size_t alignment) {
    size_t step = alignment / ZERO_SLOT_SIZE;
    for (size_t slot = 0; slot < ZERO_SLOTS; slot += step) {
        uint64_t bit = (uint64_t)1 << (slot % 64);
        if (atomic_load_explicit(&zero_bits[slot / 64], memory_order_relaxed) & bit) continue;
        if (!(atomic_fetch_or_explicit(&zero_bits[slot / 64], bit, memory_order_relaxed) & bit))
            return region + slot * ZERO_SLOT_SIZE;
    }
    return NULL;
}

void *coral_zero_slot_alloc(size_t alignment) {
    uint8_t *region = zero_region_get();
    if (region == NULL || alignment > CORAL_SEGMENT_SIZE) return NULL;
    if (alignment > ZERO_SLOT_SIZE) return zero_slot_alloc_aligned(region, alignment);
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
void *coral_zero_slot_alloc(size_t alignment) {
    (void)alignment;
    return NULL;
}
bool coral_is_zero_slot(const void *p) {
    (void)p;
    return false;
}
bool coral_zero_slot_free(void *p) {
    (void)p;
    return false;
}
#endif
