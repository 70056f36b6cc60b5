# coralloc's core sources (no malloc/free override), relative to the project
# root, by layer (lowest first). Included by the top-level CMakeLists.txt and
# by the libFuzzer build (tests/fuzz/CMakeLists.txt), which prefixes them.
set(CORAL_CORE_SOURCES
  src/base/message.c src/base/options.c src/base/counters.c
  src/os/os.c src/os/purge.c src/os/populate.c
  src/segment/segment.c src/segment/cache.c
  src/page/page.c src/page/reclaim.c src/page/secure.c
  src/heap/heap.c src/heap/large.c src/heap/thread.c src/heap/check.c
  src/api/alloc.c src/api/bulk.c src/api/bulk_cache.c src/api/introspect.c
  src/api/profile.c src/api/profile_out.c src/api/heap_visit.c src/api/remote_run.c
)
