"""Fixtures of the runner's tests: the probe and launcher programs (built ones
when ctest gives CORALLOC_BENCH_BUILD, else compiled here with cc), and fake
workloads that succeed, crash, fail their check, hang..."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH / "src"))

from coralloc_bench.allocators import Allocator  # noqa: E402
from coralloc_bench.workloads import Workload  # noqa: E402

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def _cc() -> Optional[str]:
    return shutil.which("cc") or shutil.which("gcc")


def _program(name: str, tmp: Path) -> Optional[Path]:
    built = os.environ.get("CORALLOC_BENCH_BUILD")
    if built and (Path(built) / name).is_file():
        return Path(built) / name
    cc = _cc()
    if cc is None:
        return None
    out = tmp / name
    subprocess.run([cc, "-O1", "-o", str(out), str(BENCH / "workloads" / f"{name}.c"), "-ldl",
                    "-pthread"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def progdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("progs")


@pytest.fixture(scope="session")
def probe(progdir: Path) -> Path:
    p = _program("alloc-probe", progdir)
    if p is None:
        pytest.skip("no C compiler and no built alloc-probe")
    return p


@pytest.fixture(scope="session")
def launcher(progdir: Path) -> Path:
    p = _program("run-measured", progdir)
    if p is None:
        pytest.skip("no C compiler and no built run-measured")
    return p


@pytest.fixture(scope="session")
def bindir(probe: Path, launcher: Path, progdir: Path) -> Path:
    """A directory that looks like a build's bench/ (probe and launcher)."""
    d = progdir / "bin"
    d.mkdir(exist_ok=True)
    for p in (probe, launcher):
        if not (d / p.name).exists():
            shutil.copy(p, d / p.name)
    return d


@pytest.fixture(scope="session")
def witness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The malloc witness (libmalloc-witness.so): the built one, else compiled here."""
    built = os.environ.get("CORALLOC_BENCH_BUILD")
    if built and (Path(built) / "libmalloc-witness.so").is_file():
        return Path(built) / "libmalloc-witness.so"
    cc = _cc()
    if cc is None:
        pytest.skip("no C compiler and no built witness")
    out = tmp_path_factory.mktemp("w") / "libmalloc-witness.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out),
                    str(BENCH / "witness" / "malloc-witness.c"), "-ldl"], check=True)
    return out


def libc_path() -> str:
    if os.path.exists(LIBC):
        return LIBC
    out = subprocess.run(["ldd", "/bin/true"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "libc.so" in line and "=>" in line:
            return line.split("=>")[1].split()[0]
    pytest.skip("cannot find libc")
    return ""


def other_shared_lib() -> str:
    """A real shared library that does not define malloc (libm)."""
    d = os.path.dirname(libc_path())
    for name in ("libm.so.6", "libdl.so.2", "libpthread.so.0"):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    pytest.skip("no libm to use as a fake allocator")
    return ""


# ---- fake workloads --------------------------------------------------------------

# each prints the library it was given (LD_PRELOAD) as its malloc_lib, like
# the real workloads, unless it is meant to lie
SCRIPTS: Dict[str, str] = {
    "ok": 'echo "info: malloc_lib=${LD_PRELOAD:-%LIBC%}"\necho "result: ops_per_sec=1000 x=2"\n',
    "slowok": 'sleep 0.2\necho "info: malloc_lib=${LD_PRELOAD:-%LIBC%}"\n'
              'echo "result: ops_per_sec=500"\n',
    "crash": 'echo "result: ops_per_sec=99999999"\nkill -SEGV $$\n',
    "badcheck": 'echo "result: ops_per_sec=99999999"\n'
                'echo "CHECK FAILED: block overwritten" >&2\nexit 3\n',
    "noresult": 'echo "info: malloc_lib=${LD_PRELOAD:-%LIBC%}"\n',
    "nolib": 'echo "result: ops_per_sec=1000"\n',
    "wronglib": 'echo "info: malloc_lib=/usr/lib/libsomethingelse.so"\n'
                'echo "result: ops_per_sec=99999999"\n',
    "hang": 'sleep 30\necho "result: ops_per_sec=1"\n',
    "zero": 'echo "info: malloc_lib=${LD_PRELOAD:-%LIBC%}"\necho "result: ops_per_sec=0"\n',
    # fails only when run under the fake coralloc
    "coralfail": 'if [ -n "$LD_PRELOAD" ]; then kill -ABRT $$; fi\n'
                 'echo "info: malloc_lib=%LIBC%"\necho "result: ops_per_sec=10"\n',
}


@pytest.fixture(scope="session")
def fake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fake")
    for name, body in SCRIPTS.items():
        p = d / name
        p.write_text("#!/bin/sh\n" + body.replace("%LIBC%", libc_path()))
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return d


def fake_workload(fake_dir: Path, name: str, timeout: float = 10.0) -> Workload:
    def no_args(t: int) -> List[str]:
        return []
    return Workload(name=f"fake-{name}", group="fake", description=f"fake {name}",
                    program=str(fake_dir / name), args={"quick": no_args, "full": no_args},
                    timeout={"quick": timeout, "full": timeout})


def fake_allocators() -> List[Allocator]:
    return [Allocator("system", None, "system"),
            Allocator("coralloc", other_shared_lib(), "user")]
