/* Options: read once from the environment (CORALLOC_<NAME>) at start-up,
 * without allocating. Each is documented in docs/OPTIONS.md. */
#ifndef CORAL_OPTIONS_H
#define CORAL_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

typedef enum coral_option_e {
    CORAL_OPT_VERBOSE,        /* print the options in force at start-up */
    CORAL_OPT_SHOW_STATS,     /* print statistics at exit */
    CORAL_OPT_PURGE_DELAY_MS, /* unused memory is returned after this delay */
    CORAL_OPT_SEGMENT_CACHE,  /* chunk pool size, in 4 MiB segments */
    CORAL_OPT_PURGE_THREAD,   /* purge from a background thread */
    CORAL_OPT_POPULATE,       /* prefault policy: CORAL_POPULATE_* */
    CORAL_OPT_HUGE_PAGES,     /* transparent huge pages for segments */
    CORAL_OPT_FAIL_OS_AFTER,  /* testing: the Nth OS mapping call fails (0: off) */
    CORAL_OPT_BULK_CACHE_KB,  /* per-thread cache of blocks freed in bulk (stash.h) */
    CORAL_OPT_COUNT
} coral_option_t;

/* Values, indexed by coral_option_t. Written at start-up only (and by
 * coral_option_set for the options that allow it); read with relaxed loads. */
extern int64_t coral_options[CORAL_OPT_COUNT];

static inline int64_t coral_option(coral_option_t opt) {
    return __atomic_load_n(&coral_options[opt], __ATOMIC_RELAXED);
}

#define CORAL_POPULATE_OFF 0
#define CORAL_POPULATE_ON 1
#define CORAL_POPULATE_ADAPTIVE 2

void coral_options_init(void);
void coral_options_print(void);

#endif
