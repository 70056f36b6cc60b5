"""Small shared pieces: the error type shown as one line, paths, statistics."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Iterable, Optional, Sequence


class BenchError(Exception):
    """An error shown to the user as one line, without a traceback."""


def repo_root() -> Path:
    """The coralloc source tree: $CORALLOC_ROOT, else found upwards from this
    file (the package is installed editable from bench/) or from the current
    directory."""
    env = os.environ.get("CORALLOC_ROOT")
    if env:
        return Path(env).resolve()
    starts = [Path(__file__).resolve().parent, Path.cwd().resolve()]
    for start in starts:
        for d in [start, *start.parents]:
            if (d / "bench" / "workloads").is_dir() and (d / "CMakeLists.txt").is_file():
                return d
    return Path.cwd().resolve()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def geomean(values: Iterable[float]) -> Optional[float]:
    """Geometric mean of the positive finite values; None when there are none."""
    logs = [math.log(v) for v in values if v > 0 and math.isfinite(v)]
    if not logs:
        return None
    return math.exp(sum(logs) / len(logs))


def is_shared_library(path: str) -> bool:
    """An ELF file of type ET_DYN (what LD_PRELOAD can load)."""
    try:
        with open(path, "rb") as f:
            head = f.read(18)
    except OSError:
        return False
    if len(head) < 18 or head[:4] != b"\x7fELF":
        return False
    little = head[5] == 1
    e_type = int.from_bytes(head[16:18], "little" if little else "big")
    return e_type == 3  # ET_DYN
