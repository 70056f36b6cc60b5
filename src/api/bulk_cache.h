/* The bulk cache: blocks given to coral_free_bulk, kept by the calling
 * thread for its next coral_malloc_bulk / coral_malloc_bulk_sizes.
 *
 * Why: a batch freed in bulk is mostly followed by a batch of the same
 * sizes allocated in bulk. Freeing to the pages writes a link into every
 * block, and the next allocation then chases those links, one dependent
 * load per block (a cache miss each once the blocks are scattered), while
 * pages that filled up and emptied move between queues. The cache keeps
 * the addresses in arrays instead: a free copies the address in, an
 * allocation copies it out, and no page is touched either way.
 *
 * What goes in (bulk.c decides): only blocks
 * of classes coral_malloc_bulk asked for since the cache last overflowed
 * (coral_malloc_bulk_sizes neither asks nor takes: it pops a size per block
 * from its direct[] page, with no class lookup),
 * and only scattered ones: a stretch of one slice in address order is
 * linked whole on its page's list, and a page it empties is reset and
 * carved again by address, cheaper than any cache. A call that finds the
 * cache full empties it and forgets the classes asked for: the cache never
 * stays full of blocks no one asks for.
 *
 * A cached block is still "in use" for its page (page->used counts it, so
 * a page with cached blocks is never released) and "freed" for the
 * program and the statistics. Its page is not touched, so blocks of any
 * thread can be cached; not blocks of a user heap (coral_heap_destroy
 * frees its pages whatever is live: page->is_user_heap), of a page with
 * aligned blocks, nor large or huge blocks (bulk.c decides).
 *
 * The marker: word 0 of a cached block holds its address XOR the cache's
 * key, whose top bit is set, a value no free() link (a user-space pointer
 * or NULL) can equal. A block given to coral_free_bulk twice is seen at
 * the second time (it holds its marker already); a cached block then
 * freed with free() (its link overwrites the marker), or written after its
 * free, is seen when the cache gives it out or flushes it. Either way the
 * process stops with a message: no block is silently handed out twice.
 * Taking a block out clears its marker (word 0 is 0).
 *
 * Storage: per size class, a stack of chunks of CORAL_BULK_CACHE_CHUNK_BLOCKS
 * addresses; a class's chunks are all full but the top one, which is never
 * empty (an emptied chunk goes back to the spare list). Bounded twice: by
 * the chunks of the mapping (CORAL_BULK_CACHE_CHUNKS) and by the bytes the
 * option CORALLOC_BULK_CACHE_KB allows.
 *
 * Who may touch what (the protocol):
 * - `busy` is the cache's lock, never waited on by a bulk call. The owner
 *   thread takes it (atomic exchange to 1) at the start of a bulk call that
 *   uses the cache and stores 0 (release) at the end; a call that finds it
 *   taken goes without the cache. The purger (or a thread ticking the
 *   purge) takes it with a CAS from 0, under the caches' registry lock,
 *   to flush a cache that has not been used for the purge delay; it
 *   flushes after the registry lock is released and then stores 0.
 * - Everything but `busy`, `uses` and `bytes` is read and written only by
 *   the holder of `busy`. `bytes` is written by the holder of `busy` and
 *   read by anyone (relaxed: a hint of whether there is anything to take);
 *   `uses` is written by the owner and read by the purger, to tell an idle
 *   cache.
 * - At thread exit the owner takes `busy` (waiting out a flush in progress),
 *   flushes and keeps it: no one takes it again. It leaves the registry
 *   (under its lock, so no purger is looking at it) and is unmapped. */
#ifndef CORAL_BULK_CACHE_H
#define CORAL_BULK_CACHE_H

#include "api/api.h"

#define CORAL_BULK_CACHE_CHUNK_BLOCKS 62

typedef struct coral_cache_chunk_s {
    struct coral_cache_chunk_s *next; /* the class's next (full) chunk, or the next spare */
    size_t count;                     /* blocks[0..count) */
    void *blocks[CORAL_BULK_CACHE_CHUNK_BLOCKS];
} coral_cache_chunk_t;

_Static_assert(sizeof(coral_cache_chunk_t) == 512, "a chunk is 8 cache lines");

/* The mapping: a 2 KiB header, then the chunks (132 of them). */
#define CORAL_BULK_CACHE_MAP_SIZE ((size_t)68 << 10)
#define CORAL_BULK_CACHE_HEADER_SIZE ((size_t)2 << 10)
#define CORAL_BULK_CACHE_CHUNKS                                                                    \
    ((CORAL_BULK_CACHE_MAP_SIZE - CORAL_BULK_CACHE_HEADER_SIZE) / sizeof(coral_cache_chunk_t))

typedef struct coral_bulk_cache_s {
    coral_link_t registry_link; /* every thread's cache, under the registry lock */
    _Atomic(int) busy;
    _Atomic(uint64_t) uses;      /* bulk calls that used the cache (owner) */
    _Atomic(int64_t) bytes;      /* bytes of the blocks cached */
    uintptr_t key;               /* marker = address ^ key; top bit set */
    coral_cache_chunk_t *spare;  /* chunks given back, reused first */
    size_t carved;               /* chunks[0..carved) were ever used */
    uint64_t seen_uses, seen_ms; /* purger only: uses at its last look, and when it changed */
    coral_cache_chunk_t *top[CORAL_CLASS_COUNT];
    /* want[cls]: coral_malloc_bulk asked for blocks of class cls since the
     * cache last overflowed; only those classes' blocks are cached. Owner
     * only (busy or not; no one else reads it). */
    uint8_t want[CORAL_CLASS_COUNT];
} coral_bulk_cache_t;

_Static_assert(sizeof(coral_bulk_cache_t) <= CORAL_BULK_CACHE_HEADER_SIZE, "the header fits");

/* The calling thread's cache, made by its first coral_free_bulk. */
extern __thread coral_bulk_cache_t *coral_bulk_cache_tls __attribute__((tls_model("initial-exec")));

CORAL_INLINE coral_cache_chunk_t *coral_bulk_cache_chunks(coral_bulk_cache_t *s) {
    return (coral_cache_chunk_t *)((uint8_t *)s + CORAL_BULK_CACHE_HEADER_SIZE);
}

/* The marker of block p for a cache whose key is key. */
CORAL_INLINE uintptr_t coral_bulk_cache_marker(uintptr_t key, const void *p) {
    return (uintptr_t)p ^ key;
}

/* (bulk_cache.c) */
coral_cache_chunk_t *coral_bulk_cache_chunk_new(coral_bulk_cache_t *s, unsigned cls);
void coral_bulk_cache_chunk_done(coral_bulk_cache_t *s, unsigned cls);
CORAL_COLD __attribute__((noreturn)) void coral_bulk_cache_bad_block(const void *p, bool at_free);

/* p (a block not cached) marked as cached, key being the cache's key
 * (its callers keep it at hand): a block that holds its marker already was
 * given to coral_free_bulk twice. Holder of busy. */
CORAL_INLINE void coral_bulk_cache_mark_in(uintptr_t key, void *p) {
    uintptr_t *word = p, mark = coral_bulk_cache_marker(key, p);
    if (coral_unlikely(*word == mark)) coral_bulk_cache_bad_block(p, true);
    *word = mark;
}

/* Room for more blocks of class cls: the free entries of its top chunk
 * (a new top chunk when it has none), [*start, returned end); NULL when no
 * chunk is left. The caller writes marked blocks from *start on, then
 * says how far it got with coral_bulk_cache_commit before anything else reads
 * or changes the class's chunks. Holder of busy. */
CORAL_INLINE void **coral_bulk_cache_reserve(coral_bulk_cache_t *s, unsigned cls, void ***start) {
    coral_cache_chunk_t *c = s->top[cls];
    if (c == NULL || c->count == CORAL_BULK_CACHE_CHUNK_BLOCKS) {
        c = coral_bulk_cache_chunk_new(s, cls);
        if (c == NULL) return NULL;
    }
    *start = &c->blocks[c->count];
    return &c->blocks[CORAL_BULK_CACHE_CHUNK_BLOCKS];
}

/* The blocks of a reservation of class cls are written up to end (in
 * [start, the reserved end)): they are in the cache now. */
CORAL_INLINE void coral_bulk_cache_commit(coral_bulk_cache_t *s, unsigned cls, void **end) {
    coral_cache_chunk_t *c = s->top[cls];
    c->count = (size_t)(end - c->blocks);
}

/* The check every block leaving the cache passes: its marker (for the
 * cache's key) is intact. */
CORAL_INLINE void coral_bulk_cache_check(uintptr_t key, void *p) {
    uintptr_t *word = p;
    if (coral_unlikely(*word != coral_bulk_cache_marker(key, p)))
        coral_bulk_cache_bad_block(p, false);
}

/* Up to want blocks of class cls into out[]; how many. Each chunk's blocks
 * come out in the order they went in. Holder of busy. */
size_t coral_bulk_cache_take(coral_bulk_cache_t *s, unsigned cls, void **out, size_t want);

/* coral_malloc_bulk asks for blocks of class cls: the cache may take them. */
CORAL_INLINE void coral_bulk_cache_want(unsigned cls) {
    coral_bulk_cache_t *s = coral_bulk_cache_tls;
    if (s != NULL) s->want[cls] = 1;
}

/* The calling thread's cache, taken (busy), when it may hold blocks: for
 * the allocating calls. NULL: none, empty, or being flushed. */
CORAL_INLINE coral_bulk_cache_t *coral_bulk_cache_for_alloc(void) {
    coral_bulk_cache_t *s = coral_bulk_cache_tls;
    if (s == NULL || atomic_load_explicit(&s->bytes, memory_order_relaxed) == 0) return NULL;
    if (atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) != 0) return NULL;
    return s;
}

/* The calling thread's cache, taken, for coral_free_bulk: made on first
 * use (the thread's own heap only); NULL when the option is 0, the cache
 * is being flushed, or no memory. *room: the bytes it may still take. */
coral_bulk_cache_t *coral_bulk_cache_for_free(int64_t *room);

/* The end of a bulk call that took the cache and changed its bytes by
 * delta: busy released; then, if it holds blocks, the purger is told
 * (once). */
void coral_bulk_cache_release(coral_bulk_cache_t *s, int64_t delta);

/* The same for a coral_free_bulk that found the cache full: it is emptied
 * and forgets the classes asked for, so it never stays full of blocks
 * nobody asks for again. */
void coral_bulk_cache_release_overflowed(coral_bulk_cache_t *s, int64_t delta);

/* Free every cached block to its page (holder of busy). */
void coral_bulk_cache_flush(coral_bulk_cache_t *s);

/* The thread's own cache, flushed now (coral_collect). */
void coral_bulk_cache_flush_own(void);

/* Free blocks to their pages, never to the bulk cache, without counting
 * them as freed again (the cache's flush; bulk.c). */
void coral_bulk_free_uncached(void *const *ptrs, size_t n);

#endif /* CORAL_BULK_CACHE_H */
