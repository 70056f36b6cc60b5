"""Fault traps (perf's page-faults event) beside minor faults: parsed from
the launcher's report when present, absent (never 0) when not measured,
stored in results.json and shown with a total row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import pytest

from coralloc_bench.execute import OK, RunRecord, measure, parse_launcher_line
from coralloc_bench.report import (METRIC_BY_KEY, aggregate, build_table, load_results,
                                   render_markdown, render_text, terminal_report, write_json)

BASE = "status=0 wall=0.5 user=0.25 sys=0.125 maxrss_kib=2048 minflt=300 majflt=0"


def test_parse_with_fault_traps() -> None:
    vals = parse_launcher_line(BASE + " fault_traps=120")
    assert vals is not None
    assert vals["minflt"] == 300 and vals["fault_traps"] == 120


def test_parse_without_fault_traps_is_still_a_report() -> None:
    vals = parse_launcher_line(BASE)
    assert vals is not None and "fault_traps" not in vals


def test_parse_rejects_garbled_or_incomplete_lines() -> None:
    assert parse_launcher_line(BASE + " fault_traps=many") is None
    assert parse_launcher_line("status=0 wall=0.5 fault_traps=3") is None


def rec(w: str, a: str, minflt: int, traps: Optional[int], rep: int = 1) -> RunRecord:
    return RunRecord(workload=w, allocator=a, rep=rep, status=OK, reason="", exit_status=0,
                     wall_s=1.0, user_s=1.0, sys_s=0.0, max_rss_kib=1024,
                     minor_faults=minflt, major_faults=0, figure_name="ops", figure=1.0,
                     figures={}, threads=1, profile="quick", command=["x"], started=0.0,
                     fault_traps=traps)


def test_results_json_keeps_traps_and_their_absence(tmp_path: Path) -> None:
    records = [rec("w1", "a", 300, 120), rec("w1", "b", 300, None)]
    write_json(tmp_path / "results.json", {}, records)
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert runs[0]["fault_traps"] == 120 and runs[1]["fault_traps"] is None
    _, back = load_results(str(tmp_path / "results.json"))
    assert back == records


def test_old_results_without_the_field_load(tmp_path: Path) -> None:
    d = rec("w1", "a", 300, None).to_json()
    del d["fault_traps"]
    (tmp_path / "old.json").write_text(json.dumps({"meta": {}, "runs": [d]}))
    _, back = load_results(str(tmp_path / "old.json"))
    assert back[0].fault_traps is None


def sample() -> List[RunRecord]:
    out = []
    for rep, (t1, t2) in enumerate([(100, 10), (120, 12), (110, 11)], 1):
        out += [rec("w1", "off", 1000, t1, rep), rec("w1", "on", 1000, t2, rep),
                rec("w2", "off", 500, 50, rep), rec("w2", "on", 600, 5, rep)]
    return out


def rows_of(text: str) -> dict[str, List[str]]:
    return {ln.split()[0]: ln.split()[1:] for ln in text.splitlines()[2:]
            if ln and not ln.startswith("-")}


def test_traps_table_has_medians_and_a_total() -> None:
    cells = aggregate(sample())
    t = build_table(METRIC_BY_KEY["traps"], cells, ["w1", "w2"], ["off", "on"], "off")
    rows = rows_of(render_text(t))
    assert rows["w1"] == ["110", "(1.00x)", "11", "(~0.10x)"]  # 3 runs call nothing
    assert rows["total"] == ["160", "16"]
    assert not any("not measured" in n for n in t.notes)
    faults = rows_of(render_text(build_table(METRIC_BY_KEY["minflt"], cells, ["w1", "w2"],
                                             ["off", "on"], "off")))
    assert faults["total"] == ["1500", "1600"]
    assert "**total**" in render_markdown(t)


def test_unmeasured_traps_say_so_and_show_no_number() -> None:
    records = [rec("w1", "off", 1000, None), rec("w1", "on", 900, None)]
    t = build_table(METRIC_BY_KEY["traps"], aggregate(records), ["w1"], ["off", "on"], "off")
    rows = rows_of(render_text(t))
    assert rows["w1"] == ["-", "-"] and rows["total"] == ["-", "-"]
    assert "not measured" in render_text(t) and "not measured" in render_markdown(t)


def test_a_partly_measured_column_has_no_total() -> None:
    records = [rec("w1", "off", 1000, 7), rec("w2", "off", 1000, None)]
    t = build_table(METRIC_BY_KEY["traps"], aggregate(records), ["w1", "w2"], ["off"], "off")
    assert rows_of(render_text(t))["total"] == ["-"]


def test_terminal_report_shows_faults_and_traps() -> None:
    out = terminal_report(sample(), {}, "off")
    assert "minor page faults" in out and "page-fault traps" in out


def test_launcher_counts_traps_or_leaves_them_out(launcher: Path) -> None:
    """Touching 8 MiB traps about 2048 times; the launcher reports that (when
    the kernel lets it count), and with CORALLOC_BENCH_NO_PERF it reports no
    figure rather than 0."""
    script = "import mmap; m = mmap.mmap(-1, 8 << 20); [m.__setitem__(i, 1) for i in range(0, 8 << 20, 4096)]"
    py = "/usr/bin/python3"
    if not Path(py).exists():
        pytest.skip("no /usr/bin/python3")
    o = measure([py, "-c", script], {"PATH": "/usr/bin:/bin"}, 30, launcher=launcher)
    assert o.exit_status == 0
    if o.fault_traps is not None:
        assert 2048 <= o.fault_traps <= o.minor_faults + 64
    off = measure([py, "-c", script], {"PATH": "/usr/bin:/bin", "CORALLOC_BENCH_NO_PERF": "1"},
                  30, launcher=launcher)
    assert off.exit_status == 0 and off.fault_traps is None and off.minor_faults >= 2048
