"""How fast Python's garbage collector walks objects an allocator placed
(run with PYTHONMALLOC=malloc, so every object comes from the allocator
under test). A full collection visits every tracked object in the order
the objects were allocated, and reads each object it refers to: the time
depends on where the allocator put them relative to one another, not on
how fast it allocates. It checks its own results and exits 1 when they
are wrong.

usage: python3 gc_walk.py N COLLECTIONS
"""

import gc
import json
import sys
import time

from alloc_heavy import fail, malloc_lib


def main() -> None:
    n, collections = int(sys.argv[1]), int(sys.argv[2])
    # the records of alloc_heavy.py: dicts, lists and strings, each made
    # among temporaries (the f-strings' parts, the reversed digits) that
    # are freed at once
    recs = [{"id": i, "name": f"user-{i:07d}", "tags": [f"t{i % 7}", f"g{i % 13}"],
             "score": (i * 7919) % 1000003, "meta": {"a": i & 1, "b": str(i)[::-1]}}
            for i in range(n)]
    back = json.loads(json.dumps(recs))  # the same objects again, made by the parser
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(collections):
        if gc.collect() != 0:
            fail("a collection found garbage: the records are not cycles")
    elapsed = time.perf_counter() - t0
    if back != recs or len(back) != n:
        fail("json round trip differs")
    print(f"info: malloc_lib={malloc_lib()}")
    print(f"info: n={n} collections={collections} tracked={len(gc.get_objects())} "
          f"seconds={elapsed:.4f}")
    print(f"result: collections_per_sec={collections / elapsed:.2f} "
          f"ms_per_collection={elapsed * 1e3 / collections:.2f}")


main()
