/* The segment cache: address space that held a segment (normal or huge)
 * stays mapped after the segment is freed, so that the next segment of any kind and
 * size reuses the pages the program already touched instead of faulting in
 * fresh ones (a fault costs a kernel entry and a 4 KiB clear).
 *
 * The cache holds regions: 4 MiB-aligned runs of whole 4 MiB chunks. Each
 * records when it was last freed and its dirty length: bytes in
 * [base, base + dirty) may hold old data, bytes past it read as zero (never
 * touched, or purged). dirty stays exact through splits and merges (two
 * neighbours merge only when the first is dirty to its end or the second
 * is clean), so a taker knows which bytes it must clear for calloc and
 * which pages are resident.
 *
 * A region also records which of its first 64 chunks begin with the header
 * of a segment freed there (normal or huge), every slice descriptor of which
 * is free (slice_count 0): a new segment there need not clear the
 * descriptors (the third page of a header holds only the last one, and
 * clearing it would fault it in).
 *
 * Map entries (segment.c) of cached chunks: a segment freed into the cache
 * keeps its entries and its header until its region is split, moved or
 * purged (so that a double free soon after the free is reported as one);
 * every other cached chunk has entry NONE. So an entry never leads to a
 * header that is not there.
 *
 * Taking n bytes (whole chunks):
 *   1. the region of at least n bytes whose first n bytes hold the most
 *      dirty (resident) pages, the smallest among equals (split: the rest
 *      stays); else a new mapping;
 *   2. its clean part is then filled with the dirty chunks of other regions,
 *      whole dirty chunks first, then partly dirty ones, the most dirty
 *      first: mremap moves their page tables, so their pages are reused
 *      without a copy or a fault, and the clean pages they land on were not
 *      resident, so nothing is lost.
 * Putting merges the region with adjacent ones where dirty stays exact.
 * Dirty regions are purged (MADV_DONTNEED) once they stayed unused for
 * CORALLOC_PURGE_DELAY_MS; the cache keeps at most CORALLOC_SEGMENT_CACHE x
 * 4 MiB, beyond which the least recently freed regions are unmapped.
 *
 * Locking: one mutex guards the region table and the map entries of cached
 * chunks; it is a leaf (no other lock is taken under it) and no system call
 * is made under it: a region being mapped, moved, purged or unmapped has left
 * the table first, so it is that thread's alone. A region out of the table
 * that no thread will own (purged, to go back; evicted, to be unmapped) is
 * covered by a second lock, held until it is back or unmapped, which the
 * fork takes (purge_lock, evict_lock): the child has no such thread. Order:
 * purge_lock, evict_lock, cache_lock. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "segment/segment.h"

#define CACHE_SLOTS 128

typedef struct cache_region_s {
    uint8_t *base;
    size_t size;       /* whole chunks */
    size_t dirty;      /* bytes from base that may hold data: see above */
    uint64_t freed_ms; /* when it was last freed (merged: the latest) */
    uint64_t headers;  /* bit i: chunk i begins with a freed segment's header */
} cache_region_t;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
/* One purger of the cache at a time (the purge thread, or a thread in
 * coral_collect or a slow path's pass), held from a region's take out of
 * the table until it is back (coral_segment_cache_purge), around the
 * madvise that cache_lock is not held across. A fork takes it before
 * cache_lock: a region out of the table at the fork would be lost to the
 * child (mapped, its data resident there, reused by nobody), half purged
 * by a thread the child does not have. Taken before cache_lock, never
 * while holding it. */
static pthread_mutex_t purge_lock = PTHREAD_MUTEX_INITIALIZER;
/* One evicter at a time: a thread whose put makes room in the full cache
 * (cache_insert) holds it from before the least recently freed regions
 * leave the table until they are unmapped. A fork takes it before
 * cache_lock: regions out of the table at the fork would stay mapped in
 * the child, their data resident there, referenced by nothing. Only a put
 * that may evict takes it (taken before cache_lock, never while holding
 * it); takes never do, so none waits for an unmap. */
static pthread_mutex_t evict_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_region_t regions[CACHE_SLOTS]; /* regions[0, region_count) are in use */
static size_t region_count;
static _Atomic(size_t) cache_bytes; /* written under the lock; read as a hint */
/* Bytes of the table's regions that may hold data (their dirty lengths):
 * written under the lock, read by purge passes. */
static _Atomic(int64_t) cache_dirty;

/* Dirty bytes entered or left the table: the purge backlog and cache_dirty. */
static void cache_dirty_add(int64_t bytes) {
    atomic_store_explicit(&cache_dirty, cache_dirty + bytes, memory_order_relaxed);
    coral_purge_backlog_add(bytes);
}

static size_t cache_limit(void) {
    return (size_t)coral_option(CORAL_OPT_SEGMENT_CACHE) * CORAL_SEGMENT_SIZE;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Header bits of the chunks from byte `offset` of a region on (offset: whole
 * chunks), or of a region placed `offset` bytes in (shift left). */
static uint64_t headers_from(uint64_t headers, size_t offset) {
    size_t chunks = offset / CORAL_SEGMENT_SIZE;
    return chunks >= 64 ? 0 : headers >> chunks;
}

static uint64_t headers_at(uint64_t headers, size_t offset) {
    size_t chunks = offset / CORAL_SEGMENT_SIZE;
    return chunks >= 64 ? 0 : headers << chunks;
}

static uint64_t headers_below(uint64_t headers, size_t size) {
    size_t chunks = size / CORAL_SEGMENT_SIZE;
    return chunks >= 64 ? headers : headers & (((uint64_t)1 << chunks) - 1);
}

static size_t align_chunk(size_t x) {
    return (x + CORAL_SEGMENT_SIZE - 1) & ~(CORAL_SEGMENT_SIZE - 1);
}

/* ---- the table (cache_lock held) ---------------------------------------------------- */

/* Regions in the table count their dirty bytes in the purge backlog. */
static void table_remove(size_t i) {
    atomic_store_explicit(&cache_bytes, cache_bytes - regions[i].size, memory_order_relaxed);
    cache_dirty_add(-(int64_t)regions[i].dirty);
    regions[i] = regions[--region_count];
}

static void table_insert(cache_region_t r) {
    regions[region_count++] = r;
    atomic_store_explicit(&cache_bytes, cache_bytes + r.size, memory_order_relaxed);
    cache_dirty_add((int64_t)r.dirty);
}

/* a directly followed by b: one region. */
static cache_region_t regions_join(cache_region_t a, cache_region_t b) {
    cache_region_t r = {a.base, a.size + b.size, b.dirty ? a.size + b.dirty : a.dirty,
                        a.freed_ms > b.freed_ms ? a.freed_ms : b.freed_ms,
                        a.headers | headers_at(b.headers, a.size)};
    return r;
}

/* a directly followed by b may become one region only if its dirty length
 * stays exact: a holds data to its end, or b holds none. Else the joined
 * region would count a's clean tail as dirty, and a taker would expect
 * resident pages where each first touch faults. Unjoined neighbours stay
 * two regions; a taker of more than either assembles them with mremap. */
static bool regions_joinable(cache_region_t a, cache_region_t b) {
    return a.dirty == a.size || b.dirty == 0;
}

/* Merge r with the regions right before and after it that it may join,
 * removing those. */
static cache_region_t table_merge(cache_region_t r) {
    for (size_t i = 0; i < region_count;) {
        if (regions[i].base + regions[i].size == r.base && regions_joinable(regions[i], r)) {
            r = regions_join(regions[i], r);
        } else if (r.base + r.size == regions[i].base && regions_joinable(r, regions[i])) {
            r = regions_join(r, regions[i]);
        } else {
            i++;
            continue;
        }
        table_remove(i);
        i = 0; /* the joined region may now touch another one */
    }
    return r;
}

static size_t table_oldest(void) {
    size_t oldest = 0;
    for (size_t i = 1; i < region_count; i++)
        if (regions[i].freed_ms < regions[oldest].freed_ms) oldest = i;
    return oldest;
}

/* Whether `size` more bytes and one more slot need room. Merging a region
 * with its neighbours (table_merge) leaves cache_bytes + its size as it
 * was and frees slots, so a region that needs none before its merge needs
 * none after it. */
static bool table_needs_room(size_t size) {
    return region_count > 0 && (region_count == CACHE_SLOTS || cache_bytes + size > cache_limit());
}

/* Make room for `size` more bytes and one more slot: the least recently
 * freed regions leave, into evict[] (their map entries cleared). */
static size_t table_make_room(size_t size, cache_region_t *evict) {
    size_t n = 0;
    while (table_needs_room(size)) {
        size_t i = table_oldest();
        evict[n++] = regions[i];
        coral_segment_map_set(regions[i].base, regions[i].size, false);
        table_remove(i);
    }
    return n;
}

/* Index of the region of at least `size` bytes with the most dirty bytes
 * in its first `size`, the smallest (then the most recently freed) among
 * equals; -1 if none. */
static long table_best_fit(size_t size) {
    long best = -1;
    size_t best_dirty = 0;
    for (size_t i = 0; i < region_count; i++) {
        cache_region_t *r = &regions[i];
        if (r->size < size) continue;
        size_t dirty = min_size(r->dirty, size);
        if (best < 0 || dirty > best_dirty ||
            (dirty == best_dirty &&
             (r->size < regions[best].size ||
              (r->size == regions[best].size && r->freed_ms > regions[best].freed_ms)))) {
            best = (long)i;
            best_dirty = dirty;
        }
    }
    return best;
}

/* The region with the most dirty bytes (of those with at least `least`),
 * or -1. */
static long table_most_dirty(size_t least) {
    long best = -1;
    for (size_t i = 0; i < region_count; i++)
        if (regions[i].dirty != 0 && regions[i].dirty >= least &&
            (best < 0 || regions[i].dirty > regions[best].dirty))
            best = (long)i;
    return best;
}

/* Take the first `size` bytes of region i; the rest stays in the table, its
 * map entries cleared (its first slice may have been anything). */
static cache_region_t table_take_front(size_t i, size_t size) {
    cache_region_t front = regions[i];
    if (front.size == size) {
        table_remove(i);
        return front;
    }
    cache_region_t *rest = &regions[i];
    rest->base += size;
    rest->size -= size;
    rest->dirty = rest->dirty > size ? rest->dirty - size : 0;
    rest->headers = headers_from(rest->headers, size);
    coral_segment_map_set(rest->base, rest->size, false);
    atomic_store_explicit(&cache_bytes, cache_bytes - size, memory_order_relaxed);
    front.size = size;
    front.dirty = min_size(front.dirty, size);
    cache_dirty_add(-(int64_t)front.dirty);
    front.headers = headers_below(front.headers, size);
    return front;
}

/* ---- putting ---------------------------------------------------------------------------- */

static void regions_unmap(cache_region_t *r, size_t n) {
    for (size_t i = 0; i < n; i++) coral_os_unmap(r[i].base, r[i].size);
}

/* r (no longer in the table, its map entries as documented above) goes
 * back in, merged with its neighbours; when the cache is full, the least
 * recently freed regions leave it and are unmapped, under evict_lock. */
static void cache_insert(cache_region_t r) {
    cache_region_t evict[CACHE_SLOTS];
    coral_mutex_lock(&cache_lock);
    bool evicter = table_needs_room(r.size);
    if (evicter) { /* (the table may change meanwhile: looked at again below) */
        coral_mutex_unlock(&cache_lock); /* evict_lock comes first */
        coral_mutex_lock(&evict_lock);
        coral_mutex_lock(&cache_lock);
    }
    r = table_merge(r);
    size_t evicted = table_make_room(r.size, evict); /* 0 unless evicter */
    table_insert(r);
    coral_mutex_unlock(&cache_lock);
    if (evicted != 0) coral_test_point(CORAL_TP_CACHE_EVICTING, evict[0].base);
    regions_unmap(evict, evicted);
    if (evicter) coral_mutex_unlock(&evict_lock);
}

/* The chunks at base (size: whole chunks; bytes up to base + dirty may hold
 * data) are free: keep them for reuse, or unmap them when they are more than
 * the cache may hold (or, more than one chunk, more than half of it).
 * `header`: a freed segment whose header (every descriptor free) is at base. */
void coral_segment_cache_put(void *base, size_t size, size_t dirty, bool header) {
    size_t limit = cache_limit();
    if (size > limit || (size > CORAL_SEGMENT_SIZE && size > limit / 2)) {
        coral_segment_map_set(base, size, false);
        coral_os_unmap(base, size);
        return;
    }
    cache_region_t r = {base, size, min_size(dirty, size), coral_clock_ms(), header ? 1u : 0u};
    cache_insert(r);
    if (r.dirty != 0) coral_purger_notify();
}

/* ---- taking ---------------------------------------------------------------------------- */

/* Move the dirty chunks of cached regions onto [dst, dst + size) (clean:
 * no resident page there), from the front: first whole dirty chunks (the
 * regions with the most first), then partly dirty ones, the most dirty
 * first. Each chunk moved saves the faults of its dirty pages; a partly
 * dirty one before whole ones would only take the place of a whole one.
 * Returns how far from dst data may now lie (0: nothing moved). */
static size_t cache_fill(uint8_t *dst, size_t size) {
    /* A piece of whole chunks takes every whole dirty chunk of its region
     * (or ends the fill), a partly dirty chunk the last dirty one: at most
     * two pieces per region. */
    cache_region_t pieces[2 * CACHE_SLOTS];
    size_t n = 0, got = 0;
    coral_mutex_lock(&cache_lock);
    while (got < size) {
        long i = table_most_dirty(CORAL_SEGMENT_SIZE);
        size_t take = CORAL_SEGMENT_SIZE; /* a partly dirty chunk */
        if (i >= 0)
            take = min_size(size - got, regions[i].dirty & ~(CORAL_SEGMENT_SIZE - 1));
        else
            i = table_most_dirty(1);
        if (i < 0) break;
        pieces[n] = table_take_front((size_t)i, take);
        coral_segment_map_set(pieces[n].base, pieces[n].size, false);
        got += pieces[n++].size;
    }
    coral_mutex_unlock(&cache_lock);
    size_t off = 0, dirty = 0;
    for (size_t i = 0; i < n; i++) {
        coral_os_move(pieces[i].base, dst + off, pieces[i].size, false, CORAL_SEGMENT_SIZE);
        dirty = off + pieces[i].dirty; /* pieces[i].dirty > 0: the last counts */
        off += pieces[i].size;
    }
    return dirty;
}

/* `size` bytes (whole chunks), 4 MiB-aligned, from the cache or the OS; NULL
 * when the OS has no memory. The first `huge_bytes`: advised for huge pages,
 * before the caller touches them (a clean 2 MiB then faults in as one page;
 * what is resident stays in 4 KiB pages). got->dirty: bytes up to
 * base + got->dirty may hold old data, the rest reads as zero; got->fresh:
 * a new mapping; got->header: the first slice holds a freed segment's
 * header, every descriptor free (else, when dirty, it may hold anything). */
void *coral_segment_cache_take(size_t size, size_t huge_bytes, coral_cache_got_t *got) {
    cache_region_t target = {NULL, 0, 0, 0, 0};
    if (atomic_load_explicit(&cache_bytes, memory_order_relaxed) != 0) {
        coral_mutex_lock(&cache_lock);
        long i = table_best_fit(size);
        if (i >= 0) target = table_take_front((size_t)i, size);
        coral_mutex_unlock(&cache_lock);
    }
    got->fresh = target.base == NULL;
    if (got->fresh) {
        target.base = coral_os_map_aligned(size, CORAL_SEGMENT_SIZE);
        if (target.base == NULL) return NULL;
    }
    got->dirty = target.dirty;
    got->header = (target.headers & 1) != 0;
    size_t clean = align_chunk(target.dirty);
    if (clean < size && atomic_load_explicit(&cache_bytes, memory_order_relaxed) != 0) {
        size_t moved = cache_fill(target.base + clean, size - clean);
        if (moved != 0) {
            got->dirty = clean + moved;
            got->fresh = false;
        }
    }
    /* (Blocks freed there were inaccessible to memcheck; what the chunks
     * hold, headers included, is read as it is.) */
    CORAL_VG(VALGRIND_MAKE_MEM_DEFINED(target.base, size));
    /* Only the 2 MiB pages with nothing resident: the advice changes only
     * how clean memory faults in (a partly resident 2 MiB stays in 4 KiB
     * pages whatever it says), and a block freed and taken again while its
     * pages are resident (the common reuse) would otherwise pay a system
     * call every time. */
    size_t advised_from = (got->dirty + CORAL_HUGE_PAGE_SIZE - 1) & ~(CORAL_HUGE_PAGE_SIZE - 1);
    size_t huge_end = huge_bytes < size ? huge_bytes : size;
    if (advised_from < huge_end)
        coral_os_advise_huge(target.base + advised_from, huge_end - advised_from);
    /* Past huge_end an earlier take's advice may hold on reused memory:
     * withdrawn where this take asked for huge pages short of its end, or
     * when they turned slow. */
    size_t plain_from = advised_from > huge_end ? advised_from : huge_end;
    if (plain_from < size && !got->fresh && (huge_bytes != 0 || coral_huge_pages_turned_slow()))
        coral_os_advise_no_huge(target.base + plain_from, size - plain_from);
    return target.base;
}

/* The range [addr, addr + size) if the cache holds all of it, in one region:
 * taken (a mapping that ends at addr grows into it without a system call).
 * The range's data is not known: the caller counts all of it as dirty. */
bool coral_segment_cache_take_range(void *addr, size_t size) {
    uint8_t *a = addr;
    if (atomic_load_explicit(&cache_bytes, memory_order_relaxed) < size) return false;
    bool taken = false;
    coral_mutex_lock(&cache_lock);
    /* Up to two regions (before and after the range) replace one. */
    for (size_t i = 0; i < region_count && region_count < CACHE_SLOTS && !taken; i++) {
        cache_region_t r = regions[i];
        if (a < r.base || a + size > r.base + r.size) continue;
        taken = true;
        table_remove(i);
        /* What lies before and after the range stays, as regions of its own. */
        if (a > r.base) {
            cache_region_t head = {r.base, (size_t)(a - r.base), 0, r.freed_ms, 0};
            head.dirty = min_size(r.dirty, head.size);
            head.headers = headers_below(r.headers, head.size);
            table_insert(head);
        }
        if (a + size < r.base + r.size) {
            size_t skip = (size_t)(a + size - r.base);
            cache_region_t tail = {a + size, r.size - skip, 0, r.freed_ms,
                                   headers_from(r.headers, skip)};
            tail.dirty = r.dirty > skip ? r.dirty - skip : 0;
            coral_segment_map_set(tail.base, tail.size, false);
            table_insert(tail);
        }
        coral_segment_map_set(a, size, false);
    }
    coral_mutex_unlock(&cache_lock);
    if (taken) CORAL_VG(VALGRIND_MAKE_MEM_DEFINED(a, size)); /* as coral_segment_cache_take */
    return taken;
}

/* ---- purging ---------------------------------------------------------------------------- */

/* A dirty region due for purging whose dirty bytes fit in `budget` (any,
 * when force), out of the table: the least recently freed. Else false,
 * with *next the earliest time one will be due or, when only the budget
 * held one back, looked at again (unchanged if none). */
static bool cache_take_due(uint64_t now, bool force, int64_t budget, cache_region_t *out,
                           uint64_t *next) {
    uint64_t delay = (uint64_t)coral_option(CORAL_OPT_PURGE_DELAY_MS);
    long pick = -1;
    coral_mutex_lock(&cache_lock);
    for (size_t i = 0; i < region_count; i++) {
        if (regions[i].dirty == 0) continue;
        uint64_t due = regions[i].freed_ms + delay;
        if (due <= now && !force && (int64_t)regions[i].dirty > budget)
            due = coral_purge_recheck_ms(now); /* held by the demand window */
        else if (force || due <= now) {
            if (pick < 0 || regions[i].freed_ms < regions[pick].freed_ms) pick = (long)i;
            continue;
        }
        if (*next == 0 || due < *next) *next = due;
    }
    bool found = pick >= 0;
    if (found) {
        *out = regions[pick];
        coral_segment_map_set(out->base, out->size, false); /* headers are about to go */
        table_remove((size_t)pick);
    }
    coral_mutex_unlock(&cache_lock);
    return found;
}

int64_t coral_segment_cache_dirty(void) {
    return atomic_load_explicit(&cache_dirty, memory_order_relaxed);
}

/* Purge the dirty regions that stayed unused for the purge delay, the least
 * recently freed first, as far as the demand window lets (all, when force):
 * a region is purged whole (one call), so one bigger than what the window
 * leaves to purge stays. Returns when the next one is due or looked at
 * again, or 0 if none waits. */
uint64_t coral_segment_cache_purge(uint64_t now, bool force) {
    uint64_t next = 0;
    cache_region_t r;
    if (atomic_load_explicit(&cache_dirty, memory_order_relaxed) == 0) return 0;
    int64_t budget = force ? INT64_MAX : coral_segment_purge_budget(now);
    coral_mutex_lock(&purge_lock);
    /* Each pass takes one region out; a purged region that merges with a
     * dirty neighbour on its way back is seen again. Bounded by the table. */
    for (size_t passes = 0; passes < 2 * CACHE_SLOTS; passes++) {
        if (atomic_load_explicit(&cache_bytes, memory_order_relaxed) == 0) break;
        if (!cache_take_due(now, force, budget, &r, &next)) break;
        /* Up to the 2 MiB its data ends in: in huge pages, all of it is
         * resident (the region is whole chunks, so this stays inside). */
        size_t huge = (size_t)2 << 20;
        coral_test_point(CORAL_TP_CACHE_PURGING, r.base);
        if (coral_os_purge(r.base, (r.dirty + huge - 1) & ~(huge - 1))) {
            if (!force) budget -= (int64_t)r.dirty;
            r.dirty = 0; /* all zero now, the header too */
            r.headers = 0;
        }
        cache_insert(r);
    }
    coral_mutex_unlock(&purge_lock);
    return next;
}

/* A purge in progress ends first (purge_lock), and an eviction in
 * progress (evict_lock): the child gets every region back in the table,
 * and has none of the evicted ones mapped. */
void coral_segment_cache_prefork(void) {
    if (!coral_mutex_trylock(&purge_lock)) {
        coral_test_point(CORAL_TP_FORK_CACHE_WAIT, NULL);
        coral_mutex_lock(&purge_lock);
    }
    if (!coral_mutex_trylock(&evict_lock)) {
        coral_test_point(CORAL_TP_FORK_EVICT_WAIT, NULL);
        coral_mutex_lock(&evict_lock);
    }
    coral_mutex_lock(&cache_lock);
}

void coral_segment_cache_postfork(void) {
    coral_mutex_unlock(&cache_lock);
    coral_mutex_unlock(&evict_lock);
    coral_mutex_unlock(&purge_lock);
}
