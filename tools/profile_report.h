/* `coralloc profile FILE` (profile_report.c): the report of a heap profile;
 * argv holds the arguments after "profile". Returns the exit status. */
#ifndef CORALLOC_PROFILE_REPORT_H
#define CORALLOC_PROFILE_REPORT_H

int coralloc_profile_report(int argc, char **argv);

#endif
