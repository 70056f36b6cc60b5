"""The rule that a crash, a non-zero exit or a wrong result is a failure in
the table, never a time; and the measurement itself."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from conftest import fake_allocators, fake_workload
from coralloc_bench.allocators import Allocator
from coralloc_bench.cli import exit_code_for
from coralloc_bench.execute import (FAILED, OK, RunContext, measure, parse_result_line,
                                    run_matrix)
from coralloc_bench.report import aggregate, build_table, geomean_ratios, METRIC_BY_KEY


def ctx(tmp_path: Path, launcher: Path | None) -> RunContext:
    return RunContext(bin_dir=tmp_path, profile="quick", threads=2, work_dir=tmp_path,
                      launcher=launcher)


@pytest.mark.parametrize("use_launcher", [True, False])
def test_failures_are_not_times(fake_dir: Path, tmp_path: Path, launcher: Path,
                                use_launcher: bool) -> None:
    names = ["ok", "crash", "badcheck", "noresult", "wronglib", "zero"]
    wls = [fake_workload(fake_dir, n) for n in names]
    allocs = fake_allocators()
    recs = run_matrix(wls, allocs, 1, ctx(tmp_path, launcher if use_launcher else None))
    by = {(r.workload, r.allocator): r for r in recs}
    assert len(recs) == len(names) * 2
    for a in ("system", "coralloc"):
        ok = by[("fake-ok", a)]
        assert ok.status == OK, ok.reason
        assert ok.figure == 1000 and ok.figures == {"ops_per_sec": 1000, "x": 2}
        assert ok.wall_s is not None and ok.wall_s > 0
        assert ok.exit_status == 0
        crash = by[("fake-crash", a)]
        assert crash.status == FAILED and crash.figure is None
        assert "SIGSEGV" in crash.reason and crash.exit_status == -11
        bad = by[("fake-badcheck", a)]
        assert bad.status == FAILED and bad.figure is None
        assert bad.reason.startswith("exit 3") and "CHECK FAILED" in bad.reason
        assert by[("fake-noresult", a)].reason == "no result line"
        assert "not a positive figure" in by[("fake-zero", a)].reason
        wrong = by[("fake-wronglib", a)]
        assert wrong.status == FAILED and "malloc served by /usr/lib/libsomethingelse.so" in \
            wrong.reason
    # the tables show FAILED, not the time the failed runs took
    cells = aggregate(recs)
    workloads = [w.name for w in wls]
    for key in ("time", "figure", "rss"):
        t = build_table(METRIC_BY_KEY[key], cells, workloads, ["system", "coralloc"], "system")
        rows = {r[0]: r for r in t.rows}
        for n in names[1:]:
            assert rows[f"fake-{n}"][1:] == ["FAILED", "FAILED"]
        assert rows["failed runs"][1:] == ["5", "5"]
    # and the geomean is over the workloads that completed only
    g, n = geomean_ratios(cells, "figure", workloads, "coralloc", "system")
    assert n == 1 and g == pytest.approx(1.0)


def test_one_failed_rep_fails_the_cell(fake_dir: Path, tmp_path: Path, launcher: Path) -> None:
    w = fake_workload(fake_dir, "coralfail")
    recs = run_matrix([w], fake_allocators(), 2, ctx(tmp_path, launcher))
    cells = aggregate(recs)
    assert cells[("fake-coralfail", "system")].status == OK
    assert cells[("fake-coralfail", "coralloc")].status == FAILED
    assert "SIGABRT" in cells[("fake-coralfail", "coralloc")].reason
    assert exit_code_for(recs) == 1
    assert exit_code_for([r for r in recs if r.allocator == "system"]) == 0


def test_interleaved_order(fake_dir: Path, tmp_path: Path, launcher: Path) -> None:
    wls = [fake_workload(fake_dir, "ok"), fake_workload(fake_dir, "slowok")]
    recs = run_matrix(wls, fake_allocators(), 3, ctx(tmp_path, launcher), seed=1)
    reps = [r.rep for r in recs]
    assert reps == sorted(reps), "rep k of everything runs before rep k+1"
    assert [r.workload for r in recs[:4]] == ["fake-ok"] * 2 + ["fake-slowok"] * 2


def test_allocator_order_is_drawn_anew_in_every_rep(fake_dir: Path, tmp_path: Path,
                                                    launcher: Path) -> None:
    """Not a rotation (where each allocator always runs right after the same
    one): the order of each repetition is a fresh permutation, replayable
    from its seed."""
    allocs = fake_allocators() + [Allocator("system-b", None, "system")]
    names = sorted(a.name for a in allocs)

    def orders(seed: int) -> List[Tuple[str, ...]]:
        recs = run_matrix([fake_workload(fake_dir, "ok")], allocs, 8, ctx(tmp_path, launcher),
                          seed=seed)
        assert all(r.status == OK for r in recs)
        return [tuple(r.allocator for r in recs if r.rep == k) for k in range(1, 9)]
    first = orders(7)
    assert all(sorted(o) == names for o in first)
    followers: Dict[str, set[str]] = {}
    for o in first:
        for a, b in zip(o, o[1:]):
            followers.setdefault(a, set()).add(b)
    assert any(len(f) > 1 for f in followers.values()), first
    assert len(set(first)) > 3, first
    assert orders(7) == first  # the seed replays it


def test_timeout_is_a_failure(fake_dir: Path, tmp_path: Path, launcher: Path) -> None:
    w = fake_workload(fake_dir, "hang", timeout=0.5)
    recs = run_matrix([w], fake_allocators()[:1], 1, ctx(tmp_path, launcher))
    assert recs[0].status == FAILED and recs[0].reason.startswith("timeout")
    assert recs[0].wall_s is not None and recs[0].wall_s < 5


def test_blocked_allocator_runs_nothing(fake_dir: Path, tmp_path: Path) -> None:
    w = fake_workload(fake_dir, "ok")
    recs = run_matrix([w], fake_allocators(), 1, ctx(tmp_path, None),
                      blocked={"coralloc": "allocator not verified: malloc is glibc's"})
    by = {r.allocator: r for r in recs}
    assert by["system"].status == OK
    assert by["coralloc"].status == FAILED and by["coralloc"].wall_s is None
    assert "not verified" in by["coralloc"].reason


def test_launcher_measures_the_program_not_the_runner(launcher: Path) -> None:
    """Peak RSS through the launcher is the program's own, not this Python
    process's size carried over the fork."""
    direct = measure(["/bin/true"], {"PATH": "/usr/bin:/bin"}, 10)
    launched = measure(["/bin/true"], {"PATH": "/usr/bin:/bin"}, 10, launcher=launcher)
    assert direct.exit_status == 0 and launched.exit_status == 0
    assert launched.max_rss_kib < 8 * 1024
    assert launched.max_rss_kib <= direct.max_rss_kib


def test_launcher_reports_signals_and_missing_programs(launcher: Path, tmp_path: Path) -> None:
    o = measure(["/bin/sh", "-c", "kill -KILL $$"], {"PATH": "/usr/bin:/bin"}, 10,
                launcher=launcher)
    assert o.exit_status == -9
    o = measure([str(tmp_path / "nonexistent")], {}, 10, launcher=launcher)
    assert o.exit_status == 127 and "cannot run" in o.stderr


def test_parse_result_line() -> None:
    assert parse_result_line("info: x=1\nresult: ops_per_sec=12.5 faults_per_op=0.5\n") == (
        "ops_per_sec", {"ops_per_sec": 12.5, "faults_per_op": 0.5}, "")
    assert parse_result_line("")[2] == "no result line"
    assert parse_result_line("result: a=1\nresult: a=2\n")[2] == "2 result lines"
    assert "bad result item" in parse_result_line("result: a=fast\n")[2]
    assert "bad result item" in parse_result_line("result: a=nan\n")[2]
    assert parse_result_line("result:\n")[2] == "empty result line"


def test_a_run_that_does_not_say_who_served_malloc_is_a_failure(fake_dir: Path, tmp_path: Path,
                                                                launcher: Path) -> None:
    """A workload's good result line without its malloc_lib line proves
    nothing about the allocator: failed, with the reason."""
    recs = run_matrix([fake_workload(fake_dir, "nolib")], fake_allocators()[:1], 1,
                      ctx(tmp_path, launcher))
    assert recs[0].status == FAILED and recs[0].wall_s is not None
    assert "malloc_lib" in recs[0].reason
    ok = run_matrix([fake_workload(fake_dir, "ok")], fake_allocators()[:1], 1,
                    ctx(tmp_path, launcher))
    assert ok[0].status == OK and ok[0].served_by.endswith("libc.so.6")
