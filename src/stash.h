/* The bulk cache ("stash"): blocks given to coral_free_bulk, kept by the
 * calling thread for its next coral_malloc_bulk / coral_malloc_bulk_sizes.
 *
 * Why: a batch freed in bulk is mostly followed by a batch of the same
 * sizes allocated in bulk. Freeing to the pages writes a link into every
 * block, and the next allocation then chases those links, one dependent
 * load per block (a cache miss each once the blocks are scattered), while
 * pages that filled up and emptied move between queues. The stash keeps
 * the addresses in arrays instead: a free copies the address in, an
 * allocation copies it out, and no page is touched either way.
 *
 * What goes in (bulk.c decides, measured on the bulk harness): only blocks
 * of classes coral_malloc_bulk asked for since the cache last overflowed
 * (coral_malloc_bulk_sizes neither asks nor takes: a size per block is
 * served faster by the pages, whose lists it pops without a class lookup),
 * and only scattered ones: a stretch of one slice in address order is
 * linked whole on its page's list, and a page it empties is reset and
 * carved again by address, cheaper than any cache. A call that finds the
 * cache full empties it and forgets the classes asked for: the cache never
 * stays full of blocks no one asks for.
 *
 * A stashed block is still "in use" for its page (page->used counts it, so
 * a page with stashed blocks is never released) and "freed" for the
 * program and the statistics. Its page is not touched, so blocks of any
 * thread can be stashed; not blocks of a user heap (coral_heap_destroy
 * frees its pages whatever is live: CORAL_PAGE_USER_HEAP), of a page with
 * aligned blocks, nor large or huge blocks (bulk.c decides).
 *
 * The marker: word 0 of a stashed block holds its address XOR the stash's
 * key, whose top bit is set, a value no free() link (a user-space pointer
 * or NULL) can equal. A block given to coral_free_bulk twice is seen at
 * the second time (it holds its marker already); a stashed block then
 * freed with free() (its link overwrites the marker), or written after its
 * free, is seen when the stash gives it out or flushes it. Either way the
 * process stops with a message: no block is silently handed out twice.
 * Taking a block out clears its marker (word 0 is 0).
 *
 * Storage: per size class, a stack of chunks of CORAL_STASH_CHUNK_BLOCKS
 * addresses; a class's chunks are all full but the top one, which is never
 * empty (an emptied chunk goes back to the spare list). Bounded twice: by
 * the chunks of the mapping (CORAL_STASH_CHUNKS) and by the bytes the
 * option CORALLOC_BULK_CACHE_KB allows.
 *
 * Who may touch what (the protocol):
 * - `busy` is the stash's lock, never waited on by a bulk call. The owner
 *   thread takes it (atomic exchange to 1) at the start of a bulk call that
 *   uses the stash and stores 0 (release) at the end; a call that finds it
 *   taken goes without the stash. The purger (or a thread ticking the
 *   purge) takes it with a CAS from 0, under the heap registry lock, to
 *   flush a stash that has not been used for the purge delay; it flushes
 *   after the registry lock is released and then stores 0.
 * - Everything but `busy`, `uses` and `bytes` is read and written only by
 *   the holder of `busy`. `bytes` is written by the holder of `busy` and
 *   read by anyone (relaxed: a hint of whether there is anything to take);
 *   `uses` is written by the owner and read by the purger, to tell an idle
 *   stash.
 * - At thread exit the owner takes `busy` (waiting out a flush in progress),
 *   flushes and keeps it: no one takes it again. The mapping is unmapped
 *   once the heap has left the registry (no purger can still read it). */
#ifndef CORAL_STASH_H
#define CORAL_STASH_H

#include "internal.h"

#define CORAL_STASH_CHUNK_BLOCKS 62

typedef struct coral_stash_chunk_s {
    struct coral_stash_chunk_s *next; /* the class's next (full) chunk, or the next spare */
    size_t count;                     /* blocks[0..count) */
    void *blocks[CORAL_STASH_CHUNK_BLOCKS];
} coral_stash_chunk_t;

_Static_assert(sizeof(coral_stash_chunk_t) == 512, "a chunk is 8 cache lines");

/* The mapping: a 1 KiB header, then the chunks (64 KiB of them). */
#define CORAL_STASH_MAP_SIZE ((size_t)68 << 10)
#define CORAL_STASH_HEADER_SIZE ((size_t)1 << 10)
#define CORAL_STASH_CHUNKS ((CORAL_STASH_MAP_SIZE - CORAL_STASH_HEADER_SIZE) / sizeof(coral_stash_chunk_t))

typedef struct coral_stash_s {
    _Atomic(int) busy;
    _Atomic(uint64_t) uses;  /* bulk calls that used the stash (owner) */
    _Atomic(int64_t) bytes;  /* bytes of the blocks stashed */
    uintptr_t key;           /* marker = address ^ key; top bit set */
    coral_stash_chunk_t *spare; /* chunks given back, reused first */
    size_t carved;              /* chunks[0..carved) were ever used */
    uint64_t seen_uses, seen_ms; /* purger only: uses at its last look, and when it changed */
    coral_stash_chunk_t *top[CORAL_CLASS_COUNT];
    /* want[cls]: coral_malloc_bulk asked for blocks of class cls since the
     * cache last overflowed; only those classes' blocks are cached. Owner
     * only (busy or not; no one else reads it). */
    uint8_t want[CORAL_CLASS_COUNT];
} coral_stash_t;

_Static_assert(sizeof(coral_stash_t) <= CORAL_STASH_HEADER_SIZE, "the header fits");

CORAL_INLINE coral_stash_chunk_t *coral_stash_chunks(coral_stash_t *s) {
    return (coral_stash_chunk_t *)((uint8_t *)s + CORAL_STASH_HEADER_SIZE);
}

/* The marker of block p for a stash whose key is key. */
CORAL_INLINE uintptr_t coral_stash_marker(uintptr_t key, const void *p) {
    return (uintptr_t)p ^ key;
}

/* (stash.c) */
coral_stash_chunk_t *coral_stash_chunk_new(coral_stash_t *s, unsigned cls);
void coral_stash_chunk_done(coral_stash_t *s, unsigned cls);
CORAL_COLD __attribute__((noreturn)) void coral_stash_bad_block(const void *p, bool at_free);

/* p (a block not stashed) marked as stashed, key being the stash's key
 * (its callers keep it at hand): a block that holds its marker already was
 * given to coral_free_bulk twice. Holder of busy. */
CORAL_INLINE void coral_stash_mark_in(uintptr_t key, void *p) {
    uintptr_t *word = p, mark = coral_stash_marker(key, p);
    if (coral_unlikely(*word == mark)) coral_stash_bad_block(p, true);
    *word = mark;
}

/* Room for more blocks of class cls: the free entries of its top chunk
 * (a new top chunk when it has none), [*start, returned end); NULL when no
 * chunk is left. The caller writes marked blocks from *start on, then
 * says how far it got with coral_stash_commit before anything else reads
 * or changes the class's chunks. Holder of busy. */
CORAL_INLINE void **coral_stash_reserve(coral_stash_t *s, unsigned cls, void ***start) {
    coral_stash_chunk_t *c = s->top[cls];
    if (c == NULL || c->count == CORAL_STASH_CHUNK_BLOCKS) {
        c = coral_stash_chunk_new(s, cls);
        if (c == NULL) return NULL;
    }
    *start = &c->blocks[c->count];
    return &c->blocks[CORAL_STASH_CHUNK_BLOCKS];
}

/* The blocks of a reservation of class cls are written up to end (in
 * [start, the reserved end)): they are in the stash now. */
CORAL_INLINE void coral_stash_commit(coral_stash_t *s, unsigned cls, void **end) {
    coral_stash_chunk_t *c = s->top[cls];
    c->count = (size_t)(end - c->blocks);
}

/* The check every block leaving the stash passes: its marker (for the
 * stash's key) is intact. */
CORAL_INLINE void coral_stash_check(uintptr_t key, void *p) {
    uintptr_t *word = p;
    if (coral_unlikely(*word != coral_stash_marker(key, p))) coral_stash_bad_block(p, false);
}

/* Up to want blocks of class cls into out[]; how many. Each chunk's blocks
 * come out in the order they went in. Holder of busy. */
size_t coral_stash_take(coral_stash_t *s, unsigned cls, void **out, size_t want);

/* coral_malloc_bulk asks for blocks of class cls: the cache may take them. */
CORAL_INLINE void coral_stash_want(coral_heap_t *heap, unsigned cls) {
    coral_stash_t *s = atomic_load_explicit(&heap->stash, memory_order_relaxed);
    if (s != NULL) s->want[cls] = 1;
}

/* The calling thread's stash, taken (busy), when it may hold blocks: for
 * the allocating calls. NULL: none, empty, or being flushed. */
CORAL_INLINE coral_stash_t *coral_stash_for_alloc(coral_heap_t *heap) {
    coral_stash_t *s = atomic_load_explicit(&heap->stash, memory_order_relaxed);
    if (s == NULL || atomic_load_explicit(&s->bytes, memory_order_relaxed) == 0) return NULL;
    if (atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) != 0) return NULL;
    return s;
}

/* The calling thread's stash, taken, for coral_free_bulk: made on first
 * use (the thread's own heap only); NULL when the option is 0, the stash
 * is being flushed, or no memory. *room: the bytes it may still take. */
coral_stash_t *coral_stash_for_free(coral_heap_t *heap, int64_t *room);

/* The end of a bulk call that took the stash and changed its bytes by
 * delta: busy released; then, if it holds blocks, the purger is told
 * (once). */
void coral_stash_release(coral_stash_t *s, int64_t delta);

/* The same for a coral_free_bulk that found the stash full: it is emptied
 * and forgets the classes asked for, so it never stays full of blocks
 * nobody asks for again. */
void coral_stash_release_overflowed(coral_stash_t *s, int64_t delta);

/* Free every stashed block to its page (holder of busy). */
void coral_stash_flush(coral_stash_t *s);

/* The thread's own stash, flushed now (coral_collect). */
void coral_stash_flush_own(coral_heap_t *heap);

/* Thread exit: flush the stash and keep it taken (before the heap leaves
 * the registry); then unmap it (after). */
coral_stash_t *coral_stash_thread_exit(coral_heap_t *heap);
void coral_stash_unmap(coral_stash_t *s);

/* The purger: flush stashes unused for the purge delay (all with force);
 * returns when the next may be due (0: none holds blocks). */
uint64_t coral_stashes_flush_due(uint64_t now, bool force);

#endif /* CORAL_STASH_H */
