"""Freshness: how far silver is behind the bucket, per change: the time silver committed the
change minus the time the change was made in Couchbase, read from its CAS (the hybrid logical
clock's nanoseconds, docs/protocol/dcp.md §1.5; the ``_modified_at`` of its row).

An apply does not date each change apart: the walk's ``state`` rows, which it collects
anyway, sum up the CAS times of each vbucket's committed changes, and the apply merges them
(:mod:`pipelines.silver.walk_summary`: their count, their sum and their quantiles at
:data:`PROBABILITIES`); it adds the time its MERGEs committed. That is a :class:`ChangeTimes`: a batch's freshness distribution, piecewise linear
between those quantiles. Several batches (follow mode's last minute) mix by their counts
(:func:`window_quantile`); a Prometheus histogram is filled from them with whole counts
(:meth:`ChangeTimes.cumulative`).

No Spark here: follow mode's loop and metrics, and their tests, use it as it is.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PROBABILITIES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
"""The quantiles of a batch's CAS times the apply collects: symmetric (a CAS quantile ``p``
is the freshness quantile ``1 - p``), finer in the tails, where p95 and p99 are read."""


@dataclass(frozen=True, slots=True)
class ChangeTimes:
    """The CAS times of the changes one apply committed, and when it committed them."""

    changes: int
    """Committed changes with a CAS time (CAS 0, which no change carries, is left out)."""
    cas_quantiles: tuple[float, ...]
    """Seconds since the epoch at :data:`PROBABILITIES`, ascending."""
    cas_sum: float
    """Their sum, in seconds since the epoch (for the histogram's ``_sum``)."""
    committed_at: float
    """Wall time the apply's MERGEs had committed (seconds since the epoch)."""

    @classmethod
    def from_row(cls, row: dict[str, Any], committed_at: float) -> ChangeTimes | None:
        """From the walk's summary row (``cas_count``, ``cas_sum``, ``cas_quantiles``); None
        when the run committed no change with a CAS time."""
        count = row.get("cas_count") or 0
        quantiles = row.get("cas_quantiles")
        if not count or not quantiles:
            return None
        return cls(
            int(count), tuple(float(q) for q in quantiles), float(row["cas_sum"]), committed_at
        )

    @property
    def points(self) -> list[tuple[float, float]]:
        """The freshness distribution's corners: (seconds, fraction of changes at most that
        fresh), ascending; a negative difference (the nodes' clocks ahead of this one) is 0."""
        return sorted(
            (max(0.0, self.committed_at - cas), 1.0 - p)
            for p, cas in zip(PROBABILITIES, self.cas_quantiles, strict=True)
        )

    def cdf(self, seconds: float) -> float:
        """The fraction of the changes silver had within ``seconds`` of their CAS time."""
        points = self.points
        at = [s for s, _ in points]
        i = bisect.bisect_right(at, seconds) - 1
        if i < 0:
            return 0.0
        if i >= len(points) - 1:
            return 1.0
        (s0, f0), (s1, f1) = points[i], points[i + 1]
        return f0 + (f1 - f0) * (seconds - s0) / (s1 - s0)  # s1 > s0: bisect_right

    def quantile(self, q: float) -> float:
        """Freshness at quantile ``q``: silver's commit time minus the CAS quantile 1 - q."""
        return window_quantile([self], q)

    @property
    def seconds_sum(self) -> float:
        """Freshness summed over the changes (the commit time minus each CAS time)."""
        return max(0.0, self.changes * self.committed_at - self.cas_sum)

    def cumulative(self, bounds: Sequence[float]) -> list[int]:
        """Changes at most ``bound`` seconds behind, for each of ``bounds`` (ascending): a
        histogram's cumulative buckets, whole numbers that never decrease."""
        return [round(self.changes * self.cdf(b)) for b in bounds]


def window_quantile(batches: Iterable[ChangeTimes], q: float) -> float:
    """The ``q`` quantile of freshness over the changes of every batch (each batch's
    distribution weighted by its changes); NaN without changes."""
    chosen = [b for b in batches if b.changes]
    total = sum(b.changes for b in chosen)
    if not total:
        return math.nan
    low = min(b.points[0][0] for b in chosen)
    high = max(b.points[-1][0] for b in chosen)

    def below(seconds: float) -> float:
        return sum(b.changes * b.cdf(seconds) for b in chosen) / total

    if below(low) >= q:
        return low
    for _ in range(60):  # bisection: the mixture's CDF is continuous but for single points
        middle = (low + high) / 2
        if below(middle) >= q:
            high = middle
        else:
            low = middle
        if high - low < 1e-3:
            break
    return high
