/* The statistics counters (base.h). */
#include "base/base.h"

coral_counters_t coral_counters;
