"""The runner is typed: mypy --strict (bench/pyproject.toml) finds nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import BENCH


def test_mypy_strict_is_clean() -> None:
    pytest.importorskip("mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=BENCH,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
