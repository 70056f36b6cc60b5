"""Real programs of the full profile, the short-lived tools users run all day:
git on a generated repository, gcc on a generated C file, lua on an
allocation-heavy script, ruby with a thread per core, and python's own test
modules. Each runs under the allocator (every process it starts too,
through LD_PRELOAD), with the malloc witness (see witness.py) telling
who served each process; each output is checked against answers computed
here, independently."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from coralloc_bench.allocators import Allocator
from coralloc_bench.execute import Check, Outcome, RunContext, failure_reason, measure
from coralloc_bench.witness import find_python, not_run, witness_verdict, witnessed_env
from coralloc_bench.workloads import Workload

M32 = 0xFFFFFFFF
Result = Tuple[Outcome, Check, List[str]]


def _run_checked(argv: List[str], alloc: Allocator, ctx: RunContext, timeout: float,
                 name: str, expect: Callable[[str], str], figure: str, amount: float,
                 cwd: Optional[Path] = None, env_extra: Optional[Dict[str, str]] = None) -> Result:
    """Run argv under the allocator and the witness; a failure when it fails,
    when expect(stdout) names a wrong answer, or when a process of it was
    served by another malloc. The figure is `amount` per second of wall."""
    witness_file = ctx.work_dir / f"{name}-{alloc.name}.witness"
    witness_file.unlink(missing_ok=True)
    env = witnessed_env(alloc, ctx, witness_file)
    env.update(env_extra or {})
    o = measure(argv, env, timeout, cwd=str(cwd) if cwd else None, launcher=ctx.launcher)
    served, who = witness_verdict(alloc, ctx, witness_file)
    why = failure_reason(o, timeout) or expect(o.stdout) or served
    if why:
        return o, Check(False, why, served_by=who), argv
    rate = amount / o.wall_s if o.wall_s > 0 else 0.0
    return o, Check(True, "", figure, rate, {figure: rate}, who), argv


def _lines_are(want: List[str]) -> Callable[[str], str]:
    def check(stdout: str) -> str:
        got = stdout.strip().splitlines()
        if got == want:
            return ""
        bad = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                   min(len(got), len(want)))
        return f"wrong output at line {bad + 1}"
    return check


# ---- git ---------------------------------------------------------------------------

GIT_FILES = 60


def git_file(i: int, rnd: int) -> str:
    """File i of the generated repository as of round rnd: lines added each
    round the file is touched (every file in 1 round of 3)."""
    lines = [f"file {i} line {k}: {'x' * ((i * 7 + k) % 50)}" for k in range(40)]
    for r in range(1, rnd + 1):
        if (i + r) % 3 == 0:
            lines.insert((i + r) % len(lines), f"round {r} changed file {i}")
    return "\n".join(lines) + "\n"


def git_blob_id(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_script(rounds: int) -> str:
    """Commit `rounds` rounds of changes (prepared in rounds/R/), then the
    commands a developer runs: log -p, diff, blame, repack, fsck."""
    return f"""set -e
git init -q repo
cd repo
for r in $(seq 0 {rounds}); do
  cp ../rounds/$r/* .
  git add -A
  git commit -q -m "round $r"
done
git log -p --stat >/dev/null
git diff --stat HEAD~{min(rounds, 5)} HEAD >/dev/null
git blame f0007.txt >/dev/null
git repack -adq
git fsck --full --no-progress 2>/dev/null
git rev-list --count HEAD
git ls-files | wc -l
git rev-parse HEAD:f0007.txt
"""


def run_git(w: Workload, alloc: Allocator, ctx: RunContext, timeout: float) -> Result:
    git, sh = shutil.which("git"), shutil.which("sh")
    if git is None or sh is None:
        return not_run("skipped: git not installed (apt-get install git)")
    rounds = int(w.argv_tail(ctx.profile, ctx.threads)[0])
    src = ctx.work_dir / f"git-{rounds}"
    if not (src / "script.sh").is_file():
        for r in range(rounds + 1):
            d = src / "rounds" / str(r)
            d.mkdir(parents=True, exist_ok=True)
            for i in range(GIT_FILES):
                if r == 0 or (i + r) % 3 == 0:
                    (d / f"f{i:04d}.txt").write_text(git_file(i, r))
        (src / "script.sh").write_text(git_script(rounds))
    run_dir = ctx.work_dir / f"git-run-{alloc.name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    (run_dir / "rounds").symlink_to(src / "rounds")
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": str(run_dir),
           "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost",
           "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z",
           "LC_ALL": "C"}
    want = [str(rounds + 1), str(GIT_FILES), git_blob_id(git_file(7, rounds))]
    res = _run_checked([sh, str(src / "script.sh")], alloc, ctx, timeout, "git",
                       _lines_are(want), "commits_per_sec", rounds + 1, cwd=run_dir,
                       env_extra=env)
    shutil.rmtree(run_dir, ignore_errors=True)
    return res


# ---- gcc ---------------------------------------------------------------------------

def gcc_source(n: int) -> str:
    """n functions, each a loop over a switch, and main() folding them."""
    fns = []
    for k in range(n):
        fns.append(f"""static unsigned f{k}(unsigned x) {{
    unsigned acc = {k}u;
    for (unsigned i = 0; i < 8; i++) {{
        switch ((x + i) % 4u) {{
        case 0: acc = acc * 31u + x + i; break;
        case 1: acc ^= (x << (i % 7u)) + {k}u; break;
        case 2: acc += (acc >> 3) ^ i; break;
        default: acc = acc * 7u + {k * 13 + 1}u; break;
        }}
    }}
    return acc;
}}
""")
    calls = "".join(f"    s += f{k}(s ^ {k}u);\n" for k in range(n))
    return ("#include <stdio.h>\n" + "".join(fns) +
            f"int main(void) {{\n    unsigned s = 0;\n{calls}    printf(\"%u\\n\", s);\n"
            "    return 0;\n}\n")


def gcc_expected(n: int) -> str:
    s = 0
    for k in range(n):
        x = (s ^ k) & M32
        acc = k
        for i in range(8):
            sel = ((x + i) & M32) % 4
            if sel == 0:
                acc = (acc * 31 + x + i) & M32
            elif sel == 1:
                acc ^= (((x << (i % 7)) & M32) + k) & M32
            elif sel == 2:
                acc = (acc + ((acc >> 3) ^ i)) & M32
            else:
                acc = (acc * 7 + k * 13 + 1) & M32
        s = (s + acc) & M32
    return str(s)


def run_gcc(w: Workload, alloc: Allocator, ctx: RunContext, timeout: float) -> Result:
    gcc, sh = shutil.which("gcc"), shutil.which("sh")
    if gcc is None or sh is None:
        return not_run("skipped: gcc not installed (apt-get install gcc)")
    n = int(w.argv_tail(ctx.profile, ctx.threads)[0])
    src = ctx.work_dir / f"gen-{n}.c"
    if not src.is_file():
        src.write_text(gcc_source(n))
    out = ctx.work_dir / f"gen-{n}-{alloc.name}"
    script = f'set -e\n"{gcc}" -O2 -o "{out}" "{src}"\n"{out}"\n'
    res = _run_checked([sh, "-c", script], alloc, ctx, timeout, "gcc",
                       _lines_are([gcc_expected(n)]), "functions_per_sec", n)
    out.unlink(missing_ok=True)
    return res


# ---- lua ---------------------------------------------------------------------------

LUA_SCRIPT = """local n = tonumber(arg[1])
local t = {}
for i = 1, n do t[i] = {id = i, name = "item-" .. i, tags = {i % 7, i % 11}} end
local parts = {}
for i = 1, n do parts[#parts + 1] = t[i].name .. ":" .. (t[i].tags[1] + t[i].tags[2]) end
local s = table.concat(parts, ",")
table.sort(t, function(a, b)
  if a.tags[1] ~= b.tags[1] then return a.tags[1] < b.tags[1] end
  return a.id > b.id
end)
local total = 0
for r = 1, 20 do
  local m = {}
  for i = 1, n // 4 do m["k" .. (i * r % n)] = i end
  local c = 0
  for _ in pairs(m) do c = c + 1 end
  total = total + c
end
print(#s, t[1].id, t[n].id, total)
"""


def lua_expected(n: int) -> str:
    length = sum(len(f"item-{i}:{i % 7 + i % 11}") for i in range(1, n + 1)) + n - 1
    first = max(i for i in range(1, n + 1) if i % 7 == 0)
    last = min(i for i in range(1, n + 1) if i % 7 == 6)
    total = sum(len({i * r % n for i in range(1, n // 4 + 1)}) for r in range(1, 21))
    return f"{length}\t{first}\t{last}\t{total}"


def find_lua() -> Optional[str]:
    for name in ("lua5.4", "lua"):
        found = shutil.which(name)
        if found:
            return found
    return None


def run_lua(w: Workload, alloc: Allocator, ctx: RunContext, timeout: float) -> Result:
    lua = find_lua()
    if lua is None:
        return not_run("skipped: lua not installed (apt-get install lua5.4)")
    n = int(w.argv_tail(ctx.profile, ctx.threads)[0])
    script = ctx.work_dir / "alloc.lua"
    if not script.is_file():
        script.write_text(LUA_SCRIPT)
    return _run_checked([lua, str(script), str(n)], alloc, ctx, timeout, "lua",
                        _lines_are([lua_expected(n)]), "items_per_sec", n)


# ---- ruby ---------------------------------------------------------------------------

# Threads (the cores) each build and drop hashes of arrays of heap strings;
# ruby runs one thread at a time (its global lock), and its garbage
# collector, run by whichever thread needs memory, frees blocks the other
# threads allocated: remote frees for a thread-caching allocator.
RUBY_SCRIPT = """n = ARGV[0].to_i
threads = ARGV[1].to_i
def work(n, seed)
  acc = 0
  keep = []
  n.times do |i|
    h = {}
    20.times { |j| h["key-#{j}"] = [i, j, seed, "v" * ((i + j) % 97 + 24)] }
    s = h.values.map { |v| v[3] }.join(",")
    keep << s if i % 50 == 0
    keep.shift if keep.size > 200
    acc += s.size + h.size
  end
  acc
end
ts = threads.times.map { |t| Thread.new { work(n, t) } }
puts ts.map(&:value).sum
"""


def ruby_expected(n: int, threads: int) -> str:
    per_thread = sum(sum((i + j) % 97 + 24 for j in range(20)) + 19 + 20 for i in range(n))
    return str(threads * per_thread)


def run_ruby(w: Workload, alloc: Allocator, ctx: RunContext, timeout: float) -> Result:
    ruby = shutil.which("ruby")
    if ruby is None:
        return not_run("skipped: ruby not installed (apt-get install ruby)")
    n = int(w.argv_tail(ctx.profile, ctx.threads)[0])
    threads = max(2, ctx.threads)
    script = ctx.work_dir / "alloc.rb"
    if not script.is_file():
        script.write_text(RUBY_SCRIPT)
    return _run_checked([ruby, str(script), str(n), str(threads)], alloc, ctx, timeout, "ruby",
                        _lines_are([ruby_expected(n, threads)]), "items_per_sec", n * threads)


# ---- python's own tests ------------------------------------------------------------

def python_testsuite_package() -> Optional[str]:
    """Debian's package with python3's test modules (libpython3.X-testsuite)."""
    py = find_python()
    if py is None:
        return None
    name = os.path.basename(os.path.realpath(py))  # python3.11
    return f"lib{name}-testsuite" if name.startswith("python3.") else None


def python_has_tests() -> bool:
    py = find_python()
    if py is None:
        return False
    name = os.path.basename(os.path.realpath(py))
    return Path(f"/usr/lib/{name}/test/regrtest.py").is_file() or \
        Path(f"/usr/lib/{name}/test/libregrtest").is_dir()


def run_python_tests(w: Workload, alloc: Allocator, ctx: RunContext, timeout: float) -> Result:
    py = find_python()
    if py is None or not python_has_tests():
        return not_run(f"skipped: python's test modules not installed (apt-get install "
                        f"{python_testsuite_package() or 'libpython3-testsuite'})")
    modules = w.argv_tail(ctx.profile, ctx.threads)
    argv = [py, "-m", "test", "-q", "--fail-env-changed", *modules]

    def check(stdout: str) -> str:
        return "" if "Tests result: SUCCESS" in stdout else "python tests did not pass"
    return _run_checked(argv, alloc, ctx, timeout, "python-tests", check, "modules_per_sec",
                        len(modules), cwd=ctx.work_dir,
                        env_extra={"PYTHONMALLOC": "malloc", "PYTHONHASHSEED": "0"})


EXECUTORS = {"real:git": run_git, "real:gcc": run_gcc, "real:lua": run_lua,
             "real:ruby": run_ruby, "real:python-tests": run_python_tests}


def missing_packages(programs: List[str]) -> List[str]:
    need: List[str] = []
    if "real:git" in programs and shutil.which("git") is None:
        need.append("git")
    if "real:gcc" in programs and shutil.which("gcc") is None:
        need.append("gcc")
    if "real:lua" in programs and find_lua() is None:
        need.append("lua5.4")
    if "real:ruby" in programs and shutil.which("ruby") is None:
        need.append("ruby")
    if "real:python-tests" in programs and not python_has_tests():
        pkg = python_testsuite_package()
        if pkg:
            need.append(pkg)
    return need

