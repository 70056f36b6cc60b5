"""Statistics and reports: geomean, ratios, tables, result files, compare."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from coralloc_bench.cli import main
from coralloc_bench.execute import FAILED, OK, RunRecord
from coralloc_bench.allocators import Allocator, copies
from coralloc_bench.report import (METRIC_BY_KEY, aggregate, best_peer_gaps, best_peer_section,
                                   build_table, compare, load_results, markdown_report,
                                   render_markdown, render_text, terminal_report, write_csv,
                                   write_json)
from coralloc_bench.util import BenchError, geomean


def rec(w: str, a: str, wall: Optional[float], rep: int = 1, status: str = OK,
        rss: int = 1024, fig: Optional[float] = None, reason: str = "") -> RunRecord:
    return RunRecord(workload=w, allocator=a, rep=rep, status=status, reason=reason,
                     exit_status=0 if status == OK else -11, wall_s=wall, user_s=wall,
                     sys_s=0.0, max_rss_kib=rss, minor_faults=100, major_faults=0,
                     figure_name="ops_per_sec",
                     figure=(fig if fig is not None else (1 / wall if wall else None))
                     if status == OK else None,
                     figures={}, threads=1, profile="quick", command=["x"], started=0.0)


def test_geomean() -> None:
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert geomean([]) is None
    assert geomean([0.0, -1.0, math.nan]) is None
    assert geomean([0.0, 9.0]) == pytest.approx(9.0)  # non-positive values are left out


def sample() -> List[RunRecord]:
    """5 repetitions: the fewest with which the rank test can call a
    difference over two workloads (3 can call none)."""
    out = []
    for rep, (a, b, c) in enumerate([(1.0, 2.0, 0.5), (1.2, 2.2, 0.5), (0.8, 1.8, 0.5),
                                     (1.1, 2.1, 0.5), (0.9, 1.9, 0.5)], 1):
        out += [rec("w1", "mimalloc", a, rep), rec("w1", "coralloc", b, rep),
                rec("w1", "system", c, rep)]
    for rep in range(1, 6):
        out += [rec("w2", "mimalloc", 4.0, rep, rss=2048), rec("w2", "coralloc", 1.0, rep),
                rec("w2", "system", 4.0, rep,
                    status=FAILED if rep == 2 else OK, reason="killed by SIGSEGV")]
    return out


def test_medians_ratios_and_geomean_row() -> None:
    records = sample()
    cells = aggregate(records)
    assert cells[("w1", "mimalloc")].values["time"] == pytest.approx(1.0)  # median
    assert cells[("w1", "coralloc")].values["time"] == pytest.approx(2.0)
    assert cells[("w2", "system")].status == FAILED
    t = build_table(METRIC_BY_KEY["time"], cells, ["w1", "w2"],
                    ["system", "coralloc", "mimalloc"], "mimalloc")
    rows = {r[0]: r[1:] for r in t.rows}
    assert rows["w1"] == ["0.500 (0.50x)", "2.000 (2.00x)", "1.000 (1.00x)"]
    assert rows["w2"] == ["FAILED", "1.000 (0.25x)", "4.000 (1.00x)"]
    # coralloc: geomean(2.0, 0.25) = sqrt(0.5); system only over w1
    assert rows["geomean vs mimalloc"] == ["0.50x (n=1)", "0.71x", "1.00x"]
    assert rows["failed runs"] == ["1", "0", "0"]
    assert "lower is better" in t.title
    fig = build_table(METRIC_BY_KEY["figure"], cells, ["w1", "w2"],
                      ["system", "coralloc", "mimalloc"], "mimalloc")
    assert "higher is better" in fig.title
    text = render_text(t)
    assert "FAILED" in text and "geomean vs mimalloc" in text
    md = render_markdown(t)
    assert md.count("\n|") >= 5 and "**geomean vs mimalloc**" in md


def test_terminal_and_markdown_reports() -> None:
    records = sample()
    meta: Dict[str, object] = {"allocators": {"system": {"path": None, "verified": True},
                                              "coralloc": {"path": "/x.so", "verified": True},
                                              "mimalloc": {"path": "/m.so", "verified": True}},
                               "command": "coralloc-bench run", "profile": "quick"}
    out = terminal_report(records, meta, "mimalloc")
    header = out.splitlines()[1].split()
    assert header == ["workload", "system", "coralloc", "mimalloc"]
    assert "w2 / system rep 2: killed by SIGSEGV" in out
    md = markdown_report(records, meta, "mimalloc", ["time.png"])
    assert "![time.png](time.png)" in md and "## Failures" in md and "SIGSEGV" in md


def test_result_files_round_trip(tmp_path: Path) -> None:
    records = sample()
    write_json(tmp_path / "results.json", {"profile": "quick"}, records)
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["runs"]) == len(records)
    need = {"workload", "allocator", "rep", "status", "reason", "exit_status", "wall_s",
            "user_s", "sys_s", "max_rss_kib", "minor_faults", "major_faults", "figure"}
    assert need <= set(data["runs"][0])
    meta, back = load_results(str(tmp_path / "results.json"))
    assert meta == {"profile": "quick"} and back == records
    write_csv(tmp_path / "results.csv", records)
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(lines) == len(records) + 1 and lines[0].startswith("workload,allocator,rep")


def test_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = [rec("w1", "coralloc", 2.0), rec("w2", "coralloc", 1.0), rec("w1", "mimalloc", 1.0),
           rec("w3", "coralloc", 1.0)]
    new = [rec("w1", "coralloc", 1.0), rec("w2", "coralloc", 1.0), rec("w1", "mimalloc", 1.0),
           rec("w3", "coralloc", None, status=FAILED, reason="exit 3")]
    write_json(tmp_path / "old.json", {}, old)
    write_json(tmp_path / "new.json", {}, new)
    text = compare(str(tmp_path / "old.json"), str(tmp_path / "new.json"), ["time"])
    rows: Dict[str, str] = {}
    for ln in text.splitlines()[1:]:
        if ln and ln[0] != "-":
            rows.setdefault(ln.split()[0], ln)  # the table's row, not the list below it
    assert "2.000 -> 1.000 (0.50x)" in rows["w1"]
    assert "ok->failed" in rows["w3"]
    assert "0.71x" in rows["geomean"]  # sqrt(0.5 * 1.0)
    assert main(["compare", str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 0
    assert "old -> new" in capsys.readouterr().out
    write_json(tmp_path / "other.json", {}, [rec("zz", "x", 1.0)])
    with pytest.raises(BenchError):
        compare(str(tmp_path / "old.json"), str(tmp_path / "other.json"))


def test_overlapping_ranges_are_within_noise() -> None:
    """w1: coralloc 1.8-2.2 s against mimalloc's 0.8-1.2 s is beyond noise
    (worse); system's 0.5 against mimalloc's 0.8-1.2 too (better); a cell
    whose range overlaps the baseline's gets a ~ and is not counted."""
    records = sample() + [rec("w3", "mimalloc", v, i) for i, v in enumerate((1.0, 1.1, 1.3), 1)]
    records += [rec("w3", "coralloc", v, i) for i, v in enumerate((1.2, 1.25, 1.4), 1)]
    cells = aggregate(records)
    assert cells[("w1", "coralloc")].ranges["time"] == (1.8, 2.2)
    t = build_table(METRIC_BY_KEY["time"], cells, ["w1", "w3"], ["coralloc", "mimalloc"],
                    "mimalloc", ranges=True)
    rows = {r[0]: r[1:] for r in t.rows}
    assert rows["w1"][0] == "2.000 [1.800-2.200] (2.00x)"
    assert rows["w3"][0] == "1.250 [1.200-1.400] (~1.14x)"
    assert rows["beyond noise (better/worse)"] == ["0/1", "-"]


def test_compare_names_the_changes_beyond_noise(tmp_path: Path) -> None:
    old = [rec("w1", "a", v, i) for i, v in enumerate((1.0, 1.1, 1.2), 1)]
    old += [rec("w2", "a", v, i) for i, v in enumerate((1.0, 1.1, 1.2), 1)]
    new = [rec("w1", "a", v, i) for i, v in enumerate((1.15, 1.2, 1.3), 1)]  # overlaps
    new += [rec("w2", "a", v, i) for i, v in enumerate((0.5, 0.55, 0.6), 1)]  # faster
    write_json(tmp_path / "old.json", {}, old)
    write_json(tmp_path / "new.json", {}, new)
    out = compare(str(tmp_path / "old.json"), str(tmp_path / "new.json"), ["time"])
    assert "changed beyond noise (1;" in out
    assert "  w2 / a: 1.100 -> 0.550 (0.50x, better)" in out.splitlines()
    assert "w1 / a:" not in out


def runs(w: str, a: str, walls: List[float]) -> List[RunRecord]:
    return [rec(w, a, t, rep) for rep, t in enumerate(walls, 1)]


def test_best_peer_gap_is_to_the_fastest_peer_and_ranked_by_noise() -> None:
    records = (runs("apart", "coralloc", [1.18, 1.19, 1.20, 1.21, 1.22])
               + runs("apart", "p1", [0.98, 0.99, 1.0, 1.01, 1.02])
               + runs("apart", "p2", [1.08, 1.09, 1.10, 1.11, 1.12])
               + runs("mixed", "coralloc", [1.0, 1.2, 1.4]) + runs("mixed", "p1", [0.9, 1.0, 1.1])
               + runs("close", "coralloc", [1.04, 1.04, 1.04]) + runs("close", "p1", [1.0] * 3))
    gaps, compared = best_peer_gaps(aggregate(records), ["apart", "mixed", "close"], "coralloc",
                                    ["p1", "p2"])
    assert compared == 3
    assert [(g.workload, g.peer, g.beyond_noise) for g in gaps] == [("apart", "p1", True),
                                                                     ("mixed", "p1", False)]
    assert gaps[0].ratio == pytest.approx(1.2)


def test_copies_are_the_noise_yardstick_not_peers() -> None:
    original = Allocator("coralloc", "/lib/libcoralloc.so", "build")
    twins = copies(original, 2)
    assert [(c.name, c.path, c.copy_of) for c in twins] == [
        ("coralloc-copy1", "/lib/libcoralloc.so", "coralloc"),
        ("coralloc-copy2", "/lib/libcoralloc.so", "coralloc")]
    records = (runs("w", "coralloc", [1.3] * 5) + runs("w", "peer", [1.0] * 5)
               + runs("w", "coralloc-copy1", [1.0] * 5)
               + runs("w", "coralloc-copy2", [1.3] * 5))
    meta: Dict[str, object] = {"allocators": {a.name: a.to_json() for a in
                                              [original, Allocator("peer", "/p.so", "user"),
                                               *twins]}}
    text = "\n".join(best_peer_section(aggregate(records), ["w"],
                                       ["coralloc", "peer", *[c.name for c in twins]], meta))
    assert "above 1.05x the fastest peer's on 1 of 1 workloads" in text
    assert "| w | 1.30x | peer | yes |" in text
    assert "above 1.05x the fastest copy's on 1 of 1 workloads" in text
    assert "| w | 1.30x | coralloc-copy1 | yes |" in text
    terminal = terminal_report(records, meta, "peer")
    assert "above 1.05x the fastest peer's on 1 of 1 workloads" in terminal
    assert "above 1.05x the fastest copy's on 1 of 1 workloads" in terminal


def test_merge_joins_runs_of_other_workloads(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A suite run in parts (each under a timed command's limit) reads as one
    run; parts with other allocators, or one workload twice, are refused."""
    allocs: Dict[str, object] = {"a": {"path": None}, "b": {"path": "/b.so"}}
    part1 = [rec("w1", a, t, rep) for a, t in (("a", 1.0), ("b", 2.0)) for rep in (1, 2)]
    part2 = [rec("w2", a, t, rep) for a, t in (("a", 1.0), ("b", 0.5)) for rep in (1, 2)]
    write_json(tmp_path / "1.json", {"allocators": allocs, "baseline": "a",
                                     "workloads": {"w1": {}},
                                     "suite": {"not_run": {"w2": "later", "x": "never"}}},
               part1)
    write_json(tmp_path / "2.json", {"allocators": allocs, "workloads": {"w2": {}},
                                     "suite": {"not_run": {"y": "never"}}}, part2)
    assert main(["merge", str(tmp_path / "1.json"), str(tmp_path / "2.json"), "--out",
                 str(tmp_path / "m"), "--no-charts"]) == 0
    meta, records = load_results(str(tmp_path / "m" / "results.json"))
    assert len(records) == 8 and set(meta["workloads"]) == {"w1", "w2"}  # type: ignore[arg-type]
    assert meta["suite"] == {"not_run": {"x": "never", "y": "never"}}
    md = (tmp_path / "m" / "report.md").read_text()
    assert "| w1 " in md and "| w2 " in md
    out = capsys.readouterr().out
    assert any(ln.startswith("geomean vs a") and ln.split()[-1] == "1.00x"
               for ln in out.splitlines())  # b: geomean(2.0, 0.5), the column order a, b
    write_json(tmp_path / "3.json", {"allocators": {"a": {}}}, part2)
    assert main(["merge", str(tmp_path / "1.json"), str(tmp_path / "3.json"), "--out",
                 str(tmp_path / "n")]) == 2
    assert main(["merge", str(tmp_path / "1.json"), str(tmp_path / "1.json"), "--out",
                 str(tmp_path / "n")]) == 2
    assert "workload w1 is in runs 1 and 2 of the same seed" in capsys.readouterr().err


def test_merge_numbers_repetitions_of_other_seeds(tmp_path: Path) -> None:
    """One command per repetition (other seeds), merged: the workload's
    repetitions follow each other, 1..4, and the medians take all of them."""
    allocs: Dict[str, object] = {"a": {"path": None}, "b": {"path": "/b.so"}}
    for seed, t in ((1, 1.0), (2, 3.0)):
        write_json(tmp_path / f"{seed}.json", {"allocators": allocs, "baseline": "a",
                                               "seed": seed, "reps": 2,
                                               "workloads": {"w": {}}},
                   [rec("w", a, t * f, rep) for a, f in (("a", 1.0), ("b", 2.0))
                    for rep in (1, 2)])
    assert main(["merge", str(tmp_path / "1.json"), str(tmp_path / "2.json"), "--out",
                 str(tmp_path / "m"), "--no-charts"]) == 0
    meta, records = load_results(str(tmp_path / "m" / "results.json"))
    assert meta["reps"] == 4
    assert sorted(r.rep for r in records if r.allocator == "a") == [1, 2, 3, 4]
    assert sorted((r.rep, r.wall_s) for r in records if r.allocator == "b") == [
        (1, 2.0), (2, 2.0), (3, 6.0), (4, 6.0)]
