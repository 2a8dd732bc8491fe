"""The columnar check's bronze: its frames split into the few control frames (rows, for the
row steps of :mod:`.streams` and :mod:`.history`) and the history items and snapshot markers
(columns, nearly every frame), with each frame's place in session order. A bronze table
holding anything the rows treat with Spark's null rules (a required column null, an unknown
opcode) is not taken here: :class:`~pipelines.errors.NotOnDriver`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.events import SnapshotMarker, UnknownFrame
from pipelines.errors import NotOnDriver
from pipelines.lake.delta_rs import spark_rows
from pipelines.quality.frames import ITEM_OPS, KNOWN_OPCODES, POSITION, REQUIRED
from pipelines.quality.small.read import base_frames_of

Row = dict[str, Any]
ITEM_COLUMNS = (
    "vbucket",
    "op",
    *POSITION,
    "file",
    "collection_id",
    "key",
    "rev_seqno",
    "cas",
    "expiration",
    "event",
    "in_snapshot_start",
    "in_snapshot_end",
    "in_oso",
    "in_vb_uuid",
    "start_seqno",
    "end_seqno",
    "snapshot_flags",
)
"""The columns the items and snapshot markers keep, with ``seqno``."""


def regular(events: pa.Table) -> None:
    """Raise :class:`NotOnDriver` when a frame of ``events`` has a required column null or an
    unknown opcode: the row check (or Spark's) reports those."""
    op = events["op"]
    for column, ops in REQUIRED.items():
        nulls = pc.is_null(events[column])
        if ops is not None:
            nulls = pc.and_(nulls, pc.is_in(op, value_set=pa.array(ops)))
        if pc.any(nulls).as_py():
            raise NotOnDriver(f"a frame's {column} is null")
    known = pa.array(KNOWN_OPCODES, events["opcode"].type)
    unknown = pc.or_(pc.equal(op, UnknownFrame.op), pc.invert(pc.is_in(events["opcode"], known)))
    if pc.any(unknown).as_py():
        raise NotOnDriver("a frame's opcode is unknown")


def _numbers(column: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    return np.asarray(pc.fill_null(column, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def _flags(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(column, False).to_numpy(zero_copy_only=False), dtype=bool)


def _present(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return _flags(pc.is_valid(column))


@dataclass
class Bronze:
    """Bronze split: ``control`` (base frame rows, each with ``_i``, its row number), the
    items' columns (``items``, with ``seqno``) and per row of the table its ``rank`` in
    session order (:data:`~pipelines.quality.frames.POSITION`) and ``session`` code (an index
    of ``sessions``: start, id)."""

    control: list[Row]
    items: pa.Table
    item_rows: np.ndarray
    is_marker: np.ndarray
    rank: np.ndarray
    session: np.ndarray
    sessions: list[tuple[str, str]]

    def item_dicts(self, which: np.ndarray) -> list[Row]:
        """Items (indexes into ``items``) as base frame rows."""
        return spark_rows(self.items.take(pa.array(which, pa.int64())))


def _seqno(events: pa.Table) -> pa.ChunkedArray:
    return pc.coalesce(events["by_seqno"], events["commit_seqno"], events["abort_seqno"])


def _plain(events: pa.Table) -> pa.ChunkedArray:
    """Frames of a vbucket's stream that are no response."""
    return pc.and_(pc.is_null(events["status"]), pc.is_valid(events["vbucket"]))


def _marker(events: pa.Table) -> np.ndarray:
    return _flags(pc.and_(_plain(events), pc.equal(events["op"], SnapshotMarker.op)))


def columnar(events: pa.Table) -> np.ndarray:
    """Which frames of ``events`` the columns take: snapshot markers and history items (with
    a seqno) of a vbucket's stream."""
    items = pc.and_(
        pc.is_in(events["op"], value_set=pa.array(ITEM_OPS)), pc.is_valid(_seqno(events))
    )
    return np.asarray(_marker(events) | _flags(pc.and_(_plain(events), items)), bool)


def split(events: pa.Table, control: Sequence[Row] | None = None) -> Bronze:
    """``events`` (:data:`~pipelines.quality.small.read.BASE_READ`) split into control frames
    and items; ``control``: the base frame rows of its control frames when the caller has
    them already (the frames of ``events`` :func:`columnar` does not take, in order)."""
    regular(events)
    seqno = _seqno(events)
    is_marker = _marker(events)
    is_item = columnar(events)
    started = events["session_started_at"].to_numpy(zero_copy_only=False)
    ids = events["session_id"].to_numpy(zero_copy_only=False)
    session, sessions = np.zeros(0, np.int64), []
    if len(started):
        codes, uniques = pd.MultiIndex.from_arrays([started, ids]).factorize()
        ascending = np.asarray(uniques.argsort(), np.int64)  # as Spark orders the two strings
        code_rank = np.empty(len(ascending), np.int64)
        code_rank[ascending] = np.arange(len(ascending))
        session = code_rank[np.asarray(codes, np.int64)]
        sessions = [tuple(uniques[i]) for i in ascending]
    rank = np.empty(len(session), np.int64)
    order = np.lexsort((_numbers(events["offset"]), _numbers(events["file_sequence"]), session))
    rank[order] = np.arange(len(order))
    control_rows = np.flatnonzero(~is_item)
    if control is None:
        control = base_frames_of(events.take(pa.array(control_rows, pa.int64())))
    control = [{**frame, "_i": i} for frame, i in zip(control, control_rows.tolist(), strict=True)]
    item_rows = np.flatnonzero(is_item)
    items = events.select(list(ITEM_COLUMNS)).take(pa.array(item_rows, pa.int64()))
    items = items.append_column("seqno", seqno.take(pa.array(item_rows, pa.int64())))
    return Bronze(control, items, item_rows, is_marker[item_rows], rank, session, sessions)


def newest_per(table: pa.Table, keys: list[str], order: list[str]) -> pa.Table:
    """Per value of ``keys`` (a null key its own group), the row of ``table`` with the
    largest ``order`` columns, compared in turn, a null lowest (Spark's ``max_by`` of a
    struct)."""
    table = table.take(
        pc.sort_indices(
            table,
            sort_keys=[(c, "ascending", "at_end") for c in keys]
            + [(c, "descending", "at_end") for c in order],
        )
    )
    n = table.num_rows
    first = np.ones(n, bool)
    if n > 1:
        same = np.ones(n - 1, bool)
        for c in keys:
            column = table[c].combine_chunks()
            same &= _flags(pc.equal(column.slice(1), column.slice(0, n - 1)))
        first[1:] = ~same
    return table.filter(pa.array(first))
