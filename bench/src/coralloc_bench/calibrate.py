"""Calibration: how long each workload of a profile runs under the baseline
allocator (mimalloc 3.4.3), so that every one runs long enough to measure
the allocator rather than process start-up and exit (at least MIN_SECONDS,
with the iterations inside the process).

`coralloc-bench calibrate --profile quick --write` runs each workload under
the baseline and records, per workload, the arguments it ran with and the
median wall time in data/calibration-<profile>.json; the runner's tests
check that every workload of the quick profile still has the arguments it
was calibrated with and that its recorded time reaches MIN_SECONDS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from coralloc_bench import programs
from coralloc_bench.allocators import Allocator
from coralloc_bench.execute import OK, Progress, RunContext, RunRecord, run_matrix
from coralloc_bench.util import median
from coralloc_bench.workloads import Workload

DATA = Path(__file__).resolve().parent / "data"
MIN_SECONDS = 0.3
TARGET_SECONDS = 0.4


def calibration_file(profile: str) -> Path:
    return DATA / f"calibration-{profile}.json"


def load(profile: str) -> Optional[Dict[str, object]]:
    path = calibration_file(profile)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None


def measure(workloads: Sequence[Workload], alloc: Allocator, reps: int,
            ctx: RunContext, quiet: bool = False) -> Dict[str, Dict[str, object]]:
    """Per workload: its arguments, thread count and median wall time under
    `alloc` (None when a run failed)."""
    progress = Progress(len(workloads) * reps, quiet=quiet)
    try:
        records = run_matrix(workloads, [alloc], reps, ctx, progress,
                             executor_for=programs.executor_for)
    finally:
        progress.close()
    out: Dict[str, Dict[str, object]] = {}
    for w in workloads:
        runs = [r for r in records if r.workload == w.name]
        walls = [r.wall_s for r in runs if r.status == OK and r.wall_s is not None]
        ok = len(walls) == len(runs)
        out[w.name] = {"args": w.argv_tail(ctx.profile, ctx.threads), "threads": ctx.threads,
                       "wall_s": round(median(walls), 4) if ok and walls else None,
                       "reason": "" if ok else "; ".join(sorted({r.reason for r in runs
                                                                  if r.status != OK}))}
    return out


def from_records(records: Sequence[RunRecord], meta: Dict[str, object], alloc: str
                 ) -> Dict[str, Dict[str, object]]:
    """The same figures from a recorded run (results.json): per workload the
    arguments it ran with (from the run's header) and the median wall time
    of `alloc`'s runs (None when one failed)."""
    workloads = meta.get("workloads")
    threads = int(meta.get("threads") or 1)  # type: ignore[call-overload]
    out: Dict[str, Dict[str, object]] = {}
    for name, d in (workloads.items() if isinstance(workloads, dict) else []):
        runs = [r for r in records if r.workload == name and r.allocator == alloc]
        walls = [r.wall_s for r in runs if r.status == OK and r.wall_s is not None]
        ok = bool(runs) and len(walls) == len(runs)
        out[name] = {"args": d.get("args") if isinstance(d, dict) else None,
                     "threads": threads,
                     "wall_s": round(median(walls), 4) if ok and walls else None,
                     "reason": "" if ok else f"no successful run of {alloc}"}
    return out


def lines(results: Dict[str, Dict[str, object]]) -> List[List[str]]:
    """Rows for the table: workload, seconds, the factor to TARGET_SECONDS, a
    mark for the ones under MIN_SECONDS."""
    rows: List[List[str]] = []
    for name, d in results.items():
        wall = d.get("wall_s")
        if not isinstance(wall, (int, float)):
            rows.append([name, "FAILED", "", str(d.get("reason", ""))])
            continue
        mark = "SHORT" if wall < MIN_SECONDS else ""
        rows.append([name, f"{wall:.3f}", f"{TARGET_SECONDS / wall:.2f}", mark])
    return rows


def too_short(data: Dict[str, object], workloads: Sequence[Workload], profile: str
              ) -> List[str]:
    """The workloads whose recorded calibration is missing, was taken with
    other arguments than they have now, or is under MIN_SECONDS."""
    recorded = data.get("workloads")
    bad: List[str] = []
    for w in workloads:
        d = recorded.get(w.name) if isinstance(recorded, dict) else None
        if not isinstance(d, dict):
            bad.append(f"{w.name}: not calibrated")
            continue
        threads = int(d.get("threads") or 1)
        if d.get("args") != w.argv_tail(profile, threads):
            bad.append(f"{w.name}: arguments changed since calibration")
            continue
        wall = d.get("wall_s")
        if not isinstance(wall, (int, float)) or wall < MIN_SECONDS:
            bad.append(f"{w.name}: {wall} s under {data.get('allocator')}")
    return bad
