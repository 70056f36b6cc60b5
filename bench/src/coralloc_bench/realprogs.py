"""Real programs from Debian run under the allocator, their outputs checked:
python3 running an allocation-heavy script, the sqlite3 CLI, and
redis-server driven by redis-benchmark on 127.0.0.1 (bounded, always
stopped); git, gcc, lua and python's own tests are in devtools.py, and
programs.py maps each real program to its runner.

Who served malloc in a real program is told by the malloc witness
(witness.py); python prints it itself (its script's malloc_lib line)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from coralloc_bench.allocators import Allocator
from coralloc_bench.execute import (Check, Executor, Outcome, RunContext, Spawned,
                                    check_workload_output, failure_reason, measure, signal_name)
from coralloc_bench.witness import find_python, not_run, witness_verdict, witnessed_env
from coralloc_bench.workloads import Workload

DATA = Path(__file__).resolve().parent / "data"


# ---- python ------------------------------------------------------------------

def run_python_script(script: str, w: Workload, alloc: Allocator, ctx: RunContext,
                      timeout: float) -> Tuple[Outcome, Check, List[str]]:
    """Debian's python3 running one of the data scripts, every object from
    the allocator under test."""
    py = find_python()
    if py is None:
        return not_run("skipped: python3 not installed (apt-get install python3)")
    argv = [py, str(DATA / script), *w.argv_tail(ctx.profile, ctx.threads)]
    env = alloc.env()
    env["PYTHONMALLOC"] = "malloc"  # every object through the allocator, not pymalloc
    env["PYTHONHASHSEED"] = "0"
    env.pop("PYTHONPATH", None)
    o = measure(argv, env, timeout, launcher=ctx.launcher)
    return o, check_workload_output(o, alloc, timeout), argv


def run_python(w: Workload, alloc: Allocator, ctx: RunContext,
               timeout: float) -> Tuple[Outcome, Check, List[str]]:
    return run_python_script("alloc_heavy.py", w, alloc, ctx, timeout)


def run_python_gc(w: Workload, alloc: Allocator, ctx: RunContext,
                  timeout: float) -> Tuple[Outcome, Check, List[str]]:
    return run_python_script("gc_walk.py", w, alloc, ctx, timeout)


# ---- sqlite ------------------------------------------------------------------

ALPHA = "abcdefghijklmnopqrstuvwxyz" * 4


def sqlite_script(n: int) -> str:
    return f"""CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, val INTEGER, payload TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < {n})
INSERT INTO t SELECT i, 'name-' || i, i % 97, i * 3 % 1000, substr('{ALPHA}', 1, 20 + i % 80) FROM c;
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp ON t(grp, val);
SELECT count(*), sum(grp), sum(length(payload)) FROM t;
SELECT grp, count(*), sum(val) FROM t GROUP BY grp ORDER BY grp LIMIT 3;
SELECT count(*) FROM t WHERE name LIKE 'name-1%';
SELECT id FROM t ORDER BY payload DESC, id LIMIT 3;
SELECT count(*) FROM t a JOIN t b ON a.id = b.id * 2;
SELECT length(group_concat(name)) FROM t WHERE grp = 5;
UPDATE t SET payload = payload || 'y' WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*), sum(length(payload)) FROM t;
"""


def sqlite_expected(n: int) -> List[str]:
    """What sqlite3 must print for sqlite_script(n), computed independently."""
    ids = range(1, n + 1)
    out = [f"{n}|{sum(i % 97 for i in ids)}|{sum(20 + i % 80 for i in ids)}"]
    for g in range(3):
        members = [i for i in ids if i % 97 == g]
        out.append(f"{g}|{len(members)}|{sum(i * 3 % 1000 for i in members)}")
    out.append(str(sum(1 for i in ids if str(i).startswith("1"))))
    longest = max(20 + i % 80 for i in ids)
    out += [str(i) for i in [i for i in ids if 20 + i % 80 == longest][:3]]
    out.append(str(n // 2))
    names5 = [f"name-{i}" for i in ids if i % 97 == 5]
    out.append(str(sum(len(s) for s in names5) + max(0, len(names5) - 1)) if names5 else "")
    kept = [i for i in ids if i % 5 != 0]
    out.append(f"{len(kept)}|{sum(20 + i % 80 + (1 if i % 3 == 0 else 0) for i in kept)}")
    return out


def run_sqlite(w: Workload, alloc: Allocator, ctx: RunContext,
               timeout: float) -> Tuple[Outcome, Check, List[str]]:
    exe = shutil.which("sqlite3")
    if exe is None:
        return not_run("skipped: sqlite3 not installed (apt-get install sqlite3)")
    n = int(w.argv_tail(ctx.profile, ctx.threads)[0])
    script = ctx.work_dir / f"sqlite-{n}.sql"
    expected_file = ctx.work_dir / f"sqlite-{n}.expected"
    if not script.is_file():
        script.write_text(sqlite_script(n))
        expected_file.write_text("\n".join(sqlite_expected(n)) + "\n")
    argv = [exe, "-batch", ":memory:"]
    witness_file = ctx.work_dir / f"sqlite-{alloc.name}.witness"
    witness_file.unlink(missing_ok=True)
    o = measure(argv, witnessed_env(alloc, ctx, witness_file), timeout, stdin_path=str(script),
                launcher=ctx.launcher)
    why = failure_reason(o, timeout)
    served, who = witness_verdict(alloc, ctx, witness_file)
    why = why or served
    if why:
        return o, Check(False, why, served_by=who), argv
    got = o.stdout.strip().splitlines()
    want = expected_file.read_text().strip().splitlines()
    if got != want:
        bad = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        return o, Check(False, f"wrong output at line {bad + 1}"), argv
    rows_per_sec = n / o.wall_s if o.wall_s > 0 else 0.0
    return o, Check(True, "", "rows_per_sec", rows_per_sec, {"rows_per_sec": rows_per_sec},
                    who), argv


# ---- redis -------------------------------------------------------------------

REDIS_TESTS = "set,get,lpush,lpop,sadd,hset,zadd"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _resp(port: int, *args: str, timeout: float = 5.0) -> bytes:
    """Send one command in RESP to 127.0.0.1:port and return the first reply line."""
    msg = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(msg.encode())
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        # a bulk string: read its body line too
        if data.startswith(b"$") and not data.startswith(b"$-1"):
            while data.count(b"\r\n") < 2:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.split(b"\r\n")[1]
        return data.split(b"\r\n")[0]


def _wait_ready(port: int, sp: Spawned, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if sp.poll():
            return False
        try:
            if _resp(port, "PING", timeout=1.0) == b"+PONG":
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def run_redis(w: Workload, alloc: Allocator, ctx: RunContext,
              timeout: float) -> Tuple[Outcome, Check, List[str]]:
    server, bench = shutil.which("redis-server"), shutil.which("redis-benchmark")
    if server is None or bench is None:
        return not_run("skipped: redis not installed (apt-get install redis-server redis-tools)")
    n = int(w.argv_tail(ctx.profile, ctx.threads)[0])
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="coralloc-redis-", dir=str(ctx.work_dir))
    witness_file = Path(workdir) / "witness.txt"
    argv = [server, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--jemalloc-bg-thread", "no", "--dir", workdir, "--logfile", ""]
    deadline = time.monotonic() + timeout
    # Debian's redis-server links libjemalloc: the allocator under test comes
    # first in the lookup scope by LD_PRELOAD (glibc for `system`), and the
    # witness checks that it served the server's malloc
    sp = Spawned(argv, witnessed_env(alloc, ctx, witness_file, libc_first=True), cwd=workdir,
                 launcher=ctx.launcher)
    reason = ""
    figures: Dict[str, float] = {}
    try:
        if not _wait_ready(port, sp, min(deadline, time.monotonic() + 15)):
            reason = "redis-server did not start"
        else:
            reason, figures = _drive(port, n, bench, sp, alloc, deadline)
    except OSError as e:
        reason = f"talking to redis-server: {e}"
    finally:
        # always stopped: SHUTDOWN NOSAVE, and killed if it is still there 5 s later
        if not sp.poll():
            try:
                _resp(port, "SHUTDOWN", "NOSAVE", timeout=2.0)
            except OSError:
                pass
        stop_by = time.monotonic() + 5
        while not sp.poll():
            if time.monotonic() > stop_by:
                sp.kill()
                reason = reason or "redis-server did not stop on SHUTDOWN"
                stop_by = float("inf")
            time.sleep(0.02)
        o = sp.outcome()
        served, who = witness_verdict(alloc, ctx, witness_file)
        shutil.rmtree(workdir, ignore_errors=True)
    if not reason and o.exit_status != 0:
        reason = (f"redis-server killed by {signal_name(-o.exit_status)}"
                  if o.exit_status is not None and o.exit_status < 0
                  else f"redis-server exit {o.exit_status}")
    reason = reason or served
    if reason:
        return o, Check(False, reason), argv
    return o, Check(True, "", "ops_per_sec", figures["ops_per_sec"], figures, who), argv


def mapped_libs(pid: int) -> List[str]:
    libs: List[str] = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[5].startswith("/") and parts[5] not in libs:
                    libs.append(parts[5])
    except OSError:
        pass
    return libs


def _drive(port: int, n: int, bench: str, sp: Spawned, alloc: Allocator,
           deadline: float) -> Tuple[str, Dict[str, float]]:
    """redis-benchmark against the server, then a check of its state."""
    # the allocator must be in the server: its library is mapped there (the
    # witness says whether it serves malloc; libjemalloc, linked,
    # still answers redis' mallctl calls about its own, unused, heap)
    if alloc.path is not None:
        want = os.path.realpath(alloc.path)
        pid = sp.program_pid()
        if pid is None or want not in {os.path.realpath(p) for p in mapped_libs(pid)}:
            return f"{alloc.path} is not mapped in redis-server", {}
    cmd = [bench, "-h", "127.0.0.1", "-p", str(port), "-n", str(n), "-c", "20", "-P", "4",
           "-d", "64", "-r", str(max(1000, n)), "-t", REDIS_TESTS, "--csv"]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return "redis-benchmark timed out", {}
    if sp.poll():
        return "redis-server died during the benchmark", {}
    if r.returncode != 0:
        return f"redis-benchmark exit {r.returncode}", {}
    rps: Dict[str, float] = {}
    for line in r.stdout.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if len(cells) >= 2 and cells[0] != "test":
            try:
                rps[cells[0]] = float(cells[1])
            except ValueError:
                pass
    tests = {t.upper() for t in REDIS_TESTS.split(",")}
    if set(rps) != tests or any(v <= 0 for v in rps.values()):
        return f"redis-benchmark reported {sorted(rps)}, expected {sorted(tests)}", {}
    # the data is really there and the server still answers right
    if _resp(port, "SET", "coralloc:check", "v" * 1000) != b"+OK":
        return "SET failed after the benchmark", {}
    if _resp(port, "GET", "coralloc:check") != b"v" * 1000:
        return "GET returned the wrong value", {}
    size = _resp(port, "DBSIZE")
    if not size.startswith(b":") or int(size[1:]) < 2:
        return f"DBSIZE is {size!r} after the benchmark", {}
    seconds = sum(n / v for v in rps.values())
    figures = {"ops_per_sec": n * len(rps) / seconds}
    figures.update({f"{k.lower()}_rps": v for k, v in rps.items()})
    return "", figures
