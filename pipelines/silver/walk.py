"""The per-vbucket walk of silver: bronze frames in session order → committed effects.

One vbucket's frames (after the position the last run stopped at) go through a small state
machine, the rules of docs/protocol/dcp.md §6–§7 a CDC sink must follow:

- a snapshot's changes are *committed* only once the snapshot is complete: an item at its end
  seqno, a seqno-advanced to it, the next marker, or a stream end (docs/protocol/dcp.md §6.3); OSO backfills
  once their end marker arrived (§6.9);
- a rollback response (status 0x23, or a new stream whose failover log branches below what was
  applied) retracts everything above the rollback seqno (§7.5);
- a drop of collection C at seqno S retracts C's rows below S and later changes to C are ignored;
  a repeated create is a flush (§6.7).

Plain Python over plain dicts, so it is tested without Spark; silver runs it per vbucket inside
``applyInArrow`` (:func:`walk_group_rows`: a vbucket's group of frames in, walked rows out). The walk stops at the last complete snapshot: the frames of an unfinished one
are read again by the next run. With ``eager`` (the ``silver.eager_apply`` setting) the data
changes of that unfinished tail are applied now as well, without moving the consistent point;
the next run reads the tail again and commits it when it completes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pyarrow as pa

from dcp_cdc.events import DATA_OPS, Deletion, Expiration, Mutation
from dcp_cdc.protocol import OsoFlag

CHANGE_OF = {Mutation.op: "upsert", Deletion.op: "delete", Expiration.op: "expire"}
ENDING_EVENTS = ("flush_collection", "drop_collection")
"""The kinds of system event that end every older item of their collection in the vbucket."""

Position = tuple[str, str, int, int]  # session_started_at, session_id, file_sequence, offset


def position_of(frame: dict[str, Any]) -> Position:
    return (
        frame["session_started_at"] or "",
        frame["session_id"],
        frame["file_sequence"],
        frame["offset"],
    )


@dataclass
class VbState:
    """What silver remembers per vbucket between runs (``silver.<bucket>__stream_state``)."""

    vbucket: int
    position: Position | None = None
    consistent_seqno: int = 0
    last_applied_seqno: int = 0
    vb_uuid: int | None = None
    failover_log: list[tuple[int, int]] = field(default_factory=list)
    manifest_uid: int = 0
    purge_seqno: int = 0
    known: dict[int, int] = field(default_factory=dict)  # collection id -> create seqno
    dropped: dict[int, int] = field(default_factory=dict)  # collection id -> drop seqno
    open_snapshot: tuple[int, int] | None = None  # (start, end) of a snapshot not yet complete
    last_cas: int = 0  # the highest CAS of a change committed here (the clock before an event)

    def to_json(self) -> dict[str, Any]:
        return {
            "vbucket": self.vbucket,
            "position": list(self.position) if self.position else None,
            "consistent_seqno": self.consistent_seqno,
            "last_applied_seqno": self.last_applied_seqno,
            "vb_uuid": self.vb_uuid,
            "failover_log": [list(e) for e in self.failover_log],
            "manifest_uid": self.manifest_uid,
            "purge_seqno": self.purge_seqno,
            "known": {str(k): v for k, v in self.known.items()},
            "dropped": {str(k): v for k, v in self.dropped.items()},
            "open_snapshot": list(self.open_snapshot) if self.open_snapshot else None,
            "last_cas": self.last_cas,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VbState:
        pos = data.get("position")
        snap = data.get("open_snapshot")
        return cls(
            vbucket=data["vbucket"],
            position=(pos[0], pos[1], pos[2], pos[3]) if pos else None,
            consistent_seqno=data["consistent_seqno"],
            last_applied_seqno=data["last_applied_seqno"],
            vb_uuid=data["vb_uuid"],
            failover_log=[(u, s) for u, s in data["failover_log"]],
            manifest_uid=data["manifest_uid"],
            purge_seqno=data["purge_seqno"],
            known={int(k): v for k, v in data["known"].items()},
            dropped={int(k): v for k, v in data["dropped"].items()},
            open_snapshot=(snap[0], snap[1]) if snap else None,
            last_cas=data.get("last_cas", 0),
        )


@dataclass
class WalkResult:
    state: VbState
    changes: list[dict[str, Any]] = field(default_factory=list)  # committed data frames
    ended: list[dict[str, Any]] = field(default_factory=list)
    """Committed data frames a later drop or flush in this walk removed: versions for history
    tables, not changes to apply."""
    system_events: list[dict[str, Any]] = field(default_factory=list)  # committed, in order
    rollbacks: list[int] = field(default_factory=list)
    ignored: int = 0  # changes to collections already dropped in this vbucket


def walk(frames: Iterable[dict[str, Any]], state: VbState, *, eager: bool = False) -> WalkResult:
    """Walk one vbucket's frames (in session order, after ``state.position``)."""
    result = WalkResult(state)
    buffer: list[dict[str, Any]] = []
    snap_end: int | None = None
    oso = False
    last_position = state.position

    def complete(closing: dict[str, Any] | None) -> None:
        nonlocal buffer, snap_end, last_position
        top = _commit(buffer, state, result)
        if snap_end is not None and not oso:
            top = max(top, snap_end)
        if buffer or snap_end is not None:
            state.consistent_seqno = top
        buffer = []
        snap_end = None
        state.open_snapshot = None
        if closing is not None:
            last_position = position_of(closing)

    for f in frames:
        op = f["op"]
        if op == "stream_request_response":
            if f["rollback_seqno"] is not None:
                _rollback(f["rollback_seqno"], state, result)
                buffer, snap_end, oso = [], None, False
                state.open_snapshot = None
                last_position = position_of(f)
            elif f["failover_log"]:
                buffer, snap_end, oso = [], None, False  # a new stream: the open one is gone
                state.open_snapshot = None
                log = [(e["vb_uuid"], e["seqno"]) for e in f["failover_log"]]
                branch = branch_point(state.failover_log, log, state.last_applied_seqno)
                if branch is not None:
                    _rollback(branch, state, result)
                state.failover_log = log
                state.vb_uuid = log[0][0]
                last_position = position_of(f)
            continue
        if op == "snapshot_marker":
            if not oso:
                complete(None)
                last_position = _before(f)
            buffer, snap_end = [], f["end_seqno"]
            state.open_snapshot = (f["start_seqno"], f["end_seqno"])
            if f["purge_seqno"] is not None:
                state.purge_seqno = max(state.purge_seqno, f["purge_seqno"])
            continue
        if op == "oso_snapshot":
            if f["oso_flags"] & OsoFlag.START:
                complete(None)
                last_position = _before(f)
                oso, buffer, snap_end = True, [], None
            else:
                complete(f)
                oso = False
            continue
        if op == "stream_end":
            if not oso:
                complete(f)
            continue
        if op in DATA_OPS or op in ("system_event", "seqno_advanced"):
            buffer.append(f)
            if not oso and snap_end is not None and f["by_seqno"] == snap_end:
                complete(f)
    if eager and not oso:
        _apply_tail(buffer, state, result)
    state.position = last_position
    return result


def _commit(buffer: list[dict[str, Any]], state: VbState, result: WalkResult) -> int:
    """The frames of a complete snapshot (``buffer``) committed in order: its data changes
    (but those of collections dropped) and its system events; their highest seqno (or the
    consistent seqno)."""
    top = state.consistent_seqno
    clock = state.last_cas
    for f in buffer:
        seqno = f["by_seqno"]
        top = max(top, seqno)
        if f["op"] in DATA_OPS:
            clock = max(clock, f["cas"] or 0)
            cid = f["collection_id"] or 0
            if cid in state.dropped and state.dropped[cid] <= seqno:
                result.ignored += 1
                continue
            result.changes.append(f)
            state.last_applied_seqno = max(state.last_applied_seqno, seqno)
        elif f["op"] == "system_event":
            _system_event(f, state, result, _clock_before(buffer, seqno, state.last_cas))
    state.last_cas = clock
    return top


def _apply_tail(buffer: list[dict[str, Any]], state: VbState, result: WalkResult) -> None:
    """Eager apply: the data changes of an unfinished snapshot, except those of collections
    dropped, or created inside the tail itself (their table comes with the create event)."""
    created_here = {
        f["collection_id"] for f in buffer if f["op"] == "system_event" and f["collection_id"]
    }
    for f in buffer:
        cid = f["collection_id"] or 0
        if f["op"] not in DATA_OPS or cid in created_here:
            continue
        if cid in state.dropped and state.dropped[cid] <= f["by_seqno"]:
            continue
        result.changes.append(f)
        # so that a rollback below it is recognised and retracts it
        state.last_applied_seqno = max(state.last_applied_seqno, f["by_seqno"])


def _before(frame: dict[str, Any]) -> Position:
    """The position just before ``frame``: a marker opens a snapshot that may not finish."""
    started, session, seq, offset = position_of(frame)
    return (started, session, seq, offset - 1)


def branch_point(
    known: list[tuple[int, int]], received: list[tuple[int, int]], applied: int
) -> int | None:
    """Where a new failover log leaves the history we applied behind, if below it (§7.4).

    Our newest branch that the new log still has is valid up to the start of the next newer
    branch in the new log; changes we applied above that point are on a dead branch.
    """
    if not known or applied == 0:
        return None
    index = {uuid: i for i, (uuid, _) in enumerate(received)}
    for uuid, _ in known:  # newest first
        if uuid in index:
            i = index[uuid]
            if i == 0:
                return None  # our branch is still the newest one
            point = received[i - 1][1]
            return point if point < applied else None
    return 0  # no common history: start over


def _rollback(seqno: int, state: VbState, result: WalkResult) -> None:
    """Retract everything above ``seqno`` (docs/protocol/dcp.md §7.5): this run's effects here, and earlier
    runs' rows through ``result.rollbacks`` (silver rebuilds those keys from bronze)."""
    result.changes = [c for c in result.changes if c["by_seqno"] <= seqno]
    result.ended = [c for c in result.ended if c["by_seqno"] <= seqno]
    result.system_events = [e for e in result.system_events if e["by_seqno"] <= seqno]
    result.rollbacks.append(seqno)
    retract(state, seqno)


def retract(state: VbState, seqno: int) -> None:
    """What a rollback to ``seqno`` does to the vbucket's state: its history above it is gone."""
    state.failover_log = [e for e in state.failover_log if e[1] <= seqno]
    state.consistent_seqno = min(state.consistent_seqno, seqno)
    state.last_applied_seqno = min(state.last_applied_seqno, seqno)
    state.known = {c: s for c, s in state.known.items() if s <= seqno}
    state.dropped = {c: s for c, s in state.dropped.items() if s <= seqno}


def _clock_before(buffer: list[dict[str, Any]], seqno: int, clock: int) -> int:
    """The highest CAS of the changes below ``seqno`` (in ``buffer``, or ``clock`` before
    it): a system event carries CAS 0 (docs/protocol/dcp.md §1.5), so this is the last time known before it."""
    cas = [f["cas"] or 0 for f in buffer if f["op"] in DATA_OPS and f["by_seqno"] < seqno]
    return max([clock, *cas])


def _system_event(f: dict[str, Any], state: VbState, result: WalkResult, clock: int) -> None:
    cid = f["collection_id"]
    seqno = f["by_seqno"]
    kind = record_event(state, f["event"], cid, seqno, f["manifest_uid"])
    if kind in ENDING_EVENTS:  # what came before it is gone
        kept: list[dict[str, Any]] = []
        for c in result.changes:
            gone = (c["collection_id"] or 0) == cid and c["by_seqno"] < seqno
            (result.ended if gone else kept).append(c)
        result.changes = kept
    result.system_events.append({**f, "kind": kind, "cas": clock})


def record_event(
    state: VbState, event: str | None, cid: int | None, seqno: int, manifest_uid: int | None
) -> str | None:
    """What a committed system event does to the vbucket's state; its kind as silver records
    it: a repeated create of a collection is a flush (docs/protocol/dcp.md §6.7)."""
    if manifest_uid is not None:
        state.manifest_uid = max(state.manifest_uid, manifest_uid)
    kind = event
    if kind == "create_collection" and cid is not None:
        if cid in state.known and state.dropped.get(cid) is None:
            kind = "flush_collection"  # a repeated create: every older item is gone
        state.known[cid] = seqno
        state.dropped.pop(cid, None)
    elif kind == "drop_collection" and cid is not None:
        state.dropped[cid] = seqno
    return kind


# --- one vbucket's group, row by row -------------------------------------------------------


class RowKind(StrEnum):
    """The ``kind`` column of a walked row (:data:`pipelines.schemas.WALKED`), a string in the
    tables; the members compare equal to their strings."""

    CHANGE = "change"
    """A committed change to apply."""
    ENDED_CHANGE = "ended_change"
    """A committed change a later drop or flush of its collection removed in the same run
    (:attr:`WalkResult.ended`): a version for the history tables, not a change to apply."""
    SYSTEM_EVENT = "system_event"
    """A committed system event (``event``: its kind as silver records it)."""
    ROLLBACK = "rollback"
    """A rollback of the vbucket to ``rollback_seqno``."""
    STATE = "state"
    """The vbucket's state to save, one row per vbucket walked (with the vbucket's versions
    summed up: :mod:`pipelines.silver.walk_summary`)."""


VERSION_KINDS = (RowKind.CHANGE.value, RowKind.ENDED_CHANGE.value)
"""The kinds of walked rows that are versions of documents."""


def late_threshold(late_after: int, seen: int) -> int:
    """The run version above which a frame at or before a vbucket's saved position is late:
    the newest run the vbucket has seen (``seen``: its frames of every run up to it were
    read), or the apply's ``late_after`` (the oldest any vbucket has seen) when that is newer
    (a state saved without ``seen_version``). A vbucket idle for a while keeps an old
    ``seen_version``; the others' frames read again are not late for that."""
    return max(late_after, seen)


def next_position(
    unconsumed: tuple[str, int] | None,
    last_read: tuple[str, int] | None,
    saved: dict[str, Any] | None,
    read_through: int | None,
) -> tuple[str | None, int | None]:
    """Where a vbucket's next apply starts reading bronze: ``(run id, position_version)``,
    the ingest-log version of the first run it reads. ``unconsumed``: the run (id, version)
    of the first frame the walk read and did not consume (an open snapshot's), read again
    from that run on. Otherwise every frame of the runs read up to ``read_through`` (the
    newest run the apply read, None: unknown) is consumed, so the next apply starts after it;
    the run id kept is that of the last frame read (``last_read``), else the saved one.
    Without ``read_through``: the last run read, else the saved position."""
    if unconsumed is not None:
        return unconsumed
    saved_run = saved.get("run_id") if saved else None
    saved_version = saved.get("position_version") if saved else None
    if read_through is not None:
        run = last_read[0] if last_read is not None else saved_run
        return run, max(read_through + 1, saved_version or 0)
    if last_read is not None:
        return last_read
    return saved_run, saved_version


def walk_group_rows(table: pa.Table, out_schema: pa.Schema, eager: bool) -> pa.Table:
    """One vbucket's group of bronze frames (the table ``applyInArrow`` hands
    :func:`pipelines.silver.transforms.walk_frames`' function: the walked columns, ``vb_key``
    and the vbucket's ``saved_state`` JSON) walked from its saved state into rows of
    :data:`pipelines.schemas.WALKED`: the committed changes, the changes a drop or flush
    ended, the system events, the rollbacks, and one ``state`` row, the state to save.

    Row by row: every frame becomes a dict and goes through :func:`walk`. This is the reference
    the columnar walk (:func:`pipelines.silver.walk_columns.walk_group`) must equal.
    """
    return pa.Table.from_pylist(walked_rows(table.to_pylist(), out_schema.names, eager), out_schema)


def walked_rows(rows: list[dict[str, Any]], names: list[str], eager: bool) -> list[dict[str, Any]]:
    """:func:`walk_group_rows` over one vbucket's frames as dicts (``rows``, sorted here), its
    output rows as dicts of the columns ``names`` (and fewer: the table built from them fills
    the rest with nulls)."""
    vb = rows[0]["vb_key"]
    saved = json.loads(rows[0]["saved_state"]) if rows[0]["saved_state"] else None
    state = VbState.from_json(saved) if saved else VbState(vb)
    seen = saved.get("seen_version", 0) if saved else 0
    rows.sort(key=position_of)
    start = state.position
    fresh = [r for r in rows if start is None or position_of(r) > start]
    late_after = rows[0].get("late_after")
    late = (
        late_after is not None
        and start is not None
        and any(
            r["run_version"] > late_threshold(late_after, seen)
            for r in rows
            if position_of(r) <= start
        )
    )
    result = walk(fresh, state, eager=eager)
    out: list[dict[str, Any]] = []
    changes = list(result.changes)
    events = list(result.system_events)
    for kind, rows_of_kind in ((RowKind.CHANGE, changes), (RowKind.ENDED_CHANGE, result.ended)):
        for c in rows_of_kind:
            out.append(
                {
                    **{k: c.get(k) for k in names},
                    "kind": kind.value,
                    "vbucket": vb,
                    "state": None,
                }
            )
    for e in events:
        out.append(
            {
                **{k: e.get(k) for k in names},
                "kind": RowKind.SYSTEM_EVENT.value,
                "event": e["kind"],
                "vbucket": vb,
                "state": None,
            }
        )
    for seqno in result.rollbacks:
        out.append({"kind": RowKind.ROLLBACK.value, "vbucket": vb, "rollback_seqno": seqno})
    after = [r for r in fresh if state.position is None or position_of(r) > state.position]
    position_run, position_version = next_position(
        (after[0]["ingest_run_id"], after[0]["run_version"]) if after else None,
        (fresh[-1]["ingest_run_id"], fresh[-1]["run_version"]) if fresh else None,
        saved,
        rows[0].get("read_through"),
    )
    seen = max([seen, *(r["run_version"] for r in rows)])
    out.append(
        {
            "kind": RowKind.STATE.value,
            "vbucket": vb,
            "frames": len(fresh),
            "ignored": result.ignored,
            "state": json.dumps(
                {
                    **state.to_json(),
                    "run_id": position_run,
                    "position_version": position_version,
                    "seen_version": seen,
                }
            ),
            "position_run_id": position_run,
            "late": late,
        }
    )
    return out
