"""An allocation-heavy Python program for the benchmark (run with
PYTHONMALLOC=malloc so that every object goes through the allocator under
test). It checks its own results and exits 1 when they are wrong.

usage: python3 alloc_heavy.py N
"""

import ctypes
import json
import sys
import time


def malloc_lib() -> str:
    """The shared object whose malloc the dynamic linker binds calls to: the
    first object in link-map (search) order, after the executable, that
    defines malloc itself. (python3 is not PIE: dlsym(RTLD_DEFAULT) would
    answer with the executable's canonical PLT entry.)"""
    class LinkMap(ctypes.Structure):
        pass
    LinkMap._fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p),
                        ("l_ld", ctypes.c_void_p), ("l_next", ctypes.POINTER(LinkMap)),
                        ("l_prev", ctypes.POINTER(LinkMap))]

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
    try:
        main_prog = ctypes.CDLL(None)
        dladdr = main_prog.dladdr
        lm = ctypes.cast(main_prog._handle, ctypes.POINTER(LinkMap))
        lm = lm.contents.l_next
        while lm:
            name = (lm.contents.l_name or b"").decode()
            lm = lm.contents.l_next
            if not name.startswith("/"):
                continue
            try:
                fn = ctypes.CDLL(name).malloc
            except (OSError, AttributeError):
                continue
            info = DlInfo()
            if dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) and \
                    info.dli_fname and info.dli_fname.decode() == name:
                return name
    except (OSError, AttributeError, ValueError):
        pass
    return "unknown"


def fail(what: str) -> None:
    print(f"CHECK FAILED: {what}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    n = int(sys.argv[1])
    t0 = time.perf_counter()
    # records of small objects
    recs = [{"id": i, "name": f"user-{i:07d}", "tags": [f"t{i % 7}", f"g{i % 13}"],
             "score": (i * 7919) % 1000003, "meta": {"a": i & 1, "b": str(i)[::-1]}}
            for i in range(n)]
    # JSON round trip: one big string, then a tree of new objects
    text = json.dumps(recs)
    back = json.loads(text)
    if back != recs:
        fail("json round trip differs")
    del text
    # group by, string building and splitting
    groups: dict = {}
    for r in back:
        groups.setdefault(r["tags"][1], []).append(r["name"])
    if sum(len(v) for v in groups.values()) != n or len(groups) != min(n, 13):
        fail("group by")
    words = " ".join(r["name"] for r in recs).split(" ")
    if len(words) != n or words[-1] != f"user-{n - 1:07d}":
        fail("join/split")
    # sorting with keys (tuples), and a check of the order
    s = sorted(back, key=lambda r: (r["score"], r["id"]))
    if any(s[i]["score"] > s[i + 1]["score"] for i in range(n - 1)):
        fail("sort order")
    # sets of tuples: pairs (i mod 1000, i mod 977) are distinct below 977000
    seen = set()
    for i in range(n):
        seen.add((i % 1000, str(i % 977)))
    if len(seen) != min(n, 977000):
        fail(f"set size {len(seen)}")
    # dict churn: insert everything, delete two thirds, check what is left
    d = {}
    for i in range(n):
        d[f"k{i}"] = [i, str(i), (i, i)]
        if i % 3 != 0:
            del d[f"k{i}"]
    if len(d) != (n + 2) // 3 or any(v[0] % 3 for v in d.values()):
        fail("dict churn")
    del recs, back, groups, words, s, seen, d
    elapsed = time.perf_counter() - t0
    print(f"info: malloc_lib={malloc_lib()}")
    print(f"info: n={n} seconds={elapsed:.4f}")
    print(f"result: ops_per_sec={n / elapsed:.1f}")


if __name__ == "__main__":
    main()
