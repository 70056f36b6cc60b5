"""The real programs of the full profile: the answers the runner expects
are those the programs give, and the malloc witness names the object that
serves a process's malloc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from coralloc_bench import devtools
from coralloc_bench.allocators import Allocator
from coralloc_bench.execute import RunContext
from coralloc_bench.witness import witness_verdict, witnessed_env
from conftest import BENCH, libc_path


def test_gcc_expected_output(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed")
    (tmp_path / "g.c").write_text(devtools.gcc_source(12))
    subprocess.run([gcc, "-O2", "-o", str(tmp_path / "g"), str(tmp_path / "g.c")], check=True)
    out = subprocess.run([str(tmp_path / "g")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == devtools.gcc_expected(12)


def test_lua_expected_output(tmp_path: Path) -> None:
    lua = devtools.find_lua()
    if lua is None:
        pytest.skip("lua5.4 not installed (tests/packages.txt: make test installs it as root)")
    (tmp_path / "a.lua").write_text(devtools.LUA_SCRIPT)
    out = subprocess.run([lua, str(tmp_path / "a.lua"), "500"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == devtools.lua_expected(500)


def test_git_blob_id_is_gits(tmp_path: Path) -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git not installed")
    text = devtools.git_file(7, 5)
    (tmp_path / "f").write_text(text)
    out = subprocess.run([git, "hash-object", str(tmp_path / "f")], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == devtools.git_blob_id(text)


def test_the_witness_names_who_serves_malloc(witness: Path, tmp_path: Path) -> None:
    """Under `system` every process (a shell and what it starts) is served
    by libc; the same run judged as another allocator's is a failure that
    names libc."""
    ctx = RunContext(tmp_path, "quick", 1, tmp_path, None, witness)
    system = Allocator("system", None, "system")
    wf = tmp_path / "w.txt"
    subprocess.run(["sh", "-c", "ls >/dev/null; true"], env=witnessed_env(system, ctx, wf),
                   check=True)
    lines = wf.read_text().splitlines()
    assert len(lines) >= 2 and all("libc" in ln for ln in lines)
    why, who = witness_verdict(system, ctx, wf)
    assert why == "" and "libc" in who  # results.json's served_by names it
    other = Allocator("other", libc_path().replace("libc.so.6", "libm.so.6"), "user")
    assert witness_verdict(other, ctx, wf)[0].startswith("malloc served by ")
    assert witness_verdict(system, ctx, tmp_path / "none.txt") == \
        ("no process reported who served malloc", "")
    no_witness = RunContext(tmp_path, "quick", 1, tmp_path)
    assert "not built" in witness_verdict(system, no_witness, wf)[0]


def test_system_comes_first_in_a_program_that_links_another_malloc(witness: Path,
                                                                   tmp_path: Path) -> None:
    """A program linked with another allocator (Debian's redis-server links
    libjemalloc) is served by glibc under `system` once libc is preloaded."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "m.c").write_text("#include <stddef.h>\nextern void *__libc_malloc(size_t);\n"
                                  "void *malloc(size_t n) { return __libc_malloc(n); }\n")
    lib = tmp_path / "libm2.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "m.c")], check=True)
    (tmp_path / "p.c").write_text("int main(void) { return 0; }\n")
    prog = tmp_path / "p"
    subprocess.run([cc, "-o", str(prog), str(tmp_path / "p.c"), "-Wl,--no-as-needed",
                    f"-L{tmp_path}", "-lm2", f"-Wl,-rpath,{tmp_path}"], check=True)
    ctx = RunContext(tmp_path, "quick", 1, tmp_path, None, witness)
    system = Allocator("system", None, "system")
    plain, first = tmp_path / "plain.txt", tmp_path / "first.txt"
    subprocess.run([str(prog)], env=witnessed_env(system, ctx, plain), check=True)
    subprocess.run([str(prog)], env=witnessed_env(system, ctx, first, libc_first=True),
                   check=True)
    assert "libm2.so" in witness_verdict(system, ctx, plain)[0]
    assert witness_verdict(system, ctx, first)[0] == ""


def test_ruby_expected_output(tmp_path: Path) -> None:
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.skip("ruby not installed")
    (tmp_path / "a.rb").write_text(devtools.RUBY_SCRIPT)
    out = subprocess.run([ruby, str(tmp_path / "a.rb"), "300", "2"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == devtools.ruby_expected(300, 2)
