"""coralloc-bench: run / list / compare.

  coralloc-bench run [--profile quick|full] [--workloads A,B] [--allocs A,B]
                     [--alloc NAME=/path/lib.so] [--reps N] [--threads N] [--out DIR]
  coralloc-bench list
  coralloc-bench compare OLD.json NEW.json
  coralloc-bench calibrate [--profile quick|full] [--workloads A,B] [--write]
  coralloc-bench fastpath [--allocs A,B] [--scenarios A,B] [--out DIR] [--write-docs]

Errors in what the user gave (an unknown workload or allocator, a path that
is not a shared library, a bad number) are one line on stderr and exit 2.
`run` exits 1 when a run of coralloc failed, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from coralloc_bench import __version__
from coralloc_bench import allocators as allocs_mod
from coralloc_bench import fastpath as fastpath_mod
from coralloc_bench import programs
from coralloc_bench import workloads as wl_mod
from coralloc_bench.execute import (FAILED, Executor, Progress, RunContext, RunRecord,
                                    run_matrix)
from coralloc_bench.util import BenchError, repo_root

PROG = "coralloc-bench"
DEFAULT_REPS = {"quick": 3, "full": 5}
PROBE = "alloc-probe"
LAUNCHER = "run-measured"
WITNESS = "libmalloc-witness.so"


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage dump), via BenchError."""

    def error(self, message: str) -> NoReturn:
        raise BenchError(f"{message} (see `{self.prog} --help`)")


def _positive_int(what: str):  # type: ignore[no-untyped-def]
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a positive integer, not '{s}'")
        if v < 1:
            raise argparse.ArgumentTypeError(f"{what} must be a positive integer, not '{s}'")
        return v
    return parse


def _absolute(s: str) -> str:
    """A path option as an absolute path: programs run in other directories."""
    return os.path.abspath(s)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="coralloc's benchmark suite: our own workloads and "
                "real programs under every allocator, interleaved, with tables and charts.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{run,list,compare,calibrate,fastpath}",
                           parser_class=_Parser)
    sub.required = True

    r = sub.add_parser("run", help="run the benchmarks and write the report")
    r.add_argument("--profile", choices=wl_mod.PROFILES, default="quick",
                   help="quick (default, under 10 minutes on 2 cores) or full")
    r.add_argument("--suite", metavar="mimalloc-bench=PATH",
                   help="run the tests of a checkout of daanx/mimalloc-bench (its bench.sh "
                        "command lines, procs = --threads) instead of our workloads; "
                        "--workloads then names its tests (larsonN), families (larson) or "
                        "lists (tests_all1)")
    r.add_argument("--suite-build", metavar="DIR",
                   help="where the suite's programs are built (default: "
                        "<repo>/build-mimalloc-bench)")
    r.add_argument("--seed", type=int,
                   help="seed of the random allocator order of each repetition "
                        "(default: drawn, and recorded in results.json)")
    r.add_argument("--workloads", metavar="A,B",
                   help="workloads or groups to run (default: the profile's; see `list`)")
    r.add_argument("--allocs", metavar="A,B",
                   help="allocators to run (default: every one found)")
    r.add_argument("--alloc", metavar="NAME=/path/lib.so[,VAR=VALUE...]", action="append",
                   default=[], help="one more allocator to preload (repeatable), with "
                   "environment settings for its runs only (e.g. options)")
    r.add_argument("--coralloc-lib", metavar="PATH",
                   help="coralloc's library (default: <repo>/build/libcoralloc.so)")
    r.add_argument("--copies", type=_positive_int("--copies"), default=0, metavar="N",
                   help="also run N copies of coralloc under the names coralloc-copy1.. "
                        "(an A/A run): the report's 'Against the best peer' then says how "
                        "often coralloc lands above 1.05x of itself, the noise floor")
    r.add_argument("--reps", type=_positive_int("--reps"),
                   help="repetitions (default: 3 quick, 5 full)")
    r.add_argument("--threads", type=_positive_int("--threads"),
                   help="base thread count (default: the cores this process may use); "
                        "-x2 workloads run twice as many")
    r.add_argument("--out", metavar="DIR",
                   help="output directory (default: bench/results/<date-time>/)")
    r.add_argument("--baseline", default=allocs_mod.DEFAULT_BASELINE,
                   help="allocator the ratios are to (default: mimalloc3, mimalloc 3.4.3)")
    r.add_argument("--build-dir", metavar="DIR", type=_absolute,
                   help="where the workloads are built (default: <repo>/build/bench, "
                        "else <repo>/build-bench)")
    r.add_argument("--no-install", action="store_true",
                   help="do not apt-get install missing allocators or programs")
    r.add_argument("--no-charts", action="store_true", help="do not draw PNG charts")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    r.add_argument("--fastpath", action="store_true",
                   help="also count instructions per malloc+free under callgrind for every "
                        "allocator (`fastpath`), in the report")
    r.set_defaults(func=cmd_run)

    fp = sub.add_parser("fastpath", help="instructions per malloc+free under callgrind, for "
                        "every allocator")
    fp.add_argument("--allocs", metavar="A,B", help="allocators (default: every one found)")
    fp.add_argument("--alloc", metavar="NAME=/path/lib.so[,VAR=VALUE...]", action="append",
                    default=[])
    fp.add_argument("--coralloc-lib", metavar="PATH")
    fp.add_argument("--build-dir", metavar="DIR", type=_absolute,
                    help="the build whose libcoralloc.so is measured (default: <repo>/build)")
    fp.add_argument("--scenarios", metavar="A,B", help="pair16,pair64,pair512,batch64,mixed")
    fp.add_argument("--scale", type=float, default=1.0,
                    help="multiply every iteration count by this")
    fp.add_argument("--cc", default="cc", help="C compiler for fastpath.c (default: cc)")
    fp.add_argument("--out", metavar="DIR", help="write fastpath.md and fastpath.json there")
    fp.add_argument("--write-docs", action="store_true",
                    help="put the table at the top of docs/FASTPATH.md")
    fp.add_argument("--no-install", action="store_true")
    fp.set_defaults(func=cmd_fastpath)

    ls = sub.add_parser("list", help="name the workloads and the allocators found")
    ls.add_argument("--alloc", metavar="NAME=/path/lib.so", action="append", default=[])
    ls.add_argument("--coralloc-lib", metavar="PATH")
    ls.add_argument("--build-dir", metavar="DIR", type=_absolute)
    ls.set_defaults(func=cmd_list)

    cal = sub.add_parser("calibrate", help="time each workload under the baseline allocator "
                         "(is every one long enough?)")
    cal.add_argument("--profile", choices=wl_mod.PROFILES, default="quick")
    cal.add_argument("--workloads", metavar="A,B")
    cal.add_argument("--alloc", metavar="NAME=/path/lib.so", action="append", default=[])
    cal.add_argument("--baseline", default=allocs_mod.DEFAULT_BASELINE,
                     help="the allocator to time under (default: mimalloc3)")
    cal.add_argument("--reps", type=_positive_int("--reps"), default=3)
    cal.add_argument("--threads", type=_positive_int("--threads"))
    cal.add_argument("--build-dir", metavar="DIR", type=_absolute)
    cal.add_argument("--no-install", action="store_true")
    cal.add_argument("--quiet", action="store_true")
    cal.add_argument("--write", action="store_true",
                     help="record the times in the package's data/calibration-PROFILE.json")
    cal.add_argument("--from", dest="from_results", metavar="RESULTS.json",
                     help="take the times from a recorded run instead of running")
    cal.set_defaults(func=cmd_calibrate)

    m = sub.add_parser("merge", help="one report from several runs of the same allocators "
                       "(a suite run in parts, or one command per repetition with other "
                       "seeds, each under the time limit of a timed command)")
    m.add_argument("results", metavar="RESULTS.json", nargs="+")
    m.add_argument("--out", metavar="DIR", required=True,
                   help="where to write the merged results.json, report.md and charts")
    m.add_argument("--no-charts", action="store_true")
    m.set_defaults(func=cmd_merge)

    c = sub.add_parser("compare", help="ratios between two results.json files (NEW/OLD)")
    c.add_argument("old", metavar="OLD.json")
    c.add_argument("new", metavar="NEW.json")
    c.add_argument("--metrics", default="time,rss,figure",
                   help="figures to compare (time,figure,rss,user,sys,minflt,traps,majflt)")
    c.set_defaults(func=cmd_compare)
    return p


def _log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def threads_default() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def bin_dir(build_dir: Optional[str], root: Path) -> Path:
    """The directory with the built workloads."""
    if build_dir:
        cands = [Path(build_dir) / "bench", Path(build_dir)]
    else:
        env = os.environ.get("CORALLOC_BENCH_BUILD")
        cands = ([Path(env)] if env else []) + [root / "build" / "bench", root / "build-bench"]
    for c in cands:
        if (c / PROBE).is_file():
            return c.resolve()
    raise BenchError(f"the workloads are not built (no {PROBE} in "
                     f"{', '.join(str(c) for c in cands)}): run `make build`, or "
                     f"`cmake -S bench -B build-bench && cmake --build build-bench`")


def make_context(bdir: Path, profile: str, threads: int, work: Path) -> RunContext:
    """The context of runs from the workloads built in bdir: the launcher
    and the malloc witness when they are built."""
    launcher, witness = bdir / LAUNCHER, bdir / WITNESS
    return RunContext(bdir, profile, threads, work, launcher if launcher.is_file() else None,
                      witness if witness.is_file() else None)


def _coralloc_build_root(root: Path, build_dir: Optional[str]) -> Path:
    """Where libcoralloc.so is, as an absolute path (a relative --build-dir
    would give a relative LD_PRELOAD, which programs started in another
    directory cannot load)."""
    if build_dir and (Path(build_dir) / "libcoralloc.so").is_file():
        return Path(build_dir).resolve()
    return root / "build"


def machine_info() -> Dict[str, object]:
    info: Dict[str, object] = {}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info["cores"] = os.cpu_count() or 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1048576, 1)
                break
    except OSError:
        pass
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                info["os"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    info["kernel"] = platform.release()
    info["glibc"] = allocs_mod.glibc_version()
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
        info["thp"] = thp.split("[")[1].split("]")[0] if "[" in thp else thp
    except (OSError, IndexError):
        pass
    return info



def resolve_out_dir(out: Optional[str], root: Path) -> Path:
    """The results directory, absolute: programs run with their own working
    directory (redis-server gets --dir inside it), so a relative --out must
    not be resolved again from there."""
    if out:
        return Path(out).resolve()
    return root / "bench" / "results" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")

def suite_workloads(spec: str, select: Optional[str], threads: int, build: Optional[str],
                    install: bool, root: Path
                    ) -> Tuple[List[wl_mod.Workload], Dict[str, Executor], Dict[str, object]]:
    """--suite mimalloc-bench=PATH: its tests as workloads, their runners, and
    what results.json says of the suite (checkout, commit, procs, the tests
    not run and why)."""
    from coralloc_bench import mimalloc_bench as mb
    name, sep, path = spec.partition("=")
    if name != mb.NAME or not sep or not path:
        raise BenchError(f"--suite takes {mb.NAME}=PATH (a checkout of daanx/mimalloc-bench), "
                         f"not '{spec}'")
    checkout = Path(path).resolve()
    suite = mb.read_suite(checkout, threads)
    tests = mb.select(suite, select)
    state = Path(build).resolve() if build else root / "build-mimalloc-bench"
    sdir, gone = mb.build(checkout, state, [t.program for t in tests if t.program], _log)
    skipped = dict(suite.skipped)
    for t in tests:
        if t.program in gone:
            skipped[t.name] = f"{t.program} not built: {gone[t.program]}"
    skipped.update(mb.install_programs(tests, install, _log, allocs_mod.apt_install))
    tests = [t for t in tests if t.name not in skipped]
    if not tests:
        raise BenchError(f"no {mb.NAME} test left to run: " +
                         "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    for k, v in skipped.items():
        _log(f"{mb.NAME}: {k} not run: {v}")
    chosen, executors = mb.workloads(suite, sdir)
    chosen = [w for w in chosen if w.name in {t.name for t in tests}]
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    meta: Dict[str, object] = {
        "name": mb.NAME, "checkout": str(checkout), "commit": commit, "procs": threads,
        "build": str(sdir), "not_run": skipped,
        "derived_times": {t.name: t.derivation.regex for t in tests if t.derivation}}
    return chosen, executors, meta


def cmd_run(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    root = repo_root()
    profile: str = args.profile
    threads: int = args.threads or threads_default()
    executors: Dict[str, Executor] = {}
    suite_meta: Dict[str, object] = {}
    if args.suite:
        chosen, executors, suite_meta = suite_workloads(
            args.suite, args.workloads, threads, args.suite_build, not args.no_install, root)
    else:
        chosen = wl_mod.select(args.workloads, profile)
    reps: int = args.reps or DEFAULT_REPS[profile]
    if args.baseline not in allocs_mod.KNOWN and not any(
            s.partition("=")[0] == args.baseline for s in args.alloc):
        raise BenchError(f"unknown baseline allocator '{args.baseline}'")
    bdir = bin_dir(args.build_dir, root)
    missing = sorted({w.program for w in chosen if not w.is_real and w.name not in executors
                      and not (bdir / w.program).is_file()})
    if missing:
        raise BenchError(f"workload programs missing in {bdir}: {', '.join(missing)} "
                         f"(rebuild: `make build`)")
    user_names = [s.partition("=")[0] for s in args.alloc]
    allocs_mod.check_names(args.allocs, user_names)
    if args.copies and args.allocs and "coralloc" not in args.allocs.split(","):
        raise BenchError("--copies repeats coralloc, which --allocs leaves out")
    install = not args.no_install
    missing_allocs: Dict[str, str] = {}
    found = allocs_mod.discover(args.coralloc_lib, args.alloc,
                                _coralloc_build_root(root, args.build_dir), install, _log,
                                missing_allocs)
    alloc_list = allocs_mod.select(args.allocs, found, user_names, _log)
    if args.copies:
        original = next((a for a in alloc_list if a.name == "coralloc"), None)
        if original is None:
            raise BenchError("--copies repeats coralloc, which this run does not include")
        alloc_list += allocs_mod.copies(original, args.copies)

    real = [w.program for w in chosen if w.is_real]
    if real and install:
        need = programs.missing_packages(real)
        if need and not allocs_mod.apt_install(need, _log):
            _log(f"missing programs ({' '.join(need)}): their workloads are skipped")

    # prove each allocator serves the calls before trusting its numbers
    blocked: Dict[str, str] = {}
    for a in alloc_list:
        res = allocs_mod.verify(a, bdir / PROBE)
        if res.ok:
            extra = f" ({'; '.join(res.notes)})" if res.notes else ""
            _log(f"{a.name}: verified, malloc is {res.symbols.get('malloc', '?')}{extra}")
        else:
            _log(f"{a.name}: NOT verified: {res.reason}; its runs are reported as failed")
            blocked[a.name] = f"allocator not verified: {res.reason}"

    seed: int = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    out_dir = resolve_out_dir(args.out, root)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "work").mkdir(exist_ok=True)
    except OSError as e:
        raise BenchError(f"cannot create {out_dir}: {e}") from None
    baseline = args.baseline if args.baseline in [a.name for a in alloc_list] else \
        next((n for n in allocs_mod.BASELINE_FALLBACKS if n in [a.name for a in alloc_list]),
             alloc_list[0].name)
    if baseline != args.baseline:
        _log(f"baseline {args.baseline} is not run; ratios are to {baseline}")

    meta: Dict[str, object] = {
        "tool": f"{PROG} {__version__}",
        "command": " ".join(shlex.quote(a) for a in [PROG, *sys.argv[1:]])
        if sys.argv and sys.argv[0] else PROG,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "profile": suite_meta.get("name", profile), "reps": reps, "threads": threads,
        "baseline": baseline, "seed": seed,
        "machine": machine_info(),
        "allocators": {a.name: a.to_json() for a in alloc_list},
        "missing_allocators": missing_allocs,
        **({"suite": suite_meta} if suite_meta else {}),
        "workloads": {w.name: {"description": w.description, "program": w.program,
                               "threads": w.threads_used(threads),
                               "args": w.argv_tail(profile, threads)} for w in chosen},
    }
    ctx = make_context(bdir, profile, threads, out_dir / "work")
    launcher = bdir / LAUNCHER
    if ctx.launcher is None:
        _log(f"{launcher} is not built: peak RSS will include the runner's own size")
    records: List[RunRecord] = []

    from coralloc_bench import report

    def save(rec: Optional[RunRecord] = None) -> None:
        if rec is not None:
            records.append(rec)
        report.write_json(out_dir / "results.json", meta, records)

    total = len(chosen) * len(alloc_list) * reps
    _log(f"{suite_meta.get('name', profile)}: {len(chosen)} workloads x {len(alloc_list)} allocators "
         f"({', '.join(a.name for a in alloc_list)}) x {reps} reps = {total} runs, "
         f"{threads} threads; writing {out_dir}")
    progress = Progress(total, quiet=args.quiet)
    interrupted = False
    try:
        run_matrix(chosen, alloc_list, reps, ctx, progress, executors=executors,
                   on_record=save, blocked=blocked, executor_for=programs.executor_for,
                   seed=seed)
    except KeyboardInterrupt:
        interrupted = True
        _log("interrupted: writing what has run so far")
    finally:
        progress.close()
    if args.fastpath and not interrupted:
        ok = [a for a in alloc_list if a.name not in blocked]
        meta["fastpath"] = dataclasses.asdict(fastpath_section(ok, None, 1.0, "cc"))
    meta["total_seconds"] = round(time.monotonic() - t_start, 1)
    save()
    report.write_csv(out_dir / "results.csv", records)
    charts: List[str] = []
    if not args.no_charts and records:
        from coralloc_bench import charts as charts_mod
        if charts_mod.available():
            charts = charts_mod.draw(records, meta, baseline, out_dir)
        else:
            _log("matplotlib is not installed: no charts (pip install matplotlib)")
    (out_dir / "report.md").write_text(report.markdown_report(records, meta, baseline, charts))
    shutil.rmtree(out_dir / "work", ignore_errors=True)
    if records:
        print(report.terminal_report(records, meta, baseline))
    print(f"\n{len(records)} runs in {meta['total_seconds']} s; report: {out_dir / 'report.md'}"
          f"; results: {out_dir / 'results.json'}")
    if interrupted:
        return 130
    code = exit_code_for(records)
    if code:
        _log(f"{code_failures(records)} run(s) of coralloc failed")
    return code


def code_failures(records: Sequence[RunRecord]) -> int:
    return sum(1 for r in records if r.allocator == "coralloc" and r.status == FAILED)


def exit_code_for(records: Sequence[RunRecord]) -> int:
    """1 when a run of coralloc failed (crash, wrong result, not verified)."""
    return 1 if code_failures(records) else 0


def cmd_list(args: argparse.Namespace) -> int:
    root = repo_root()
    print("workloads (profiles; threads: T = --threads, default the cores):")
    width = max(len(w.name) for w in wl_mod.WORKLOADS)
    for w in wl_mod.WORKLOADS:
        th = {0: "1", 1: "T"}.get(w.thread_factor, f"{w.thread_factor}T")
        print(f"  {w.name:<{width}}  {'+'.join(w.profiles) or 'by name':<10}  {th:>2}  {w.description}")
    print(f"  groups: {', '.join(sorted(wl_mod.GROUPS))}")
    missing: Dict[str, str] = {}
    found = allocs_mod.discover(args.coralloc_lib, args.alloc,
                                _coralloc_build_root(root, args.build_dir), False,
                                lambda s: None, missing)
    try:
        probe: Optional[Path] = bin_dir(args.build_dir, root) / PROBE
    except BenchError:
        probe = None
    print("allocators:")
    for name in allocs_mod.order(list(found)):
        a = found[name]
        state = "not verified (workloads not built)"
        if probe is not None:
            res = allocs_mod.verify(a, probe)
            state = "verified" if res.ok else f"NOT verified: {res.reason}"
        ver = f" {a.version}" if a.version else ""
        print(f"  {name:<10} {a.path or 'glibc (no preload)'}{ver}  [{state}]")
    for name, why in missing.items():
        print(f"  {name:<10} missing: {why}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    import tempfile

    from tabulate import tabulate

    from coralloc_bench import calibrate
    root = repo_root()
    profile: str = args.profile
    if args.from_results:
        from coralloc_bench import report
        meta, records = report.load_results(args.from_results)
        profile = str(meta.get("profile") or profile)
        results = calibrate.from_records(records, meta, args.baseline)
        am = meta.get("allocators")
        info = am.get(args.baseline) if isinstance(am, dict) else None
        version = str(info.get("version", "")) if isinstance(info, dict) else ""
        alloc = allocs_mod.Allocator(args.baseline, None, "recorded", version=version)
        if not results:
            raise BenchError(f"{args.from_results}: no workload recorded")
    else:
        chosen = wl_mod.select(args.workloads, profile)
        threads: int = args.threads or threads_default()
        bdir = bin_dir(args.build_dir, root)
        found = allocs_mod.discover(None, args.alloc, _coralloc_build_root(root, args.build_dir),
                                    not args.no_install, _log)
        if args.baseline not in found:
            raise BenchError(f"allocator '{args.baseline}' is not available here")
        alloc = found[args.baseline]
        res = allocs_mod.verify(alloc, bdir / PROBE)
        if not res.ok:
            raise BenchError(f"{alloc.name} not verified: {res.reason}")
        with tempfile.TemporaryDirectory(prefix="coralloc-calibrate-") as tmp:
            ctx = make_context(bdir, profile, threads, Path(tmp))
            results = calibrate.measure(chosen, alloc, args.reps, ctx, args.quiet)
    print(tabulate(calibrate.lines(results),
                   headers=["workload", f"wall s ({alloc.name})",
                            f"x to {calibrate.TARGET_SECONDS} s", ""]))
    if args.write:
        path = calibrate.calibration_file(profile)
        old = calibrate.load(profile) or {}
        merged = dict(old.get("workloads") or {}) if args.workloads else {}  # type: ignore[call-overload]
        merged.update(results)
        data = {"allocator": f"{alloc.name} {alloc.version}", "profile": profile,
                "reps": args.reps, "date": _dt.datetime.now().astimezone().isoformat(
                    timespec="seconds"),
                "command": " ".join(shlex.quote(a) for a in [PROG, *sys.argv[1:]]),
                "machine": machine_info(), "workloads": merged}
        import json
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


def _fastpath_allocs(args: argparse.Namespace, root: Path) -> List[allocs_mod.Allocator]:
    allocs_mod.check_names(args.allocs, [s.partition("=")[0] for s in args.alloc])
    found = allocs_mod.discover(args.coralloc_lib, args.alloc,
                                _coralloc_build_root(root, args.build_dir), not args.no_install,
                                _log)
    return allocs_mod.select(args.allocs, found, [s.partition("=")[0] for s in args.alloc], _log)


def fastpath_section(allocs: Sequence[allocs_mod.Allocator], scenarios: Optional[str],
                     scale: float, cc: str) -> "fastpath_mod.Section":
    """Run the fastpath counts; the table (markdown) and figures for a report."""
    fastpath = fastpath_mod
    names = [x.strip() for x in (scenarios or "").split(",") if x.strip()]
    for n in names:
        if n not in fastpath.BY_NAME:
            raise BenchError(f"unknown scenario '{n}' (known: {', '.join(fastpath.BY_NAME)})")
    scens = [fastpath.BY_NAME[n] for n in names] if names else fastpath.SCENARIOS
    results, notes = fastpath.run(allocs, scens, scale, cc, _log)
    order = [a.name for a in allocs]
    return fastpath.Section(fastpath.table(results, order, scens),
                            fastpath.table(results, order, scens, tablefmt="simple"), notes,
                            fastpath.to_json(results))


def cmd_fastpath(args: argparse.Namespace) -> int:
    import json
    root = repo_root()
    allocs = _fastpath_allocs(args, root)
    sec = fastpath_section(allocs, args.scenarios, args.scale, args.cc)
    print(sec.text)
    command = " ".join(shlex.quote(a) for a in [PROG, *sys.argv[1:]])
    md = (f"Instructions per malloc+free (callgrind), `{command}`, "
          f"{_dt.date.today().isoformat()}:\n\n{sec.table}\n")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fastpath.md").write_text(md)
        (out / "fastpath.json").write_text(json.dumps(
            {"command": command, "allocators": {a.name: a.to_json() for a in allocs},
             "per_block": sec.figures, "notes": sec.notes}, indent=1) + "\n")
        print(f"wrote {out / 'fastpath.md'}")
    if args.write_docs:
        doc = root / "docs" / "FASTPATH.md"
        old = doc.read_text() if doc.is_file() else ""
        rest = old[old.index("## What is measured"):] if "## What is measured" in old else ""
        vers = ", ".join(f"{a.name} {a.version}" for a in allocs if a.version)
        doc.write_text(
            f"# Fast-path instruction counts\n\nInstructions per `malloc`+`free`, counted by "
            f"`valgrind --tool=callgrind`. Produced on {_dt.date.today().isoformat()} by\n\n"
            f"```sh\n{command}\n```\n\n{sec.table}\n\nLower is better; **bold** marks "
            f"the best peer on each row; \"coralloc / best peer\" is below 1.00 where coralloc "
            f"does better. Versions: {vers}.\n\n" +
            "".join(f"- {n}\n" for n in sec.notes) + ("\n" if sec.notes else "") + rest)
        print(f"wrote {doc}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    """Runs under the same allocators, as one run: runs of other workloads
    side by side, runs of the same workloads (other seeds) as further
    repetitions, the workloads and the suite's notes joined; the first
    file's metadata otherwise (its command, machine, baseline)."""
    from coralloc_bench import report
    meta, records = report.merge_results([report.load_results(p) for p in args.results])
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    meta["merged_from"] = [str(Path(p).resolve()) for p in args.results]
    report.write_json(out / "results.json", meta, records)
    report.write_csv(out / "results.csv", records)
    baseline = report.pick_baseline(str(meta.get("baseline") or ""), report.layout(records,
                                                                                  meta)[1])
    charts: List[str] = []
    if not args.no_charts:
        from coralloc_bench import charts as charts_mod
        if charts_mod.available():
            charts = charts_mod.draw(records, meta, baseline, out)
    (out / "report.md").write_text(report.markdown_report(records, meta, baseline, charts))
    print(report.terminal_report(records, meta, baseline))
    print(f"\n{len(records)} runs merged; report: {out / 'report.md'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from coralloc_bench import report
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    for m in metrics:
        if m not in report.METRIC_BY_KEY:
            raise BenchError(f"unknown metric '{m}' (known: {', '.join(report.METRIC_BY_KEY)})")
    print(report.compare(args.old, args.new, metrics))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except BenchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
