"""Realistic bulk documents: their frames decode, with the project's decoder, to the documents
they stand for, whatever the connection negotiated; their sizes, shares and collections; the
truth that sums them up."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from dcp_cdc.decoder import iter_decode
from dcp_cdc.events import Mutation
from dcp_cdc.protocol import Datatype
from dcp_cdc.simulator import realistic
from dcp_cdc.simulator.bulk import DIGITS, BulkDocs, Chunk
from dcp_cdc.simulator.model import vbucket_of
from dcp_cdc.simulator.realistic import (
    BINARY_FLAGS,
    JSON_FLAGS,
    MAX_VALUE,
    MIN_VALUE,
    SCOPES,
    RealisticDocs,
    row_digest,
    truth,
)
from dcp_cdc.simulator.state import SimConfig, Simulation
from dcp_cdc.simulator.stream import SessionOptions

COUNT = 3000


def _bucket_with_docs(count: int = COUNT) -> tuple[Simulation, RealisticDocs, list[int]]:
    sim = Simulation(SimConfig(seed=5, vbuckets=8, docs=10, ops=0))
    sim.setup()
    highs = [vb.high_seqno for vb in sim.bucket.vbuckets]
    return sim, RealisticDocs(sim.bucket, count), highs


@pytest.fixture(scope="module")
def made() -> tuple[Simulation, RealisticDocs, list[int]]:
    return _bucket_with_docs()


def _decoded(data: bytes, collections: bool) -> list[Mutation]:
    events = list(iter_decode(data, collections=collections))
    assert all(isinstance(e, Mutation) for e in events), events[:1]
    return events  # type: ignore[return-value]


def _number(event: Mutation) -> int:
    return int(event.key.removeprefix(b"bulk::"))


@pytest.mark.parametrize(
    ("snappy", "xattrs"), [(True, True), (False, True), (True, False), (False, False)]
)
def test_frames_decode_to_the_documents(
    made: tuple[Simulation, RealisticDocs, list[int]], snappy: bool, xattrs: bool
) -> None:
    _, bulk, _ = made
    options = SessionOptions("r", snappy=snappy, xattrs=xattrs)
    ids = set(bulk.collection_ids)
    seen = 0
    for vbid in range(8):
        n = bulk.in_vbucket(vbid)
        data, count, last = bulk.frames(Chunk(vbid, 2, n, 7, options, ids))
        events = _decoded(data, collections=True)
        assert count == len(events) == n - 2 and last == bulk.seqno(vbid, n - 1)
        for i, e in enumerate(events, start=2):
            number = _number(e)
            doc = bulk.document(number)
            assert int(bulk.numbers[bulk.offsets[vbid] + i]) == number
            assert vbucket_of(e.key, 8) == vbid == e.header.vbucket
            assert e.collection_id == bulk.collection_ids[doc.collection]
            assert e.value == doc.body and e.key == doc.key
            assert e.xattrs == (doc.xattrs if xattrs else None)
            want = (Datatype.JSON if doc.is_json else 0) | (Datatype.SNAPPY if snappy else 0)
            want |= Datatype.XATTR if xattrs and doc.xattrs else 0
            assert e.header.datatype == want
            assert (e.by_seqno, e.rev_seqno, e.header.cas) == (
                bulk.seqno(vbid, i),
                1,
                bulk.cas_base + number,
            )
            assert e.flags == (JSON_FLAGS if doc.is_json else BINARY_FLAGS)
            assert e.header.opaque == 7 and e.expiration == 0
            seen += 1
    assert seen == COUNT - 16


def test_the_documents_are_realistic() -> None:
    docs = list(realistic.documents(20_000))
    assert [d.key for d in docs[:2]] == [b"bulk::0000000000", b"bulk::0000000001"]
    values = [len(d.body) + (len(realistic.xattr_section()) if d.xattrs else 0) for d in docs]
    assert min(values) >= MIN_VALUE and max(values) <= MAX_VALUE
    assert all(len(d.body) >= MIN_VALUE for d in docs)
    assert len({len(d.body) for d in docs}) > 200  # a spread of sizes
    assert 1200 < np.median([len(d.body) for d in docs]) < 2200
    with_xattrs = [d for d in docs if d.xattrs]
    binary = [d for d in docs if not d.is_json]
    assert 0.08 < len(with_xattrs) / len(docs) < 0.12
    assert 0.01 < len(binary) / len(docs) < 0.03
    assert all(set(d.xattrs or {}) == {"_sync", "meta"} for d in with_xattrs)
    assert all(d.user_xattrs == {"meta": (d.xattrs or {})["meta"]} for d in with_xattrs)
    shares = Counter(d.collection for d in docs)
    assert sorted(shares) == [0, 1, 2, 3] and shares[0] > shares[1] > shares[2] > shares[3]
    for d in docs:
        if d.is_json:
            parsed = json.loads(d.body)
            assert parsed["id"] == d.key.decode().removeprefix("bulk::")
            assert any(isinstance(v, dict | list) for v in parsed.values())  # nested
    assert len({d.body for d in docs}) == len(docs)  # each its own


def test_snappy_compresses_the_json_values(
    made: tuple[Simulation, RealisticDocs, list[int]],
) -> None:
    _, bulk, _ = made
    forms = bulk.forms(xattrs=True, snappy=True)
    plain = bulk.forms(xattrs=True, snappy=False)
    ratios = [f[2] / p[2] for f, p, v in zip(forms, plain, bulk.variants, strict=True) if v.is_json]
    assert max(ratios) < 0.95 and 0.3 < float(np.median(ratios)) < 0.8


def test_the_same_numbers_make_the_same_bytes(
    made: tuple[Simulation, RealisticDocs, list[int]],
) -> None:
    _, bulk, _ = made
    _, again, _ = _bucket_with_docs()
    options = SessionOptions("r")
    ids = set(bulk.collection_ids)
    for vbid in (0, 5):
        n = bulk.in_vbucket(vbid)
        one = bulk.frames(Chunk(vbid, 0, n, 1, options, ids))
        assert one == again.frames(Chunk(vbid, 0, n, 1, options, ids))
    assert realistic.document(1234) == bulk.document(1234)  # whatever the count


def test_the_collections_come_first_and_filters_hold(
    made: tuple[Simulation, RealisticDocs, list[int]],
) -> None:
    sim, bulk, highs = made
    bucket = sim.bucket
    names = [
        (bucket.scopes[bucket.collections[c].scope_id].name, bucket.collections[c].name)
        for c in bulk.collection_ids
    ]
    assert names == [(s, c) for s, colls in SCOPES for c in colls]
    for vb in bucket.vbuckets:
        created = [e for e in vb.sys_events if e.collection_id in bulk.collection_ids]
        assert len(created) == 4 and max(e.seqno for e in created) < bulk.seqno(vb.vbid, 0)
        assert bulk.seqno(vb.vbid, 0) > highs[vb.vbid] and vb.high_seqno == bulk.last_seqno(vb.vbid)
    options = SessionOptions("r")
    for cid in bulk.collection_ids:
        n = bulk.in_vbucket(3)
        data, count, last = bulk.frames(Chunk(3, 0, n, 1, options, {cid}))
        events = _decoded(data, collections=True)
        assert count == len(events) > 0 and {e.collection_id for e in events} == {cid}
        assert last == events[-1].by_seqno == bulk.collection_last_seqno(3, cid)
    assert bulk.collection_last_seqno(3, 0) == 0
    unaware = SessionOptions("r", collections=False)
    ids = set(bulk.collection_ids)
    assert bulk.frames(Chunk(3, 0, 10, 1, unaware, ids - ids)) == (b"", 0, -1)


def test_the_truth_sums_the_documents() -> None:
    per = truth(5000)
    assert sum(t.documents for t in per) == 5000 and len(per) == 4
    docs = list(realistic.documents(5000))
    for index, t in enumerate(per):
        mine = [d for d in docs if d.collection == index]
        assert t.documents == len(mine)
        assert t.digest == sum(
            row_digest(
                d.key.decode(),
                d.body,
                is_json=d.is_json,
                user_xattrs=d.user_xattrs,
                flags=d.flags,
                expiry=0,
                rev_seqno=1,
            )
            for d in mine
        )
    args = {"is_json": True, "user_xattrs": None, "flags": 0, "expiry": 0, "rev_seqno": 1}
    base = row_digest("k", b"{}", **args)  # type: ignore[arg-type]
    assert base != row_digest("k", b"{ }", **args)  # type: ignore[arg-type]
    assert base != row_digest("k", b"{}", **(args | {"user_xattrs": {"a": "1"}}))  # type: ignore[arg-type]
    assert base != row_digest("k", b"{}", **(args | {"rev_seqno": 2}))  # type: ignore[arg-type]
    assert base < 1 << 60


def test_the_small_shapes_truth_is_its_bodies() -> None:
    (got,) = realistic.small_truth(300, 70)
    sim = Simulation(SimConfig(seed=3, vbuckets=4, docs=1, ops=0))
    bulk = BulkDocs(sim.bucket, 300, 70)
    want = sum(
        row_digest(
            bulk.key(k).decode(),
            bulk.body.replace(b"0" * DIGITS, b"%010d" % k, 1),
            is_json=True,
            user_xattrs=None,
            flags=0,
            expiry=0,
            rev_seqno=1,
        )
        for k in range(300)
    )
    assert (got.documents, got.digest) == (300, want)
