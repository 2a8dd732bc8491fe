"""The columnar check's placement: :func:`.streams.stream_frames`'s rule over columns. Per
(session, vbucket), in session order, each frame's stream and snapshot numbers, the request it
answers, and whether its seqno regresses or lies outside its snapshot, for the control frames
(rows, a few a vbucket) and the snapshot markers and items (columns) together: each number is
a running count within the pair, each remembered value the last one before the frame there
(docs/protocol/dcp.md §7.1 and §8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dcp_cdc.events import OsoSnapshot, StreamRequest, StreamRequestResponse
from pipelines.quality.frames import ITEM_OPS, OSO_START, STREAM_OPS
from pipelines.quality.small.items import Bronze, _flags, _numbers, _present
from pipelines.quality.small.sql import both, coalesce

Row = dict[str, Any]
SNAPSHOT_KEY = ("session", "vbucket", "stream_no", "snapshot_no")
_ITEMS = frozenset(ITEM_OPS)
_STREAM = frozenset(STREAM_OPS)
_LOWEST = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Seed:
    """What a (session, vbucket) pair's frames before a cut leave to the frames from it: the
    running counts (streams opened, requests, snapshots, rollbacks) and the values
    remembered (the last rollback point, the last request's range, the request the last
    opening answered, the highest item seqno since the last rollback)."""

    opened: int = 0
    requests: int = 0
    snapshot_no: int = 0
    rollback_no: int = 0
    rollback_floor: int | None = None
    requested_start: int | None = None
    requested_end: int | None = None
    answered: int | None = None
    highest: int | None = None


Seeds = Mapping[tuple[str, int], Seed]
"""Per (session id, vbucket), where its frames read here continue from."""
_NO_SEED = Seed()


@dataclass
class Trail:
    """The stream frames in pair order (``order``: frame indexes, the control rows first then
    the columns) with each pair's number (``pair``; its (session code, vbucket) in
    ``pairs``) and, after each frame, what a :class:`Seed` holds (``values``: per field, the
    value and whether it is known): where the frames after any of them continue from."""

    order: np.ndarray
    pair: np.ndarray
    pairs: list[tuple[int, int]]
    stream_no: np.ndarray
    values: dict[str, tuple[np.ndarray, np.ndarray]]
    first: list[Seed]
    """Per pair, the seed its first frame continued from."""

    def seed_after(self, at: int) -> Seed:
        """What the frames after sorted frame ``at`` continue from."""
        found = {
            name: int(v[at]) if known[at] else None for name, (v, known) in self.values.items()
        }
        return Seed(
            opened=found["opened"] or 0,
            requests=found["requests"] or 0,
            snapshot_no=found["snapshot_no"] or 0,
            rollback_no=found["rollback_no"] or 0,
            rollback_floor=found["rollback_floor"],
            requested_start=found["requested_start"],
            requested_end=found["requested_end"],
            answered=found["answered"],
            highest=found["highest"],
        )


@dataclass
class Placed:
    """The control frames of the streams (rows, placed), and per row of the columns (markers
    and items) its stream, snapshot (``snapshot``: a code per (session, vbucket, stream,
    snapshot), whose keys are ``snapshot_keys``' rows) and flags."""

    frames: list[Row]
    stream_no: np.ndarray
    snapshot_no: np.ndarray
    snapshot: np.ndarray
    snapshot_keys: pd.DataFrame
    regression: np.ndarray
    floor: np.ndarray
    out_of_range: np.ndarray
    in_order: np.ndarray
    trail: Trail | None = None


class _Frames:
    """The stream frames, control rows first then the columns, as arrays (``of``) sorted by
    (session, vbucket, session order) (``order``), and where each frame's pair starts."""

    def __init__(self, frames: list[Row], bronze: Bronze, seeds: Seeds) -> None:
        self.frames, self.cols, self.n_c = frames, bronze.items, len(frames)
        rows = np.concatenate([np.array([f["_i"] for f in frames], np.int64), bronze.item_rows])
        vbucket = self.of("vbucket")[0]
        self.order = np.lexsort((bronze.rank[rows], vbucket, bronze.session[rows]))
        n = len(self.order)
        self.at = np.arange(n)
        s, v = bronze.session[rows][self.order], vbucket[self.order]
        new = np.ones(n, bool)
        new[1:] = (s[1:] != s[:-1]) | (v[1:] != v[:-1])
        self.start = np.maximum.accumulate(np.where(new, self.at, 0)) if n else self.at
        firsts = np.flatnonzero(new)
        self.pairs = [(int(s[i]), int(v[i])) for i in firsts]
        pair_seeds = [seeds.get((bronze.sessions[c][1], vb), _NO_SEED) for c, vb in self.pairs]
        self.pair_seeds = pair_seeds
        self.pair = np.cumsum(new) - 1 if n else self.at
        self.seeds = {
            name: (
                np.array([_or0(getattr(p, name)) for p in pair_seeds] + [0], np.int64)[self.pair],
                np.array([getattr(p, name) is not None for p in pair_seeds] + [False], bool)[
                    self.pair
                ],
            )
            for name in Seed.__dataclass_fields__
        }

    def of(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A column's values (0 for null) and presence, in frame order."""
        values = [f[name] for f in self.frames]
        known = np.array([0 if v is None else v for v in values], np.int64)
        has = np.array([v is not None for v in values], bool)
        if name in self.cols.column_names:
            return (
                np.concatenate([known, _numbers(self.cols[name])]),
                np.concatenate([has, _present(self.cols[name])]),
            )
        pad = self.cols.num_rows
        return np.concatenate([known, np.zeros(pad, np.int64)]), np.concatenate(
            [has, np.zeros(pad, bool)]
        )

    def control(self, flags: list[bool]) -> np.ndarray:
        """A flag of the control rows, false for the columns, in frame order."""
        return np.concatenate([np.array(flags, bool), np.zeros(self.cols.num_rows, bool)])

    def running(self, counted: np.ndarray, seed: str) -> np.ndarray:
        """Sorted: the count of ``counted`` (frame order) in the pair up to each frame, from
        the pair's ``seed`` count."""
        c = np.cumsum(counted[self.order].astype(np.int64))
        return (c - (c - counted[self.order])[self.start] if len(c) else c) + self.seeds[seed][0]

    def remembered(
        self, values: np.ndarray, where: np.ndarray, seed: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sorted: the value (``values``, sorted) of the last frame of ``where`` (frame
        order) in the pair up to each frame, else the pair's ``seed`` value; and whether
        there is one."""
        at, known = self.last(where)
        seeded, has_seed = self.seeds[seed]
        return np.where(known, values[at], seeded), known | has_seed

    def last(self, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sorted: the position of the last frame of ``where`` (frame order) in the pair up
        to each frame, and whether there is one."""
        if not len(self.at):
            return self.at, self.at.astype(bool)
        found = np.maximum.accumulate(np.where(where[self.order], self.at, -1))
        return np.maximum(found, 0), found >= self.start


def place(bronze: Bronze, seeds: Seeds | None = None) -> Placed:
    """The stream frames placed (:func:`.streams.stream_frames`): the control frames' rows
    updated with their fields, the columns' placement returned. ``seeds``: the pairs whose
    earlier frames are not among ``bronze`` continue from them."""
    control = [dict(f) for f in bronze.control if f["op"] in _STREAM and f["vbucket"] is not None]
    s = _Frames(control, bronze, seeds or {})
    ops = [f["op"] for f in control]
    opens = [
        both(op == StreamRequestResponse.op, None if f["status"] is None else f["status"] == 0)
        for op, f in zip(ops, control, strict=True)
    ]
    opens_true = s.control([o is True for o in opens])
    oso_start = s.control(
        [
            op == OsoSnapshot.op and coalesce(f["oso_flags"], 0) & OSO_START != 0
            for op, f in zip(ops, control, strict=True)
        ]
    )
    marker = np.concatenate([np.zeros(s.n_c, bool), bronze.is_marker])
    rollback_seqno, has_rollback = s.of("rollback_seqno")
    rollback = s.control([op == StreamRequestResponse.op for op in ops]) & has_rollback
    request = s.control([op == StreamRequest.op for op in ops])
    seqno_all, has_seqno = s.of("seqno")
    is_item = (
        np.concatenate([np.array([op in _ITEMS for op in ops], bool), ~bronze.is_marker])
        & has_seqno
    )
    opened = s.running(opens_true, "opened")
    requests = s.running(request, "requests")
    snapshot_no = s.running(marker | opens_true | oso_start, "snapshot_no")
    rollback_no = s.running(rollback, "rollback_no")
    rollback_floor, floor_known = s.remembered(rollback_seqno[s.order], rollback, "rollback_floor")
    start_seqno, has_start = s.of("start_seqno")
    end_seqno, has_end = s.of("end_seqno")
    started, known_s = s.remembered(start_seqno[s.order], request & has_start, "requested_start")
    ended, known_e = s.remembered(end_seqno[s.order], request & has_end, "requested_end")
    answered, answered_known = s.remembered(requests, opens_true, "answered")
    stream_no = opened + (requests > np.where(answered_known, answered, 0))
    seqno, item = seqno_all[s.order], is_item[s.order]
    before, has_before = _seeded_highest(
        s, rollback_no, *_highest_before(s.start, rollback_no, seqno, item)
    )
    has_floor = has_before | floor_known
    floor = np.where(
        has_before & floor_known,
        np.maximum(before, rollback_floor),
        np.where(has_before, before, rollback_floor),
    )
    in_oso = np.concatenate(
        [
            np.array([bool(coalesce(f["in_oso"], False)) for f in control], bool),
            _flags(s.cols["in_oso"]),
        ]
    )
    in_order = item & ~in_oso[s.order]
    regression = in_order & has_floor & (seqno <= floor)
    window_start, has_window_start = (a[s.order] for a in s.of("in_snapshot_start"))
    window_end, has_window_end = (a[s.order] for a in s.of("in_snapshot_end"))
    outside = ~has_window_start | (seqno < window_start) | (has_window_end & (seqno > window_end))
    unsort = np.empty(len(s.order), np.int64)
    unsort[s.order] = np.arange(len(s.order))
    sorted_values = {
        "_opened": (opened, None),
        "_requests": (requests, None),
        "snapshot_no": (snapshot_no, None),
        "rollback_no": (rollback_no, None),
        "rollback_floor": (rollback_floor, floor_known),
        "requested_start": (started, known_s),
        "requested_end": (ended, known_e),
        "_answered": (answered, answered_known),
        "stream_no": (stream_no, None),
        "seqno_floor": (floor, has_floor),
    }
    _update_control(control, opens, rollback, is_item, unsort, sorted_values, in_order)
    n_c = s.n_c
    mine = unsort[n_c:]
    keys = pd.DataFrame(
        {
            "session": bronze.session[bronze.item_rows],
            "vbucket": _numbers(s.cols["vbucket"]),
            "stream_no": stream_no[mine],
            "snapshot_no": snapshot_no[mine],
        }
    )
    code = keys.groupby(list(SNAPSHOT_KEY), sort=False).ngroup().to_numpy()
    after = np.where(has_before & item, np.maximum(before, seqno), np.where(item, seqno, before))
    trail = _trail(s, sorted_values, after, has_before | item)
    return Placed(
        control,
        stream_no[mine],
        snapshot_no[mine],
        np.asarray(code, np.int64),
        keys.drop_duplicates().reset_index(drop=True),
        regression[mine],
        np.where(has_floor, floor, 0)[mine],
        (in_order & outside)[mine],
        in_order[mine],
        trail,
    )


_SEEDED = {
    "opened": "_opened",
    "requests": "_requests",
    "snapshot_no": "snapshot_no",
    "rollback_no": "rollback_no",
    "rollback_floor": "rollback_floor",
    "requested_start": "requested_start",
    "requested_end": "requested_end",
    "answered": "_answered",
}


def _trail(
    s: _Frames,
    sorted_values: dict[str, tuple[np.ndarray, np.ndarray | None]],
    highest: np.ndarray,
    has_highest: np.ndarray,
) -> Trail:
    """The frames' :class:`Trail` from the values :func:`place` computed (sorted)."""
    known = np.ones(len(s.order), bool)
    values = {
        name: (v, known if has is None else has)
        for name, (v, has) in ((n, sorted_values[f]) for n, f in _SEEDED.items())
    }
    values["highest"] = (highest, has_highest)
    return Trail(s.order, s.pair, s.pairs, sorted_values["stream_no"][0], values, s.pair_seeds)


def _seeded_highest(
    s: _Frames, rollback_no: np.ndarray, before: np.ndarray, has_before: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_highest_before` with the pair's seed: its highest item seqno counts for the
    frames of the seed's rollback number."""
    highest, has_highest = s.seeds["highest"]
    seeded = has_highest & (rollback_no == s.seeds["rollback_no"][0])
    before = np.where(seeded, np.where(has_before, np.maximum(before, highest), highest), before)
    return before, has_before | seeded


def _or0(value: int | None) -> int:
    return 0 if value is None else value


def _highest_before(
    start: np.ndarray, rollback_no: np.ndarray, seqno: np.ndarray, item: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted: the highest item seqno before each frame in its pair and rollback number, and
    whether an item came before it there."""
    frame = pd.DataFrame(
        {
            "p": start,
            "r": rollback_no,
            "q": np.where(item, seqno, _LOWEST),
            "i": item.astype(np.int64),
        }
    )
    grouped = frame.groupby(["p", "r"], sort=False)
    highest = grouped["q"].cummax().to_numpy()
    counted = grouped["i"].cumsum().to_numpy() - item
    before = np.full(len(seqno), _LOWEST)
    if len(seqno) > 1:
        same = (start[1:] == start[:-1]) & (rollback_no[1:] == rollback_no[:-1])
        before[1:] = np.where(same, highest[:-1], _LOWEST)
    return before, counted > 0


def _update_control(
    control: list[Row],
    opens: list[bool | None],
    rollback: np.ndarray,
    is_item: np.ndarray,
    unsort: np.ndarray,
    sorted_values: dict[str, tuple[np.ndarray, np.ndarray | None]],
    in_order: np.ndarray,
) -> None:
    """The control rows' fields, as :func:`.streams._place` sets them."""
    at = unsort[: len(control)]
    values = {
        name: (v[at].tolist(), None if has is None else has[at].tolist())
        for name, (v, has) in sorted_values.items()
    }
    for i, f in enumerate(control):
        f.update(
            {name: v[i] if has is None or has[i] else None for name, (v, has) in values.items()}
        )
        item_in_order = bool(in_order[at[i]])
        f.update(
            opens_stream=opens[i],
            is_rollback=bool(rollback[i]),
            is_item=bool(is_item[i]),
            regression=bool(
                item_in_order and f["seqno_floor"] is not None and f["seqno"] <= f["seqno_floor"]
            ),
            out_of_range=both(item_in_order, _outside(f)) if item_in_order else False,
        )


def _outside(f: Row) -> bool | None:
    """:func:`.streams._place`'s ``outside`` of a control row's seqno."""
    start, end, seqno = f["in_snapshot_start"], f["in_snapshot_end"], f["seqno"]
    if start is None:
        return True
    below = None if seqno is None else seqno < start
    above = None if seqno is None or end is None else seqno > end
    return True if below or above else (None if None in (below, above) else False)
