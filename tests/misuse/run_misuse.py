#!/usr/bin/env python3
"""The misuse suite: each case of tests/misuse/misuse.c in a child process,
under an allocator preloaded (or glibc's own), and what came of it.

  run_misuse.py check BUILD LIB MISUSE   every case under LIB (BUILD: default or
                                         secure) must end as EXPECT says
  run_misuse.py table LIB SECURE_LIB MISUSE
                                         a markdown table: both builds and glibc
  run_misuse.py doc SECURITY_MD MISUSE   the table in docs/SECURITY.md has a row
                                         for each case, in order, whose two builds'
                                         outcomes are EXPECT's, and their totals

Outcomes: "aborted" with coralloc's message, one line (the text EXPECT names),
"crashed" (a signal other than SIGABRT: a fault), "ran on" (the misuse went
unnoticed and the program finished), "n/a" (the allocator lacks the call).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

# What each build must do, by case: ("aborted", text of the message) where
# it detects the misuse at the call, ("crashed", why) where a fault stops the
# program at the bad access (a guard page or an inaccessible block), else
# ("ran on" | "crashed", why the default build cannot tell at O(1)).
# docs/SECURITY.md explains each.
Expect = tuple[str, str]
EXPECT: dict[str, tuple[Expect, Expect]] = {
    # case: (default build, secure build)
    "double-free-small": (("aborted", "double free detected"),
                          ("aborted", "double free detected")),
    "double-free-small-delayed": (("aborted", "double free detected"),
                                  ("aborted", "double free detected")),
    "double-free-large": (("aborted", "in no page in use: double free?"),
                          ("aborted", "double free detected")),
    "double-free-large-delayed": (("aborted", "in no page in use: double free?"),
                                  ("aborted", "double free detected")),
    "double-free-huge": (("aborted", "double free detected"),
                         ("aborted", "double free detected")),
    "double-free-remote": (("aborted", "double free detected"),
                           ("aborted", "double free detected")),
    "double-free-remote-delayed": (("aborted", "more blocks freed than allocated"),
                                   ("aborted", "double free detected")),
    "double-free-pending-remote": (("aborted", "while its first free was pending"),
                                   ("aborted", "double free detected")),
    "double-free-pending-owner": (("aborted", "while its first free was pending"),
                                  ("aborted", "double free detected")),
    "double-free-released": (("aborted", "double free"),
                             ("aborted", "double free")),
    "free-stack": (("aborted", "invalid pointer"), ("aborted", "invalid pointer")),
    "free-static": (("aborted", "invalid pointer"), ("aborted", "invalid pointer")),
    "free-mmap": (("aborted", "invalid pointer"), ("aborted", "invalid pointer")),
    "free-interior-small": (("aborted", "not its start"),
                            ("aborted", "not its start")),
    "free-interior-large": (("aborted", "not its start"), ("aborted", "not its start")),
    "free-interior-huge": (("aborted", "not its start"), ("aborted", "not its start")),
    "realloc-after-free": (("aborted", "a freed block"), ("aborted", "a freed block")),
    "realloc-foreign": (("aborted", "invalid pointer"), ("aborted", "invalid pointer")),
    "overflow-1-small": (("crashed", "no canary in the default build"),
                         ("aborted", "heap overflow detected")),
    "overflow-8-small": (("crashed", "no canary in the default build"),
                         ("aborted", "heap overflow detected")),
    "overflow-1-large": (("ran on", "no canary in the default build"),
                         ("aborted", "heap overflow detected")),
    # (one byte past malloc_usable_size: the secure build reports a huge
    # block's request, and checks the canary after it)
    "overflow-1-huge": (("ran on", "no guard page in the default build"),
                        ("aborted", "heap overflow detected")),
    "write-after-free-small": (("crashed", "no fill check in the default build"),
                               ("aborted", "write after free detected")),
    "write-after-free-medium": (("crashed", "no fill check in the default build"),
                                ("aborted", "write after free detected")),
    "write-after-free-tail": (("ran on", "no fill check in the default build"),
                              ("aborted", "write after free detected")),
    "read-after-free-huge": (("ran on", "freed chunks stay mapped for reuse"),
                             ("crashed", "a freed huge block's range is inaccessible")),
    "read-after-free-huge-reused": (("ran on", "the next huge block reuses the freed chunks"),
                                    ("crashed", "a freed huge block's range stays "
                                     "inaccessible for the next 64 huge frees")),
    "write-after-free-huge-reused": (("ran on", "the next huge block reuses the freed chunks"),
                                     ("crashed", "a freed huge block's range stays "
                                      "inaccessible for the next 64 huge frees")),
    "double-free-huge-reused": (("aborted", "double free detected"),
                                ("aborted", "double free detected")),
    "malloc0-write": (("crashed", "malloc(0) is a 16-byte block"),
                      ("crashed", "malloc(0) is an inaccessible slot")),
    "malloc0-read": (("ran on", "malloc(0) is a 16-byte block"),
                     ("crashed", "malloc(0) is an inaccessible slot")),
    "free-sized-mismatch": (("aborted", "free_sized"), ("aborted", "free_sized")),
    "free-aligned-sized-mismatch": (("aborted", "free_aligned_sized"),
                                    ("aborted", "free_aligned_sized")),
}
# Issue 33: large blocks after their free (the secure build serves requests
# of 256 KiB and up as large blocks, inaccessible in its heap's quarantine).
_LARGE_QUARANTINED = "a freed large block stays inaccessible in its heap's quarantine"
_LARGE_DEFAULT = "the freed block's memory stays mapped for reuse"
EXPECT.update({
    "read-after-free-large": (("ran on", _LARGE_DEFAULT), ("crashed", _LARGE_QUARANTINED)),
    "read-after-free-large-64k": (("ran on", _LARGE_DEFAULT),
                                  ("ran on", "a 64 KiB block is a size class's, not protected")),
    "read-after-free-large-1m": (("ran on", _LARGE_DEFAULT), ("crashed", _LARGE_QUARANTINED)),
    "write-after-free-large-noreuse": (("ran on", _LARGE_DEFAULT),
                                       ("crashed", _LARGE_QUARANTINED)),
    "write-after-free-large-noreuse-64k": (("ran on", _LARGE_DEFAULT),
                                           ("ran on", "a 64 KiB block is a size class's, past "
                                            "the ring's 4096 bytes: its fill checked at reuse")),
    "write-after-free-large-noreuse-1m": (("ran on", _LARGE_DEFAULT),
                                          ("crashed", _LARGE_QUARANTINED)),
    "read-after-free-large-remote": (("ran on", _LARGE_DEFAULT),
                                     ("crashed", "protected once the owner takes the free back")),
    "write-after-free-large-remote": (("ran on", _LARGE_DEFAULT),
                                      ("crashed", "protected once the owner takes the free back")),
    "read-after-free-large-other-thread": (("ran on", _LARGE_DEFAULT),
                                           ("crashed", _LARGE_QUARANTINED)),
})
# Issue 33: each size range, the owner and another thread, the bulk calls.
EXPECT.update({
    "free-plus1-small": (("aborted", "not its start"), ("aborted", "not its start")),
    "free-plus1-medium": (("aborted", "not its start"), ("aborted", "not its start")),
    "free-plus1-large": (("aborted", "not its start"), ("aborted", "not its start")),
    "free-plus1-huge": (("aborted", "not its start"), ("aborted", "not its start")),
    "double-free-pqp-small": (("aborted", "double free detected"),
                              ("aborted", "double free detected")),
    "double-free-pqp-medium": (("aborted", "double free detected"),
                               ("aborted", "double free detected")),
    "double-free-pqp-large": (("aborted", "in no page in use: double free?"),
                              ("aborted", "double free detected")),
    "double-free-pqp-huge": (("aborted", "double free detected"),
                             ("aborted", "double free detected")),
    "double-free-owner-then-remote": (("aborted", "handed out since"),
                                      ("aborted", "double free detected")),
    "free-interior-remote-small": (("aborted", "not its start"), ("aborted", "not its start")),
    "free-interior-remote-medium": (("aborted", "not its start"), ("aborted", "not its start")),
    "free-free-space": (("aborted", "a block never handed out"),
                        ("aborted", "heap overflow detected")),
    "usable-size-free-space": (("aborted", "a block never handed out"),
                               ("aborted", "a block never handed out")),
    "usable-size-interior": (("aborted", "not a block's start"),
                             ("aborted", "not a block's start")),
    "usable-size-after-free": (("aborted", "a freed block"), ("aborted", "a freed block")),
    "double-free-remote-across-take": (("aborted", "more blocks freed than allocated"),
                                       ("aborted", "double free detected")),
    "bulk-same-block-8": (("aborted", "double free detected"),
                          ("aborted", "double free detected")),
    "bulk-after-free": (("aborted", "double free detected"),
                        ("aborted", "double free detected")),
    "bulk-interior-remote-large": (("aborted", "not its start"), ("aborted", "not its start")),
})
# Issue 33, the secure build's review findings and the C++ deletes.
EXPECT.update({
    "cxx-sized-delete-mismatch": (("aborted", "operator delete"),
                                  ("aborted", "operator delete")),
    "cxx-aligned-sized-delete-mismatch": (("aborted", "operator delete"),
                                          ("aborted", "operator delete")),
    "double-free-bitflip": (("aborted", "double free detected"),
                            ("aborted", "double free detected")),
    "forge-link": (("ran on", "no link encoding in the default build: the forged link "
                    "is followed"),
                   ("aborted", "free list corrupted")),
    "aligned-alloc0-write": (("ran on", "a zero-size request is a 16-byte block"),
                             ("crashed", "an inaccessible slot")),
    "posix-memalign0-write": (("ran on", "a zero-size request is a 16-byte block"),
                              ("crashed", "an inaccessible slot")),
    "memalign0-write": (("ran on", "a zero-size request is a 16-byte block"),
                        ("crashed", "an inaccessible slot")),
    "free-interior-large-aligned": (("aborted", "not its start"), ("aborted", "not its start")),
    "overflow-heap-destroy": (("ran on", "no canary in the default build"),
                              ("aborted", "heap overflow detected")),
})
# Issue 33's neighbours (audit aud33): each misuse in every size range
# (small 48 bytes, medium 2000, large 256 KiB, huge 16 MiB), by the owner
# and by another thread, through every call that frees.
EXPECT.update({
    "double-free-pqp-remote-medium": (("aborted", "more blocks freed than allocated"),
                                      ("aborted", "double free detected")),
    "double-free-pqp-remote-large": (("aborted", "double free detected"),
                                     ("aborted", "double free detected")),
    "double-free-pqp-remote-huge": (("aborted", "double free detected"),
                                    ("aborted", "double free detected")),
    "free-interior-remote-large": (("aborted", "not its start"), ("aborted", "not its start")),
    "free-interior-remote-huge": (("aborted", "not its start"), ("aborted", "not its start")),
    "free-never-handed-out-small": (("aborted", "double free detected"),
                                    ("aborted", "double free detected")),
    "free-never-handed-out-remote-small": (("aborted", "handed out since"),
                                           ("aborted", "double free detected")),
    "free-never-handed-out-remote-run-small": (("aborted", "handed out since"),
                                               ("aborted", "double free detected")),
    "bulk-never-handed-out-small": (("aborted", "double free detected"),
                                    ("aborted", "double free detected")),
    "free-never-handed-out-medium": (("aborted", "a block never handed out"),
                                     ("aborted", "heap overflow detected")),
    "free-free-space-large": (("aborted", "in no page in use"), ("aborted", "in no page in use")),
    "usable-size-interior-large": (("aborted", "invalid pointer"), ("aborted", "invalid pointer")),
    "usable-size-interior-huge": (("aborted", "invalid pointer"), ("aborted", "invalid pointer")),
    "usable-size-after-free-large": (("aborted", "invalid pointer"),
                                     ("aborted", "invalid pointer")),
    "usable-size-after-free-huge": (("aborted", "invalid pointer"),
                                    ("aborted", "invalid pointer")),
    "bulk-interior-small": (("aborted", "not its start"), ("aborted", "not its start")),
    "bulk-interior-medium": (("aborted", "not its start"), ("aborted", "not its start")),
    "bulk-interior-large": (("aborted", "not its start"), ("aborted", "not its start")),
    "bulk-interior-huge": (("aborted", "not its start"), ("aborted", "not its start")),
    "bulk-interior-remote-small": (("aborted", "not its start"), ("aborted", "not its start")),
    "bulk-interior-remote-huge": (("aborted", "not its start"), ("aborted", "not its start")),
    "bulk-after-free-medium": (("aborted", "double free detected"),
                               ("aborted", "double free detected")),
    "bulk-after-free-large": (("aborted", "in no page in use: double free?"),
                              ("aborted", "double free detected")),
    "bulk-after-free-huge": (("aborted", "double free detected"),
                             ("aborted", "double free detected")),
    "bulk-pqp-small": (("aborted", "double free detected"), ("aborted", "double free detected")),
    "bulk-pqp-medium": (("aborted", "double free detected"), ("aborted", "double free detected")),
    "bulk-pqp-large": (("aborted", "double free detected"), ("aborted", "double free detected")),
    "bulk-pqp-huge": (("aborted", "double free detected"), ("aborted", "double free detected")),
    "cxx-delete-interior": (("aborted", "not its start"), ("aborted", "not its start")),
    "cxx-delete-array-interior": (("aborted", "not its start"), ("aborted", "not its start")),
    "cxx-delete-nothrow-interior": (("aborted", "not its start"), ("aborted", "not its start")),
    "cxx-delete-array-nothrow-interior": (("aborted", "not its start"),
                                          ("aborted", "not its start")),
    "cxx-aligned-delete-interior": (("aborted", "operator delete: invalid pointer"),
                                    ("aborted", "operator delete: invalid pointer")),
    "cxx-aligned-array-delete-interior": (("aborted", "operator delete: invalid pointer"),
                                          ("aborted", "operator delete: invalid pointer")),
    "cxx-aligned-nothrow-delete-interior": (("aborted", "operator delete: invalid pointer"),
                                            ("aborted", "operator delete: invalid pointer")),
    "cxx-aligned-array-nothrow-delete-interior": (("aborted", "operator delete: invalid pointer"),
                                                  ("aborted", "operator delete: invalid pointer")),
    "cxx-array-sized-delete-mismatch": (("aborted", "operator delete"),
                                        ("aborted", "operator delete")),
    "cxx-aligned-array-sized-delete-mismatch": (("aborted", "operator delete"),
                                                ("aborted", "operator delete")),
    "realloc-interior": (("aborted", "not a block's start"), ("aborted", "not a block's start")),
    "free-sized-interior": (("aborted", "not a block's start"),
                            ("aborted", "not a block's start")),
    "write-after-free-small-noreuse": (("ran on", "no fill check in the default build"),
                                       ("aborted", "write after free detected")),
    "write-after-free-small-noreuse-head": (("ran on", "no fill check in the default build"),
                                            ("aborted", "write after free detected")),
    "write-after-free-medium-noreuse": (("ran on", "no fill check in the default build"),
                                        ("aborted", "write after free detected")),
    "overflow-request-small": (("ran on", "no canary in the default build"),
                               ("aborted", "heap overflow detected")),
    "overflow-request-large": (("ran on", "no canary in the default build"),
                               ("aborted", "heap overflow detected")),
    "free-interior-planted-canary": (("aborted", "not its start"),
                                     ("aborted", "not its start")),
    **{case: (("ran on", "no canary in the default build"),
              ("aborted", "heap overflow detected"))
       for case in ("overflow-request1-small", "overflow-request1-medium",
                    "overflow-request1-large", "overflow-request1-slack4",
                    "overflow-request-calloc", "overflow-realloc-grown",
                    "overflow-realloc-shrunk", "overflow-realloc-large-shrunk")},
    "write-after-free-small48-noreuse": (("ran on", "no fill check in the default build"),
                                         ("aborted", "write after free detected")),
    "write-after-free-retire": (("ran on", "no fill check in the default build"),
                                ("aborted", "write after free detected")),
})
# Issue 33: a sized free told a size other than the request, at most the
# usable size (C23's free_sized, C++'s sized deletes): only the secure
# build knows the request.
EXPECT.update({
    case: (("ran on", "the default build checks a sized free against the usable size"),
           ("aborted", "not the size the block was allocated with"))
    for case in ("free-sized-plus1-small", "free-sized-minus1-medium", "free-sized-minus1-large",
                 "free-sized-plus1-huge",
                 "free-sized-calloc-wrong", "free-aligned-sized-plus1",
                 "cxx-sized-delete-wrong-size", "cxx-aligned-sized-delete-wrong-size")
})
EXPECT["overflow-huge-rounding"] = (("ran on", "no guard page in the default build"),
                                    ("crashed", "the guard region after the 2 MiB rounding"))
# Exact above 1 KiB: a class whose slack is 64 or more (malloc(1050): 94).
EXPECT["overflow-request1-wide"] = (("ran on", "no canary in the default build"),
                                    ("aborted", "heap overflow detected"))
EXPECT["free-sized-minus64-wide"] = (
    ("ran on", "the default build checks a sized free against the usable size"),
    ("aborted", "not the size the block was allocated with"))
# A huge block's canary after its request (the secure build), however the
# block came and whoever finds it.
EXPECT.update({
    case: (("ran on", "no canary in the default build"), ("aborted", "heap overflow detected"))
    for case in ("overflow-request1-huge", "overflow-request1-huge-aligned",
                 "overflow-request1-huge-calloc", "overflow-realloc-huge-grown",
                 "overflow-realloc-huge-grown-far", "overflow-realloc-huge-shrunk",
                 "overflow-request1-huge-remote", "overflow-huge-heap-destroy",
                 "overflow-request1-huge-bulk")
})
EXPECT.update({
    case: (("ran on", "no canary in the default build"),
           ("aborted", "its canary was overwritten: a heap overflow"))
    for case in ("overflow-request1-huge-realloc", "overflow-request1-huge-usable",
                 "overflow-request1-huge-free-sized")
})
BUILDS = ("default", "secure")
# Damage found later, with no call to undo: these abort in both modes.
AFTER_THE_FACT = ("free list corrupted", "write after free detected",
                  "more blocks freed than allocated", "handed out since")


def run_case(misuse: str, case: str, lib: str | None,
             extra_env: dict[str, str] | None = None) -> tuple[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("CORALLOC_ON_ERROR", None)
    if lib:
        env["LD_PRELOAD"] = lib
    env.update(extra_env or {})
    proc = subprocess.run([misuse, case], env=env, capture_output=True, text=True, timeout=60)
    message = proc.stderr.strip()  # all of it: an abort must say one line (matches)
    if proc.returncode == 0:
        return "ran on", message
    if proc.returncode == 3:
        return "n/a", message
    if proc.returncode == -signal.SIGABRT:
        return "aborted", message
    if proc.returncode < 0:
        return "crashed", signal.Signals(-proc.returncode).name
    return f"exit {proc.returncode}", message


def cases(misuse: str) -> list[str]:
    out = subprocess.run([misuse, "--list"], capture_output=True, text=True, check=True).stdout
    return out.split()


def matches(want: Expect, got: str, message: str) -> bool:
    # "aborted or ran on": the outcome depends on the secure build's random
    # choices (which block a reused span puts where); either is accepted,
    # and an abort must still carry coralloc's message.
    if want[0] == "aborted or ran on":
        return got == "ran on" or (got == "aborted" and message.startswith("coralloc: error: ")
                                              and "\n" not in message)
    return got == want[0] and (want[0] != "aborted" or (
        message.startswith("coralloc: error: ") and "\n" not in message and want[1] in message))


def first_line(message: str) -> str:
    return message.splitlines()[0] if message else ""


def same_text(a: str, b: str) -> bool:
    """Equal but for addresses (each run maps elsewhere)."""
    return re.sub(r"0x[0-9a-f]+", "0x...", a) == re.sub(r"0x[0-9a-f]+", "0x...", b)


def check(build: str, lib: str, misuse: str) -> int:
    """Every case ends as EXPECT says for `build`; a case the build aborts
    on also runs with CORALLOC_ON_ERROR=warn, where it must print the same
    message (each line of its stderr) and go on to exit 0 (the misuse
    leaked, nothing corrupted),
    except damage found after the fact (AFTER_THE_FACT), which aborts in
    both modes."""
    column = BUILDS.index(build)
    failures = 0
    listed = cases(misuse)
    for case in listed:
        want = EXPECT[case][column]
        got, message = run_case(misuse, case, lib)
        ok = matches(want, got, message)
        print(f"{'ok  ' if ok else 'FAIL'} {case:30} {got:8} {first_line(message)[:90]}")
        failures += not ok
        if ok and want[0] == "aborted" and want[1] not in AFTER_THE_FACT:
            wgot, wmessage = run_case(misuse, case, lib, {"CORALLOC_ON_ERROR": "warn"})
            # Each line the same: one report per misuse (a case may repeat
            # its misuse, as bulk-same-block-8 does seven times), none from
            # a call that went on after its report.
            wok = wgot == "ran on" and all(same_text(line, message)
                                           for line in wmessage.splitlines())
            print(f"{'ok  ' if wok else 'FAIL'} {case + ' (warn)':30} {wgot:8} "
                  f"{first_line(wmessage)[:90]}")
            failures += not wok
    missing = set(EXPECT) - set(listed)
    for case in sorted(missing):
        print(f"FAIL {case}: expected but not in the program")
    failures += len(missing)
    detected = sum(EXPECT[c][column][0] == "aborted" for c in listed)
    print(f"misuse ({build} build): {len(listed)} cases, {detected} aborted with a message, "
          f"{failures} unexpected")
    return 1 if failures else 0


def table(lib: str, secure_lib: str, misuse: str) -> int:
    print("| case | default build | secure build | glibc 2.36 |")
    print("|---|---|---|---|")
    names = ("default", "secure", "glibc")
    counts = dict.fromkeys(names, 0)
    for case in cases(misuse):
        row = []
        for name, preload in zip(names, (lib, secure_lib, None)):
            got, message = run_case(misuse, case, preload)
            counts[name] += got == "aborted"
            message = re.sub(r"0x[0-9a-f]+", "0x...", first_line(message))  # each run differs
            row.append(got + (f": `{message[:60]}`" if got == "aborted" and message else ""))
        print(f"| {case} | {' | '.join(row)} |")
    print("| **aborted with a message** | " +
          " | ".join(f"**{counts[n]}**" for n in names) + " |")
    return 0


def doc(security_md: str, misuse: str) -> int:
    """The table in SECURITY_MD (as `table` wrote it) against EXPECT: what
    the check runs prove of each build, the page must say (its glibc
    column is measured by `table` only)."""
    lines = open(security_md, encoding="utf-8").read().splitlines()
    header = "| case | default build | secure build | glibc 2.36 |"
    start = lines.index(header) + 2 if header in lines else len(lines)
    cells: dict[str, list[str]] = {}
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        row = line.split(" | ")
        cells[row[0][2:]] = row[1:]
    totals = cells.pop("**aborted with a message**", [])
    listed = cases(misuse)
    named = list(cells)
    failures = []
    if named != listed:
        failures.append(f"the table's cases {named} are not the program's {listed}")
    for case in listed:
        for column, build in enumerate(BUILDS):
            want = EXPECT[case][column][0]
            said = cells.get(case, ["?", "?"])[column].split(":")[0].strip()
            if said != want:
                failures.append(f"{case}: the table says {said!r} for the {build} build, "
                                f"EXPECT {want!r}")
    for column, build in enumerate(BUILDS):
        count = sum(EXPECT[c][column][0] == "aborted" for c in listed)
        if len(totals) <= column or totals[column].strip() != f"**{count}**":
            failures.append(f"the {build} build's total is not **{count}**")
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"misuse doc: {len(listed)} cases, {len(failures)} disagreements with {security_md}")
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[1] == "check" and argv[2] in BUILDS:
        return check(argv[2], argv[3], argv[4])
    if len(argv) == 5 and argv[1] == "table":
        return table(argv[2], argv[3], argv[4])
    if len(argv) == 4 and argv[1] == "doc":
        return doc(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
