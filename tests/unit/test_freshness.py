"""Freshness from a batch's CAS quantiles (``pipelines/observe/freshness.py``): one batch's quantiles,
several batches mixed by their counts, a histogram's cumulative counts, clock skew. Each
expected value is worked out by hand from the batches written here."""

from __future__ import annotations

import math

import pytest

from pipelines.observe.freshness import PROBABILITIES, ChangeTimes, window_quantile


def uniform(changes: int, first: float, last: float, committed_at: float) -> ChangeTimes:
    """``changes`` CAS times spread evenly from ``first`` to ``last`` seconds."""
    quantiles = tuple(first + (last - first) * p for p in PROBABILITIES)
    return ChangeTimes(changes, quantiles, changes * (first + last) / 2, committed_at)


def test_one_batch_reads_as_the_commit_time_minus_its_cas_quantiles() -> None:
    # CAS times even over [1000, 1100], committed at 1200: freshness even over [100, 200]
    times = uniform(100, 1000.0, 1100.0, committed_at=1200.0)
    assert times.quantile(0.5) == pytest.approx(150.0, abs=0.01)
    assert times.quantile(0.95) == pytest.approx(195.0, abs=0.01)  # the CAS's p5: 1005
    assert times.cdf(99.0) == 0.0 and times.cdf(150.0) == pytest.approx(0.5)
    assert times.cdf(200.0) == 1.0
    assert times.cumulative([60.0, 120.0, 150.0, 180.0, 300.0]) == [0, 20, 50, 80, 100]
    assert times.seconds_sum == pytest.approx(100 * 1200 - 100 * 1050)


def test_batches_of_a_window_mix_by_their_changes() -> None:
    all_at_10 = ChangeTimes(100, (990.0,) * len(PROBABILITIES), 100 * 990.0, 1000.0)
    even_20_to_40 = uniform(300, 960.0, 980.0, committed_at=1000.0)
    assert all_at_10.quantile(0.5) == 10.0 and all_at_10.cumulative([9.0, 10.0]) == [0, 100]
    # 400 changes: 100 at 10 s, then 300 spread over [20, 40]. The 200th is a third of the
    # way into [20, 40]: 26.67 s; the 380th, 280/300 of the way: 38.67 s.
    batches = [all_at_10, even_20_to_40]
    assert window_quantile(batches, 0.5) == pytest.approx(20 + 20 / 3, abs=0.01)
    assert window_quantile(batches, 0.95) == pytest.approx(20 + 20 * 280 / 300, abs=0.01)
    assert window_quantile(batches, 0.1) == 10.0
    assert math.isnan(window_quantile([], 0.5))


def test_nodes_clocks_ahead_read_as_zero_not_negative() -> None:
    ahead = uniform(10, 1005.0, 1010.0, committed_at=1000.0)
    assert ahead.quantile(0.5) == 0.0 and ahead.quantile(0.95) == 0.0
    assert ahead.seconds_sum == 0.0 and ahead.cumulative([0.0, 1.0]) == [10, 10]


def test_the_walks_summary_row_without_changes_is_none() -> None:
    assert (
        ChangeTimes.from_row({"cas_count": 0, "cas_sum": None, "cas_quantiles": None}, 1.0) is None
    )
    row = {"cas_count": 2, "cas_sum": 3.0, "cas_quantiles": [1.0] * 7 + [2.0] * 8}
    assert ChangeTimes.from_row(row, 5.0) == ChangeTimes(2, (1.0,) * 7 + (2.0,) * 8, 3.0, 5.0)
