"""Turning run records into tables (one per figure: rows workloads, columns
allocators, each cell with its ratio to the baseline, and a geometric-mean
row), results.json, results.csv, report.md, and the comparison of two
result files."""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from coralloc_bench import stats
from coralloc_bench.allocators import BASELINE_FALLBACKS
from coralloc_bench.execute import FAILED, OK, SKIPPED, RunRecord
from coralloc_bench.util import BenchError, geomean, median
from tabulate import SEPARATING_LINE, tabulate


def _fmt_num(v: float) -> str:
    """3 significant digits, k/M suffixes for big numbers."""
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g}G"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.3f}"


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    unit: str
    lower_better: bool
    get: Callable[[RunRecord], Optional[float]]
    fmt: Callable[[float], str] = _fmt_num
    # A count that adds up over workloads (faults): the table gets a total row.
    summable: bool = False
    # Said under the table when no run has the figure (it is not measured
    # everywhere: the table then shows '-', never a made-up value).
    missing_note: str = ""


def _f(v: Optional[float], scale: float = 1.0) -> Optional[float]:
    return None if v is None else float(v) * scale


METRICS: List[Metric] = [
    Metric("time", "time (wall; a suite's own derived time where it has one)", "s", True,
           lambda r: _f(r.time_s if r.time_s is not None else r.wall_s), lambda v: f"{v:.3f}"),
    Metric("figure", "the workload's own figure (ops/s; sqlite: rows/s)", "", False,
           lambda r: _f(r.figure)),
    Metric("rss", "peak RSS", "MiB", True, lambda r: _f(r.max_rss_kib, 1 / 1024),
           lambda v: f"{v:.1f}"),
    Metric("user", "user CPU time", "s", True, lambda r: _f(r.user_s), lambda v: f"{v:.3f}"),
    Metric("sys", "system CPU time", "s", True, lambda r: _f(r.sys_s), lambda v: f"{v:.3f}"),
    Metric("minflt", "minor page faults", "", True, lambda r: _f(r.minor_faults),
           summable=True),
    Metric("traps", "page-fault traps (perf page-faults: minor faults less those prefaulted "
           "by MADV_POPULATE_WRITE/MAP_POPULATE)", "", True, lambda r: _f(r.fault_traps),
           summable=True,
           missing_note="fault traps not measured: perf_event_open was not available to the "
                        "launcher (no kernel support or perf_event_paranoid), or "
                        "CORALLOC_BENCH_NO_PERF was set"),
    Metric("majflt", "major page faults", "", True, lambda r: _f(r.major_faults)),
]
METRIC_BY_KEY = {m.key: m for m in METRICS}
TERMINAL_METRICS = ("time", "figure", "rss", "minflt", "traps")
# A suite's programs print no figure of ours; their system time says more.
SUITE_METRICS = ("time", "rss", "sys", "minflt", "traps")


@dataclass
class Cell:
    status: str  # ok / failed / skipped / missing
    reason: str = ""
    values: Dict[str, float] = field(default_factory=dict)  # medians of the ok runs
    runs: int = 0
    ok_runs: int = 0
    # (min, max) of the ok runs, per metric: the noise of this cell
    ranges: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    # every ok run's value, per metric (the rank test's samples)
    samples: Dict[str, List[float]] = field(default_factory=dict)


def aggregate(records: Sequence[RunRecord]) -> Dict[Tuple[str, str], Cell]:
    """One cell per (workload, allocator): failed if any run failed (a broken
    allocator posts no time), skipped if skipped, else the medians."""
    groups: Dict[Tuple[str, str], List[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.workload, r.allocator), []).append(r)
    cells: Dict[Tuple[str, str], Cell] = {}
    for key, runs in groups.items():
        failed = [r for r in runs if r.status == FAILED]
        ok = [r for r in runs if r.status == OK]
        if failed:
            reasons = sorted({r.reason for r in failed})
            cells[key] = Cell(FAILED, "; ".join(reasons), {}, len(runs), len(ok))
        elif not ok:
            cells[key] = Cell(SKIPPED, runs[0].reason, {}, len(runs), 0)
        else:
            values: Dict[str, float] = {}
            ranges: Dict[str, Tuple[float, float]] = {}
            samples: Dict[str, List[float]] = {}
            for m in METRICS:
                vs = [v for v in (m.get(r) for r in ok) if v is not None]
                if vs:
                    values[m.key] = median(vs)
                    ranges[m.key] = (min(vs), max(vs))
                    samples[m.key] = vs
            cells[key] = Cell(OK, "", values, len(runs), len(ok), ranges, samples)
    return cells


def _ordered(items: Sequence[str]) -> List[str]:
    seen: List[str] = []
    for i in items:
        if i not in seen:
            seen.append(i)
    return seen


def ratio(cells: Dict[Tuple[str, str], Cell], metric: str, workload: str, alloc: str,
          baseline: str) -> Optional[float]:
    c, b = cells.get((workload, alloc)), cells.get((workload, baseline))
    if not c or not b or c.status != OK or b.status != OK:
        return None
    v, bv = c.values.get(metric), b.values.get(metric)
    if v is None or bv is None or bv <= 0 or v <= 0:
        return None
    return v / bv


def overlap(a: Optional[Tuple[float, float]], b: Optional[Tuple[float, float]]) -> bool:
    """Do two min-max ranges overlap? (False when either is unknown.)"""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def differing(cells: Dict[Tuple[str, str], Cell], metric: str, workloads: Sequence[str],
              alloc: str, others: Dict[str, str]) -> Dict[str, bool]:
    """For each workload where alloc and others[workload] both completed:
    do their runs differ beyond noise? The rank-sum test on the runs, with
    Benjamini-Hochberg over these workloads (see stats.py): the false calls
    stay at most stats.Q of the calls, however many workloads there are."""
    pairs: List[Tuple[str, List[float], List[float]]] = []
    for w in workloads:
        c, b = cells.get((w, alloc)), cells.get((w, others.get(w, "")))
        if not c or not b or c.status != OK or b.status != OK:
            continue
        a_s, b_s = c.samples.get(metric), b.samples.get(metric)
        if a_s and b_s:
            pairs.append((w, a_s, b_s))
    calls = stats.differ([(a, b) for _, a, b in pairs])
    return {w: called for (w, _, _), called in zip(pairs, calls)}


def beyond_noise(cells: Dict[Tuple[str, str], Cell], metric: Metric, workloads: Sequence[str],
                 alloc: str, baseline: str) -> Tuple[int, int]:
    """How many workloads the allocator is better / worse than the baseline
    on beyond noise (see differing)."""
    called = differing(cells, metric.key, workloads, alloc, {w: baseline for w in workloads})
    better = worse = 0
    for w, yes in called.items():
        r = ratio(cells, metric.key, w, alloc, baseline)
        if not yes or r is None or r == 1.0:
            continue
        if (r < 1.0) == metric.lower_better:
            better += 1
        else:
            worse += 1
    return better, worse


# Workloads that run coralloc's own bulk calls against the peers' malloc/free
# (and the no-allocator ceilings): shown, but kept out of the headline figures.
NOT_HEADLINE = ("-api", "-null")


def headline(workloads: Sequence[str]) -> List[str]:
    """The workloads of the headline geomean (every one that runs the same
    calls under every allocator)."""
    return [w for w in workloads if not w.endswith(NOT_HEADLINE)]


def geomean_ratios(cells: Dict[Tuple[str, str], Cell], metric: str, workloads: Sequence[str],
                   alloc: str, baseline: str) -> Tuple[Optional[float], int]:
    rs = [r for r in (ratio(cells, metric, w, alloc, baseline) for w in workloads)
          if r is not None]
    return geomean(rs), len(rs)


@dataclass
class Table:
    title: str
    header: List[str]
    rows: List[List[str]]
    notes: List[str]
    footer: int = 2  # summary rows at the end (geomean, failures; total)


def noise_note(reps: int) -> str:
    """What '~' and 'beyond noise' mean, and what this many repetitions can show."""
    return (f"~ before a ratio: not told apart from the baseline by the exact two-sided rank-sum "
            f"(Mann-Whitney) test of the runs, Benjamini-Hochberg over the workloads of the "
            f"column at a false-discovery rate of {stats.Q:g}; 'beyond noise' counts the "
            f"others, better/worse. With {reps} runs each the smallest p is "
            f"{stats.smallest_p(reps, reps):.3g}" +
            (": no difference can be called; run 5 or more repetitions." if
             stats.smallest_p(reps, reps) > stats.Q else "."))


def build_table(metric: Metric, cells: Dict[Tuple[str, str], Cell], workloads: Sequence[str],
                allocs: Sequence[str], baseline: str, ranges: bool = False) -> Table:
    """One table of a figure; `ranges` adds each cell's [min-max]."""
    better = "lower is better" if metric.lower_better else "higher is better"
    unit = f" ({metric.unit})" if metric.unit else ""
    spread = " [min-max]" if ranges else ""
    title = f"{metric.title}{unit}: median{spread}, and ratio to {baseline} ({better})"
    rows: List[List[str]] = []
    called = {a: differing(cells, metric.key, workloads, a, {w: baseline for w in workloads})
              for a in allocs if a != baseline}
    for w in workloads:
        row = [w]
        for a in allocs:
            c = cells.get((w, a))
            if c is None:
                row.append("-")
            elif c.status == FAILED:
                row.append("FAILED")
            elif c.status == SKIPPED:
                row.append("skipped")
            elif metric.key not in c.values:
                row.append("-")
            else:
                v = metric.fmt(c.values[metric.key])
                lo_hi = c.ranges.get(metric.key)
                if ranges and lo_hi is not None:
                    v += f" [{metric.fmt(lo_hi[0])}-{metric.fmt(lo_hi[1])}]"
                r = ratio(cells, metric.key, w, a, baseline)
                noise = "~" if a != baseline and not called[a].get(w, False) else ""
                row.append(f"{v} ({noise}{r:.2f}x)" if r is not None else v)
        rows.append(row)
    top = headline(workloads)
    left_out = len(workloads) - len(top)
    geo = [f"geomean vs {baseline}" + (f" (without the {left_out} -api)" if left_out else "")]
    for a in allocs:
        g, n = geomean_ratios(cells, metric.key, top, a, baseline)
        usable = sum(1 for w in top if (w, a) in cells)
        if g is None:
            geo.append("-")
        else:
            geo.append(f"{g:.2f}x" + (f" (n={n})" if n < usable else ""))
    footer = 3
    if metric.summable:
        rows.append(total_row(metric, cells, workloads, allocs))
        footer = 4
    rows.append(geo)
    noise_row = ["beyond noise (better/worse)"]
    for a in allocs:
        noise_row.append("-" if a == baseline else "%d/%d" % beyond_noise(cells, metric,
                                                                          workloads, a, baseline))
    rows.append(noise_row)
    fails = ["failed runs"] + [str(sum(1 for w in workloads
                                       if cells.get((w, a), Cell("missing")).status == FAILED))
                               for a in allocs]
    rows.append(fails)
    measured = any(metric.key in c.values for c in cells.values())
    notes = [metric.missing_note] if metric.missing_note and not measured else []
    reps = max((c.ok_runs for c in cells.values()), default=0)
    notes.append(noise_note(reps))
    return Table(title, ["workload", *allocs], rows, notes, footer)


def total_row(metric: Metric, cells: Dict[Tuple[str, str], Cell], workloads: Sequence[str],
              allocs: Sequence[str]) -> List[str]:
    """The medians added up over the workloads, per allocator; '-' when any
    workload has no value for it (a partial sum would compare unfairly)."""
    row = ["total"]
    for a in allocs:
        vals = [cells[(w, a)].values.get(metric.key) if (w, a) in cells else None
                for w in workloads]
        row.append("-" if not vals or any(v is None for v in vals)
                   else metric.fmt(sum(v for v in vals if v is not None)))
    return row


def render_text(t: Table, footer: Optional[int] = None) -> str:
    """An aligned text table (tabulate); a rule above the last `footer` rows
    (the table's own summary rows unless given), its notes below."""
    footer = t.footer if footer is None else footer
    rows: List[Any] = list(t.rows)
    if footer:
        rows.insert(len(rows) - footer, SEPARATING_LINE)
    body = tabulate(rows, headers=t.header, tablefmt="simple", disable_numparse=True,
                    colalign=("left", *["right"] * (len(t.header) - 1)))
    return "\n".join([t.title, body, *t.notes])


def render_markdown(t: Table) -> str:
    rows = [r if i < len(t.rows) - t.footer else [f"**{r[0]}**", *r[1:]]
            for i, r in enumerate(t.rows)]
    body = tabulate(rows, headers=t.header, tablefmt="pipe", disable_numparse=True,
                    colalign=("left", *["right"] * (len(t.header) - 1)))
    out = [f"**{t.title}**", "", body]
    if t.notes:
        out += [""] + t.notes
    return "\n".join(out)


# A run whose cross-CPU round trip (before or after it) exceeds this multiple
# of the fastest one measured in the same results ran while the machine moved
# cache lines between cores that much slower (as on a VM whose host has put
# the two vCPUs on distant cores); every cross-thread workload slows with it.
RTT_SLOW_FACTOR = 2.0


def slow_rtt_runs(records: Sequence[RunRecord]) -> Tuple[Optional[float], List[RunRecord]]:
    """The fastest cross-CPU round trip of the runs (ns; None when none was
    measured) and the ok runs that saw over RTT_SLOW_FACTOR times it."""
    measured = [(r, r.rtt_before_ns, r.rtt_after_ns) for r in records
                if r.rtt_before_ns is not None and r.rtt_after_ns is not None]
    if not measured:
        return None, []
    fastest = min(min(b, a) for _, b, a in measured)
    slow = [r for r, b, a in measured
            if r.status == OK and max(b, a) > RTT_SLOW_FACTOR * fastest]
    return fastest, slow


def rtt_notes(records: Sequence[RunRecord], limit: int = 40) -> List[str]:
    """One summary line on the cross-CPU round trips of the runs, then one
    line per run (up to `limit`) that ran while they were slow."""
    fastest, slow = slow_rtt_runs(records)
    if fastest is None:
        return []
    runs = sum(1 for r in records if r.status == OK)
    out = [f"cross-CPU round trip before/after each run: fastest {fastest:.0f} ns; "
           f"{len(slow)} of {runs} runs saw over {RTT_SLOW_FACTOR:g}x that (cache lines "
           "crossed between cores slower then, as when a VM's host puts its vCPUs on distant "
           "cores; cross-thread workloads slow down with it)"]
    for r in slow[:limit]:
        out.append(f"{r.workload} / {r.allocator} rep {r.rep}: {r.rtt_before_ns:.0f} / "
                   f"{r.rtt_after_ns:.0f} ns, {r.wall_s:.3f} s")
    if len(slow) > limit:
        out.append(f"... and {len(slow) - limit} more (results.json: rtt_before_ns, "
                   "rtt_after_ns)")
    return out


def failures(records: Sequence[RunRecord]) -> List[str]:
    out = []
    for r in records:
        if r.status == FAILED:
            out.append(f"{r.workload} / {r.allocator} rep {r.rep}: {r.reason}")
    return out


def layout(records: Sequence[RunRecord], meta: Dict[str, object]) -> Tuple[List[str], List[str]]:
    workloads = _ordered([r.workload for r in records])
    alloc_meta = meta.get("allocators")
    allocs_present = _ordered([r.allocator for r in records])
    if isinstance(alloc_meta, dict):
        allocs = [a for a in alloc_meta if a in allocs_present]
        allocs += [a for a in allocs_present if a not in allocs]
    else:
        allocs = allocs_present
    return workloads, allocs


def pick_baseline(requested: Optional[str], allocs: Sequence[str]) -> str:
    if requested and requested in allocs:
        return requested
    for b in BASELINE_FALLBACKS:
        if b in allocs:
            return b
    return allocs[0]


def terminal_report(records: Sequence[RunRecord], meta: Dict[str, object], baseline: str,
                    metrics: Optional[Sequence[str]] = None) -> str:
    cells = aggregate(records)
    workloads, allocs = layout(records, meta)
    if metrics is None:
        metrics = SUITE_METRICS if isinstance(meta.get("suite"), dict) else TERMINAL_METRICS
    parts = [render_text(build_table(METRIC_BY_KEY[m], cells, workloads, allocs, baseline))
             for m in metrics]
    summary = best_peer_section(cells, workloads, allocs, meta, tables=False)
    if summary:
        parts.append("\n".join(summary))
    rtt = rtt_notes(records, limit=10)
    if len(rtt) > 1:
        parts.append(rtt[0] + ":\n" + "\n".join("  " + x for x in rtt[1:]))
    suite = meta.get("suite")
    gone = suite.get("not_run") if isinstance(suite, dict) else None
    if isinstance(gone, dict) and gone:
        parts.append("not run:\n" + "\n".join(f"  {k}: {v}" for k, v in gone.items()))
    f = failures(records)
    if f:
        parts.append("failures:\n" + "\n".join("  " + x for x in f))
    return "\n\n".join(parts)


# ---- against the best peer -------------------------------------------------------

# A workload is a gap when the subject's median wall time is above this many
# times the fastest peer's median.
BEST_PEER_LIMIT = 1.05


@dataclass(frozen=True)
class PeerGap:
    workload: str
    ratio: float  # subject's median / the fastest peer's median
    peer: str
    beyond_noise: bool  # the two min-max ranges do not overlap


def copy_names(meta: Dict[str, object]) -> Dict[str, str]:
    """The allocators that are copies of another (`run --copies`): name -> original."""
    am = meta.get("allocators")
    if not isinstance(am, dict):
        return {}
    return {n: str(a["copy_of"]) for n, a in am.items()
            if isinstance(a, dict) and a.get("copy_of")}


def best_peer_gaps(cells: Dict[Tuple[str, str], Cell], workloads: Sequence[str],
                   subject: str, peers: Sequence[str]) -> Tuple[List[PeerGap], int]:
    """The workloads where subject's median wall time is above BEST_PEER_LIMIT
    times the fastest of peers' medians, and how many workloads were
    compared (subject and at least one peer completed them)."""
    fastest = fastest_peers(cells, workloads, subject, peers)
    called = differing(cells, "time", workloads, subject, {w: p for w, (p, _) in fastest.items()})
    gaps = [PeerGap(w, r, p, called.get(w, False)) for w, (p, r) in fastest.items()
            if r > BEST_PEER_LIMIT]
    return gaps, len(fastest)


def fastest_peers(cells: Dict[Tuple[str, str], Cell], workloads: Sequence[str], subject: str,
                  peers: Sequence[str]) -> Dict[str, Tuple[str, float]]:
    """workload -> (the peer with the lowest median time, subject's ratio to
    it), for the workloads subject and at least one peer completed."""
    out: Dict[str, Tuple[str, float]] = {}
    for w in workloads:
        rs = [(r, p) for r, p in ((ratio(cells, "time", w, subject, p), p) for p in peers)
              if r is not None]
        if rs:
            r, peer = max(rs)  # the highest ratio: to the fastest peer
            out[w] = (peer, r)
    return out


def leave_one_out(ratios: Dict[str, float]) -> Tuple[float, float, str]:
    """The geomean of the ratios with each workload left out in turn: its
    lowest and highest value, and the workload whose absence moves it most."""
    full = geomean(ratios.values()) or 1.0
    outs = {w: geomean(r for k, r in ratios.items() if k != w) or full for w in ratios}
    if len(ratios) < 2:
        return full, full, ""
    most = max(outs, key=lambda w: abs(math.log(outs[w] / full)))
    return min(outs.values()), max(outs.values()), most


def headline_lines(cells: Dict[Tuple[str, str], Cell], workloads: Sequence[str], subject: str,
                   peers: Sequence[str], baseline: str) -> List[str]:
    """The subject's time geomean against the baseline and against the
    fastest peer of each workload, each with its leave-one-out range (how
    much one workload carries), over the headline workloads."""
    top = headline(workloads)
    out: List[str] = []
    vs_base = {w: r for w in top
               if (r := ratio(cells, "time", w, subject, baseline)) is not None}
    fastest = fastest_peers(cells, top, subject, peers)
    left = len(workloads) - len(top)
    note = f"; {left} -api workloads left out" if left else ""
    for label, rs in ((baseline, vs_base), ("the fastest peer of each workload",
                                            {w: r for w, (_, r) in fastest.items()})):
        if not rs or (label == baseline and subject == baseline):
            continue
        lo, hi, most = leave_one_out(rs)
        g = geomean(rs.values()) or 1.0
        out.append(f"{subject}'s time geomean vs {label}: {g:.2f}x over {len(rs)} workloads "
                   f"(leave-one-out {lo:.2f}x-{hi:.2f}x"
                   + (f", most moved by leaving out {most}" if most else "") + f"){note}.")
    return out


def _gap_summary(who: str, against: str, gaps: Sequence[PeerGap], compared: int) -> str:
    apart = sum(1 for g in gaps if g.beyond_noise)
    return (f"{who}'s median time is above {BEST_PEER_LIMIT:g}x {against}'s on "
            f"{len(gaps)} of {compared} workloads; on {apart} of them beyond noise (rank-sum "
            f"test, Benjamini-Hochberg at {stats.Q:g} over the workloads).")


def best_peer_section(cells: Dict[Tuple[str, str], Cell], workloads: Sequence[str],
                      allocs: Sequence[str], meta: Dict[str, object],
                      subject: str = "coralloc", tables: bool = True) -> List[str]:
    """Markdown: the subject against the fastest peer of each workload, and,
    when the run has copies of the subject, against the fastest copy: what
    noise alone gives on this machine with these repetitions (an A/A run).
    Without tables, only the summary lines (the terminal report)."""
    if subject not in allocs:
        return []
    copied = copy_names(meta)
    copies = [a for a in allocs if copied.get(a) == subject]
    peers = [a for a in allocs if a != subject and a not in copied]
    out = ["## Against the best peer", ""] if tables else []
    baseline = str(meta.get("baseline") or pick_baseline(None, allocs))
    out += headline_lines(cells, workloads, subject, peers, baseline)
    if tables:
        out.append("")
    for group, label in ((peers, "the fastest peer"), (copies, "the fastest copy")):
        if not group:
            continue
        gaps, compared = best_peer_gaps(cells, workloads, subject, group)
        out += [_gap_summary(subject, label, gaps, compared)]
        if not tables:
            continue
        out.append("")
        if gaps:
            out += ["| workload | ratio | to | beyond noise |", "|---|---:|---|---|"]
            out += [f"| {g.workload} | {g.ratio:.2f}x | {g.peer} | "
                    f"{'yes' if g.beyond_noise else 'no'} |" for g in gaps]
            out.append("")
    if copies and tables:
        out += [f"The copies ({', '.join(copies)}) are {subject}'s own library under other "
                "names: a gap to them is noise, and their line above is the yardstick for "
                "the peers' line.", ""]
    return out


# ---- files -------------------------------------------------------------------

CSV_FIELDS = ["workload", "allocator", "rep", "status", "reason", "exit_status", "wall_s",
              "user_s", "sys_s", "max_rss_kib", "minor_faults", "major_faults", "fault_traps",
              "rtt_before_ns", "rtt_after_ns", "time_s",
              "figure_name",
              "figure", "threads", "profile", "served_by", "command"]


def write_json(path: Path, meta: Dict[str, object], records: Sequence[RunRecord]) -> None:
    data = {"meta": meta, "runs": [r.to_json() for r in records]}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def write_csv(path: Path, records: Sequence[RunRecord]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in records:
            d = r.to_json()
            w.writerow([" ".join(map(str, d["command"])) if k == "command"  # type: ignore[call-overload]
                        else ("" if d.get(k) is None else d.get(k)) for k in CSV_FIELDS])


def load_results(path: str) -> Tuple[Dict[str, object], List[RunRecord]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise BenchError(f"{path}: not a results file ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise BenchError(f"{path}: not a results file (no 'runs' list)")
    try:
        records = [RunRecord.from_json(d) for d in data["runs"]]
    except (TypeError, AttributeError) as e:
        raise BenchError(f"{path}: bad run record ({e})") from None
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    return meta, records  # type: ignore[return-value]


def merge_results(parts: Sequence[Tuple[Dict[str, object], List[RunRecord]]]
                  ) -> Tuple[Dict[str, object], List[RunRecord]]:
    """Several runs as one: their records, the first run's metadata with the
    workloads, the suite's tests not run and its derived times joined. A
    workload in several runs of other seeds is repeated: its later runs'
    repetitions are numbered after the earlier ones (a run split into one
    command per repetition, each under a timed command's limit). Refused when
    the runs' allocators differ (their ratios would not compare) or when a
    workload is in two runs of the same seed (the same run twice)."""
    if not parts:
        raise BenchError("nothing to merge")
    meta = json.loads(json.dumps(parts[0][0]))  # a deep copy
    records: List[RunRecord] = []
    seen: Dict[str, List[int]] = {}  # workload -> the runs it is in
    reps: Dict[str, int] = {}  # workload -> the highest repetition merged
    names = sorted(_dict(meta.get("allocators")))
    for i, (m, recs) in enumerate(parts):
        if sorted(_dict(m.get("allocators"))) != names:
            raise BenchError(f"run {i + 1} has other allocators than run 1: "
                             f"{sorted(_dict(m.get('allocators')))} against {names}")
        offset = {w: reps.get(w, 0) for w in {r.workload for r in recs}}
        for w in offset:
            for j in seen.get(w, []):
                if parts[j][0].get("seed") == m.get("seed"):
                    raise BenchError(f"workload {w} is in runs {j + 1} and {i + 1} "
                                     f"of the same seed")
            seen.setdefault(w, []).append(i)
        for r in recs:
            r.rep += offset[r.workload]
            reps[r.workload] = max(reps.get(r.workload, 0), r.rep)
        records += recs
        if i:
            _dict(meta.setdefault("workloads", {})).update(_dict(m.get("workloads")))
            suite, other = _dict(meta.get("suite")), _dict(m.get("suite"))
            for k in ("not_run", "derived_times"):
                if k in other:
                    _dict(suite.setdefault(k, {})).update(_dict(other[k]))
            meta["total_seconds"] = float(str(meta.get("total_seconds") or 0)) + float(
                str(m.get("total_seconds") or 0))
    if reps:
        meta["reps"] = max(reps.values())
    suite = _dict(meta.get("suite"))
    if "not_run" in suite:  # a test some part ran is not "not run"
        suite["not_run"] = {k: v for k, v in _dict(suite["not_run"]).items() if k not in seen}
    return meta, records


def _dict(v: object) -> Dict[str, Any]:
    return v if isinstance(v, dict) else {}


def markdown_report(records: Sequence[RunRecord], meta: Dict[str, object], baseline: str,
                    charts: Sequence[str]) -> str:
    cells = aggregate(records)
    workloads, allocs = layout(records, meta)
    out = ["# coralloc benchmark report", ""]
    out.append(f"- command: `{meta.get('command', '')}`")
    for k in ("date", "profile", "reps", "threads", "total_seconds"):
        if k in meta:
            out.append(f"- {k.replace('_', ' ')}: {meta[k]}")
    machine = meta.get("machine")
    if isinstance(machine, dict):
        out.append("- machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()))
    out += ["", "## Allocators", "",
            "| name | library | version | built, and the options it runs with | verified | "
            "notes |", "|---|---|---|---|---|---|"]
    am = meta.get("allocators")
    if isinstance(am, dict):
        for name, a in am.items():
            if isinstance(a, dict):
                notes = "; ".join(str(n) for n in a.get("notes") or [])
                src = f" ({a.get('package')})" if a.get("package") else ""
                env = a.get("settings")
                opts = (" " + " ".join(f"{k}={v}" for k, v in env.items())
                        if isinstance(env, dict) and env else "")
                out.append(f"| {name} | {a.get('path') or 'glibc (no preload)'} | "
                           f"{a.get('version') or ''}{src} | {a.get('build') or ''}{opts} | "
                           f"{'yes' if a.get('verified') else 'NO'} | {notes} |")
    gone = meta.get("missing_allocators")
    if isinstance(gone, dict) and gone:
        out += ["", "Not run (missing here):", ""]
        out += [f"- {name}: {why}" for name, why in gone.items()]
    out += ["", "Cells are medians over the repetitions; a cell with any failed run is "
            "FAILED (a crash, a non-zero exit or a wrong result never counts as a time). "
            f"Ratios are to {baseline}; the geomean row is over the workloads both "
            "completed.", ""]
    wl = meta.get("workloads")
    if isinstance(wl, dict):
        out += ["## Workloads", "", "| workload | threads | what |", "|---|---:|---|"]
        for w in workloads:
            d = wl.get(w)
            if isinstance(d, dict):
                out.append(f"| {w} | {d.get('threads', '')} | {d.get('description', '')} |")
        out.append("")
    out += suite_section(meta)
    if charts:
        out += ["## Charts", ""]
        out += [f"![{c}]({c})" for c in charts]
        out.append("")
    out += ["## Tables", ""]
    for m in METRICS:
        if m.key == "figure" and isinstance(meta.get("suite"), dict):
            continue  # a suite's programs print no figure of ours
        out += [render_markdown(build_table(m, cells, workloads, allocs, baseline, ranges=True)),
                ""]
    out += best_peer_section(cells, workloads, allocs, meta)
    fp = meta.get("fastpath")
    if isinstance(fp, dict) and fp.get("table"):
        out += ["## Fast path (callgrind)", "",
                "Instructions per malloc+free pair (per block for batch64 and mixed), loop "
                "included, from `coralloc-bench fastpath` (see docs/FASTPATH.md):", "",
                str(fp["table"]), ""]
        out += [f"- {n}" for n in fp.get("notes") or []]
    rtt = rtt_notes(records)
    if rtt:
        out += ["## Cross-CPU round trip", "", rtt[0] + ("." if len(rtt) == 1 else ":"), ""]
        out += [f"- {x}" for x in rtt[1:]]
        out.append("")
    f = failures(records)
    out += ["## Failures", ""]
    out += [f"- {x}" for x in f] if f else ["none"]
    out.append("")
    return "\n".join(out)


def suite_section(meta: Dict[str, object]) -> List[str]:
    """Markdown: the suite a run came from (`run --suite`): its checkout and
    commit, procs, whose times are derived from the program's output, and
    the tests not run with the reason."""
    suite = meta.get("suite")
    if not isinstance(suite, dict):
        return []
    out = ["## Suite", "",
           f"{suite.get('name')} from {suite.get('checkout')} (commit {suite.get('commit') or '?'})"
           f", its bench.sh command lines with procs = {suite.get('procs')}, programs built "
           f"with its CMake in {suite.get('build')}.", ""]
    derived = suite.get("derived_times")
    if isinstance(derived, dict) and derived:
        out += ["Time: the wall time, except where bench.sh derives the time from the "
                "program's output (the regular expression it reads):", ""]
        out += [f"- {k}: `{v}`" for k, v in derived.items()]
        out.append("")
    gone = suite.get("not_run")
    if isinstance(gone, dict) and gone:
        out += ["Not run:", ""] + [f"- {k}: {v}" for k, v in gone.items()] + [""]
    return out


# ---- compare -------------------------------------------------------------------

def compare(old_path: str, new_path: str, metrics: Sequence[str] = ("time", "rss", "figure")
            ) -> str:
    """Ratios NEW/OLD of the medians, per workload and allocator present in
    both files, and their geometric means; a `!` marks a change beyond noise
    (the old and new min-max ranges do not overlap), and each table is
    followed by the list of those changes."""
    _, old = load_results(old_path)
    meta_new, new = load_results(new_path)
    co, cn = aggregate(old), aggregate(new)
    workloads, allocs = layout(new, meta_new)
    pairs = [(w, a) for w in workloads for a in allocs if (w, a) in co and (w, a) in cn]
    if not pairs:
        raise BenchError("the two result files have no workload/allocator in common")
    parts = []
    for key in metrics:
        m = METRIC_BY_KEY[key]
        better = "lower is better" if m.lower_better else "higher is better"
        header = ["workload", *[a for a in allocs if any(p[1] == a for p in pairs)]]
        rows: List[List[str]] = []
        per_alloc: Dict[str, List[float]] = {a: [] for a in header[1:]}
        changed: List[str] = []
        for w in workloads:
            if not any((w, a) in co and (w, a) in cn for a in header[1:]):
                continue
            row = [w]
            for a in header[1:]:
                o, n = co.get((w, a)), cn.get((w, a))
                if o is None or n is None:
                    row.append("-")
                elif n.status != OK or o.status != OK:
                    row.append(f"{o.status}->{n.status}" if n.status != o.status else n.status)
                else:
                    ov, nv = o.values.get(key), n.values.get(key)
                    if ov and nv and ov > 0:
                        r = nv / ov
                        per_alloc[a].append(r)
                        moved = not overlap(o.ranges.get(key), n.ranges.get(key))
                        row.append(f"{m.fmt(ov)} -> {m.fmt(nv)} ({r:.2f}x)" +
                                   ("!" if moved else ""))
                        if moved:
                            way = "better" if (r < 1.0) == m.lower_better else "worse"
                            changed.append(f"{w} / {a}: {m.fmt(ov)} -> {m.fmt(nv)} "
                                           f"({r:.2f}x, {way})")
                    else:
                        row.append("-")
            rows.append(row)
        geo = ["geomean new/old"]
        for a in header[1:]:
            g = geomean(per_alloc[a])
            geo.append("-" if g is None else f"{g:.2f}x")
        rows.append(geo)
        unit = f" ({m.unit})" if m.unit else ""
        notes = [f"changed beyond noise ({len(changed)}; `!`: the min-max ranges do not "
                 "overlap):", *(f"  {c}" for c in changed)] if changed else [
            "no change beyond noise (every old and new min-max range overlaps)"]
        t = Table(f"{m.title}{unit}: old -> new (new/old, {better})", header, rows, notes)
        parts.append(render_text(t, footer=1))
    return "\n\n".join(parts)
