"""The columnar check's history: which data items survive the rollbacks and the branches of
the newest failover logs, which are committed and outside drops and flushes, and the live
documents bronze implies (per collection and key, the newest change that is a mutation not
expired), by the rules of :mod:`.history` (whose docstrings say them), over the items'
columns; the system events, few, go through the row steps themselves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.events import DATA_OPS, Mutation, SystemEvent
from pipelines.errors import NotOnDriver
from pipelines.quality.small import history
from pipelines.quality.small.items import Bronze, _flags, _numbers, _present, newest_per
from pipelines.quality.small.placement import Placed

Row = dict[str, Any]
Branches = dict[Any, list[tuple[Any, Any]]]


@dataclass
class History:
    """What the reconciliation and coverage take from bronze's history."""

    branches: Branches
    dead_changes: set[tuple[Any, Any, Any]]
    cuts: dict[tuple[Any, Any], tuple[bool, Any]]
    live: pa.Table  # collection_id, key, seqno, expiration
    counted: np.ndarray | None = None
    """Per item, whether it is a change the live documents are taken from (a data item,
    committed, alive, outside drops and flushes)."""


def dead_branch(
    vbucket: np.ndarray,
    uuid: np.ndarray,
    has_uuid: np.ndarray,
    seqno: np.ndarray,
    branches: Branches,
) -> np.ndarray:
    """:func:`.history.with_branch`'s ``dead_branch`` (True or False: seqnos are never null
    here) of each (vbucket, vb uuid, seqno); a row with no uuid is not judged (False)."""
    entries = [
        (v, u, end)
        for v, log in branches.items()
        if v is not None
        for u, end in log
        if u is not None
    ]
    if len({(v, u) for v, u, _ in entries}) < len(entries):
        raise NotOnDriver("a failover log names one vb uuid twice")
    ends = np.array([e is not None for _, _, e in entries] + [False], bool)
    end = np.array([0 if e is None else e for _, _, e in entries] + [0], np.int64)
    found = _matched(
        pd.DataFrame({"a": vbucket, "b": uuid}),
        pd.DataFrame(
            {
                "a": np.array([v for v, _, _ in entries], np.int64),
                "b": np.array([u for _, u, _ in entries], np.int64),
            }
        ),
    )
    dead = (found < 0) | (ends[found] & (seqno > end[found]))
    return np.asarray(has_uuid & dead, bool)


def _matched(rows: pd.DataFrame, table: pd.DataFrame) -> np.ndarray:
    """Per row of ``rows``, the index of the row of ``table`` (unique on its columns) with
    the same values, -1 where none has."""
    table = table.assign(_at=np.arange(len(table), dtype=np.float64))
    joined = rows.merge(table, on=list(rows.columns), how="left")
    return np.asarray(joined["_at"].fillna(-1).to_numpy(), np.int64)


def _rolled_back(
    vbucket: np.ndarray, rank: np.ndarray, seqno: np.ndarray, placed: Placed, bronze: Bronze
) -> np.ndarray:
    """Items a later rollback of their vbucket removed (their seqno above its point)."""
    rolled = np.zeros(len(seqno), bool)
    for f in placed.frames:
        if not f["is_rollback"]:
            continue
        at = vbucket == f["vbucket"]
        rolled |= at & (rank < bronze.rank[f["_i"]]) & (seqno > f["rollback_seqno"])
    return rolled


def with_places(rows: list[Row], which: np.ndarray, placed: Placed) -> list[Row]:
    for row, i in zip(rows, which, strict=True):
        row["stream_no"] = int(placed.stream_no[i])
        row["snapshot_no"] = int(placed.snapshot_no[i])
    return rows


def bronze_history(
    bronze: Bronze, placed: Placed, snaps: list[Row], now: int | None = None
) -> History:
    """The branches, dead changes, collection cuts and live documents of bronze."""
    now = int(time.time()) if now is None else now
    items = bronze.items
    frames = placed.frames
    branches = history.latest_branches(frames)
    system = np.flatnonzero(_flags(pc.equal(items["op"], SystemEvent.op)))
    system_rows = with_places(bronze.item_dicts(system), system, placed)
    alive_system, _ = history.split_history(system_rows, branches, history.rollbacks(frames))
    data_at = np.flatnonzero(_flags(pc.is_in(items["op"], value_set=pa.array(DATA_OPS))))
    data = items.take(pa.array(data_at, pa.int64()))
    vbucket, seqno = _numbers(data["vbucket"]), _numbers(data["seqno"])
    uuid, has_uuid = _numbers(data["in_vb_uuid"]), _present(data["in_vb_uuid"])
    rank = bronze.rank[bronze.item_rows[data_at]]
    rolled = _rolled_back(vbucket, rank, seqno, placed, bronze)
    dead = rolled | dead_branch(vbucket, uuid, has_uuid, seqno, branches)
    dead_changes = _dead_changes(vbucket, uuid, has_uuid, seqno, dead, alive_system)
    committed_snapshot = committed_snapshots(placed, bronze, snaps)
    committed = ~dead & committed_snapshot[placed.snapshot[data_at]]
    cuts = history.collection_cuts(history.committed_items(alive_system, snaps))
    cid = _numbers(data["collection_id"])
    kept = committed & outside_cuts(cid, vbucket, seqno, cuts)
    counted = np.zeros(items.num_rows, bool)
    counted[data_at] = kept
    return History(branches, dead_changes, cuts, _live(data, np.flatnonzero(kept), now), counted)


def committed_snapshots(placed: Placed, bronze: Bronze, snaps: list[Row]) -> np.ndarray:
    """Per snapshot code of the items, whether its snapshot is committed."""
    done = {
        (s["session_id"], s["vbucket"], s["stream_no"], s["snapshot_no"])
        for s in snaps
        if s["committed"] is True
    }
    keys = placed.snapshot_keys
    return np.array(
        [
            (bronze.sessions[s][1], v, n, k) in done
            for s, v, n, k in zip(
                keys["session"].tolist(),
                keys["vbucket"].tolist(),
                keys["stream_no"].tolist(),
                keys["snapshot_no"].tolist(),
                strict=True,
            )
        ]
        + [False],
        bool,
    )


def _dead_changes(
    vbucket: np.ndarray,
    uuid: np.ndarray,
    has_uuid: np.ndarray,
    seqno: np.ndarray,
    dead: np.ndarray,
    alive_system: list[Row],
) -> set[tuple[Any, Any, Any]]:
    """:func:`.history.dead_changes`: (vbucket, vb uuid, seqno) of dead data items no alive
    item repeats."""
    at = np.flatnonzero(dead)
    if not len(at):
        return set()

    def triple(i: Any) -> tuple[Any, Any, Any]:
        return (int(vbucket[i]), int(uuid[i]) if has_uuid[i] else None, int(seqno[i]))

    gone = {triple(i) for i in at}
    near = np.flatnonzero(~dead & np.isin(seqno, seqno[at]))
    kept = {triple(i) for i in near}
    kept |= {(f["vbucket"], f["in_vb_uuid"], f["seqno"]) for f in alive_system}
    return {k for k in gone if None in k or k not in kept}


def outside_cuts(
    cid: np.ndarray,
    vbucket: np.ndarray,
    seqno: np.ndarray,
    cuts: dict[tuple[Any, Any], tuple[bool, Any]],
) -> np.ndarray:
    """Items not in a dropped collection's vbucket, nor at or below its flush."""
    if not cuts:
        return np.ones(len(seqno), bool)
    dropped = np.array([d for d, _ in cuts.values()] + [False], bool)
    flushed = np.array([f is not None for _, f in cuts.values()] + [False], bool)
    flush = np.array([0 if f is None else f for _, f in cuts.values()] + [0], np.int64)
    at = _matched(
        pd.DataFrame({"a": cid, "b": vbucket}),
        pd.DataFrame(
            {
                "a": np.array([c for c, _ in cuts], np.int64),
                "b": np.array([-1 if v is None else v for _, v in cuts], np.int64),
            }
        ),
    )
    return np.asarray(~dropped[at] & ~(flushed[at] & (seqno <= flush[at])), bool)


def _live(data: pa.Table, kept: np.ndarray, now: int) -> pa.Table:
    """Per (collection, key) of the ``kept`` data items, the newest by (seqno, rev seqno),
    where it is a mutation whose expiry is not past."""
    changes = data.take(pa.array(kept, pa.int64())).select(
        ["collection_id", "key", "seqno", "rev_seqno", "op", "expiration"]
    )
    changes = changes.set_column(0, "collection_id", pc.fill_null(changes["collection_id"], 0))
    newest = newest_per(changes, ["collection_id", "key"], ["seqno", "rev_seqno"])
    expiry = _numbers(newest["expiration"])
    live = _flags(pc.equal(newest["op"], Mutation.op)) & ((expiry == 0) | (expiry > now))
    return newest.filter(pa.array(live)).select(["collection_id", "key", "seqno", "expiration"])
