"""Argument handling: bad input is one line on stderr and exit 2, never a
traceback; list and compare work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from conftest import BENCH, other_shared_lib
from coralloc_bench.cli import build_parser, main, resolve_out_dir


def cli(args: List[str], env_extra: dict[str, str] | None = None) -> Tuple[int, str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(BENCH / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-m", "coralloc_bench", *args], capture_output=True,
                       text=True, env=env, timeout=60)
    return r.returncode, r.stdout, r.stderr


def one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("coralloc-bench: error: ")
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_workload() -> None:
    code, _, err = cli(["run", "--workloads", "larson-128,nope", "--no-install"])
    one_line_error(code, err, "unknown workload 'nope'")


def test_unknown_profile() -> None:
    code, _, err = cli(["run", "--profile", "slow"])
    one_line_error(code, err, "slow")


@pytest.mark.parametrize("args,needle", [
    (["--reps", "0"], "--reps must be a positive integer"),
    (["--threads", "two"], "--threads must be a positive integer"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_numbers_and_options(args: List[str], needle: str) -> None:
    code, _, err = cli(["run", *args])
    one_line_error(code, err, needle)


def test_no_command() -> None:
    code, _, err = cli([])
    one_line_error(code, err)


def test_unknown_allocator(bindir: Path) -> None:
    code, _, err = cli(["run", "--build-dir", str(bindir), "--workloads", "python",
                        "--allocs", "system,nosuchalloc", "--no-install"])
    one_line_error(code, err, "unknown allocator 'nosuchalloc'")


def test_alloc_not_a_shared_library(bindir: Path, tmp_path: Path) -> None:
    text = tmp_path / "lib.so"
    text.write_text("not an ELF file\n")
    code, _, err = cli(["run", "--build-dir", str(bindir), "--workloads", "python",
                        "--alloc", f"mine={text}", "--no-install"])
    one_line_error(code, err, "is not a shared library")
    code, _, err = cli(["run", "--build-dir", str(bindir), "--workloads", "python",
                        "--alloc", f"mine={tmp_path / 'missing.so'}", "--no-install"])
    one_line_error(code, err, "does not exist")
    code, _, err = cli(["run", "--build-dir", str(bindir), "--workloads", "python",
                        "--alloc", "justaname", "--no-install"])
    one_line_error(code, err, "NAME=/path/lib.so")
    code, _, err = cli(["run", "--build-dir", str(bindir), "--workloads", "python",
                        "--coralloc-lib", str(text), "--no-install"])
    one_line_error(code, err, "is not a shared library")


def test_copies_need_coralloc(bindir: Path) -> None:
    code, _, err = cli(["run", "--build-dir", str(bindir), "--workloads", "python",
                        "--allocs", "system", "--copies", "2", "--no-install"])
    one_line_error(code, err, "--copies repeats coralloc, which --allocs leaves out")
    code, _, err = cli(["run", "--copies", "0"])
    one_line_error(code, err, "--copies must be a positive integer")


def test_workloads_not_built(tmp_path: Path) -> None:
    code, _, err = cli(["run", "--build-dir", str(tmp_path), "--workloads", "larson-128"])
    one_line_error(code, err, "not built")


def test_list_names_workloads_and_allocators(bindir: Path) -> None:
    code, out, err = cli(["list", "--build-dir", str(bindir),
                          "--alloc", f"fake={other_shared_lib()}"])
    assert code == 0, err
    for name in ("larson-128", "xthread", "cache-scratch", "cache-thrash", "churn", "bulk-64",
                 "glibc-simple-16", "zero-fill-2m", "large-window", "large-realloc", "tree",
                 "leak", "json", "python", "sqlite", "redis"):
        assert f"  {name} " in out
    assert "system" in out and "[verified]" in out
    # a library that does not define malloc is found but not verified
    fake = [ln for ln in out.splitlines() if ln.strip().startswith("fake ")]
    assert fake and "NOT verified" in fake[0]


def test_compare_errors(tmp_path: Path) -> None:
    code, _, err = cli(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    one_line_error(code, err, "no such file")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = cli(["compare", str(bad), str(bad)])
    one_line_error(code, err, "not a results file")


def test_parser_contract() -> None:
    """The options others script against."""
    p = build_parser()
    a = p.parse_args(["run", "--profile", "full", "--workloads", "a,b", "--allocs", "x,y",
                      "--alloc", "n=/p.so", "--alloc", "m=/q.so", "--reps", "4",
                      "--threads", "3", "--out", "/tmp/o"])
    assert (a.profile, a.workloads, a.allocs, a.alloc, a.reps, a.threads, a.out) == (
        "full", "a,b", "x,y", ["n=/p.so", "m=/q.so"], 4, 3, "/tmp/o")
    a = p.parse_args(["run"])
    assert a.profile == "quick" and a.reps is None and a.baseline == "mimalloc3"
    a = p.parse_args(["compare", "old.json", "new.json"])
    assert (a.old, a.new) == ("old.json", "new.json")


def test_relative_out_dir_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # redis-server runs in a directory of its own with --dir under --out: a
    # relative --out used to make it fail to start
    monkeypatch.chdir(tmp_path)
    got = resolve_out_dir("results/x", tmp_path / "repo")
    assert got.is_absolute() and got == tmp_path / "results" / "x"
    assert resolve_out_dir(None, tmp_path).is_absolute()


def test_main_returns_codes() -> None:
    assert main(["run", "--workloads", "nope"]) == 2
