"""When two allocators' times differ beyond noise: the exact two-sided
Mann-Whitney (Wilcoxon rank-sum) test on their repetitions, and the
Benjamini-Hochberg procedure over the comparisons of one table column.

Why this test: it assumes nothing about the shape of the timing noise
(heavy tails, a slow outlier); under "same distribution" its p-value is
exact, so the false-positive rate of one comparison is at most the level.
Over the W workloads of a column, Benjamini-Hochberg keeps the expected
share of false calls among the calls at most Q (and, when no allocator
differs at all, the chance of any call at most Q). The price: with n
repetitions each, the smallest p-value possible is 2 / C(2n, n) (0.10 at
n = 3, 0.029 at 4, 0.0079 at 5), so a 3-repetition run can call nothing and
a difference needs 5 or more to be seen over many workloads."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Dict, List, Sequence, Tuple

# The false-discovery rate of a table column (Benjamini-Hochberg).
Q = 0.05


def _rank2(a: Sequence[float], b: Sequence[float]) -> List[int]:
    """Twice the mid-ranks of a+b (integers, ties sharing their mean rank)."""
    allv = sorted(list(a) + list(b))
    first: Dict[float, int] = {}
    last: Dict[float, int] = {}
    for i, v in enumerate(allv, start=1):
        first.setdefault(v, i)
        last[v] = i
    return [first[v] + last[v] for v in list(a) + list(b)]


@lru_cache(maxsize=256)
def _sum_counts(ranks: Tuple[int, ...], n: int) -> Dict[int, int]:
    """How many n-subsets of ranks have each sum (the permutation
    distribution of the rank sum of the first sample)."""
    # counts[k][s]: subsets of size k with sum s, over the ranks seen so far
    counts: List[Dict[int, int]] = [dict() for _ in range(n + 1)]
    counts[0][0] = 1
    for r in ranks:
        for k in range(min(n, len(ranks)) - 1, -1, -1):
            for s, c in counts[k].items():
                counts[k + 1][s + r] = counts[k + 1].get(s + r, 0) + c
    return counts[n]


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """The exact two-sided p-value of the rank-sum test of a against b (ties
    by mid-ranks, the distribution conditional on them); 1.0 when either
    sample is empty."""
    if not a or not b:
        return 1.0
    r2 = _rank2(a, b)
    n = len(a)
    observed = sum(r2[:n])
    mean = n * sum(r2) / len(r2)  # E[sum of n of the ranks], doubled ranks
    dist = _sum_counts(tuple(sorted(r2)), n)
    total = sum(dist.values())
    far = abs(observed - mean)
    extreme = sum(c for s, c in dist.items() if abs(s - mean) >= far - 1e-9)
    return min(1.0, extreme / total)


def smallest_p(n: int, m: int) -> float:
    """The smallest two-sided p-value of the test with samples of n and m."""
    if n < 1 or m < 1:
        return 1.0
    return min(1.0, 2 / math.comb(n + m, n))


def benjamini_hochberg(pvalues: Sequence[float], q: float = Q) -> List[bool]:
    """Which of the hypotheses are rejected at false-discovery rate q."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m = len(pvalues)
    cut = 0
    for rank, i in enumerate(order, start=1):
        if pvalues[i] <= q * rank / m:
            cut = rank
    rejected = [False] * m
    for i in order[:cut]:
        rejected[i] = True
    return rejected


def differ(pairs: Sequence[Tuple[Sequence[float], Sequence[float]]],
           q: float = Q) -> List[bool]:
    """For each (a, b) of a family of comparisons: do a and b differ beyond
    noise (rank-sum test, Benjamini-Hochberg at q over the family)?"""
    return benjamini_hochberg([mann_whitney_p(a, b) for a, b in pairs], q)
