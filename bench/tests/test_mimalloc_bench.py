"""`run --suite mimalloc-bench=PATH`: the tests of a checkout run with its
bench.sh's command lines, built with its CMake, through the runner. On the
fixture tree tests/fixtures/mimalloc-bench (the same layout; CI has no
network for the real one)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import BENCH
from coralloc_bench import mimalloc_bench as mb
from coralloc_bench.cli import main
from coralloc_bench.util import BenchError

FIXTURE = BENCH / "tests" / "fixtures" / "mimalloc-bench"


def commands(procs: int) -> Dict[str, str]:
    return {t.name: t.command for t in mb.read_suite(FIXTURE, procs).tests}


def test_commands_are_bench_sh_s_with_procs_put_in() -> None:
    """procs = 2: $procs and $procsx2 put in; `if test "$procs" != "1"` keeps
    multiN; `if test $procs -gt 16` takes its else branch."""
    c = commands(2)
    assert c["larsonN"] == "./larson 2"
    assert c["multi1"] == "./tiny 10" and c["multiN"] == "./tiny 4"
    assert c["cappedN"] == "./tiny 2"
    assert c["tiny"] == "./tiny 20000"
    assert list(c)[:4] == ["tiny", "echo-in", "larsonN", "rateN"]  # bench.sh's order


def test_conditions_follow_procs() -> None:
    assert "multiN" not in commands(1)
    assert commands(32)["cappedN"] == "./tiny 16"


def test_input_and_derived_times_come_from_bench_sh() -> None:
    tests = {t.name: t for t in mb.read_suite(FIXTURE, 2).tests}
    assert tests["echo-in"].stdin == str((FIXTURE / "bench" / "echo-in" / "input").resolve())
    assert tests["tiny"].stdin is None and tests["tiny"].derivation is None
    larson, rate = tests["larsonN"].derivation, tests["rateN"].derivation
    assert larson is not None and rate is not None
    assert larson.time_from("threads: 2\nrelative time: 0.250 s\n") == pytest.approx(0.25)
    assert larson.time_from("no time here\n") is None
    assert rate.time_from("running...400000 memory ops/CPU second\n") == pytest.approx(5.0)
    assert tests["multiN"].thread_factor == 2 and tests["larsonN"].thread_factor == 1


def test_what_needs_bench_sh_s_environment_is_named() -> None:
    skipped = mb.read_suite(FIXTURE, 2).skipped
    assert "pushd" in skipped["pushy"]
    assert "$redis_dir" in skipped["needs-env"]
    assert "not a timing" in skipped["security"]


def test_bre_to_python() -> None:
    assert mb.bre_to_python(r".* time: \([0-9\.]*\).*") == r".* time: ([0-9\.]*).*"
    assert mb.bre_to_python(r"a(b)\(c\)") == r"a\(b\)(c)"


def test_not_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="not a mimalloc-bench checkout"):
        mb.read_suite(tmp_path, 2)


def test_missing_sources_are_found_from_cmake_s_errors() -> None:
    text = (FIXTURE / "bench" / "CMakeLists.txt").read_text()
    line = 1 + text.split("\n").index("add_executable(gone gone/gone.c)")
    err = (f"CMake Error at CMakeLists.txt:{line} (add_executable):\n  Cannot find source "
           "file:\n\n    gone/gone.c\n\n  Tried extensions .c .C\n")
    assert mb.missing_sources(err, text) == {"gone": "gone/gone.c"}
    kept = mb.without_targets(text, ["gone"])
    assert "add_executable(tiny tiny/tiny.c)" in kept
    assert not any(ln.startswith(("add_executable(gone", "target_link_libraries(gone"))
                   for ln in kept.split("\n"))


def _tools() -> None:
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        pytest.skip("cmake or a C++ compiler is not installed")


def test_build_leaves_out_the_program_whose_sources_are_missing(tmp_path: Path) -> None:
    _tools()
    logs: List[str] = []
    bdir, gone = mb.build(FIXTURE, tmp_path / "state", ["tiny", "larson", "gone"], logs.append)
    assert bdir == tmp_path / "state" / "out" / "bench"
    assert (bdir / "tiny").is_file() and (bdir / "larson").is_file()
    assert set(gone) == {"gone"} and "sources missing" in gone["gone"]
    assert any("gone is not built" in ln for ln in logs)
    # bench.sh's ../../bench from out/bench reaches the checkout's bench/
    assert (bdir / ".." / ".." / "bench" / "echo-in" / "input").is_file()


def test_a_second_build_keeps_the_first_one_s_programs(tmp_path: Path) -> None:
    """A run that needs other programs (the suite run in parts) builds them
    beside the ones built before, in the same configured tree."""
    _tools()
    logs: List[str] = []
    state = tmp_path / "state"
    bdir, _ = mb.build(FIXTURE, state, ["tiny", "gone"], logs.append)
    built = (bdir / "tiny").stat().st_mtime_ns
    again, gone = mb.build(FIXTURE, state, ["larson"], logs.append)
    assert again == bdir and (bdir / "larson").is_file()
    assert (bdir / "tiny").is_file() and (bdir / "tiny").stat().st_mtime_ns == built
    assert set(gone) == {"gone"} and "sources missing" in gone["gone"]


def test_missing_sources_are_forgotten_when_the_cmakelists_changes(tmp_path: Path) -> None:
    text = "add_executable(gone gone.c)\n"
    mb._missing_remember(tmp_path, text, {"gone": "gone.c"})
    assert mb._missing_remembered(tmp_path, tmp_path, text) == {"gone": "gone.c"}
    assert mb._missing_remembered(tmp_path, tmp_path, "add_executable(gone gone.cpp)\n") == {}


def test_a_source_that_appeared_is_built(tmp_path: Path) -> None:
    """The sources found missing are looked for again at every build: once
    bench.sh's set-up script has fetched them, their program is built."""
    _tools()
    checkout = tmp_path / "checkout"
    shutil.copytree(FIXTURE, checkout, symlinks=True)
    logs: List[str] = []
    state = tmp_path / "state"
    _, gone = mb.build(checkout, state, ["tiny", "gone"], logs.append)
    assert set(gone) == {"gone"}
    (checkout / "bench" / "gone").mkdir()
    (checkout / "bench" / "gone" / "gone.c").write_text("int main(void) { return 0; }\n")
    bdir, gone = mb.build(checkout, state, ["gone"], logs.append)
    assert gone == {} and (bdir / "gone").is_file()


def test_the_suite_runs_through_the_runner(tmp_path: Path, bindir: Path, witness: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test it can run, under system, twice, interleaved: bench.sh's
    derived times, who served malloc, and the tests not run with why."""
    _tools()
    # the launcher's cross-CPU probe and fault counter are not what this checks
    monkeypatch.setenv("CORALLOC_BENCH_NO_RTT", "1")
    monkeypatch.setenv("CORALLOC_BENCH_NO_PERF", "1")
    build = tmp_path / "build"
    build.mkdir()
    for p in (bindir / "alloc-probe", bindir / "run-measured", witness):
        shutil.copy(p, build / p.name)
    out = tmp_path / "out"
    code = main(["run", "--suite", f"mimalloc-bench={FIXTURE}", "--suite-build",
                 str(tmp_path / "suite"), "--build-dir", str(build), "--allocs", "system",
                 "--threads", "2", "--reps", "2", "--no-install", "--no-charts", "--quiet",
                 "--out", str(out), "--seed", "3"])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    runs = data["runs"]
    assert {r["workload"] for r in runs} == {"tiny", "echo-in", "larsonN", "rateN", "multi1",
                                             "multiN", "cappedN"}
    assert all(r["status"] == "ok" for r in runs), [r["reason"] for r in runs]
    assert all("libc" in r["served_by"] for r in runs)
    times = {r["workload"]: r["time_s"] for r in runs}
    assert times["larsonN"] == pytest.approx(0.25) and times["rateN"] == pytest.approx(5.0)
    assert times["tiny"] is None  # the wall time counts
    import csv
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {float(r["time_s"]) for r in rows if r["workload"] == "larsonN"} == {0.25}
    suite = data["meta"]["suite"]
    assert suite["procs"] == 2 and data["meta"]["seed"] == 3
    assert set(suite["not_run"]) == {"pushy", "needs-env", "security", "goneN", "sysprog"}
    assert "apt-get install" in suite["not_run"]["sysprog"]
    report = (out / "report.md").read_text()
    assert "## Suite" in report and "- goneN: gone not built: sources missing" in report
    text = capsys.readouterr().out
    assert "not run:" in text and "larsonN" in text


def test_a_bad_suite_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--suite", "spec=/x", "--no-install"]) == 2
    assert "--suite takes mimalloc-bench=PATH" in capsys.readouterr().err
    assert main(["run", "--suite", f"mimalloc-bench={tmp_path}", "--no-install"]) == 2
    assert "not a mimalloc-bench checkout" in capsys.readouterr().err
    assert main(["run", "--suite", f"mimalloc-bench={FIXTURE}", "--workloads", "nope",
                 "--no-install"]) == 2
    assert "unknown mimalloc-bench test 'nope'" in capsys.readouterr().err
