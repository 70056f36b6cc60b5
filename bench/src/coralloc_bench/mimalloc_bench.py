"""The field's own suite, daanx/mimalloc-bench, run from a user's checkout
through our runner (`coralloc-bench run --suite mimalloc-bench=PATH`).

What runs comes from the checkout itself, read at run time:
- bench.sh's `run_test` function: each test's command line(s), with its
  `procs` (here: the cores the run may use) and `$benchdir` put in, and its
  `if test $procs ...` conditions evaluated as bench.sh would;
- bench.sh's `run_test_env_cmd`: a test's standard input (`infile=`), and the
  time bench.sh counts instead of the wall time where it derives one from the
  program's output (larson, rptest, xmalloc-test, glibc-thread: a `sed`
  expression, then `K / $ops` or the value itself);
- bench/CMakeLists.txt: the programs, built with the checkout's own CMake into
  our build directory (a program whose sources are missing is left out and
  named with the reason; one that fails to build too).

The programs run in the build directory `<build>/out/bench` next to
`<build>/bench` (a link to the checkout's bench/), the layout bench.sh's
relative paths (`../../bench/...`) expect. Nothing is written into the
checkout. A test that needs what bench.sh's build-bench-env.sh sets up
(redis, lean, lua, rocksdb, linux, spec, a PDF for gs) or that is not a
timing (security) is skipped with the reason; a system program (ruby, z3)
is installed from Debian when we are root, else skipped with the reason.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from coralloc_bench.allocators import Allocator
from coralloc_bench.execute import Check, Executor, Outcome, RunContext, failure_reason, measure
from coralloc_bench.util import BenchError
from coralloc_bench.witness import witness_verdict, witnessed_env
from coralloc_bench.workloads import Workload

NAME = "mimalloc-bench"
# Debian packages of the system programs bench.sh's tests call by name.
DEBIAN_PACKAGES = {"ruby": "ruby", "z3": "z3", "gs": "ghostscript"}
# Seconds one run may take before it is killed (bench.sh has no limit; its
# longest tests take tens of seconds on 2 cores).
TIMEOUT_S = 600.0
Log = Callable[[str], None]


@dataclass(frozen=True)
class Derivation:
    """How bench.sh turns a program's output into the time it counts."""
    pattern: str  # the glob of test names (bench.sh's case label)
    regex: str  # Python regex with one group: the number on the output line
    numerator: Optional[float]  # time = numerator / number; None: time = number

    def time_from(self, stdout: str) -> Optional[float]:
        for line in stdout.splitlines():
            m = re.search(self.regex, line)
            if m and m.group(1) and m.group(1) != ".":
                try:
                    v = float(m.group(1))
                except ValueError:
                    continue
                if self.numerator is None:
                    return v
                return self.numerator / v if v > 0 else None
        return None


@dataclass(frozen=True)
class SuiteTest:
    """One test of bench.sh (larsonN, cfrac...) as it runs here."""
    name: str
    family: str  # bench.sh's run_test case (larson, cthrash...)
    command: str  # the command line with procs and benchdir put in
    stdin: Optional[str] = None
    derivation: Optional[Derivation] = None
    thread_factor: int = 0  # 0: no procs in the command, 1: procs, 2: procs x 2...

    @property
    def argv(self) -> List[str]:
        return shlex.split(self.command)

    @property
    def program(self) -> str:
        """The built program's name (`./larson` -> larson), '' for a system one."""
        a = self.argv
        return a[0][2:] if a and a[0].startswith("./") else ""


@dataclass
class Suite:
    """The checkout read: its test families by bench.sh's groups, and the
    tests for one procs."""
    checkout: Path
    groups: Dict[str, List[str]]
    tests: List[SuiteTest]
    skipped: Dict[str, str] = field(default_factory=dict)  # test or family -> why


# ---- reading bench.sh ----------------------------------------------------------------

_FUNC = re.compile(r"^function\s+(\w+)\s*\{", re.M)
_LABEL = re.compile(r"^(\s*)([A-Za-z0-9_.*|-]+)\)\s*(.*)$")
_RUN_CMD = re.compile(r'^run_test_cmd\s+"([^"]+)"(?:\s+"([^"]*)")?\s*(?:#.*)?$')
_PROCS_TEST = re.compile(r'^if\s+test\s+"?\$procs"?\s+(-gt|-ge|-lt|-le|-eq|-ne|!=|=)\s+"?(\d+)"?'
                         r'\s*;\s*then$')
_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def function_body(text: str, name: str) -> List[str]:
    """The lines of bash function `name` (between its header and the first
    line that is a lone `}`)."""
    for m in _FUNC.finditer(text):
        if m.group(1) == name:
            rest = text[m.end():].split("\n")[1:]
            end = next((i for i, ln in enumerate(rest) if ln.rstrip() == "}"), len(rest))
            return rest[:end]
    raise BenchError(f"bench.sh has no function {name}: not a mimalloc-bench checkout "
                     "this runner can read")


def case_branches(body: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """The branches of the first `case` in body, at its own indentation:
    (label, lines), the label's trailing code as the first line."""
    start = next((i for i, ln in enumerate(body) if ln.strip().startswith("case ")), None)
    if start is None:
        return []
    branches: List[Tuple[str, List[str]]] = []
    indent: Optional[int] = None
    for ln in body[start + 1:]:
        m = _LABEL.match(ln)
        if m and (indent is None or len(m.group(1)) == indent) and not ln.strip().startswith(
                ("if ", "run_test_cmd", "echo ")):
            indent = len(m.group(1))
            branches.append((m.group(2), [m.group(3)] if m.group(3) else []))
        elif ln.strip() == "esac" and indent is not None and len(ln) - len(ln.lstrip()) < indent:
            break
        elif branches:
            branches[-1][1].append(ln)
    return branches


def _statement(line: str) -> str:
    s = line.strip()
    return s[:-2].rstrip() if s.endswith(";;") else s


def _procs_condition(s: str, procs: int) -> bool:
    m = _PROCS_TEST.match(s)
    if m is None:
        raise ValueError(s)
    op, n = m.group(1), int(m.group(2))
    return {"-gt": procs > n, "-ge": procs >= n, "-lt": procs < n, "-le": procs <= n,
            "-eq": procs == n, "=": procs == n, "-ne": procs != n, "!=": procs != n}[op]


def family_commands(lines: Sequence[str], procs: int) -> Tuple[List[Tuple[str, str]], str]:
    """The (test name, command) pairs a run_test branch runs for `procs`, with
    its conditions evaluated, and why it cannot be run here ('' when it can)."""
    out: List[Tuple[str, str]] = []
    active: List[Tuple[bool, bool]] = []  # (enclosing active, this condition)
    for raw in lines:
        s = _statement(raw)
        if not s or s.startswith("#"):
            continue
        on = all(p and c for p, c in active)
        if s.startswith("if "):
            try:
                active.append((on, _procs_condition(s, procs)))
            except ValueError:
                return [], f"bench.sh condition not understood: {s}"
        elif s == "else" and active:
            parent, cond = active[-1]
            active[-1] = (parent, not cond)
        elif s == "fi" and active:
            active.pop()
        elif s.startswith(("pushd", "popd", "case ", "esac")):
            return [], f"runs in a directory bench.sh's build-bench-env.sh sets up ({s})"
        elif re.match(r"^\w+=", s):
            continue  # bench.sh's own bookkeeping (redis_tail=...)
        else:
            m = _RUN_CMD.match(s)
            if m is None:
                return [], f"bench.sh line not understood: {s}"
            if on:
                out.append((m.group(1), m.group(2) or ""))
    return out, ""


def procs_values(procs: int, benchdir: str) -> Dict[str, str]:
    """bench.sh's variables derived from procs (as it computes them), and benchdir."""
    return {"procs": str(procs), "procsx2": str(procs * 2), "procsx4": str(procs * 4),
            "procs_div2": str(procs // 2), "procs_max16": str(min(procs, 16)),
            "benchdir": benchdir}


def substitute(command: str, values: Dict[str, str]) -> Tuple[str, List[str]]:
    """command with the known variables put in, and the unknown ones named."""
    unknown: List[str] = []

    def put(m: "re.Match[str]") -> str:
        name = m.group(1) or m.group(2)
        if name in values:
            return values[name]
        unknown.append(name)
        return m.group(0)
    return _VAR.sub(put, command), unknown


def _thread_factor(command: str) -> int:
    for var, factor in (("procsx4", 4), ("procsx2", 2), ("procs_max16", 1), ("procs", 1)):
        if re.search(r"\$\{?" + var + r"\b", command):
            return factor
    return 0


def bre_to_python(bre: str) -> str:
    """A sed basic regular expression (bench.sh's) as a Python one: \\( \\) group,
    bare ( ) literal."""
    out, i = [], 0
    while i < len(bre):
        c = bre[i]
        if c == "\\" and i + 1 < len(bre):
            nxt = bre[i + 1]
            out.append(nxt if nxt in "()" else "\\" + nxt)
            i += 2
            continue
        out.append("\\" + c if c in "()+?{}|" else c)
        i += 1
    return "".join(out)


_SED = re.compile(r"sed -n 's/(.*)/\\1/p'")
_RATIO = re.compile(r'scale=\d+;\s*\((\d+)\s*/\s*\$ops\)')


def derivations(text: str) -> List[Derivation]:
    """The times bench.sh derives from a test's output: the `case` after its
    "fixup" comment in run_test_env_cmd (a sed expression on the output,
    then `K / $ops` when it computes one)."""
    body = function_body(text, "run_test_env_cmd")
    start = next((i for i, ln in enumerate(body) if "fixup" in ln), None)
    if start is None:
        return []
    out: List[Derivation] = []
    for label, lines in case_branches(body[start:]):
        joined = "\n".join(lines)
        sed = _SED.search(joined)
        if sed is None:
            continue
        ratio = _RATIO.search(joined)
        for pat in label.split("|"):
            out.append(Derivation(pat, bre_to_python(sed.group(1)),
                                  float(ratio.group(1)) if ratio else None))
    return out


def stdin_files(text: str, benchdir: str) -> Dict[str, str]:
    """Tests whose standard input bench.sh sets (`infile=` in run_test_env_cmd):
    label pattern -> path."""
    body = function_body(text, "run_test_env_cmd")
    out: Dict[str, str] = {}
    for label, lines in case_branches(body):
        for ln in lines:
            m = re.search(r'infile="([^"]+)"', ln)
            if m:
                path, _ = substitute(m.group(1), {"benchdir": benchdir})
                for pat in label.split("|"):
                    out[pat] = path
    return out


def _match(name: str, table: Dict[str, str]) -> Optional[str]:
    return next((v for pat, v in table.items() if fnmatch.fnmatchcase(name, pat)), None)


def groups_of(text: str) -> Dict[str, List[str]]:
    """bench.sh's test lists: tests_all1.. -> the test families in each."""
    out: Dict[str, List[str]] = {}
    for m in re.finditer(r'^readonly\s+(tests_all\d)="([^"$]*)"', text, re.M):
        out[m.group(1)] = m.group(2).split()
    return out


def read_suite(checkout: Path, procs: int) -> Suite:
    """The checkout's tests for `procs` (see the module's comment)."""
    script = checkout / "bench.sh"
    if not script.is_file() or not (checkout / "bench" / "CMakeLists.txt").is_file():
        raise BenchError(f"{checkout} is not a mimalloc-bench checkout (no bench.sh and "
                         "bench/CMakeLists.txt): get one with `git clone "
                         "https://github.com/daanx/mimalloc-bench`")
    text = script.read_text(errors="replace")
    benchdir = str((checkout / "bench").resolve())
    values = procs_values(procs, benchdir)
    derived = derivations(text)
    inputs = stdin_files(text, benchdir)
    suite = Suite(checkout, groups_of(text), [])
    for family, lines in case_branches(function_body(text, "run_test")):
        if family == "*":
            continue
        commands, why = family_commands(lines, procs)
        if why:
            suite.skipped[family] = why
            continue
        for name, raw in commands:
            command, unknown = substitute(raw, values)
            if not command.strip():
                suite.skipped[name] = "not a timing (bench.sh runs its own checks for it)"
                continue
            if unknown:
                suite.skipped[name] = (f"needs ${', $'.join(unknown)}, which bench.sh's "
                                       "build-bench-env.sh sets up")
                continue
            d = next((x for x in derived if fnmatch.fnmatchcase(name, x.pattern)), None)
            suite.tests.append(SuiteTest(name, family, command, _match(name, inputs), d,
                                         _thread_factor(raw)))
    return suite


# ---- building bench/ -------------------------------------------------------------------

_MISSING = re.compile(r"CMake Error at (?:.*/)?CMakeLists\.txt:(\d+) \(add_executable\):\n"
                      r"\s*Cannot find source file:\n\s*\n\s*(\S+)")


def missing_sources(cmake_output: str, cmakelists: str) -> Dict[str, str]:
    """From a failed configure: target -> the source file CMake did not find."""
    lines = cmakelists.split("\n")
    out: Dict[str, str] = {}
    for m in _MISSING.finditer(cmake_output):
        n = int(m.group(1))
        if 0 < n <= len(lines):
            t = re.match(r"\s*add_executable\s*\(\s*([\w.+-]+)", lines[n - 1])
            if t:
                out[t.group(1)] = m.group(2)
    return out


def without_targets(cmakelists: str, targets: Sequence[str]) -> str:
    """cmakelists with every command whose first argument is one of targets
    left out (add_executable, target_*, set_target_properties...)."""
    names = "|".join(re.escape(t) for t in targets)
    cmd = re.compile(r"^\s*\w+\s*\(\s*(" + names + r")[\s)]")
    out: List[str] = []
    depth = 0
    for ln in cmakelists.split("\n"):
        if depth == 0 and cmd.match(ln):
            depth = ln.count("(") - ln.count(")")
            out.append("# left out by coralloc-bench (sources missing): " + ln.strip())
            continue
        if depth > 0:
            depth += ln.count("(") - ln.count(")")
            continue
        out.append(ln)
    return "\n".join(out)


def _link(path: Path, target: Path) -> None:
    if path.is_symlink() or path.exists():
        if path.is_symlink() and Path(os.readlink(path)) == target:
            return
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    path.symlink_to(target)


def _configure(src: Path, bdir: Path) -> subprocess.CompletedProcess[str]:
    cache = bdir / "CMakeCache.txt"
    if cache.is_file() and f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\n" not in cache.read_text():
        shutil.rmtree(bdir)  # configured from another source tree
    bdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["cmake", "-S", str(src), "-B", str(bdir),
                           "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True)


_MISSING_MEMO = "missing-sources.json"


def _missing_remembered(state: Path, bench: Path, cmakelists: str) -> Dict[str, str]:
    """The targets whose sources a configure of this CMakeLists.txt found
    missing, as _missing_remember kept them; empty when none were kept, the
    file changed since, or one of those sources is in bench/ now (bench.sh's
    set-up script fetched it)."""
    try:
        memo = json.loads((state / _MISSING_MEMO).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(memo, dict) or memo.get("cmakelists") != _digest(cmakelists):
        return {}
    missing = memo.get("missing")
    if not isinstance(missing, dict) or not missing:
        return {}
    if any((bench / str(src)).exists() for src in missing.values()):
        return {}
    return {str(t): str(src) for t, src in missing.items()}


def _missing_remember(state: Path, cmakelists: str, missing: Dict[str, str]) -> None:
    memo = {"cmakelists": _digest(cmakelists), "missing": missing}
    (state / _MISSING_MEMO).write_text(json.dumps(memo, indent=1, sort_keys=True) + "\n")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _mirror(bench: Path, mirror: Path, cmakelists: str) -> None:
    """mirror: every entry of bench/ linked, and CMakeLists.txt as given."""
    mirror.mkdir(parents=True, exist_ok=True)
    for e in bench.iterdir():
        if e.name != "CMakeLists.txt":
            _link(mirror / e.name, e.resolve())
    (mirror / "CMakeLists.txt").write_text(cmakelists)


def build(checkout: Path, state: Path, programs: Sequence[str], log: Log,
          jobs: int = 2) -> Tuple[Path, Dict[str, str]]:
    """Build `programs` from the checkout's bench/ with its CMake in
    state/out/bench; the build directory and program -> why it is not built."""
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        raise BenchError("cmake and a C++ compiler are needed to build mimalloc-bench "
                         "(apt-get install cmake g++)")
    bench = (checkout / "bench").resolve()
    state.mkdir(parents=True, exist_ok=True)
    _link(state / "bench", bench)  # ../../bench from out/bench, as bench.sh has it
    bdir = state / "out" / "bench"
    log(f"{NAME}: configuring {bench} in {bdir}")
    text = (bench / "CMakeLists.txt").read_text()
    # A checkout whose sources were found missing before (and whose
    # CMakeLists.txt is the same) is configured from its mirror at once:
    # configuring the checkout first would find the build directory made
    # from the mirror and remove it, so that every run rebuilt every program
    # and kept only its own.
    missing = _missing_remembered(state, bench, text)
    if not missing:
        r = _configure((state / "bench").resolve(), bdir)
        if r.returncode != 0:
            missing = missing_sources(r.stdout + r.stderr, text)
            if not missing:
                tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
                raise BenchError(f"configuring {bench} failed: {' / '.join(tail)}")
    gone = {t: f"sources missing ({s} is not in the checkout)" for t, s in missing.items()}
    if missing:
        src = state / "src"
        _mirror(bench, src, without_targets(text, list(missing)))
        r = _configure(src.resolve(), bdir)
        if r.returncode != 0:
            tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
            raise BenchError(f"configuring {bench} without {', '.join(missing)} failed: "
                             f"{' / '.join(tail)}")
        _missing_remember(state, text, missing)
    for p in sorted(set(programs) - set(gone)):
        b = subprocess.run(["cmake", "--build", str(bdir), "--target", p, "-j", str(jobs)],
                           capture_output=True, text=True)
        if b.returncode != 0 or not (bdir / p).is_file():
            err = [ln for ln in (b.stdout + b.stderr).splitlines() if "error" in ln.lower()]
            gone[p] = "build failed: " + (err[0].strip()[:200] if err else f"exit {b.returncode}")
    for p, why in sorted(gone.items()):
        log(f"{NAME}: {p} is not built: {why}")
    return bdir, gone


# ---- running a test -----------------------------------------------------------------------

def run_test(t: SuiteTest, bdir: Path, alloc: Allocator, ctx: RunContext,
             timeout: float) -> Tuple[Outcome, Check, List[str]]:
    """One run of a test as bench.sh runs it (its command line in
    out/bench, its standard input), under the allocator and the malloc
    witness: a failure when it fails, when bench.sh's derived time cannot be
    read from its output, or when a process of it was served by another
    malloc."""
    argv = t.argv
    if not t.program:
        exe = shutil.which(argv[0])
        if exe is None:
            pkg = DEBIAN_PACKAGES.get(argv[0], argv[0])
            return (Outcome(None, 0, 0, 0, 0, 0, 0, "", ""),
                    Check(False, f"skipped: {argv[0]} not installed (apt-get install {pkg})"),
                    argv)
    witness_file = ctx.work_dir / f"{t.name}-{alloc.name}.witness"
    witness_file.unlink(missing_ok=True)
    env = witnessed_env(alloc, ctx, witness_file)
    o = measure(argv, env, timeout, stdin_path=t.stdin, cwd=str(bdir), launcher=ctx.launcher)
    served, who = witness_verdict(alloc, ctx, witness_file)
    why = failure_reason(o, timeout) or served
    if why:
        return o, Check(False, why, served_by=who), argv
    time_s: Optional[float] = None
    if t.derivation is not None:
        time_s = t.derivation.time_from(o.stdout)
        if time_s is None or time_s <= 0:
            return o, Check(False, f"no time in the output (bench.sh reads it with "
                               f"/{t.derivation.regex}/)", served_by=who), argv
    c = Check(True, "", "", None, {"bench_time_s": time_s or o.wall_s}, who, time_s)
    return o, c, argv


def workloads(suite: Suite, bdir: Path) -> Tuple[List[Workload], Dict[str, Executor]]:
    """The suite's tests as workloads of the matrix, and their runners."""
    out: List[Workload] = []
    ex: Dict[str, Executor] = {}
    for t in suite.tests:
        tail = t.argv[1:]
        args = {"quick": (lambda t_: lambda n: list(t_))(tail),
                "full": (lambda t_: lambda n: list(t_))(tail)}
        program = str(bdir / t.program) if t.program else t.argv[0]
        out.append(Workload(t.name, NAME, f"bench.sh: {t.command}", program, args, profiles=(),
                            thread_factor=min(t.thread_factor, 2),
                            timeout={"quick": TIMEOUT_S, "full": TIMEOUT_S}))
        ex[t.name] = (lambda t_: lambda w, a, c, timeout: run_test(t_, bdir, a, c, timeout))(t)
    return out, ex


def select(suite: Suite, spec: Optional[str]) -> List[SuiteTest]:
    """--workloads with a suite: test names (larsonN), families (larson) or
    bench.sh's lists (tests_all1..); None: every test it can run."""
    if not spec:
        return list(suite.tests)
    chosen: List[SuiteTest] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        found = [t for t in suite.tests if item in (t.name, t.family)
                 or t.family in suite.groups.get(item, [])]
        if not found and item not in suite.skipped:
            known = sorted({t.name for t in suite.tests} | {t.family for t in suite.tests})
            raise BenchError(f"unknown {NAME} test '{item}' (known: {', '.join(known)})")
        chosen += [t for t in found if t not in chosen]
    if not chosen:
        raise BenchError("--workloads names no test this runner can run")
    return chosen


def install_programs(tests: Sequence[SuiteTest], install: bool, log: Log,
                     apt: Callable[[Sequence[str], Log], bool]) -> Dict[str, str]:
    """Install the Debian packages of the system programs the tests call
    (ruby, z3) when `install` (apt only works as root); the tests whose
    program is still missing: name -> why (they are not run)."""
    def missing() -> List[SuiteTest]:
        return [t for t in tests if not t.program and shutil.which(t.argv[0]) is None]
    need = sorted({DEBIAN_PACKAGES.get(t.argv[0], t.argv[0]) for t in missing()})
    if need and install:
        apt(need, log)
    return {t.name: f"{t.argv[0]} is not installed (apt-get install "
                    f"{DEBIAN_PACKAGES.get(t.argv[0], t.argv[0])}, as root)" for t in missing()}
