"""The workload table and the real programs' expected outputs."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import BENCH
from coralloc_bench import calibrate, realprogs
from coralloc_bench.util import BenchError
from coralloc_bench.workloads import BY_NAME, PROFILES, WORKLOADS, in_profile, select


def test_names_and_args() -> None:
    assert len(BY_NAME) == len(WORKLOADS)
    for w in WORKLOADS:
        assert re.match(r"^[a-z0-9-]+$", w.name)
        for p in PROFILES:
            args = w.argv_tail(p, 2)
            assert all(isinstance(a, str) for a in args)
        if not w.is_real:
            assert (BENCH / "workloads" / f"{w.program}.c").is_file()
        if w.name.endswith("-x2"):
            assert w.thread_factor == 2
    # every family of workloads is in the quick profile
    quick = {w.name for w in in_profile("quick")}
    for need in ("larson-128", "larson-1000", "xthread", "cache-scratch", "cache-thrash",
                 "churn", "bulk-64", "bulk-rand", "bulk-1700", "bulk-rand-subset",
                 "glibc-simple-16", "glibc-simple-64k-thread", "zero-fill-4k",
                 "large-window", "large-realloc", "tree", "leak", "json", "startup", "python",
                 "sqlite", "redis"):
        assert need in quick
    assert any(w.thread_factor == 2 for w in in_profile("quick"))
    assert {w.name for w in in_profile("quick")} < {w.name for w in in_profile("full")}


def test_threads_follow_the_option() -> None:
    larson = BY_NAME["larson-128"]
    assert larson.argv_tail("quick", 3)[:2] == ["--threads", "3"]
    assert BY_NAME["larson-128-x2"].argv_tail("quick", 3)[:2] == ["--threads", "6"]
    assert BY_NAME["xthread-x2"].threads_used(4) == 8


def test_select() -> None:
    assert [w.name for w in select("larson-128,json", "quick")] == ["larson-128", "json"]
    assert {w.name for w in select("larson", "quick")} == {"larson-128", "larson-1000",
                                                          "larson-128-x2"}
    assert "larson-1000-x2" in {w.name for w in select("larson", "full")}
    # a full-only workload can be named in the quick profile
    assert [w.name for w in select("tree-mt", "quick")] == ["tree-mt"]
    assert select(None, "quick") == in_profile("quick")
    with pytest.raises(BenchError, match="unknown workload 'nope'"):
        select("nope", "quick")
    with pytest.raises(BenchError, match="unknown profile"):
        select(None, "slow")


def test_sqlite_expected_output() -> None:
    """The independently computed answer matches sqlite3 itself (small n)."""
    exe = shutil.which("sqlite3")
    if exe is None:
        pytest.skip("sqlite3 not installed")
    n = 1000
    r = subprocess.run([exe, "-batch", ":memory:"], input=realprogs.sqlite_script(n),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == realprogs.sqlite_expected(n)


def test_bulk_matrix_is_complete() -> None:
    """Every size x release x memset combination runs through malloc/free and
    through the bulk API, with the same arguments but --api."""
    bulk = {w.name: w for w in WORKLOADS if w.group == "bulk"}
    assert len(bulk) == 3 * 2 * 2 * 2
    for name, w in bulk.items():
        if name.endswith("-api"):
            continue
        twin = bulk[name + "-api"]
        for p in PROFILES:
            plain, api = w.argv_tail(p, 2), twin.argv_tail(p, 2)
            assert plain[plain.index("--api") + 1] == "plain"
            assert api[api.index("--api") + 1] == "bulk"
            assert [a for a in plain if a != "plain"] == [a for a in api if a != "bulk"]
        args = w.argv_tail("full", 2)
        assert (args[args.index("--memset") + 1] == "0") == ("-touch" in name)
        assert (args[args.index("--release") + 1] == "subset") == ("-subset" in name)


def test_bulk_ceilings_twin_the_plain_loops() -> None:
    """Every plain bulk workload has a -null twin (no allocator) with the
    same arguments but --api null, in no profile (run by name only)."""
    by_name = {w.name: w for w in WORKLOADS}
    plain = [w for w in WORKLOADS if w.group == "bulk" and not w.name.endswith("-api")]
    nulls = [w for w in WORKLOADS if w.group == "bulk-null"]
    assert len(nulls) == len(plain) == 12
    for w in plain:
        twin = by_name[w.name + "-null"]
        assert twin.profiles == ()
        for p in PROFILES:
            a, b = w.argv_tail(p, 2), twin.argv_tail(p, 2)
            assert b[b.index("--api") + 1] == "null"
            assert [x for x in a if x != "plain"] == [x for x in b if x != "null"]
    for p in PROFILES:
        assert not any(w.group == "bulk-null" for w in select(None, p))
        assert not any(w.group == "bulk-null" for w in select("bulk", p))


@pytest.mark.parametrize("profile", ["quick"])
def test_every_workload_runs_long_enough(profile: str) -> None:
    """Every workload of the profile has the arguments it was last calibrated
    with (`coralloc-bench calibrate --profile quick --write`), and ran at
    least MIN_SECONDS under the baseline then: the figures measure the
    allocator, not process start-up and exit."""
    data = calibrate.load(profile)
    assert data is not None, f"no {calibrate.calibration_file(profile)}"
    assert str(data.get("allocator", "")).startswith("mimalloc3 3.4.3")
    assert calibrate.too_short(data, in_profile(profile), profile) == []


def test_a_changed_argument_needs_a_new_calibration() -> None:
    w = BY_NAME["json"]
    data = {"allocator": "x", "workloads": {
        "json": {"args": w.argv_tail("quick", 2)[:-1] + ["1"], "threads": 2, "wall_s": 1.0}}}
    assert calibrate.too_short(data, [w], "quick") == ["json: arguments changed since calibration"]
    data["workloads"]["json"] = {"args": w.argv_tail("quick", 2), "threads": 2, "wall_s": 0.1}
    assert calibrate.too_short(data, [w], "quick") == ["json: 0.1 s under x"]


def test_calibration_from_a_recorded_run() -> None:
    """A results file gives the same check: the arguments from its header,
    the baseline's median wall time from its runs."""
    from coralloc_bench.execute import FAILED, OK, RunRecord

    def run(a: str, wall: float, status: str = OK) -> RunRecord:
        return RunRecord("json", a, 1, status, "", 0, wall, 0, 0, 1, 1, 0, "x", 1.0, {}, 1,
                         "quick", [], 0.0)
    w = BY_NAME["json"]
    meta = {"threads": 2, "workloads": {"json": {"args": w.argv_tail("quick", 2)}}}
    got = calibrate.from_records([run("mimalloc3", 0.5), run("mimalloc3", 0.4),
                                  run("mimalloc3", 0.6), run("other", 0.1)], meta, "mimalloc3")
    assert got["json"]["wall_s"] == 0.5
    assert calibrate.too_short({"allocator": "m", "workloads": got}, [w], "quick") == []
    failed = calibrate.from_records([run("mimalloc3", 0.5, FAILED)], meta, "mimalloc3")
    assert failed["json"]["wall_s"] is None
