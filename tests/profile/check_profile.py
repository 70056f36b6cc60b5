#!/usr/bin/env python3
"""The heap profile's accuracy, read back from the file coralloc wrote.

check_profile.py LIB SITES_EXE WORKDIR [--pprof | --command CORALLOC | --small]

Runs SITES_EXE (tests/profile/profile_sites.c) with LIB preloaded and
CORALLOC_PROFILE=WORKDIR/prof, CORALLOC_PROFILE_RATE=1024; the program
prints the truth (bytes allocated and still live per function), and the
profile it wrote at exit (WORKDIR/prof.PID) is read with read_pprof.py:

- its sample types are alloc_objects, alloc_space, inuse_objects,
  inuse_space (count, bytes), its period the rate;
- the program's mapping comes first and carries its GNU build ID;
- each function's estimated alloc_space and inuse_space (the leaf frame of
  each sample, i.e. the function that called malloc) is within 10 % of the
  truth;
- a process that took no sample writes no file at exit: `ls /` under the
  largest rate (1 TiB: its few KiB of blocks are sampled with odds of about
  1 in 10^8; before, it wrote an empty profile).

With --small, the program's sizes are those malloc's fast path serves
(16 B to 1000 B), so that the estimates rest on that path's counting
alone (the profiling library's malloc counts there, api.h).

With --command, `CORALLOC profile FILE` (the text report) must name the
three functions first, in order, for in-use and for allocated bytes.

With --stray STRAY_EXE (tests/profile/stray_frame.c), the profile of a
program whose frame-pointer chain leads to a stray word (a return address
in no mapping) has no location in no mapping: its stacks are cut there.

With --totals TOTALS_EXE (tests/profile/thread_totals.c), the profile a
program dumps while half of its threads have exited and half are alive
holds every thread's allocations and frees at its site, exactly (each
thread's totals are published in batches: at its exit, and by the dump).

With --pprof, the standard pprof (PATH, or $(go env GOPATH)/bin) must read
the file and its -top view (by alloc_space, and by inuse_space) must name
the three functions first, in order. Exit 77 (SKIPPED) when pprof is not
installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import read_pprof  # noqa: E402

RATE = 1024
TOLERANCE = 0.10
SITES = ["site_sixty", "site_thirty", "site_ten"]


def fail(msg: str) -> None:
    print(f"FAILED: {msg}")
    sys.exit(1)


def run_sites(lib: str, exe: str, work: Path,
              small: bool = False) -> tuple[Path, dict[str, tuple[int, int]]]:
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("prof.*"):
        old.unlink()
    env = dict(os.environ, LD_PRELOAD=lib, CORALLOC_PROFILE=str(work / "prof"),
               CORALLOC_PROFILE_RATE=str(RATE))
    argv = [exe, str(16 << 20), "small"] if small else [exe]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=240)
    if proc.returncode != 0:
        fail(f"{exe} exited {proc.returncode}")
    truth = {}
    for line in out.splitlines():
        name, alloc, inuse = line.split()
        truth[name] = (int(alloc), int(inuse))
    path = work / f"prof.{proc.pid}"
    if not path.exists():
        fail(f"no profile {path} (found: {sorted(p.name for p in work.iterdir())})")
    return path, truth


def check_file(path: Path, exe: str, truth: dict[str, tuple[int, int]]) -> None:
    prof = read_pprof.read(str(path))
    want_types = [("alloc_objects", "count"), ("alloc_space", "bytes"),
                  ("inuse_objects", "count"), ("inuse_space", "bytes")]
    if prof.sample_types != want_types:
        fail(f"sample types {prof.sample_types}")
    if prof.default_sample_type != "inuse_space":
        fail(f"default sample type {prof.default_sample_type!r}")
    if prof.period != RATE or prof.period_type != ("space", "bytes"):
        fail(f"period {prof.period} {prof.period_type}")
    first = prof.mappings.get(1)
    if first is None or os.path.realpath(first.filename) != os.path.realpath(exe):
        fail(f"first mapping {first}, not {exe}")
    if len(first.build_id) < 16 or any(c not in "0123456789abcdef" for c in first.build_id):
        fail(f"the program's mapping has no build ID: {first.build_id!r}")
    for k, type_name in enumerate(["alloc_space", "inuse_space"]):
        est = prof.totals_by(type_name, lambda fr: fr[0] if fr else None)
        for name in SITES:
            real, got = truth[name][k], est.get(name, 0)
            err = (got - real) / real
            print(f"{type_name:12} {name:12} true {real:>10} estimated {got:>10} ({err:+.1%})")
            if abs(err) > TOLERANCE:
                fail(f"{type_name} of {name}: {got} estimated, {real} true")


def check_no_sample_no_file(lib: str, work: Path) -> None:
    for old in work.glob("none.*"):
        old.unlink()
    env = dict(os.environ, LD_PRELOAD=lib, CORALLOC_PROFILE=str(work / "none"),
               CORALLOC_PROFILE_RATE=str(1 << 40))
    r = subprocess.run(["ls", "/"], env=env, timeout=60, stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        fail(f"ls / exited {r.returncode}")
    written = sorted(p.name for p in work.glob("none.*"))
    if written:
        fail(f"a process with no sample wrote {written}")


def check_stray(lib: str, exe: str, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("stray.*"):
        old.unlink()
    env = dict(os.environ, LD_PRELOAD=lib, CORALLOC_PROFILE=str(work / "stray"),
               CORALLOC_PROFILE_RATE="1")
    r = subprocess.run([exe], env=env, timeout=60, stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        fail(f"{exe} exited {r.returncode}")
    files = sorted(work.glob("stray.*"))
    if len(files) != 1:
        fail(f"{len(files)} profiles written, not 1")
    prof = read_pprof.read(str(files[0]))
    if not prof.samples:
        fail("no sample in the profile")
    stray = [hex(loc.address) for loc in prof.locations.values() if loc.mapping_id == 0]
    if stray:
        fail(f"locations in no mapping (a stray frame kept): {stray}")
    print(f"stray frame: {len(prof.locations)} locations, none in no mapping")


def check_totals(lib: str, exe: str, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("totals*"):
        old.unlink()
    dump = work / "totals-dump"
    env = dict(os.environ, LD_PRELOAD=lib, CORALLOC_PROFILE=str(work / "totals"),
               CORALLOC_PROFILE_RATE="1")
    r = subprocess.run([exe, str(dump)], env=env, timeout=120, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail(f"{exe} exited {r.returncode}")
    name, alloc, inuse = r.stdout.split()
    prof = read_pprof.read(str(dump))
    for type_name, want in [("alloc_objects", int(alloc)), ("inuse_objects", int(inuse)),
                            ("alloc_space", int(alloc) * 4096),
                            ("inuse_space", int(inuse) * 4096)]:
        got = prof.totals_by(type_name, lambda fr: fr[0] if fr else None).get(name, 0)
        print(f"{type_name:13} {name}: {got} in the dump, {want} true")
        if got != want:
            fail(f"{type_name} of {name}: {got} in the dump, not {want}")


def find_pprof() -> str | None:
    found = shutil.which("pprof")
    if found:
        return found
    go = shutil.which("go")
    if go:
        gopath = subprocess.run([go, "env", "GOPATH"], capture_output=True, text=True).stdout.strip()
        cand = Path(gopath) / "bin" / "pprof"
        if cand.exists():
            return str(cand)
    return None


def check_pprof(path: Path) -> None:
    pprof = find_pprof()
    if pprof is None:
        print("SKIPPED: pprof is not installed (go install github.com/google/pprof@latest)")
        sys.exit(77)
    for index in ["alloc_space", "inuse_space"]:
        proc = subprocess.run([pprof, "-top", "-symbolize=none", f"-sample_index={index}",
                               str(path)], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            fail(f"pprof -top: {proc.stderr.strip()}")
        names = []
        rows = proc.stdout.splitlines()
        start = next(i for i, r in enumerate(rows) if r.strip().startswith("flat")) + 1
        for row in rows[start:]:
            parts = row.split()
            if len(parts) >= 6:
                names.append(parts[5])
        print(f"pprof -top ({index}): {names[:4]}")
        if names[:3] != SITES:
            fail(f"pprof -top by {index} names {names[:3]} first, not {SITES}")
    traces = subprocess.run([pprof, "-traces", "-symbolize=none", str(path)],
                            capture_output=True, text=True, timeout=120)
    if traces.returncode != 0 or "site_sixty" not in traces.stdout:
        fail(f"pprof -traces: {traces.stderr.strip()}")


def check_report(command: str, path: Path) -> None:
    proc = subprocess.run([command, "profile", str(path)], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        fail(f"coralloc profile exited {proc.returncode}: {proc.stderr.strip()}")
    print(proc.stdout)
    sections = proc.stdout.split("\n\n")[1:]
    if len(sections) != 2:
        fail("coralloc profile: not two sections (in use, allocated)")
    for section in sections:
        leaves = [line.split("blocks")[1].split("<")[0].strip()
                  for line in section.splitlines()[1:] if "blocks" in line]
        if leaves[:3] != SITES:
            fail(f"coralloc profile names {leaves[:3]} first, not {SITES}")


def main() -> int:
    lib, exe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if "--stray" in sys.argv[4:]:
        check_stray(lib, sys.argv[sys.argv.index("--stray") + 1], work)
        print("PASSED")
        return 0
    if "--totals" in sys.argv[4:]:
        check_totals(lib, sys.argv[sys.argv.index("--totals") + 1], work)
        print("PASSED")
        return 0
    path, truth = run_sites(lib, exe, work, small="--small" in sys.argv[4:])
    if "--pprof" in sys.argv[4:]:
        check_pprof(path)
    elif "--command" in sys.argv[4:]:
        check_report(sys.argv[sys.argv.index("--command") + 1], path)
    else:
        check_file(path, exe, truth)
        check_no_sample_no_file(lib, work)
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
