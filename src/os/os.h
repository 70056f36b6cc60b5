/* Layer 2, os: every call into the kernel, and the policies of when to make
 * them.
 *
 * It owns: every mmap, munmap, madvise, mremap, mincore and mprotect the allocator
 * makes (os.c: each counted; the testing option CORALLOC_FAIL_OS_AFTER
 * makes one fail), the huge-page and populate policies of new mappings
 * (decided from this layer's own state: bytes mapped, the options), the
 * adaptive populate policy (populate.c: prefault clean memory where a write
 * is known to follow), and the purge scheduler (purge.c: when freed memory
 * goes back to the OS, and the background thread that does it).
 *
 * The purge scheduler knows nothing of what it purges: the layers above
 * register their purge functions as stages of a pass
 * (coral_purge_stage_set), and tell it how many bytes wait to be purged
 * (coral_purge_backlog_add) and that something new does
 * (coral_purger_notify). */
#ifndef CORAL_OS_H
#define CORAL_OS_H

#include "base/base.h"

/* ---- kernel calls (os.c) --------------------------------------------------- */

/* Anonymous read-write memory, zero; NULL with errno ENOMEM. */
void *coral_os_map(size_t size);
/* The same, aligned to `alignment` (a power of two, at least an OS page). */
void *coral_os_map_aligned(size_t size, size_t alignment);
void coral_os_unmap(void *p, size_t size);
/* Give the pages back to the OS; they read as zero afterwards. */
bool coral_os_purge(void *p, size_t size);
/* Map [end, end + size) only if nothing is mapped there. */
bool coral_os_extend(void *end, size_t size);
/* Move the pages of [src, src + size) onto the mapped range at dst; the
 * source is unmapped after. `piece`: the granularity of the mappings the
 * range may be made of (moves go piece by piece when one move fails); a
 * piece that cannot move is copied when `keep`, else dropped. */
void coral_os_move(void *src, void *dst, size_t size, bool keep, size_t piece);
/* Fault the range in now, writable, in one call. */
void coral_os_populate(void *p, size_t size);
/* Which pages of [p, p + size) are resident (mincore): false if unknown. */
bool coral_os_resident(const void *p, size_t size, unsigned char *vec);
/* A new mapping of `size` bytes for a segment, of which the first `header`
 * bytes are metadata: populated whole when CORALLOC_POPULATE=on. */
void coral_os_new_segment(void *base, size_t size, size_t header);
/* Transparent huge pages for [p, p + size) (MADV_HUGEPAGE): advised before
 * anything there is touched, so that each clean 2 MiB faults in as one
 * page. Callers ask coral_huge_pages_for_* first. */
void coral_os_advise_huge(void *p, size_t size);
/* The advice withdrawn (MADV_NOHUGEPAGE): clean memory of [p, p + size)
 * faults in 4 KiB pages again, and the kernel does not gather it into huge
 * pages later. */
void coral_os_advise_no_huge(void *p, size_t size);
/* Make [p, p + size) (whole OS pages) inaccessible, or read-write again: a
 * guard page. False (errno set) when the kernel refuses. */
bool coral_os_protect(void *p, size_t size, bool accessible);
/* Replace whatever is mapped at [p, p + size) (whole OS pages), and fill
 * the holes there (`holes`: their bytes), with one inaccessible mapping
 * that holds no page: the address range stays reserved (nothing else is
 * mapped there) and every access faults. Its pages are dropped. False when
 * the kernel refuses (what was there is then as it was). */
bool coral_os_reserve_inaccessible(void *p, size_t size, size_t holes);
/* n random bytes from the kernel (getrandom), or from the clock and
 * addresses when it has none. */
void coral_os_random(void *out, size_t n);

/* ---- the adaptive populate policy (populate.c) ------------------------------ */

/* Below this a populate costs more than the traps it saves: no smaller
 * range is ever populated. */
#define CORAL_POPULATE_MIN_BYTES ((size_t)64 << 10)
bool coral_populate_adaptive(void);
/* A clean span of `bytes` at start for blocks of block_size, whose class
 * already has a full span at full (full_bytes long; NULL: none). */
void coral_populate_class_span(uint8_t *start, size_t bytes, size_t block_size, const uint8_t *full,
                               size_t full_bytes);
/* A large or huge block placed on clean memory [p, p + size); `huge_pages`:
 * the memory was advised for huge pages (its faults are timed). */
void coral_populate_big_block(uint8_t *p, size_t size, bool huge_pages);
void coral_populate_note_big_block(const uint8_t *p, size_t size);
void coral_populate_growth(uint8_t *p, size_t old_size, size_t new_size);
void coral_populate_copy(void *dst, size_t size);

/* ---- the huge-page policy (populate.c) ----------------------------------------- */

/* CORALLOC_HUGE_PAGES: should a thread's new segment, taken because its
 * other segments are full, get huge pages? Yes while the spans the process
 * carves are written densely (the measures of the populate policy). */
bool coral_huge_pages_for_segment(void);
/* Should a huge block's mapping (or its growth) get huge pages? Yes
 * whenever CORALLOC_HUGE_PAGES is on: a block of more than 2 MiB is no
 * small program's, and is mostly written (a program that touches a huge
 * block sparsely pays 2 MiB per touched 2 MiB, as under mimalloc 3). The
 * populate policy's score cannot tell: a block in huge pages reads as
 * resident wherever it was touched. */
bool coral_huge_pages_for_big_block(void);

/* Whether huge pages come in cheaply on this machine. A 2 MiB page pays
 * while faulting it in costs less than the 512 faults of 4 KiB it stands
 * for; where it does not (a VM guest whose free memory the host took back
 * has every huge page faulted in again by the host, page by page), the
 * process stops asking for them: both questions above answer no once
 * CORAL_HUGE_SLOW_LIMIT huge pages took more than CORAL_HUGE_SLOW_NS each.
 * The cost is the faulting thread's CPU time (user and system), so a
 * thread preempted meanwhile is not taken for a slow page. */
#define CORAL_HUGE_PAGE_SIZE ((size_t)2 << 20)
#define CORAL_HUGE_SLOW_NS 1000000u
#define CORAL_HUGE_SLOW_LIMIT 2u
/* Fault in [p, p + size), clean memory just advised for huge pages, and
 * note what each 2 MiB of it cost (nothing when it is less than 2 MiB):
 * the first 2 MiB alone, then the rest. When the first makes huge pages
 * slow, the rest is withdrawn from the advice before it is faulted in (in
 * 4 KiB pages). Returns whether huge pages are still cheap. */
bool coral_huge_pages_fault_in(void *p, size_t size);
/* Huge pages were advised, then found slow: memory advised before that and
 * taken again should have the advice withdrawn (coral_os_advise_no_huge)
 * before it is touched. */
bool coral_huge_pages_turned_slow(void);
/* Tests: take each huge page's cost as `ns` instead of measuring it
 * (negative: measure), and forget the slow pages seen so far. */
void coral_huge_pages_cost_override(int64_t ns);

/* ---- the purge scheduler (purge.c) -------------------------------------------- */

/* A stage of a purge pass: return to the OS what became due by `now` (all
 * that can be, when force); returns when its next purge is due (0: none). */
typedef uint64_t (*coral_purge_fn)(uint64_t now, bool force);

/* The stages of a pass, in the order they run: blocks kept in caches go
 * back to their pages first, then the memory they leave free is purged. */
typedef enum coral_purge_stage_e {
    CORAL_PURGE_BLOCK_CACHES,  /* idle bulk caches (api layer) */
    CORAL_PURGE_SEGMENT_CACHE, /* freed segments kept mapped (segment layer) */
    CORAL_PURGE_FREE_SLICES,   /* free slices of segments in use (segment layer) */
    CORAL_PURGE_ORPHAN_PAGES,  /* pages other threads emptied (page layer) */
    CORAL_PURGE_STAGES
} coral_purge_stage_t;

void coral_purge_stage_set(coral_purge_stage_t stage, coral_purge_fn fn);
/* Purge what is due, from a slow path, at most every quarter delay (when
 * no purge thread runs). */
void coral_purge_tick(void);
/* Purge everything purgeable now (coral_collect, malloc_trim). */
void coral_purge_now(void);
/* Tests: a whole purge pass at the current clock, run by the purge thread
 * (true: waited for it) or, when none runs, by the caller (false). */
bool coral_purge_wait_pass(void);
/* Something new waits to be purged: wake the purge thread if it sleeps. */
void coral_purger_notify(void);
/* Bytes that may hold data were freed (> 0), or reused or purged (< 0). */
void coral_purge_backlog_add(int64_t bytes);
/* Start the purge thread if it is wanted: call only where no allocator lock
 * is held (pthread_create allocates). */
void coral_purger_start_if_wanted(void);
/* A free is about to leave `bytes` to purge: start the purge thread before
 * they are free if they will make it wanted (same rule: no lock held). */
void coral_purger_start_ahead(int64_t bytes);
/* Demand (purge.c): bytes of spans in use and huge blocks went up (> 0) or
 * down (< 0). Called at each span or huge block taken or given back. */
void coral_purge_demand_add(int64_t bytes);
/* The window of demand a purge keeps resident: CORAL_PURGE_WINDOW_DELAYS
 * purge delays. */
#define CORAL_PURGE_WINDOW_DELAYS 4
/* Bytes of freed memory a purge at `now` leaves resident: the peak of demand
 * over the window less demand now (what the program used lately and will
 * likely use again). The purge stages of free memory purge only what their
 * resident free memory holds beyond it. */
size_t coral_purge_keep_bytes(uint64_t now);
/* When a purge held back by the window is looked at again: the window has
 * moved on by one slot. */
uint64_t coral_purge_recheck_ms(uint64_t now);
/* A program thread is exiting (its heap is being abandoned): the purge
 * thread watches for the moment no program thread is left, and then ends
 * the process as the last thread's exit would have (purge.c). */
void coral_purger_thread_exiting(void);
void coral_purger_prefork(void);
void coral_purger_postfork(bool child);

#endif /* CORAL_OS_H */
