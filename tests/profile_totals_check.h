/* profile_totals_check.c: the heap profiler's totals, for test_windows. */
#ifndef CORAL_TEST_PROFILE_TOTALS_CHECK_H
#define CORAL_TEST_PROFILE_TOTALS_CHECK_H

#include <stddef.h>

/* How many sites have bytes other than `unit` times their objects (alloc
 * or in use), after every tally is published; *alloc_objects (if not NULL)
 * gets the objects allocated at all sites together. */
size_t profile_sites_inconsistent(double unit, double *alloc_objects);

#endif
