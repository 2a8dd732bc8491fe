"""pipelines/silver/walk_summary.py: a vbucket's versions summed up on its state row, and a
run's summary added up from its state rows, without Spark."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from dcp_cdc.protocol import HLC_COUNTER_MASK
from pipelines import schemas
from pipelines.observe.freshness import PROBABILITIES
from pipelines.silver import walk_summary
from pipelines.silver.walk_summary import POINTS, collected, merged_quantiles, summarize

SCHEMA = schemas.arrow_schema(schemas.WALKED)
NS = 1_000_000_000


def _cas(seconds: float, counter: int = 0) -> int:
    """A CAS of ``seconds`` since the epoch, with ``counter`` in its counter bits."""
    return (int(seconds * NS) & ~HLC_COUNTER_MASK) | counter


def _walked(vb: int, rows: list[dict[str, object]]) -> pa.Table:
    """A vbucket's walked rows as the walk gives them: its rows, then the state row."""
    body = [{"vbucket": vb, **r} for r in rows]
    return pa.Table.from_pylist([*body, {"kind": "state", "vbucket": vb}], schema=SCHEMA)


def test_the_state_row_sums_up_the_vbuckets_versions() -> None:
    table = _walked(
        7,
        [
            {"kind": "change", "collection_id": 8, "key": b"a", "cas": _cas(100.5, 3)},
            {"kind": "change", "collection_id": 8, "key": b"a", "cas": _cas(101.0)},
            {"kind": "change", "collection_id": 8, "key": b"b", "cas": _cas(99.0, 1)},
            {"kind": "change", "collection_id": 0, "key": b"a", "cas": 0},  # no CAS time
            {"kind": "ended_change", "collection_id": 9, "key": b"z", "cas": _cas(50.0)},
            {"kind": "system_event", "collection_id": 10, "event": "create_collection"},
            {"kind": "rollback", "rollback_seqno": 4},
        ],
    )
    out = summarize(table).to_pylist()
    *body, state = out
    for name in walk_summary.COLUMNS:  # the other rows carry none of it
        assert all(r[name] is None for r in body), name
    assert dict(state["change_keys"]) == {0: 1, 8: 2}  # distinct keys of changes
    assert state["version_collections"] == [0, 8, 9]  # ended changes too, no system event
    assert state["cas_count"] == 3  # CAS 0 is no time
    assert state["cas_points"] == pytest.approx([99.0, 100.5, 101.0])
    assert state["cas_sum"] == pytest.approx(300.5)
    assert [r["kind"] for r in out] == [r["kind"] for r in table.to_pylist()]


def test_a_vbucket_without_changes_sums_up_nothing() -> None:
    (state,) = summarize(_walked(3, [])).to_pylist()
    assert state["change_keys"] == [] and state["version_collections"] == []
    assert (state["cas_count"], state["cas_sum"], state["cas_points"]) == (0, None, None)


def test_many_cas_times_become_points_at_even_ranks() -> None:
    seconds = np.array([100.0 + i / 7 for i in range(1000)])
    points = walk_summary.points(seconds)
    assert points is not None and len(points) == POINTS
    assert points[0] == seconds.min() and points[-1] == seconds.max()
    assert points == pytest.approx(list(np.quantile(seconds, np.linspace(0, 1, POINTS))))


def test_quantiles_of_groups_given_whole_are_exact() -> None:
    """Groups small enough to give every value: the merged quantiles are the values'."""
    rng = random.Random(5)
    groups = [sorted(rng.uniform(0, 100) for _ in range(rng.randint(1, 40))) for _ in range(9)]
    values = sorted(v for g in groups for v in g)
    found = merged_quantiles([len(g) for g in groups], groups, PROBABILITIES)
    n = len(values)
    expected = [values[max(0, int(np.ceil(p * n)) - 1)] for p in PROBABILITIES]
    assert found == expected
    assert found[0] == values[0] and found[-1] == values[-1]


def test_quantiles_of_groups_given_as_points_are_close() -> None:
    """Groups of thousands of values each given as 101 points: each merged quantile is
    within a percent of the values' rank."""
    rng = np.random.default_rng(3)
    groups = [rng.normal(50 + 10 * i, 5 + i, size=2000 + 500 * i) for i in range(6)]
    everything = np.sort(np.concatenate(groups))
    points = [walk_summary.points(g) or [] for g in groups]
    found = merged_quantiles([len(g) for g in groups], points, PROBABILITIES)
    for p, value in zip(PROBABILITIES, found, strict=True):
        rank = np.searchsorted(everything, value) / len(everything)
        assert abs(rank - p) <= 0.01, (p, rank)


def test_a_runs_summary_adds_up_its_vbuckets() -> None:
    states = [
        summarize(
            _walked(
                vb,
                [
                    {"kind": "change", "collection_id": 8, "key": f"k{vb}-{i}".encode(), "cas": c}
                    for i, c in enumerate(cas)
                ],
            )
        ).to_pylist()[-1]
        for vb, cas in ((0, [_cas(10.0), _cas(12.0)]), (1, [_cas(11.0)]), (2, []))
    ]
    summed = collected(states)
    assert summed.keys == {8: 3} and summed.version_cids == {8}
    assert summed.times["cas_count"] == 3
    assert summed.times["cas_sum"] == pytest.approx(33.0, abs=1e-3)  # counter bits masked
    quantiles = summed.times["cas_quantiles"]
    assert len(quantiles) == len(PROBABILITIES)
    assert (quantiles[0], quantiles[7], quantiles[-1]) == pytest.approx((10, 11, 12), abs=1e-3)
    nothing = collected([states[-1]])
    assert nothing.times == {"cas_count": 0, "cas_sum": None, "cas_quantiles": None}


def test_several_vbuckets_in_one_table_are_each_summed_up_as_alone() -> None:
    """The walk's groups hold several vbuckets (each one's rows, then its state row): every
    state row gets its own vbucket's summary, as when summed up alone."""
    tables = [
        _walked(
            vb,
            [
                {"kind": "change", "collection_id": cid, "key": k, "cas": _cas(t)}
                for cid, k, t in rows
            ],
        )
        for vb, rows in (
            (3, [(8, b"a", 10.0), (8, b"b", 12.0), (9, b"a", 11.0)]),
            (4, []),
            (67, [(8, b"a", 20.0), (0, b"c", 0.0)]),
            (5, [(9, b"x", 30.0)] * 200),
        )
    ]
    alone = [r for t in tables for r in summarize(t).to_pylist()]
    assert summarize(pa.concat_tables(tables)).to_pylist() == alone
    states = [r for r in alone if r["kind"] == "state"]
    assert [dict(r["change_keys"]) for r in states] == [{8: 2, 9: 1}, {}, {8: 1, 0: 1}, {9: 1}]
    assert [r["cas_count"] for r in states] == [3, 0, 1, 200]
