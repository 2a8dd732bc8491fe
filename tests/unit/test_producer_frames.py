"""The producer's fast document frames and bulk documents are byte for byte the generic
encoder's."""

from __future__ import annotations

import dataclasses
import json
import random
import zlib

import numpy as np
import pytest

from dcp_cdc.encoder import encode
from dcp_cdc.errors import ConfigError
from dcp_cdc.simulator.bulk import DIGITS, FEW, KEY_PREFIX, BulkDocs, Chunk, crc32_of_numbered
from dcp_cdc.simulator.frames import DocFrames, ValueCache
from dcp_cdc.simulator.model import Doc, Item, vbucket_of
from dcp_cdc.simulator.state import SimConfig, Simulation
from dcp_cdc.simulator.stream import EventMaker, SessionOptions


@pytest.fixture(scope="module")
def sim() -> Simulation:
    """Documents of every kind: JSON and binary, small and Snappy-sized, with and without
    xattrs, deleted with system xattrs, expired, in the default and user collections,
    and system events between them."""
    s = Simulation(SimConfig(seed=11, vbuckets=4, docs=300, ops=0, binary_share=0.3))
    s.ttl_share = 0.3
    s.setup(max_ttl=60)
    cids = [c.collection_id for c in s.bucket.live_collections()]
    s.live(400, cids=cids)
    s.bucket.advance(1000)
    s.pager(limit=1000)
    s.bucket.create_collection(8, "late")
    return s


def _all_items(sim: Simulation, vbid: int) -> list[Item]:
    vb = sim.bucket.vbuckets[vbid]
    items = [Item(d.seqno, doc=d) for d in vb.docs.values()]
    items += [Item(e.seqno, sys=e) for e in vb.sys_events]
    return sorted(items, key=lambda i: i.seqno)


def test_the_fixture_covers_every_kind(sim: Simulation) -> None:
    docs = [d for vb in sim.bucket.vbuckets for d in vb.docs.values()]
    live = [d for d in docs if not d.deleted]
    assert any(not d.is_json for d in live) and any(d.is_json for d in live)
    assert any(len(d.body) >= 96 for d in live) and any(len(d.body) < 96 for d in live)
    assert any(d.xattrs for d in live) and any(d.deleted and d.xattrs for d in docs)
    assert any(d.change == "expire" for d in docs) and any(d.change == "delete" for d in docs)
    assert {d.collection_id for d in docs} >= {0, 8 + 1}


OPTIONS = [
    SessionOptions("all"),
    SessionOptions("no-collections", collections=False),
    SessionOptions("no-xattrs-no-snappy", xattrs=False, snappy=False),
    SessionOptions("no-delete-times", delete_times=False, expiry_opcode=False),
    SessionOptions("no-expiry-opcode", expiry_opcode=False),
    SessionOptions("flatbuffers", flatbuffers=True, marker_v2_2=False),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.session_id)
@pytest.mark.parametrize("disk", [True, False])
@pytest.mark.parametrize("collection_filter", [None, (9, 0)])
def test_fast_frames_equal_generic_frames(
    sim: Simulation,
    options: SessionOptions,
    disk: bool,
    collection_filter: tuple[int, ...] | None,
) -> None:
    generic = EventMaker(sim.bucket, options, random.Random(7))
    fast = DocFrames(EventMaker(sim.bucket, options, random.Random(7)), ValueCache(limit=50))
    for vbid in range(len(sim.bucket.vbuckets)):
        items = _all_items(sim, vbid)
        visible = [i for i in items if generic.visible(i, collection_filter)]
        want = b"".join(
            encode(generic.item_event(vbid, i, disk=disk, opaque=0xABCD0000 + vbid))
            for i in visible
        )
        out = bytearray()
        count, last = fast.items(
            out,
            vbid,
            items,
            disk=disk,
            opaque=0xABCD0000 + vbid,
            collection_filter=collection_filter,
        )
        assert bytes(out) == want
        assert count == len(visible)
        assert last == (visible[-1].seqno if visible else -1)
        # the cache's second answer (and the second pass over the same versions) agrees too
        again = bytearray()
        fast.items(again, vbid, items, disk=disk, opaque=1, collection_filter=collection_filter)
        redo = b"".join(encode(generic.item_event(vbid, i, disk=disk, opaque=1)) for i in visible)
        assert bytes(again) == redo


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.session_id)
def test_fast_backfill_markers_equal_generic_markers(
    sim: Simulation, options: SessionOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V2.0, and V2.2 where the vbucket has purged tombstones and the connection allows it."""
    generic = EventMaker(sim.bucket, options, random.Random(7))
    fast = DocFrames(EventMaker(sim.bucket, options, random.Random(7)), ValueCache())
    vbuckets = sim.bucket.vbuckets
    monkeypatch.setattr(vbuckets[1], "purge_seqno", 5)
    monkeypatch.setattr(vbuckets[3], "purge_seqno", 0x1_0000_0007)
    assert not vbuckets[0].purge_seqno and not vbuckets[2].purge_seqno
    for vb in vbuckets:
        for start, end in ((0, vb.high_seqno), (3, 9)):
            out = bytearray(b"before")
            fast.backfill_marker(out, vb, start, end=end, opaque=0xC0DE0000 + vb.vbid)
            marker = generic.backfill_marker(vb, start, end=end, opaque=0xC0DE0000 + vb.vbid)
            assert bytes(out) == b"before" + encode(marker)


# --- bulk documents -------------------------------------------------------------------------


def test_bulk_vbuckets_are_the_keys_crc32() -> None:
    numbers = np.array([0, 1, 9, 10, 12345, 999_999_999, 4_000_000_000], dtype=np.uint32)
    crcs = crc32_of_numbered(KEY_PREFIX, numbers, DIGITS)
    assert [int(c) for c in crcs] == [zlib.crc32(KEY_PREFIX + b"%010d" % n) for n in numbers]


@pytest.mark.parametrize("collections", [True, False])
@pytest.mark.parametrize("size", [1, FEW - 1, FEW, None], ids=lambda s: f"size-{s}")
def test_bulk_frames_equal_generic_mutations(collections: bool, size: int | None) -> None:
    """Chunks of every size (numpy's records, or a few frames packed one by one) are the
    generic encoder's mutations."""
    sim = Simulation(SimConfig(seed=3, vbuckets=8, docs=10, ops=0))
    sim.setup()
    highs = [vb.high_seqno for vb in sim.bucket.vbuckets]
    bulk = BulkDocs(sim.bucket, 5000, 70)
    maker = EventMaker(sim.bucket, SessionOptions("b", collections=collections), random.Random())
    assert sum(bulk.in_vbucket(v) for v in range(8)) == 5000
    for vbid, vb in enumerate(sim.bucket.vbuckets):
        n = bulk.in_vbucket(vbid)
        assert bulk.seqno(vbid, 0) == highs[vbid] + 1 and vb.high_seqno == highs[vbid] + n
        options = SessionOptions("b", collections=collections)
        hi = n - 2 if size is None else 3 + size
        data, count, last = bulk.frames(Chunk(vbid, 3, hi, 0xBEEF + vbid, options, {0}))
        want = []
        for i in range(3, hi):
            number = int(bulk.numbers[bulk.offsets[vbid] + i])
            key = bulk.key(number)
            assert vbucket_of(key, 8) == vbid
            body = b'{"id":"%010d","pad":"' % number + b"x" * (70 - 28) + b'"}'
            assert len(body) == 70 and json.loads(body)["id"] == f"{number:010d}"
            doc = Doc(0, key, vbid, bulk.seqno(vbid, i), 1, bulk.cas_base + number, 0, 0, body,
                      True, None)  # fmt: skip
            event = maker.doc_event(vbid, doc, disk=True, opaque=0xBEEF + vbid)
            want.append(encode(dataclasses.replace(event, nru=0)))
        assert count == hi - 3 and data == b"".join(want) and last == bulk.seqno(vbid, hi - 1)


def test_bulk_sizes_are_checked() -> None:
    sim = Simulation(SimConfig(seed=3, vbuckets=8, docs=10, ops=0))
    with pytest.raises(ConfigError, match="body bytes"):
        BulkDocs(sim.bucket, 10, 96)
    with pytest.raises(ConfigError, match="bulk docs"):
        BulkDocs(sim.bucket, 0, 64)
