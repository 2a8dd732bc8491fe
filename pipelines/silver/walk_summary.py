"""What the apply's driver reads of a walk's versions of documents, summed up per vbucket
where the walk made them, on the vbucket's ``state`` row.

The apply collects the walk's control rows (states, rollbacks, system events) in one job,
and needs three things of the versions it does not collect: the keys each collection's
committed changes touch (a count per collection), the collections with versions, and the
CAS times of the committed changes (freshness, :class:`pipelines.observe.freshness.ChangeTimes`).
Each vbucket is walked and summed up on its own, and a key lives in one vbucket, so
per-vbucket counts of distinct keys add up to the run's; the CAS times come as each vbucket's count, sum and
quantile points, merged by weight (:func:`collected`). Aggregating the cached walk in Spark
instead took three more jobs and two shuffles per apply.

No Spark here: the walk's ``applyInArrow`` function calls :func:`summarize`, the driver
:func:`collected`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.protocol import HLC_COUNTER_MASK
from pipelines.observe.freshness import PROBABILITIES
from pipelines.silver.walk import VERSION_KINDS, RowKind

POINTS = 101
"""Quantile points of a vbucket's CAS times at most (all of them when it has fewer)."""
COLUMNS = ("change_keys", "version_collections", "cas_count", "cas_sum", "cas_points")
"""The columns of :data:`pipelines.schemas.WALKED` only the ``state`` row fills."""


def summarize(out: pa.Table) -> pa.Table:
    """``out``, the walked rows of one vbucket or several (each vbucket's ``state`` row after
    its other rows), with :data:`COLUMNS` set on each ``state`` row: the vbucket's distinct
    keys of committed changes per collection, its collections with versions, and its
    changes' CAS times (count, sum, points). One pass over all the vbuckets: a vbucket's
    summary costs no Arrow call of its own."""
    kinds = out.column("kind")
    vbuckets = out.column("vbucket")
    at_state = np.flatnonzero(pc.equal(kinds, RowKind.STATE.value).to_numpy(zero_copy_only=False))
    state_vbs = vbuckets.take(pa.array(at_state)).to_pylist()
    changes = out.filter(pc.equal(kinds, RowKind.CHANGE.value))
    keys: dict[int, Counter[int]] = {vb: Counter() for vb in state_vbs}
    changed = changes.select(["vbucket", "collection_id", "key"]).to_pydict()
    for vb, cid, key in set(zip(*changed.values(), strict=True)):
        keys[vb][cid] += key is not None
    versions = out.filter(pc.is_in(kinds, value_set=pa.array(VERSION_KINDS)))
    collections: dict[int, set[int]] = {vb: set() for vb in state_vbs}
    for vb, cid in set(
        zip(
            versions.column("vbucket").to_pylist(),
            versions.column("collection_id").to_pylist(),
            strict=True,
        )
    ):
        collections[vb].add(cid)
    times = _cas_times(changes)
    values = {
        "change_keys": [sorted(keys[vb].items()) for vb in state_vbs],
        "version_collections": [sorted(collections[vb]) for vb in state_vbs],
        "cas_count": [len(times.get(vb, ())) for vb in state_vbs],
        "cas_sum": [float(times[vb].sum()) if vb in times else None for vb in state_vbs],
        "cas_points": [points(times[vb]) if vb in times else None for vb in state_vbs],
    }
    # each row's index among the state rows (null for the other rows): the values taken
    slot = np.full(out.num_rows, -1, dtype=np.int64)
    slot[at_state] = np.arange(len(at_state))
    where = pa.array(slot, mask=slot < 0)
    for name, column_values in values.items():
        i = out.schema.get_field_index(name)
        field = out.schema.field(i)
        out = out.set_column(i, field, pa.array(column_values, field.type).take(where))
    return out


def _cas_times(changes: pa.Table) -> dict[int, np.ndarray]:
    """vbucket -> the CAS times of its committed changes (:func:`cas_seconds`), for the
    vbuckets with any."""
    if not changes.num_rows:
        return {}
    cas = changes.column("cas")
    valid = pc.is_valid(cas)
    vbs = pc.filter(changes.column("vbucket"), valid).to_numpy()
    values = pc.filter(cas, valid).to_numpy().astype(np.int64)
    vbs = vbs[values > 0]
    seconds = cas_seconds(values)
    order = np.argsort(vbs, kind="stable")
    vbs, seconds = vbs[order], seconds[order]
    bounds = np.flatnonzero(np.diff(vbs)) + 1
    return {
        int(part_vbs[0]): part
        for part_vbs, part in zip(np.split(vbs, bounds), np.split(seconds, bounds), strict=True)
        if len(part)
    }


def cas_seconds(cas: np.ndarray) -> np.ndarray:
    """Seconds since the epoch of the CAS values (the clock's nanoseconds, its counter bits
    masked off); a CAS of 0 (none) is left out."""
    kept = cas.astype(np.int64)
    kept = kept[kept > 0]
    return (kept & ~HLC_COUNTER_MASK) / 1e9


def points(seconds: np.ndarray) -> list[float] | None:
    """The sorted values, or :data:`POINTS` quantiles of them (from the least to the
    greatest) when there are more; None for none."""
    if not len(seconds):
        return None
    ordered = np.sort(seconds)
    if len(ordered) <= POINTS:
        return [float(v) for v in ordered]
    return [float(v) for v in np.quantile(ordered, np.linspace(0.0, 1.0, POINTS))]


@dataclass(frozen=True)
class Collected:
    """The summaries of a run's ``state`` rows, added up."""

    keys: dict[int, int]
    """collection id -> the keys of its committed changes."""
    version_cids: set[int]
    """The collections with versions of documents."""
    times: dict[str, Any]
    """``cas_count``, ``cas_sum`` and ``cas_quantiles`` at :data:`PROBABILITIES`, as
    :meth:`pipelines.observe.freshness.ChangeTimes.from_row` reads them."""


def collected(states: Iterable[Mapping[str, Any]]) -> Collected:
    """The run's summary from its ``state`` rows (as collected: ``change_keys`` a list of
    (collection, keys) pairs or a dict)."""
    keys: dict[int, int] = {}
    version_cids: set[int] = set()
    counts, sums, all_points = [], [], []
    for row in states:
        pairs = row.get("change_keys") or []
        for cid, n in pairs.items() if isinstance(pairs, Mapping) else pairs:
            keys[cid] = keys.get(cid, 0) + n
        version_cids.update(row.get("version_collections") or [])
        if row.get("cas_count"):
            counts.append(int(row["cas_count"]))
            sums.append(float(row["cas_sum"]))
            all_points.append(list(row["cas_points"]))
    count = sum(counts)
    times: dict[str, Any] = {
        "cas_count": count,
        "cas_sum": sum(sums) if count else None,
        "cas_quantiles": merged_quantiles(counts, all_points, PROBABILITIES) if count else None,
    }
    return Collected(keys, version_cids, times)


def merged_quantiles(
    counts: Sequence[int], groups: Sequence[Sequence[float]], probabilities: Sequence[float]
) -> list[float]:
    """Quantiles at ``probabilities`` of values given per group as points (each group's
    values, or quantile points evenly spaced in rank) and the group's count: each point
    stands for ``count / len(points)`` values. A quantile is the least point at which the
    weight at or below it reaches its share of the total (0: the least, 1: the greatest)."""
    values = np.concatenate([np.asarray(g, dtype=float) for g in groups])
    weights = np.concatenate(
        [np.full(len(g), n / len(g)) for n, g in zip(counts, groups, strict=True)]
    )
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])
    total = cumulative[-1]
    found = []
    for p in probabilities:
        i = int(np.searchsorted(cumulative, p * total - 1e-9 * total, side="left"))
        found.append(float(values[min(i, len(values) - 1)]))
    return found
