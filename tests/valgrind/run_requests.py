#!/usr/bin/env python3
"""valgrind_requests: coralloc's Valgrind client requests, under memcheck.

  run_requests.py PROGRAM     (tests/valgrind/requests.c, built with
                               CORAL_VALGRIND=1)

Each mode of the program runs under `valgrind --leak-check=full`; its
report must say what the mode did: nothing for `clean`, a block definitely
lost for `leak`, an invalid read for `read-freed`, an invalid free for
`double-free` (coralloc's own check sees that one too: it runs with
CORALLOC_ON_ERROR=warn so the program goes on).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

# mode: (what memcheck's report must contain, whether it must have no error)
EXPECT: dict[str, tuple[str, bool]] = {
    "clean": ("ERROR SUMMARY: 0 errors", True),
    "leak": (r"definitely lost: [\d,]+ bytes in 1 blocks", False),
    "read-freed": ("Invalid read of size 1", False),
    "double-free": (r"Invalid free\(\)", False),
}


def run(program: str, mode: str) -> str:
    env = dict(os.environ, CORALLOC_ON_ERROR="warn", CORALLOC_PURGE_THREAD="0")
    proc = subprocess.run(
        ["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite", program, mode],
        env=env, capture_output=True, text=True, timeout=240)
    return proc.stderr


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    failures = 0
    for mode, (pattern, no_error) in EXPECT.items():
        report = run(argv[1], mode)
        ok = re.search(pattern, report) is not None
        if no_error:
            ok = ok and "definitely lost" not in report.replace("definitely lost: 0 bytes", "")
        print(f"{'ok  ' if ok else 'FAIL'} {mode:12} memcheck says /{pattern}/: {ok}")
        if not ok:
            print(report[-3000:])
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
