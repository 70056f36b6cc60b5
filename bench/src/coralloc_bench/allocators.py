"""Finding the allocators, installing the missing Debian ones, and proving
that each one really serves the calls of a process it is preloaded into."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from coralloc_bench import peers as peers_mod
from coralloc_bench.util import BenchError, is_shared_library, repo_root

# name -> (Debian package, file names to look for)
DEBIAN_ALLOCATORS: Dict[str, tuple[str, tuple[str, ...]]] = {
    "mimalloc": ("libmimalloc2.0", ("libmimalloc.so.2", "libmimalloc.so")),
    "jemalloc": ("libjemalloc2", ("libjemalloc.so.2", "libjemalloc.so")),
    "tcmalloc": ("libtcmalloc-minimal4", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")),
}
KNOWN = ("system", "coralloc", *peers_mod.PEER_NAMES, *DEBIAN_ALLOCATORS)
DEFAULT_BASELINE = "mimalloc3"
# the baseline when the one asked for is not run, in order of preference
BASELINE_FALLBACKS = ("mimalloc3", "mimalloc", "system")

# The entry points that must come from the allocator under test; the others
# are reported when they do not (a program calling them mixes allocators).
REQUIRED_SYMBOLS = ("malloc", "free", "calloc", "realloc")

NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,40}$")


@dataclass
class Allocator:
    name: str
    path: Optional[str]  # None: the system allocator (glibc), nothing preloaded
    source: str  # "system", "build", "debian", "pypi", "crate", "user"
    package: Optional[str] = None
    version: str = ""
    verified: bool = False
    notes: List[str] = field(default_factory=list)
    settings: Dict[str, str] = field(default_factory=dict)  # extra environment, e.g. options
    copy_of: Optional[str] = None  # `run --copies`: the allocator this one repeats
    # How it was built and with which options it runs (the report says it).
    build: str = ""

    def env(self) -> Dict[str, str]:
        """The environment of a run under this allocator."""
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        if self.path:
            env["LD_PRELOAD"] = self.path
        env.update(self.settings)
        return env

    def serves(self, lib_path: str) -> bool:
        """Is lib_path (a shared object that defines malloc in a process) this
        allocator's library?"""
        if lib_path in ("", "-", "unknown"):
            return False
        if self.path is None:
            return bool(re.match(r"libc([.-]|\.so)", os.path.basename(lib_path)))
        try:
            return os.path.realpath(lib_path) == os.path.realpath(self.path)
        except OSError:
            return False

    def to_json(self) -> Dict[str, object]:
        return {"path": self.path, "source": self.source, "package": self.package,
                "version": self.version, "verified": self.verified, "notes": self.notes,
                "settings": self.settings, "copy_of": self.copy_of, "build": self.build}


def copies(original: Allocator, n: int) -> List[Allocator]:
    """n copies of an allocator, named <name>-copy1 .. <name>-copyN: the same
    library and settings, run beside it as if they were peers. The report
    compares the original with them as with the peers: a gap to a copy is
    noise, so the copies show how far apart one allocator lands from itself
    on this machine (an A/A run)."""
    return [dataclasses.replace(original, name=f"{original.name}-copy{i}", notes=[],
                                copy_of=original.name) for i in range(1, n + 1)]


def lib_dirs() -> List[str]:
    dirs: List[str] = []
    multiarch = ""
    try:
        out = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True,
                             timeout=10)
        multiarch = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    if not multiarch:
        import sysconfig
        multiarch = str(sysconfig.get_config_var("MULTIARCH") or "")
    for base in ("/usr/lib", "/lib"):
        if multiarch:
            dirs.append(f"{base}/{multiarch}")
        dirs.append(base)
    dirs += ["/usr/lib64", "/usr/local/lib"]
    return dirs


def find_debian_lib(name: str) -> Optional[str]:
    _, files = DEBIAN_ALLOCATORS[name]
    for d in lib_dirs():
        for f in files:
            p = os.path.join(d, f)
            if os.path.isfile(p):
                return p
    return None


def debian_version(package: str) -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def glibc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return ""


def apt_install(packages: Sequence[str], log: Callable[[str], None]) -> bool:
    """apt-get install, as root only; an `apt-get update` first when the
    install fails (package lists missing or old). True when it worked."""
    if not packages:
        return True
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    log(f"installing {' '.join(packages)} with apt-get")
    for attempt in range(2):
        if attempt == 1:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True,
                           timeout=600)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if r.returncode == 0:
            return True
    log(f"apt-get install {' '.join(packages)} failed: "
        f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return False


def discover(coralloc_lib: Optional[str], extra: Sequence[str], build_root: Path,
             install: bool, log: Callable[[str], None],
             missing_out: Optional[Dict[str, str]] = None,
             peer_cache: Optional[Path] = None) -> Dict[str, Allocator]:
    """All allocators that can be run: system, coralloc (when built), the
    Debian ones (installed first when missing, if root and `install`), the
    pinned peers from PyPI and crates.io (fetched and built when missing,
    if `install`; see peers.py), and the user's NAME=/path ones. Missing ones
    are reported through log() and, with their reason, in missing_out."""
    found: Dict[str, Allocator] = {}
    gone: Dict[str, str] = missing_out if missing_out is not None else {}
    found["system"] = Allocator("system", None, "system", version=glibc_version(),
                                build="the C library's malloc, its default tunables")

    user = parse_alloc_specs(extra)
    cpath = coralloc_lib or (user.pop("coralloc").path if "coralloc" in user else None)
    if cpath is not None:
        check_library(cpath, "--coralloc-lib")
        found["coralloc"] = Allocator("coralloc", os.path.abspath(cpath), "user",
                                      build="given with --coralloc-lib, default options")
    else:
        # absolute: the programs run in other directories (LD_PRELOAD would
        # not find a relative path from there)
        default = Path(os.path.abspath(build_root / "libcoralloc.so"))
        if default.is_file():
            found["coralloc"] = Allocator("coralloc", str(default), "build",
                                          build="this tree's CMake build, default options")
        else:
            log(f"coralloc: {default} is not built (run `make build`, or give "
                f"--coralloc-lib PATH); going on without it")

    missing = [n for n in DEBIAN_ALLOCATORS if n not in user and find_debian_lib(n) is None]
    if missing and install:
        apt_install([DEBIAN_ALLOCATORS[n][0] for n in missing], log)
    for name, (pkg, _) in DEBIAN_ALLOCATORS.items():
        if name in user:
            continue
        path = find_debian_lib(name)
        if path is None:
            gone[name] = f"not installed; `apt-get install {pkg}` (as root) adds it"
            log(f"{name}: {gone[name]}; going on without it")
            continue
        found[name] = Allocator(name, path, "debian", package=pkg, version=debian_version(pkg),
                                build="Debian's build, default options")
    wanted = [p for p in peers_mod.PEERS if p.name not in user]
    got, lost = peers_mod.obtain_all(peer_cache or peers_mod.default_cache(repo_root()),
                                     install, log, wanted)
    for name, (peer, path) in got.items():
        found[name] = Allocator(name, path, "pypi" if peer.package.startswith("PyPI") else "crate",
                                package=peer.package, version=peer.version, build=peer.build)
    for name, why in lost.items():
        gone[name] = why
        log(f"{name}: missing: {why}; going on without it")
    for name, a in user.items():
        found[name] = a
    return found


def check_library(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise BenchError(f"{what}: {path} does not exist")
    if not is_shared_library(path):
        raise BenchError(f"{what}: {path} is not a shared library")


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_alloc_settings(name: str, items: Sequence[str]) -> Dict[str, str]:
    """The VAR=VALUE items after the library in an --alloc spec."""
    settings: Dict[str, str] = {}
    for item in items:
        var, sep, value = item.partition("=")
        if not sep or not ENV_NAME_RE.match(var) or var == "LD_PRELOAD":
            raise BenchError(f"--alloc {name}: '{item}' is not a VAR=VALUE setting")
        settings[var] = value
    return settings


def parse_alloc_specs(specs: Sequence[str]) -> Dict[str, Allocator]:
    """--alloc NAME=/path/lib.so[,VAR=VALUE...] (repeatable): the settings
    are added to the environment of this allocator's runs only, so one
    library can run under several option sets in one interleaved run (e.g.
    coralloc-thp=build/libcoralloc.so,CORALLOC_HUGE_PAGES=1)."""
    out: Dict[str, Allocator] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        name = name.strip()
        path, *items = rest.split(",")
        if not sep or not name or not path:
            raise BenchError(f"--alloc needs NAME=/path/lib.so, not '{spec}'")
        if not NAME_RE.match(name) or name == "system":
            raise BenchError(f"--alloc: '{name}' is not a usable allocator name")
        check_library(path, f"--alloc {name}")
        out[name] = Allocator(name, os.path.abspath(path), "user",
                              settings=parse_alloc_settings(name, items))
    return out


@dataclass
class ProbeResult:
    ok: bool
    reason: str
    symbols: Dict[str, str]
    notes: List[str]


def judge_probe(alloc: Allocator, returncode: int, stdout: str, stderr: str) -> ProbeResult:
    """Decide from alloc-probe's output whether `alloc` serves the calls."""
    symbols: Dict[str, str] = {}
    owns: Optional[int] = None
    for line in stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] == "sym":
            symbols[parts[1]] = parts[2]
        elif len(parts) == 2 and parts[0] == "owns":
            owns = int(parts[1]) if parts[1].isdigit() else 0
    notes: List[str] = []
    preload_err = [ln for ln in stderr.splitlines() if "LD_PRELOAD" in ln or "ld.so" in ln]
    if preload_err:
        return ProbeResult(False, preload_err[0].strip(), symbols, notes)
    if returncode != 0:
        why = f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"
        tail = (stderr.strip().splitlines() or [""])[-1]
        return ProbeResult(False, f"probe failed ({why}) {tail}".strip(), symbols, notes)
    if "ok" not in stdout.split():
        return ProbeResult(False, "probe did not finish", symbols, notes)
    for sym in REQUIRED_SYMBOLS:
        where = symbols.get(sym, "-")
        if not alloc.serves(where):
            want = "libc" if alloc.path is None else os.path.basename(alloc.path)
            return ProbeResult(False, f"{sym} resolves to {where}, not {want}", symbols, notes)
    others = [s for s, where in symbols.items()
              if s not in REQUIRED_SYMBOLS and where != "-" and not alloc.serves(where)]
    if others and alloc.path is not None:
        notes.append(f"not overridden (still glibc's): {', '.join(sorted(others))}")
    if alloc.name == "coralloc":
        if owns is None:
            notes.append("coral_owns not exported: ownership of malloc'ed blocks not checked")
        elif owns != 1:
            return ProbeResult(False, "coral_owns() does not claim a block from malloc()",
                               symbols, notes)
    return ProbeResult(True, "", symbols, notes)


def verify(alloc: Allocator, probe: Path, timeout: float = 30.0) -> ProbeResult:
    """Run alloc-probe under the allocator and judge the answer."""
    if not probe.is_file():
        raise BenchError(f"{probe} is not built (build the workloads first)")
    try:
        r = subprocess.run([str(probe)], env=alloc.env(), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return ProbeResult(False, f"probe hung for {timeout:.0f} s", {}, [])
    result = judge_probe(alloc, r.returncode, r.stdout, r.stderr)
    alloc.verified = result.ok
    alloc.notes.extend(result.notes)
    return result


def order(names: Sequence[str]) -> List[str]:
    """system, coralloc, the pinned peers, the Debian ones, then the user's."""
    known = [n for n in KNOWN if n in names]
    return known + sorted(n for n in names if n not in KNOWN)


def check_names(spec: Optional[str], user_names: Sequence[str]) -> None:
    """--allocs names only known allocators or --alloc ones (checked before
    anything is looked for, so that a typo is the only thing said)."""
    for item in (s.strip() for s in (spec or "").split(",")):
        if item and item not in KNOWN and item not in user_names:
            raise BenchError(f"unknown allocator '{item}' (known: {', '.join(order(KNOWN))}; "
                             f"add others with --alloc NAME=/path/lib.so)")


def select(spec: Optional[str], found: Dict[str, Allocator], user_names: Sequence[str],
           log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> List[Allocator]:
    """--allocs A,B: each must be a known allocator name or one given with
    --alloc; known but not found here is reported and skipped. An allocator
    given with --alloc runs whether or not --allocs names it."""
    if not spec:
        return [found[n] for n in order(list(found))]
    spec = ",".join([spec, *(n for n in user_names if n in found)])
    chosen: List[Allocator] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item in found:
            if found[item] not in chosen:
                chosen.append(found[item])
        elif item in KNOWN or item in user_names:
            log(f"{item}: not available here; skipped")
        else:
            raise BenchError(f"unknown allocator '{item}' (known: {', '.join(order(list(found)))};"
                             f" add others with --alloc NAME=/path/lib.so)")
    if not chosen:
        raise BenchError("no allocator to run")
    return chosen
