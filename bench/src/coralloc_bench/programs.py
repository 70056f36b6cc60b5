"""Which runner runs a workload: our own C programs (execute.py), the real
programs (realprogs.py, devtools.py). The one module that knows them all,
so that none of them imports another's caller (no import circle)."""

from __future__ import annotations

import shutil
from typing import Dict, List

from coralloc_bench import devtools, realprogs
from coralloc_bench.execute import Executor, run_c_workload
from coralloc_bench.witness import find_python
from coralloc_bench.workloads import Workload

EXECUTORS: Dict[str, Executor] = {
    "real:python": realprogs.run_python, "real:python-gc": realprogs.run_python_gc,
    "real:sqlite": realprogs.run_sqlite, "real:redis": realprogs.run_redis, **devtools.EXECUTORS}


def executor_for(w: Workload) -> Executor:
    """The runner of workload w."""
    return EXECUTORS[w.program] if w.is_real else run_c_workload


def missing_packages(programs: List[str]) -> List[str]:
    """Debian packages to install for the real programs among `programs`."""
    need: List[str] = []
    checks = {"real:python": (find_python() is not None, "python3"),
              "real:python-gc": (find_python() is not None, "python3"),
              "real:sqlite": (shutil.which("sqlite3") is not None, "sqlite3"),
              "real:redis": (shutil.which("redis-server") is not None and
                             shutil.which("redis-benchmark") is not None,
                             "redis-server redis-tools")}
    for p in programs:
        if p in checks and not checks[p][0]:
            need += checks[p][1].split()
    return need + devtools.missing_packages(programs)
