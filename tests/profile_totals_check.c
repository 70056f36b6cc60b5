/* For test_windows: the heap profiler's site totals, read in the process
 * itself (src/api/profile.h's coral_profile_sites_visit, which publishes
 * every thread's tally first). */
#include "api/profile.h"
#include "profile_totals_check.h"

typedef struct totals_look_s {
    double unit;
    size_t sites, inconsistent;
    double alloc_objects;
} totals_look_t;

static void site_look(const coral_profile_site_t *s, void *arg) {
    totals_look_t *look = arg;
    look->sites++;
    look->alloc_objects += s->alloc_objects;
    if (s->alloc_bytes != look->unit * s->alloc_objects ||
        s->inuse_bytes != look->unit * s->inuse_objects)
        look->inconsistent++;
}

size_t profile_sites_inconsistent(double unit, double *alloc_objects) {
    totals_look_t look = {unit, 0, 0, 0.0};
    coral_profile_sites_visit(site_look, &look);
    if (alloc_objects != NULL) *alloc_objects = look.alloc_objects;
    return look.inconsistent;
}
