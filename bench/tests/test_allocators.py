"""Allocator verification: a preloaded library must really define the malloc
the process calls before any of its numbers is trusted."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import libc_path, other_shared_lib
from coralloc_bench.allocators import (Allocator, judge_probe, parse_alloc_specs, select,
                                       verify)
from coralloc_bench.util import BenchError, is_shared_library

MIM = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"


def probe_out(lib: str, owns: int | None = None, others: str | None = None) -> str:
    lines = [f"sym {s} {lib}" for s in ("malloc", "free", "calloc", "realloc")]
    lines += [f"sym {s} {others or lib}" for s in ("pvalloc", "reallocarray")]
    if owns is not None:
        lines.append(f"owns {owns}")
    return "\n".join(lines + ["ok"]) + "\n"


def test_judge_system() -> None:
    a = Allocator("system", None, "system")
    assert judge_probe(a, 0, probe_out("/lib/x86_64-linux-gnu/libc.so.6"), "").ok
    r = judge_probe(a, 0, probe_out(MIM), "")
    assert not r.ok and "malloc resolves to" in r.reason


def test_judge_fake_lib_path() -> None:
    a = Allocator("mimalloc", MIM, "debian")
    assert judge_probe(a, 0, probe_out(MIM), "").ok
    # silently fell back to glibc: not trusted
    r = judge_probe(a, 0, probe_out("/lib/x86_64-linux-gnu/libc.so.6"), "")
    assert not r.ok and r.reason == \
        "malloc resolves to /lib/x86_64-linux-gnu/libc.so.6, not libmimalloc.so.2"
    # the dynamic linker refused the library
    r = judge_probe(a, 0, probe_out("/lib/x86_64-linux-gnu/libc.so.6"),
                    "ERROR: ld.so: object '/x.so' from LD_PRELOAD cannot be preloaded: ignored.")
    assert not r.ok and "cannot be preloaded" in r.reason
    # crashed at start-up
    r = judge_probe(a, -11, "", "")
    assert not r.ok and "signal 11" in r.reason
    # only part of the API overridden: trusted, with a note
    r = judge_probe(a, 0, probe_out(MIM, others="/lib/x86_64-linux-gnu/libc.so.6"), "")
    assert r.ok and "pvalloc, reallocarray" in r.notes[0]


def test_judge_coralloc_owns() -> None:
    a = Allocator("coralloc", "/b/libcoralloc.so", "build")
    assert judge_probe(a, 0, probe_out("/b/libcoralloc.so", owns=1), "").ok
    r = judge_probe(a, 0, probe_out("/b/libcoralloc.so", owns=0), "")
    assert not r.ok and "coral_owns" in r.reason
    r = judge_probe(a, 0, probe_out("/b/libcoralloc.so"), "")
    assert r.ok and "coral_owns not exported" in r.notes[0]


def test_verify_with_the_real_probe(probe: Path) -> None:
    sysa = Allocator("system", None, "system")
    assert verify(sysa, probe).ok and sysa.verified
    # a real shared library that does not define malloc: not verified
    fake = Allocator("fake", other_shared_lib(), "user")
    r = verify(fake, probe)
    assert not r.ok and not fake.verified
    assert r.reason.startswith("malloc resolves to") and "libc" in r.reason


def test_verify_a_preloaded_malloc(probe: Path, tmp_path: Path) -> None:
    """A tiny allocator of our own (forwarding to glibc) is recognised."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "mini.c"
    src.write_text("""
#include <stddef.h>
extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t), *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t s) { return __libc_calloc(n, s); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
""")
    lib = tmp_path / "libmini.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    a = parse_alloc_specs([f"mini={lib}"])["mini"]
    r = verify(a, probe)
    assert r.ok, r.reason
    assert os.path.realpath(r.symbols["malloc"]) == os.path.realpath(lib)
    assert any("aligned_alloc" in n for n in r.notes)


def test_alloc_specs() -> None:
    with pytest.raises(BenchError, match="NAME=/path"):
        parse_alloc_specs(["nolib"])
    with pytest.raises(BenchError, match="does not exist"):
        parse_alloc_specs(["x=/nonexistent/lib.so"])
    with pytest.raises(BenchError, match="not a shared library"):
        parse_alloc_specs(["x=/etc/hostname" if os.path.exists("/etc/hostname") else
                           "x=/etc/passwd"])
    with pytest.raises(BenchError, match="not a usable allocator name"):
        parse_alloc_specs([f"system={libc_path()}"])
    assert parse_alloc_specs([f"my-alloc={libc_path()}"])["my-alloc"].source == "user"


def test_alloc_spec_settings() -> None:
    a = parse_alloc_specs([f"thp={libc_path()},CORALLOC_HUGE_PAGES=1,X_Y=a=b"])["thp"]
    assert a.settings == {"CORALLOC_HUGE_PAGES": "1", "X_Y": "a=b"}
    env = a.env()
    assert env["CORALLOC_HUGE_PAGES"] == "1" and env["X_Y"] == "a=b"
    assert env["LD_PRELOAD"] == os.path.abspath(libc_path())
    assert parse_alloc_specs([f"plain={libc_path()}"])["plain"].settings == {}
    for bad in ("NOEQUALS", "1BAD=2", "LD_PRELOAD=/x.so", "=v"):
        with pytest.raises(BenchError, match="VAR=VALUE"):
            parse_alloc_specs([f"x={libc_path()},{bad}"])


def test_is_shared_library(tmp_path: Path) -> None:
    assert is_shared_library(libc_path())
    assert not is_shared_library("/etc/passwd")
    assert not is_shared_library(str(tmp_path / "none.so"))
    (tmp_path / "short").write_bytes(b"\x7fELF")
    assert not is_shared_library(str(tmp_path / "short"))


def test_select() -> None:
    found = {"system": Allocator("system", None, "system"),
             "mimalloc": Allocator("mimalloc", MIM, "debian")}
    notes: list[str] = []
    assert [a.name for a in select("mimalloc,system", found, [], notes.append)] == \
        ["mimalloc", "system"]
    assert [a.name for a in select(None, found, [])] == ["system", "mimalloc"]
    # known but not installed here: skipped with a note
    assert [a.name for a in select("system,tcmalloc", found, [], notes.append)] == ["system"]
    assert notes and "tcmalloc" in notes[0]
    with pytest.raises(BenchError, match="unknown allocator 'hoard'"):
        select("hoard", found, [])
    with pytest.raises(BenchError, match="no allocator"):
        select("tcmalloc", found, [], notes.append)


def test_a_relative_build_dir_gives_an_absolute_preload(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The programs run in other directories (redis in its own, git in a
    repository): a relative LD_PRELOAD path would not load there."""
    from coralloc_bench import allocators
    from coralloc_bench.cli import build_parser
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b").mkdir()
    shutil.copy(other_shared_lib(), tmp_path / "b" / "libcoralloc.so")
    found = allocators.discover(None, [], Path("b"), False, lambda s: None,
                                peer_cache=tmp_path / "peers")
    assert found["coralloc"].path == str(tmp_path / "b" / "libcoralloc.so")
    assert build_parser().parse_args(["run", "--build-dir", "b"]).build_dir == \
        str(tmp_path / "b")
