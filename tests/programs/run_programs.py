#!/usr/bin/env python3
"""Real programs from Debian under LD_PRELOAD of coralloc's libraries.

  run_programs.py PROGRAM --stats-so STATS_SO [--work-dir DIR] LIB [LIB...]

PROGRAM is one of python, sqlite, redis, git, gxx (see PROGRAMS below). The
program's session runs once without a preload (glibc's malloc; jemalloc for
Debian's redis-server, which links it) and once under each LIB, preloaded
with STATS_SO (stats_at_exit.c) after it. Under each LIB:

- the session's transcript must equal the reference run's byte for byte
  (normalised only where the program itself is not deterministic: the
  duration in unittest's "Ran N tests in X s" line; redis-benchmark's
  timings, of which only the list of commands it ran is kept);
- every process that exited through exit() wrote what its malloc, free,
  calloc and realloc resolve to (must be LIB) and LIB's statistics; each
  program the session names must be among them with blocks allocated
  (pages carved for blocks, or large or huge blocks);
- and the session's own checks (python: at least 1000 tests ran, all
  passing; redis: jemalloc, which redis-server links, served next to
  nothing of what redis counts as used memory).

Exit 0: passed; 77: the program is not installed (ctest: skipped); 1:
failed (the reason and, for a transcript, a diff are printed).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

SKIP = 77
HERE = Path(__file__).resolve().parent
DEPS = HERE.parent / "deps.sh"  # the SKIPPED line that names the Debian package


class Failure(Exception):
    """The test failed: the message says why."""


class Skipped(Exception):
    """A program the test needs is not installed."""


@dataclass
class Run:
    """One run of a session: its environment, work directory and preload."""

    work: Path
    lib: str | None  # None: the reference run, no preload
    stats_dir: Path | None
    env: dict[str, str] = field(default_factory=dict)
    label: str = "glibc"

    def run(self, cmd: list[str], *, cwd: Path | None = None, input: bytes | None = None,
            env: dict[str, str] | None = None, timeout: float = 240,
            ok_codes: tuple[int, ...] = (0,)) -> bytes:
        """cmd's stdout (stderr merged); fails on an exit code not in ok_codes."""
        try:
            proc = subprocess.run(cmd, cwd=cwd or self.work, input=input,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env={**self.env, **(env or {})}, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"{self.label}: {' '.join(cmd)[:200]}: no exit after {timeout:.0f} s")
        if proc.returncode not in ok_codes:
            tail = proc.stdout.decode(errors="replace")[-3000:]
            raise Failure(f"{self.label}: {' '.join(cmd)[:200]}: exit {proc.returncode}\n{tail}")
        return proc.stdout


@dataclass
class Result:
    transcript: str  # must be the same under every allocator
    facts: dict[str, float] = field(default_factory=dict)  # measured, compared by checks
    summary: str = ""  # one line for the log


@dataclass
class Program:
    needs: list[str]  # commands (or absolute paths) that must exist
    session: Callable[[Run], Result]
    served: list[str]  # regexes of executables or argv[0] (basenames) that must show allocations
    check: Callable[[Result, Result, Run], str] | None = None  # (reference, preloaded)


def base_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CORALLOC_", "LD_", "MALLOC_", "GLIBC_TUNABLES", "PYTHON"))}
    home = work / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), LC_ALL="C", LANG="C", TZ="UTC", TMPDIR=str(work),
               GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null",
               GIT_AUTHOR_NAME="Coral Tester", GIT_AUTHOR_EMAIL="tester@example.invalid",
               GIT_COMMITTER_NAME="Coral Tester", GIT_COMMITTER_EMAIL="tester@example.invalid")
    return env


# ---- python: its own test modules -------------------------------------------
PYTHON = "/usr/bin/python3"  # Debian's, whose test suite libpython3.11-testsuite is
PYTHON_MODULES = ["test_dict", "test_list", "test_set", "test_json", "test_re",
                  "test_unicode|test_str", "test_ordered_dict", "test_collections",
                  "test_itertools", "test_deque"]
PYTHON_MIN_TESTS = 1000


def python_modules() -> list[str]:
    """The modules to run (test_unicode became test_str in 3.12); Skipped
    when the test suite is not installed."""
    probe = subprocess.run([PYTHON, "-c", "import test, os; print(os.path.dirname(test.__file__))"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise Skipped(f"{PYTHON} has no test package")
    tests = Path(probe.stdout.strip())
    chosen = []
    for alternatives in PYTHON_MODULES:
        found = [m for m in alternatives.split("|")
                 if (tests / f"{m}.py").exists() or (tests / m / "__init__.py").exists()]
        if not found:
            raise Skipped(f"python's test module {alternatives} is not installed (Debian "
                          f"package libpython3.11-testsuite: apt-get install "
                          f"libpython3.11-testsuite, or run make test as root)")
        chosen.append("test." + found[0])
    return chosen


def python_session(run: Run) -> Result:
    modules = python_modules()
    # PYTHONMALLOC=malloc: every object through malloc, not pymalloc's arenas.
    out = run.run([PYTHON, "-m", "unittest", "-v", *modules],
                  env={"PYTHONMALLOC": "malloc", "PYTHONHASHSEED": "0"}, ok_codes=(0, 1))
    text = out.decode(errors="replace")
    ran = re.findall(r"^Ran (\d+) tests? in [0-9.]+s$", text, re.M)
    if len(ran) != 1:
        raise Failure(f"{run.label}: no 'Ran N tests' line in unittest's output:\n{text[-2000:]}")
    text = re.sub(r"^(Ran \d+ tests?) in [0-9.]+s$", r"\1 in (time removed)", text, flags=re.M)
    status = text.rstrip().splitlines()[-1]
    tests = int(ran[0])
    return Result(text, {"tests": tests, "ok": float(status.startswith("OK"))},
                  f"{len(modules)} modules, {tests} tests, {status}")


def python_check(ref: Result, got: Result, run: Run) -> str:
    if not ref.facts["ok"]:
        raise Failure("python's tests fail without any preload (the environment, not "
                      "coralloc): " + ref.summary)
    if got.facts["tests"] < PYTHON_MIN_TESTS:
        raise Failure(f"{run.label}: {got.facts['tests']:.0f} tests ran, "
                      f"fewer than {PYTHON_MIN_TESTS}")
    return f"{got.facts['tests']:.0f} tests passed"


# ---- sqlite3: 200k rows -------------------------------------------------------
SQLITE_ROWS = 200_000


def sqlite_script() -> str:
    """Create, 200k INSERTs in one transaction, indexes, aggregates, updates,
    deletes, a join, window functions, integrity check, VACUUM."""
    lines = [
        ".bail on",
        "PRAGMA journal_mode=MEMORY;",
        "CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, category INTEGER,"
        " cents INTEGER, qty INTEGER, note TEXT);",
        "BEGIN;",
    ]
    x = 12345
    for i in range(1, SQLITE_ROWS + 1):
        x = (x * 1103515245 + 12345) % 2**31
        name = f"item-{x % 99991:05d}-{i % 7}"
        note = "n" * (x % 61) + str(i)
        lines.append(f"INSERT INTO item VALUES({i},'{name}',{x % 97},{x % 100000},"
                     f"{(x >> 8) % 50},'{note}');")
    lines += [
        "COMMIT;",
        "CREATE INDEX item_category ON item(category, cents);",
        "CREATE INDEX item_name ON item(name);",
        "SELECT count(*), sum(qty), sum(cents), min(name), max(name), sum(length(note)) FROM item;",
        "SELECT category, count(*), sum(qty), printf('%.3f', avg(cents) / 100.0)"
        " FROM item GROUP BY category ORDER BY category;",
        "SELECT id, name, cents FROM item WHERE category = 7 ORDER BY cents DESC, id LIMIT 10;",
        "SELECT name, count(*) FROM item GROUP BY name HAVING count(*) > 3 ORDER BY 2 DESC, 1 LIMIT 10;",
        "UPDATE item SET cents = cents * 11 / 10, note = note || '+' WHERE category % 3 = 0;",
        "SELECT changes();",
        "DELETE FROM item WHERE qty < 5;",
        "SELECT changes();",
        "SELECT count(*), sum(cents), sum(length(note)) FROM item;",
        "CREATE TABLE category(id INTEGER PRIMARY KEY, label TEXT);",
        "INSERT INTO category SELECT DISTINCT category, 'category-' || category FROM item;",
        "SELECT label, n, rank() OVER (ORDER BY n DESC, label) FROM"
        " (SELECT c.label, count(*) AS n FROM item i JOIN category c ON c.id = i.category"
        " GROUP BY c.label) ORDER BY 3 LIMIT 12;",
        "SELECT id, sum(cents) OVER (ORDER BY id ROWS BETWEEN 50 PRECEDING AND CURRENT ROW)"
        " FROM item WHERE id % 10007 = 0 ORDER BY id;",
        "SELECT length(group_concat(name, ',')) FROM (SELECT name FROM item ORDER BY note, id LIMIT 60000);",
        "SELECT count(DISTINCT substr(note, 1, 20)), count(DISTINCT name) FROM item;",
        "PRAGMA integrity_check;",
        "VACUUM;",
        "SELECT count(*), max(id) FROM item;",
    ]
    return "\n".join(lines) + "\n"


def sqlite_session(run: Run) -> Result:
    script = run.work / "script.sql"
    script.write_text(sqlite_script())
    out = run.run(["sqlite3", str(run.work / "test.db")], input=script.read_bytes())
    text = out.decode(errors="replace")
    return Result(text, summary=f"{SQLITE_ROWS} rows, {len(text.splitlines())} lines of results")


# ---- redis: redis-server, redis-benchmark, a redis-cli script ----------------
REDIS_BENCH_TESTS = "set,get,incr,lpush,rpop,sadd,hset,zadd,lrange_100"
REDIS_SCRIPT = """\
FLUSHALL
EVAL "for i=1,100000 do redis.call('SET','key:'..i, string.rep('v', i % 200)) end return redis.call('DBSIZE')" 0
EVAL "for i=1,30000 do redis.call('RPUSH','list:'..(i%50), i) redis.call('HSET','hash:'..(i%100), 'f'..i, i*3) redis.call('ZADD','zset', i*7 % 1000, 'm'..i) redis.call('SADD','set:'..(i%10), 'member'..i) end return 1" 0
DBSIZE
GET key:199
STRLEN key:12345
LLEN list:7
LRANGE list:7 0 9
LRANGE list:7 -3 -1
HLEN hash:3
HGET hash:3 f203
HMGET hash:99 f99 f199 nosuch
ZCARD zset
ZRANGE zset 0 9 WITHSCORES
ZRANGEBYSCORE zset 990 +inf LIMIT 0 5
ZSCORE zset m12345
SCARD set:3
SISMEMBER set:3 member13
SINTERCARD 2 set:3 set:4
SORT set:4 ALPHA LIMIT 0 8
APPEND key:1 tail
GET key:1
INCRBY counter 41
INCR counter
MSET a 1 b 2 c 3
MGET a b c nosuch
EVAL "local n=0 for i=1,100000,2 do n = n + redis.call('DEL','key:'..i) end return n" 0
DBSIZE
OBJECT ENCODING list:7
OBJECT ENCODING hash:3
OBJECT ENCODING zset
DEBUG DIGEST
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_info(run: Run, port: int) -> dict[str, str]:
    out = run.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "INFO", "memory"])
    return dict(line.split(":", 1) for line in out.decode().splitlines() if ":" in line)


def start_redis(run: Run) -> tuple[subprocess.Popen[str], int, list[str]]:
    """redis-server on an unused port; returns once its log says it is ready
    (read from its stdout, no polling). The log is drained by a thread."""
    for attempt in range(5):
        port = free_port()
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(run.work), "--logfile", "",
               "--daemonize", "no", "--enable-debug-command", "yes",
               "--jemalloc-bg-thread", "no"]
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=run.env, text=True, errors="replace")
        assert server.stdout is not None
        log: list[str] = []
        for line in server.stdout:
            log.append(line)
            if "Ready to accept connections" in line:
                threading.Thread(target=lambda: log.extend(server.stdout or []),
                                 daemon=True).start()
                return server, port, log
        server.wait()
        if not any("Address already in use" in line for line in log):
            raise Failure(f"{run.label}: redis-server exited with {server.returncode} "
                          f"before it was ready:\n{''.join(log)[-3000:]}")
    raise Failure(f"{run.label}: no unused port found for redis-server in 5 attempts")


def redis_session(run: Run) -> Result:
    server, port, log = start_redis(run)
    try:
        cli = ["redis-cli", "-h", "127.0.0.1", "-p", str(port)]
        bench = run.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", "10000",
                         "-r", "10000", "-d", "64", "-c", "20", "-t", REDIS_BENCH_TESTS,
                         "--csv"]).decode()
        # Timings are not deterministic: the transcript keeps which commands ran.
        ran = sorted({row.split(",")[0].strip('"') for row in bench.splitlines()[1:]
                      if row.count(",") >= 1 and float(row.split(",")[1].strip('"')) > 0})
        if len(ran) < len(REDIS_BENCH_TESTS.split(",")):
            raise Failure(f"{run.label}: redis-benchmark ran {ran}, expected "
                          f"{REDIS_BENCH_TESTS}:\n{bench}")
        script = run.run(cli, input=REDIS_SCRIPT.encode()).decode(errors="replace")
        info = redis_info(run, port)
        run.run(cli + ["SHUTDOWN", "NOSAVE"], ok_codes=(0, 1))  # the connection may drop
    except BaseException:
        server.kill()
        server.wait()
        raise
    try:
        status = server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        raise Failure(f"{run.label}: redis-server did not exit on SHUTDOWN")
    if status != 0:
        raise Failure(f"{run.label}: redis-server exit {status}:\n{''.join(log)[-3000:]}")
    # at the same moment: what redis counts as used (the usable sizes its
    # allocator's malloc_usable_size gives) and what jemalloc says it holds
    facts = {k: float(info[k]) for k in ("used_memory", "allocator_allocated")}
    transcript = f"redis-benchmark ran: {' '.join(ran)}\n{script}"
    return Result(transcript, facts,
                  f"benchmark of {len(ran)} commands, then {len(REDIS_SCRIPT.splitlines())} "
                  f"commands; used_memory {facts['used_memory'] / 2**20:.1f} MiB, "
                  f"jemalloc holds {facts['allocator_allocated'] / 2**20:.2f} MiB")


def redis_check(ref: Result, got: Result, run: Run) -> str:
    """Debian's redis-server links libjemalloc and calls the unprefixed
    malloc & co, which the preload takes; its mallctl (INFO's allocator_*
    figures) still reaches jemalloc. So jemalloc's own count of allocated
    bytes shows who served: nearly all of redis's used memory without the
    preload, next to none under coralloc."""
    used, jem = got.facts["used_memory"], got.facts["allocator_allocated"]
    if jem > used / 10:
        raise Failure(f"{run.label}: jemalloc holds {jem:.0f} bytes of redis's used memory "
                      f"{used:.0f}: jemalloc, not {run.lib}, serves redis")
    return (f"jemalloc (linked) holds {jem / 2**10:.0f} KiB of redis's used_memory "
            f"{used / 2**20:.1f} MiB (without the preload: jemalloc holds "
            f"{ref.facts['allocator_allocated'] / 2**20:.1f} MiB of "
            f"{ref.facts['used_memory'] / 2**20:.1f} MiB)")


# ---- git: a generated repository ----------------------------------------------
def git_session(run: Run) -> Result:
    repo = run.work / "repo"
    repo.mkdir()
    clock = [1704067200]  # 2024-01-01 00:00 UTC; every commit a minute later

    def git(*args: str, input: bytes | None = None) -> bytes:
        clock[0] += 60
        date = f"@{clock[0]} +0000"
        return run.run(["git", "-c", "gc.autoDetach=false", "-c", "core.pager=cat", *args],
                       cwd=repo, input=input,
                       env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})

    def write(path: str, text: str) -> None:
        f = repo / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)

    x = 777

    def rand(n: int) -> int:
        nonlocal x
        x = (x * 1103515245 + 12345) % 2**31
        return x % n

    def content(i: int, version: int) -> str:
        return "".join(f"file {i} version {version} line {k} {rand(1000000)}\n"
                       for k in range(20 + i % 40))

    out: list[bytes] = []
    git("init", "-q", "-b", "main", ".")
    for i in range(400):
        write(f"dir{i % 20}/file{i}.txt", content(i, 0))
    git("add", "-A")
    git("commit", "-q", "-m", "initial: 400 files")
    for c in range(1, 13):
        for _ in range(30):
            i = rand(400)
            write(f"dir{i % 20}/file{i}.txt", content(i, c))
        write(f"new/added{c}.txt", content(1000 + c, c))
        if c % 4 == 0:
            git("rm", "-q", f"dir{c}/file{c}.txt")
            git("mv", f"dir{c + 1}/file{c + 1}.txt", f"dir{c + 1}/renamed{c + 1}.txt")
        git("add", "-A")
        git("commit", "-q", "-m", f"main {c}: 30 files changed")
        if c == 4:
            git("tag", "-a", "v1", "-m", "version 1")
    for branch, d in (("feature-a", "dir0"), ("feature-b", "dir1")):
        git("checkout", "-q", "-b", branch, "v1")
        for c in range(8):
            write(f"{d}/{branch}-{c}.txt", content(2000 + c, c))
            git("add", "-A")
            git("commit", "-q", "-m", f"{branch} {c}")
    git("checkout", "-q", "main")
    out.append(git("merge", "--no-ff", "-m", "merge feature-a", "feature-a"))
    out.append(git("merge", "--no-ff", "-m", "merge feature-b", "feature-b"))
    out.append(git("log", "--graph", "--oneline", "--decorate", "--all"))
    out.append(git("log", "--stat", "-6", "--format=%H %an %ad %s", "--date=iso"))
    out.append(git("rev-list", "--count", "--all"))
    out.append(git("describe", "--tags", "main~3"))
    out.append(git("diff", "--stat", "v1", "main"))
    out.append(git("shortlog", "-sn", "--all"))
    out.append(git("blame", "-s", "-L", "1,10", "dir7/file27.txt"))
    out.append(git("cat-file", "-p", "HEAD"))
    ls = git("ls-tree", "-r", "HEAD")
    out.append(f"ls-tree: {len(ls.splitlines())} entries, sha256 "
               f"{hashlib.sha256(ls).hexdigest()}\n".encode())
    patch = git("log", "-p", "--all")
    out.append(f"log -p: {len(patch)} bytes, sha256 {hashlib.sha256(patch).hexdigest()}\n".encode())
    tar = git("archive", "--format=tar", "HEAD")
    out.append(f"archive: {len(tar)} bytes, sha256 {hashlib.sha256(tar).hexdigest()}\n".encode())
    out.append(git("gc", "-q"))
    out.append(git("fsck", "--full", "--strict", "--no-progress"))
    counts = git("count-objects", "-v").decode()
    out.append("".join(line + "\n" for line in counts.splitlines()
                       if line.split(":")[0] in ("count", "in-pack", "packs", "garbage")).encode())
    out.append(git("log", "--oneline", "-3", "feature-b"))
    text = b"".join(out).decode(errors="replace")
    return Result(text, summary=f"{clock[0] // 60 - 1704067200 // 60} git commands, "
                                f"{len(text.splitlines())} lines compared")


# ---- g++: a multi-file C++ program ---------------------------------------------
GXX_SOURCES = ["main.cc", "words.cc", "graph.cc", "shapes.cc"]


def gxx_session(run: Run) -> Result:
    src = run.work / "src"
    shutil.copytree(HERE / "gxx", src)
    (run.work / "obj").mkdir()
    out = []
    for name in GXX_SOURCES:
        obj = f"obj/{Path(name).stem}.o"
        run.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror",
                 "-frandom-seed=coralloc", "-c", f"src/{name}", "-o", obj])
        data = (run.work / obj).read_bytes()
        out.append(f"{obj}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}\n")
    run.run(["g++", "-pthread", "-o", "gxx_prog", *(f"obj/{Path(n).stem}.o" for n in GXX_SOURCES)])
    out.append(run.run([str(run.work / "gxx_prog")]).decode(errors="replace"))
    return Result("".join(out), summary=f"{len(GXX_SOURCES)} files compiled and linked, "
                                        f"the program run")


PROGRAMS: dict[str, Program] = {
    "python": Program([PYTHON], python_session, [r"^python3"], python_check),
    "sqlite": Program(["sqlite3"], sqlite_session, [r"^sqlite3$"]),
    "redis": Program(["redis-server", "redis-cli", "redis-benchmark"], redis_session,
                     [r"^redis-server$", r"^redis-cli$", r"^redis-benchmark$"], redis_check),
    "git": Program(["git"], git_session, [r"^git$"]),
    "gxx": Program(["g++"], gxx_session,
                   [r"g\+\+", r"^cc1plus$", r"(^|-)as$", r"^collect2$", r"(^|-)ld(\.bfd|\.gold)?$",
                    r"^gxx_prog$"]),
}


# ---- the allocator's evidence ---------------------------------------------------
def served(run: Run, want: list[str]) -> str:
    """Every process that wrote its record had malloc & co from run.lib; each
    executable in `want` allocated through it. Returns the evidence line."""
    assert run.stats_dir is not None and run.lib is not None
    lib = os.path.realpath(run.lib)
    records = []
    for f in sorted(run.stats_dir.glob("*.json")):
        try:
            records.append(json.loads(f.read_text()))
        except ValueError as e:
            raise Failure(f"{run.label}: unreadable record {f.name}: {e}")
    if not records:
        raise Failure(f"{run.label}: no process wrote its record: did the preload load?")
    for r in records:
        for sym in ("malloc", "free", "calloc", "realloc"):
            owner = r[sym] and os.path.realpath(r[sym])
            if owner != lib:
                raise Failure(f"{run.label}: {r['exe']}: {sym} comes from {r[sym]}, not {lib}")
        if r["stats"] is None:
            raise Failure(f"{run.label}: {r['exe']}: no coral_stats_json in the process")

    def allocated(r: dict) -> bool:
        s = r["stats"]
        return s["page_bytes_peak"] > 0 or s["large_allocs"] > 0 or s["huge_allocs"] > 0

    def name(r: dict) -> str:  # argv[0]'s when it differs from the file's
        # (redis-server rewrites its argv[0] to "redis-server HOST:PORT")
        exe, argv0 = os.path.basename(r["exe"]), os.path.basename(r["argv0"].split(" ")[0])
        return exe if exe == argv0 or not argv0 else f"{argv0}={exe}"

    names = Counter(name(r) for r in records)
    for pattern in want:
        if not any(any(re.search(pattern, n) for n in name(r).split("=")) and allocated(r)
                   for r in records):
            raise Failure(f"{run.label}: no process matching {pattern} allocated through "
                          f"{lib} (processes: {dict(names)})")
    peak = max(r["stats"]["page_bytes_peak"] for r in records)
    mapped = max(r["stats"]["mapped_peak"] for r in records)
    large = sum(r["stats"]["large_allocs"] for r in records)
    huge = sum(r["stats"]["huge_allocs"] for r in records)
    procs = ", ".join(f"{n} x{c}" for n, c in sorted(names.items()))
    return (f"{len(records)} processes ({procs}), malloc/free/calloc/realloc all from "
            f"{os.path.basename(lib)}; largest peak {peak / 2**20:.1f} MiB in pages, "
            f"{mapped / 2**20:.1f} MiB mapped; {large} large and {huge} huge blocks")


def compare(ref: Result, got: Result, label: str) -> None:
    if ref.transcript == got.transcript:
        return
    diff = difflib.unified_diff(ref.transcript.splitlines(), got.transcript.splitlines(),
                                "without preload", label, lineterm="", n=2)
    raise Failure(f"{label}: output differs from the run without preload:\n"
                  + "\n".join(list(diff)[:60]))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("program", choices=sorted(PROGRAMS))
    ap.add_argument("--stats-so", required=True, help="stats_at_exit.so")
    ap.add_argument("--work-dir", default=None, help="where the runs' files go (removed after)")
    ap.add_argument("libs", nargs="+", help="allocator libraries to preload, one run each")
    args = ap.parse_args(argv[1:])
    prog = PROGRAMS[args.program]
    for need in prog.needs:
        if not (os.access(need, os.X_OK) if need.startswith("/") else shutil.which(need)):
            said = subprocess.run(["bash", str(DEPS), "skipped", need]).returncode
            if said == 0:  # deps.sh finds it where this did not
                print(f"SKIPPED: {need} is not installed")
            return SKIP
    for path in [args.stats_so, *args.libs]:
        if not os.path.isfile(path):
            print(f"FAIL: no {path}")
            return 1
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    top = Path(tempfile.mkdtemp(prefix=f"programs-{args.program}.", dir=args.work_dir)).resolve()
    t_all = time.monotonic()
    try:
        t0 = time.monotonic()
        ref_run = Run(top / "glibc", None, None)
        ref_run.work.mkdir()
        ref_run.env = base_env(ref_run.work)
        ref = prog.session(ref_run)
        print(f"{args.program}: without preload: {ref.summary} ({time.monotonic() - t0:.1f} s)")
        for i, lib in enumerate(args.libs):
            t0 = time.monotonic()
            name = os.path.basename(lib)
            run = Run(top / f"lib{i}", lib, top / f"lib{i}.stats", label=name)
            run.work.mkdir()
            run.stats_dir.mkdir()
            run.env = base_env(run.work)
            run.env.update(LD_PRELOAD=f"{os.path.realpath(args.stats_so)} {os.path.realpath(lib)}",
                           CORAL_PROGRAMS_STATS_DIR=str(run.stats_dir))
            got = prog.session(run)
            compare(ref, got, name)
            evidence = served(run, prog.served)
            extra = prog.check(ref, got, run) if prog.check else ""
            print(f"{args.program}: {name}: {got.summary}; the same output "
                  f"({len(got.transcript)} bytes) ({time.monotonic() - t0:.1f} s)")
            print(f"  served: {evidence}")
            if extra:
                print(f"  {extra}")
    except Skipped as e:
        print(f"SKIPPED: {e}")
        shutil.rmtree(top, ignore_errors=True)
        return SKIP
    except Failure as e:
        print(f"FAIL: {args.program}: {e}\n(files kept in {top})")
        return 1
    shutil.rmtree(top, ignore_errors=True)
    print(f"{args.program}: passed under {len(args.libs)} "
          f"librar{'y' if len(args.libs) == 1 else 'ies'} in {time.monotonic() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
