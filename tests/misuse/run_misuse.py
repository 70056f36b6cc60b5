#!/usr/bin/env python3
"""The misuse suite: each case of tests/misuse/misuse.c in a child process,
under an allocator preloaded (or glibc's own), and what came of it.

  run_misuse.py check LIB MISUSE   every case under LIB must end as EXPECT says
  run_misuse.py table LIB MISUSE   a markdown table: coralloc (LIB) and glibc

Outcomes: "aborted" with coralloc's message (the text EXPECT names),
"crashed" (a signal other than SIGABRT: a fault), "ran on" (the misuse went
unnoticed and the program finished), "n/a" (the allocator lacks the call).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# What the default build does today, by case: ("aborted", text of the
# message) where it detects the misuse, else ("ran on" | "crashed", why it
# cannot tell at O(1) in the default build). docs/SECURITY.md explains each.
EXPECT: dict[str, tuple[str, str]] = {
    "double-free-small": ("aborted", "double free detected"),
    "double-free-small-delayed": ("ran on", "not the last block freed: needs a scan"),
    "double-free-large": ("aborted", "in no page in use: double free?"),
    "double-free-large-delayed": ("aborted", "in no page in use: double free?"),
    "double-free-huge": ("aborted", "double free detected"),
    "double-free-remote": ("aborted", "double free detected"),
    "free-stack": ("aborted", "invalid pointer"),
    "free-static": ("aborted", "invalid pointer"),
    "free-mmap": ("aborted", "invalid pointer"),
    "free-interior-small": ("ran on", "no division on the free fast path"),
    "free-interior-large": ("aborted", "not its start"),
    "free-interior-huge": ("aborted", "invalid pointer"),
    "realloc-after-free": ("aborted", "double free detected"),
    "realloc-foreign": ("aborted", "invalid pointer"),
    "overflow-1-small": ("crashed", "no canary in the default build"),
    "overflow-8-small": ("crashed", "no canary in the default build"),
    "overflow-1-large": ("ran on", "no canary in the default build"),
    "overflow-1-huge": ("ran on", "no canary in the default build"),
    "write-after-free-small": ("ran on", "no fill check in the default build"),
    "write-after-free-medium": ("crashed", "no fill check in the default build"),
    "read-after-free-huge": ("ran on", "freed chunks stay mapped for reuse"),
    "malloc0-write": ("crashed", "malloc(0) is a 16-byte block"),
    "free-sized-mismatch": ("aborted", "free_sized"),
    "free-aligned-sized-mismatch": ("aborted", "free_aligned_sized"),
}


def run_case(misuse: str, case: str, lib: str | None) -> tuple[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if lib:
        env["LD_PRELOAD"] = lib
    proc = subprocess.run([misuse, case], env=env, capture_output=True, text=True, timeout=60)
    message = proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else ""
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


def check(lib: str, misuse: str) -> int:
    failures = 0
    listed = cases(misuse)
    for case in listed:
        want, text = EXPECT[case]
        got, message = run_case(misuse, case, lib)
        ok = got == want and (want != "aborted" or (
            message.startswith("coralloc: error: ") and text in message))
        print(f"{'ok  ' if ok else 'FAIL'} {case:30} {got:8} {message[:90]}")
        failures += not ok
    missing = set(EXPECT) - set(listed)
    for case in sorted(missing):
        print(f"FAIL {case}: expected but not in the program")
    failures += len(missing)
    detected = sum(EXPECT[c][0] == "aborted" for c in listed)
    print(f"misuse: {len(listed)} cases, {detected} detected by the default build, "
          f"{failures} unexpected")
    return 1 if failures else 0


def table(lib: str, misuse: str) -> int:
    print("| case | coralloc (default build) | glibc 2.36 |")
    print("|---|---|---|")
    counts = {"coralloc": 0, "glibc": 0}
    for case in cases(misuse):
        row = []
        for name, preload in (("coralloc", lib), ("glibc", None)):
            got, message = run_case(misuse, case, preload)
            counts[name] += got == "aborted"
            row.append(got + (f": `{message[:70]}`" if got == "aborted" and message else ""))
        print(f"| {case} | {row[0]} | {row[1]} |")
    print(f"| **aborted with a message** | **{counts['coralloc']}** | **{counts['glibc']}** |")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[1] not in ("check", "table"):
        print(__doc__, file=sys.stderr)
        return 2
    return check(argv[2], argv[3]) if argv[1] == "check" else table(argv[2], argv[3])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
