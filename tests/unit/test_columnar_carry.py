"""The pieces of the columnar check's carried state, on explicit frames and rows: frames
placed from a cut's seed are placed as among all of their pair's frames; a stream's part
before a cut and the part after combine to the part of the whole; a state survives its
encoding; a table's change feed gives each key's first and last change. That the check from
the state equals the check over everything on whole scenarios is
tests/spark/test_quality_incremental.py's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pipelines import schemas
from pipelines.quality.small.carried import Cut, State, Sums, decode, encode
from pipelines.quality.small.items import split
from pipelines.quality.small.live_sums import BRONZE_TTL, SILVER_TTL, without_keys
from pipelines.quality.small.placement import Seed, place
from pipelines.quality.small.read import BASE_READ, base_frames
from pipelines.quality.small.silver_changes import _ends
from pipelines.quality.small.streams import (
    combine_partials,
    snapshots,
    stream_frames,
    stream_partial,
)
from pipelines.schemas import arrow_schema
from tests.unit.test_small_check import _event

VB = 7


def _item(seqno: int, start: int, end: int) -> dict[str, Any]:
    return {
        "op": "mutation",
        "vbucket": VB,
        "by_seqno": seqno,
        "rev_seqno": 1,
        "cas": seqno,
        "key": f"k{seqno % 3}".encode(),
        "collection_id": 0,
        "in_snapshot_start": start,
        "in_snapshot_end": end,
        "in_vb_uuid": 99,
    }


def _marker(start: int, end: int) -> dict[str, Any]:
    return {
        "op": "snapshot_marker",
        "vbucket": VB,
        "start_seqno": start,
        "end_seqno": end,
        "snapshot_flags": 1,
    }


STREAM = [
    {"op": "stream_request", "vbucket": VB, "start_seqno": 0, "end_seqno": 100},
    {"op": "stream_request_response", "status": 0, "opaque": VB},
    _marker(1, 3),
    *[_item(s, 1, 3) for s in (1, 2, 3)],
    _marker(4, 6),
    *[_item(s, 4, 6) for s in (4, 6, 5)],  # 5 after 6: a regression the seed's floor finds
    _marker(7, 9),
    *[_item(s, 7, 9) for s in (7, 8)],
]


def _events(frames: list[dict[str, Any]]) -> pa.Table:
    rows = [_event(offset=i * 100, frame_index=i, **f) for i, f in enumerate(frames)]
    schema = arrow_schema(schemas.EVENTS)
    fields = pa.schema([schema.field(c) for c in BASE_READ])
    return pa.Table.from_pylist([{c: r.get(c) for c in BASE_READ} for r in rows], schema=fields)


def _placement(events: pa.Table, seeds: dict[Any, Seed] | None = None) -> dict[int, Any]:
    """Per frame (by offset), its placed stream, snapshot, regression and floor."""
    bronze = split(events)
    placed = place(bronze, seeds)
    offsets = events["offset"].to_pylist()
    found = {}
    for i, row in enumerate(bronze.item_rows):
        found[offsets[row]] = (
            int(placed.stream_no[i]),
            int(placed.snapshot_no[i]),
            bool(placed.regression[i]),
            int(placed.floor[i]),
            bool(placed.out_of_range[i]),
        )
    for f in placed.frames:
        found[f["offset"]] = (f["stream_no"], f["snapshot_no"], f["regression"], None, None)
    return found


def test_frames_placed_from_a_cuts_seed_are_placed_as_among_all_of_their_pair() -> None:
    events = _events(STREAM)
    whole = _placement(events)
    bronze = split(events)
    trail = place(bronze).trail
    assert trail is not None
    for cut in range(1, events.num_rows):  # every frame a cut: the frames from it alone
        seed = trail.seed_after(cut - 1)
        tail = events.slice(cut)
        part = _placement(tail, {(bronze.sessions[0][1], VB): seed})
        assert part == {k: v for k, v in whole.items() if k >= cut * 100}, cut
    assert whole[900][2] is True  # seqno 5 after 6 regresses, from any cut before it


def test_a_streams_parts_before_and_after_a_cut_combine_to_the_whole() -> None:
    frames = stream_frames(
        base_frames([_event(offset=i * 100, frame_index=i, **f) for i, f in enumerate(STREAM)])
    )
    snaps = snapshots(frames)
    duplicates: list[dict[str, Any]] = []
    whole = stream_partial(frames, snaps, duplicates, (0, None, None))
    for cut in range(1, 5):
        before = stream_partial(
            [f for f in frames if f["snapshot_no"] < cut],
            [s for s in snaps if s["snapshot_no"] < cut],
            duplicates,
            (0, None, None),
        )
        after = stream_partial(
            [f for f in frames if f["snapshot_no"] >= cut],
            [s for s in snaps if s["snapshot_no"] >= cut],
            duplicates,
            (0, None, None),
        )
        assert combine_partials(before, after) == whole, cut
    assert whole["regressions"] == 1 and whole["snapshots"] == 3


def test_a_state_survives_its_encoding() -> None:
    tail = _events(STREAM[:3]).append_column("counted", pa.array([False, False, False]))
    state = State(
        at={"bronze.b_events": 4},
        txns={"events": 3, "quarantine": None},
        now=1_700_000_000,
        apart=None,
        pairs={("s1", VB): Cut((1, 2), Seed(1, 1, 2, 0, None, 0, 100, 1, 3), (1, 3), (1, 900))},
        tail=tail,
        control=_events(STREAM[:2]),
        streams={("t", "s1", VB, 1): {"last": (2, "marker", 4, 6, 6, True, 7), "items": 3}},
        duplicates=[],
        data_max={(VB, 99): 6, (VB, None): 2},
        files={"/landing/s1-0001.dcp": 12},
        branches={VB: [(99, None)]},
        cuts={(8, VB): (False, None)},
        dead_changes={(VB, 98, 4)},
        sums={0: Sums(3, 12345, 3, 12345, {"silver.t": 3})},
        rolled=[],
        dropped=[],
        bronze_ttl=BRONZE_TTL.empty_table(),
        silver_ttl=SILVER_TTL.empty_table(),
    )
    again = decode(encode(state))
    assert again == state


def test_without_keys_splits_a_table_by_collection_and_key_as_bytes() -> None:
    table = pa.table(
        {
            "_collection_id": pa.array([8, 8, 9], pa.int64()),
            "key": pa.array(["a", "b", "a"]),
            "_seqno": pa.array([1, 2, 3], pa.int64()),
        }
    )
    keys = pa.table(
        {"collection_id": pa.array([8], pa.int64()), "key": pa.array([b"a"], pa.binary())}
    )
    kept, hit = without_keys(table, "_collection_id", keys)
    assert kept["_seqno"].to_pylist() == [2, 3]
    assert hit["_seqno"].to_pylist() == [1]


def test_the_feeds_first_and_last_change_of_each_key() -> None:
    feed = pa.table(
        {
            "key": ["a", "a", "b", "a", "a", "c"],
            "_commit_version": [3, 3, 3, 5, 5, 4],
            "_change_type": [
                "update_postimage",
                "update_preimage",
                "insert",
                "update_preimage",
                "update_postimage",
                "delete",
            ],
        }
    )
    first, last = _ends(feed)
    firsts = {feed["key"][int(i)].as_py(): int(i) for i in first}
    lasts = {feed["key"][int(i)].as_py(): int(i) for i in last}
    assert firsts == {"a": 1, "b": 2, "c": 5}  # a's pre-image of version 3
    assert lasts == {"a": 4, "b": 2, "c": 5}  # a's post-image of version 5
    assert np.array_equal(np.sort(first), np.array([1, 2, 5]))
