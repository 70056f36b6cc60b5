"""Who served malloc in a program the runner did not write (real programs,
the mimalloc-bench suite): the malloc witness (bench/witness/malloc-witness.c),
preloaded after the allocator, appends at start-up of each process the
object its malloc calls are bound to; every line must name the allocator
under test (libc for system)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from coralloc_bench.allocators import Allocator
from coralloc_bench.execute import Check, Outcome, RunContext


def libc_path() -> Optional[str]:
    """The C library this runner's processes use (for `system` in programs
    that link another allocator: preloaded, glibc's malloc comes first)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/libc.so" in path or "/libc-" in path:
                    return path
    except OSError:
        pass
    return None


def witnessed_env(alloc: Allocator, ctx: RunContext, witness_file: Path,
                  libc_first: bool = False) -> Dict[str, str]:
    """The allocator's environment with the witness preloaded after it (and
    glibc before everything for `system` when libc_first: a program that
    links libjemalloc is then served by glibc, as `system` means)."""
    env = alloc.env()
    pre = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if alloc.path is None and libc_first:
        lc = libc_path()
        pre = ([lc] if lc else []) + pre
    if ctx.witness is not None:
        pre.append(str(ctx.witness))
        env["CORALLOC_WITNESS_FILE"] = str(witness_file)
    if pre:
        env["LD_PRELOAD"] = ":".join(pre)
    return env


def witness_verdict(alloc: Allocator, ctx: RunContext, witness_file: Path) -> Tuple[str, str]:
    """('', who served) when every process the witness heard of was served by
    `alloc`, else (why not, who served); who served is the objects the
    processes named, distinct, comma-separated (results.json's served_by).
    No witness built: the check cannot be made, and says so."""
    if ctx.witness is None:
        return "malloc-witness is not built: who served malloc is unknown", ""
    try:
        lines = witness_file.read_text().split("\n")
    except OSError:
        lines = []
    served = [ln.split(" ", 1)[1] for ln in lines if " " in ln]
    who = ",".join(sorted(set(served)))
    if not served:
        return "no process reported who served malloc", ""
    wrong = sorted({p for p in served if not alloc.serves(p)})
    if wrong:
        want = "libc" if alloc.path is None else os.path.basename(alloc.path)
        return (f"malloc served by {', '.join(wrong)}, not {want} "
                f"({sum(1 for p in served if not alloc.serves(p))} of {len(served)} processes)",
                who)
    return "", who


def not_run(reason: str) -> Tuple[Outcome, Check, List[str]]:
    return Outcome(None, 0, 0, 0, 0, 0, 0, "", ""), Check(False, reason), []


def find_python() -> Optional[str]:
    """Debian's python3 (not a virtualenv's or pyenv's shim)."""
    for p in ("/usr/bin/python3",):
        if os.access(p, os.X_OK):
            return p
    return shutil.which("python3")


