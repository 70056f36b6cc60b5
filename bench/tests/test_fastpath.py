"""`coralloc-bench fastpath`: the provider check and the counts."""

from __future__ import annotations

import shutil

import pytest

from coralloc_bench import fastpath
from coralloc_bench.allocators import Allocator
from coralloc_bench.util import BenchError
from conftest import libc_path


def test_a_run_not_served_by_the_allocator_fails() -> None:
    stderr = f"fastpath: malloc from {libc_path()}\nfastpath: free from {libc_path()}\n"
    fastpath.check_provider(stderr, Allocator("system", None, "system"))
    with pytest.raises(BenchError, match="preload not in effect"):
        fastpath.check_provider(stderr, Allocator("x", "/x/libx.so", "user"))
    with pytest.raises(BenchError, match="no provider for free"):
        fastpath.check_provider(f"fastpath: malloc from {libc_path()}\n",
                                Allocator("system", None, "system"))


def test_glibc_pair_is_counted_linear() -> None:
    """The system allocator's malloc(16)+free pair, counted at N, 2N, 3N:
    both halves agree, and the table has one row with the figure."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind not installed")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    sc = [fastpath.BY_NAME["pair16"]]
    results, notes = fastpath.run([Allocator("system", None, "system")], sc, 0.02, cc,
                                  lambda s: None)
    m = results["pair16"]["system"]
    assert notes == []
    assert m.halves[0] == pytest.approx(m.halves[1], rel=0.02)
    row = fastpath.table(results, ["system"], sc, tablefmt="simple").splitlines()[-1].split()
    assert row == ["pair16", "per", "pair", f"{m.per_block:.1f}"]
