/* The walk behind coral_heap_visit (alloc.c; the rules in coralloc.h): the
 * blocks in use in a heap, in two steps so that the caller's fn may call
 * anything: first each page's blocks in use are noted (bits per page, in a
 * mapping of their own, no code of the program running), then fn is called
 * for each. It calls the layers below only. */
#include <errno.h>
#include <string.h>

#include "api/api.h"

/* The usable bytes of the blocks of page (a page of a normal segment, or a
 * huge block's descriptor): what the default build's malloc_usable_size
 * says; the secure build's says the request, which lies in a block's
 * memory (coralloc.h: the walk reads none; a huge block's is its segment's,
 * its canary right after it inside the bytes said here). */
static size_t usable_of(const coral_page_t *page) {
    if (coral_ptr_segment(page)->kind == CORAL_SEGMENT_HUGE) return page->block_size;
    return page->block_size - CORAL_CANARY_SIZE;
}

/* A page's entry in the list: its blocks, and then words of bits (block i
 * in use: bit i % 64 of word i / 64). */
typedef struct visit_page_s {
    uint8_t *start;
    size_t block_size, usable;
    uint32_t blocks, words;
} visit_page_t;

typedef struct visit_list_s {
    uint8_t *p;
    size_t len, cap;
} visit_list_t;

static size_t visit_entry_size(uint32_t words) { return sizeof(visit_page_t) + words * 8u; }

static void visit_size_page(coral_page_t *page, void *arg) {
    *(size_t *)arg += visit_entry_size((page->capacity + 63) / 64 + 1);
}

static void visit_note_page(coral_page_t *page, void *arg) {
    visit_list_t *list = arg;
    uint64_t live[CORAL_PAGE_LIVE_WORDS];
    uint32_t blocks = coral_page_live_blocks(page, live), words = (blocks + 63) / 64;
    /* (Room for every page was counted before: a huge block freed since by
     * another thread leaves its room unused; pages cannot be added.) */
    if (list->len + visit_entry_size(words) > list->cap) return;
    visit_page_t *e = (visit_page_t *)(void *)(list->p + list->len);
    *e = (visit_page_t){.start = page->start,
                        .block_size = page->block_size,
                        .usable = usable_of(page),
                        .blocks = blocks,
                        .words = words};
    memcpy(e + 1, live, words * 8u);
    list->len += visit_entry_size(words);
}

static int visit_list_run(const visit_list_t *list, coral_block_visit_fn fn, void *arg) {
    for (size_t at = 0; at < list->len;) {
        const visit_page_t *e = (const visit_page_t *)(const void *)(list->p + at);
        const uint64_t *live = (const uint64_t *)(e + 1);
        for (uint32_t i = 0; i < e->blocks; i++) {
            if (!(live[i / 64] >> (i % 64) & 1)) continue;
            int rc = fn(e->start + (size_t)i * e->block_size, e->block_size, e->usable, arg);
            if (rc != 0) return rc;
        }
        at += visit_entry_size(e->words);
    }
    return 0;
}

int coral_heap_walk(coral_heap_t *heap, coral_block_visit_fn fn, void *arg) {
    if (heap == &coral_heap_empty) return 0; /* the thread never allocated */
    visit_list_t list = {0};
    coral_heap_pages_visit(heap, visit_size_page, &list.cap);
    if (list.cap == 0) return 0;
    if ((list.p = coral_os_map(list.cap)) == NULL) {
        errno = ENOMEM;
        return -1;
    }
    coral_heap_pages_visit(heap, visit_note_page, &list);
    int rc = visit_list_run(&list, fn, arg);
    coral_os_unmap(list.p, list.cap);
    return rc;
}
