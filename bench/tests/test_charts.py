"""Charts: skipped where matplotlib is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from coralloc_bench.execute import FAILED
from test_report import rec

pytest.importorskip("matplotlib")


def test_draw_time_rss_and_faults(tmp_path: Path) -> None:
    from coralloc_bench.charts import draw
    records = [rec("w1", "mimalloc", 1.0), rec("w1", "coralloc", 0.5, rss=512),
               rec("w2", "mimalloc", 2.0), rec("w2", "coralloc", None, status=FAILED,
                                                reason="exit 3"),
               rec("w1", "mine", 3.0)]
    files = draw(records, {}, "mimalloc", tmp_path)
    assert files == ["time.png", "rss.png", "faults.png"]
    for f in files:
        data = (tmp_path / f).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert 5_000 < len(data) < 400_000
