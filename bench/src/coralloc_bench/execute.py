"""Running one measured process, judging its output, and running the whole
matrix interleaved (rep k of every workload under every allocator before any
rep k+1)."""

from __future__ import annotations

import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from coralloc_bench.allocators import Allocator
from coralloc_bench.workloads import Workload

OK = "ok"
FAILED = "failed"
SKIPPED = "skipped"


@dataclass
class Outcome:
    """What the kernel says about one finished process."""
    exit_status: Optional[int]  # exit code, or -signal when killed; None: not run
    wall_s: float
    user_s: float
    sys_s: float
    max_rss_kib: int
    minor_faults: int
    major_faults: int
    stdout: str
    stderr: str
    timed_out: bool = False
    # Page faults that trapped (perf's page-faults event), from the launcher;
    # None when not measured (no launcher, or perf_event_open refused).
    fault_traps: Optional[int] = None
    # The cache-line round trip between two CPUs just before and just after
    # the run, from the launcher (a state of the machine, see run-measured.c);
    # None when not measured (no launcher, one CPU, CORALLOC_BENCH_NO_RTT).
    rtt_before_ns: Optional[float] = None
    rtt_after_ns: Optional[float] = None


@dataclass
class Check:
    ok: bool
    reason: str = ""
    figure_name: str = ""
    figure: Optional[float] = None
    figures: Dict[str, float] = field(default_factory=dict)
    served_by: str = ""
    # The time a suite counts for this run when it is not the wall time
    # (mimalloc-bench's bench.sh derives some from the program's output).
    time_s: Optional[float] = None


@dataclass
class RunRecord:
    """One run: one record of results.json."""
    workload: str
    allocator: str
    rep: int
    status: str  # ok / failed / skipped
    reason: str
    exit_status: Optional[int]
    wall_s: Optional[float]
    user_s: Optional[float]
    sys_s: Optional[float]
    max_rss_kib: Optional[int]
    minor_faults: Optional[int]
    major_faults: Optional[int]
    figure_name: str
    figure: Optional[float]
    figures: Dict[str, float]
    threads: int
    profile: str
    command: List[str]
    started: float
    served_by: str = ""
    # None: not measured (see Outcome.fault_traps); never a stand-in 0.
    fault_traps: Optional[int] = None
    # None: not measured (see Outcome.rtt_before_ns).
    rtt_before_ns: Optional[float] = None
    rtt_after_ns: Optional[float] = None
    # The time the suite counts when it is not wall_s (see Check.time_s);
    # None: the wall time is the time.
    time_s: Optional[float] = None

    def to_json(self) -> Dict[str, object]:
        return asdict(self)

    @staticmethod
    def from_json(d: Dict[str, object]) -> "RunRecord":
        fields = RunRecord.__dataclass_fields__
        kw = {k: d.get(k) for k in fields}
        kw["figures"] = dict(d.get("figures") or {})  # type: ignore[call-overload]
        kw["command"] = list(d.get("command") or [])  # type: ignore[call-overload]
        kw["served_by"] = str(d.get("served_by") or "")
        kw["reason"] = str(d.get("reason") or "")
        kw["figure_name"] = str(d.get("figure_name") or "")
        traps = d.get("fault_traps")
        kw["fault_traps"] = int(traps) if isinstance(traps, (int, float)) else None
        for k in ("rtt_before_ns", "rtt_after_ns", "time_s"):
            v = d.get(k)
            kw[k] = float(v) if isinstance(v, (int, float)) else None
        return RunRecord(**kw)  # type: ignore[arg-type]


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Spawned:
    """A measured process, started in a new session (its own process group,
    killed as a whole on a timeout).

    With `launcher` (the run-measured program) the program is started by that
    small launcher, which reports the program's own rusage: a process forked
    straight from this Python runner would carry the runner's RSS high-water
    mark into its ru_maxrss at exec. Without it, os.wait4 on the program
    itself gives the numbers (peak RSS then includes the runner's size)."""

    def __init__(self, argv: Sequence[str], env: Dict[str, str], stdin_path: Optional[str] = None,
                 cwd: Optional[str] = None, launcher: Optional[Path] = None) -> None:
        self.argv = list(argv)
        self._out = tempfile.TemporaryFile()
        self._err = tempfile.TemporaryFile()
        self._report: Optional[str] = None
        self.status: Optional[int] = None
        self.rusage: Optional[os.struct_rusage] = None  # type: ignore[name-defined]
        self.timed_out = False
        run_argv, run_env = self.argv, env
        if launcher is not None:
            fd, self._report = tempfile.mkstemp(prefix="coralloc-bench-", suffix=".rusage")
            os.close(fd)
            run_argv = [str(launcher), self._report, *self.argv]
            run_env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
            run_env["CORALLOC_BENCH_PRELOAD"] = env.get("LD_PRELOAD", "")
        self.t0 = time.perf_counter()
        self.t_end = 0.0
        with open(stdin_path or os.devnull, "rb") as inp:
            try:
                self.proc: Optional[subprocess.Popen[bytes]] = subprocess.Popen(
                    run_argv, env=run_env, stdin=inp, stdout=self._out, stderr=self._err,
                    cwd=cwd, start_new_session=True)
                self.error = ""
            except OSError as e:
                self.proc = None
                self.error = f"cannot start {self.argv[0]}: {e}"
        self.launched = launcher is not None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    def program_pid(self) -> Optional[int]:
        """The measured program's pid (the launcher's child when launched)."""
        if self.proc is None:
            return None
        if not self.launched:
            return self.proc.pid
        try:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            return int(kids.split()[0]) if kids.split() else None
        except (OSError, ValueError):
            return None

    def _reaped(self, status: int, ru: "os.struct_rusage") -> None:  # type: ignore[name-defined]
        self.t_end = time.perf_counter()
        self.status = os.waitstatus_to_exitcode(status)
        self.rusage = ru
        if self.proc is not None:
            self.proc.returncode = self.status  # reaped here; keep Popen from waiting again
        _kill_group(self.pid)  # anything the program left in its group

    def poll(self) -> bool:
        """True once the process has ended (reaping it)."""
        if self.proc is None or self.status is not None:
            return True
        pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
        if pid == 0:
            return False
        self._reaped(status, ru)
        return True

    def kill(self) -> None:
        if self.proc is not None and self.status is None:
            _kill_group(self.proc.pid)

    def wait(self, timeout: float) -> Outcome:
        if self.proc is not None and self.status is None:
            left = max(0.0, timeout - (time.perf_counter() - self.t0))

            def on_timeout() -> None:
                self.timed_out = True
                self.kill()

            timer = threading.Timer(left, on_timeout)
            timer.daemon = True
            timer.start()
            try:
                while True:
                    try:
                        _, status, ru = os.wait4(self.proc.pid, 0)
                        break
                    except InterruptedError:
                        continue
                    except KeyboardInterrupt:
                        self.kill()
                        os.wait4(self.proc.pid, 0)
                        self.proc.returncode = -signal.SIGKILL
                        self.close()
                        raise
            finally:
                timer.cancel()
            self._reaped(status, ru)
        return self.outcome()

    def outcome(self) -> Outcome:
        self._out.seek(0)
        self._err.seek(0)
        stdout = self._out.read().decode(errors="replace")
        stderr = self._err.read().decode(errors="replace")
        if self.proc is None or self.rusage is None or self.status is None:
            self.close()
            return Outcome(None, 0.0, 0.0, 0.0, 0, 0, 0, stdout, self.error or stderr)
        ru = self.rusage
        o = Outcome(self.status, self.t_end - self.t0, ru.ru_utime, ru.ru_stime, ru.ru_maxrss,
                    ru.ru_minflt, ru.ru_majflt, stdout, stderr, self.timed_out)
        if self._report is not None:
            rep = parse_launcher_report(self._report)
            if rep is not None and not self.timed_out:
                o.exit_status = int(rep["status"])
                o.wall_s, o.user_s, o.sys_s = rep["wall"], rep["user"], rep["sys"]
                o.max_rss_kib = int(rep["maxrss_kib"])
                o.minor_faults, o.major_faults = int(rep["minflt"]), int(rep["majflt"])
                if "fault_traps" in rep:
                    o.fault_traps = int(rep["fault_traps"])
                if "rtt_before_ns" in rep and "rtt_after_ns" in rep:
                    o.rtt_before_ns, o.rtt_after_ns = rep["rtt_before_ns"], rep["rtt_after_ns"]
            elif not self.timed_out and o.exit_status is not None and o.exit_status >= 0:
                # the launcher itself failed (cannot start the program...)
                o.exit_status = o.exit_status or 125
        self.close()
        return o

    def close(self) -> None:
        self._out.close()
        self._err.close()
        if self._report is not None:
            try:
                os.unlink(self._report)
            except OSError:
                pass
            self._report = None


def parse_launcher_report(path: str) -> Optional[Dict[str, float]]:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return parse_launcher_line(text)


def parse_launcher_line(text: str) -> Optional[Dict[str, float]]:
    """The launcher's report line as numbers, None when garbled or when a
    field every report has is missing. fault_traps is optional: the launcher
    leaves it out when the kernel would not count; so are rtt_before_ns and
    rtt_after_ns (see run-measured.c)."""
    vals: Dict[str, float] = {}
    for item in text.split():
        k, sep, v = item.partition("=")
        try:
            vals[k] = float(v)
        except ValueError:
            return None
    need = ("status", "wall", "user", "sys", "maxrss_kib", "minflt", "majflt")
    return vals if all(k in vals for k in need) else None


def measure(argv: Sequence[str], env: Dict[str, str], timeout: float,
            stdin_path: Optional[str] = None, cwd: Optional[str] = None,
            launcher: Optional[Path] = None) -> Outcome:
    """Run argv to completion and take its rusage (see Spawned). Output goes
    to temporary files (no pipe to fill up). Past `timeout` seconds the
    process group is killed and the outcome is marked timed out."""
    return Spawned(argv, env, stdin_path, cwd, launcher).wait(timeout)


def parse_result_line(stdout: str) -> Tuple[Optional[str], Dict[str, float], str]:
    """The workload's "result: name=value [name=value ...]" line: the first
    figure's name, all figures, and an error when the line is missing or bad."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("result:")]
    if len(lines) != 1:
        return None, {}, ("no result line" if not lines else f"{len(lines)} result lines")
    figures: Dict[str, float] = {}
    first: Optional[str] = None
    for item in lines[0][len("result:"):].split():
        name, sep, value = item.partition("=")
        try:
            v = float(value)
        except ValueError:
            return None, {}, f"bad result item '{item}'"
        if not sep or not math.isfinite(v):
            return None, {}, f"bad result item '{item}'"
        figures[name] = v
        if first is None:
            first = name
    if first is None:
        return None, {}, "empty result line"
    return first, figures, ""


def info_value(stdout: str, key: str) -> Optional[str]:
    for ln in stdout.splitlines():
        if ln.startswith("info:"):
            for item in ln[5:].split():
                k, sep, v = item.partition("=")
                if sep and k == key:
                    return v
    return None


def failure_reason(o: Outcome, timeout: float) -> Optional[str]:
    """Why a finished process is a failure, from its exit alone (None: exit 0)."""
    if o.exit_status is None:
        return o.stderr.strip() or "not started"
    if o.timed_out:
        return f"timeout after {timeout:.0f} s"
    if o.exit_status < 0:
        return f"killed by {signal_name(-o.exit_status)}"
    if o.exit_status != 0:
        msg = [ln.strip() for ln in o.stderr.splitlines()
               if "CHECK FAILED" in ln or "OUT OF MEMORY" in ln or "error" in ln.lower()]
        tail = msg[0] if msg else (o.stderr.strip().splitlines() or [""])[-1].strip()
        return f"exit {o.exit_status}" + (f": {tail[:200]}" if tail else "")
    return None


def check_workload_output(o: Outcome, alloc: Allocator, timeout: float) -> Check:
    """The rule for our own workloads: exit 0, one good result line with a
    positive first figure, and a malloc_lib line naming the allocator under
    test (a run that does not say who served malloc proves nothing)."""
    why = failure_reason(o, timeout)
    if why:
        return Check(False, why)
    name, figures, err = parse_result_line(o.stdout)
    if name is None:
        return Check(False, err)
    if figures[name] <= 0:
        return Check(False, f"{name}={figures[name]} is not a positive figure")
    lib = info_value(o.stdout, "malloc_lib")
    if lib is None:
        return Check(False, "no 'info: malloc_lib=' line: who served malloc is unknown")
    if not alloc.serves(lib):
        want = "libc" if alloc.path is None else os.path.basename(alloc.path)
        return Check(False, f"malloc served by {lib}, not {want}", name, figures[name], figures,
                     lib)
    return Check(True, "", name, figures[name], figures, lib)


@dataclass
class RunContext:
    bin_dir: Path
    profile: str
    threads: int
    work_dir: Path  # for generated inputs (sqlite script...)
    launcher: Optional[Path] = None  # run-measured, when built
    witness: Optional[Path] = None  # libmalloc-witness.so, when built (real programs)


# A runner for one (workload, allocator) run: returns the Outcome and Check.
Executor = Callable[[Workload, Allocator, RunContext, float], Tuple[Outcome, Check, List[str]]]


def run_c_workload(w: Workload, alloc: Allocator, ctx: RunContext,
                   timeout: float) -> Tuple[Outcome, Check, List[str]]:
    prog = Path(w.program) if os.path.isabs(w.program) else ctx.bin_dir / w.program
    argv = [str(prog), *w.argv_tail(ctx.profile, ctx.threads)]
    o = measure(argv, alloc.env(), timeout, launcher=ctx.launcher)
    return o, check_workload_output(o, alloc, timeout), argv


def run_one(w: Workload, alloc: Allocator, rep: int, ctx: RunContext,
            executor: Executor) -> RunRecord:
    timeout = w.timeout.get(ctx.profile, 300.0)
    started = time.time()
    o, c, argv = executor(w, alloc, ctx, timeout)
    status = OK if c.ok else (SKIPPED if c.reason.startswith("skipped") else FAILED)
    ran = o.exit_status is not None
    return RunRecord(
        workload=w.name, allocator=alloc.name, rep=rep, status=status, reason=c.reason,
        exit_status=o.exit_status,
        wall_s=o.wall_s if ran else None, user_s=o.user_s if ran else None,
        sys_s=o.sys_s if ran else None, max_rss_kib=o.max_rss_kib if ran else None,
        minor_faults=o.minor_faults if ran else None,
        major_faults=o.major_faults if ran else None,
        fault_traps=o.fault_traps if ran else None,
        rtt_before_ns=o.rtt_before_ns if ran else None,
        rtt_after_ns=o.rtt_after_ns if ran else None,
        figure_name=c.figure_name, figure=c.figure if c.ok else None, figures=c.figures,
        threads=w.threads_used(ctx.threads), profile=ctx.profile, command=argv,
        started=started, served_by=c.served_by, time_s=c.time_s if c.ok else None)


class Progress:
    """tqdm progress bar on a terminal (what runs now, time left); one line
    per run otherwise; nothing when quiet."""

    def __init__(self, total: int, quiet: bool = False, stream: TextIO = sys.stderr) -> None:
        self.total = total
        self.done = 0
        self.quiet = quiet
        self.stream = stream
        self.bar: object = None
        self.t0 = time.monotonic()
        if not quiet and stream.isatty():
            try:
                from tqdm import tqdm
                size = shutil.get_terminal_size((100, 20))
                self.bar = tqdm(total=total, file=stream, unit="run",
                                ncols=size.columns if size.columns > 20 else 100,
                                nrows=size.lines if size.lines > 2 else 20, mininterval=0.5,
                                bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}"
                                           " [{elapsed}<{remaining}]")
            except ImportError:
                self.bar = None

    def start(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(what[:40])  # type: ignore[attr-defined]

    def finish(self, rec: RunRecord) -> None:
        self.done += 1
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(1)  # type: ignore[attr-defined]
            if rec.status == FAILED:
                self.bar.write(f"FAILED {rec.workload} / {rec.allocator} rep {rec.rep}: "  # type: ignore[attr-defined]
                               f"{rec.reason}")
            return
        elapsed = time.monotonic() - self.t0
        left = elapsed / self.done * (self.total - self.done)
        res = f"{rec.wall_s:.3f} s" if rec.status == OK and rec.wall_s is not None else \
            f"{rec.status.upper()}: {rec.reason}"
        print(f"[{self.done}/{self.total} ~{left:.0f} s left] {rec.workload} / {rec.allocator} "
              f"rep {rec.rep}: {res}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()  # type: ignore[attr-defined]


def run_c_workloads(w: Workload) -> Executor:
    """The runner of a matrix of our own C workloads only."""
    return run_c_workload


def run_matrix(workloads: Sequence[Workload], allocs: Sequence[Allocator], reps: int,
               ctx: RunContext, progress: Optional[Progress] = None,
               executors: Optional[Dict[str, Executor]] = None,
               on_record: Optional[Callable[[RunRecord], None]] = None,
               blocked: Optional[Dict[str, str]] = None,
               executor_for: Callable[[Workload], Executor] = run_c_workloads,
               seed: Optional[int] = None) -> List[RunRecord]:
    """Interleaved: for each rep, each workload under each allocator, the
    allocators in a fresh random order for every (rep, workload) drawn from
    `seed` (so no allocator always runs first, or always right after the
    same one, and a run can be replayed in the same order).
    `executor_for` gives each workload's runner; `executors` replaces the
    runner of some workloads (by name); the allocators in `blocked` (name ->
    reason, e.g. not verified) are not run: each of their runs is recorded
    as failed with that reason. A workload that reports itself skipped
    (program not installed) is not tried again."""
    records: List[RunRecord] = []
    skip: Dict[str, str] = {}
    blocked = blocked or {}
    rng = random.Random(seed)
    for rep in range(1, reps + 1):
        for w in workloads:
            for alloc in rng.sample(list(allocs), len(allocs)):
                if progress:
                    progress.start(f"{w.name}/{alloc.name} #{rep}")
                if alloc.name in blocked:
                    rec = run_one(w, alloc, rep, ctx, _fixed(blocked[alloc.name]))
                elif w.name in skip:
                    rec = run_one(w, alloc, rep, ctx, _fixed(skip[w.name]))
                else:
                    rec = run_one(w, alloc, rep, ctx,
                                  (executors or {}).get(w.name) or executor_for(w))
                    if rec.status == SKIPPED:
                        skip[w.name] = rec.reason
                records.append(rec)
                if on_record:
                    on_record(rec)
                if progress:
                    progress.finish(rec)
    return records


def _fixed(reason: str) -> Executor:
    """An executor that runs nothing and answers with `reason`."""
    def ex(w: Workload, a: Allocator, c: RunContext, t: float) -> Tuple[Outcome, Check, List[str]]:
        return _skipped(reason)
    return ex


def _skipped(reason: str) -> Tuple[Outcome, Check, List[str]]:
    return Outcome(None, 0, 0, 0, 0, 0, 0, "", ""), Check(False, reason), []
