"""`coralloc-bench fastpath`: instructions per malloc+free, under callgrind,
for coralloc and every peer the runner finds.

data/fastpath.c is compiled (cc -O2 -fno-builtin) into a temporary
directory; for each allocator and scenario it runs

    valgrind --tool=callgrind --trace-children=yes env [LD_PRELOAD=lib] fastpath SCENARIO N

at N, 2N and 3N iterations and reports (Ir(3N) - Ir(N)) / 2N / blocks per
iteration, so that process start-up, the allocator's initialisation and the
set-up outside the loop cancel; the two halves (N..2N, 2N..3N) must agree
(the cost is linear). Each figure includes the loop's own instructions (10
per pair, 14-15 per block; see docs/FASTPATH.md), the same for every
allocator. The allocators are the runner's (coralloc from the build
directory, the Debian packages, the pinned peers), each verified: fastpath
prints which object its malloc and free resolve to, and a run whose
provider is not the allocator under test fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

from tabulate import tabulate

from coralloc_bench.allocators import Allocator
from coralloc_bench.util import BenchError

SOURCE = Path(__file__).resolve().parent / "data" / "fastpath.c"
CFLAGS = ["-O2", "-fno-builtin"]


@dataclass(frozen=True)
class Scenario:
    name: str
    blocks: int  # malloc/free pairs per iteration
    iterations: int  # N (the runs use N, 2N and 3N)
    unit: str
    what: str


SCENARIOS: List[Scenario] = [
    Scenario("pair16", 1, 200_000, "per pair", "malloc(16) + free, one block at a time"),
    Scenario("pair64", 1, 200_000, "per pair", "malloc(64) + free, one block at a time"),
    Scenario("pair512", 1, 200_000, "per pair", "malloc(512) + free, one block at a time"),
    Scenario("batch64", 1000, 200, "per block",
             "1000 x malloc(64), then 1000 frees in the same order"),
    Scenario("mixed", 1000, 200, "per block", "1000 mallocs of 8..1024 B (fixed random "
             "sizes), freed in a fixed scrambled order"),
]
BY_NAME = {s.name: s for s in SCENARIOS}


@dataclass
class Measurement:
    per_block: float
    halves: Tuple[float, float]  # slope over N..2N and over 2N..3N


def build(outdir: Path, cc: str) -> Path:
    exe = outdir / "fastpath"
    cmd = [cc, *CFLAGS, "-o", str(exe), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"building fastpath failed: {shlex.join(cmd)}: {proc.stderr.strip()}")
    return exe


_PROVIDER = re.compile(r"^fastpath: (malloc|free) from (.*)$", re.M)


def check_provider(stderr: str, alloc: Allocator) -> None:
    """The loop must call the allocator we think it calls."""
    found = dict(_PROVIDER.findall(stderr))
    for sym in ("malloc", "free"):
        where = found.get(sym)
        if where is None:
            raise BenchError(f"{alloc.name}: fastpath printed no provider for {sym}")
        if not alloc.serves(where):
            want = "libc" if alloc.path is None else alloc.path
            raise BenchError(f"{alloc.name}: {sym} resolves to {where}, not {want}: "
                             f"preload not in effect")


def callgrind_ir(exe: Path, alloc: Allocator, scenario: str, iterations: int,
                 workdir: Path) -> int:
    """Total instructions (Ir) of the fastpath process itself, not of `env`."""
    outdir = Path(tempfile.mkdtemp(prefix="cg-", dir=workdir))
    env_cmd = ["env"] + ([f"LD_PRELOAD={alloc.path}"] if alloc.path is not None else [])
    env_cmd += [f"{k}={v}" for k, v in alloc.settings.items()]
    cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes", "-q",
           f"--callgrind-out-file={outdir}/callgrind.out.%p",
           *env_cmd, str(exe), scenario, str(iterations)]
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environ)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchError(f"{alloc.name} {scenario}: callgrind exited {proc.returncode}: {tail}")
    check_provider(proc.stderr, alloc)
    # one file per traced process image: the workload's, never the `env` launcher's
    want = f"{exe} {scenario} {iterations}"
    totals: List[int] = []
    for f in sorted(outdir.iterdir()):
        text = f.read_text(errors="replace")
        cmd_m = re.search(r"^cmd:\s*(.*)$", text, re.M)
        tot_m = re.search(r"^(?:totals|summary):\s*(\d+)", text, re.M)
        if cmd_m and tot_m and cmd_m.group(1).strip() == want:
            totals.append(int(tot_m.group(1)))
    shutil.rmtree(outdir)
    if len(totals) != 1:
        raise BenchError(f"expected one callgrind output for '{want}', found {len(totals)}")
    return totals[0]


def measure(exe: Path, alloc: Allocator, sc: Scenario, n: int, workdir: Path) -> Measurement:
    ir = [callgrind_ir(exe, alloc, sc.name, k * n, workdir) for k in (1, 2, 3)]
    per = n * sc.blocks
    return Measurement((ir[2] - ir[0]) / (2 * per),
                       ((ir[1] - ir[0]) / per, (ir[2] - ir[1]) / per))


def snapshot(alloc: Allocator, workdir: Path) -> Tuple[Allocator, str]:
    """A library under development may be rebuilt while this runs: measure a
    copy, and say which (mtime, sha256)."""
    assert alloc.path is not None
    snap = workdir / "snapshot" / alloc.name / os.path.basename(alloc.path)
    snap.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(alloc.path, snap)
    digest = hashlib.sha256(snap.read_bytes()).hexdigest()[:16]
    mtime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.stat().st_mtime))
    note = f"{alloc.name}: {alloc.path} as of {mtime} (sha256 {digest}...), copied before the runs"
    return dataclasses.replace(alloc, path=str(snap)), note


Results = Dict[str, Dict[str, Measurement]]  # scenario -> allocator -> measurement


def run(allocs: Sequence[Allocator], scens: Sequence[Scenario], scale: float, cc: str,
        log: Callable[[str], None]) -> Tuple[Results, List[str]]:
    """Every scenario under every allocator; the notes of the run."""
    if shutil.which("valgrind") is None:
        raise BenchError("valgrind is not installed (apt-get install valgrind)")
    notes: List[str] = []
    results: Results = {s.name: {} for s in scens}
    with tempfile.TemporaryDirectory(prefix="coralloc-fastpath-") as tmp:
        workdir = Path(tmp)
        exe = build(workdir, cc)
        for a in allocs:
            run_as = a
            if a.name == "coralloc" and a.path is not None:
                run_as, note = snapshot(a, workdir)
                log(note)
                notes.append(note)
            for sc in scens:
                n = max(1, int(sc.iterations * scale))
                try:
                    m = measure(exe, run_as, sc, n, workdir)
                except BenchError as e:
                    note = f"{a.name}: not measured: {e}"
                    log(note)
                    notes.append(note)
                    break  # its other scenarios would fail alike
                results[sc.name][a.name] = m
                h1, h2 = m.halves
                log(f"{a.name:9s} {sc.name:8s} {m.per_block:8.2f} instructions {sc.unit}"
                    f"  (halves {h1:.2f} / {h2:.2f})")
                if abs(h1 - h2) > 0.02 * max(abs(h1), abs(h2), 1.0):
                    note = (f"{a.name} {sc.name}: not linear in the iteration count "
                            f"({h1:.2f} vs {h2:.2f} over N..2N and 2N..3N)")
                    log(f"warning: {note}")
                    notes.append(note)
    return results, notes


def table(results: Results, allocs: Sequence[str], scens: Sequence[Scenario],
          tablefmt: str = "pipe") -> str:
    """Instructions per pair/block; the best peer's bold (markdown) and
    coralloc's ratio to it."""
    has_coralloc = "coralloc" in allocs
    head = ["scenario", "unit", *allocs] + (["coralloc / best peer"] if has_coralloc else [])
    rows: List[List[str]] = []
    for sc in scens:
        row = results[sc.name]
        peers = [a for a in allocs if a != "coralloc" and a in row]
        best = min(peers, key=lambda p: row[p].per_block) if peers else None
        cells = [sc.name, sc.unit]
        for a in allocs:
            if a not in row:
                cells.append("-")
            else:
                v = f"{row[a].per_block:.1f}"
                cells.append(f"**{v}**" if a == best and tablefmt == "pipe" else v)
        if has_coralloc:
            cells.append(f"{row['coralloc'].per_block / row[best].per_block:.2f}"
                         if best is not None and "coralloc" in row else "-")
        rows.append(cells)
    return tabulate(rows, headers=head, tablefmt=tablefmt, disable_numparse=True,
                    colalign=("left", "left", *["right"] * (len(head) - 2)))


def to_json(results: Results) -> Dict[str, Dict[str, float]]:
    return {s: {a: round(m.per_block, 2) for a, m in row.items()} for s, row in results.items()}


@dataclass
class Section:
    """A fastpath run as a report shows it."""
    table: str  # markdown
    text: str  # plain text
    notes: List[str]
    figures: Dict[str, Dict[str, float]]
