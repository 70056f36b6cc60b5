/* prelude.h: what glibc's build gives its test and support sources
 * (tests/glibc/run.sh builds them from Debian's glibc-source against the
 * installed glibc): its internal symbol macros, empty outside libc, and a
 * timeout factor. Included first in every file it compiles. */
#include <limits.h>
#define libc_hidden_proto(...)
#define libc_hidden_def(...)
#define libc_hidden_builtin_proto(...)
#define attribute_hidden
#define __glibc_likely(x) __builtin_expect(!!(x), 1)
#define __glibc_unlikely(x) __builtin_expect(!!(x), 0)
#ifndef TIMEOUTFACTOR
#define TIMEOUTFACTOR 1
#endif
