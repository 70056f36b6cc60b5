"""The noise test of the reports: exact p-values, Benjamini-Hochberg, an A/A
run that finds (about) nothing, a real difference that is found; the
headline figures (best peer, leave-one-out, -api left out); and the runner's
modules importing each other in no circle."""

from __future__ import annotations

import ast
import random
from typing import Dict, List, Set, Tuple

import pytest

from conftest import BENCH
from coralloc_bench import stats
from coralloc_bench.execute import OK, RunRecord
from coralloc_bench.report import (METRIC_BY_KEY, aggregate, build_table, headline_lines,
                                   leave_one_out)


def test_exact_p_values() -> None:
    assert stats.mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)  # 2 / C(6,3)
    assert stats.mann_whitney_p([4, 5, 6], [1, 2, 3]) == pytest.approx(0.1)
    assert stats.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert stats.mann_whitney_p([1, 3, 5], [2, 4, 6]) == pytest.approx(0.7)
    assert stats.mann_whitney_p([1.0] * 3, [1.0] * 3) == 1.0  # all tied
    assert stats.mann_whitney_p([], [1.0]) == 1.0
    assert stats.smallest_p(3, 3) == pytest.approx(0.1)
    assert stats.smallest_p(5, 5) == pytest.approx(2 / 252)


def test_benjamini_hochberg() -> None:
    # sorted p .01, .02, .03 are at most .05 * rank / 4 (.0125, .025, .0375); .5 is not
    assert stats.benjamini_hochberg([0.5, 0.01, 0.03, 0.02]) == [False, True, True, True]
    assert stats.benjamini_hochberg([0.04, 0.5]) == [False, False]  # .04 > .05*1/2
    assert stats.benjamini_hochberg([]) == []


def _lognormal(rng: random.Random, n: int, scale: float, sigma: float) -> List[float]:
    return [scale * rng.lognormvariate(0.0, sigma) for _ in range(n)]


def test_an_a_a_run_finds_about_nothing() -> None:
    """Two copies of one allocator (the same timing distribution, with the
    spread seen on this machine: max/min of 3 runs about 1.4) over 65
    workloads: the test calls some difference in at most about 5% of whole
    runs (the rate it states), where the old rule (min-max ranges apart)
    called one in nearly every run."""
    rng = random.Random(36)
    trials, workloads, reps = 200, 65, 5
    any_call = old_rule = 0
    for _ in range(trials):
        pairs = [(_lognormal(rng, reps, 1.0, 0.15), _lognormal(rng, reps, 1.0, 0.15))
                 for _ in range(workloads)]
        any_call += any(stats.differ(pairs))
        old_rule += any(min(a[:3]) > max(b[:3]) or min(b[:3]) > max(a[:3]) for a, b in pairs)
    assert any_call / trials <= 0.08
    assert old_rule / trials > 0.9


def test_a_real_difference_is_found() -> None:
    """1.3x slower on 20 workloads out of 40, 7 repetitions, 5% spread."""
    rng = random.Random(7)
    pairs = [(_lognormal(rng, 7, 1.3 if w < 20 else 1.0, 0.05), _lognormal(rng, 7, 1.0, 0.05))
             for w in range(40)]
    calls = stats.differ(pairs)
    assert sum(calls[:20]) >= 18 and sum(calls[20:]) <= 2


def rec(w: str, a: str, wall: float, rep: int) -> RunRecord:
    return RunRecord(workload=w, allocator=a, rep=rep, status=OK, reason="", exit_status=0,
                     wall_s=wall, user_s=wall, sys_s=0.0, max_rss_kib=1024, minor_faults=1,
                     major_faults=0, figure_name="", figure=None, figures={}, threads=1,
                     profile="quick", command=[], started=0.0)


def runs(table: Dict[Tuple[str, str], float]) -> List[RunRecord]:
    return [rec(w, a, v * (1 + 0.01 * rep), rep) for (w, a), v in table.items()
            for rep in range(1, 6)]


def test_headline_leaves_out_api_and_names_the_best_peer() -> None:
    """bulk-64-api (coralloc's bulk calls against the peers' malloc) is in
    the table, not in the geomean; against the best peer per workload the
    figure is the worse of the two peers' ratios."""
    cells = aggregate(runs({("a", "coralloc"): 1.0, ("a", "p1"): 2.0, ("a", "p2"): 1.0,
                            ("b", "coralloc"): 1.0, ("b", "p1"): 1.0, ("b", "p2"): 4.0,
                            ("bulk-64-api", "coralloc"): 0.1, ("bulk-64-api", "p1"): 1.0,
                            ("bulk-64-api", "p2"): 1.0}))
    names = ["a", "b", "bulk-64-api"]
    t = build_table(METRIC_BY_KEY["time"], cells, names, ["coralloc", "p1", "p2"], "p1")
    geo = {r[0]: r[1:] for r in t.rows}["geomean vs p1 (without the 1 -api)"]
    assert geo[0] == "0.71x"  # sqrt(0.5 * 1.0), not with the 0.1 of bulk-64-api
    lines = headline_lines(cells, names, "coralloc", ["p1", "p2"], "p1")
    assert lines[0].startswith("coralloc's time geomean vs p1: 0.71x over 2 workloads")
    assert lines[1].startswith("coralloc's time geomean vs the fastest peer of each workload: "
                               "1.00x over 2 workloads")
    assert "1 -api workloads left out" in lines[0]


def test_leave_one_out() -> None:
    lo, hi, most = leave_one_out({"a": 0.25, "b": 1.0, "c": 1.0})
    assert lo == pytest.approx(0.5) and hi == pytest.approx(1.0) and most == "a"


def _imports(path: str) -> Set[str]:
    """The coralloc_bench modules a module imports, at top level or inside
    functions (an import circle through a function is still a circle)."""
    tree = ast.parse((BENCH / "src" / "coralloc_bench" / path).read_text())
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "coralloc_bench":
                out |= {a.name for a in node.names}
            elif node.module.startswith("coralloc_bench."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names
                    if a.name.startswith("coralloc_bench.")}
    return out - {"__init__", "__version__"}


def test_the_modules_import_each_other_in_no_circle() -> None:
    mods = {p.stem: _imports(p.name) for p in (BENCH / "src" / "coralloc_bench").glob("*.py")}
    assert "devtools" in mods and mods["programs"] >= {"devtools", "realprogs"}
    state: Dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: List[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, "import circle: " + " -> ".join(path + [m])
        state[m] = 1
        for n in sorted(mods.get(m, set()) & set(mods)):
            visit(n, path + [m])
        state[m] = 2
    for m in sorted(mods):
        visit(m, [])
