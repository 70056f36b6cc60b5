/* Large blocks (above the largest size class, up to half a segment:
 * CORAL_LARGE_MAX_SIZE) and huge blocks (bigger: a segment of their own).
 *
 * A large block is a page of one block: a span of 64 KiB slices taken from
 * one of the thread's segments, so freeing it returns the span to the
 * segment, and the next large request of the thread reuses it without a
 * system call. Its page sits in the heap's full queue, so frees from other
 * threads reach the owner through heap->delayed_pages (page.c).
 *
 * A huge block is a segment of its own, whole 4 MiB chunks from the segment
 * cache, with a 64 KiB header (the segment header) before the block. Freed,
 * its chunks go back to the cache, where any later segment, normal or huge,
 * reuses their pages (the secure build moves them there, to another
 * address, and keeps the block's own range inaccessible for a while).
 * realloc grows it in place (into cached chunks right
 * after it, or fresh address space) or moves its pages with mremap: bytes
 * are never copied. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "heap/heap.h"

static size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

/* Every heap's huge-block list, and the owner field of every huge
 * block (heap.h). Held only around list and owner updates and a huge
 * block's move (mremap), never while waiting for another lock. */
static pthread_mutex_t huge_lists_lock = PTHREAD_MUTEX_INITIALIZER;

void coral_huge_lists_lock(void) { coral_mutex_lock(&huge_lists_lock); }
void coral_huge_lists_unlock(void) { coral_mutex_unlock(&huge_lists_lock); }

static void *huge_alloc(coral_heap_t *heap, size_t size, size_t alignment, bool zero);

/* The secure build: the last huge blocks freed (their mappings made
 * inaccessible or unmapped at the free), so that a second free of one is
 * named as such. A ring any thread
 * writes (one slot each, by fetch_add) and reads; an entry is a hint, not a
 * proof: a block mapped at the same address later takes it out. */
#define FREED_HUGE_RING 64
static _Atomic(uintptr_t) freed_huge[FREED_HUGE_RING];
static _Atomic(unsigned) freed_huge_next;

static void freed_huge_note(const void *block, bool freed) {
    if (!freed) {
        for (size_t i = 0; i < FREED_HUGE_RING; i++) {
            uintptr_t was = (uintptr_t)block;
            atomic_compare_exchange_strong_explicit(&freed_huge[i], &was, 0, memory_order_relaxed,
                                                    memory_order_relaxed);
        }
        return;
    }
    unsigned i = atomic_fetch_add_explicit(&freed_huge_next, 1, memory_order_relaxed);
    atomic_store_explicit(&freed_huge[i % FREED_HUGE_RING], (uintptr_t)block, memory_order_relaxed);
}

bool coral_huge_was_freed(const void *p) {
    for (size_t i = 0; i < FREED_HUGE_RING; i++)
        if (atomic_load_explicit(&freed_huge[i], memory_order_relaxed) == (uintptr_t)p) return true;
    return false;
}

/* How much of a huge block's mapping of `total` bytes is advised for huge
 * pages: all of it for a block that grows (it fills what it grows into). */
static size_t huge_pages_all(size_t total) { return coral_huge_pages_for_big_block() ? total : 0; }

/* For a new block ending `end` bytes into its mapping: the 2 MiB pages the
 * header and the block fill at least half of. A 2 MiB block, which ends
 * 64 KiB into the mapping's second 2 MiB, faults in one huge page, not two
 * (a resident 2 MiB for 64 KiB of it). */
static size_t huge_pages_dense(size_t end) {
    if (!coral_huge_pages_for_big_block()) return 0;
    return (end + CORAL_HUGE_PAGE_SIZE / 2) & ~(CORAL_HUGE_PAGE_SIZE - 1);
}

/* The secure build: a large block at p of `inner` bytes (the request and
 * its canary word) ends, and its guard page starts, at the first OS page
 * boundary after them, not at its span's end: so the request canary at
 * the request's end and the canary word at the block's end lie on the
 * same OS page or on neighbours, and a malloc that writes both faults in
 * no page the program leaves untouched far from its request's end (the
 * span's end may lie up to 64 KiB after it). The span's bytes past the
 * guard page stay unused. */
static size_t secure_large_end(const coral_page_t *page, const uint8_t *p, size_t inner) {
    return align_up((size_t)(p - page->start) + inner, CORAL_OS_PAGE_SIZE);
}

void *coral_heap_malloc_large(coral_heap_t *heap, size_t size, size_t alignment, bool zero) {
    if (size > CORAL_MAX_REQUEST) {
        errno = ENOMEM;
        return NULL;
    }
    /* A span starts on a slice boundary, so only alignments above the slice
     * size need room to move the block up. */
    /* The slow path's work, as a class refill does it: a thread that only
     * allocates large blocks takes back those other threads freed (their
     * pages wait on delayed_pages), so it reuses their spans. */
    coral_heap_periodic_work(heap);
    coral_heap_collect_delayed(heap);
    size_t extra = alignment > CORAL_SLICE_SIZE ? alignment - CORAL_SLICE_SIZE : 0;
    /* (The secure build ends the span with a guard page.) */
    extra += CORAL_GUARD_SIZE;
    if (size + extra > CORAL_LARGE_MAX_SIZE) return huge_alloc(heap, size, alignment, zero);

    size_t slices = align_up(size + extra, CORAL_SLICE_SIZE) / CORAL_SLICE_SIZE;
    coral_page_t *page = coral_heap_span_alloc(heap, slices);
    if (page == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    coral_page_init(page, &heap->owner, !heap->is_default, CORAL_CLASS_LARGE,
                    slices * CORAL_SLICE_SIZE - CORAL_GUARD_SIZE);
    coral_page_set_capacity(page, 1);
    page->reserved = page->used = 1;
    coral_heap_add_large_page(heap, page);
    coral_count(&coral_counters.large_allocs, 1);
    coral_heap_count(heap, allocs, CORAL_CLASS_LARGE, 1);
    uint8_t *p = page->start;
    if (alignment > CORAL_SLICE_SIZE) {
        p = (uint8_t *)align_up((uintptr_t)p, alignment);
        if (p != page->start) {
            page->aligned_slices = (uint16_t)((size_t)(p - page->start) / CORAL_SLICE_SIZE);
            coral_slice_set_flags(page, coral_slice_flags(page) | CORAL_PAGE_HAS_ALIGNED);
        }
    }
    if (CORAL_SECURE) {
        page->block_size = secure_large_end(page, p, size);
        /* made accessible again when the span is released (page layer) */
        (void)coral_os_protect(page->start + page->block_size, CORAL_GUARD_SIZE, false);
    }
    if (zero && !page->is_fresh) memset(p, 0, size);
    if (CORAL_SECURE) coral_secure_large_out(page, p, size - CORAL_CANARY_SIZE);
    /* Clean memory: populated if the program writes its big blocks (and
     * measured at its free: populate.c). */
    if (page->is_fresh && coral_populate_adaptive()) coral_populate_big_block(p, size, false);
    return p;
}

/* Grow or shrink a large block in place, within its segment (owner only).
 * NULL when the slices after it are taken. */
void *coral_realloc_large_in_place(coral_page_t *page, void *p, size_t size) {
    size_t offset = (size_t)((uint8_t *)p - page->start);
    /* (The secure build: room for the canary, written at the new end,
     * and the guard page moves to the new end.) */
    size_t need = offset + coral_secure_inner_size(size) + CORAL_GUARD_SIZE;
    size_t slices = align_up(need, CORAL_SLICE_SIZE) / CORAL_SLICE_SIZE;
    size_t old_usable = page->block_size - offset;
    uint8_t *old_guard = page->start + page->block_size;
    if (CORAL_SECURE) (void)coral_os_protect(old_guard, CORAL_GUARD_SIZE, true);
    if (!coral_span_resize(page, slices)) {
        if (CORAL_SECURE) (void)coral_os_protect(old_guard, CORAL_GUARD_SIZE, false);
        return NULL;
    }
    page->block_size = slices * CORAL_SLICE_SIZE - CORAL_GUARD_SIZE;
    if (CORAL_SECURE) {
        page->block_size = secure_large_end(page, p, coral_secure_inner_size(size));
        (void)coral_os_protect(page->start + page->block_size, CORAL_GUARD_SIZE, false);
        coral_secure_large_out(page, p, size);
    }
    if (coral_populate_adaptive()) coral_populate_growth(p, old_usable, size);
    return p;
}

/* ---- huge blocks -------------------------------------------------------------------- */

/* Where a huge block starting `offset` bytes into its segment ends for a
 * request of size bytes: at an OS page; in the secure build at a 2 MiB
 * boundary (the huge page of x86-64 and of arm64 with 4 KiB pages), with
 * its guard (HUGE_GUARD_SIZE) right after. A guard inside a 2 MiB region the block uses
 * would keep the kernel from mapping that region with a huge page (4 KiB
 * pages instead, a fault each: a block grown by realloc would get all its
 * memory so); past the boundary it lies in a region the block does not
 * use. And a realloc that stays within the slack moves no guard (no
 * mprotect). The slack is the program's (malloc_usable_size counts it)
 * and untouched until the program writes it. */
#define HUGE_END_ALIGN (CORAL_SECURE ? (size_t)2 << 20 : CORAL_OS_PAGE_SIZE)
/* (secure build) Room for a huge block's guard: the whole 2 MiB region
 * after it. While big blocks get huge pages, the guard is all of it, not
 * one OS page: an mprotect of a whole 2 MiB-aligned region changes a huge
 * page's mapping as a whole, where one of 4 KiB inside it splits it into
 * 4 KiB pages for good. A block grown into the region of its guard (and
 * the guard moved to the next one) keeps its huge pages, resident ones too
 * (a reused region's). It costs no address space: the block ends at 2 MiB
 * and its mapping at 4 MiB, so the chunk that holds a guard page holds the
 * whole region. */
#define HUGE_GUARD_SIZE (CORAL_SECURE ? HUGE_END_ALIGN : 0)

/* The guard made now (seg->huge_guard records it): without huge pages
 * for big blocks (off, or found slow: populate.c), one OS page, as after a
 * large block. An mprotect changes every page table entry of its range,
 * and a reused region is resident there: 512 entries of 4 KiB for a 2 MiB
 * guard, at each allocation and again at the free, against one. */
static size_t huge_guard_now(void) {
    if (!CORAL_SECURE) return 0;
    return coral_huge_pages_for_big_block() ? HUGE_GUARD_SIZE : CORAL_OS_PAGE_SIZE;
}

size_t coral_huge_block_end(size_t offset, size_t size) {
    return align_up(offset + size, HUGE_END_ALIGN);
}

static size_t huge_offset(size_t alignment) {
    return alignment > CORAL_SLICE_SIZE ? alignment : CORAL_SLICE_SIZE;
}

/* The header of a huge segment of `size` bytes at seg whose block starts
 * `offset` bytes in, from the cache (see coral_segment_cache_take for `got`). Only
 * pages[0] describes the block. A free reads the descriptor of the slice
 * its pointer is in, and a huge segment's free checks that the pointer is
 * the block's start: so only the start's slice must lead to pages[0]. The
 * other descriptors keep slice_count 0 (zero, or free slices of an earlier
 * segment), so that the chunk can serve as a normal segment later without
 * clearing them, and no more header pages than needed are touched. */
static void huge_init_header(coral_segment_t *seg, size_t size, size_t offset,
                             const coral_cache_got_t *got) {
    if (got->dirty != 0) {
        coral_segment_header_reset(seg);
        if (got->header)
            memset(&seg->pages[0], 0, sizeof seg->pages[0]);
        else
            memset(seg->pages, 0, sizeof seg->pages); /* it may hold anything */
    }
    seg->kind = CORAL_SEGMENT_HUGE;
    seg->size = size;
    size_t start_slice = offset / CORAL_SLICE_SIZE;
    if (start_slice < CORAL_SLICES_PER_SEGMENT)
        coral_slice_mark_interior(&seg->pages[start_slice], start_slice);
    seg->pages[0].slice_count = 1;
    seg->pages[0].class_idx = CORAL_CLASS_LARGE;
}

/* A mapping of `total` bytes (whole chunks) whose block, at `offset` and
 * ending at `end`, is aligned to `alignment`: from the cache, unless the
 * alignment is above the 4 MiB every cached region has. */
static coral_segment_t *huge_segment_new(size_t total, size_t end, size_t offset, size_t alignment,
                                         coral_cache_got_t *got) {
    coral_segment_t *seg;
    if (alignment <= CORAL_SEGMENT_SIZE) {
        seg = coral_segment_cache_take(total, huge_pages_dense(end), got);
    } else {
        /* The block starts `offset` (= the alignment) after the segment:
         * align the segment to the alignment too. */
        seg = coral_os_map_aligned(total, alignment);
        got->dirty = 0;
        got->fresh = true;
        got->header = false;
    }
    if (seg == NULL) return NULL;
    huge_init_header(seg, total, offset, got);
    coral_segment_map_set(seg, total, true);
    if (got->fresh) coral_os_new_segment(seg, total, offset);
    coral_count_gauge(&coral_counters.segments, &coral_counters.segments_peak, 1);
    return seg;
}

/* The secure build: a huge block's canary (heap.h, coral_huge_canary_intact)
 * written after its request, whose room the allocation and every realloc ask
 * for (coral_secure_inner_size). The request is any number of bytes: the
 * word is unaligned. */
static void huge_canary_out(coral_segment_t *seg) {
    coral_page_t *page = &seg->pages[0];
    uint64_t canary = coral_canary_of(page, page->start);
    memcpy(page->start + seg->huge_request, &canary, sizeof canary);
}

static void *huge_alloc(coral_heap_t *heap, size_t size, size_t alignment, bool zero) {
    size_t offset = huge_offset(alignment);
    if (size > CORAL_MAX_REQUEST - offset) {
        errno = ENOMEM;
        return NULL;
    }
    /* The block ends at an OS page or 2 MiB (coral_huge_block_end); the
     * mapping at a chunk (in the secure build, with room for the guard region
     * after the block). Populated (below) is at most what size covers. */
    size_t end = coral_huge_block_end(offset, size);
    size_t asked_end = align_up(offset + size, CORAL_OS_PAGE_SIZE);
    size_t total = align_up(end + HUGE_GUARD_SIZE, CORAL_SEGMENT_SIZE);
    coral_cache_got_t got;
    coral_segment_t *seg = huge_segment_new(total, end, offset, alignment, &got);
    if (seg == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    coral_page_t *page = &seg->pages[0];
    page->start = coral_segment_base(seg) + offset;
    page->block_size = end - offset;
    seg->huge_request = size - CORAL_CANARY_SIZE; /* (the secure build asked for a canary's room) */
    if (CORAL_SECURE) { /* accessible again at the free, to move (huge_retire_secure) */
        seg->huge_guard = huge_guard_now();
        (void)coral_os_protect(coral_segment_base(seg) + end, seg->huge_guard, false);
        freed_huge_note(page->start, false);
    }
    page->used = page->capacity = page->reserved = 1;
    /* Some of the block lies on clean memory (past what may hold data):
     * populated if the program writes its big blocks, measured at its free
     * (populate.c). */
    size_t clean_from = got.dirty > offset ? got.dirty : offset;
    page->is_fresh = clean_from < end;
    if (page->is_fresh && clean_from < asked_end && coral_populate_adaptive())
        coral_populate_big_block(coral_segment_base(seg) + clean_from, asked_end - clean_from,
                                 coral_huge_pages_for_big_block());
    seg->huge_dirty = got.dirty > end ? got.dirty : end;
    coral_count(&coral_counters.huge_allocs, 1);
    coral_count(&coral_counters.huge_live, 1);
    coral_count(&coral_counters.huge_bytes, (int64_t)page->block_size);
    coral_purge_demand_add((int64_t)page->block_size);
    coral_heap_count(heap, allocs, CORAL_CLASS_LARGE, 1);
    if (zero && got.dirty > offset)
        memset(page->start, 0, got.dirty - offset < size ? got.dirty - offset : size);
    if (CORAL_SECURE) {
        page->epoch = coral_secure_next_epoch();
        huge_canary_out(seg);
    }
    /* Every heap keeps a list of its huge blocks: for coral_heap_destroy,
     * and for coral_heap_visit (a thread's own heap too, until its thread
     * exits: abandonment detaches them). */
    coral_huge_lists_lock();
    atomic_store_explicit(&page->owner, &heap->owner, memory_order_relaxed);
    coral_list_push_front(&heap->huge_blocks, &seg->link);
    coral_huge_lists_unlock();
    return page->start;
}

/* The secure build: the address ranges of the last freed huge blocks,
 * reserved and inaccessible (coral_os_reserve_inaccessible), so that a read
 * or write through a stale pointer faults, and no later block is placed
 * there, until HUGE_QUARANTINE_SLOTS more huge blocks were freed. The
 * pages moved out first (coral_huge_release), to the segment cache: they
 * are reused as in the default build, at another address, without an
 * mprotect (which walks every 4 KiB page table entry of the range, twice
 * per reuse). A slot holds a range's base (4 MiB-aligned) with its size in
 * chunks in the low bits, 0 when empty. A free takes the next slot (one
 * fetch_add) and exchanges its range in: the range it gets out is that
 * thread's alone, unmapped (its address space free for anyone again). A
 * fork between the two leaves the child one range reserved and listed
 * nowhere: address space, no memory. Ranges of more than
 * HUGE_QUARANTINE_MAX are unmapped at the free (they still fault until
 * the address is mapped again): the slots hold at most 64 GiB of address
 * space. */
#define HUGE_QUARANTINE_SLOTS 64
#define HUGE_QUARANTINE_MAX ((size_t)1 << 30)
static _Atomic(uintptr_t) huge_quarantine[HUGE_QUARANTINE_SLOTS];
static _Atomic(unsigned) huge_quarantine_next;

static void huge_quarantine_add(uint8_t *base, size_t size) {
    unsigned i = atomic_fetch_add_explicit(&huge_quarantine_next, 1, memory_order_relaxed);
    uintptr_t out = atomic_exchange_explicit(&huge_quarantine[i % HUGE_QUARANTINE_SLOTS],
                                             (uintptr_t)base | (size / CORAL_SEGMENT_SIZE),
                                             memory_order_relaxed);
    if (out != 0)
        coral_os_unmap((void *)(out & ~CORAL_SEGMENT_MASK),
                       (out & CORAL_SEGMENT_MASK) * CORAL_SEGMENT_SIZE);
}

/* The freed huge mapping at seg, `size` bytes of which the first `dirty`
 * may hold data, its block ending `end` bytes in (its guard region after):
 * its pages to the segment cache, moved (page tables move, 2 MiB at a time)
 * to new address space, and its address range reserved inaccessible in the
 * quarantine. The guard region is made accessible first, to move with the
 * rest (a region that held data before may have pages there, and one
 * mapping moves in one call). No memory for the move: the mapping is
 * unmapped. */
static void huge_retire_secure(coral_segment_t *seg, size_t size, size_t end, size_t dirty) {
    uint8_t *base = (uint8_t *)seg;
    uint8_t *to =
        size <= HUGE_QUARANTINE_MAX ? coral_os_map_aligned(size, CORAL_SEGMENT_SIZE) : NULL;
    if (to == NULL || !coral_os_protect(base + end, seg->huge_guard, true)) {
        if (to != NULL) coral_os_unmap(to, size);
        coral_os_unmap(base, size);
        return;
    }
    coral_os_move(base, to, size, false, CORAL_SEGMENT_SIZE);
    coral_test_point(CORAL_TP_HUGE_MOVED, base);
    if (coral_os_reserve_inaccessible(base, size, size)) huge_quarantine_add(base, size);
    coral_segment_cache_put(to, size, dirty, true);
}

/* The block is gone: its chunks go to the cache. The header stays as it is
 * (used == 0), so a second free of the block is reported. The secure
 * build moves the pages to the cache at another address and leaves the
 * block's address range inaccessible (a read or write after free faults,
 * a second free is named by the ring of freed blocks): huge_retire_secure. */
void coral_huge_release(coral_segment_t *seg) {
    coral_page_t *page = &seg->pages[0];
    if (page->is_fresh && coral_populate_adaptive())
        coral_populate_note_big_block(page->start, page->block_size);
    seg->pages[0].used = 0;
    coral_count(&coral_counters.huge_live, -1);
    coral_count(&coral_counters.huge_bytes, -(int64_t)seg->pages[0].block_size);
    coral_purge_demand_add(-(int64_t)seg->pages[0].block_size);
    coral_count(&coral_counters.segments, -1);
    if (CORAL_SECURE) {
        size_t size = seg->size; /* (the header is gone once retired) */
        size_t end = (size_t)(page->start + page->block_size - coral_segment_base(seg));
        freed_huge_note(page->start, true);
        coral_segment_map_set(seg, size, false);
        huge_retire_secure(seg, size, end, seg->huge_dirty);
        return;
    }
    coral_segment_cache_put(seg, seg->size, seg->huge_dirty, true);
}

static void huge_free(coral_segment_t *seg);

/* free() leaves errno as it was (POSIX.1-2024; glibc's tst-free-errno): the
 * kernel calls of a huge block's release may fail (an unmap that would split
 * a mapping when the process has its most mappings: the memory is left to
 * the process, as glibc's free leaves it). */
void coral_huge_free(coral_segment_t *seg) {
    int saved = errno;
    huge_free(seg);
    errno = saved;
}

static void huge_free(coral_segment_t *seg) {
    coral_page_t *page = &seg->pages[0];
    if (page->used != 1) {
        coral_misuse("double free detected: huge block %p was already free", (void *)page->start);
        return;
    }
    if (CORAL_SECURE && !coral_huge_canary_intact(seg)) {
        coral_misuse("heap overflow detected: huge block %p of %zu bytes was written past its end",
                     (void *)page->start, seg->huge_request);
        return;
    }
    /* A block still listed by its heap: off its list. (An owner found NULL without the
     * lock stays NULL: it is set only before the block is handed out; the
     * load acquires what the abandoning thread read of the block before it
     * cleared the owner, heap.c.) The
     * owner is read again under the lock:
     * the heap's thread may be exiting (which detaches its blocks under
     * it), and its struct then made another heap. */
    if (atomic_load_explicit(&page->owner, memory_order_acquire) != NULL) {
        coral_test_point(CORAL_TP_HUGE_FREE_UNLOCKED, seg);
        coral_huge_lists_lock();
        coral_test_point(CORAL_TP_HUGE_LIST_LOCKED, seg);
        coral_heap_t *heap = coral_page_heap(page);
        if (heap != NULL) coral_list_remove(&heap->huge_blocks, &seg->link);
        atomic_store_explicit(&page->owner, NULL, memory_order_relaxed);
        coral_huge_lists_unlock();
    }
    coral_purger_start_ahead((int64_t)seg->huge_dirty);
    coral_huge_release(seg);
}

size_t coral_huge_usable(coral_segment_t *seg, const void *p) {
    if (CORAL_SECURE) return seg->huge_request;
    coral_page_t *page = &seg->pages[0];
    return (size_t)(page->start + page->block_size - (const uint8_t *)p);
}

/* ---- resizing huge blocks -------------------------------------------------------------
 * The caller owns the block, so no other thread looks the segment up while
 * it changes; map entries are cleared before a range can be anybody else's
 * and set before the block is handed back. */

/* Keep the first `total` bytes (whole chunks) of the mapping; the chunks
 * after go to the cache (their pages stay for the next segment). */
static void huge_shrink(coral_segment_t *seg, size_t total) {
    uint8_t *tail = coral_segment_base(seg) + total;
    size_t tail_size = seg->size - total;
    coral_segment_map_set(tail, tail_size, false);
    seg->size = total;
    coral_segment_cache_put(tail, tail_size, seg->huge_dirty > total ? seg->huge_dirty - total : 0,
                            false);
    if (seg->huge_dirty > total) seg->huge_dirty = total;
}

/* Move the first `old` bytes of seg's mapping onto `to` (whatever `to` held
 * there is dropped). A heap's list of huge blocks links the segment by
 * address: it is relinked under the heap's lock, which a free of another of
 * its blocks takes to unlink that one. */
static coral_segment_t *huge_move(coral_segment_t *seg, coral_segment_t *to, size_t old) {
    /* (Acquire: as huge_free's, what an abandoning thread read of the
     * segment comes before the move, heap.c.) */
    bool tracked = atomic_load_explicit(&seg->pages[0].owner, memory_order_acquire) != NULL;
    if (tracked) coral_huge_lists_lock();
    coral_segment_map_set(seg, old, false);
    coral_os_move(seg, to, old, true, CORAL_SEGMENT_SIZE);
    if (tracked) {
        /* Re-read under the lock: the heap's thread may have detached it. */
        coral_heap_t *heap = coral_page_heap(&to->pages[0]);
        if (heap != NULL) coral_list_relink(&heap->huge_blocks, &to->link);
        coral_huge_lists_unlock();
    }
    return to;
}

/* Grow the mapping to `total` bytes (whole chunks), keeping its pages: into
 * cached chunks right after it, else fresh address space right after it,
 * else at a new place (the pages move; the new part comes from the cache
 * where it can). NULL (errno ENOMEM): unchanged. */
static coral_segment_t *huge_grow(coral_segment_t *seg, size_t total) {
    size_t old = seg->size, more = total - old;
    uint8_t *end = coral_segment_base(seg) + old;
    if (coral_segment_cache_take_range(end, more)) {
        seg->huge_dirty = total; /* the cached pages' data is not known */
    } else if (!coral_os_extend(end, more)) {
        coral_cache_got_t got;
        coral_segment_t *moved = coral_segment_cache_take(total, huge_pages_all(total), &got);
        if (moved == NULL) {
            errno = ENOMEM;
            return NULL;
        }
        if (got.dirty > seg->huge_dirty) seg->huge_dirty = got.dirty;
        seg = huge_move(seg, moved, old);
    }
    seg->size = total;
    coral_segment_map_set(seg, total, true);
    return seg;
}

/* Resize a huge block: its pages stay (or move), no byte is copied. */
void *coral_huge_realloc(coral_segment_t *seg, void *p, size_t size) {
    size_t offset = (size_t)((uint8_t *)p - coral_segment_base(seg));
    if (size > CORAL_MAX_REQUEST - offset) {
        errno = ENOMEM;
        return NULL;
    }
    /* (the secure build: with room for the canary after the request) */
    size_t end = coral_huge_block_end(offset, coral_secure_inner_size(size));
    size_t total = align_up(end + HUGE_GUARD_SIZE, CORAL_SEGMENT_SIZE);
    /* The secure build: the same end (within the slack) leaves the block as
     * it is, its canary moved to the new request's end; otherwise its guard
     * region moves to the block's new end. */
    if (CORAL_SECURE && end - offset == seg->pages[0].block_size) {
        seg->huge_request = size;
        huge_canary_out(seg);
        return p;
    }
    uint8_t *old_guard = seg->pages[0].start + seg->pages[0].block_size;
    if (CORAL_SECURE) (void)coral_os_protect(old_guard, seg->huge_guard, true);
    if (total > seg->size) {
        coral_segment_t *grown = huge_grow(seg, total);
        if (grown == NULL) {
            if (CORAL_SECURE) (void)coral_os_protect(old_guard, seg->huge_guard, false);
            return NULL;
        }
        seg = grown;
    } else if (total < seg->size && end + seg->size / 4 < seg->size) {
        huge_shrink(seg, total); /* much smaller: give chunks back */
    }
    if (CORAL_SECURE) {
        seg->huge_guard = huge_guard_now();
        (void)coral_os_protect(coral_segment_base(seg) + end, seg->huge_guard, false);
    }
    size_t old_size = seg->pages[0].block_size;
    int64_t delta = (int64_t)(end - offset) - (int64_t)old_size;
    coral_count(&coral_counters.huge_bytes, delta);
    coral_purge_demand_add(delta);
    if (end > seg->huge_dirty) seg->huge_dirty = end;
    seg->pages[0].start = coral_segment_base(seg) + offset;
    seg->pages[0].block_size = end - offset;
    seg->huge_request = size;
    if (coral_populate_adaptive())
        coral_populate_growth(seg->pages[0].start, old_size, end - offset);
    /* (after the populate: the canary's page is written, not read first) */
    if (CORAL_SECURE) huge_canary_out(seg); /* (its start may have moved: huge_grow) */
    return seg->pages[0].start;
}
