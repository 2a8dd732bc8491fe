"""The small check's history: the branches of the failover logs, the rollbacks, which changes
survive, collection drops and flushes, the live documents bronze implies and where the
cluster's history stands, by the rules of :mod:`pipelines.quality.branches` (whose
docstrings say them, citing docs/protocol/dcp.md), here over rows in the driver.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from dcp_cdc.events import (
    DATA_OPS,
    FailoverLogResponse,
    Mutation,
    StreamRequestResponse,
    SystemEvent,
    VbSeqnosResponse,
)
from pipelines.quality.frames import POSITION
from pipelines.quality.small.sql import (
    both,
    coalesce,
    concat,
    group,
    largest,
    max_by,
    negate,
    order_key,
    smallest,
)

Row = dict[str, Any]
_DATA = frozenset(DATA_OPS)
_HISTORY = frozenset((*DATA_OPS, SystemEvent.op))


def _position(f: Row) -> tuple[Any, ...]:
    """:func:`pipelines.quality.frames.history_position`."""
    return tuple(f[c] for c in POSITION)


def latest_branches(frames: Sequence[Row]) -> dict[Any, list[tuple[Any, Any]]]:
    """vbucket → the (uuid, branch_end) of each entry of its newest failover log that opened
    a stream (:func:`pipelines.quality.branches.latest_branches`)."""
    logs = group(
        (f for f in frames if f["opens_stream"] is True and f["failover_log"] is not None),
        lambda f: f["vbucket"],
    )
    branches = {}
    for vbucket, rows in logs.items():
        log = max_by((f["failover_log"], _position(f)) for f in rows)
        branches[vbucket] = [
            (e["vb_uuid"] if e is not None else None, _entry_seqno(log, i - 1) if i > 0 else None)
            for i, e in enumerate(log)
        ]
    return branches


def _entry_seqno(log: Sequence[Row | None], index: int) -> Any:
    entry = log[index]
    return None if entry is None else entry["seqno"]


def with_branch(
    rows: Sequence[Row],
    branches: dict[Any, list[tuple[Any, Any]]],
    *,
    vbucket: str,
    uuid: str,
    seqno: str,
) -> list[Row]:
    """:func:`pipelines.quality.branches.with_branch`: each row with ``dead_branch`` (a row
    the left join matches to several entries of one uuid is repeated, as Spark's is)."""
    out = []
    for r in rows:
        if r[uuid] is None:  # not judged
            out.append({**r, "dead_branch": False})
            continue
        ends = [end for u, end in branches.get(r[vbucket], []) if u == r[uuid]]
        if r[vbucket] is None or not ends:  # its branch is gone from the newest log
            out.append({**r, "dead_branch": True})
            continue
        for end in ends:
            dead: bool | None = False
            if end is not None:  # above where its branch ended (a null seqno: unknown)
                dead = None if r[seqno] is None else r[seqno] > end
            out.append({**r, "dead_branch": dead})
    return out


def rollbacks(frames: Sequence[Row]) -> list[tuple[Any, tuple[Any, ...], Any]]:
    """(vbucket, position, rollback seqno) of each rollback response."""
    return [(f["vbucket"], _position(f), f["rollback_seqno"]) for f in frames if f["is_rollback"]]


def history_items(frames: Sequence[Row]) -> list[Row]:
    return [f for f in frames if f["op"] in _HISTORY]


def split_history(
    items: Sequence[Row],
    branches: dict[Any, list[tuple[Any, Any]]],
    rolled: Sequence[tuple[Any, tuple[Any, ...], Any]],
) -> tuple[list[Row], list[Row]]:
    """:func:`pipelines.quality.branches.split_history`: (alive, dead)."""
    by_vbucket = group(rolled, lambda r: r[0])

    def rolled_back(f: Row) -> bool:
        if f["seqno"] is None:
            return False
        position = order_key(_position(f))
        return any(
            order_key(p) > position and f["seqno"] > seqno
            for _, p, seqno in by_vbucket.get(f["vbucket"], [])
        )

    gone = [f["vbucket"] is not None and rolled_back(f) for f in items]
    removed = [f for f, g in zip(items, gone, strict=True) if g]
    kept = with_branch(
        [f for f, g in zip(items, gone, strict=True) if not g],
        branches,
        vbucket="vbucket",
        uuid="in_vb_uuid",
        seqno="seqno",
    )
    alive = [_without_branch(f) for f in kept if f["dead_branch"] is False]
    dead = removed + [_without_branch(f) for f in kept if f["dead_branch"] is True]
    return alive, dead


def _without_branch(f: Row) -> Row:
    return {k: v for k, v in f.items() if k != "dead_branch"}


_CHANGE = ("vbucket", "in_vb_uuid", "seqno")


def dead_changes(alive: Sequence[Row], dead: Sequence[Row]) -> set[tuple[Any, Any, Any]]:
    """(vbucket, vb uuid, seqno) of dead data events not sent again."""
    kept = {tuple(f[c] for c in _CHANGE) for f in alive}
    gone = {tuple(f[c] for c in _CHANGE) for f in dead if f["op"] in _DATA}
    return {k for k in gone if None in k or k not in kept}


def committed_items(items: Sequence[Row], snaps: Sequence[Row]) -> list[Row]:
    """``items`` of committed snapshots."""
    key = ("session_id", "vbucket", "stream_no", "snapshot_no")
    done = {tuple(s[c] for c in key) for s in snaps if s["committed"] is True}
    return [f for f in items if None not in (k := tuple(f[c] for c in key)) and k in done]


def collection_cuts(items: Sequence[Row]) -> dict[tuple[Any, Any], tuple[bool, Any]]:
    """(collection, vbucket) → (dropped, flush seqno), from the system events of ``items``."""
    events = group(
        (f for f in items if f["op"] == SystemEvent.op),
        lambda f: (coalesce(f["collection_id"], 0), f["vbucket"]),
    )
    cuts = {}
    for key, rows in events.items():
        dropped = largest(
            None if f["event"] is None else f["event"] == "drop_collection" for f in rows
        )
        creates = [f["seqno"] for f in rows if f["event"] == "create_collection"]
        first, last = smallest(creates), largest(creates)
        flush = last if first is not None and last is not None and last > first else None
        cuts[key] = (bool(coalesce(dropped, False)), flush)
    return cuts


def newest_changes(
    alive: Sequence[Row], cuts: dict[tuple[Any, Any], tuple[bool, Any]]
) -> list[Row]:
    """Per (collection, key) of ``alive``'s data events, minus drops and flushes, the newest
    (``cid``, ``key`` as bytes, ``change``: op, expiration, seqno)."""
    changes = []
    for f in alive:
        if f["op"] not in _DATA:
            continue
        cid = coalesce(f["collection_id"], 0)
        dropped, flush = cuts.get((cid, f["vbucket"]), (False, None))
        if f["vbucket"] is None:
            dropped, flush = False, None
        if dropped or not (flush is None or (f["seqno"] is not None and f["seqno"] > flush)):
            continue
        changes.append((cid, f))
    newest = []
    for (cid, key), rows in group(changes, lambda c: (c[0], c[1]["key"])).items():
        change = max_by(
            ((f["op"], f["expiration"], f["seqno"]), (f["seqno"], f["rev_seqno"])) for _, f in rows
        )
        newest.append({"cid": cid, "key": key, "change": change})
    return newest


def live_of(newest: Sequence[Row], now: int | None = None) -> list[Row]:
    """The newest changes that are live documents: a mutation whose expiry is not past."""
    now = int(time.time()) if now is None else now
    live = []
    for n in newest:
        op, expiration, seqno = n["change"]
        expiry = coalesce(expiration, 0)
        if op == Mutation.op and (expiry == 0 or expiry > now):
            live.append({"collection_id": n["cid"], "key": n["key"], "seqno": seqno})
    return live


def cluster_branches(base: Sequence[Row]) -> dict[Any, Row]:
    """vbucket → its cluster history as the captures last recorded it (``log``,
    ``log_session``, ``high``): :func:`pipelines.quality.branches.cluster_branches`."""
    logs: list[tuple[Any, Any]] = []
    highs: list[tuple[Any, Any]] = []
    for f in base:
        op, ok = f["op"], None if f["status"] is None else f["status"] == 0
        if not ok:
            continue
        at = (f["session_started_at"], f["session_id"])
        if (
            op in (StreamRequestResponse.op, FailoverLogResponse.op)
            and f["failover_log"] is not None
        ):
            logs.append((f["vbucket"], (f["failover_log"], at, _position(f))))
        if op == VbSeqnosResponse.op and f["high_seqnos"] is not None:
            p = _position(f)
            for h in f["high_seqnos"]:
                vbucket, seqno = (None, None) if h is None else (h["vbucket"], h["seqno"])
                highs.append((vbucket, (seqno, at, p)))
    newest = {v: max_by((n, n[2]) for _, n in rows) for v, rows in group(logs, _first).items()}
    high = {v: max_by((h, h[2]) for _, h in rows) for v, rows in group(highs, _first).items()}
    cluster = {}
    for vbucket, (log, log_at, _) in newest.items():
        h = high.get(vbucket) if vbucket is not None else None
        seqno = None
        if h is not None and order_key(h[1]) >= order_key(log_at):
            seqno = h[0]
        cluster[vbucket] = {"log": log, "log_session": log_at[1], "high": seqno}
    return cluster


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def on_branch(states: Sequence[Row], cluster: dict[Any, Row]) -> list[Row]:
    """:func:`pipelines.quality.branches.on_branch`: per vbucket of silver's state whose
    cluster history is recorded, ``on_cluster_branch`` and ``cluster_branch_detail``."""
    out = []
    for s in states:
        seqno = s["consistent_seqno"]
        below = [
            e
            for e in (s["failover_log"] or [])
            if e is not None
            and seqno is not None
            and e["seqno"] is not None
            and e["seqno"] <= seqno
        ]
        s_uuid = coalesce(below[0]["vb_uuid"] if below else None, s["vb_uuid"])
        c = cluster.get(s["vbucket"]) if s["vbucket"] is not None else None
        if s_uuid is None or c is None:
            continue
        log = c["log"]
        found = next(
            (i for i, e in enumerate(log) if e is not None and e["vb_uuid"] == s_uuid), None
        )
        # a branch ends where the next newer one starts; the newest at the high seqno
        newer = found is not None and found > 0
        branch_end = _entry_seqno(log, found - 1) if found is not None and found > 0 else c["high"]
        within: bool | None = True
        if branch_end is not None:
            within = None if seqno is None else seqno <= branch_end
        ok = both(found is not None, within)
        detail = None
        if found is None or negate(ok):
            detail = _branch_detail(c, seqno, s_uuid, branch_end, found, newer)
        out.append(
            {"vbucket": s["vbucket"], "on_cluster_branch": ok, "cluster_branch_detail": detail}
        )
    return out


def _branch_detail(
    c: Row, seqno: Any, s_uuid: Any, branch_end: Any, found: int | None, newer: bool
) -> str | None:
    """:func:`on_branch`'s ``cluster_branch_detail`` of a vbucket off the cluster's branch."""
    log_text = ", ".join(
        t
        for t in (
            concat(e["vb_uuid"], "@", e["seqno"]) if e is not None else None for e in c["log"]
        )
        if t is not None
    )
    silver_at = concat("silver at seqno ", seqno, " of vb uuid ", s_uuid, "; ")
    log_note = concat("newest failover log, session ", c["log_session"], ": [", log_text, "])")
    if found is None:
        return concat(silver_at, "the cluster no longer holds that branch (", log_note)
    if newer:
        where_it_ends = concat(" ended at seqno ", branch_end, " (")
    else:
        where_it_ends = concat(" is at seqno ", branch_end, " (its high seqno; ")
    return concat(silver_at, "the cluster's branch ", s_uuid, where_it_ends, log_note)
