"""PNG charts (matplotlib): per-workload bars of a figure normalized to the
baseline allocator, one bar per allocator, like the usual published
allocator comparisons. Failed cells are marked, not drawn as bars."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from coralloc_bench.execute import FAILED, RunRecord
from coralloc_bench.report import METRIC_BY_KEY, aggregate, geomean_ratios, layout, ratio

CHARTS = {"time": "time.png", "rss": "rss.png", "minflt": "faults.png"}

COLORS = {"coralloc": "#d1495b", "mimalloc3": "#00798c", "mimalloc": "#7fc4cc",
          "snmalloc": "#2e4057", "rpmalloc": "#a05195", "jemalloc": "#edae49",
          "tcmalloc": "#66a182", "system": "#8d96a3"}
EXTRA_COLORS = ["#665191", "#f95d6a", "#003f5c", "#ff7c43", "#444e86"]


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw(records: Sequence[RunRecord], meta: Dict[str, object], baseline: str, out_dir: Path,
         dpi: int = 80) -> List[str]:
    """Write time.png, rss.png and faults.png into out_dir; returns the file names."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    cells = aggregate(records)
    workloads, allocs = layout(records, meta)
    written: List[str] = []
    for key, fname in CHARTS.items():
        m = METRIC_BY_KEY[key]
        nw, na = len(workloads), len(allocs)
        fig, ax = plt.subplots(figsize=(min(16.0, max(7.0, 0.45 * nw + 2)), 6.0))
        width = 0.8 / max(na, 1)
        extra = iter(EXTRA_COLORS)
        ymax = 1.0
        fails: List[Tuple[float, str]] = []
        for j, a in enumerate(allocs):
            xs: List[float] = []
            ys: List[float] = []
            for i, w in enumerate(workloads):
                x = i - 0.4 + width * (j + 0.5)
                r = ratio(cells, key, w, a, baseline)
                c = cells.get((w, a))
                if r is not None:
                    xs.append(x)
                    ys.append(r)
                    ymax = max(ymax, r)
                elif c is not None and c.status == FAILED:
                    fails.append((x, a))
            g, _ = geomean_ratios(cells, key, workloads, a, baseline)
            label = f"{a} (geomean {g:.2f}x)" if g is not None else a
            color = COLORS.get(a) or next(extra, "#444444")
            ax.bar(xs, ys, width=width * 0.95, label=label, color=color)
        for x, a in fails:
            ax.text(x, 1.0, "x", color="red", ha="center", va="bottom", fontsize=9,
                    fontweight="bold")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ticks = LogLocator(base=10, subs=(1.0, 2.0, 5.0))
        ax.yaxis.set_major_locator(ticks)
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(range(nw))
        ax.set_xticklabels(workloads, rotation=60, ha="right", fontsize=8)
        ax.set_xlim(-0.6, nw - 0.4)
        ax.set_ylabel(f"{m.title} / {baseline}  (log; lower is better)")
        title = f"{m.title} relative to {baseline}"
        if fails:
            title += "   (red x: failed run)"
        fig.suptitle(title, fontsize=11)
        ax.grid(axis="y", which="both", alpha=0.25)
        ax.legend(fontsize=8, ncol=min(na, 5), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                  frameon=False)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=dpi)
        plt.close(fig)
        written.append(fname)
    return written
