"""The peers that are not Debian packages: mimalloc 3 from PyPI, snmalloc and
rpmalloc from crates.io, each pinned to one version, fetched with the
registry's own client and built here at run time (never copied into the
repository). Builds are cached under bench/.peers/ (gitignored); a peer that
cannot be had is reported with the reason and the run goes on without it.

- mimalloc3: the PyPI package cmeel-mimalloc 3.4.3 ships a release build of
  libmimalloc.so.3.4; bench/run-bench installs it into bench/.venv (the
  `peers` extra of bench/pyproject.toml).
- snmalloc: the crate snmalloc-sys 0.7.6 ships snmalloc's sources; its CMake
  builds libsnmallocshim.so (Release), snmalloc's own LD_PRELOAD shim.
- rpmalloc: the crate rpmalloc-sys 0.2.3 ships rpmalloc 1.4.3's C source;
  compiled as its release build (-O3 -funroll-loops) with ENABLE_PRELOAD and
  ENABLE_OVERRIDE (the malloc family overridden), as rpmalloc's own
  configure.py builds librpmallocwrap.so.
  rpmalloc 2.0 is on no package registry.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

Log = Callable[[str], None]


class PeerMissing(Exception):
    """A peer that cannot be had here; the message says why."""


@dataclass(frozen=True)
class Peer:
    name: str
    version: str  # the allocator's own version
    package: str  # where it comes from, pinned: "PyPI cmeel-mimalloc==3.4.3"
    obtain: Callable[["Peer", Path, bool, Log], str]  # -> library path
    build: str = ""  # how it is built and the options it runs with (the report says it)


# ---- mimalloc 3 from PyPI --------------------------------------------------------

MIMALLOC3_DIST = "cmeel-mimalloc"
MIMALLOC3_VERSION = "3.4.3"
MIMALLOC3_FILE = "libmimalloc.so.3.4"


def _obtain_mimalloc3(peer: Peer, cache: Path, install: bool, log: Log) -> str:
    """libmimalloc.so.3.4 from the cmeel-mimalloc distribution installed in
    this runner's Python environment (bench/.venv)."""
    from importlib import metadata
    try:
        dist = metadata.distribution(MIMALLOC3_DIST)
    except metadata.PackageNotFoundError:
        raise PeerMissing(f"PyPI package {MIMALLOC3_DIST}=={MIMALLOC3_VERSION} is not "
                          f"installed in {sys.prefix} (bench/run-bench --setup installs it)")
    if dist.version != MIMALLOC3_VERSION:
        raise PeerMissing(f"{MIMALLOC3_DIST} {dist.version} is installed, not "
                          f"{MIMALLOC3_VERSION}")
    for f in dist.files or []:
        if f.name == MIMALLOC3_FILE:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return str(path)
    raise PeerMissing(f"{MIMALLOC3_DIST} {dist.version} has no {MIMALLOC3_FILE}")


# ---- crates ----------------------------------------------------------------------

def find_cargo() -> Optional[str]:
    """cargo on PATH, else rustup's default place."""
    found = shutil.which("cargo")
    if found:
        return found
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    cand = home / "bin" / "cargo"
    return str(cand) if cand.is_file() else None


def crate_source(crate: str, version: str, cache: Path, log: Log) -> Path:
    """The unpacked source of crate==version, fetched by cargo from crates.io
    through a throwaway project under `cache` (cargo keeps the sources in
    its own registry cache; `cargo metadata` says where)."""
    cargo = find_cargo()
    if cargo is None:
        raise PeerMissing("cargo is not installed (rustup, or apt-get install cargo)")
    proj = cache / "cargo" / f"{crate}-{version}"
    (proj / "src").mkdir(parents=True, exist_ok=True)
    (proj / "src" / "lib.rs").write_text("")
    (proj / "Cargo.toml").write_text(
        f'[package]\nname = "coralloc-bench-fetch"\nversion = "0.0.0"\nedition = "2021"\n'
        f'publish = false\n\n[dependencies]\n'
        f'{crate} = {{ version = "={version}", default-features = false }}\n')
    log(f"fetching crate {crate} {version} with cargo")
    try:
        r = subprocess.run([cargo, "metadata", "--format-version", "1", "--manifest-path",
                            str(proj / "Cargo.toml")], capture_output=True, text=True,
                           timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise PeerMissing(f"cargo metadata failed: {e}")
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise PeerMissing(f"cargo could not fetch {crate} {version}: {tail}")
    for pkg in json.loads(r.stdout).get("packages", []):
        if pkg.get("name") == crate and pkg.get("version", "").split("+")[0] == version:
            return Path(pkg["manifest_path"]).parent
    raise PeerMissing(f"cargo did not resolve {crate} {version}")


def _run_build(cmds: Sequence[Sequence[str]], logfile: Path, what: str) -> None:
    with open(logfile, "w") as logf:
        for cmd in cmds:
            logf.write("$ " + " ".join(cmd) + "\n")
            logf.flush()
            try:
                r = subprocess.run(list(cmd), stdout=logf, stderr=subprocess.STDOUT,
                                   timeout=1200)
            except (OSError, subprocess.SubprocessError) as e:
                raise PeerMissing(f"building {what} failed: {e}")
            if r.returncode != 0:
                raise PeerMissing(f"building {what} failed (exit {r.returncode}; "
                                  f"log: {logfile})")


def _cached_build(peer: Peer, cache: Path, install: bool, log: Log, libname: str,
                  recipe: Sequence[str],
                  build: Callable[[Path, Path], None]) -> str:
    """cache/<name>-<hash of package and recipe>/<libname>, built by build(dir,
    log file) once (under a lock: two runners never build into one place)."""
    key = hashlib.sha256("\n".join([peer.package, *recipe]).encode()).hexdigest()[:10]
    out = cache / f"{peer.name}-{key}"
    lib = out / libname
    if lib.is_file():
        return str(lib)
    if not install:
        raise PeerMissing(f"not built yet ({lib}); run without --no-install to build it")
    out.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.is_file():
            log(f"building {peer.name} {peer.version} ({peer.package}) in {out}")
            tmp = out / (libname + ".tmp")
            build(tmp, out / "build.log")
            os.replace(tmp, lib)
    return str(lib)


SNMALLOC_CRATE = ("snmalloc-sys", "0.7.6")
SNMALLOC_CMAKE = ("-DCMAKE_BUILD_TYPE=Release", "-DSNMALLOC_BUILD_TESTING=OFF")


def _obtain_snmalloc(peer: Peer, cache: Path, install: bool, log: Log) -> str:
    def build(dest: Path, logfile: Path) -> None:
        if shutil.which("cmake") is None or shutil.which("c++") is None:
            raise PeerMissing("cmake and a C++ compiler are needed to build snmalloc")
        src = crate_source(*SNMALLOC_CRATE, cache, log) / "upstream"
        bdir = dest.parent / "build"
        _run_build([["cmake", "-S", str(src), "-B", str(bdir), *SNMALLOC_CMAKE],
                    ["cmake", "--build", str(bdir), "--target", "snmallocshim", "-j2"]],
                   logfile, "snmalloc")
        shutil.copy2(bdir / "libsnmallocshim.so", dest)
        shutil.rmtree(bdir, ignore_errors=True)
    return _cached_build(peer, cache, install, log, "libsnmallocshim.so", SNMALLOC_CMAKE, build)


RPMALLOC_CRATE = ("rpmalloc-sys", "0.2.3")
# -O3 -funroll-loops: rpmalloc's own release build (its build/ninja scripts).
RPMALLOC_FLAGS = ("-O3", "-funroll-loops", "-shared", "-fPIC", "-D_GNU_SOURCE",
                  "-DENABLE_PRELOAD=1", "-DENABLE_OVERRIDE=1")


def _obtain_rpmalloc(peer: Peer, cache: Path, install: bool, log: Log) -> str:
    def build(dest: Path, logfile: Path) -> None:
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise PeerMissing("a C compiler is needed to build rpmalloc")
        src = crate_source(*RPMALLOC_CRATE, cache, log) / "rpmalloc"
        changelog = (src / "CHANGELOG").read_text().split()
        if not changelog or changelog[0] != peer.version:
            raise PeerMissing(f"{RPMALLOC_CRATE[0]} {RPMALLOC_CRATE[1]} ships rpmalloc "
                              f"{changelog[0] if changelog else '?'}, not {peer.version}")
        _run_build([[cc, *RPMALLOC_FLAGS, "-o", str(dest), str(src / "rpmalloc" / "rpmalloc.c"),
                     "-lpthread"]], logfile, "rpmalloc")
    return _cached_build(peer, cache, install, log, "librpmalloc.so", RPMALLOC_FLAGS, build)


PEERS: Tuple[Peer, ...] = (
    Peer("mimalloc3", MIMALLOC3_VERSION, f"PyPI {MIMALLOC3_DIST}=={MIMALLOC3_VERSION}",
         _obtain_mimalloc3, "the package's release build, mimalloc's default options "
         "(no MIMALLOC_* set: transparent huge pages allowed, as its default; "
         "`--alloc NAME=PATH,MIMALLOC_ALLOW_THP=0` runs it without)"),
    Peer("snmalloc", SNMALLOC_CRATE[1],
         f"crates.io {SNMALLOC_CRATE[0]} {SNMALLOC_CRATE[1]}", _obtain_snmalloc,
         f"cmake {' '.join(SNMALLOC_CMAKE)}, its libsnmallocshim.so, default options"),
    Peer("rpmalloc", "1.4.3", f"crates.io {RPMALLOC_CRATE[0]} {RPMALLOC_CRATE[1]}",
         _obtain_rpmalloc, f"cc {' '.join(RPMALLOC_FLAGS)}, default options"),
)
PEER_NAMES = tuple(p.name for p in PEERS)


def default_cache(root: Path) -> Path:
    return root / "bench" / ".peers"


def obtain_all(cache: Path, install: bool, log: Log,
               peers: Sequence[Peer] = PEERS) -> Tuple[Dict[str, Tuple[Peer, str]],
                                                         Dict[str, str]]:
    """Every peer that can be had: name -> (peer, library path); and the
    missing ones: name -> reason."""
    found: Dict[str, Tuple[Peer, str]] = {}
    missing: Dict[str, str] = {}
    for p in peers:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            found[p.name] = (p, p.obtain(p, cache, install, log))
        except (PeerMissing, OSError) as e:
            missing[p.name] = str(e)
    return found, missing


def names() -> List[str]:
    return list(PEER_NAMES)
